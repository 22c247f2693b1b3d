"""The backward of a softmax over each destination's edges, in a cancellation-free form.

With ``p = softmax_v(x)`` over the edges into ``v`` and ``dp`` the cotangent of
``p``, the textbook backward

    dx_e = p_e (dp_e - dbar_v),   dbar_v = sum_{f->v} p_f dp_f

sums to zero over each row: softmax is shift invariant, so a term every score
of a row shares (GAT's ``att_dst . z_v``) gets a gradient that is a sum of terms
that cancel. In floating point ``dbar_v`` is off by about ``eps |dp|``, and
when one edge holds nearly all the weight (large scores) that edge's ``dx``,
whose true value is of the size of the other edges' weights, is mostly that
rounding. Summed over the row, the error reaches the shared term's gradient
whole, where the true value is small or 0: noise of the size of the *other*
gradients, which Adam turns into full-size steps.

``edge_softmax_vjp`` removes it with one more row sum: ``sigma_v = sum_e dx_e``
of the computed ``dx`` is the rounding the row picked up, and

    dx'_e = dx_e - p_e sigma_v

is the same in exact arithmetic (``sigma = 0``); in floating point the dominant
edge's gradient becomes, in effect, minus the sum of the others' (each
accurate), and each row of ``dx'`` sums to the rounding of its own terms. Every
backend computes this form: the interpreter and the PyTorch edge softmax call this
function, the PyTorch attention product computes it in place, span by span of edges
(``torch_ops._softmax_vjp_into``, once differentiable), or row by row with sarc's C
kernel (``sarc.native``'s ``softmax_vjp``), the IR's VJP rule
(``sarc.ir.autodiff``) emits it, the Triton kernels
sum ``sigma`` per row; the distributed schedules, whose rows span workers,
keep the softmax's sums and dots in float64 instead (``sarc.backends.torch_blocks``;
a block whose value is a source feature takes its score gradients from sarc's C
``softmax_shares``, its dots in double).
"""
from __future__ import annotations

from typing import Callable

import torch

RowSum = Callable[[torch.Tensor], torch.Tensor]
"""Edge values -> per-destination sums."""

AtEdges = Callable[[torch.Tensor], torch.Tensor]
"""Per-destination values -> one row per edge (the gather at each edge's destination)."""


def edge_softmax_vjp(p: torch.Tensor, dp: torch.Tensor, row_sum: RowSum,
                     at_edges: AtEdges) -> torch.Tensor:
    """``dx`` of ``p = softmax_v(x)`` given ``dp``: ``p (dp - <p, dp>)``, projected so each
    row sums to zero (see the module doc)."""
    dx = p * (dp - at_edges(row_sum(p * dp)))
    return dx - p * at_edges(row_sum(dx))
