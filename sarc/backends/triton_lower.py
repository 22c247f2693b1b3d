"""A fused op's region as Triton code: one ``tl.*`` expression per region value.

A kernel of the Triton backend walks the edges of a graph in tiles of
``BLOCK_E`` edges. Inside that loop every region value is a register *tile*:
a row axis (one row per edge of the tile, or a single row broadcast to all of
them: a value read at the program's own node, or a parameter) followed by the
value's feature axes. Each feature axis is padded to a power of two (Triton's
block shapes are powers of two) and masked where it is padded; at most one axis,
the last one of the result, is *tiled*: it spans ``BLOCK_D`` features starting
at ``fd`` and the launch grid has one program per feature block (see
``plan_tiling``).

Region ops lower through ``TL_LOWERING`` (the per-op table of this backend, as
``torch_backend.LOWERING`` is the PyTorch one): elementwise ops to one ``tl``
expression of their (broadcast-aligned) operands, shape ops to ``tl.reshape`` /
``tl.broadcast_to`` / ``tl.sum`` over the padded tiles. An op missing from the
table, or a shape change the padded layout cannot express in registers, raises
``TritonLoweringError`` naming the op; ``NOT_IN_KERNELS`` says why each op that
is absent is absent (``tests/backends/triton`` fails when an op is in neither).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import SarcError
from ..ir.function import Region, Value
from ..ir.ops import BINARY_ELEMENTWISE, Op
from ..ir.printer import format_value
from ..ir.types import DType


class TritonLoweringError(SarcError):
    """A construct the Triton backend cannot generate a kernel for (names the op)."""


def pow2(n: int) -> int:
    """The smallest power of two >= n (and >= 1)."""
    p = 1
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class Axis:
    """One feature axis of a tile: its true size, and whether it is the tiled axis."""

    size: int
    tiled: bool = False

    @property
    def block(self) -> str:
        """The axis' extent in the tile, as code."""
        return "BLOCK_D" if self.tiled else str(pow2(self.size))

    def index(self) -> str:
        """The feature indices along the axis, as code."""
        return "fd" if self.tiled else f"tl.arange(0, {pow2(self.size)})"

    def mask(self) -> str | None:
        """Which of them are real (not padding), as code; None if all are."""
        if self.tiled:
            return "dmask"
        if pow2(self.size) != self.size:
            return f"(tl.arange(0, {pow2(self.size)}) < {self.size})"
        return None


@dataclass(frozen=True)
class Tile:
    """How a region value lives in registers.

    ``rows``: ``"E"`` one row per edge of the tile (``BLOCK_E``), ``"1"`` one row
    for all of them (a value of the program's own node, a parameter), ``"S"`` a
    Python scalar (a constant).
    """

    rows: str
    axes: tuple[Axis, ...]

    @property
    def rank(self) -> int:
        return 1 + len(self.axes)

    def dims(self) -> list[str]:
        return ["BLOCK_E" if self.rows == "E" else "1", *(a.block for a in self.axes)]

    def shape(self) -> str:
        return _tuple(self.dims())

    def edge_shape(self) -> str:
        """The tile with one row per edge (what an accumulator over edges holds)."""
        return _tuple(["BLOCK_E", *(a.block for a in self.axes)])

    def feature_shape(self) -> str:
        """The tile without its row axis (an accumulator's shape)."""
        return _tuple([a.block for a in self.axes])


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def bcast(expr: str, axis: int, rank: int) -> str:
    """``expr``, a 1-d vector, placed on ``axis`` of a rank-``rank`` tile."""
    if rank == 1:
        return expr
    return f"{expr}[{', '.join(':' if i == axis else 'None' for i in range(rank))}]"


def wide(index: str) -> str:
    """A feature index as a 64-bit offset: an operand's stride need not be its row's width
    (a column-major input), and index x stride may pass 2^31 elements where the stride
    itself fits 32 bits (Triton passes it as int32 then)."""
    return f"{index}.to(tl.int64)"


def axis_mask(axes: tuple[Axis, ...], rank: int, first: int) -> list[str]:
    """The masks of the padded feature axes (axis i of ``axes`` at tile axis first + i)."""
    out = []
    for i, a in enumerate(axes):
        m = a.mask()
        if m is not None:
            out.append(bcast(m, first + i, rank))
    return out


# --- which axis is tiled ------------------------------------------------------------------

class _NoTiling(Exception):
    pass


def plan_tiling(r: Region) -> frozenset[int]:
    """The region values whose last feature axis is the tiled (feature-block) axis.

    The result's last axis is tiled when every value it is computed from either
    carries that axis as its own last axis or broadcasts along it (a size-1 or
    missing axis), and no op reduces over it or reshapes across it. Otherwise
    (or when the result has no feature axis wider than 1) nothing is tiled and
    each program computes whole feature rows.
    """
    root = r.values[r.result]
    if not root.type.feat or root.type.feat[-1] == 1:
        return frozenset()
    d = root.type.feat[-1]
    req: dict[int, bool] = {r.result: True}

    def need(i: int, flag: bool) -> None:
        if req.get(i, flag) != flag:
            raise _NoTiling
        req[i] = flag

    def along(i: int) -> bool:
        """Operand i carries the tiled axis (else it broadcasts along it)."""
        f = r.values[i].type.feat
        if not f or f[-1] == 1:
            return False
        if f[-1] != d:
            raise _NoTiling
        return True

    try:
        for j in reversed(range(len(r.values))):
            if j not in req:
                continue
            v = r.values[j]
            if not req[j]:
                for i in v.inputs:
                    need(i, False)
                continue
            if v.op in UNARY_TL or v.op in BINARY_ELEMENTWISE or v.op in (Op.WHERE_POS, Op.EQ_MASK,
                                                                          Op.CAST):
                for i in v.inputs:
                    need(i, along(i))
            elif v.op in (Op.RESHAPE, Op.EXPAND):
                fi = r.values[v.inputs[0]].type.feat
                if v.op is Op.RESHAPE and (not fi or fi[-1] != d):
                    raise _NoTiling
                need(v.inputs[0], along(v.inputs[0]))
            elif v.op is Op.SUM_AXIS:
                fi = r.values[v.inputs[0]].type.feat
                if v.attr["axis"] % len(fi) == len(fi) - 1:
                    raise _NoTiling
                need(v.inputs[0], True)
            elif v.op is Op.INDEX:
                need(v.inputs[0], True)
                need(v.inputs[1], False)
            elif v.op not in (Op.ARG, Op.CONST):
                raise _NoTiling
    except _NoTiling:
        return frozenset()
    return frozenset(j for j, t in req.items() if t)


# --- the emitter --------------------------------------------------------------------------

def compute_dtype(r: Region) -> str:
    """Kernels compute in float32 (float64 for float64 regions); half inputs are widened."""
    return "tl.float64" if any(v.type.dtype is DType.F64 for v in r.values) else "tl.float32"


def _const(x: float) -> str:
    if x != x:
        return 'float("nan")'
    if x in (float("inf"), float("-inf")):
        return f'float("{x}")'
    return repr(float(x))


def layout_compatible(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether a reshape from feature shape ``a`` to ``b`` keeps the padded layout.

    Axes of size 1 come and go freely. The rest are matched in groups of equal
    product; within a group every axis but the outermost must be an exact power
    of two, so that padding (only ever at the end of an axis) stays at the end of
    the group and ``tl.reshape`` of the padded tile moves no element.
    """
    a = tuple(x for x in a if x != 1)
    b = tuple(x for x in b if x != 1)
    i = j = 0
    while i < len(a) and j < len(b):
        ga, gb = [a[i]], [b[j]]
        pa, pb = a[i], b[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                pa *= a[i]
                ga.append(a[i])
                i += 1
            else:
                pb *= b[j]
                gb.append(b[j])
                j += 1
        if any(pow2(x) != x for x in ga[1:] + gb[1:]):
            return False
    return i == len(a) and j == len(b)


class RegionEmitter:
    """Writes the code of one region inside a kernel's edge loop.

    ``index`` maps each side an ARG can be read at to the code of its row
    indices: a ``[BLOCK_E]`` vector (one node or edge per edge of the tile) or,
    for ``row_sides``, a ``[1]`` vector (the program's own row, the same for
    every edge: such loads are hoisted before the loop). ``prefix`` names the
    region's values (``{prefix}{j}``) so that two regions can share a kernel.
    """

    def __init__(self, r: Region, prefix: str, index: dict[str, str],
                 row_sides: frozenset[str] = frozenset(), tiled: frozenset[int] | None = None,
                 cdtype: str | None = None):
        self.r, self.prefix, self.index, self.row_sides = r, prefix, index, row_sides
        self.tiled = plan_tiling(r) if tiled is None else tiled
        self.cdtype = cdtype or compute_dtype(r)
        self.pre: list[str] = []     # hoisted before the edge loop
        self.body: list[str] = []    # inside it
        self.tiles: dict[int, Tile] = {}
        self.names: dict[int, str] = {}
        self.operands: set[int] = set()   # the fused op's operands the region reads
        self.sides: set[str] = set()      # the sides it reads them at (index vectors needed)

    # the public result ------------------------------------------------------------------
    def emit(self) -> tuple[str, Tile]:
        for j, v in enumerate(self.r.values):
            if v.op is Op.ARG and self._only_indexed(j):
                continue  # a table read only through INDEX: loaded row by row there
            lower = TL_LOWERING.get(v.op)
            if lower is None:
                raise TritonLoweringError(
                    f"{v.op.value} cannot run inside a Triton kernel "
                    f"({NOT_IN_KERNELS.get(v.op, 'no lowering')})")
            lines = self.pre if self._hoisted(v) else self.body
            lines.append(f"# {format_value(j, v, with_loc=False, sigil='^')}")
            self.tiles[j] = self._tile_of(j, v)
            expr = lower(self, j, v)
            name = f"{self.prefix}{j}"
            if v.op is Op.CONST:
                self.names[j] = expr
                lines.pop()
            else:
                lines.append(f"{name} = {expr}")
                self.names[j] = name
        return self.names[self.r.result], self.tiles[self.r.result]

    # helpers ----------------------------------------------------------------------------
    def _only_indexed(self, j: int) -> bool:
        users = [v for v in self.r.values if j in v.inputs]
        return bool(users) and all(u.op is Op.INDEX and u.inputs[0] == j for u in users)

    def _hoisted(self, v: Value) -> bool:
        return v.op is Op.ARG and (v.attr["side"] in self.row_sides or v.attr["side"] == "param")

    def _tile_of(self, j: int, v: Value) -> Tile:
        if v.op is Op.CONST:
            return Tile("S", ())
        feat = v.type.feat
        axes = tuple(Axis(d, tiled=(j in self.tiled and k == len(feat) - 1))
                     for k, d in enumerate(feat))
        if v.op is Op.ARG:
            side = v.attr["side"]
            if side == "param" and not feat:
                return Tile("S", ())
            rows = "1" if side == "param" or side in self.row_sides else "E"
            return Tile(rows, axes)
        reads = v.inputs[1:] if v.op is Op.INDEX else v.inputs  # a table has no tile
        rows = "E" if any(self.tiles[i].rows == "E" for i in reads) else "1"
        return Tile(rows, axes)

    def operand(self, i: int) -> str:
        return self.names[i]

    def aligned(self, i: int, out: Tile) -> str:
        """Operand ``i`` reshaped to broadcast against a tile like ``out`` (torch's rules).

        Graph values already have the output's rank; a parameter lines its axes up
        from the right (a leading size-1 axis covering the row axis is dropped,
        missing leading axes are added).
        """
        t, name = self.tiles[i], self.names[i]
        if t.rows == "S" or t.rank == out.rank:
            return name
        axes = t.axes
        if t.rank > out.rank:
            drop = t.rank - out.rank
            assert all(a.size == 1 for a in axes[:drop]), "a param's row-aligned axis is 1"
            axes = axes[drop:]
        dims = ["1" if t.rows == "1" else "BLOCK_E", *(["1"] * (out.rank - 1 - len(axes))),
                *(a.block for a in axes)]
        return f"tl.reshape({name}, {_tuple(dims)})"

    def load_arg(self, j: int, v: Value) -> str:
        k, side = v.attr["index"], v.attr["side"]
        self.operands.add(k)
        self.sides.add(side)
        t = self.tiles[j]
        ptr = f"x{k}_ptr"
        if t.rows == "S":
            return f"tl.load({ptr}).to({self.cdtype})"
        first = 0 if side == "param" else 1   # the stride of feature axis 0
        rank = t.rank
        terms, masks = [], []
        if side != "param":
            terms.append(f"{bcast(self.index[side], 0, rank)} * x{k}_s0")
            if side not in self.row_sides:
                masks.append(bcast("emask", 0, rank))
        for i, a in enumerate(t.axes):
            terms.append(f"{bcast(wide(a.index()), i + 1, rank)} * x{k}_s{first + i}")
        masks += axis_mask(t.axes, rank, 1)
        # a parameter has feature terms only, each with a size-1 row axis: a [1, ...] tile
        offs = " + ".join(terms)
        mask = f", mask={' & '.join(masks)}" if masks else ""
        if v.type.dtype is DType.I64:
            return f"tl.load({ptr} + {offs}{mask}, other=0)"
        other = ", other=0.0" if masks else ""
        return f"tl.load({ptr} + {offs}{mask}{other}).to({self.cdtype})"


# --- the per-op table ------------------------------------------------------------------

Lowering = Callable[[RegionEmitter, int, Value], str]


def _unary(fmt: Callable[[Value, str], str]) -> Lowering:
    def lower(em: RegionEmitter, j: int, v: Value) -> str:
        return fmt(v, em.operand(v.inputs[0]))
    return lower


def _nary(fmt: Callable[[Value, list[str]], str]) -> Lowering:
    def lower(em: RegionEmitter, j: int, v: Value) -> str:
        return fmt(v, [em.aligned(i, em.tiles[j]) for i in v.inputs])
    return lower


def _pow(v: Value, x: str) -> str:
    e = float(v.attr["exponent"])
    if e == 1.0:
        return x
    if e == 0.0:
        return f"({x} * 0.0 + 1.0)"
    if e == 0.5:
        return f"tl.sqrt({x})"
    if e == -0.5:
        return f"(1.0 / tl.sqrt({x}))"
    if e.is_integer() and abs(e) <= 4:
        prod = " * ".join([x] * int(abs(e)))
        return f"({prod})" if e > 0 else f"(1.0 / ({prod}))"
    if e.is_integer():  # |x|^e, with the sign of x for odd e
        mag = f"tl.exp({_const(e)} * tl.log(tl.abs({x})))"
        return f"(tl.where({x} < 0, -1.0, 1.0) * {mag})" if int(e) % 2 else mag
    return f"tl.exp({_const(e)} * tl.log({x}))"


def _reshape(em: RegionEmitter, j: int, v: Value) -> str:
    i = v.inputs[0]
    fi, fo = em.r.values[i].type.feat, v.type.feat
    tin, tout = em.tiles[i], em.tiles[j]
    core_in = fi[:-1] if tin.axes and tin.axes[-1].tiled else fi
    core_out = fo[:-1] if tout.axes and tout.axes[-1].tiled else fo
    if not layout_compatible(core_in, core_out):
        raise TritonLoweringError(
            f"reshape {list(fi)} -> {list(fo)} moves padded elements (an axis that is not "
            f"a power of two is merged or split with an inner one); it cannot run on a "
            f"register tile")
    dims_in = tin.dims()
    dims_out = [tin.dims()[0], *(a.block for a in tout.axes)]
    if dims_in == dims_out:
        return em.operand(i)
    return f"tl.reshape({em.operand(i)}, {_tuple(dims_out)})"


def _expand(em: RegionEmitter, j: int, v: Value) -> str:
    i = v.inputs[0]
    out = em.tiles[j]
    x = em.aligned(i, out)
    dims = [em.tiles[i].dims()[0] if em.tiles[i].rows != "S" else "1", *(a.block for a in out.axes)]
    if em.tiles[i].rows == "S":
        return f"tl.full({_tuple(dims)}, {x}, {em.cdtype})"
    return f"tl.broadcast_to({x}, {_tuple(dims)})"


def _sum_axis(em: RegionEmitter, j: int, v: Value) -> str:
    i = v.inputs[0]
    t = em.tiles[i]
    k = v.attr["axis"] % len(t.axes)
    x = em.operand(i)
    m = t.axes[k].mask()
    if m is not None:
        x = f"tl.where({bcast(m, k + 1, t.rank)}, {x}, 0.0)"
    return f"tl.sum({x}, axis={k + 1})"


def _index(em: RegionEmitter, j: int, v: Value) -> str:
    table, idx = v.inputs
    tv = em.r.values[table]
    if tv.op is not Op.ARG or tv.attr["side"] != "param":
        raise TritonLoweringError("index reads a table that is not a parameter operand")
    k = tv.attr["index"]
    em.operands.add(k)
    t = em.tiles[j]
    rank = t.rank
    terms = [f"{bcast(em.operand(idx), 0, rank)} * x{k}_s0"]
    for a_i, a in enumerate(t.axes):
        terms.append(f"{bcast(wide(a.index()), a_i + 1, rank)} * x{k}_s{a_i + 1}")
    masks = [bcast("emask", 0, rank)] if em.tiles[idx].rows == "E" else []
    masks += axis_mask(t.axes, rank, 1)
    mask = f", mask={' & '.join(masks)}, other=0.0" if masks else ""
    return f"tl.load(x{k}_ptr + {' + '.join(terms)}{mask}).to({em.cdtype})"


_TL_DTYPE = {DType.F32: "tl.float32", DType.F16: "tl.float16", DType.BF16: "tl.bfloat16",
             DType.F64: "tl.float64"}


def _cast(em: RegionEmitter, j: int, v: Value) -> str:
    """A region computes in its compute dtype: a cast rounds the tile to the target dtype
    (where it is narrower) and goes on in the compute dtype, the value torch's cast gives
    of the region's value (which, computed in the compute dtype, may be finer than torch's
    op-by-op rounding in a half layer).
    To bfloat16 through ``_bf16_round`` (every kernel module's header): Triton's own
    conversion truncates, or gives 0 / NaN from float64, under the interpreter."""
    if v.attr.get("autocast"):   # never fused (passes.fuse): autocast is not the kernel's
        raise TritonLoweringError("a cast by autocast in an edge region")
    x = em.operand(v.inputs[0])
    to = _TL_DTYPE[v.attr["dtype"]]
    if to == em.cdtype:
        return f"{x}.to({em.cdtype})"
    if v.attr["dtype"] is DType.BF16:
        return f"_bf16_round({x}).to({em.cdtype})"
    return f"{x}.to({to}).to({em.cdtype})"


UNARY_TL: dict[Op, Callable[[Value, str], str]] = {
    Op.NEG: lambda v, x: f"-{x}",
    Op.EXP: lambda v, x: f"tl.exp({x})",
    Op.LOG: lambda v, x: f"tl.log({x})",
    Op.RELU: lambda v, x: f"_nan_max({x}, 0.0)",
    Op.SIGMOID: lambda v, x: f"tl.sigmoid({x})",
    Op.TANH: lambda v, x: f"_tanh({x})",
    Op.ERF: lambda v, x: f"tl.math.erf({x})",
    Op.COS: lambda v, x: f"tl.cos({x})",
    Op.SIN: lambda v, x: f"tl.sin({x})",
    Op.DETACH: lambda v, x: x,
    Op.LOG1P: lambda v, x: f"_log1p({x})",
    Op.POW: _pow,
    Op.CLAMP_MIN: lambda v, x: f"_nan_max({x}, {_const(v.attr['min'])})",
    Op.LEAKY_RELU: lambda v, x: f"tl.where({x} > 0, {x}, {x} * {_const(v.attr['slope'])})",
    Op.ELU: lambda v, x: (f"tl.where({x} > 0, {x}, "
                          f"{_const(v.attr['alpha'])} * _expm1_neg(_nan_min({x}, 0.0)))"),
    Op.SOFTPLUS: lambda v, x: f"_softplus({x}, {_const(v.attr['beta'])}, "
                              f"{_const(v.attr['threshold'])})",
}

TL_LOWERING: dict[Op, Lowering] = {
    Op.ARG: lambda em, j, v: em.load_arg(j, v),
    Op.CONST: lambda em, j, v: _const(v.attr["value"]),
    **{op: _unary(fmt) for op, fmt in UNARY_TL.items()},
    Op.ADD: _nary(lambda v, a: f"{a[0]} + {a[1]}"),
    Op.SUB: _nary(lambda v, a: f"{a[0]} - {a[1]}"),
    Op.MUL: _nary(lambda v, a: f"{a[0]} * {a[1]}"),
    Op.DIV: _nary(lambda v, a: f"{a[0]} / {a[1]}"),
    Op.WHERE_POS: _nary(lambda v, a: f"tl.where({a[0]} > 0, {a[1]}, {a[2]})"),
    Op.EQ_MASK: _nary(lambda v, a: f"tl.where({a[0]} == {a[1]}, 1.0, 0.0)"),
    Op.RESHAPE: _reshape,
    Op.EXPAND: _expand,
    Op.SUM_AXIS: _sum_axis,
    Op.INDEX: _index,
    Op.CAST: _cast,
}
"""Region op -> the code of its tile (the Triton twin of ``torch_backend.LOWERING``)."""

_GRAPH = "a graph op: the fusion pass never puts one inside a region; it runs as its own kernel"
_NODE = "a node- or parameter-level op: runs as PyTorch in the generated layer module"

NOT_IN_KERNELS: dict[Op, str] = {
    Op.INPUT: "a leaf of the layer, not of a region (regions read operands through arg)",
    Op.PARAM: "a leaf of the layer, not of a region (regions read operands through arg)",
    Op.GATHER_SRC: _GRAPH, Op.GATHER_DST: _GRAPH, Op.REDUCE: _GRAPH,
    Op.EDGE_SOFTMAX: _GRAPH, Op.SCATTER_SRC: _GRAPH,
    Op.AGGREGATE: _GRAPH, Op.SDDMM: _GRAPH, Op.SOFTMAX_AGGREGATE: _GRAPH,
    Op.DROPOUT: "dropout stays out of regions (the fusion pass leaves it to PyTorch, which "
                "draws its mask from sarc.ir.rng)",
    Op.CONCAT: "concatenating register tiles along a feature axis has no Triton primitive",
    Op.SLICE: "slicing a register tile along a feature axis has no Triton primitive",
    Op.PAD: "padding a register tile along a feature axis has no Triton primitive",
    Op.MAX_AXIS: "the maximum over a feature axis: left to PyTorch",
    Op.PERMUTE: "permuting a register tile's feature axes: left to PyTorch",
    Op.LINEAR: _NODE, Op.MATMUL: _NODE, Op.TYPED_LINEAR: _NODE,
    Op.DST_TO_SRC: _NODE, Op.DIV_EDGE_COUNT: _NODE, Op.SUM_ROWS: _NODE,
    Op.ROW_OUTER: _NODE, Op.TYPED_OUTER: _NODE, Op.TRANSPOSE: _NODE,
    Op.INDEX_ADD: "adds rows into a parameter table at data-dependent positions (the gradient "
                  "of a table read per edge): it needs atomics or a sort, not a region",
}
