"""Block ops of the Triton backend: the distributed edge part's partials and surrogates.

The API is ``torch_blocks``' (``registry.BLOCK_OPS``, ``registry.SITE_OPS``). Where the
torch ops take a region function (or, for an unfused reduce, its kind), the Triton
lowering of the edge part (``triton_edge``) passes the value's compiled op
(``triton_runtime.FusedOp``), and the block op runs its kernels:

- ``extremum_partial`` / ``reduce_extremum_partial``: ``(y, count)`` of max / min: the
  op's forward kernel, then its tie-counting kernel (the one its backward splits ties
  with) at ``y``;
- ``extremum_select`` / ``reduce_extremum_select``: the surrogate whose gradient is the
  block's share of the merged extremum's: its value is ``y * ties`` (the tied edges' sum),
  its backward the op's gradient kernels fed the merged ``y`` and the cotangent ``g / C``
  (C the tie count over every block) in place of the block's own.

Given a region function instead (an op the Triton backend could not lower), they are
the torch backend's. The softmax's block ops and the unfused edge_softmax's have no
Triton kernels yet (``FALLBACKS`` says why): they are the torch backend's, and the
lowering lists each use in the schedule's ``fallbacks``.
"""
from __future__ import annotations

import torch

from . import torch_blocks
from .triton_runtime import FusedOp, check_device

_STATS = ("the distributed softmax keeps its weights, sums and dots in float64 "
          "(torch_blocks.STATS); the Triton softmax kernels accumulate in float32")

FALLBACKS: dict[str, str] = {
    "softmax_partial": _STATS,
    "softmax_surrogate": _STATS,
    "softmax_normalizer": _STATS,
    "softmax_normalized": _STATS,
    "score_normalizer": _STATS,
    "edge_softmax_global": _STATS,
    "score_normalizer_surrogate": _STATS,
}
"""Block ops without a Triton kernel, with the reason: they run on the torch backend."""

softmax_partial = torch_blocks.softmax_partial
softmax_surrogate = torch_blocks.softmax_surrogate
softmax_normalizer = torch_blocks.softmax_normalizer
softmax_normalized = torch_blocks.softmax_normalized
score_normalizer = torch_blocks.score_normalizer
edge_softmax_global = torch_blocks.edge_softmax_global
score_normalizer_surrogate = torch_blocks.score_normalizer_surrogate


def _ties(op: FusedOp, g, xs, y: torch.Tensor) -> torch.Tensor:
    """Per destination and element, how many of the block's edges attain ``y``."""
    return op.row_sum(g, [*xs, y], y.dtype)


def _partial(op: FusedOp, g, xs):
    check_device(op.name, op.forward.main.kernel, [g.src, *xs])
    y, (exact,) = op.run_forward(g, xs)
    return y, _ties(op, g, xs, exact).to(y.dtype)


@torch.no_grad()
def extremum_partial(kind: str, body, sides, width: int, g, *operands):
    """(y, count) of ``kind`` over the block's edges of ``body`` (a fused aggregate)."""
    if not isinstance(body, FusedOp):
        return torch_blocks.extremum_partial(kind, body, sides, width, g, *operands)
    return _partial(body, g, operands)


@torch.no_grad()
def reduce_extremum_partial(kind, x: torch.Tensor, g):
    """(y, count) over the block's edges of the edge tensor ``x`` (a REDUCE; ``kind``: its op)."""
    if not isinstance(kind, FusedOp):
        return torch_blocks.reduce_extremum_partial(kind, x, g)
    return _partial(kind, g, (x,))


def extremum_select(kind: str, body, sides, width: int, g, y: torch.Tensor, *operands):
    """sum over the block's edges e -> v of ``body(e)`` where it equals the merged ``y[v]``."""
    if not isinstance(body, FusedOp):
        return torch_blocks.extremum_select(kind, body, sides, width, g, y, *operands)
    check_device(body.name, body.forward.main.kernel, [g.src, y, *operands])
    return _Select.apply(body, g, y, *operands)


def reduce_extremum_select(kind, x: torch.Tensor, g, y: torch.Tensor) -> torch.Tensor:
    if not isinstance(kind, FusedOp):
        return torch_blocks.reduce_extremum_select(kind, x, g, y)
    check_device(kind.name, kind.forward.main.kernel, [g.src, x, y])
    return _Select.apply(kind, g, y, x)


class _Select(torch.autograd.Function):
    """The block's edges attaining the merged extremum ``y``; backward: ``dy`` (the
    cotangent's share per tied edge) through the op's gradient kernels."""

    @staticmethod
    def forward(ctx, op: FusedOp, g, y, *xs):
        ties = _ties(op, g, xs, y)
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(y, *xs)
        return torch.where(ties > 0, y * ties, torch.zeros((), dtype=y.dtype, device=y.device))

    @staticmethod
    def backward(ctx, dy):
        y, *xs = ctx.saved_tensors
        feeds = [*xs, y, dy.to(y.dtype).contiguous()]
        grads = ctx.op.operand_grads(ctx.g, xs, feeds, ctx.needs_input_grad[3:])
        return (None, None, None, *grads)
