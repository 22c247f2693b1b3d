"""Merge rules: the partial aggregates of the source blocks -> the layer's aggregates.

Each source block j gives a partial for every aggregate of the layer
(``sarc.backends.torch_blocks``); a merge folds them in, block by block in any order,
so only one block's partial is held at a time, and afterwards gives the
cotangent each block's backward surrogate needs (``MERGES``: one rule per reducer of
``sarc.ir.reducers``, whose ``combine``, ``beats`` and ``tie_share`` they use):

- sum: ``y = sum_j y_j``; cotangent ``g``.
- mean: partial *sums*, ``y = (sum_j y_j) / max(1, in_degree)`` with the
  whole-graph in-degree; cotangent ``g / max(1, in_degree)``.
- max / min: ``y = max_j y_j`` over the blocks that have edges into the node
  (0 where no block has: a node without incoming edges gets 0, as DGL and PyG
  give), with the number C of edges attaining it over all blocks; cotangent
  ``(y, g / C)``: every edge attaining the extremum gets ``g / C``, ties split
  evenly across and within blocks, as ``torch_ops`` does on one process.
- softmax (a fused softmax_aggregate), online: per block (m_j, s_j, acc_j);
  ``M = max(M, m_j)``, ``S = S e^(M_old - M) + s_j e^(m_j - M)``, ``acc``
  likewise; ``y = acc / S``. One pass over the blocks (FlashAttention's
  rescaling). Cotangent ``(M, S, g, D)`` with ``D_v = <g_v, y_v>`` per score
  element: each block's backward is then independent of the others. ``S``,
  ``acc``, ``y`` and ``D`` are kept in float64 (``sarc.backends.torch_blocks.STATS``: the
  score gradients cancel over each row, see there); ``y`` is handed on in the
  layer's dtype. A block whose scores into a row are all -inf adds nothing
  (``s_j = 0``); where every block's are (``S = 0``), ``y`` is NaN if the row has
  edges, as one process's ``exp(-inf - -inf)`` gives (and torch, PyG, DGL), and 0
  if it has none.
- softmax with a normalizer pass first (baseline mode: no online softmax):
  ``(M, S)`` from the normalizer pass, then ``y = sum_j acc_j`` where the blocks
  normalize with them; same cotangent.
- normalizers of an unfused ``edge_softmax``: ``(m_j, s_j)`` merged like the
  online softmax into ``(M, S)``, S in float64; rows without edges get ``(0, 1)``,
  rows whose every score is -inf ``(NaN, 1)`` (their weights NaN, as on one process).
  Its backward's per-piece shares: ``SiteShares``.
"""
from __future__ import annotations

import math

import torch

from ..ir.reducers import NEG_INF, SOFTMAX, reducer, tie_share
from ..ir.split import Aggregate

def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.reshape(mask.shape[0], *mask.shape[1:], *([1] * (like.dim() - mask.dim())))


def _expand(a: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return a.reshape(*a.shape, *([1] * (like.dim() - a.dim())))


def _full(n: int, part: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full((n, *part.shape[1:]), value, dtype=part.dtype, device=part.device)


ROW_SPAN_ELEMS = 1 << 18
"""The values of a span of rows the softmax merge's float64 arithmetic is done in on the
CPU: whole rows' temporaries would each be fresh memory, paid for page by page, every
step. On a GPU the caching allocator reuses memory: the rows are one span, one launch."""


def _row_spans(t: torch.Tensor, min_rows: int = 1):
    """Spans [r0, r1) of t's rows (``ROW_SPAN_ELEMS``), each of ``min_rows`` rows at least
    where t has as many (a short last span is folded into the one before)."""
    n = t.shape[0]
    if t.device.type != "cpu":
        return [(0, n)] if n else []
    step = max(min_rows, ROW_SPAN_ELEMS // max(1, math.prod(t.shape[1:])))
    spans = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
    if len(spans) > 1 and spans[-1][1] - spans[-1][0] < min_rows:
        spans[-2:] = [(spans[-2][0], n)]
    return spans


def _normalized(acc: torch.Tensor, s: torch.Tensor, dtype: torch.dtype):
    """(acc / s, and the same in ``dtype``): acc [rows, *S, ...] divided by its row's sum
    s [rows, *S], span of rows by span of rows."""
    out = torch.empty(acc.shape, dtype=torch.promote_types(acc.dtype, s.dtype),
                      device=acc.device)
    y = out if dtype == out.dtype else torch.empty(acc.shape, dtype=dtype, device=acc.device)
    for r0, r1 in _row_spans(acc):
        torch.div(acc[r0:r1], _expand(s[r0:r1], acc), out=out[r0:r1])
        if y is not out:
            y[r0:r1] = out[r0:r1]
    return out, y


def _row_dots(g: torch.Tensor, y: torch.Tensor, shape) -> torch.Tensor:
    """D = <g, y> per row and score element (``shape``: [rows, *S]), in y's dtype: g is
    taken to it exactly first, span of rows by span of rows."""
    d = torch.empty(shape, dtype=y.dtype, device=y.device)
    trailing = math.prod(y.shape[len(shape):])
    # two rows a span at least: a reduction to one number is split across threads
    # (torch's two-pass reduction), which sums in another order than the whole tensor's
    for r0, r1 in _row_spans(y, min_rows=2):
        yr = y[r0:r1].reshape(r1 - r0, *shape[1:], trailing)
        d[r0:r1] = (g[r0:r1].reshape(yr.shape).to(y.dtype) * yr).sum(-1)
    return d


def _if_edges(edges_into: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Where a softmax's sum ``s`` (rows x score axes) is 0: NaN on the rows with edges (all
    their scores -inf), else 0, in ``s``'s dtype."""
    has = _expand(edges_into > 0, s)
    return torch.where(has, float("nan"), 0.0).to(s.dtype).expand_as(s)


class _AtRows:
    """Adding a part that covers some destination rows only (a piece's ``rows``): the
    rule's state at those rows is merged with it as a whole part is, and written back.
    ``STATE`` names the state tensors, ``IDENTITY`` the value of each before any part
    (what a row no block reaches holds).

    A whole first part becomes the state as it is, not copied (``_add``): a block op's
    partial is a tensor of its own that nothing else reads (with one block, the merge
    then costs no pass over the rows). The state is written in place only where it is
    the rule's own (``owned``): a part at rows copies a block's partial first."""

    STATE: tuple[str, ...] = ()
    IDENTITY: tuple[float, ...] = ()
    owned = False

    def add(self, part, rows: torch.Tensor | None = None, n: int | None = None) -> None:
        if rows is None:
            self.owned = getattr(self, self.STATE[0]) is not None  # combined: new tensors
            self._add(part)
            return
        parts = part if isinstance(part, tuple) else (part,)
        if getattr(self, self.STATE[0]) is None:
            for name, p, value in zip(self.STATE, parts, self.IDENTITY):
                setattr(self, name, _full(n, p, value))
        elif not self.owned:
            for name in self.STATE:
                setattr(self, name, getattr(self, name).clone())
        self.owned = True
        full = [getattr(self, name) for name in self.STATE]
        for name, t in zip(self.STATE, full):
            setattr(self, name, t.index_select(0, rows))
        self._add(part)
        for name, t in zip(self.STATE, full):
            setattr(self, name, t.index_copy_(0, rows, getattr(self, name)))


class SumMerge:
    """sum, and mean (``divisor``: the whole-graph in-degree)."""

    def __init__(self, divisor: torch.Tensor | None = None):
        self.divisor = None if divisor is None else divisor.clamp(min=1)
        self.total: torch.Tensor | None = None
        self.owned = False  # total is this merge's to add to in place (not a block's partial)

    def add(self, y: torch.Tensor, rows: torch.Tensor | None = None, n: int | None = None) -> None:
        if rows is None and self.total is None:  # a whole part first: the total as it is
            self.total = y
            return
        if rows is None and not self.owned and self.total.dtype == y.dtype:
            self.total, self.owned = self.total + y, True
            return
        if self.total is None:
            self.total = _full(n, y, 0.0)
        elif not self.owned:
            self.total = self.total.clone()
        self.owned = True
        if rows is None:
            self.total.add_(y)
        else:
            self.total.index_add_(0, rows, y)

    def finish(self, zeros: torch.Tensor) -> torch.Tensor:
        total = zeros.contiguous() if self.total is None else self.total
        self.total = None  # the cotangent needs only the divisor: free the sums (mean)
        return total if self.divisor is None else total / _rows(self.divisor.to(total.dtype), total)

    def cotangent(self, g: torch.Tensor):
        return g if self.divisor is None else g / _rows(self.divisor.to(g.dtype), g)


class ExtremumMerge(_AtRows):
    """max / min over the blocks with edges; C counts the edges attaining it. A block's NaN
    (count 0: no edge attains it) wins, as on one process."""

    STATE, IDENTITY = ("y", "count"), (0.0, 0.0)  # count 0: no edge yet

    def __init__(self, kind: str):
        self.kind = kind
        self.reducer = reducer(kind)
        self.y: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def _add(self, part) -> None:
        y, c = part
        if self.y is None:
            self.y, self.count = y, c
            return
        better = self.reducer.beats(y, self.y)
        better = better & (c > 0) | (self.count == 0) & (c > 0) & ~torch.isnan(self.y)
        better = better | torch.isnan(y)
        tie = (y == self.y) & (c > 0) & (self.count > 0)
        self.count = torch.where(better, c, torch.where(tie, self.count + c, self.count))
        self.y = torch.where(better, y, self.y)

    def finish(self, zeros: torch.Tensor) -> torch.Tensor:
        """y in the layer's dtype (``zeros``'). The merged y stays as the blocks gave it
        for the cotangent: a block op that computes in float32 for a half-precision layer
        (Triton's) gives its exact extremum, which its backward compares edges with."""
        if self.y is None:
            self.y, self.count = zeros.clone(), zeros.clone()
        y = torch.empty_like(self.y)  # rows no edge reaches (a block's identity there): 0
        zero = torch.zeros((), dtype=y.dtype, device=y.device)
        for r0, r1 in _row_spans(y):
            yr, cr = self.y[r0:r1], self.count[r0:r1]
            torch.where((cr == 0) & ~torch.isnan(yr), zero, yr, out=y[r0:r1])
        self.y = y
        return y.to(zeros.dtype)

    def cotangent(self, g: torch.Tensor):
        spans = _row_spans(g)
        if len(spans) <= 1:
            return self.y, tie_share(g, self.count)
        share = torch.empty(g.shape, dtype=torch.promote_types(g.dtype, self.count.dtype),
                            device=g.device)
        for r0, r1 in spans:
            share[r0:r1] = tie_share(g[r0:r1], self.count[r0:r1])
        return self.y, share


class SoftmaxMerge(_AtRows):
    """Online softmax: per block (m, s, acc), rescaled to the running max."""

    STATE, IDENTITY = ("m", "s", "acc"), (NEG_INF, 0.0, 0.0)

    def __init__(self, score_dims: int, edges_into: torch.Tensor):
        self.score_dims = score_dims  # score axes (with the row axis): m and s have these
        self.edges_into = edges_into  # [rows]: the edges into each row over all blocks
        self.m = self.s = self.acc = None

    def _add(self, part) -> None:
        m, s, acc = part
        if self.m is None:
            self.m, self.s, self.acc = m, s, acc
            return
        self.m, self.s, self.acc = SOFTMAX.combine((self.m, self.s, self.acc), part)

    def finish(self, zeros: torch.Tensor) -> torch.Tensor:
        if self.m is None:
            shape = zeros.shape[:self.score_dims]
            self.m = torch.full(shape, NEG_INF, dtype=zeros.dtype, device=zeros.device)
            self.s = torch.zeros(shape, dtype=zeros.dtype, device=zeros.device)
            self.acc = zeros.contiguous()
        empty = self.s == 0
        self.s = self.s.masked_fill(empty, 1.0)  # a row without a sum: divided by 1
        self.out, y = _normalized(self.acc, self.s, zeros.dtype)
        # a row whose sum is 0: 0 without edges, NaN with (all -inf); on a GPU without
        # asking whether there is one (a host sync every step)
        if self.out.device.type != "cpu" or empty.any():
            has = _expand(self.edges_into > 0, empty)
            for t in (self.out,) if y is self.out else (self.out, y):
                t.masked_fill_(_expand(empty & has, t), float("nan"))
                t.masked_fill_(_expand(empty & ~has, t), 0.0)
            # the backward's statistics: a row whose scores are all -inf weighs its edges
            # NaN (exp(-inf - NaN)), as one process's backward does; a row without edges
            # has none
            self.m = torch.where(empty, _if_edges(self.edges_into, self.m), self.m)
        self.acc = None
        return y

    def cotangent(self, g: torch.Tensor):
        return self.m, self.s, g, _row_dots(g, self.out, self.m.shape)


class NormalizedSoftmaxMerge(SoftmaxMerge):
    """Softmax whose blocks normalized with global (M, S) from a normalizer pass: a sum."""

    def __init__(self, norm: tuple[torch.Tensor, torch.Tensor], edges_into: torch.Tensor):
        super().__init__(norm[0].dim(), edges_into)
        self.m, self.s = norm
        self.total = SumMerge()

    def add(self, part, rows: torch.Tensor | None = None, n: int | None = None) -> None:
        self.total.add(part, rows, n)

    def finish(self, zeros: torch.Tensor) -> torch.Tensor:
        self.out = self.total.finish(zeros)
        return self.out.to(zeros.dtype)


class NormalizerMerge(_AtRows):
    """(M, S) of softmax normalizers over every block: (m_j, s_j) merged online."""

    STATE, IDENTITY = ("m", "s"), (NEG_INF, 0.0)

    def __init__(self, edges_into: torch.Tensor):
        self.edges_into = edges_into  # [rows]: the edges into each row over all blocks
        self.m = self.s = None

    def _add(self, part) -> None:
        m, s = part
        if self.m is None:
            self.m, self.s = m, s
            return
        self.m, self.s = SOFTMAX.combine((self.m, self.s), part)

    def finish(self, shape, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(M, S): M in the scores' ``dtype``, S in float64 (the blocks' sums are)."""
        if self.m is None:
            return (torch.zeros(shape, dtype=dtype, device=device),
                    torch.ones(shape, dtype=torch.float64, device=device))
        empty = self.s == 0
        return (torch.where(empty, _if_edges(self.edges_into, self.m), self.m),
                torch.where(empty, 1.0, self.s))


class SiteShares:
    """The backward of an unfused ``edge_softmax`` across pieces (``sarc.backends.torch_blocks``):
    the main pass leaves, per piece, ``B_j = sum alpha_e g_e`` over its edges of each
    destination (float64, at the piece's rows); the normalizer pass gives each piece
    ``(gbar, B_j)`` at its rows, ``gbar = sum_j B_j`` over every piece of the row."""

    def __init__(self, n: int):
        self.n = n
        self.by_piece: dict = {}
        self.total: torch.Tensor | None = None

    def add(self, key, b: torch.Tensor, rows: torch.Tensor | None) -> None:
        self.by_piece[key] = b
        if self.total is None:
            self.total = b.new_zeros((self.n, *b.shape[1:]))
        if rows is None:
            self.total += b
        else:
            self.total.index_add_(0, rows, b)

    def at(self, key, rows: torch.Tensor | None, like: torch.Tensor) -> tuple:
        """(gbar, B_j) at a piece's rows; zeros where the main pass left nothing (``like``:
        the sums S at those rows, for the shape)."""
        zeros = torch.zeros(like.shape, dtype=torch.float64, device=like.device)
        gbar = zeros if self.total is None else (
            self.total if rows is None else self.total.index_select(0, rows))
        return gbar, self.by_piece.get(key, zeros)


def _linear_merge(agg: Aggregate, in_degree: torch.Tensor, norm):
    return SumMerge(in_degree if reducer(agg.kind).by_degree else None)


def _extremum_merge(agg: Aggregate, in_degree: torch.Tensor, norm):
    return ExtremumMerge(agg.kind)


def _softmax_merge(agg: Aggregate, in_degree: torch.Tensor, norm):
    if norm is not None:
        return NormalizedSoftmaxMerge(norm, in_degree)
    return SoftmaxMerge(1 + len(agg.score_feat), in_degree)


MERGES = {
    "sum": _linear_merge,
    "mean": _linear_merge,
    "max": _extremum_merge,
    "min": _extremum_merge,
    "softmax": _softmax_merge,
}
"""Each reducer's merge (``sarc.ir.reducers``): (aggregate, whole-graph in-degree, the
(M, S) of a normalizer pass or None) -> the merge state."""


def make_merge(agg: Aggregate, in_degree: torch.Tensor, norm=None):
    """The merge of ``agg``; ``norm``: the (M, S) of a normalizer pass (baseline softmax)."""
    rule = MERGES.get(agg.kind)
    if rule is None:
        raise ValueError(f"no merge rule for aggregate kind {agg.kind!r}")
    return rule(agg, in_degree, norm)
