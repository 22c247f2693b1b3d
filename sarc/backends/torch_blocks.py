"""Block ops of the torch backend: the distributed edge part's partials and their backward.

The generated edge part (``sarc.backends.dist_backend``) runs on one source
block at a time. Sum aggregates are ordinary block aggregates (the torch
backend's runtime ops, ``torch_ops``). The aggregates whose partials need more than
a value, and the backward "surrogates", are here (``registry.BLOCK_OPS``; every
backend's block ops have this API, ``triton_blocks`` the Triton backend's); ``sarc.distributed.merge`` combines what they
return. Shapes: a score has feature shape ``S`` (GAT: heads), a value ``S + C``.

Forward partials (no autograd; evaluated destination-row block by block, so
edge tensors exist one ``torch_ops.EDGE_BLOCK_ELEMS`` block at a time):

- ``extremum_partial``: ``(y, count)``: the block's max (min) per destination
  and element, and how many of the block's edges attain it (0: no edge);
- ``softmax_partial``: ``(m, s, acc)``: the block's max score, ``sum exp(score - m)``
  and ``sum exp(score - m) * value`` (online softmax, merged with rescaling);
- ``softmax_normalizer`` / ``score_normalizer``: ``(m, s)`` of a score
  region / an edge score tensor (a normalizer pass: baseline mode, unfused
  edge_softmax); ``softmax_normalized``: ``sum alpha * value`` with global
  normalizers ``alpha = exp(score - M) / S``;
- ``edge_softmax_global``: ``exp(score - M[dst]) / S[dst]`` (differentiable, see below).

Backward surrogates (differentiable): per-destination tensors whose gradient
with respect to the block's inputs is the block's share of the layer's
gradient, given the merged state and the output cotangent:

- ``extremum_select``: ``sum over e of [x_e == Y_v] x_e`` (cotangent ``g / C``,
  C the tie count over *all* blocks: ties split evenly, as on one process), weighed by
  that cotangent and summed: a scalar computed for its gradient alone;
- ``softmax_surrogate``: ``sum_e alpha_e (<g_v, value_e> - D_v)``, ``D_v = <g_v, out_v>``,
  alpha from the final (M, S): its gradient is ``alpha_e g_v`` for the value
  and ``alpha_e (<g_v, value_e> - D_v)`` for the score, exactly the softmax's
  (summed over the destinations too: a scalar computed for its gradient alone);
- ``score_normalizer_surrogate``: the normalizer pass's share of an unfused
  edge_softmax's score gradient (below).

Precision of the fused softmax. A score gradient ``alpha_e (<g, value_e> - D_v)``
sums to zero over each destination's edges (softmax is shift invariant): the
gradient of a term all of a destination's scores share (GAT's ``att_dst .
z_v``) is a sum of terms that cancel. Its rounding error is that of ``D_v`` and
of the dots, ``eps |g| |value|``, against a true value that, at large scores
(one edge holding nearly all the weight), is far smaller. On one process the
backward removes it with a second sum over the row (``sarc.ir.softmax``); here a
row's edges span blocks on other workers, and a second pass over them would
cost a round of exchanges. Instead the softmax's weights, sums, accumulator and
the dots are computed in float64 (``STATS``) in the forward partials, the
merge and the surrogate alike, so ``D_v`` is ``sum_e alpha_e <g, value_e>`` of
the same weights to float64 precision and each score gradient comes out
correctly rounded; the layer's output and every gradient stay in the layer's
dtype. Where the value is a source feature z (GAT), the surrogate forms no
float64 tensor but its result: each score gradient is computed in double and
rounded once (``torch_ops.softmax_shares``: sarc's C kernel, one pass over the
block's rows), and z's gradient, which does not cancel, is a transposed product
in the layer's dtype (``_SourceValueShares``).

An unfused ``edge_softmax``: its weights ``alpha = exp(score - M) / S`` (float64
normalizers from a normalizer pass) feed arbitrary edge code, and its score
gradient ``alpha_e (g_e - gbar_v)``, ``gbar_v = sum_e alpha_e g_e`` over every
block, is known only after the main backward pass has seen every block. The
textbook split -- ``alpha_e g_e`` in that pass, ``-alpha_e gbar_v`` in the
normalizer pass -- cancels across the two passes, after both went through the
score's gradient into the operands: at large scores the error is far above
plain float32's. Here each pass's share is small instead. In the main pass a
piece (its edges of row v: ``A_j = sum alpha_e``, ``B_j = sum alpha_e g_e``) sends
``alpha_e (g_e - B_j / A_j)`` to the score and hands ``B_j`` on
(``edge_softmax_global``'s backward gives it as the gradient of its ``S``
operand; the runtime keeps it per piece, ``merge.SiteShares``); in the
normalizer pass the same piece sends ``alpha_e (B_j / A_j - gbar_v)``,
``gbar_v = sum_j B_j`` (``score_normalizer_surrogate``). The two add up to the
softmax's gradient; both are computed in float64 and are as small as the
gradient itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..backward_once import once_differentiable
from . import torch_ops as K
from ..graph import Graph
from ..native import kernels as cpu_kernels

NEG_INF = float("-inf")


def _has_edges(g: Graph) -> torch.Tensor:
    return g.rowptr[1:] > g.rowptr[:-1]


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def _by_row_blocks(g: Graph, sides, width: int, operands, fn):
    """``fn(block graph, *block operands)`` over destination-row blocks, results concatenated."""
    outs = [fn(*K.block_args(g, sides, lo, hi, operands)) for lo, hi in K.row_blocks(g, width)]
    if len(outs) == 1:
        return outs[0]
    return tuple(torch.cat(parts, 0) for parts in zip(*outs))


def _per_edge(gb: Graph, sides, xs, skip: int | None = None):
    """The operands as a region reads them, one row per edge; None for operand ``skip`` (a
    softmax's value, which its score does not read: ``dist_backend._value_src_index``)."""
    return [None if i == skip else K.per_edge(x, s, gb) for i, (x, s) in enumerate(zip(xs, sides))]


# --- max / min ----------------------------------------------------------------------------

def _extremum(kind: str, x: torch.Tensor, g: Graph):
    """(y, count) of ``kind`` over each destination's edges of the edge tensor ``x``."""
    return K.edge_extremum(kind, x, g.rowptr, g.dst)


@dataclass(frozen=True)
class SourceRow:
    """The body of an aggregate whose message is operand ``index`` read at each edge's
    source as it is (``patterns.extremum_pattern``), in place of its region function and
    callable as it: the max / min block ops then take the extremum over the CSR index
    with sarc's C kernel (``_source_kernels``), no edge values formed."""

    index: int

    def __call__(self, g: Graph, *per_edge: torch.Tensor) -> torch.Tensor:
        return per_edge[self.index]


@dataclass(frozen=True)
class LiftedRow:
    """The body of a max / min aggregate whose message is operand ``index``, a source
    feature, plus or minus values constant over a destination's edges
    (``patterns.lifted_extremum``: EdgeConv), callable as its region function ``body``: the
    block ops take the feature's ``extremum`` over the CSR index with sarc's C kernel and
    evaluate ``body`` once per destination at it (``torch_ops.extremum_lifted``), no edge
    values formed. Its ties are the feature's, as on one process."""

    index: int
    extremum: str
    body: Callable

    def __call__(self, g: Graph, *per_edge: torch.Tensor) -> torch.Tensor:
        return self.body(g, *per_edge)


def _source_kernels(body, g: Graph, operands):
    """The CPU kernels where ``body`` is a ``SourceRow`` or ``LiftedRow`` they can run (CPU,
    float32 / float64 operands, a block with edges), else None."""
    if isinstance(body, LiftedRow):
        return K.lifted_kernels(g, operands[body.index], operands)
    if not isinstance(body, SourceRow) or g.num_edges == 0:
        return None
    return cpu_kernels.kernels_for(operands[body.index])


def _lifted(body: LiftedRow, at: torch.Tensor, g: Graph, operands) -> torch.Tensor:
    """``body`` at each destination, its source feature ``at`` (the row's extremum)."""
    return body.body(g, *(at if k == body.index else o for k, o in enumerate(operands)))


@torch.no_grad()
def extremum_partial(kind: str, body, sides, width: int, g: Graph, *operands):
    """(y, count) of ``kind`` over the block's edges of ``body`` (a fused aggregate)."""
    k = _source_kernels(body, g, operands)
    if k is not None:
        lay = K.layout(g)
        if isinstance(body, LiftedRow):
            at, count = k.extremum(body.extremum, lay.rowptr, lay.src, operands[body.index],
                                   g.num_dst)
            return K._finalize(kind, _lifted(body, at, g, operands), g), count
        return k.extremum(kind, lay.rowptr, lay.src, operands[body.index], g.num_dst)
    return _by_row_blocks(g, sides, width, operands,
                          lambda gb, *xs: _extremum(kind, body(gb, *_per_edge(gb, sides, xs)), gb))


@torch.no_grad()
def reduce_extremum_partial(kind: str, x: torch.Tensor, g: Graph):
    """(y, count) of ``kind`` over the block's edges of the edge tensor ``x`` (a REDUCE)."""
    return _extremum(kind, x, g)


def _select(x: torch.Tensor, y: torch.Tensor, g: Graph) -> torch.Tensor:
    keep = x == y.index_select(0, g.dst)
    return K.segment_sum(torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)), g)


def extremum_select(kind: str, body, sides, width: int, g: Graph, y: torch.Tensor,
                    share: torch.Tensor, *operands):
    """The sum over destinations v and the block's edges e -> v of ``share[v] * body(e)``
    where ``body(e)`` equals the merged ``y[v]``, for its gradient alone
    (``torch_ops.fused_surrogate``)."""
    k = _source_kernels(body, g, operands)
    if k is not None and isinstance(body, LiftedRow):
        return _lifted_select(k, body, g, y, share, operands)
    if k is not None and operands[body.index].requires_grad and torch.is_grad_enabled():
        return _SourceSelect.apply(g, y.detach(), share.detach(), body.index, *operands)

    def block(gb, yb, *xs):
        return _select(body(gb, *_per_edge(gb, sides, xs)), yb, gb)
    return K.fused_surrogate(block, g, ("dst", *sides), width, (y, *operands), share)


class _SourceSelect(torch.autograd.Function):
    """``extremum_select`` of a ``SourceRow`` body, for its gradient alone: forward
    computes nothing; backward gives the source operand ``dx[u] = sum over the block's
    edges (u, v) of [x[u] == y[v]] share[v]``, row by row of the transposed index (the C
    kernel's ``select_sum``: no edge tensor, no scatter)."""

    @staticmethod
    def forward(ctx, g, y, share, index, *operands):
        ctx.g, ctx.index, ctx.count = g, index, len(operands)
        ctx.save_for_backward(operands[index], y, share)
        return torch.zeros((), dtype=STATS, device=g.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, y, share = ctx.saved_tensors
        ptr, rows, _ = K.layout(ctx.g).transposed()
        s = share.to(x.dtype) * grad.to(x.dtype)
        grads = [None] * ctx.count
        grads[ctx.index] = cpu_kernels.kernels().select_sum(ptr, rows, x, y.to(x.dtype), s)
        return None, None, None, None, *grads


def _lifted_select(k, body: LiftedRow, g: Graph, y: torch.Tensor, share: torch.Tensor,
                   operands) -> torch.Tensor:
    """``extremum_select`` of a ``LiftedRow``: per destination, the message at the block's
    extremum of the feature, where it equals the merged ``y``, times ``share`` and the
    count of the block's edges attaining it (each of them selected): the destination
    terms' gradient is the per-edge form's; the feature's goes to those edges, ``share``
    each (``_AtExtremum``)."""
    x = operands[body.index]
    lay = K.layout(g)
    with torch.no_grad():
        at, count = k.extremum(body.extremum, lay.rowptr, lay.src, x.detach(), g.num_dst)
    msg = _lifted(body, _AtExtremum.apply(x, at, count, g), g, operands)
    keep = (msg == y.to(msg.dtype)) & _rows(_has_edges(g), msg)
    zero = torch.zeros((), dtype=msg.dtype)
    return torch.where(keep, msg * (share.to(msg.dtype) * count.to(msg.dtype)), zero).sum()


class _AtExtremum(torch.autograd.Function):
    """``at``, the extremum of x over each row of the block's CSR index with ``count`` edges
    attaining it (computed by the caller); backward: each of those edges' sources gets
    ``dat / count`` (``select_sum`` over the transposed index: no edge tensor)."""

    @staticmethod
    def forward(ctx, x, at, count, g):
        ctx.g = g
        ctx.save_for_backward(x, at, count)
        return at.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dat):
        x, at, count = ctx.saved_tensors
        return K.extremum_grad(K.layout(ctx.g), x, at, count, dat), None, None, None


def reduce_extremum_select(kind: str, x: torch.Tensor, g: Graph, y: torch.Tensor,
                           share: torch.Tensor) -> torch.Tensor:
    """``extremum_select`` of an edge tensor ``x`` (a REDUCE)."""
    return (_select(x, y, g) * share).sum()


# --- softmax ------------------------------------------------------------------------------

def _expand_to(a: torch.Tensor, like_dim: int) -> torch.Tensor:
    return a.reshape(*a.shape, *([1] * (like_dim - a.dim())))


STATS = torch.float64
"""The dtype of a fused softmax's weights, sums and dots (see the module doc)."""


def _weighted_sum(w: torch.Tensor, value, value_index, gb: Graph, sides, xs) -> torch.Tensor:
    """sum over edges e -> v of w[e] * value(e), in w's dtype; w has the score's shape [e, *S].

    When the value is a source feature z (GAT), a CSR product weighted per head (no
    e x S x C tensor, nor a copy of z in w's dtype); otherwise the value is formed per edge.
    """
    if value_index is not None:  # one product over every head: w [e, *S] weighs z's S axes
        return K.weighted_sum(gb, w, xs[value_index])
    val = value(gb, *_per_edge(gb, sides, xs)).to(w.dtype)
    return K.segment_sum(_expand_to(w, val.dim()) * val, gb)


@dataclass(frozen=True)
class DotScore:
    """The score region ``body`` of an attention whose score is the dot product per head of
    a source and a destination row, maybe scaled (``patterns.dot_score``; ``dot`` and
    ``feat`` as ``torch_ops.dot_scores`` takes them), callable as the region: the softmax
    block ops compute the scores as one SDDMM of the rows, no gathered row, where sarc's
    CPU kernels run it, as on one process (``torch_ops.softmax_dot_spmm``)."""

    body: Callable
    dot: tuple
    feat: tuple[int, ...]

    def __call__(self, g: Graph, *per_edge: torch.Tensor) -> torch.Tensor:
        return self.body(g, *per_edge)


def _block_width(score, width: int, operands, value_per_edge: bool) -> int:
    """The per-edge width a block op's row blocks are sized by: a ``DotScore`` whose SDDMM
    runs, with no value formed per edge, holds the scores alone (a number per head and
    edge), not the dot's products: one block where the layer's width would cut many."""
    if (isinstance(score, DotScore) and not value_per_edge
            and K.dot_scores_run(score.dot, *operands)):
        return max(1, math.prod(score.feat))
    return width


def _scores(score, gb: Graph, sides, xs, skip: int | None):
    """(the block's scores, the operands per edge or None where the scores did not need
    them): ``score`` of the rows ``xs``, a ``DotScore`` as one SDDMM where it can."""
    if isinstance(score, DotScore):
        sc = K.dot_scores(gb, score.dot, score.feat, *xs)
        if sc is not None:
            return sc, None
    per = _per_edge(gb, sides, xs, skip)
    return score(gb, *per), per


def _score_stats(sc: torch.Tensor, g: Graph, dtype: torch.dtype):
    """(m, exp(sc - m)): the block's max score per destination (sc's dtype, exact) and the
    exponentials in ``dtype``. Where a destination's scores in the block are all -inf
    (``masked_fill``), m is -inf and the exponentials are 0, shifted by 0, not by m."""
    m = torch.segment_reduce(sc, "max", offsets=g.rowptr, axis=0)
    neg_inf = torch.full((), NEG_INF, dtype=m.dtype, device=m.device)
    m = torch.where(_rows(_has_edges(g), m), m, neg_inf)
    shift = torch.where(m == NEG_INF, torch.zeros((), dtype=m.dtype, device=m.device), m)
    ex = torch.exp(sc.to(dtype) - shift.to(dtype).index_select(0, g.dst))
    return m, ex


def _weights(sc: torch.Tensor, g: Graph, big_m: torch.Tensor, big_s: torch.Tensor) -> torch.Tensor:
    """alpha = exp(sc - M) / S at each edge's destination, in ``STATS``."""
    return (torch.exp(sc.to(STATS) - big_m.to(STATS).index_select(0, g.dst))
            / big_s.to(STATS).index_select(0, g.dst))


@torch.no_grad()
def softmax_partial(score, value, sides, width: int, g: Graph, value_index, *operands):
    """(m, s, acc): the block's share of a softmax aggregate, to be merged online. Where the
    value is a source feature z (GAT), sarc's C kernel takes the scores to (m, s, acc) in
    one pass over each row (``softmax_partial``: no edge tensor in ``STATS``)."""
    def block(gb, *xs):
        sc, _ = _scores(score, gb, sides, xs, value_index)
        z = xs[value_index] if value_index is not None else None
        k = cpu_kernels.kernels_for(sc, z) if z is not None and gb.num_edges else None
        if k is not None:
            heads = math.prod(sc.shape[1:])
            lay = K.layout(gb)
            m, s, acc = k.softmax_partial(lay.rowptr, lay.src, sc, K._by_head(z, heads))
            return (m.reshape(gb.num_dst, *sc.shape[1:]),
                    s.reshape(gb.num_dst, *sc.shape[1:]), acc.reshape(gb.num_dst, *z.shape[1:]))
        m, ex = _score_stats(sc, gb, STATS)
        return m, K.segment_sum(ex, gb), _weighted_sum(ex, value, value_index, gb, sides, xs)
    width = _block_width(score, width, operands, value_index is None)
    return _by_row_blocks(g, sides, width, operands, block)


@torch.no_grad()
def softmax_normalizer(score, sides, width: int, g: Graph, *operands):
    """(m, s) of a softmax aggregate's score on the block (a normalizer pass)."""
    def block(gb, *xs):
        m, ex = _score_stats(_scores(score, gb, sides, xs, None)[0], gb, STATS)
        return m, K.segment_sum(ex, gb)
    return _by_row_blocks(g, sides, _block_width(score, width, operands, False), operands, block)


@torch.no_grad()
def softmax_normalized(score, value, sides, width: int, g: Graph, value_index, norm, *operands):
    """sum over the block's edges of alpha * value, alpha normalized by the global (M, S)."""
    big_m, big_s = norm

    def block(gb, mb, sb, *xs):
        alpha = _weights(_scores(score, gb, sides, xs, value_index)[0], gb, mb, sb)
        return (_weighted_sum(alpha, value, value_index, gb, sides, xs),)
    width = _block_width(score, width, operands, value_index is None)
    (out,) = _by_row_blocks(g, ("dst", "dst", *sides), width, (big_m, big_s, *operands), block)
    return out


def softmax_surrogate(score, value, sides, width: int, g: Graph, value_index, state, *operands):
    """The sum over destinations v and the block's edges e of alpha_e (<g_v, value_e> - D_v),
    in ``STATS``, for its gradient alone (``torch_ops.fused_surrogate``: the value is not
    computed; the gradients come back in the operands' dtypes).

    ``state`` = (M, S, g, D) from ``merge.SoftmaxMerge.cotangent``.
    """
    big_m, big_s, grad, d = state

    def block(gb, mb, sb, gr, db, *xs):
        sc, per = _scores(score, gb, sides, xs, value_index)
        if value_index is not None:
            return _SourceValueShares.apply(sc, xs[value_index], mb, sb, gr, db, gb)
        alpha = _weights(sc, gb, mb, sb)
        val = value(gb, *(per or _per_edge(gb, sides, xs))).to(STATS)
        ge = gr.to(STATS).index_select(0, gb.dst)
        dot = (ge * val).reshape(*sc.shape, math.prod(val.shape[sc.dim():])).sum(-1)
        return K.segment_sum(alpha * (dot - db.to(STATS).index_select(0, gb.dst)), gb)
    width = _block_width(score, width, operands, value_index is None)
    return K.fused_surrogate(block, g, ("dst", "dst", "dst", "dst", *sides), width,
                             (big_m, big_s, grad, d, *operands))


class _SourceValueShares(torch.autograd.Function):
    """The surrogate of a softmax block whose value is a source feature z its score does not
    read (GAT): per destination v, ``sum_e ds_e`` with ``ds_e = alpha_e (<g_v, z_u> - D_v)``
    over the block's edges e = (u, v). ``torch_ops.softmax_shares`` computes alpha and ds
    (the dots and arithmetic in ``STATS``, rounded once, as the module doc asks); backward,
    with ``c_v`` the output's cotangent: ``ds_e c_v`` to the score, ``A_{alpha c}^T g`` (a
    transposed product) to z. No node row or edge value in ``STATS`` is formed, nor a
    value per edge."""

    @staticmethod
    def forward(ctx, sc, z, big_m, big_s, grad, d, g):
        alpha, ds = K.softmax_shares(g, sc.detach(), z.detach(), big_m, big_s, grad, d)
        ctx.g, ctx.sc_shape, ctx.z_shape, ctx.z_dtype = g, sc.shape, z.shape, z.dtype
        ctx.save_for_backward(alpha, ds, grad)
        return K.segment_sum(ds.to(STATS), g).reshape(g.num_dst, *sc.shape[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, cot):
        alpha, ds, grad = ctx.saved_tensors
        g, heads = ctx.g, alpha.shape[1]
        if cot.numel() and not any(cot.stride()):
            # one number for every row (the surrogate's sum gives 1): no per-edge gather,
            # and no product at all by 1
            c = float(cot.reshape(-1)[0])
        else:
            c = cot.reshape(g.num_dst, heads).to(alpha.dtype).index_select(0, g.dst)
        unit = isinstance(c, float) and c == 1.0
        dsc = (ds if unit else ds * c).reshape(ctx.sc_shape) if ctx.needs_input_grad[0] else None
        dz = None
        if ctx.needs_input_grad[1]:
            dz = K.transposed_product(g, alpha if unit else alpha * c, grad,
                                      ctx.z_shape).to(ctx.z_dtype)
        return dsc, dz, None, None, None, None, None


# --- unfused edge_softmax: global normalizers -------------------------------------------

@torch.no_grad()
def score_normalizer(sc: torch.Tensor, g: Graph):
    """(m, s) of an edge score tensor on the block, s in ``STATS``."""
    m, ex = _score_stats(sc, g, STATS)
    return m, K.segment_sum(ex, g)


def edge_softmax_global(sc: torch.Tensor, g: Graph, norm) -> torch.Tensor:
    """softmax of ``sc`` over each destination's edges in *every* block: exp(sc - M) / S,
    in sc's dtype. Backward: the main pass's share of the score gradient (module doc)."""
    big_m, big_s = norm
    return _GlobalSoftmax.apply(sc, big_m, big_s, g)


class _GlobalSoftmax(torch.autograd.Function):
    """``alpha = exp(sc - M) / S``; backward (``g`` the gradient of alpha), per destination
    row of the block: ``alpha (g - B / A)`` to sc, ``B = sum alpha g`` to S (the share
    the normalizer pass needs, not dL/dS), nothing to M."""

    @staticmethod
    def forward(ctx, sc, big_m, big_s, g):
        alpha = _weights(sc, g, big_m, big_s)
        ctx.g, ctx.dtype = g, sc.dtype
        ctx.save_for_backward(alpha)
        return alpha.to(sc.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        (alpha,) = ctx.saved_tensors
        g = ctx.g
        ga = alpha * grad.to(STATS)
        a, b = K.segment_sum(alpha, g), K.segment_sum(ga, g)
        mean = torch.where(a > 0, b / torch.where(a > 0, a, 1.0), 0.0)
        dsc = ga - alpha * mean.index_select(0, g.dst)
        return dsc.to(ctx.dtype), None, b, None


def score_normalizer_surrogate(sc: torch.Tensor, g: Graph, norm, shares) -> torch.Tensor:
    """Per destination, sum over the block's edges of alpha_e (B / A - gbar): its gradient
    is the normalizer pass's share of the score gradient (module doc). ``shares`` =
    (gbar, B) at the block's destinations (``merge.SiteShares``)."""
    big_m, big_s = norm
    gbar, b = shares
    alpha = _weights(sc, g, big_m, big_s.detach())
    a = K.segment_sum(alpha.detach(), g)
    coef = torch.where(a > 0, b.to(STATS) / torch.where(a > 0, a, 1.0), 0.0) - gbar.to(STATS)
    return K.segment_sum(alpha * coef.index_select(0, g.dst), g)
