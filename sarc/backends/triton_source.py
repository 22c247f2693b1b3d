"""Triton kernels of the graph ops, rendered from the jinja2 templates in ``templates/``.

Every function here returns a ``KernelSource``: the text of one standalone
module (``import triton`` is all it needs) holding one ``@triton.jit`` kernel,
its autotune space ``CONFIGS`` and key ``KEY``, and a ``launch`` function that
states the launch grid. Its header names the IR op it implements (printed),
what part of it (forward, the gradient of an operand, the merge of split
rows), the launch grid and the autotune space.

Kernels and their schedules:

- ``aggregate``: g-SpMM, ``y[r] = kind over the edges of row r of body(e)``,
  over CSR (rows = destinations) or CSC (rows = sources: the transposed
  aggregation of a source gradient). One program per work item (a row, or a
  segment of a long row: see ``triton_runtime``) and feature block; no atomics:
  segments write partial results that ``combine`` merges.
- ``softmax_aggregate``: attention in one pass over a row's edges with a running
  max and rescaling (online softmax); writes the per-row log-sum-exp for the
  backward pass; ``softmax_combine`` merges split rows.
- ``sddmm``: one value per edge, edge-parallel.
- ``edge_softmax`` / ``edge_softmax_grad``: an unfused edge_softmax (e.g. with
  dropout on the attention weights) and its backward, a program per row.
- ``typed_linear`` / ``typed_outer``: a weight per row type (RGCN), rows grouped
  by type (a segment GEMM, the row gather fused), and the weight gradient.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.function import Region
from ..ir.printer import format_region
from ..ir.reducers import reducer
from ..ir.types import Domain, DType, TensorType
from . import codegen
from .triton_lower import Axis, RegionEmitter, Tile, TritonLoweringError, axis_mask, bcast, pow2


@dataclass(frozen=True)
class KernelSource:
    """One generated kernel module: its name (a file stem) and text."""

    name: str
    source: str


@dataclass(frozen=True)
class Origin:
    """What a kernel's header names: the layer, the user's file and the IR op (printed)."""

    layer: str
    source: str
    ir: tuple[str, ...]


def _config(meta: dict[str, int], warps: int) -> str:
    items = ", ".join(f'"{k}": {v}' for k, v in meta.items())
    return f"triton.Config({{{items}}}, num_warps={warps})"


def _space(configs: list[tuple[dict[str, int], int]]) -> str:
    keys = list(configs[0][0])
    parts = [f"{k} in {sorted({m[k] for m, _ in configs})}" for k in keys]
    warps = sorted({w for _, w in configs})
    return f"{len(configs)} configs over {', '.join(parts)}, num_warps in {warps}"


TILED_ROW_CONFIGS = [({"BLOCK_E": 32, "BLOCK_D": 128}, 4), ({"BLOCK_E": 16, "BLOCK_D": 64}, 2),
                     ({"BLOCK_E": 32, "BLOCK_D": 64}, 4), ({"BLOCK_E": 64, "BLOCK_D": 32}, 4),
                     ({"BLOCK_E": 16, "BLOCK_D": 256}, 8), ({"BLOCK_E": 64, "BLOCK_D": 128}, 8)]
"""Row kernels (aggregate, softmax) with a tiled feature axis: edges x features per step."""

ROW_BLOCK_E = [(32, 4), (16, 2), (64, 4), (128, 8)]
EDGE_BLOCK_E = [(128, 4), (64, 4), (256, 8), (32, 2)]
TILED_EDGE_CONFIGS = [({"BLOCK_E": 64, "BLOCK_D": 128}, 4), ({"BLOCK_E": 128, "BLOCK_D": 64}, 4),
                      ({"BLOCK_E": 256, "BLOCK_D": 32}, 8), ({"BLOCK_E": 32, "BLOCK_D": 256}, 4)]

NARROW = 32
"""A tiled feature axis at most this wide gets tiles of its own (padded) width: the tiles
above are 32 to 256 features wide, and the autotuner prunes those wider than the axis."""

NARROW_ROW_BLOCK_E = (16, 32, 64, 128)
NARROW_EDGE_BLOCK_E = (64, 128, 256, 512)
ELEMS_PER_WARP = 256
"""Tile elements per warp of a narrow tile (8 per thread), 1 to 8 warps."""


def _tiled(wide: list[tuple[dict[str, int], int]], narrow_e: tuple[int, ...], d: int,
           width: int) -> list[tuple[dict[str, int], int]]:
    """Configs of a kernel tiling a feature axis of ``d`` elements: ``wide``, or for a narrow
    axis (GAT's 8-wide heads, a 7-class output layer) ``BLOCK_D`` its padded width and more
    edges per tile, so a program's lanes hold features rather than padding; warps by the
    tile's elements (``width``: an edge's padded elements, the other axes included)."""
    if d > NARROW:
        return wide
    return [({"BLOCK_E": e, "BLOCK_D": pow2(d)}, max(1, min(8, e * width // ELEMS_PER_WARP)))
            for e in narrow_e]
MAX_TILE = 16384
"""Elements of the widest register tile an untiled kernel may hold per program."""


def _untiled(block_e: list[tuple[int, int]], width: int) -> list[tuple[dict[str, int], int]]:
    """Configs of a kernel whose programs hold whole feature rows of ``width`` (padded) elements."""
    out = [({"BLOCK_E": e, "BLOCK_D": 1}, w) for e, w in block_e if e * width <= MAX_TILE]
    if not out:  # a very wide row: the smallest edge tile there is
        e, w = min(block_e)
        out = [({"BLOCK_E": max(1, min(e, MAX_TILE // max(1, width))), "BLOCK_D": 1}, w)]
    return out


def _width(tiles: list[Tile]) -> int:
    return max([math.prod(pow2(a.size) for a in t.axes) for t in tiles] + [1])


def _tiled_size(t: Tile) -> int:
    return next((a.size for a in t.axes if a.tiled), 1)


VIEWS = {
    # view: (index code per side, sides read at the program's own row, index loads)
    "csr": ({"dst": "rowv", "src": "i_src", "edge": "i_edge"}, frozenset({"dst"}),
            {"src": "i_src = tl.load(other_ptr + j, mask=emask, other=0)", "edge": "i_edge = j"}),
    "csc": ({"src": "rowv", "dst": "i_dst", "edge": "i_edge"}, frozenset({"src"}),
            {"dst": "i_dst = tl.load(other_ptr + j, mask=emask, other=0)",
             "edge": "i_edge = tl.load(eid_ptr + j, mask=emask, other=0)"}),
    "edges": ({"src": "i_src", "dst": "i_dst", "edge": "i_edge"}, frozenset(),
              {"src": "i_src = tl.load(src_ptr + j, mask=emask, other=0)",
               "dst": "i_dst = tl.load(dst_ptr + j, mask=emask, other=0)", "edge": "i_edge = j"}),
}


def _emitter(r: Region, prefix: str, view: str, tiled=None) -> RegionEmitter:
    index, row_sides, _ = VIEWS[view]
    return RegionEmitter(r, prefix, index, row_sides, tiled)


def _index_lines(view: str, sides: set[str]) -> list[str]:
    loads = VIEWS[view][2]
    return [loads[s] for s in ("src", "dst", "edge") if s in sides and s in loads]


def _params(types: list[TensorType], operands: set[int]) -> list[str]:
    """Pointer and strides of each operand a kernel reads (a graph value's row axis first)."""
    out = []
    for k in sorted(operands):
        t = types[k]
        rank = len(t.feat) + (0 if t.domain is Domain.PARAM else 1)
        out.append(", ".join([f"x{k}_ptr", *(f"x{k}_s{i}" for i in range(rank))]))
    return out


def _row_store(row: str, axes: tuple[Axis, ...]) -> tuple[str, str]:
    """Offsets and mask of a row of a contiguous [rows, *axes] buffer, the tile holding no rows."""
    sizes = [a.size for a in axes]
    rank = len(axes)
    terms = [f"{row} * {math.prod(sizes)}" if math.prod(sizes) != 1 else row]
    for i, a in enumerate(axes):
        stride = math.prod(sizes[i + 1:])
        terms.append(f"{bcast(a.index(), i, rank)}" + (f" * {stride}" if stride != 1 else ""))
    masks = axis_mask(axes, rank, 0)
    return " + ".join(terms), (f", mask={' & '.join(masks)}" if masks else "")


def cdtype_of(types: list[TensorType]) -> str:
    """The compute dtype of a kernel reading values of ``types`` (float64 only for float64)."""
    return "tl.float64" if any(t.dtype is DType.F64 for t in types) else "tl.float32"


def _render(template: str, name: str, origin: Origin, role: str, doc: list[str], grid: str,
            configs, key: list[str], extra_ir: list[str] = (), **ctx) -> KernelSource:
    text = codegen.render(
        template, layer=origin.layer, source=origin.source, name=name, role=role,
        ir=[*origin.ir, *extra_ir], doc=doc, grid=grid,
        configs=[_config(m, w) for m, w in configs], space=_space(configs), key=key, **ctx)
    return KernelSource(name, text)


def _region_ir(title: str, r: Region) -> list[str]:
    return ["", title, *format_region(r, "    ", with_loc=False)]


# --- g-SpMM ---------------------------------------------------------------------------

def _literal(x: float) -> str:
    """A float as Triton source: ``float("-inf")`` for the infinities."""
    return f'float("{x}")' if math.isinf(x) else repr(x)


@dataclass(frozen=True)
class RowReduce:
    """A node-level reducer in Triton source: the accumulator's start value (the
    reducer's unit), the statement folding a masked edge value ``{x}`` into it, the
    combine of two partials ``acc`` and ``x``, and the reduction of ``{x}`` over a tile's
    axis 0. max and min propagate NaN, as torch's (``_nan_max``: the kernels' header)."""

    identity: str
    accumulate: str
    combine: str
    tile: str


ROW_REDUCE: dict[str, RowReduce] = {
    "sum": RowReduce(_literal(reducer("sum").unit), "acc += {x}", "acc + x",
                     "tl.sum({x}, axis=0)"),
    "mean": RowReduce(_literal(reducer("mean").unit), "acc += {x}", "acc + x",
                      "tl.sum({x}, axis=0)"),
    "max": RowReduce(_literal(reducer("max").unit), "acc = _nan_max(acc, {x})",
                     "_nan_max(acc, x)", "tl.reduce({x}, 0, _nan_max)"),
    "min": RowReduce(_literal(reducer("min").unit), "acc = _nan_min(acc, {x})",
                     "_nan_min(acc, x)", "tl.reduce({x}, 0, _nan_min)"),
}
"""Each node-level reducer (``sarc.ir.reducers``) in an aggregate kernel and the combine
of split rows; softmax has kernels of its own (``softmax_aggregate``, ``softmax_combine``:
online rescaling)."""


def aggregate(origin: Origin, name: str, role: str, body: Region, kind: str, view: str,
              types: list[TensorType], show_body: bool = False) -> KernelSource:
    """``y[r] = kind over the edges of row r of body(e)``; ``view`` "csr" (rows = dst) or "csc"."""
    red = ROW_REDUCE.get(kind)
    if red is None:
        raise TritonLoweringError(f"unknown reduction {kind!r}")
    em = _emitter(body, "r", view)
    res, tile = em.emit()
    rank = tile.rank
    emask = bcast("emask", 0, rank)
    identity = red.identity
    accumulate = red.accumulate.format(x=f"tl.where({emask}, {res}, {identity})")
    reduce = red.tile
    offs, mask = _row_store("slot", tile.axes)
    d = _tiled_size(tile)
    width = _width(list(em.tiles.values()))
    configs = (_tiled(TILED_ROW_CONFIGS, NARROW_ROW_BLOCK_E, d, width) if d > 1
               else _untiled(ROW_BLOCK_E, width))
    row_side = "destination" if view == "csr" else "source"
    doc = [f"Reduction: {kind} over the edges of each {row_side} row "
           f"({'CSR' if view == 'csr' else 'CSC: the transposed graph'}); accumulation in "
           f"{em.cdtype.removeprefix('tl.')}.",
           "Schedule: rows are grouped in degree buckets (a launch per bucket, BLOCK_E pruned to "
           "the bucket's largest degree); rows longer than the split length run as segments "
           "whose partial results a combine kernel merges (no atomics)."]
    grid = ("(work items of the bucket, cdiv(D, BLOCK_D))" if d > 1 else "(work items of the bucket, 1)")
    extra = _region_ir("this kernel computes, per edge, then reduces:", body) if show_body else []
    return _render(
        "triton_aggregate.py.j2", name, origin, role, doc, grid, configs, ["D", "MAX_DEG"], extra,
        d=d, params=_params(types, em.operands), csc=(view == "csc"),
        row_side="dst" if view == "csr" else "src", pre=em.pre, index=_index_lines(view, em.sides),
        body=em.body, cdtype=em.cdtype, acc_shape=tile.edge_shape(), identity=identity,
        accumulate=accumulate,
        reduce=f"acc = {reduce.format(x='acc')}", kind=kind, by_degree=reducer(kind).by_degree,
        out_offs=offs, out_mask=mask,
        operands=sorted(em.operands))


def combine(origin: Origin, name: str, kind: str, feat: tuple[int, ...], cdtype: str) -> KernelSource:
    """Merge the partial results of split rows (``kind``: sum / mean / max / min)."""
    red = ROW_REDUCE[kind]
    configs = [({"BLOCK_F": 256}, 4), ({"BLOCK_F": 128}, 4), ({"BLOCK_F": 512}, 8)]
    doc = [f"Merges the partial {kind}s of the segments of each split row"
           + (", then divides by the row's degree." if reducer(kind).by_degree else ".")]
    return _render("triton_combine.py.j2", name, origin, "merge of split rows", doc,
                   "(split rows, cdiv(F, BLOCK_F))", configs, ["F"], f=math.prod(feat),
                   identity=red.identity, combine=red.combine, kind=kind,
                   by_degree=reducer(kind).by_degree, cdtype=cdtype)


# --- attention -------------------------------------------------------------------------

def _keep(name: str, n_keep: int, n_new: int, row: bool) -> str:
    """``name`` with ``n_new`` size-1 axes appended (after a row axis if ``row``)."""
    if n_new == 0 or (n_keep == 0 and not row):
        return name
    return f"{name}[{', '.join([':'] * (n_keep + row) + ['None'] * n_new)}]"


def softmax_aggregate(origin: Origin, name: str, score: Region, value: Region,
                      types: list[TensorType], acc: str | None = None) -> KernelSource:
    """``y[v] = sum_e softmax_v(score)(e) * value(e)`` in one pass (online softmax); the
    score and value computed as their regions say, the running max, sum and weighted sum
    in ``acc`` (default: the value's compute dtype)."""
    sf = score.values[score.result].type.feat
    vf = value.values[value.result].type.feat
    se = _emitter(score, "s", "csr", frozenset())
    ve = _emitter(value, "v", "csr", None if len(vf) > len(sf) else frozenset())
    acc = acc or ve.cdtype
    s_res, s_tile = se.emit()
    v_res, v_tile = ve.emit()
    ns, nx = len(sf), len(vf) - len(sf)
    offs, mask = _row_store("slot", v_tile.axes)
    s_offs, s_mask = _row_store("slot", s_tile.axes)
    d = _tiled_size(v_tile)
    tiles = list(se.tiles.values()) + list(ve.tiles.values())
    configs = (_tiled(TILED_ROW_CONFIGS, NARROW_ROW_BLOCK_E, d, _width(tiles)) if d > 1
               else _untiled(ROW_BLOCK_E, _width(tiles)))
    doc = ["One pass over each destination row's edges: running max m and sum l of "
           "exp(score - m) per score element, the accumulator rescaled by exp(m_old - m_new) "
           f"(FlashAttention's online softmax); accumulation in {acc.removeprefix('tl.')}.",
           "Writes m and l per row, apart (the backward pass recomputes the weights "
           "exp(score - m) / l from them).",
           "Schedule: degree buckets; long rows split into segments merged by a combine kernel."]
    grid = "(work items of the bucket, cdiv(D, BLOCK_D))" if d > 1 else "(work items of the bucket, 1)"
    return _render(
        "triton_softmax_aggregate.py.j2", name, origin, "forward", doc, grid, configs,
        ["D", "MAX_DEG"], d=d, params=_params(types, se.operands | ve.operands),
        pre=se.pre + ve.pre, index=_index_lines("csr", se.sides | ve.sides),
        body=se.body + ve.body, cdtype=acc, score_shape=s_tile.feature_shape(),
        acc_shape=v_tile.feature_shape(), score=s_res, value=v_res,
        emask_s=bcast("emask", 0, 1 + ns), emask_v=bcast("emask", 0, 1 + len(vf)),
        shift_e="shift" if ns == 0 else f"shift[{', '.join(['None'] + [':'] * ns)}]",
        p_x=_keep("p", ns, nx, True), scale_x=_keep("scale", ns, nx, False),
        l_x=_keep("l", ns, nx, False), out_offs=offs, out_mask=mask,
        score_offs=s_offs, score_mask=s_mask, operands=sorted(se.operands | ve.operands))


def softmax_combine(origin: Origin, name: str, score_feat: tuple[int, ...],
                    value_feat: tuple[int, ...], cdtype: str) -> KernelSource:
    configs = [({"BLOCK_F": 256}, 4), ({"BLOCK_F": 128}, 4), ({"BLOCK_F": 512}, 8)]
    ns = math.prod(score_feat)
    f = math.prod(value_feat)
    doc = ["Merges the (m, l, acc) partial results of the segments of each split row, "
           "writes the normalized row and its log-sum-exp."]
    return _render("triton_softmax_combine.py.j2", name, origin, "merge of split rows", doc,
                   "(split rows, cdiv(F, BLOCK_F))", configs, ["F"], f=f, ns=ns, cx=f // ns,
                   cdtype=cdtype)


# --- g-SDDMM ---------------------------------------------------------------------------

def sddmm(origin: Origin, name: str, role: str, body: Region, types: list[TensorType],
          show_body: bool = False) -> KernelSource:
    """``y[e] = body(e)``, edge-parallel, in CSR edge order."""
    em = _emitter(body, "r", "edges")
    res, tile = em.emit()
    rank = tile.rank
    if tile.rows != "E":
        res = f"tl.broadcast_to({res}, {tile.edge_shape()})"
    sizes = [a.size for a in tile.axes]
    terms = [f"{bcast('j', 0, rank)} * {math.prod(sizes)}"]
    for i, a in enumerate(tile.axes):
        stride = math.prod(sizes[i + 1:])
        terms.append(bcast(a.index(), i + 1, rank) + (f" * {stride}" if stride != 1 else ""))
    masks = [bcast("emask", 0, rank), *axis_mask(tile.axes, rank, 1)]
    d = _tiled_size(tile)
    width = _width(list(em.tiles.values()))
    configs = (_tiled(TILED_EDGE_CONFIGS, NARROW_EDGE_BLOCK_E, d, width) if d > 1
               else _untiled(EDGE_BLOCK_E, width))
    doc = [f"One value per edge, edge-parallel (no reduction); computed in "
           f"{em.cdtype.removeprefix('tl.')}, stored in the op's dtype."]
    grid = "(cdiv(E, BLOCK_E), cdiv(D, BLOCK_D))" if d > 1 else "(cdiv(E, BLOCK_E), 1)"
    extra = _region_ir("this kernel computes, per edge:", body) if show_body else []
    return _render(
        "triton_sddmm.py.j2", name, origin, role, doc, grid, configs, ["D"], extra, d=d,
        params=_params(types, em.operands), pre=em.pre, index=_index_lines("edges", em.sides),
        body=em.body, result=res, out_offs=" + ".join(terms), out_mask=" & ".join(masks),
        operands=sorted(em.operands))


# --- unfused edge softmax ----------------------------------------------------------------

def edge_softmax(origin: Origin, name: str, f: int, cdtype: str, grad: bool) -> KernelSource:
    configs = [({"BLOCK_E": 32, "BLOCK_F": 32}, 4), ({"BLOCK_E": 16, "BLOCK_F": 64}, 4),
               ({"BLOCK_E": 64, "BLOCK_F": 16}, 4), ({"BLOCK_E": 128, "BLOCK_F": 8}, 8)]
    if grad:
        doc = ["dx = y * (dy - sum over the row's edges of y * dy), minus y times the row's "
               "sum of dx (the cancellation-free form of sarc.ir.softmax): three passes over "
               "each row."]
        return _render("triton_edge_softmax_grad.py.j2", name, origin, "backward", doc,
                       "(rows of the bucket, cdiv(F, BLOCK_F))", configs, ["F", "MAX_DEG"],
                       f=f, cdtype=cdtype)
    doc = ["Two passes over each destination row's edges: max and sum of exponentials "
           "(online), then the normalized weights. Rows in degree buckets; a long row is "
           "one program (not split)."]
    return _render("triton_edge_softmax.py.j2", name, origin, "forward", doc,
                   "(rows of the bucket, cdiv(F, BLOCK_F))", configs, ["F", "MAX_DEG"],
                   f=f, cdtype=cdtype)


SITE_PARTS = {
    "normalizer": ("the block's normalizer (m, s)",
                   ["Per destination row of the block: m = the max score (exact, in the "
                    "score's dtype) and s = sum exp(x - m), in float64 (two passes)."]),
    "weights": ("forward: global weights",
                ["alpha = exp(x - M) / S per edge, M and S the normalizers merged over "
                 "every block (float64), rounded once to the score's dtype."]),
    "scaled_weights": ("the normalizer pass's score gradient",
                       ["alpha * w per edge, w one float64 number per destination row and "
                        "score element: the gradient of sum_e alpha_e w_v."]),
    "row_sums": ("the block's weight sums",
                 ["A = sum over the row's edges of alpha, in float64."]),
    "row_shares": ("backward: the main pass's share of the score gradient",
                   ["A = sum alpha and B = sum alpha dy over the row's edges (float64; B "
                    "is kept for the normalizer pass), then dx = alpha dy - alpha B / A, "
                    "rounded once: two passes over each row."]),
}
"""An unfused edge_softmax on a distributed block (``triton_blocks``): its kernels, by part."""


def softmax_site(origin: Origin, name: str, part: str, f: int) -> KernelSource:
    """One kernel of an unfused edge_softmax's block ops (``SITE_PARTS``): rows of a
    degree bucket, every exponential and sum in float64 (``torch_blocks.STATS``)."""
    role, doc = SITE_PARTS[part]
    configs = [({"BLOCK_E": 32, "BLOCK_F": 32}, 4), ({"BLOCK_E": 16, "BLOCK_F": 64}, 4),
               ({"BLOCK_E": 64, "BLOCK_F": 16}, 4), ({"BLOCK_E": 128, "BLOCK_F": 8}, 8)]
    return _render("triton_softmax_site.py.j2", name, origin, role, doc,
                   "(rows of the bucket, cdiv(F, BLOCK_F))", configs, ["F", "MAX_DEG"],
                   f=f, part={"scaled_weights": "weights", "row_sums": "shares",
                              "row_shares": "shares"}.get(part, part),
                   scaled=part == "scaled_weights", grad=part == "row_shares")


# --- typed linear ------------------------------------------------------------------------

def typed_linear(origin: Origin, name: str, role: str, dtype: DType) -> KernelSource:
    if dtype is DType.F64:
        raise TritonLoweringError("typed_linear in float64: tl.dot has no float64 kernel")
    configs = [({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, 4),
               ({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}, 4),
               ({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32}, 4),
               ({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, 8)]
    doc = ["Rows grouped by type (a stable sort of the type ids, per call); one program per "
           "(type, block of its rows, block of output columns): a segment GEMM with tl.dot and "
           "float32 accumulation; an edge-level input gathered from node rows on the fly."]
    dot = ', input_precision="ieee"' if dtype is DType.F32 else ""
    return _render("triton_typed_linear.py.j2", name, origin, role, doc,
                   "(types x cdiv(largest type count, BLOCK_M), cdiv(N, BLOCK_N))", configs,
                   ["K", "N"], dot_args=dot)


def typed_outer(origin: Origin, name: str, dtype: DType) -> KernelSource:
    if dtype is DType.F64:
        raise TritonLoweringError("typed_linear in float64: tl.dot has no float64 kernel")
    configs = [({"BLOCK_M": 64, "BLOCK_K": 32, "BLOCK_N": 32}, 4),
               ({"BLOCK_M": 128, "BLOCK_K": 64, "BLOCK_N": 64}, 8),
               ({"BLOCK_M": 32, "BLOCK_K": 32, "BLOCK_N": 32}, 2)]
    doc = ["dw[r] = sum over the rows of type r of x_i^T c_i: one program per (type, block of "
           "input features, block of output features), looping over the type's rows."]
    dot = ', input_precision="ieee"' if dtype is DType.F32 else ""
    return _render("triton_typed_outer.py.j2", name, origin, "weight gradient", doc,
                   "(types, cdiv(K, BLOCK_K), cdiv(N, BLOCK_N))", configs, ["K", "N"],
                   dot_args=dot)
