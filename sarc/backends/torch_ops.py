"""Graph kernels the generated PyTorch code calls: CSR segment reductions.

Edges are sorted by destination (``Graph`` guarantees it), so every
aggregation is a ``torch.segment_reduce`` over ``g.rowptr``: no atomics, no
scatter, and autograd support on CPU and GPU. Nothing here loops over nodes or
edges in Python; ``typed_linear`` loops over edge *types* only.

Half and bfloat16 layers: every op that sums over edges (``accumulates``) sums in
float32 and rounds its result once to the layer's dtype, forward and backward, so a
node of many in-edges is as exact as one of few.
"""
from __future__ import annotations

import functools
import math
import warnings
import weakref
from typing import Callable

import torch

from ..amp import autocast_state, cast_by_autocast  # noqa: F401 - generated code calls K.cast_by_autocast
from ..backward_once import once_differentiable
from ..graph import Graph
from ..native import kernels as cpu_kernels

LOW_PRECISION = (torch.float16, torch.bfloat16)


def _cast(out, dtype: torch.dtype):
    if isinstance(out, torch.Tensor):
        return out.to(dtype) if out.is_floating_point() else out
    if isinstance(out, tuple):
        return tuple(_cast(o, dtype) for o in out)
    return out


def accumulated_dtype(dtypes, softmax: bool, device_type: str) -> torch.dtype | None:
    """The dtype of an edge sum over operands of ``dtypes`` where one is half / bfloat16
    (None where none is): their promoted dtype, as torch's arithmetic on them gives it;
    a softmax's (``softmax``) float32 at least under autocast on ``device_type``, whose
    softmax is float32."""
    dtypes = list(dtypes)
    if not any(d in LOW_PRECISION for d in dtypes):
        return None
    dtype = functools.reduce(torch.promote_types, dtypes)
    if softmax and autocast_state(device_type)[0]:
        dtype = torch.promote_types(dtype, torch.float32)
    return dtype


def accumulates(fn=None, *, softmax: bool = False):
    """An op summing over edges: half / bfloat16 operands are summed in float32, the result
    rounded once to the operands' promoted dtype, as torch's arithmetic on them gives it
    (half where all are; float32 where a float32 operand meets a half one). The cast's
    gradient rounds the backward the same way. ``softmax``: an op whose weights are a
    softmax's, which autocast computes in float32 (as the interpreter's ``torch.softmax``
    under it): under autocast its result is float32 at least."""
    if fn is None:
        return functools.partial(accumulates, softmax=softmax)

    def up(a):
        return a.float() if isinstance(a, torch.Tensor) and a.dtype in LOW_PRECISION else a

    @functools.wraps(fn)
    def run(*args, **kwargs):
        floats = [a for a in (*args, *kwargs.values())
                  if isinstance(a, torch.Tensor) and a.is_floating_point()]
        dtype = accumulated_dtype((a.dtype for a in floats), softmax,
                                  floats[0].device.type if floats else "cpu")
        if dtype is None:
            return fn(*args, **kwargs)
        with torch.autocast(floats[0].device.type, enabled=False):  # it would cast back down
            return _cast(fn(*map(up, args), **{k: up(a) for k, a in kwargs.items()}), dtype)
    return run



def rounded(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A fused op's result in the half / bfloat16 dtype the IR gives it, where autocast is
    off: ``accumulates`` rounds to its operands' promoted dtype, and a region may cast
    down what it sums (``z * w.to(z.dtype)``, float32 weights of a bfloat16 layer)."""
    if x.dtype == dtype or autocast_state(x.device.type)[0]:
        return x
    return x.to(dtype)


def csr(rowptr: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape) -> torch.Tensor:
    """A CSR matrix from a Graph's arrays, whose invariants hold by construction.

    torch marks CSR support as beta and warns on every construction: silenced here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(rowptr, col, values, shape, check_invariants=False)

_SPMM_DTYPES = (torch.float32, torch.float64)

EDGE_BLOCK_ELEMS = 1 << 22
"""Edge-value elements (rows x width) one block of a fused op may hold at once."""
from ..ir import rng
from ..ir.reducers import reducer, tie_share, tie_shares
from ..ir.softmax import edge_softmax_vjp


def _rowwise(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def dst_rows(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """The destinations' rows of a source-side x: its first ``g.num_dst`` rows, x itself
    when those are all of them (on a whole graph), so that autograd adds the gradient
    to x's instead of padding a copy with zeros."""
    return x if x.shape[0] == g.num_dst else x[: g.num_dst]


def gather_src(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[e] = x[src(e)]"""
    return _gather(x, g, "src")


def gather_dst(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[e] = x[dst(e)]"""
    return _gather(x, g, "dst")


def _gather(x: torch.Tensor, g: Graph, side: str) -> torch.Tensor:
    """x's row at each edge's ``side``. Under autograd, on sarc's CPU kernels, its gradient
    is a sum over each node's edges (``_EdgeRowSum``: sarc's C kernels, threaded) instead
    of ``index_select``'s ``index_add_`` (several times slower on 65k edges x 64 here)."""
    index = g.src if side == "src" else g.dst
    if x.requires_grad and torch.is_grad_enabled() and g.num_edges \
            and cpu_kernels.kernels_for(x) is not None:
        return _Gather.apply(x, g, side)
    return x.index_select(0, index)


class _Gather(torch.autograd.Function):
    """y[e] = x[side(e)]; backward ``_EdgeRowSum`` (differentiable again: a gather)."""

    @staticmethod
    def forward(ctx, x, g, side):
        ctx.g, ctx.side, ctx.rows = g, side, x.shape[0]
        return x.index_select(0, g.src if side == "src" else g.dst)

    @staticmethod
    def backward(ctx, dy):
        return _EdgeRowSum.apply(dy, ctx.g, ctx.side, ctx.rows), None, None


class _EdgeRowSum(torch.autograd.Function):
    """x[u] = sum over the edges e with side(e) = u of y[e], for ``rows`` nodes: at the
    destinations a CSR product over the graph's index (its edges are in destination
    order); at the sources the C kernel's ``scatter_rows`` (each thread its own columns of
    every row: no transposed index to build, which a block of rows would build at every
    call). Backward a gather."""

    @staticmethod
    def forward(ctx, y, g, side, rows):
        ctx.g, ctx.side = g, side
        k = cpu_kernels.kernels()
        if side == "src":
            return k.scatter_rows(g.src, y.detach(), max(rows, g.num_src))[:rows]
        ptr, cols = layout(g).arrays(None, g.num_edges)
        n = g.num_dst
        flat = y.detach().reshape(y.shape[0], 1, -1)
        out = k.spmm(ptr, cols, None, flat, n).reshape(n, *y.shape[1:])
        if rows > n:  # the operand's rows past the graph's nodes: no edge reads them
            out = torch.cat([out, out.new_zeros(rows - n, *y.shape[1:])], 0)
        return out[:rows]

    @staticmethod
    def backward(ctx, dx):
        return _gather(dx, ctx.g, ctx.side), None, None, None


class Layout:
    """A graph's edge index as the sparse kernels read it, built once per graph
    (``layout(g)``): the CSR arrays in int32 where the sizes fit (half the index bytes
    to read), and, made on first use, the transposed (CSC) arrays of a backward pass
    (rows of each source, sorted by source, and the edge each entry is), the distinct
    pairs an SDDMM runs on, and the graph's own weights in both orders.

    A kernel keeps a layout on its autograd context, as it keeps the graph: both belong
    to the graph, not to the step (``tests/planner/test_kept_bytes.py``). The layout
    refers to its graph weakly, so the cache does not keep the graph alive.
    """

    def __init__(self, g: Graph):
        self._graph = weakref.ref(g)
        fits = max(g.num_edges, g.num_src, g.num_dst) < 2 ** 31 - 1
        self.index_dtype = torch.int32 if fits else torch.int64
        self.rowptr = g.rowptr.to(self.index_dtype)
        self.src = g.src.to(self.index_dtype)
        self._transposed: tuple | None = None
        self._sddmm: tuple | None = None
        self._edge_ids: torch.Tensor | None = None
        self._weights: dict[tuple, torch.Tensor] = {}

    @property
    def g(self) -> Graph:
        return self._graph()

    def arrays(self, cols: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row pointer, column of each edge) of a product with ``n`` columns: the graph's
        source (``cols`` is ``g.src``), the edge itself (None: n is E, which fits), or
        ``cols``; int64 where ``n`` does not fit the layout's index dtype."""
        g = self.g
        if cols is g.src:
            return self.rowptr, self.src
        if cols is None:
            if self._edge_ids is None:
                self._edge_ids = torch.arange(g.num_edges, dtype=self.index_dtype, device=g.device)
            return self.rowptr, self._edge_ids
        if n >= 2 ** 31 - 1:
            return g.rowptr, cols
        return self.rowptr, cols.to(self.index_dtype)

    def transposed(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(colptr, dst rows, edge ids) of the graph's edges ordered by source (stable)."""
        if self._transposed is None:
            self._transposed = transpose(self.g.src, self.g.dst, self.g.num_src, self.index_dtype)
        return self._transposed

    def sddmm_pattern(self):
        """``sddmm_pattern`` of the graph's edges (their columns the sources)."""
        if self._sddmm is None:
            self._sddmm = sddmm_pattern(self.g, self.rowptr, self.src, self.g.num_src)
        return self._sddmm

    def weights(self, kind: str, dtype: torch.dtype, transposed: bool = False) -> torch.Tensor:
        """The values [E, 1] of an unweighted product reducing by ``kind``: 1 per edge for a
        sum, 1 / max(1, in-degree of dst(e)) for a mean (so the product is the mean: no
        division of its rows, nor of their gradient); in the transposed order if asked."""
        key = (kind, dtype, transposed)
        if key not in self._weights:
            g = self.g
            if kind == "mean":
                count = (g.rowptr[1:] - g.rowptr[:-1]).clamp(min=1).to(dtype)
                w = count.reciprocal().index_select(0, g.dst)
            else:
                w = torch.ones(g.num_edges, dtype=dtype, device=g.device)
            if transposed and kind != "sum":
                w = w.index_select(0, self.transposed()[2])
            self._weights[key] = w.unsqueeze(1)
        return self._weights[key]


_LAYOUTS: "weakref.WeakKeyDictionary[Graph, Layout]" = weakref.WeakKeyDictionary()


def layout(g: Graph) -> Layout:
    """``g``'s ``Layout``, made on first use and dropped with the graph."""
    lay = _LAYOUTS.get(g)
    if lay is None:
        lay = _LAYOUTS[g] = Layout(g)
    return lay


def transpose(cols: torch.Tensor, rows: torch.Tensor, num_cols: int, index_dtype: torch.dtype):
    """The CSR arrays of a matrix's transpose from its entries' (row, column) in CSR order:
    (pointer per column, row of each entry, the CSR position of each entry), entries
    ordered by column, stably (so by row within a column)."""
    k = cpu_kernels.kernels() if cols.device.type == "cpu" else None
    if k is not None:
        ptr, rows_t, order = k.transpose(cols, rows, num_cols)
        return ptr.to(index_dtype), rows_t.to(index_dtype), order
    order = torch.argsort(cols, stable=True)
    ptr = torch.zeros(num_cols + 1, dtype=torch.int64, device=cols.device)
    ptr[1:] = torch.cumsum(torch.bincount(cols, minlength=num_cols), 0)
    return ptr.to(index_dtype), rows.index_select(0, order).to(index_dtype), order


def _finalize(kind: str, s: torch.Tensor, g: Graph) -> torch.Tensor:
    """A reducer's rows from their accumulators (``Reducer.finalize``: a mean divides by the
    degree, a max / min is ``empty`` on a row without edges)."""
    return reducer(kind).finalize(s, g.rowptr[1:] - g.rowptr[:-1])


@accumulates
def spmm(kind: str, g: Graph, x: torch.Tensor, w: torch.Tensor | None = None,
         side: str = "src", src_scale: torch.Tensor | None = None,
         dst_scale: torch.Tensor | None = None) -> torch.Tensor:
    """y[v] = sum (or mean) over the edges e = (u, v) of w[e] * x[u]: CSR sparse matmul.

    With ``side="edge"``, x is already per edge: y[v] = sum of w[e] * x[e]. ``w`` is a
    scalar per edge, or one per head: ``w`` of shape [E, *heads] weighs the leading
    feature axes ``heads`` of x (GAT's attention, [E, H, 1] against [N, H, D]), one
    product per head. ``src_scale`` / ``dst_scale``, a number per source / destination
    node ([N, 1, ..]), multiply x's rows and the result's (``patterns.scaled_products``:
    GCN's degree normalization), in the product as it reads and writes where they need
    no gradient. No edge tensor is formed or kept; the backward pass is ``A^T @ dy`` for x
    (the scales swapped) and an SDDMM for w.
    """
    if src_scale is not None or dst_scale is not None:
        fused = x.dtype in _SPMM_DTYPES and g.num_edges and side == "src" and not any(
            t is not None and t.requires_grad for t in (src_scale, dst_scale, w))
        if not fused:
            if src_scale is not None:
                x = x * _rowwise(src_scale.reshape(-1), x).to(x.dtype)
            y = spmm(kind, g, x, w, side)
            return y if dst_scale is None else y * _rowwise(dst_scale.reshape(-1), y).to(y.dtype)
    heads = math.prod(w.shape[1:]) if w is not None else 1
    if x.dtype not in _SPMM_DTYPES or g.num_edges == 0:
        xe = gather_src(x, g) if side == "src" else x
        if w is not None:
            # sizes from the shapes, not -1: with no edges -1 is ambiguous
            per_head = math.prod(xe.shape[1:]) // heads
            xe = (xe.reshape(xe.shape[0], heads, per_head)
                  * w.reshape(w.shape[0], heads, 1).to(xe.dtype)).reshape(xe.shape)
        return segment_reduce(kind, xe, g)
    cols, n = (g.src, g.num_src) if side == "src" else (None, g.num_edges)
    scales = [None if t is None else t.detach().reshape(-1) for t in (dst_scale, src_scale)]
    if w is None and side == "src":  # the graph's own weights: the product is the reduction
        return _CsrProduct.apply(g, cols, n, None, x, kind, *scales)
    w = w.reshape(w.shape[0], heads).to(x.dtype) if w is not None else None
    return _finalize(kind, _CsrProduct.apply(g, cols, n, w, x, "sum", *scales), g)


def weighted_sum(g: Graph, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y[v] = sum over the edges e = (u, v) of w[e, h] * x[u, h] (w [E, H], x [N_src, H, ..]),
    summed and returned in w's dtype, without autograd: sarc's C kernel reads a float32 x
    as it is under float64 weights (no float64 copy of x), torch's products take a copy."""
    heads = math.prod(w.shape[1:])
    x3, w2 = _by_head(x, heads), w.reshape(w.shape[0], heads)
    shape = (g.num_dst, *x.shape[1:])
    if g.num_edges == 0:
        return x.new_zeros(shape, dtype=w.dtype)
    lay = layout(g)
    mixed = (x.dtype, w.dtype) == (torch.float32, torch.float64) and w.device.type == "cpu"
    k = cpu_kernels.kernels_for(x, w) or (cpu_kernels.kernels_for(x) if mixed else None)
    if k is not None:
        return k.spmm(lay.rowptr, lay.src, w2, x3, g.num_dst, dtype=w.dtype).reshape(shape)
    return _products(lay.rowptr, lay.src, w2, (g.num_dst, g.num_src), x3.to(w.dtype),
                     as_shape=shape)


def _products(ptr, cols, w: torch.Tensor, shape, x: torch.Tensor,
              w_index: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
              col_scale: torch.Tensor | None = None, as_shape=None) -> torch.Tensor:
    """``diag(row_scale) A_h diag(col_scale) @ x_h`` for each head h of the CSR matrices
    (ptr, cols, w[:, h]), the weights of the entries ``w[w_index]`` where given (a
    transposed index's order): x [n, H, F] -> [m, H, F] (H = 1: one product of the
    flattened features), reshaped to ``as_shape`` where given (written in that shape, not
    a view of another: a gradient that autograd may add to in place). sarc's CPU kernel
    (``cpu_kernels``, reading through ``w_index``, scaling as it reads and writes) where
    it is built, else torch's products."""
    k = cpu_kernels.kernels_for(x, w)
    if k is not None:
        out = None if as_shape is None else x.new_empty(as_shape)
        y = k.spmm(ptr, cols, w, x, shape[0], w_index, row_scale, col_scale, out=out)
        return y if out is None else out
    if as_shape is not None:
        y = _products(ptr, cols, w, shape, x, w_index, row_scale, col_scale)
        return y if y.shape == as_shape else y.reshape(as_shape)
    if w_index is not None:
        w = w.index_select(0, w_index)
    if col_scale is not None:
        x = x * _rowwise(col_scale, x).to(x.dtype)
    heads = w.shape[1]
    if heads == 1:
        out = _sparse_mm(csr(ptr, cols, w.reshape(-1), shape),
                         x.reshape(shape[1], -1)).reshape(shape[0], *x.shape[1:])
    else:
        out = x.new_empty(shape[0], heads, x.shape[2])
        for h in range(heads):
            out[:, h] = _sparse_mm(csr(ptr, cols, w[:, h].contiguous(), shape), x[:, h])
    return out if row_scale is None else out * _rowwise(row_scale, out).to(x.dtype)


def _sparse_mm(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """CSR @ dense. On the CPU, torch's row-parallel reducing SpMM (``reduce="sum"``, torch
    2.0 on), faster than the MKL product torch.sparse.mm calls otherwise."""
    if x.device.type == "cpu":
        return torch.sparse.mm(a, x, "sum")
    return torch.sparse.mm(a, x)


def sddmm_pattern(g: Graph, ptr: torch.Tensor, cols: torch.Tensor, n: int):
    """The CSR pattern an SDDMM over the entries (dst(e), cols[e]) runs on: (ptr, cols, None)
    when no (row, column) pair repeats, else the distinct pairs' (ptr, cols) and each
    edge's pair (``torch.sparse.sampled_addmm`` refuses repeated entries; a repeated
    pair's value is the same dot product)."""
    key = g.dst * n + cols.long()
    pairs, inverse = torch.unique(key, sorted=True, return_inverse=True)
    if pairs.numel() == key.numel():
        return ptr, cols, None
    rows = torch.div(pairs, n, rounding_mode="floor")
    uptr = torch.zeros(g.num_dst + 1, dtype=torch.int64, device=key.device)
    uptr[1:] = torch.cumsum(torch.bincount(rows, minlength=g.num_dst), 0)
    return uptr.to(ptr.dtype), (pairs - rows * n).to(cols.dtype), inverse


def _sddmm(pattern, shape, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """d[e, h] = <a[row(e), h], b[col(e), h]> for each edge e of ``pattern``
    (``sddmm_pattern``): a [m, H, F], b [n, H, F] -> [E, H]. ``torch.sparse.sampled_addmm``
    on the CPU (no edge x feature tensor); elsewhere edge block by edge block."""
    ptr, cols, inverse = pattern
    k = cpu_kernels.kernels_for(a, b)
    if k is not None:
        d = k.sddmm(ptr, cols, a, b)
        return d if inverse is None else d.index_select(0, inverse)
    heads, num = a.shape[1], cols.numel()
    d = a.new_empty(num, heads)
    if a.device.type == "cpu":
        values = csr(ptr, cols, a.new_zeros(num), shape)
        for h in range(heads):
            d[:, h] = torch.sparse.sampled_addmm(values, a[:, h], b[:, h].t(), beta=0.0).values()
        return d if inverse is None else d.index_select(0, inverse)
    rows = torch.repeat_interleave(torch.arange(shape[0], device=a.device),
                                   ptr[1:].long() - ptr[:-1].long(), output_size=num)
    step = max(1, EDGE_BLOCK_ELEMS // max(1, heads * a.shape[2]))
    for e0 in range(0, num, step):
        e1 = min(num, e0 + step)
        d[e0:e1] = (a.index_select(0, rows[e0:e1]) * b.index_select(0, cols[e0:e1].long())).sum(2)
    return d if inverse is None else d.index_select(0, inverse)


def _dots(lay: Layout, cols: torch.Tensor | None, n: int, a: torch.Tensor,
          b: torch.Tensor) -> torch.Tensor:
    """d[e, h] = <a[dst(e), h], b[col(e), h]> over the edges of ``lay``'s graph, columns
    as ``Layout.arrays`` takes them (``g.src``, None for the edge itself, or ``cols``).
    sarc's CPU kernel takes repeated (row, column) entries; torch's needs them merged."""
    g = lay.g
    if cpu_kernels.kernels_for(a, b) is not None:
        pattern = (*lay.arrays(cols, n), None)
    elif cols is g.src:
        pattern = lay.sddmm_pattern()
    else:
        pattern = sddmm_pattern(g, *lay.arrays(cols, n), n)
    return _sddmm(pattern, (g.num_dst, n), a, b)


def _by_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of x as [rows, heads, features per head] (sizes from the shape: no -1)."""
    return x.reshape(x.shape[0], heads, math.prod(x.shape[1:]) // heads)


class _CsrProduct(torch.autograd.Function):
    """y = diag(rs) A_w diag(cs) @ x with A_w[v, col(e)] = w[e] for each edge e into v;
    multi-edges add up. ``cols`` None: the column of edge e is e (x per edge); ``w`` None:
    the graph's own weights for reducing by ``unit`` (``Layout.weights``: 1, or 1 /
    in-degree for a mean); ``w`` [E, H]: one product per head h of x's features [n, H, F]
    with weights w[:, h]; ``rs`` [num_dst], ``cs`` [n]: scales that need no gradient (or
    None).

    It keeps the weights (x too when they need a gradient) and the columns when they
    are not the graph's; the graph's layout (its CSR and transposed index, its own
    weights in both orders) lives with the graph. Backward: dx = diag(cs) A_w^T diag(rs)
    @ dy (a CSR product over the transposed index; per edge dy[dst(e)] w[e] when x is
    per edge), dw[e] = <dy[v], x[col(e)]> (an SDDMM, ``_sddmm``; unscaled products only).
    """

    @staticmethod
    def keep(ctx, g, cols, n, w, x, unit, rs, cs) -> None:
        """What the backward pass reads."""
        ctx.g, ctx.lay, ctx.n, ctx.x_shape, ctx.unit = g, layout(g), n, x.shape, unit
        ctx.graph_cols = cols is g.src
        assert (rs is None and cs is None) or not ctx.needs_input_grad[3], \
            "a scaled product's weights take no gradient (torch_ops.spmm multiplies instead)"
        # x is needed only for dw: keep it only then
        ctx.save_for_backward(w, x if ctx.needs_input_grad[3] else None,
                              None if ctx.graph_cols else cols, rs, cs)

    @staticmethod
    def forward(ctx, g, cols, n, w, x, unit, rs=None, cs=None):
        _CsrProduct.keep(ctx, g, cols, n, w, x, unit, rs, cs)
        lay = ctx.lay
        heads = 1 if w is None else w.shape[1]
        ww = w.detach() if w is not None else lay.weights(unit, x.dtype)
        ptr, c = lay.arrays(cols, n)
        return _products(ptr, c, ww, (g.num_dst, n), _by_head(x.detach(), heads), None, rs, cs,
                         as_shape=(g.num_dst, *x.shape[1:]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        g, lay, n = ctx.g, ctx.lay, ctx.n
        w, x, cols, rs, cs = ctx.saved_tensors
        heads = 1 if w is None else w.shape[1]
        dy3 = _by_head(dy, heads)
        dw = dx = None
        if ctx.needs_input_grad[4]:
            ww = w if w is not None else lay.weights(ctx.unit, dy.dtype)
            if ctx.graph_cols:
                ptr, rows, order = lay.transposed()
                if w is not None:
                    dx = _products(ptr, rows, ww, (n, g.num_dst), dy3, order, cs, rs,
                                   as_shape=ctx.x_shape)
                else:
                    dx = _products(ptr, rows, lay.weights(ctx.unit, dy.dtype, transposed=True),
                                   (n, g.num_dst), dy3, None, cs, rs, as_shape=ctx.x_shape)
            elif cols is None:  # x per edge: dx[e] = w[e] dy[dst(e)]
                dx = dy3.index_select(0, g.dst) * ww.unsqueeze(2)
            else:
                ptr, rows, order = transpose(cols, g.dst, n, lay.arrays(cols, n)[1].dtype)
                dx = _products(ptr, rows, ww, (n, g.num_dst), dy3, order, cs, rs)
            if dx.shape != ctx.x_shape:
                dx = dx.reshape(ctx.x_shape)
        if ctx.needs_input_grad[3]:
            dw = _dots(lay, g.src if ctx.graph_cols else cols, n, dy3, _by_head(x, heads))
        return None, None, None, dw, dx, None, None, None


class _CsrProductVjp(torch.autograd.Function):
    """``sum(_CsrProduct(...) * cot)`` for its gradient alone: a distributed block's backward
    surrogate, differentiated and never read. Forward keeps what the product's backward
    reads and computes nothing; backward is the product's, with ``dy = cot``."""

    @staticmethod
    def forward(ctx, g, cols, n, w, x, unit, rs, cs, cot):
        _CsrProduct.keep(ctx, g, cols, n, w, x, unit, rs, cs)
        ctx.cot = cot.detach()
        return x.new_zeros(())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # the surrogate is differentiated on its own (grad 1): no pass over cot to scale it
        # by 1, where that is known without a device sync
        unit = grad.device.type == "cpu" and bool(grad == 1)
        dy = (ctx.cot if unit else ctx.cot * grad).reshape(ctx.g.num_dst, *ctx.x_shape[1:])
        return (*_CsrProduct.backward(ctx, dy), None)


def spmm_surrogate(cot: torch.Tensor, kind: str, g: Graph, x: torch.Tensor,
                   w: torch.Tensor | None = None, side: str = "src") -> torch.Tensor:
    """``(spmm(kind, g, x, w, side) * cot).sum()``, a distributed block's surrogate (only its
    gradient is read): where the product is one ``_CsrProduct`` its forward is not run, the
    gradient is the product's backward with ``dy = cot``; otherwise the expression as is."""
    direct = (x.dtype in _SPMM_DTYPES and g.num_edges and not cot.requires_grad
              and ((w is None and side == "src") or kind == "sum"))
    if not direct:
        return (spmm(kind, g, x, w, side) * cot).sum()
    cols, n = (g.src, g.num_src) if side == "src" else (None, g.num_edges)
    if w is None and side == "src":
        return _CsrProductVjp.apply(g, cols, n, None, x, kind, None, None, cot)
    heads = math.prod(w.shape[1:]) if w is not None else 1
    w = w.reshape(w.shape[0], heads).to(x.dtype) if w is not None else None
    return _CsrProductVjp.apply(g, cols, n, w, x, "sum", None, None, cot)


@accumulates
def typed_spmm(kind: str, g: Graph, x: torch.Tensor, table: torch.Tensor, types: torch.Tensor,
               w: torch.Tensor | None = None) -> torch.Tensor:
    """y[v] = sum (or mean) over the edges e = (u, v) of w[e] * x[u] @ table[types[e]].

    When nodes x types are fewer than edges, ``x @ table[r]`` is computed once per
    (node, type) pair and aggregated by a sparse product whose column for edge e
    is ``src(e) * R + types[e]``; otherwise per edge, grouped by type. Neither
    keeps an E x D tensor for the backward pass.
    """
    num_types, _, out = table.shape
    check_types(types, num_types)
    if g.num_src * num_types <= g.num_edges and x.dtype in _SPMM_DTYPES and g.num_edges:
        # under autocast the products are in its low dtype, as torch's matmul gives them;
        # the sparse product sums them in float32 and rounds once (``accumulates``)
        per_type = torch.einsum("ni,rio->nro", x, table).reshape(g.num_src * num_types, out)
        cols = g.src * num_types + types
        w = w.reshape(-1, 1).to(x.dtype) if w is not None else None
        return _table_product(kind, g, cols, w, per_type)
    rows = _GatheredTypedLinear.apply(x, table, types, g.src)
    return spmm(kind, g, rows, w, "edge")


@accumulates
def _table_product(kind: str, g: Graph, cols: torch.Tensor, w: torch.Tensor | None,
                   per_type: torch.Tensor) -> torch.Tensor:
    """``typed_spmm``'s sum (or mean) over the node x type rows ``per_type``, entry e of
    destination v reading row ``cols[e]``."""
    return _finalize(kind, _CsrProduct.apply(g, cols, per_type.shape[0], w, per_type, "sum"), g)


class _GatheredTypedLinear(torch.autograd.Function):
    """y[e] = x[src[e]] @ table[types[e]] without keeping the gathered rows (E x D): the
    backward pass gathers them again (x, only when the table needs a gradient, and the
    types are what it keeps)."""

    @staticmethod
    def forward(ctx, x, table, types, src):
        ctx.src, ctx.num_rows = src, x.shape[0]
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, table, types)
        return typed_linear(x.detach().index_select(0, src), table.detach(), types)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, table, types = ctx.saved_tensors
        order = torch.argsort(types, stable=True)
        counts = torch.bincount(types, minlength=table.shape[0]).tolist()
        src = ctx.src.index_select(0, order)
        dys = torch.split(dy.index_select(0, order), counts)
        dx = dtable = None
        if ctx.needs_input_grad[0]:
            dxe = torch.cat([d @ table[r].t() for r, d in enumerate(dys)], 0)
            dx = dxe.new_zeros((ctx.num_rows, table.shape[1])).index_add_(0, src, dxe)
        if ctx.needs_input_grad[1]:
            xs = torch.split(x.index_select(0, src), counts)
            dtable = torch.stack([xr.t() @ d for xr, d in zip(xs, dys)], 0)
        return dx, dtable, None, None


def segment_sum(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[v] = sum of x[e] over the edges into v, as the CSR product [I_rows] @ x."""
    if x.dtype not in _SPMM_DTYPES or g.num_edges == 0:
        return torch.segment_reduce(x, "sum", offsets=g.rowptr, axis=0)
    return _CsrProduct.apply(g, None, g.num_edges, None, x, "sum")


@accumulates
def segment_reduce(kind: str, x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[v] = kind over the edges into v of x[e]; the reducer's ``empty`` (0) where v has
    no edges."""
    return SEGMENT_REDUCE[kind](g, x)


def _segment_linear(kind: str):
    r = reducer(kind)

    def reduce_rows(g: Graph, x: torch.Tensor) -> torch.Tensor:
        return r.finalize(segment_sum(x, g), g.rowptr[1:] - g.rowptr[:-1])
    return reduce_rows


def _segment_extremum(kind: str):
    def reduce_rows(g: Graph, x: torch.Tensor) -> torch.Tensor:
        return _SegmentExtremum.apply(x, kind, g.rowptr, g.dst)
    return reduce_rows


def _segment_softmax(g: Graph, score: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """sum over the edges into v of softmax_v(score) * value."""
    alpha = edge_softmax(score, g)
    alpha = alpha.reshape(*alpha.shape, *([1] * (value.dim() - alpha.dim())))
    return segment_reduce("sum", alpha * value, g)


class _SegmentExtremum(torch.autograd.Function):
    """max / min over CSR segments, 0 for empty ones; ties share the gradient evenly.

    ``torch.segment_reduce``'s own backward for max/min divides a tied gradient
    by the number of ties only where the gradient is positive (torch 2.2 to
    2.13): with a negative gradient every tied edge receives all of it. The
    interpreter's meaning (``torch.amax``) splits it evenly, the reducer's
    ``tie_shares`` rule, so the backward is written here. On sarc's CPU kernels the
    extremum and, in the backward pass, its tie counts are the C kernel's ``extremum``
    over the rows (one pass each, no tie tensor summed).
    """

    @staticmethod
    def forward(ctx, x, kind, rowptr, dst):
        y, _ = edge_extremum(kind, x.detach(), rowptr, dst)
        ctx.kind = kind
        ctx.save_for_backward(x, y, rowptr, dst)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, y, rowptr, dst = ctx.saved_tensors
        tie = (x == y.index_select(0, dst)).to(grad_y.dtype)
        count = edge_extremum(ctx.kind, x.detach(), rowptr, dst)[1]
        dx = tie_shares(tie, grad_y, lambda t: count.to(t.dtype), lambda t: t.index_select(0, dst))
        return dx, None, None, None


def edge_extremum(kind: str, x: torch.Tensor, rowptr: torch.Tensor, dst: torch.Tensor):
    """(y, count): ``kind`` over each CSR row (``rowptr``; ``dst``: each edge's row) of the
    edge rows ``x``, 0 for a row without edges, and how many of its edges attain it (0
    where a NaN wins): sarc's C kernel, one pass, where built; else torch's segment
    reduces."""
    k = cpu_kernels.kernels_for(x) if x.shape[0] else None
    if k is not None:
        return k.extremum(kind, rowptr, None, x, rowptr.numel() - 1)
    y = reducer(kind).finalize(torch.segment_reduce(x, kind, offsets=rowptr, axis=0),
                               rowptr[1:] - rowptr[:-1])
    tie = (x == y.index_select(0, dst)).to(x.dtype)
    return y, torch.segment_reduce(tie, "sum", offsets=rowptr, axis=0)


@accumulates
def extremum_spmm(kind: str, g: Graph, x: torch.Tensor) -> torch.Tensor:
    """y[v] = max (min) over the edges e = (u, v) of x[u], 0 where v has no edges; the edges
    tied for it share its gradient evenly (``_SegmentExtremum``'s meaning). sarc's C kernel
    where built: no edge tensor formed or kept (``_ExtremumProduct``); else a gather and
    a segment reduce."""
    if cpu_kernels.kernels_for(x) is None or g.num_edges == 0:
        return segment_reduce(kind, gather_src(x, g), g)
    return _ExtremumProduct.apply(x, kind, g)


def extremum_lifted(kind: str, body, sides: tuple[str, ...], width: int, source: int,
                    extremum: str, g: Graph, *operands) -> torch.Tensor:
    """A max / min aggregate whose message is the source feature ``operands[source]`` plus
    or minus values constant over a destination's edges (``patterns.lifted_extremum``):
    ``body`` evaluated per destination at the feature's ``extremum`` over the row's edges
    (no edge tensor), ``empty`` where a row has no edges. The values are the per-edge
    form's (rounding is monotone); the gradient goes to the edges where the feature attains
    its extremum, split evenly, which are the edges whose messages tie unless a destination
    term so much larger than the feature rounds unequal features to equal messages. Where
    the CSR extremum kernel is not built, or for half precision, ``aggregate``."""
    x = operands[source]
    if lifted_kernels(g, x, operands) is None:
        return aggregate(kind, body, sides, width, g, *operands)
    at = extremum_spmm(extremum, g, x)
    out = body(g, *(at if k == source else o for k, o in enumerate(operands)))
    return _finalize(kind, out, g)


def lifted_kernels(g: Graph, x: torch.Tensor, operands):
    """sarc's CPU kernels where a lifted extremum of source feature ``x`` runs on them (the
    kernels built and taking x, float32 / float64 operands, a graph with edges), else None."""
    if g.num_edges == 0 or any(isinstance(o, torch.Tensor) and o.is_floating_point()
                               and o.dtype not in _SPMM_DTYPES for o in operands):
        return None
    return cpu_kernels.kernels_for(x)


def extremum_grad(lay: Layout, x: torch.Tensor, y: torch.Tensor, count: torch.Tensor,
                  dy: torch.Tensor) -> torch.Tensor:
    """The gradient of x for y, the max / min of x[src(e)] over each of ``lay``'s rows with
    ``count`` edges attaining it: each of those edges' sources gets ``dy / count``, row by
    row of the transposed index (the C kernel's ``select_sum``: no edge tensor, no scatter)."""
    ptr, rows, _ = lay.transposed()
    return cpu_kernels.kernels().select_sum(ptr, rows, x, y, tie_share(dy.to(x.dtype), count))


class _ExtremumProduct(torch.autograd.Function):
    """max / min of x[src(e)] over each destination's edges (the C kernel's ``extremum``).
    It keeps x, and the tie counts the forward kernel computes with the extremum (a number
    per output number: less than the edge tensor or the argmax DGL keeps), and reads the
    output itself in backward: ``dx[u] = sum over the edges (u, v) of [x[u] == y[v]]
    dy[v] / count[v]`` row by row of the transposed index (``select_sum``: no edge tensor,
    no scatter). Where the output was written over after the call, backward computes the
    extremum again from x."""

    @staticmethod
    def forward(ctx, x, kind, g):
        lay = layout(g)
        ctx.kind, ctx.g, ctx.lay = kind, g, lay
        y, count = cpu_kernels.kernels().extremum(kind, lay.rowptr, lay.src, x.detach(),
                                                   g.num_dst)
        ctx.save_for_backward(x)
        # held detached (no cycle through the output's grad_fn), with its version to see
        # an in-place write; the counts are the kernel's own, read by nothing else. Both stay
        # for a second backward pass (retain_graph), and go with the graph
        ctx.y, ctx.count = y.detach(), count
        ctx.y_version = None if y.is_inference() else y._version   # inference mode keeps none
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        k, lay = cpu_kernels.kernels(), ctx.lay
        y, count = ctx.y, ctx.count
        if ctx.y_version is None or y._version != ctx.y_version:
            y, count = k.extremum(ctx.kind, lay.rowptr, lay.src, x, ctx.g.num_dst)
        return extremum_grad(lay, x, y, count, dy), None, None


SEGMENT_REDUCE: dict[str, Callable[..., torch.Tensor]] = {
    "sum": _segment_linear("sum"),
    "mean": _segment_linear("mean"),
    "max": _segment_extremum("max"),
    "min": _segment_extremum("min"),
    "softmax": _segment_softmax,
}
"""Each reducer (``sarc.ir.reducers``): (g, edge rows...) -> destination rows, over CSR
segments; softmax reads (score, value)."""


@accumulates(softmax=True)
def edge_softmax(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """softmax of x over the edges into each destination (max-shifted); its backward is
    the cancellation-free form of ``sarc.ir.softmax``."""
    return _EdgeSoftmax.apply(x, g)


class _EdgeSoftmax(torch.autograd.Function):
    """``p = exp(x - max) / sum`` per destination; backward ``sarc.ir.softmax.edge_softmax_vjp``
    (written with differentiable ops: a double backward goes through it)."""

    @staticmethod
    def forward(ctx, x, g):
        m = torch.segment_reduce(x, "max", offsets=g.rowptr, axis=0)
        ex = torch.exp(x - m.index_select(0, g.dst))
        p = ex / segment_sum(ex, g).index_select(0, g.dst)
        ctx.g = g
        ctx.save_for_backward(p)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, dp):
        (p,) = ctx.saved_tensors
        g = ctx.g
        return edge_softmax_vjp(p, dp, lambda t: segment_sum(t, g),
                                lambda t: t.index_select(0, g.dst)), None


def check_types(types: torch.Tensor, num_types: int) -> None:
    """Every type id indexes the weight table (an id out of range would read past it)."""
    if types.numel() and (int(types.min()) < 0 or int(types.max()) >= num_types):
        raise ValueError(f"type id out of range: the weight table has {num_types} types "
                         f"(ids 0..{num_types - 1}), got ids in "
                         f"[{int(types.min())}, {int(types.max())}]")


def typed_linear(x: torch.Tensor, w: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    """y[i] = x[i] @ w[types[i]]: rows grouped by type, one matmul per type."""
    num_types = w.shape[0]
    check_types(types, num_types)
    order = torch.argsort(types, stable=True)
    counts = torch.bincount(types, minlength=num_types).tolist()
    parts = torch.split(x.index_select(0, order), counts)
    out = torch.cat([p @ w[r] for r, p in enumerate(parts)], 0) if parts else x.new_zeros(0, w.shape[2])
    return torch.empty_like(out).index_copy(0, order, out)


# --- fused graph ops ------------------------------------------------------------------
# A fused op evaluates its region (a generated function of per-edge operands) over
# blocks of destination rows, so its E x D intermediates exist one block at a time,
# and stores only its node-level operands for the backward pass, which recomputes
# each block's edge values (rematerialization) and back-propagates through them.

def per_edge(x: torch.Tensor, side: str, g: Graph) -> torch.Tensor:
    """An operand as a region reads it: one row per edge of ``g`` (params as they are)."""
    if side in ("src", "dst"):
        return _gather(x, g, side)
    return x


def _sub_block(g: Graph, lo: int, hi: int) -> tuple[Graph, int, int]:
    """Destination rows [lo, hi) of ``g`` and their edges [e0, e1), renumbered."""
    e0, e1 = int(g.rowptr[lo]), int(g.rowptr[hi])
    sub = Graph(g.num_src, hi - lo, g.src[e0:e1], g.dst[e0:e1] - lo, g.perm[e0:e1],
                g.rowptr[lo:hi + 1] - e0, g.in_degree[lo:hi], g.out_degree, dst_in_src=False)
    return sub, e0, e1


def _slice_operand(x: torch.Tensor, side: str, lo: int, hi: int, e0: int, e1: int):
    if side == "dst":
        return x[lo:hi]
    if side == "edge":
        return x[e0:e1]
    return x


def row_blocks(g: Graph, width: int) -> list[tuple[int, int]]:
    """Split destination rows into blocks of about EDGE_BLOCK_ELEMS edge elements."""
    max_edges = max(1, EDGE_BLOCK_ELEMS // max(1, width))
    if g.num_edges <= max_edges or g.num_dst <= 1:
        return [(0, g.num_dst)]
    bounds = torch.searchsorted(g.rowptr, torch.arange(0, g.num_edges, max_edges,
                                                       device=g.rowptr.device))
    cuts = sorted(set([0, *[min(int(b), g.num_dst) for b in bounds.tolist()], g.num_dst]))
    return list(zip(cuts[:-1], cuts[1:]))


class _Rematerialized(torch.autograd.Function):
    """Run ``block_fn`` per destination block without saving edge values; recompute them in backward."""

    @staticmethod
    def forward(ctx, block_fn, g, sides, blocks, *operands):
        ctx.block_fn, ctx.g, ctx.sides, ctx.blocks = block_fn, g, sides, blocks
        ctx.save_for_backward(*operands)
        with torch.no_grad():
            outs = [block_fn(*block_args(g, sides, lo, hi, operands)) for lo, hi in blocks]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        grads = _block_grads(ctx, ctx.needs_input_grad[4:], lambda out, lo, hi: grad_out[lo:hi])
        return (None, None, None, None, *grads)


def _block_grads(ctx, needs, cotangent) -> list:
    """The operands' gradients of a rematerialized op: each block computed again with
    autograd and differentiated against ``cotangent(out, lo, hi)``, the gradients added.
    A block's leaves are its own slices of the edge and destination operands, so their
    gradients are the block's rows only, written into the whole gradient's rows (a leaf
    of the whole operand would give each block a zero-filled gradient of all E rows:
    O(blocks x E) work)."""
    operands = [x.detach() for x in ctx.saved_tensors]
    if not any(needs):
        return [None] * len(operands)
    g, sides = ctx.g, ctx.sides
    acc = [torch.zeros_like(x) if n else None for x, n in zip(operands, needs)]
    for lo, hi in ctx.blocks:
        if (lo, hi) == (0, g.num_dst):
            gb, xs, e0, e1 = g, operands, 0, g.num_edges
        else:
            gb, e0, e1 = _sub_block(g, lo, hi)
            xs = [_slice_operand(x, s, lo, hi, e0, e1) for x, s in zip(operands, sides)]
        leaves = [x.detach().requires_grad_(n) for x, n in zip(xs, needs)]
        wrt = [x for x in leaves if x.requires_grad]
        with torch.enable_grad():
            out = ctx.block_fn(gb, *leaves)
        gs = iter(torch.autograd.grad(out, wrt, cotangent(out, lo, hi), allow_unused=True))
        for a, x, s in zip(acc, leaves, sides):
            if not x.requires_grad:
                continue
            gr = next(gs)
            if gr is None:
                continue
            if x.shape == a.shape:
                a.add_(gr)
            elif s == "dst":
                a[lo:hi].add_(gr)
            else:
                a[e0:e1].add_(gr)
    return acc


class _RematerializedSum(torch.autograd.Function):
    """``fused_surrogate``: forward keeps the operands and computes nothing; backward is a
    rematerialized op's with the cotangent ``cot`` (None: 1 on every output)."""

    @staticmethod
    def forward(ctx, block_fn, g, sides, blocks, cot, *operands):
        ctx.block_fn, ctx.g, ctx.sides, ctx.blocks, ctx.cot = block_fn, g, sides, blocks, cot
        ctx.save_for_backward(*operands)
        return torch.zeros((), dtype=torch.float64, device=g.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        def cotangent(out, lo, hi):
            c = grad.to(out.dtype)
            return c.expand_as(out) if ctx.cot is None else ctx.cot[lo:hi].to(out.dtype) * c
        grads = _block_grads(ctx, ctx.needs_input_grad[5:], cotangent)
        return (None, None, None, None, None, *grads)


def block_args(g: Graph, sides, lo: int, hi: int, operands):
    if (lo, hi) == (0, g.num_dst):
        return (g, *operands)
    sub, e0, e1 = _sub_block(g, lo, hi)
    return (sub, *(_slice_operand(x, s, lo, hi, e0, e1) for x, s in zip(operands, sides)))


def fused_surrogate(block_fn, g: Graph, sides, width: int, operands,
                    cot: torch.Tensor | None = None) -> torch.Tensor:
    """``(fused(block_fn, ...) * cot).sum()`` (``cot`` None: ``.sum()``) for its gradient
    alone (a distributed block's surrogate, differentiated and never read; its value here is
    0): no block runs in the forward pass, each runs once, with autograd, in the backward
    pass."""
    if not any(isinstance(x, torch.Tensor) and x.requires_grad for x in operands) \
            or not torch.is_grad_enabled() or (cot is not None and cot.requires_grad):
        out = fused(block_fn, g, sides, width, operands)
        return (out if cot is None else out * cot).sum()
    cot = cot.detach() if cot is not None else None
    return _RematerializedSum.apply(block_fn, g, sides, row_blocks(g, width), cot, *operands)


def fused(block_fn, g: Graph, sides, width: int, operands):
    blocks = row_blocks(g, width)
    if not any(isinstance(x, torch.Tensor) and x.requires_grad for x in operands) \
            or not torch.is_grad_enabled():
        with torch.no_grad():
            outs = [block_fn(*block_args(g, sides, lo, hi, operands)) for lo, hi in blocks]
        return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
    return _Rematerialized.apply(block_fn, g, sides, blocks, *operands)


@accumulates
def aggregate(kind: str, body, sides: tuple[str, ...], width: int, g: Graph, *operands):
    """y[v] = kind over the edges e into v of body(operands read at e)  (g-SpMM)."""
    def block(gb, *xs):
        return segment_reduce(kind, body(gb, *(per_edge(x, s, gb) for x, s in zip(xs, sides))), gb)
    return fused(block, g, sides, width, operands)


@accumulates(softmax=True)
def softmax_aggregate(score, value, sides: tuple[str, ...], width: int, g: Graph, *operands):
    """y[v] = sum over e into v of softmax_v(score)(e) * value(e)."""
    def block(gb, *xs):
        per = [per_edge(x, s, gb) for x, s in zip(xs, sides)]
        return SEGMENT_REDUCE["softmax"](gb, score(gb, *per), value(gb, *per))
    return fused(block, g, sides, width, operands)


@accumulates(softmax=True)
def softmax_spmm(score, sides: tuple[str, ...], value_index: int, reads: tuple[int, ...],
                 width: int, g: Graph, *operands, folds: tuple[tuple[int, int], ...] = ()):
    """softmax_aggregate whose value is a source feature z: per head, A_alpha @ z.

    The score region reads the operands ``reads`` (gathered per edge; ``width``: the widest
    row of its edge values); the scores and weights (E x heads) are formed, the E x heads
    x D messages are not. Under autograd the region's own edge values are not kept, and
    the weights are the only edge tensor: ``_RecomputedSoftmaxProduct``. ``folds``: (k,
    dim) where operand k is not given but its factor p, the operand being
    ``contract(z's rows, p, dim)`` (GAT's ``(z * att).sum(-1)``, ``patterns.contractions``;
    z's rows on the operand's side): the product's backward adds that contraction's
    gradient to z's in place (``_fold``).
    """
    z = operands[value_index]
    read = tuple(x if k in reads else None for k, x in enumerate(operands))
    per_edge_read = any(x is not None and s in ("src", "dst", "edge") for x, s in zip(read, sides))
    recompute = (torch.is_grad_enabled() and not autocast_state(z.device.type)[0] and per_edge_read
                 and any(x is not None and x.requires_grad for x in (z, *read)))
    if recompute and z.dtype in _SPMM_DTYPES and g.num_edges and _folds_fit(z, read, sides, folds, g):
        return _RecomputedSoftmaxProduct.apply(score, sides, width, g, folds, z, *read)
    if folds:
        read = _unfolded(z, read, sides, folds, g, contract)
        recompute = recompute and any(x is not None and x.requires_grad for x in read)
    if recompute:
        scores = _RecomputedScores.apply(score, sides, width, g, *read)
    else:
        scores = score(g, *[per_edge(x, s, g) if x is not None else None
                            for x, s in zip(read, sides)])
    if z.dtype not in _SPMM_DTYPES or g.num_edges == 0:
        alpha = edge_softmax(scores, g)
        return spmm("sum", g, z, alpha)
    return _SoftmaxProduct.apply(g, scores, z)


@accumulates(softmax=True)
def softmax_dot_spmm(score, sides: tuple[str, ...], value_index: int, reads: tuple[int, ...],
                     width: int, dot: tuple, feat: tuple[int, ...], g: Graph, *operands):
    """``softmax_spmm`` whose score is the dot product per head of a source and a destination
    row, maybe scaled by a constant (``patterns.dot_score``: ``dot`` is (source operand,
    destination operand, "mul" / "div" / None, the constant); ``feat``: the score's
    features): the scores one SDDMM of the rows (``_DotScores``), no gathered row, then the
    softmax-weighted product. Where sarc's CPU kernels are not built, or for half
    precision, ``softmax_spmm``."""
    z = operands[value_index]
    s = (dot_scores(g, dot, feat, *operands)
         if z.dtype in _SPMM_DTYPES and cpu_kernels.kernels_for(z) is not None else None)
    if s is None:
        return softmax_spmm(score, sides, value_index, reads, width, g, *operands)
    return _SoftmaxProduct.apply(g, s, z)


def dot_scores(g: Graph, dot: tuple, feat: tuple[int, ...], *operands) -> torch.Tensor | None:
    """The scores ``patterns.dot_score`` finds (``dot``: source operand, destination operand,
    "mul" / "div" / None, the constant; ``feat``: the score's features), one SDDMM of the
    rows (``_DotScores``: no gathered row), as the score region computes them up to the
    order of the dot's sums; None where sarc's CPU kernels do not run it (not built, half
    precision, rows of two dtypes, a graph without edges)."""
    src, dst, op, c = dot
    a, b = operands[dst], operands[src]
    if g.num_edges == 0 or not dot_scores_run(dot, *operands):
        return None
    s = _DotScores.apply(g, a, b, math.prod(feat))
    if op == "div":
        s = s / c
    elif op == "mul":
        s = s * c
    return s.reshape(g.num_edges, *feat)


def dot_scores_run(dot: tuple, *operands) -> bool:
    """Whether ``dot_scores`` computes these operands' scores as an SDDMM (on a graph with
    edges): sarc's CPU kernels built and taking the two rows, of one dtype, float32 / 64."""
    a, b = operands[dot[1]], operands[dot[0]]
    return (cpu_kernels.kernels_for(a, b) is not None and a.dtype == b.dtype
            and a.dtype in _SPMM_DTYPES)


class _DotScores(torch.autograd.Function):
    """s[e, h] = <a[dst(e), h], b[src(e), h]>, a [N_dst, H, D] and b [N_src, H, D] read by
    head: sarc's SDDMM (``_dots``). It keeps a and b (the one each other's gradient reads);
    backward: da = A_ds @ b per head, db = A_ds^T @ a (the transposed index), no edge row."""

    @staticmethod
    def forward(ctx, g, a, b, heads):
        ctx.g, ctx.lay, ctx.heads, ctx.shapes = g, layout(g), heads, (a.shape, b.shape)
        need_a, need_b = ctx.needs_input_grad[1:3]
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return _dots(ctx.lay, g.src, g.num_src, _by_head(a.detach(), heads),
                     _by_head(b.detach(), heads))

    @staticmethod
    @once_differentiable
    def backward(ctx, ds):
        g, lay, heads = ctx.g, ctx.lay, ctx.heads
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.needs_input_grad[1]:
            da = _products(lay.rowptr, lay.src, ds.to(b.dtype), (g.num_dst, g.num_src),
                           _by_head(b, heads), as_shape=ctx.shapes[0])
        if ctx.needs_input_grad[2]:
            db = transposed_product(g, ds.to(a.dtype), a, ctx.shapes[1])
        return None, da, db, None


_OUTPUT_NOT_SAVED = frozenset({
    "_CsrProductBackward", "_SoftmaxProductBackward", "_RecomputedSoftmaxProductBackward",
    "_DotScoresBackward",
    "AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "MmBackward0",
    "AddmmBackward0", "BmmBackward0", "UnsafeViewBackward0"})
"""Backward nodes that do not read their op's result: a result of theirs may be written over."""


def add_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, written over a (or over the tensor a is a reshape of) where nothing can read
    a's values after: the generated code reads a no more (``patterns.inplace_adds``), and
    autograd does not keep it for backward (its node is one of ``_OUTPUT_NOT_SAVED``, or
    it needs no gradient). Else, or where a's shape or dtype is not the sum's, a + b."""
    base = a if a._base is None else a._base
    if (a.shape != torch.broadcast_shapes(a.shape, b.shape) or torch.result_type(a, b) != a.dtype
            or base.numel() != a.numel() or not (a.is_contiguous() and base.is_contiguous())
            or base.requires_grad != a.requires_grad  # a view autograd does not see as one
            or (base.requires_grad and type(base.grad_fn).__name__ not in _OUTPUT_NOT_SAVED)):
        return a + b
    if base is a:
        return a.add_(b)
    try:
        onto = b.expand(a.shape).view(base.shape)
    except RuntimeError:  # b's broadcast is not a view in base's shape
        return a + b
    return base.add_(onto).view(a.shape)


def contract(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """``(a * b).sum(dim)`` (a and b broadcast) without the product: a block of rows at a
    time (``ROW_BLOCK_ELEMS``); in backward, the gradient of a full-size factor is the
    gradient times the other factor (its size, as any gradient of it), that of a factor
    broadcast to the product's shape is summed block by block."""
    return _Contract.apply(a, b, dim)


ROW_BLOCK_ELEMS = 1 << 20
"""Elements of a broadcast product (rows x width) one block of ``contract`` writes."""


def _row_blocks(shape: torch.Size):
    """Row spans [r0, r1) of a product of ``shape``."""
    if not shape:
        return [(0, 1)]
    step = max(1, ROW_BLOCK_ELEMS // max(1, math.prod(shape[1:])))
    return [(r0, min(shape[0], r0 + step)) for r0 in range(0, max(1, shape[0]), step)]


def _block(x: torch.Tensor, ndim: int, r0: int, r1: int) -> torch.Tensor:
    """The rows [r0, r1) of the product that factor x (broadcast to ``ndim`` axes) gives."""
    return x[r0:r1] if x.dim() == ndim and x.shape[0] != 1 else x


class _Contract(torch.autograd.Function):
    """``contract``: it keeps the factors (which the layer holds anyway)."""

    @staticmethod
    def forward(ctx, a, b, dim):
        shape = torch.broadcast_shapes(a.shape, b.shape)
        dim = dim % len(shape)
        ctx.dim, ctx.shape = dim, shape
        ctx.save_for_backward(a, b)
        blocks = _row_blocks(shape)
        if dim == 0 or len(blocks) == 1:  # a sum over the rows: no row blocks
            return torch.mul(a, b).sum(dim)
        out = a.new_empty(shape[:dim] + shape[dim + 1:], dtype=torch.result_type(a, b))
        for r0, r1 in blocks:
            torch.sum(torch.mul(_block(a, len(shape), r0, r1), _block(b, len(shape), r0, r1)),
                      dim, out=out[r0:r1])
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = grad.unsqueeze(ctx.dim)
        # a broadcast factor's (summed block by block) first: its blocks are gone before
        # a full-size factor's gradient is written
        order = sorted(range(2), key=lambda k: (a, b)[k].shape == ctx.shape)
        grads = [None, None, None]
        for k in order:
            if ctx.needs_input_grad[k]:
                grads[k] = _factor_grad((a, b)[k], (b, a)[k], grad, ctx.shape)
        return tuple(grads)


def _factor_grad(x: torch.Tensor, other: torch.Tensor, grad: torch.Tensor,
                 shape: torch.Size) -> torch.Tensor:
    """The gradient of factor x of ``contract`` given the sum's (unsqueezed at its axis)."""
    if x.shape == shape:  # not a view where it need not be: autograd adds to it in place
        d = torch.mul(grad, other).to(x.dtype)
        return d if d.shape == shape else d.expand(shape)
    nd = len(shape)
    rows = x.dim() == nd and x.shape[0] != 1  # x has the product's rows
    out = torch.zeros_like(x)
    for r0, r1 in _row_blocks(shape):
        part = torch.mul(_block(grad, nd, r0, r1), _block(other, nd, r0, r1))
        part = part.expand(r1 - r0, *shape[1:]).sum_to_size(_block(x, nd, r0, r1).shape)
        if rows:
            out[r0:r1] = part
        else:
            out += part
    return out


def _edge_rows(x: torch.Tensor | None, side: str, g: Graph, e0: int, e1: int):
    """Operand x as a region reads it on the edges [e0, e1) of g (CSR order)."""
    if x is None or side in ("src", "dst"):
        return None if x is None else x.index_select(0, (g.src if side == "src" else g.dst)[e0:e1])
    return x[e0:e1] if side == "edge" else x


SPAN_ELEMS = 1 << 20
"""Edge-value elements (edges x width) of one span of a region computed span by span, width
the region's widest edge value, in both passes. 2^18 gave GATv2's 64-wide region
4096-edge spans, hundreds of small ops per pass on a 1M-edge graph, while its backward took
65536-edge spans sized by the scores' width alone; 2^22 (a fused block's) was faster still
but doubled GATv2's peak memory (300k edges, F = 64: 196 MiB against 98 at 2^20)."""


def _edge_spans(g: Graph, width: int):
    """Spans [e0, e1) of g's edges with at most SPAN_ELEMS values of ``width``."""
    step = max(1, SPAN_ELEMS // max(1, width))
    return [(e0, min(g.num_edges, e0 + step)) for e0 in range(0, max(1, g.num_edges), step)]


def _span_scores(score, sides, width: int, g: Graph, operands) -> torch.Tensor:
    """A score region's scores [E, ...], computed span of edges by span of edges
    (``_edge_spans``, at the scores' width) from the node operands (None where the region
    reads none), without autograd: no edge value of the region outlives its span."""
    out = None
    with torch.no_grad():
        for e0, e1 in _edge_spans(g, width):
            s = score(g, *[_edge_rows(x, side, g, e0, e1) for x, side in zip(operands, sides)])
            if out is None:
                if e1 - e0 == g.num_edges:
                    return s
                out = s.new_empty(g.num_edges, *s.shape[1:])
            out[e0:e1] = s
    return out


def _scatter_add_rows(out: torch.Tensor, index: torch.Tensor, d: torch.Tensor,
                      sorted_index: bool) -> None:
    """out[index[e]] += d[e]: sarc's C scatter where built (``index_add_`` is several times
    slower on CPU); a sorted index (a span's destinations, CSR order) touches only the rows
    [index[0], index[-1]], so only those are scattered into and added."""
    k = cpu_kernels.kernels_for(out, d) if out.is_contiguous() and d.dtype == out.dtype else None
    # unsorted, the C scatter fills and adds all of out's rows: worth it for a span that
    # touches about as many rows as out has, not for a span of a large graph's
    if k is None or not index.numel() or (not sorted_index and out.shape[0] > 4 * index.numel()):
        out.index_add_(0, index, d)
        return
    if sorted_index:
        lo, hi = int(index[0]), int(index[-1]) + 1
        out[lo:hi].add_(k.scatter_rows(index - lo, d, hi - lo).view(hi - lo, *out.shape[1:]))
    else:
        out.add_(k.scatter_rows(index, d, out.shape[0]).view(out.shape))


def _span_score_grads(score, sides, g: Graph, operands, need: list[bool],
                      ds: torch.Tensor, width: int = 1) -> list[torch.Tensor | None]:
    """The gradients of the operands ``need`` names, given that of the region's scores
    ``ds``: the region again span by span, with autograd from each span's rows of its
    operands, each span's scores' gradient sent through it and the rows' gradients added
    into the operands' (no operand-sized tensor per span). The region's dropout masks are
    functions of their keys (``sarc.ir.rng``), so the second pass is the first."""
    grads: list[torch.Tensor | None] = [torch.zeros_like(x) if x is not None and n else None
                                        for x, n in zip(operands, need)]
    width = max(width, math.prod(ds.shape[1:]))  # the region's widest edge value: its spans
    wanted = [k for k, n in enumerate(need) if n]   # are the forward pass's
    with torch.enable_grad():
        for e0, e1 in _edge_spans(g, width):
            leaves = [None if x is None else
                      _edge_rows(x, side, g, e0, e1).detach().requires_grad_(n)
                      for x, side, n in zip(operands, sides, need)]
            s = score(g, *leaves)
            if not s.requires_grad:
                continue
            part = torch.autograd.grad(s, [leaves[k] for k in wanted], ds[e0:e1],
                                       allow_unused=True)
            for k, d in zip(wanted, part):
                if d is None:
                    continue
                if sides[k] in ("src", "dst"):
                    _scatter_add_rows(grads[k], (g.src if sides[k] == "src" else g.dst)[e0:e1],
                                      d, sides[k] == "dst")
                elif sides[k] == "edge":
                    grads[k][e0:e1].add_(d)
                else:
                    grads[k].add_(d)
    return grads


class _RecomputedScores(torch.autograd.Function):
    """A score region's scores [E, ...] (``_span_scores``), keeping none of the region's
    edge values: backward computes each span's again (``_span_score_grads``). What is
    kept is the operands, which the layer holds anyway; ``operands``: None where the
    region does not read one."""

    @staticmethod
    def forward(ctx, score, sides, width, g, *operands):
        ctx.score, ctx.sides, ctx.g, ctx.width = score, sides, g, width
        ctx.save_for_backward(*operands)
        return _span_scores(score, sides, width, g, operands)

    @staticmethod
    @once_differentiable
    def backward(ctx, ds):
        operands = ctx.saved_tensors
        need = [x is not None and n for x, n in zip(operands, ctx.needs_input_grad[4:])]
        return None, None, None, None, *_span_score_grads(ctx.score, ctx.sides, ctx.g,
                                                          operands, need, ds, ctx.width)


def _own(s: torch.Tensor, operands) -> torch.Tensor:
    """Scores to overwrite: s, or a contiguous copy where s is not contiguous or is an
    operand's memory (a region that returns an edge operand as it is)."""
    storage = s.untyped_storage().data_ptr()
    if s.is_contiguous() and not any(x is not None and x.untyped_storage().data_ptr() == storage
                                     for x in operands):
        return s
    return s.clone(memory_format=torch.contiguous_format)


def _recomputed_weights(score, sides, width: int, g: Graph, operands):
    """(alpha [E, H], the scores' shape): the softmax of the score region's scores,
    computed span by span and turned into alpha in their own memory."""
    s = _own(_span_scores(score, sides, width, g, operands), operands)
    return _softmax_rows_(s.reshape(g.num_edges, math.prod(s.shape[1:])), g), s.shape


class _RecomputedSoftmaxProduct(torch.autograd.Function):
    """y[v, h] = sum over the edges e into v of alpha[e, h] z[src(e), h], alpha the softmax
    of a score region's scores over each destination's edges: ``_RecomputedScores`` and
    ``_SoftmaxProduct`` in one, whose only [E, H] tensor is alpha.

    Forward: the scores span by span (``_span_scores``), turned into alpha in their own
    memory (``_softmax_rows_``), one CSR product per head. It keeps alpha, z and the
    region's operands. Backward: dz = A_alpha^T @ dy; the scores' gradient written over
    alpha, row by row from the SDDMM <dy[dst(e)], z[src(e)]> (the C kernel's
    ``softmax_vjp``; without it ``_softmax_vjp_into`` over the SDDMM's [E, H]); then the
    operands' gradients through the region span by span (``_span_score_grads``). A second
    backward of the same graph (``retain_graph``) computes alpha again from the operands.
    """

    @staticmethod
    def forward(ctx, score, sides, width, g, folds, z, *operands):
        ctx.score, ctx.sides, ctx.width, ctx.g, ctx.folds = score, sides, width, g, folds
        ctx.lay, ctx.z_shape, ctx.spent = layout(g), z.shape, False
        ops = _unfolded(z, operands, sides, folds, g, _contract_values)
        alpha, ctx.s_shape = _recomputed_weights(score, sides, width, g, ops)
        heads = alpha.shape[1]
        ctx.save_for_backward(alpha, z, *operands, *(ops[k] for k, _ in folds))
        return _products(ctx.lay.rowptr, ctx.lay.src, alpha, (g.num_dst, g.num_src),
                         _by_head(z.detach(), heads), as_shape=(g.num_dst, *z.shape[1:]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        g, lay, folds = ctx.g, ctx.lay, ctx.folds
        alpha, z, *saved = ctx.saved_tensors
        operands, folded = saved[:len(ctx.sides)], saved[len(ctx.sides):]
        ops = list(operands)
        for (k, _), x in zip(folds, folded):
            ops[k] = x
        heads = alpha.shape[1]
        if ctx.spent:  # the first backward wrote the scores' gradient over alpha
            alpha, _ = _recomputed_weights(ctx.score, ctx.sides, ctx.width, g, ops)
        dy3, z3 = _by_head(dy, heads), _by_head(z, heads)
        dz = None
        if ctx.needs_input_grad[5]:
            dz = transposed_product(g, alpha, dy3, ctx.z_shape)
        need = [x is not None and n for x, n in zip(ops, ctx.needs_input_grad[6:])]
        for k, _ in folds:  # a folded operand's gradient goes on to z's and its factor's
            need[k] = ctx.needs_input_grad[5] or ctx.needs_input_grad[6 + k]
        grads: list = [None] * len(ops)
        if any(need):
            k = cpu_kernels.kernels_for(dy3, z3, alpha)
            if k is not None and alpha.is_contiguous():
                ds = k.softmax_vjp(*lay.arrays(g.src, g.num_src), dy3, z3, alpha)
                ctx.spent = True
            else:
                ds = _softmax_vjp_into(_dots(lay, g.src, g.num_src, dy3, z3), alpha, g)
            grads = _span_score_grads(ctx.score, ctx.sides, g, ops, need, ds.reshape(ctx.s_shape),
                                      ctx.width)
        for k, dim in folds:
            grads[k] = _fold(grads[k], z, dz, operands[k], ctx.sides[k], dim, g,
                             ctx.needs_input_grad[6 + k])
        return None, None, None, None, None, dz, *grads


class _SoftmaxProduct(torch.autograd.Function):
    """y[v, h] = sum over the edges e into v of alpha[e, h] z[src(e), h], alpha the softmax
    of the scores s [E, *heads] over each destination's edges: one CSR product per head
    whose values are the weights.

    It keeps the weights, and z when the scores need a gradient. Backward:
    dz = A_alpha^T @ dy per head (the graph's transposed index), dalpha[e] =
    <dy[dst(e)], z[src(e)]> (an SDDMM), ds from dalpha by ``edge_softmax_vjp``.
    """

    @staticmethod
    def forward(ctx, g, s, z):
        lay = layout(g)
        heads = math.prod(s.shape[1:])
        alpha = _softmax_rows_(s.detach().reshape(g.num_edges, heads).clone(), g)
        ctx.g, ctx.lay, ctx.s_shape, ctx.z_shape = g, lay, s.shape, z.shape
        ctx.save_for_backward(alpha, z if ctx.needs_input_grad[1] else None)
        return _products(lay.rowptr, lay.src, alpha, (g.num_dst, g.num_src),
                         _by_head(z.detach(), heads), as_shape=(g.num_dst, *z.shape[1:]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        g, lay = ctx.g, ctx.lay
        alpha, z = ctx.saved_tensors
        heads = alpha.shape[1]
        dy3 = _by_head(dy, heads)
        ds = dz = None
        if ctx.needs_input_grad[2]:
            dz = transposed_product(g, alpha, dy3, ctx.z_shape)
        if ctx.needs_input_grad[1]:
            dalpha = _dots(lay, g.src, g.num_src, dy3, _by_head(z, heads))
            ds = _softmax_vjp_into(dalpha, alpha, g).reshape(ctx.s_shape)
        return None, ds, dz


def transposed_product(g: Graph, w: torch.Tensor, y: torch.Tensor, shape) -> torch.Tensor:
    """x[u, h] = sum over the edges e = (u, v) of w[e, h] * y[v, h]: the transpose of the
    per-head product (w [E, H], y [N_dst, ...] read as H heads), written in ``shape``
    ([N_src, ...])."""
    ptr, rows, order = layout(g).transposed()
    return _products(ptr, rows, w.to(y.dtype), (g.num_src, g.num_dst),
                     _by_head(y, w.shape[1]), order, as_shape=shape)


def softmax_shares(g: Graph, sc: torch.Tensor, z: torch.Tensor, m: torch.Tensor,
                   s: torch.Tensor, dy: torch.Tensor, d: torch.Tensor):
    """(alpha, ds) [E, H] in sc's dtype of a softmax over each destination's edges whose
    statistics are known (its max ``m`` and sum ``s``, and ``d = <dy, y>`` of its output y
    = sum alpha z): ``alpha = exp(sc - m[v]) / s[v]``, ``ds = alpha (<dy[v], z[u]> - d[v])``,
    the score gradient, its dots and arithmetic in float64 (a row's gradients then cancel
    as they do in float64; ``torch_blocks``' note). ``sc`` [E, *S] (H = prod S heads),
    ``z`` [N_src, *S, ...], ``dy`` [N_dst, *S, ...], ``m`` [N_dst, *S], ``s`` and ``d``
    [N_dst, *S] (float64). sarc's C kernel (one pass, no dot or node row in float64 kept)
    where built; else span of edges by span of edges."""
    heads = math.prod(sc.shape[1:])
    sc, m, s, d = (t.reshape(t.shape[0], heads) for t in (sc, m, s, d))
    z, dy = _by_head(z, heads), _by_head(dy, heads)
    k = cpu_kernels.kernels_for(dy, z, sc)
    if k is not None:
        return k.softmax_shares(*layout(g).arrays(g.src, g.num_src), dy, z, sc, m, s, d)
    f64 = torch.float64
    dots = torch.empty(sc.shape, dtype=f64, device=sc.device)
    for e0, e1 in _edge_spans(g, math.prod(z.shape[1:])):
        dots[e0:e1] = (dy.index_select(0, g.dst[e0:e1]).to(f64)
                       * z.index_select(0, g.src[e0:e1]).to(f64)).sum(-1)
    at_dst = lambda t: t.to(f64).index_select(0, g.dst)
    alpha = torch.exp(sc.to(f64) - at_dst(m)) / at_dst(s)
    ds = alpha * dots.sub_(at_dst(d))
    return alpha.to(sc.dtype), ds.to(sc.dtype)


def _softmax_vjp_into(dp: torch.Tensor, p: torch.Tensor, g: Graph) -> torch.Tensor:
    """``edge_softmax_vjp(p, dp)`` [E, H] computed in ``dp``'s memory (the caller's, not
    read after): ``p dp``, then twice the row sums and, span of edges by span of edges
    (``_edge_spans``), each edge's share of them taken off. The only whole [E, H]
    tensors are ``p`` and ``dp``; written out, the form holds five at once."""
    dx = dp.mul_(p)
    for _ in range(2):                  # <p, dp> per row, then the rounding sigma
        sums = segment_sum(dx, g)
        for e0, e1 in _edge_spans(g, math.prod(dx.shape[1:])):
            share = sums.index_select(0, g.dst[e0:e1]).mul_(p[e0:e1])
            dx[e0:e1].sub_(share)
    return dx


def _fold_rows(z: torch.Tensor, side: str, g: Graph) -> torch.Tensor:
    """z's rows that a folded operand of ``side`` contracts: all, or the dst rows."""
    return z if side == "src" else z[:g.num_dst]


def _folds_fit(z, operands, sides, folds, g: Graph) -> bool:
    """Whether each fold's factor broadcasts to z's rows (a contraction's backward can
    then add to z's gradient in place)."""
    for k, _ in folds:
        rows = _fold_rows(z, sides[k], g)
        p = operands[k]
        if p is None or torch.broadcast_shapes(rows.shape, p.shape) != rows.shape \
                or torch.result_type(rows, p) != z.dtype:
            return False
    return True


def _unfolded(z, operands, sides, folds, g: Graph, contracted) -> tuple:
    """The operands with each fold's contraction in its place: ``contracted(z's rows, p,
    dim)``."""
    ops = list(operands)
    for k, dim in folds:
        ops[k] = contracted(_fold_rows(z, sides[k], g), operands[k], dim)
    return tuple(ops)


def _contract_values(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    with torch.no_grad():
        return contract(a.detach(), b.detach(), dim)


def _fold(d: torch.Tensor | None, z: torch.Tensor, dz: torch.Tensor | None, p: torch.Tensor,
          side: str, dim: int, g: Graph, p_needs_grad: bool) -> torch.Tensor | None:
    """Given the gradient d of a folded operand ``contract(z's rows, p, dim)``: adds
    ``d * p`` to z's gradient ``dz`` in place, block of rows by block (no other z-sized
    tensor), and returns p's."""
    if d is None:
        return None
    rows = _fold_rows(z, side, g)
    grad = d.unsqueeze(dim % rows.dim())
    if dz is not None:
        out = _fold_rows(dz, side, g)
        for r0, r1 in _row_blocks(rows.shape):
            out[r0:r1].add_(torch.mul(grad[r0:r1], p))
    return _factor_grad(p, rows, grad, rows.shape) if p_needs_grad else None


def _softmax_rows_(s: torch.Tensor, g: Graph) -> torch.Tensor:
    """softmax of the scores s [E, H] over each destination's edges (max-shifted), as
    ``_EdgeSoftmax`` computes it, in s's memory, which it returns: the shifts and the
    divisions gathered span of edges by span of edges, no other [E, H] tensor."""
    shift = torch.segment_reduce(s, "max", offsets=g.rowptr, axis=0)
    spans = _edge_spans(g, math.prod(s.shape[1:]))
    for e0, e1 in spans:
        s[e0:e1].sub_(shift.index_select(0, g.dst[e0:e1])).exp_()
    total = segment_sum(s, g)
    for e0, e1 in spans:
        s[e0:e1].div_(total.index_select(0, g.dst[e0:e1]))
    return s


@accumulates
def sddmm(body, sides: tuple[str, ...], g: Graph, *operands):
    """y[e] = body(operands read at e)  (g-SDDMM); the result is an edge tensor by definition."""
    return body(g, *(per_edge(x, s, g) for x, s in zip(operands, sides)))


# --- ops of backward functions and dropout -----------------------------------------------

def dropout(x: torch.Tensor, p: float, seed, key: int, training: bool) -> torch.Tensor:
    """Dropout whose mask is a function of (seed, key): the interpreter's, see sarc.ir.rng."""
    return rng.dropout(x, p, seed, key, training)


@accumulates
def scatter_src(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[u] = sum over the edges e out of u of x[e]  (the transpose of gather_src): sarc's
    C ``scatter_rows`` where built (``_EdgeRowSum``), else ``index_add_``."""
    if g.num_edges and cpu_kernels.kernels_for(x) is not None:
        return _EdgeRowSum.apply(x, g, "src", g.num_src)
    out = x.new_zeros((g.num_src, *x.shape[1:]))
    return out.index_add_(0, g.src, x)


def dst_to_src(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """A dst value as a src value: dst rows first, zero rows for the other src nodes."""
    return torch.cat([x, x.new_zeros((g.num_src - g.num_dst, *x.shape[1:]))], 0)


def div_edge_count(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[v] = x[v] / max(1, number of edges into v)  (the divisor of a mean reduce)."""
    count = (g.rowptr[1:] - g.rowptr[:-1]).clamp(min=1).to(x.dtype)
    return x / _rowwise(count, x)


def row_outer(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_i a_i^T b_i over all leading axes: [m, n]."""
    return a.reshape(-1, a.shape[-1]).t() @ b.reshape(-1, b.shape[-1])


def typed_outer(x: torch.Tensor, c: torch.Tensor, types: torch.Tensor, num_types: int) -> torch.Tensor:
    """y[r] = sum over the rows i of type r of x_i^T c_i: rows grouped by type, one matmul per type."""
    order = torch.argsort(types, stable=True)
    counts = torch.bincount(types, minlength=num_types).tolist()
    xs = torch.split(x.index_select(0, order), counts)
    cs = torch.split(c.index_select(0, order), counts)
    return torch.stack([xs[r].t() @ cs[r] for r in range(num_types)])


@accumulates
def index_add(x: torch.Tensor, idx: torch.Tensor, num_rows: int) -> torch.Tensor:
    """y[r] = sum over the rows i with idx[i] = r of x[i]  (the transpose of a table lookup)."""
    return x.new_zeros((num_rows, *x.shape[1:])).index_add_(0, idx, x)


def pad_axis(x: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
    """``x`` with ``before`` and ``after`` zeros along ``dim`` (the gradient of a slice)."""
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [before, after]
    return torch.nn.functional.pad(x, pad)


def expand_rows(x: torch.Tensor, feat: tuple[int, ...]) -> torch.Tensor:
    """Broadcast the feature axes of a node or edge value to ``feat`` (a view)."""
    lead = len(feat) - (x.dim() - 1)
    return x.reshape(x.shape[0], *([1] * lead), *x.shape[1:]).expand(x.shape[0], *feat)
