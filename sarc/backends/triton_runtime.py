"""What the Triton backend's generated code runs on: schedules, launches, autograd.

Generated layer modules call the op objects built here (``FusedOp``,
``EdgeSoftmaxOp``, ``TypedLinearOp``, ``TypedAggregateOp``); each op is a
``torch.autograd.Function`` whose forward and backward launch generated Triton
kernels, so a layer compiled for Triton is a drop-in for the PyTorch backend,
gradients included.

Scheduling rows (``graph_view``): a kernel that aggregates over the edges of
each row runs one program per *work item*. Rows are grouped into degree
buckets (``BUCKETS``), one launch per bucket, longest rows first, so a bucket's
programs do similar work and its edge tile (``BLOCK_E``) fits its degrees; a
row with more than ``SPLIT_EDGES`` edges (the hubs of a power-law graph) is cut
into segments, each a program writing a partial result, merged by a combine
kernel: no atomics, no program that walks a hub alone. Empty rows launch
nothing (outputs start at zero). Schedules are computed once per graph and
view (CSR: rows = destinations; CSC: rows = sources) and cached.

Launching (``run``): on a GPU each kernel is wrapped in ``triton.autotune``
over the ``CONFIGS`` listed in its generated module (configs larger than the
bucket's degrees or the feature size pruned), its choices kept in Triton's cache
for the next process (``persisted``). Under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors) there is nothing to time: the first
config runs, its tiles shrunk to the bucket and feature sizes, in an interpreter
that patches Triton's language once per launch (``triton_interpreter``).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Iterator, Sequence

import torch

from ..backward_once import once_differentiable
from ..errors import SarcError
from ..graph import Graph, derived
from ..ir.reducers import REDUCERS, tie_share
from .torch_ops import accumulated_dtype, check_types
from .triton_interpreter import skip_repeated_patches

SPLIT_EDGES = 1024
"""Rows with more edges than this run as several segments (partial results, then a merge)."""

BUCKETS = (16, 64, 256)
"""Degree bucket bounds: rows of degree <= 16, <= 64, <= 256, <= SPLIT_EDGES launch apart."""


class TritonRuntimeError(SarcError):
    """A generated Triton kernel cannot run here (no GPU and no interpreter, wrong device)."""


# --- launching ------------------------------------------------------------------------

def interpreted(kernel) -> bool:
    """Whether ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter)."""
    return type(kernel).__name__ == "InterpretedFunction"


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


_FEATURE_BLOCKS = ("BLOCK_D", "BLOCK_F", "BLOCK_N")


def _clamp(meta: dict, max_deg: int | None, d: int | None) -> dict:
    """Shrink a config's tiles to the work: the bucket's largest degree, the feature size."""
    meta = dict(meta)
    if max_deg is not None and "BLOCK_E" in meta:
        meta["BLOCK_E"] = min(meta["BLOCK_E"], max(2, _pow2(max_deg)))
    if d is not None:
        for k in _FEATURE_BLOCKS:
            if k in meta and meta[k] > 1:
                floor = 16 if k == "BLOCK_N" else 2  # tl.dot needs blocks of at least 16
                meta[k] = min(meta[k], max(floor, _pow2(d)))
    return meta


def _prune(configs, named_args, **kwargs):
    """Autotune pruning: drop tiles much larger than the bucket's degrees / the features."""
    max_deg = named_args.get("MAX_DEG")
    d = next((named_args[k] for k in ("D", "F", "N") if k in named_args), None)
    keep = []
    for c in configs:
        m = c.kwargs
        if max_deg is not None and m.get("BLOCK_E", 0) > max(16, _pow2(max_deg)):
            continue
        if d is not None and any(m.get(k, 1) > max(16, _pow2(d)) for k in _FEATURE_BLOCKS):
            continue
        keep.append(c)
    return keep or [min(configs, key=lambda c: tuple(c.kwargs.values()))]


_TUNED: dict[int, tuple] = {}  # id(kernel) -> (kernel, its autotuned wrapper)


def persisted() -> dict:
    """``triton.autotune``'s option to keep its choices on disk, where the installed Triton
    has it (3.2 and later): in Triton's cache, keyed by the kernel's source, the device's
    backend, the configs and the key's values (the shape bucket), so a second process
    reuses them instead of benchmarking every config again."""
    import inspect

    import triton
    return ({"cache_results": True}
            if "cache_results" in inspect.signature(triton.autotune).parameters else {})


def run(kernel, configs: Sequence, key: list[str], grid: Callable[[dict], tuple],
        args: Sequence, constexprs: dict, *, max_deg: int | None, d: int | None) -> None:
    """Launch ``kernel``: autotuned on a GPU; the first config under the interpreter."""
    if interpreted(kernel):
        skip_repeated_patches()
        meta = _clamp(configs[0].kwargs, max_deg, d)
        kernel[grid(meta)](*args, **meta, **constexprs)
        return
    if id(kernel) not in _TUNED:
        import triton
        _TUNED[id(kernel)] = (kernel, triton.autotune(
            configs=list(configs), key=key, prune_configs_by={"early_config_prune": _prune},
            **persisted())(kernel))
    _TUNED[id(kernel)][1][grid](*args, **constexprs)


def check_device(name: str, kernel, tensors: Sequence[torch.Tensor]) -> None:
    if interpreted(kernel):
        return
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "cuda":
            raise TritonRuntimeError(
                f"{name}: the Triton backend runs on GPU tensors, got a tensor on {t.device} "
                f"(on a CPU-only machine set TRITON_INTERPRET=1 before compiling the layer to "
                f"run its kernels in Triton's interpreter, or use backend='torch')")


# --- schedules ------------------------------------------------------------------------

@dataclass(frozen=True)
class Items:
    """Work items of a row kernel: (row, edges [lo, hi), output slot), one program each.

    ``max_deg`` bounds the items' edge counts, rounded up to a power of two: it prunes
    the edge tiles and keys the autotuner, so a new graph with similar degrees does not
    retune.
    """

    row: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    slot: torch.Tensor
    n: int
    max_deg: int


@dataclass(frozen=True)
class Split:
    """The rows longer than ``SPLIT_EDGES``: their segments and how to merge them."""

    segs: Items              # one per segment; slot = the segment's partial-result row
    rows: torch.Tensor       # the split rows
    seg_lo: torch.Tensor     # each split row's segments are slots [seg_lo, seg_hi)
    seg_hi: torch.Tensor
    degree: torch.Tensor     # each split row's degree (float; a mean divides by it)
    whole: Items             # the split rows as whole rows (kernels that do not split)
    n_rows: int
    n_segs: int


@dataclass(frozen=True)
class View:
    """A graph seen from one side. ``csr``: rows are destinations, edges in CSR order;
    ``csc``: rows are sources, ``eid`` maps each (CSC-ordered) edge to its CSR index."""

    name: str
    num_rows: int
    ptr: torch.Tensor
    other: torch.Tensor      # the other endpoint of each edge, in this view's order
    eid: torch.Tensor | None
    degree: torch.Tensor     # [num_rows] float32
    buckets: tuple[Items, ...]
    split: Split | None

    def whole_rows(self) -> tuple[Items, ...]:
        """Every non-empty row as one work item (for kernels that do not split rows)."""
        return self.buckets + ((self.split.whole,) if self.split is not None else ())


_VIEWS: "weakref.WeakKeyDictionary[Graph, dict]" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def row_schedule(buckets: Sequence[int], split_edges: int | None) -> Iterator[None]:
    """Rows scheduled by other degree bounds (``BUCKETS``) and cut at another length
    (``SPLIT_EDGES``; None: never) while inside, to measure one schedule against another
    (``benchmarks/gpu_schedule.py``). Every schedule computes the same values: a kernel
    walks any row in tiles, whatever its bucket. Views are cached under their bounds."""
    global BUCKETS, SPLIT_EDGES
    if any(int(b) < 1 for b in buckets) or (split_edges is not None and int(split_edges) < 1):
        raise ValueError(f"row schedule: bucket bounds and the split length are at least 1, "
                         f"got buckets {tuple(buckets)}, split {split_edges}")
    saved = BUCKETS, SPLIT_EDGES
    BUCKETS = tuple(sorted({int(b) for b in buckets}))
    SPLIT_EDGES = _NEVER_SPLIT if split_edges is None else int(split_edges)
    try:
        yield
    finally:
        BUCKETS, SPLIT_EDGES = saved


_NEVER_SPLIT = 1 << 62
"""A split length no row reaches."""


def graph_view(g: Graph, name: str) -> View:
    """The CSR (``"csr"``) or CSC (``"csc"``) view of ``g`` with its row schedule (cached)."""
    cache = _VIEWS.setdefault(g, {})
    key = (name, SPLIT_EDGES, BUCKETS)
    if key not in cache:
        cache[key] = _build_view(g, name)
    return cache[key]


def _build_view(g: Graph, name: str) -> View:
    if name == "csr":
        ptr, other, eid, rows = g.rowptr, g.src, None, g.num_dst
    else:
        eid = torch.argsort(g.src, stable=True)
        counts = torch.bincount(g.src, minlength=g.num_src)
        ptr = torch.zeros(g.num_src + 1, dtype=torch.int64, device=g.device)
        ptr[1:] = torch.cumsum(counts, 0)
        other, rows = g.dst.index_select(0, eid), g.num_src
    deg = ptr[1:] - ptr[:-1]
    buckets, split = _schedule(ptr, deg)
    return View(name, rows, ptr, other, eid, deg.to(torch.float32), buckets, split)


def _items(ptr, rows, deg) -> Items:
    order = torch.argsort(deg.index_select(0, rows), descending=True, stable=True)
    rows = rows.index_select(0, order)
    return Items(rows, ptr.index_select(0, rows), ptr.index_select(0, rows + 1), rows,
                 int(rows.numel()), _pow2(int(deg.index_select(0, rows).max())))


def _schedule(ptr: torch.Tensor, deg: torch.Tensor) -> tuple[tuple[Items, ...], Split | None]:
    bounds = sorted({b for b in BUCKETS if b < SPLIT_EDGES} | {SPLIT_EDGES})
    buckets, lo = [], 0
    for hi in bounds:
        rows = ((deg > lo) & (deg <= hi)).nonzero().squeeze(1)
        if rows.numel():
            buckets.append(_items(ptr, rows, deg))
        lo = hi
    long = (deg > SPLIT_EDGES).nonzero().squeeze(1)
    if not long.numel():
        return tuple(buckets), None
    nseg = (deg.index_select(0, long) + SPLIT_EDGES - 1) // SPLIT_EDGES
    seg_row = long.repeat_interleave(nseg)
    first = torch.cumsum(nseg, 0) - nseg
    k = torch.arange(seg_row.numel(), device=ptr.device) - first.repeat_interleave(nseg)
    seg_lo = ptr.index_select(0, seg_row) + k * SPLIT_EDGES
    seg_hi = torch.minimum(seg_lo + SPLIT_EDGES, ptr.index_select(0, seg_row + 1))
    n = int(seg_row.numel())
    segs = Items(seg_row, seg_lo, seg_hi, torch.arange(n, device=ptr.device), n,
                 _pow2(SPLIT_EDGES))
    split = Split(segs, long, first, first + nseg, deg.index_select(0, long).to(torch.float32),
                  _items(ptr, long, deg), int(long.numel()), n)
    return tuple(buckets), split


@dataclass(frozen=True)
class TypeGroups:
    """Rows grouped by type: ``order`` sorts them stably, type r owns ``order[seg[r]:seg[r+1]]``."""

    order: torch.Tensor
    seg: torch.Tensor
    num_types: int
    max_count: int


def graph_type_groups(g: Graph, types: torch.Tensor, num_types: int) -> TypeGroups:
    """``type_groups`` of an edge tensor of ``g``, kept with the graph (``graph.derived``)."""
    return derived(g, ("type groups", num_types), types, lambda: type_groups(types, num_types))


def type_groups(types: torch.Tensor, num_types: int) -> TypeGroups:
    check_types(types, num_types)
    order = torch.argsort(types, stable=True)
    counts = torch.bincount(types, minlength=num_types)
    seg = torch.zeros(num_types + 1, dtype=torch.int64, device=types.device)
    seg[1:] = torch.cumsum(counts, 0)
    return TypeGroups(order, seg, num_types, int(counts.max()) if types.numel() else 0)


# --- kernels of one op ------------------------------------------------------------------

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class AggregateKernel:
    """``y[r] = kind over the edges of row r of body(e)`` over view ``view`` (rows r)."""

    kind: str
    view: str
    feat: tuple[int, ...]
    main: ModuleType
    combine: ModuleType

    def __call__(self, g: Graph, xs: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        view = graph_view(g, self.view)
        out = torch.zeros((view.num_rows, *self.feat), dtype=dtype, device=g.device)
        for items in view.buckets:
            self.main.launch(run, xs, out, items, view, True)
        if view.split is not None:
            part = torch.empty((view.split.n_segs, *self.feat), dtype=_acc_dtype(dtype),
                               device=g.device)
            self.main.launch(run, xs, part, view.split.segs, view, False)
            self.combine.launch(run, part, out, view.split)
        return out


@dataclass(frozen=True)
class SddmmKernel:
    """``y[e] = body(e)`` for every edge (CSR order)."""

    feat: tuple[int, ...]
    main: ModuleType

    def __call__(self, g: Graph, xs: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty((g.num_edges, *self.feat), dtype=dtype, device=g.device)
        if g.num_edges:
            self.main.launch(run, xs, out, g)
        return out


@dataclass(frozen=True)
class SoftmaxKernel:
    """``y[v] = sum_e softmax_v(score)(e) * value(e)``; also returns each row's max score m
    and sum l of exp(score - m), apart: at a max far from zero (a masked edge's -1e9)
    ``m + log(l)`` would round l away, and the weights ``exp(score - m) / l`` the backward
    computes again would not be the forward's."""

    score_feat: tuple[int, ...]
    feat: tuple[int, ...]
    main: ModuleType
    combine: ModuleType

    def __call__(self, g: Graph, xs, dtype):
        view = graph_view(g, "csr")
        acc = _acc_dtype(dtype)
        out = torch.zeros((view.num_rows, *self.feat), dtype=dtype, device=g.device)
        m_row = torch.zeros((view.num_rows, *self.score_feat), dtype=acc, device=g.device)
        l_row = torch.zeros((view.num_rows, *self.score_feat), dtype=acc, device=g.device)
        for items in view.buckets:
            self.main.launch(run, xs, out, m_row, l_row, items, view, True)
        if view.split is not None:
            n = view.split.n_segs
            part = torch.empty((n, *self.feat), dtype=acc, device=g.device)
            m = torch.empty((n, *self.score_feat), dtype=acc, device=g.device)
            l_ = torch.empty((n, *self.score_feat), dtype=acc, device=g.device)
            self.main.launch(run, xs, part, m, l_, view.split.segs, view, False)
            self.combine.launch(run, part, m, l_, out, m_row, l_row, view.split)
        return out, m_row, l_row


@dataclass(frozen=True)
class Grad:
    """How operand ``operand`` (read at ``side``) gets its gradient: ``kernel`` sums the
    per-edge cotangent over where it was read (a parameter's rows are summed after)."""

    operand: int
    side: str
    kernel: AggregateKernel | SddmmKernel


def _rowwise(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.view(-1, *([1] * (like.dim() - 1)))


@dataclass(frozen=True)
class FusedOp:
    """An aggregate, SDDMM or softmax_aggregate compiled to Triton kernels.

    ``kind``: the reduction of an aggregate (sum / mean / max / min), "sddmm" or
    "softmax"; ``row_side``: the rows an aggregate reduces into ("dst": CSR, "src":
    CSC); ``grads``: per operand, its gradient kernel; ``row_sum``: for max / min,
    the kernel counting each row's ties, for softmax the one summing each row's
    score gradients (``sigma``, see ``triton_grad``).
    """

    name: str
    kind: str
    row_side: str
    dtype: torch.dtype
    forward: AggregateKernel | SddmmKernel | SoftmaxKernel
    grads: dict[int, Grad]
    row_sum: AggregateKernel | None = None
    value_extra: int = 0   # softmax: value axes beyond the score's (summed in delta)
    exact: torch.dtype | None = None   # max / min: y's dtype for the ties, where the region
    #                                    computes finer than its result's accumulator (f64)

    def __call__(self, g: Graph, *xs: torch.Tensor) -> torch.Tensor:
        check_device(self.name, self.forward.main.kernel, [g.src, *xs])
        return _FusedFunction.apply(self, g, *xs)

    def surrogate(self, g: Graph, cot: torch.Tensor, *xs: torch.Tensor) -> torch.Tensor:
        """``sum(self(g, *xs) * cot)`` for its gradient alone (a distributed block's
        surrogate, never read): a sum or mean needs nothing of its forward, so none runs;
        the backward kernels run with ``dy = cot``."""
        if self.kind not in REDUCERS or not REDUCERS[self.kind].linear or cot.requires_grad:
            return (self(g, *xs) * cot).sum()
        check_device(self.name, self.forward.main.kernel, [g.src, *xs])
        return _FusedVjp.apply(self, g, cot, *xs)

    def result_dtype(self, xs) -> torch.dtype:
        """The dtype of the op's result on operands ``xs``: the IR's, except where half or
        bfloat16 operands meet an op traced in float32 (``torch.autocast``): the torch
        backend's for them (``torch_ops.accumulated_dtype``)."""
        if self.dtype != torch.float32 or not xs:
            return self.dtype
        dtype = accumulated_dtype((x.dtype for x in xs if x.is_floating_point()),
                                  self.kind == "softmax", xs[0].device.type)
        return self.dtype if dtype is None else dtype

    def run_forward(self, g: Graph, xs) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        dtype = self.result_dtype(xs)
        if self.kind == "softmax":
            out, m, l_ = self.forward(g, xs, dtype)
            return out, (out, m, l_)
        if self._selects:
            # y as the region computes it (exact), for the backward's ties: an edge's value
            # is compared with it, and a rounded y would be attained by no edge
            y = self.forward(g, xs, self.exact or _acc_dtype(dtype))
            return y.to(dtype), (y,)
        return self.forward(g, xs, dtype), ()

    @property
    def _selects(self) -> bool:
        return self.kind in REDUCERS and REDUCERS[self.kind].selects

    def extras(self, g: Graph, xs, saved, dy: torch.Tensor) -> list[torch.Tensor]:
        """What the gradient regions read after the operands (``triton_grad.EXTRAS``)."""
        r = REDUCERS.get(self.kind)  # None: an sddmm
        if r is None or r.node_level and not (r.by_degree or r.selects):
            return [dy]
        if r.by_degree:
            deg = graph_view(g, "csr" if self.row_side == "dst" else "csc").degree
            return [dy / _rowwise(deg.clamp(min=1).to(dy.dtype), dy)]
        if r.selects:
            (y,) = saved
            ties = self.row_sum(g, [*xs, y], y.dtype)
            return [y, tie_share(dy.to(y.dtype), ties)]
        out, m, l_ = saved
        acc = m.dtype
        delta = dy.to(acc) * out.to(acc)
        for _ in range(self.value_extra):
            delta = delta.sum(-1)
        sigma = self.row_sum(g, [*xs, dy, m, l_, delta], acc)
        return [dy, m, l_, delta, sigma]

    def run_backward(self, g: Graph, xs, saved, dy: torch.Tensor, needs) -> list:
        dy = dy.contiguous()
        return self.operand_grads(g, xs, [*xs, *self.extras(g, xs, saved, dy)], needs)

    def operand_grads(self, g: Graph, xs, feeds, needs, dtype: torch.dtype | None = None) -> list:
        """Each operand's gradient (None where not ``needs``) from the gradient kernels,
        which read ``feeds``: the operands, then the extras (``triton_grad.EXTRAS``); in
        the operand's dtype, or ``dtype``."""
        grads: list[torch.Tensor | None] = []
        for k, (x, need) in enumerate(zip(xs, needs)):
            gr = self.grads.get(k)
            if not need or gr is None:
                grads.append(None)
                continue
            dt = dtype or x.dtype
            if gr.side == "param":
                rows = gr.kernel(g, feeds, _acc_dtype(dt))
                grads.append(rows.sum(0).reshape(x.shape).to(dt))
            else:
                grads.append(gr.kernel(g, feeds, dt))
        return grads


class _FusedVjp(torch.autograd.Function):
    """``FusedOp.surrogate``: forward keeps the operands and computes nothing."""

    @staticmethod
    def forward(ctx, op: FusedOp, g: Graph, cot, *xs):
        ctx.op, ctx.g, ctx.cot = op, g, cot.detach()
        ctx.save_for_backward(*xs)
        return cot.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        grads = ctx.op.run_backward(ctx.g, ctx.saved_tensors, (), ctx.cot * grad,
                                    ctx.needs_input_grad[3:])
        return (None, None, None, *grads)


class _FusedFunction(torch.autograd.Function):
    """Forward and backward of a ``FusedOp``: only its operands (node values, edge inputs)
    and per-row results are kept; edge values are recomputed by the gradient kernels."""

    @staticmethod
    def forward(ctx, op: FusedOp, g: Graph, *xs):
        out, saved = op.run_forward(g, xs)
        ctx.op, ctx.g, ctx.n = op, g, len(xs)
        ctx.save_for_backward(*xs, *saved)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        tensors = ctx.saved_tensors
        xs, saved = tensors[:ctx.n], tensors[ctx.n:]
        grads = ctx.op.run_backward(ctx.g, xs, saved, dy, ctx.needs_input_grad[2:])
        return (None, None, *grads)


@dataclass(frozen=True)
class EdgeSoftmaxOp:
    """An unfused ``edge_softmax`` (its result is used beyond one aggregate, e.g. dropped out)."""

    name: str
    forward: ModuleType
    backward: ModuleType

    def __call__(self, g: Graph, x: torch.Tensor) -> torch.Tensor:
        check_device(self.name, self.forward.kernel, [g.src, x])
        return _EdgeSoftmaxFunction.apply(self, g, x)


class _EdgeSoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: EdgeSoftmaxOp, g: Graph, x):
        # the feature size from the shape, not -1: with no edges -1 would be ambiguous
        x2 = x.reshape(x.shape[0], math.prod(x.shape[1:])).contiguous()
        y = torch.empty_like(x2)
        for items in graph_view(g, "csr").whole_rows():
            op.forward.launch(run, x2, y, items)
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(y)
        return y.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy2 = dy.reshape(y.shape).contiguous()
        dx = torch.empty_like(y)
        for items in graph_view(ctx.g, "csr").whole_rows():
            ctx.op.backward.launch(run, y, dy2, dx, items)
        return None, None, dx.view(dy.shape)


@dataclass(frozen=True)
class SoftmaxSiteOp:
    """An unfused ``edge_softmax`` on a distributed block: the kernels of its block ops
    (``triton_blocks``: normalizer pass, global weights, their gradients). Every kernel
    reads the scores in their own dtype and computes in float64; node tensors (M, S and
    the row sums) are float64, edge results are in the score's dtype."""

    name: str
    kernels: dict[str, ModuleType]   # triton_source.SITE_PARTS -> its module

    def check(self, g: Graph, *tensors: torch.Tensor) -> None:
        check_device(self.name, self.kernels["normalizer"].kernel, [g.src, *tensors])

    def _launch(self, part: str, g: Graph, tensors) -> None:
        for items in graph_view(g, "csr").whole_rows():
            self.kernels[part].launch(run, tensors, items)

    def normalizer(self, g: Graph, x: torch.Tensor):
        """(m, s): the block's max score per row (x's dtype; -inf on rows without edges)
        and sum exp(x - m) (float64; 0 there)."""
        x2 = _edge_rows(x)
        m = torch.full((g.num_dst, x2.shape[1]), float("-inf"), dtype=x.dtype, device=x.device)
        s = torch.zeros((g.num_dst, x2.shape[1]), dtype=torch.float64, device=x.device)
        self._launch("normalizer", g, (x2, m, s))
        return m.view(g.num_dst, *x.shape[1:]), s.view(g.num_dst, *x.shape[1:])

    def weights(self, g: Graph, x: torch.Tensor, big_m, big_s, scale=None) -> torch.Tensor:
        """alpha = exp(x - M) / S per edge (times ``scale`` at its row, where given), in
        x's dtype."""
        x2 = _edge_rows(x)
        y = torch.empty_like(x2)
        nodes = [_node_rows(t, x2) for t in (big_m, big_s) + ((scale,) if scale is not None else ())]
        self._launch("weights" if scale is None else "scaled_weights", g, (x2, *nodes, y))
        return y.view(x.shape)

    def row_sums(self, g: Graph, x: torch.Tensor, big_m, big_s) -> torch.Tensor:
        """A = sum alpha over each row's edges (float64)."""
        x2 = _edge_rows(x)
        a = torch.zeros((g.num_dst, x2.shape[1]), dtype=torch.float64, device=x.device)
        self._launch("row_sums", g, (x2, _node_rows(big_m, x2), _node_rows(big_s, x2), a))
        return a.view(g.num_dst, *x.shape[1:])

    def row_shares(self, g: Graph, x: torch.Tensor, big_m, big_s, dy: torch.Tensor):
        """(dx, B): dx = alpha (dy - B / A) in x's dtype, B = sum alpha dy (float64)."""
        x2 = _edge_rows(x)
        dx = torch.empty_like(x2)
        b = torch.zeros((g.num_dst, x2.shape[1]), dtype=torch.float64, device=x.device)
        self._launch("row_shares", g, (x2, _node_rows(big_m, x2), _node_rows(big_s, x2),
                                       dy.reshape(x2.shape).contiguous(), dx, b))
        return dx.view(x.shape), b.view(g.num_dst, *x.shape[1:])


def _edge_rows(x: torch.Tensor) -> torch.Tensor:
    """x as a contiguous [E, F] (the feature size from the shape: -1 is ambiguous at E = 0)."""
    return x.reshape(x.shape[0], math.prod(x.shape[1:])).contiguous()


def _node_rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A node tensor as the site kernels read it: contiguous float64 [N, F]."""
    return t.to(torch.float64).reshape(t.shape[0], like.shape[1]).contiguous()


@dataclass(frozen=True)
class TypedLinearOp:
    """``y[i] = x[i] @ W[t_i]``, the rows of x gathered from node rows (``gather``: "src" /
    "dst") when the input is an edge value read at an endpoint."""

    name: str
    gather: str | None
    forward: ModuleType
    grad_x: ModuleType
    grad_w: ModuleType
    scatter: AggregateKernel | None   # per-edge dx -> node rows (the transposed gather)

    def __call__(self, g: Graph, x: torch.Tensor, w: torch.Tensor, types: torch.Tensor):
        check_device(self.name, self.forward.kernel, [g.src, x, w, types])
        return _TypedLinearFunction.apply(self, g, x, w, types)

    def rows(self, g: Graph) -> torch.Tensor | None:
        return None if self.gather is None else (g.src if self.gather == "src" else g.dst)


def _widen(module: ModuleType, x: torch.Tensor) -> bool:
    """Under the interpreter, bfloat16 tiles go to tl.dot as float32 (its bfloat16 dot is
    wrong in triton 3.x); on a GPU they stay bfloat16 (tensor cores)."""
    return interpreted(module.kernel) and x.dtype == torch.bfloat16


def typed_rows(op: TypedLinearOp, g: Graph, x: torch.Tensor, w: torch.Tensor,
               groups: TypeGroups) -> torch.Tensor:
    """``y[i] = x[i] @ W[t_i]`` (x's rows gathered when ``op.gather``), one segment GEMM."""
    k, n = w.shape[1], w.shape[2]
    y = torch.empty((groups.order.numel(), n), dtype=x.dtype, device=x.device)
    if y.shape[0]:
        op.forward.launch(run, x, w, y, groups, op.rows(g), k, n, _widen(op.forward, x))
    return y


def typed_rows_grads(op: TypedLinearOp, g: Graph, x: torch.Tensor, w: torch.Tensor,
                     groups: TypeGroups, dy: torch.Tensor, need_x: bool, need_w: bool):
    """The gradients of ``typed_rows`` for x (scattered back to its node rows when it was
    gathered) and W, from the rows' gradient ``dy``."""
    k, n = w.shape[1], w.shape[2]
    dy = dy.contiguous()
    dx = dw = None
    if need_x:
        rows = torch.empty((dy.shape[0], k), dtype=x.dtype, device=x.device)
        if dy.shape[0]:
            op.grad_x.launch(run, dy, w.transpose(1, 2), rows, groups, None, n, k,
                             _widen(op.grad_x, dy))
        dx = rows if op.scatter is None else op.scatter(g, [rows], x.dtype)
    if need_w:
        acc = torch.zeros(w.shape, dtype=_acc_dtype(w.dtype), device=w.device)
        if dy.shape[0]:
            op.grad_w.launch(run, x, dy, acc, groups, op.rows(g), k, n, _widen(op.grad_w, x))
        dw = acc.to(w.dtype)
    return dx, dw


class _TypedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op: TypedLinearOp, g: Graph, x, w, types):
        groups = graph_type_groups(g, types, w.shape[0])
        ctx.op, ctx.g, ctx.groups = op, g, groups
        ctx.save_for_backward(x, w)
        return typed_rows(op, g, x, w, groups)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = typed_rows_grads(ctx.op, ctx.g, x, w, ctx.groups, dy,
                                  ctx.needs_input_grad[2], ctx.needs_input_grad[3])
        return None, None, dx, dw, None


# --- an aggregate of typed rows ------------------------------------------------------------

def typed_graph(g: Graph, types: torch.Tensor, num_types: int) -> Graph:
    """``g`` with the source of edge e renamed ``src[e] * num_types + types[e]``: its rows
    are those of a node x type table. Kept with the graph while its type ids are the same
    tensor, unchanged (``graph.derived``: its views are built once)."""
    def build() -> Graph:
        check_types(types, num_types)
        src = g.src * num_types + types
        n = g.num_src * num_types
        return Graph(num_src=n, num_dst=g.num_dst, src=src, dst=g.dst, perm=g.perm,
                     rowptr=g.rowptr, in_degree=g.in_degree,
                     out_degree=torch.bincount(src, minlength=n).to(torch.float32),
                     dst_in_src=False)
    return derived(g, ("typed graph", num_types), types, build)


@dataclass(frozen=True)
class TypedAggregateOp:
    """An aggregate of a typed linear's rows, ``y[v] = kind_e body(x[src e] @ W[t_e], rest)``
    (``passes.fuse_typed_linear``; operands ``x``, ``table``, ``types`` at their positions,
    the body's other operands ``rest``), as the PyTorch backend's ``typed_spmm`` computes it:

    - when nodes x types are no more than edges, ``x @ W[r]`` once per (node, type) pair
      (a batched GEMM) and the aggregate ``by_table`` over ``typed_graph``, whose sources are
      the table's rows;
    - otherwise the rows per edge (``linear``: the segment GEMM with x's rows gathered) and
      the aggregate ``by_edge`` of them.

    Neither keeps a table or E x D rows for the backward pass: only the operands; the rows
    are computed again there where another operand's gradient reads them.
    """

    name: str
    x: int
    table: int
    types: int
    by_table: FusedOp
    by_edge: FusedOp
    linear: TypedLinearOp

    def __call__(self, g: Graph, *xs: torch.Tensor) -> torch.Tensor:
        check_device(self.name, self.by_table.forward.main.kernel, [g.src, *xs])
        return _TypedAggregateFunction.apply(self, g, *xs)

    def surrogate(self, g: Graph, cot: torch.Tensor, *xs: torch.Tensor) -> torch.Tensor:
        """``sum(self(g, *xs) * cot)`` for its gradient alone, as ``FusedOp.surrogate``."""
        if cot.requires_grad:
            return (self(g, *xs) * cot).sum()
        check_device(self.name, self.by_table.forward.main.kernel, [g.src, *xs])
        return _TypedAggregateVjp.apply(self, g, cot, *xs)

    def split(self, xs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        rest = [a for k, a in enumerate(xs) if k not in (self.x, self.table, self.types)]
        return xs[self.x], xs[self.table], xs[self.types], rest


def _table_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The node x type table ``x @ W[r]`` ([N * R, out]); half and bfloat16 computed in
    float32 and kept there (the aggregate reads it as is and rounds its result once)."""
    acc = _acc_dtype(x.dtype)
    return torch.einsum("ni,rio->nro", x.to(acc), w.to(acc)).reshape(-1, w.shape[2])


class _TypedAggregateFunction(torch.autograd.Function):
    @staticmethod
    def keep(ctx, op: TypedAggregateOp, g: Graph, xs) -> None:
        """Which way the op runs on ``g`` and what its backward pass reads."""
        _, w, types, _ = op.split(xs)
        num_types = w.shape[0]
        ctx.by_table = g.num_src * num_types <= g.num_edges
        if ctx.by_table:
            ctx.graph = typed_graph(g, types, num_types)
        else:
            ctx.graph, ctx.groups = g, graph_type_groups(g, types, num_types)
        ctx.op, ctx.g = op, g
        ctx.save_for_backward(*xs)

    @staticmethod
    def forward(ctx, op: TypedAggregateOp, g: Graph, *xs):
        _TypedAggregateFunction.keep(ctx, op, g, xs)
        x, w, _, rest = op.split(xs)
        if ctx.by_table:
            return op.by_table.run_forward(ctx.graph, [_table_rows(x, w), *rest])[0]
        rows = typed_rows(op.linear, g, x, w, ctx.groups)
        return op.by_edge.run_forward(g, [rows, *rest])[0]

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return (None, None, *_typed_aggregate_grads(ctx, dy, ctx.needs_input_grad[2:]))


def _typed_aggregate_grads(ctx, dy: torch.Tensor, needs) -> list:
    """The operands' gradients of a ``TypedAggregateOp`` from its output's, ``ctx`` as
    ``_TypedAggregateFunction.keep`` left it (None where not ``needs``)."""
    op = ctx.op
    xs = ctx.saved_tensors
    x, w, _, rest = op.split(xs)
    need_rest = [n for k, n in enumerate(needs) if k not in (op.x, op.table, op.types)]
    agg = op.by_table if ctx.by_table else op.by_edge
    rows = None
    if any(need_rest):  # their gradient regions read the rows
        rows = (_table_rows(x, w) if ctx.by_table
                else typed_rows(op.linear, ctx.g, x, w, ctx.groups))
    operands = [rows, *rest]
    dy = dy.contiguous()
    feeds = [*operands, *agg.extras(ctx.graph, operands, (), dy)]
    rest_grads = iter(agg.operand_grads(ctx.graph, operands, feeds, [False, *need_rest])[1:])
    dx = dw = None
    if needs[op.x] or needs[op.table]:
        if ctx.by_table:
            acc = _acc_dtype(x.dtype)
            d_rows = agg.grads[0].kernel(ctx.graph, feeds, acc)
            d_rows = d_rows.view(x.shape[0], w.shape[0], w.shape[2])
            if needs[op.x]:
                dx = torch.einsum("nro,rio->ni", d_rows, w.to(acc)).to(x.dtype)
            if needs[op.table]:
                dw = torch.einsum("ni,nro->rio", x.to(acc), d_rows).to(w.dtype)
        else:
            d_rows = agg.grads[0].kernel(ctx.graph, feeds, x.dtype)
            dx, dw = typed_rows_grads(op.linear, ctx.g, x, w, ctx.groups, d_rows,
                                      needs[op.x], needs[op.table])
    grads = []
    for k in range(len(xs)):
        grads.append(dx if k == op.x else dw if k == op.table else None if k == op.types
                     else next(rest_grads))
    return grads


class _TypedAggregateVjp(torch.autograd.Function):
    """``TypedAggregateOp.surrogate``: forward computes nothing; backward is the op's."""

    @staticmethod
    def forward(ctx, op: TypedAggregateOp, g: Graph, cot, *xs):
        _TypedAggregateFunction.keep(ctx, op, g, xs)
        ctx.cot = cot.detach()
        return cot.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return (None, None, None,
                *_typed_aggregate_grads(ctx, ctx.cot * grad, ctx.needs_input_grad[3:]))


__all__ = ["AggregateKernel", "SddmmKernel", "SoftmaxKernel", "Grad", "FusedOp", "EdgeSoftmaxOp",
           "TypedLinearOp", "TypedAggregateOp", "typed_graph", "graph_view", "type_groups", "run",
           "row_schedule", "SPLIT_EDGES", "BUCKETS", "TritonRuntimeError"]
