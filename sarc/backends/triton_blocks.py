"""Block ops of the Triton backend: the distributed edge part's partials and surrogates.

The API is ``torch_blocks``' (``registry.BLOCK_OPS``, ``registry.SITE_OPS``). Where the
torch ops take a region function (or, for an unfused reduce, its kind), the Triton
lowering of the edge part (``triton_edge``) passes the value's compiled op
(``triton_runtime.FusedOp``; a softmax's in place of its score region, None for its
value region), and the block op runs its kernels:

- ``extremum_partial`` / ``reduce_extremum_partial``: ``(y, count)`` of max / min: the
  op's forward kernel, then its tie-counting kernel (the one its backward splits ties
  with) at ``y``;
- ``extremum_select`` / ``reduce_extremum_select``: the surrogate whose gradient is the
  block's share of the merged extremum's, computed for its gradient alone: its backward
  the op's gradient kernels fed the merged ``y`` and the cotangent ``g / C`` (C the tie
  count over every block) in place of the block's own;
- ``softmax_partial``, ``softmax_normalizer``, ``softmax_normalized``,
  ``softmax_surrogate``: on the op whose statistics are in float64 (``STATS``, see
  ``torch_blocks``): its kernels compute the score and value in the layer's dtype, as
  the layer on one process does (no float64 copy of the operands, no score computed
  otherwise than there), and each row's max, sum and weighted sum in ``STATS``. The
  partial is its forward kernel's ``(m, l, out * l)`` (each row's max score, its sum of
  exp(score - m), the unnormalized sum), the normalizer ``(m, l)``, the normalized sum
  ``out * exp(m - M) * l / S``; the surrogate, computed for its gradient alone, is the
  op's gradient kernels fed the merged state ``(M, S)``, each gradient stored in
  ``STATS``.

- ``score_normalizer``, ``edge_softmax_global``, ``score_normalizer_surrogate``: an
  unfused edge_softmax's normalizer pass and global weights, given the site's kernels
  (``triton_runtime.SoftmaxSiteOp``) after the torch op's arguments: one program per
  destination row, the scores read in their dtype, every exponential and sum in
  ``STATS``; no float64 edge tensor is formed or kept (the weights' backward computes
  them again from the scores, in the kernel that reduces them).

Given a region function instead (an op the Triton backend could not lower), or no site
op, they are the torch backend's. A block op listed in ``FALLBACKS`` (none now) has no
Triton kernel: the lowering lists each use in the schedule's ``fallbacks``.
"""
from __future__ import annotations

import torch

from ..backward_once import once_differentiable
from . import torch_blocks
from .triton_runtime import FusedOp, SoftmaxSiteOp, check_device

FALLBACKS: dict[str, str] = {}
"""Block ops without a Triton kernel, with the reason: they run on the torch backend."""

STATS = torch_blocks.STATS


def _ties(op: FusedOp, g, xs, y: torch.Tensor) -> torch.Tensor:
    """Per destination and element, how many of the block's edges attain ``y``."""
    return op.row_sum(g, [*xs, y], y.dtype)


def _partial(op: FusedOp, g, xs):
    """(y, count) with y exact (the dtype the op's region computes in: float32 for a
    half-precision layer, float64 for a region with float64 values), as the op's gradient
    kernels compare each edge with it; the merge rounds the merged y to the layer's dtype
    (``sarc.distributed.merge.ExtremumMerge``)."""
    check_device(op.name, op.forward.main.kernel, [g.src, *xs])
    _, (exact,) = op.run_forward(g, xs)
    return exact, _ties(op, g, xs, exact).to(exact.dtype)


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


def extremum_select(kind: str, body, sides, width: int, g, y: torch.Tensor,
                    share: torch.Tensor, *operands):
    """The sum over the block's edges e -> v attaining the merged ``y[v]`` of
    ``share[v] * body(e)``, for its gradient alone (``torch_blocks.extremum_select``)."""
    if not isinstance(body, FusedOp):
        return torch_blocks.extremum_select(kind, body, sides, width, g, y, share, *operands)
    check_device(body.name, body.forward.main.kernel, [g.src, y, *operands])
    return _Select.apply(body, g, y, share, *operands)


def reduce_extremum_select(kind, x: torch.Tensor, g, y: torch.Tensor,
                           share: torch.Tensor) -> torch.Tensor:
    if not isinstance(kind, FusedOp):
        return torch_blocks.reduce_extremum_select(kind, x, g, y, share)
    check_device(kind.name, kind.forward.main.kernel, [g.src, x, y])
    return _Select.apply(kind, g, y, share, x)


class _Select(torch.autograd.Function):
    """``extremum_select`` on the op's kernels: forward computes nothing (only the gradient
    is read); backward: ``share`` (the cotangent's share per tied edge) through the op's
    gradient kernels, which pick the edges attaining ``y``."""

    @staticmethod
    def forward(ctx, op: FusedOp, g, y, share, *xs):
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(y, share.detach(), *xs)
        return y.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        y, share, *xs = ctx.saved_tensors
        feeds = [*xs, y, (share * grad).to(y.dtype).contiguous()]
        grads = ctx.op.operand_grads(ctx.g, xs, feeds, ctx.needs_input_grad[4:])
        return (None, None, None, None, *grads)


# --- softmax ------------------------------------------------------------------------------

def _by_row(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A row statistic [rows, *score] broadcast over ``like``'s trailing value axes."""
    return t.reshape(*t.shape, *([1] * (like.dim() - t.dim())))


def _rows_with_edges(g, like: torch.Tensor) -> torch.Tensor:
    return _by_row(g.rowptr[1:] > g.rowptr[:-1], like)


def _softmax(op: FusedOp, g, operands):
    """The op's forward kernel on the block: (out, (m, l)), its normalized output and each
    row's max score and sum of exp(score - m); (-inf, 0) and an output of 0 on rows without
    edges, or whose scores in the block are all -inf (``masked_fill``: the kernel's 0 / 0
    there)."""
    check_device(op.name, op.forward.main.kernel, [g.src, *operands])
    out, m, l_ = op.forward(g, operands, STATS)
    neg_inf = torch.full((), float("-inf"), dtype=STATS, device=m.device)
    zero = torch.zeros((), dtype=STATS, device=m.device)
    has = _rows_with_edges(g, m) & (m != neg_inf)
    m, l_ = torch.where(has, m, neg_inf), torch.where(has, l_, zero).contiguous()
    out = torch.where(_by_row(has, out), out,
                      torch.zeros((), dtype=out.dtype, device=out.device))
    return out, (m, l_)


@torch.no_grad()
def softmax_partial(score, value, sides, width: int, g, value_index, *operands):
    """(m, s, acc): the block's share of a softmax aggregate. On the op (compiled in
    ``STATS``): its forward kernel's max scores and sums, and its output times the sums."""
    if not isinstance(score, FusedOp):
        return torch_blocks.softmax_partial(score, value, sides, width, g, value_index,
                                            *operands)
    out, (m, s) = _softmax(score, g, operands)
    return m, s, out * _by_row(s, out)


@torch.no_grad()
def softmax_normalizer(score, sides, width: int, g, *operands):
    """(m, s) of a softmax aggregate's score on the block (a normalizer pass); on the op:
    its forward kernel's."""
    if not isinstance(score, FusedOp):
        return torch_blocks.softmax_normalizer(score, sides, width, g, *operands)
    return _softmax(score, g, operands)[1]


@torch.no_grad()
def softmax_normalized(score, value, sides, width: int, g, value_index, norm, *operands):
    """sum over the block's edges of alpha * value, alpha normalized by the global (M, S);
    on the op: its output rescaled, ``out * exp(m - M) * l / S``."""
    if not isinstance(score, FusedOp):
        return torch_blocks.softmax_normalized(score, value, sides, width, g, value_index,
                                               norm, *operands)
    big_m, big_s = norm
    out, (m, s) = _softmax(score, g, operands)
    w = torch.exp(m - big_m.to(STATS)) * s / big_s.to(STATS)  # 0 where the block has no edge
    return out * _by_row(w, out)


def softmax_surrogate(score, value, sides, width: int, g, value_index, state, *operands):
    """The sum over destinations and the block's edges of alpha_e (<g_v, value_e> - D_v),
    for its gradient alone (``torch_blocks.softmax_surrogate``). On the op (compiled in
    ``STATS``): its gradient kernels, fed the merged ``M`` and ``S``, ``g`` and ``D``, and
    no projection (the block's share of a row's score gradients does not sum to zero)."""
    if not isinstance(score, FusedOp):
        return torch_blocks.softmax_surrogate(score, value, sides, width, g, value_index,
                                              state, *operands)
    op = score
    big_m, big_s, grad, d = state
    check_device(op.name, op.forward.main.kernel, [g.src, grad, *operands])
    return _SoftmaxSurrogate.apply(op, g, big_m.to(STATS).contiguous(),
                                   big_s.to(STATS).contiguous(), grad.to(STATS), d.to(STATS),
                                   *operands)


class _SoftmaxSurrogate(torch.autograd.Function):
    """``softmax_surrogate`` on the op's kernels, summed over the destinations: forward
    computes nothing (only the gradient is read)."""

    @staticmethod
    def forward(ctx, op: FusedOp, g, big_m, big_s, grad, d, *operands):
        ctx.op, ctx.g = op, g
        ctx.dtypes = [x.dtype for x in operands]
        ctx.save_for_backward(big_m, big_s, grad, d, *operands)
        return big_m.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, dsur):
        big_m, big_s, grad, d, *xs = ctx.saved_tensors
        dsur = dsur.to(STATS)
        # the surrogate is linear in (g, D): its cotangent scales both
        feeds = [*xs, (grad * dsur).contiguous(), big_m, big_s, d * dsur,
                 torch.zeros_like(big_m)]
        grads = ctx.op.operand_grads(ctx.g, xs, feeds, ctx.needs_input_grad[6:], STATS)
        return (None, None, None, None, None, None,
                *(None if gr is None else gr.to(dt) for gr, dt in zip(grads, ctx.dtypes)))


# --- unfused edge_softmax: global normalizers -------------------------------------------

@torch.no_grad()
def score_normalizer(sc: torch.Tensor, g, op: SoftmaxSiteOp | None = None):
    """(m, s) of an edge score tensor on the block, s in ``STATS``."""
    if op is None:
        return torch_blocks.score_normalizer(sc, g)
    op.check(g, sc)
    return op.normalizer(g, sc)


def edge_softmax_global(sc: torch.Tensor, g, norm, op: SoftmaxSiteOp | None = None):
    """exp(sc - M) / S at each edge's destination, in sc's dtype; backward as
    ``torch_blocks.edge_softmax_global``'s: the main pass's share of the score gradient,
    and ``B`` handed on as the gradient of S."""
    if op is None:
        return torch_blocks.edge_softmax_global(sc, g, norm)
    big_m, big_s = norm
    op.check(g, sc, big_m, big_s)
    return _GlobalWeights.apply(op, sc, big_m, big_s, g)


class _GlobalWeights(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: SoftmaxSiteOp, sc, big_m, big_s, g):
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(sc, big_m, big_s)
        return op.weights(g, sc, big_m, big_s)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        sc, big_m, big_s = ctx.saved_tensors
        dsc, b = ctx.op.row_shares(ctx.g, sc, big_m, big_s, grad)
        return None, dsc, None, b.to(big_s.dtype), None


def score_normalizer_surrogate(sc: torch.Tensor, g, norm, shares,
                               op: SoftmaxSiteOp | None = None) -> torch.Tensor:
    """Per destination, sum over the block's edges of alpha_e (B / A - gbar), for its
    gradient alone: the normalizer pass's share of the score gradient
    (``torch_blocks.score_normalizer_surrogate``)."""
    if op is None:
        return torch_blocks.score_normalizer_surrogate(sc, g, norm, shares)
    big_m, big_s = norm
    gbar, b = shares
    op.check(g, sc, big_m, big_s, gbar, b)
    return _NormalizerShares.apply(op, sc, big_m, big_s.detach(), gbar.detach(), b.detach(), g)


class _NormalizerShares(torch.autograd.Function):
    """``A coef`` per destination, ``A = sum alpha``, ``coef = B / A - gbar`` (0 / A read
    as 0); backward: ``alpha_e coef_v c_v`` to the scores (one scaled-weights kernel)."""

    @staticmethod
    def forward(ctx, op: SoftmaxSiteOp, sc, big_m, big_s, gbar, b, g):
        a = op.row_sums(g, sc, big_m, big_s)
        coef = torch.where(a > 0, b.to(STATS) / torch.where(a > 0, a, 1.0), 0.0) - gbar.to(STATS)
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(sc, big_m, big_s, coef)
        return a * coef

    @staticmethod
    @once_differentiable
    def backward(ctx, cot):
        sc, big_m, big_s, coef = ctx.saved_tensors
        scale = cot.to(STATS) * coef
        return (None, ctx.op.weights(ctx.g, sc, big_m, big_s, scale),
                None, None, None, None, None)
