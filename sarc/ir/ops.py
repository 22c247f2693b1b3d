"""The op set of sarc's IR and each op's type rule.

An op is just a name (an ``Op`` member). What an op *means* lives in per-op
tables: the type rule here (``TYPE_RULES``), the reference implementation in
``sarc.ir.interpreter``, the lowering of each backend in ``sarc.backends``.
``tests/ir/test_op_tables.py`` fails when an op misses an entry in any table.

Row axes are implicit: a value of the ``edge`` domain with feature shape
``(H, C)`` is a tensor of shape ``[E, H, C]``. Feature axes in attributes
(``axis``) count from the first *feature* axis.
"""
from __future__ import annotations

import enum
from typing import Callable, Mapping, Sequence

from .types import Domain, DType, TensorType
from .reducers import REDUCE_KINDS  # noqa: F401 - re-exported: the kinds of REDUCE / AGGREGATE


class Op(enum.Enum):
    # leaves
    INPUT = "input"            # attrs: name          a node or edge feature
    PARAM = "param"            # attrs: name          a learnable parameter
    CONST = "const"            # attrs: value         a scalar constant
    # graph movement
    GATHER_SRC = "gather_src"  # src -> edge:  y[e] = x[src(e)]
    GATHER_DST = "gather_dst"  # dst -> edge:  y[e] = x[dst(e)]
    REDUCE = "reduce"          # attrs: kind   edge -> dst: y[v] = kind_{e->v} x[e]
    EDGE_SOFTMAX = "edge_softmax"  # edge -> edge: softmax of x over the edges into dst(e)
    INDEX = "index"            # y[i] = table[idx[i]]  (param table, int rows)
    # elementwise, unary
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    ERF = "erf"                # the error function (GELU's)
    COS = "cos"
    SIN = "sin"
    LOG1P = "log1p"            # log(1 + x), exact for small x
    DETACH = "detach"          # y = x, through which no gradient flows (Tensor.detach)
    POW = "pow"                # attrs: exponent
    CLAMP_MIN = "clamp_min"    # attrs: min     y = max(x, min)
    LEAKY_RELU = "leaky_relu"  # attrs: slope
    ELU = "elu"                # attrs: alpha
    SOFTPLUS = "softplus"      # attrs: beta, threshold   torch's F.softplus
    DROPOUT = "dropout"        # attrs: p, key  (identity when not training; see sarc.ir.rng)
    CAST = "cast"              # attrs: dtype (a DType)   y = x converted (Tensor.float(), .to);
    #                            autocast=True: to torch.autocast's low dtype where it is on at
    #                            run time, else to dtype (the bias of a linear, as autocast casts it)
    # elementwise, binary (broadcasting)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    # linear algebra
    LINEAR = "linear"          # y = x @ W^T,  W: param [out, in]
    MATMUL = "matmul"          # y = a @ b,    b: param [k, n]
    TYPED_LINEAR = "typed_linear"  # y[i] = x[i] @ W[idx[i]],  W: param [R, in, out]
    # shape
    RESHAPE = "reshape"        # attrs: feat
    CONCAT = "concat"          # attrs: axis
    SUM_AXIS = "sum_axis"      # attrs: axis
    MAX_AXIS = "max_axis"      # attrs: axis, kind ("max" / "min")   torch.amax / amin
    SLICE = "slice"            # attrs: axis, start, stop   (a feature-axis range)
    PERMUTE = "permute"        # attrs: perm   the feature axes reordered (transpose, permute)
    # fused graph ops (made by the fusion pass); attrs hold a Region: a per-edge
    # expression over the operands, each read at the edge's src, dst, or the edge itself
    ARG = "arg"                # attrs: index, side    (a Region's operand, per edge)
    AGGREGATE = "aggregate"    # attrs: kind, body     y[v] = kind_{e->v} body(e)       (g-SpMM)
    SDDMM = "sddmm"            # attrs: body           y[e] = body(e)                   (g-SDDMM)
    SOFTMAX_AGGREGATE = "softmax_aggregate"  # attrs: score, value
    #                          y[v] = sum_{e->v} softmax_v(score)(e) * value(e)  (online softmax)
    # ops of backward functions (made by sarc.ir.autodiff; see the type rules below)
    SCATTER_SRC = "scatter_src"    # edge -> src:  y[u] = sum_{e: src(e)=u} x[e]  (transposed gather)
    DST_TO_SRC = "dst_to_src"      # dst -> src:   y[u] = x[u] for u < N_dst, else 0
    DIV_EDGE_COUNT = "div_edge_count"  # dst -> dst: y[v] = x[v] / max(1, #edges into v)
    SUM_ROWS = "sum_rows"          # node/edge -> param: y = sum_i x[i]
    ROW_OUTER = "row_outer"        # -> param [m, n]: y = sum_i a_i^T b_i  (leading axes flattened)
    TYPED_OUTER = "typed_outer"    # attrs: num_types   -> param [R, in, out]:
    #                                y[r] = sum_{i: idx[i]=r} x_i^T c_i
    INDEX_ADD = "index_add"        # attrs: num_rows    -> param: y[r] = sum_{i: idx[i]=r} x[i]
    TRANSPOSE = "transpose"        # param: swap the last two axes
    WHERE_POS = "where_pos"        # y = a where c > 0 else b  (broadcasting)
    EQ_MASK = "eq_mask"            # y = 1.0 where a == b else 0.0  (broadcasting)
    EXPAND = "expand"              # attrs: feat        broadcast size-1 / missing leading axes
    PAD = "pad"                    # attrs: axis, before, after   zeros around a feature axis
    #                                (the transpose of slice)


UNARY_ELEMENTWISE = frozenset({Op.NEG, Op.EXP, Op.LOG, Op.RELU, Op.SIGMOID, Op.TANH, Op.ERF,
                               Op.COS, Op.SIN, Op.LOG1P, Op.DETACH,
                               Op.POW, Op.CLAMP_MIN, Op.LEAKY_RELU, Op.ELU, Op.SOFTPLUS,
                               Op.DROPOUT})
BINARY_ELEMENTWISE = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})
LEAVES = frozenset({Op.INPUT, Op.PARAM, Op.CONST})


class TypeError_(Exception):
    """A type rule failed; the message names the problem, the caller adds where."""


def _fail(msg: str):
    raise TypeError_(msg)


def _broadcast_feat(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            _fail(f"feature shapes {list(a)} and {list(b)} do not broadcast")
        out.append(max(x, y) if 1 in (x, y) else x)
    return tuple(reversed(out))


def _param_as_feat(param: TensorType, other: TensorType) -> tuple[int, ...]:
    """Align a param's full shape with a graph value's full shape (torch rules).

    A param with as many dims as the graph value's full shape lines its first dim
    up with the row axis; that dim must be 1 (``att: [1, H, C]`` as in PyG).
    """
    full = len(other.feat) + 1
    shape = param.feat
    if len(shape) > full:
        # torch would broadcast to a result with more dims than rows + features
        _fail(f"a param of shape {list(shape)} has more dims than the "
              f"{other.domain.value} value of shape {_fmt(other)} it is combined with")
    if len(shape) == full:
        if shape[0] != 1:
            _fail(f"a param of shape {list(shape)} cannot broadcast against a "
                  f"{other.domain.value} value of shape {_fmt(other)}: its leading "
                  f"dim would cover the row axis")
        return shape[1:]
    return shape


def _fmt(t: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


# Integer values come from integer features (sarc.INDEX, Feature(dtype="i64")): type ids.
INTEGER_HINT = ("an integer feature is an index, which picks a weight per type "
                "(sarc.TypedLinear(x, edge.etype), a parameter table W[edge.etype]); to use "
                "it in arithmetic convert it first (x.float(), x.to(torch.float32), or "
                "x.to(h.dtype) for the layer's precision), or declare the feature as a float "
                "(its width, or sarc.Feature(shape)) and give it as a float tensor")


def _integer(x: TensorType, what: str) -> None:
    if not x.dtype.is_float:
        _fail(f"{what} on an integer ({x.dtype.value}) value {_fmt(x)}: {INTEGER_HINT}")


def _dtype_mismatch(a: TensorType, b: TensorType) -> None:
    """Where torch would promote, sarc asks for the conversion that says which dtype is meant."""
    _fail(f"dtype mismatch: {a.dtype.value} and {b.dtype.value}: convert one operand to the "
          f"other's dtype (x.to(y.dtype) or x.type_as(y)); sarc does not promote mixed dtypes")


def binary_type(a: TensorType, b: TensorType) -> TensorType:
    """Type of an elementwise binary op: same domain, or one side a param."""
    if a.domain is not Domain.PARAM and b.domain is not Domain.PARAM and a.domain is not b.domain:
        hint = ""
        if Domain.EDGE in (a.domain, b.domain):
            hint = " without a gather (use src./dst. inside message to read node values per edge)"
        _fail(f"cannot combine {a.domain.article} value {_fmt(a)} with "
              f"{b.domain.article} value {_fmt(b)}{hint}")
    _integer(a, "elementwise math")
    _integer(b, "elementwise math")
    if a.dtype is not b.dtype:
        _dtype_mismatch(a, b)
    if a.domain is Domain.PARAM and b.domain is Domain.PARAM:
        return TensorType(Domain.PARAM, a.dtype, _broadcast_feat(a.feat, b.feat))
    if a.domain is Domain.PARAM:
        return TensorType(b.domain, a.dtype, _broadcast_feat(_param_as_feat(a, b), b.feat))
    if b.domain is Domain.PARAM:
        return TensorType(a.domain, a.dtype, _broadcast_feat(a.feat, _param_as_feat(b, a)))
    if len(a.feat) != len(b.feat):
        # torch aligns shapes from the right, so [E] against [E, C] would line the
        # row axis of one up with a feature axis of the other
        _fail(f"cannot combine {a.domain.value} values of shapes {_fmt(a)} and {_fmt(b)}: "
              f"they differ in rank (add the missing axis, e.g. x.unsqueeze(-1))")
    return TensorType(a.domain, a.dtype, _broadcast_feat(a.feat, b.feat))


def _unary(ts, attrs):
    (x,) = ts
    _integer(x, "elementwise math")
    return x


def _dropout(ts, attrs):
    # The key names the dropout's mask stream (sarc.ir.rng): recomputing the value,
    # as a backward function does, must regenerate the same mask.
    if not isinstance(attrs.get("key"), int):
        _fail("dropout needs an int attribute key (set when traced; see sarc.ir.rng)")
    if not 0.0 <= attrs["p"] < 1.0:
        _fail(f"dropout rate must be in [0, 1), got {attrs['p']}")
    return _unary(ts, attrs)


def _cast(ts, attrs):
    """A conversion to another float dtype, of a float or an integer value; a float does not
    become an integer (that would round a value, and cut its gradient). A cast by autocast
    (``autocast=True``) is to the value's own dtype where autocast is off."""
    (x,) = ts
    to = attrs.get("dtype")
    if not isinstance(to, DType):
        _fail(f"cast needs a dtype attribute (a DType), got {to!r}")
    if not to.is_float:
        _fail(f"cast of {x.dtype.value} value {_fmt(x)} to {to.value}: a layer converts "
              f"values to float dtypes only (an integer value is an index, read as it is "
              f"given)")
    autocast = attrs.get("autocast", False)
    if autocast not in (True, False):
        _fail(f"cast's autocast attribute is True or False, got {autocast!r}")
    if autocast and to is not x.dtype:
        _fail(f"a cast by autocast of {x.dtype.value} value {_fmt(x)} is to its own dtype "
              f"where autocast is off, not {to.value}")
    if to is x.dtype and not autocast:
        _fail(f"cast of {x.dtype.value} value {_fmt(x)} to its own dtype")
    return x.with_(dtype=to)


def _gather(src_domain: Domain):
    def rule(ts, attrs):
        (x,) = ts
        if x.domain is not src_domain:
            _fail(f"gather from {src_domain.value} applied to {x.domain.article} value")
        return x.with_(domain=Domain.EDGE)
    return rule


def _reduce(ts, attrs):
    (x,) = ts
    if attrs["kind"] not in REDUCE_KINDS:
        _fail(f"unknown reduction {attrs['kind']!r}; expected one of {', '.join(REDUCE_KINDS)}")
    if x.domain is not Domain.EDGE:
        _fail(f"a reduce aggregates edge values into destination nodes, but its input "
              f"is {x.domain.article} value {_fmt(x)}")
    _integer(x, "a reduce")
    return x.with_(domain=Domain.DST)


def _edge_softmax(ts, attrs):
    (x,) = ts
    if x.domain is not Domain.EDGE:
        _fail(f"edge_softmax normalizes edge scores over each destination's incoming "
              f"edges, but its input is {x.domain.article} value {_fmt(x)}")
    return x


def _index(ts, attrs):
    table, idx = ts
    if table.domain is not Domain.PARAM:
        _fail(f"only parameter tables can be indexed per row; got {table.domain.article} value")
    if idx.dtype is not DType.I64 or idx.feat != ():
        _fail(f"a table index must be an int64 scalar per row, got {idx}")
    if not table.feat:
        _fail("cannot index a scalar parameter")
    return TensorType(idx.domain, table.dtype, table.feat[1:])


def _linear(ts, attrs):
    x, w = ts
    if w.domain is not Domain.PARAM or len(w.feat) != 2:
        _fail(f"linear needs a 2-d weight parameter [out, in], got {w}")
    if not x.feat or x.feat[-1] != w.feat[1]:
        _fail(f"linear: input has {x.feat[-1] if x.feat else 'no'} features but the "
              f"weight expects {w.feat[1]} (weight shape {list(w.feat)})")
    return x.with_(feat=(*x.feat[:-1], w.feat[0]))


def _matmul(ts, attrs):
    a, b = ts
    if b.domain is not Domain.PARAM or len(b.feat) != 2:
        per_row = ("" if b.domain is Domain.PARAM else
                   "; a product with a matrix per row (computed in the layer, as NNConv's) is "
                   "torch.einsum('ei,eio->eo', x, w) or x.unsqueeze(1) @ w (as many axes "
                   "on both sides)")
        _fail(f"matmul needs a 2-d parameter on the right, got {b}{per_row}")
    if not a.feat or a.feat[-1] != b.feat[0]:
        _fail(f"matmul: shapes {_fmt(a)} and {list(b.feat)} do not match")
    _integer(a, "matmul")
    if a.dtype is not b.dtype:
        _dtype_mismatch(a, b)
    return a.with_(feat=(*a.feat[:-1], b.feat[1]))


def _typed_linear(ts, attrs):
    x, w, idx = ts
    if w.domain is not Domain.PARAM or len(w.feat) != 3:
        _fail(f"typed linear needs a weight table [types, in, out], got {w}")
    if idx.dtype is not DType.I64 or idx.feat != () or idx.domain is not x.domain:
        _fail(f"typed linear needs an int64 type id per row of the input's domain "
              f"({x.domain.value}), got {idx}")
    if len(x.feat) != 1 or x.feat[0] != w.feat[1]:
        _fail(f"typed linear: input {_fmt(x)} does not match the weight table {list(w.feat)}")
    return x.with_(feat=(w.feat[2],))


def _reshape(ts, attrs):
    (x,) = ts
    feat = tuple(attrs["feat"])
    n_old = _prod(x.feat)
    if _prod(feat) != n_old:
        _fail(f"cannot reshape features {list(x.feat)} into {list(feat)}")
    return x.with_(feat=feat)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def _norm_axis(axis: int, ndim: int) -> int:
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim:
        _fail(f"feature axis {axis} is out of range for {ndim} feature axes")
    return a


def _concat(ts, attrs):
    if not ts:
        _fail("concat of nothing")
    first = ts[0]
    for t in ts[1:]:
        if t.domain is not first.domain:
            _fail(f"concat of {first.domain.article} and {t.domain.article} value")
        if t.dtype is not first.dtype or len(t.feat) != len(first.feat):
            _fail(f"concat of {first} and {t}")
    axis = _norm_axis(attrs["axis"], len(first.feat))
    for t in ts[1:]:
        for i, (p, q) in enumerate(zip(first.feat, t.feat)):
            if i != axis and p != q:
                _fail(f"concat: shapes {_fmt(first)} and {_fmt(t)} differ off the concat axis")
    feat = list(first.feat)
    feat[axis] = sum(t.feat[axis] for t in ts)
    return first.with_(feat=tuple(feat))


def _sum_axis(ts, attrs):
    (x,) = ts
    axis = _norm_axis(attrs["axis"], len(x.feat))
    return x.with_(feat=x.feat[:axis] + x.feat[axis + 1:])


def _permute(ts, attrs):
    (x,) = ts
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(len(x.feat))):
        _fail(f"permute {list(perm)} is not a permutation of the {len(x.feat)} feature axes")
    return x.with_(feat=tuple(x.feat[p] for p in perm))


def _max_axis(ts, attrs):
    (x,) = ts
    if attrs["kind"] not in ("max", "min"):
        _fail(f"max_axis kind {attrs['kind']!r}; expected max or min")
    return _sum_axis(ts, attrs)


def _slice(ts, attrs):
    (x,) = ts
    axis = _norm_axis(attrs["axis"], len(x.feat))
    start, stop = attrs["start"], attrs["stop"]
    if not 0 <= start < stop <= x.feat[axis]:
        _fail(f"slice [{start}:{stop}] is out of range for axis {axis} of size {x.feat[axis]}")
    feat = list(x.feat)
    feat[axis] = stop - start
    return x.with_(feat=tuple(feat))


SIDES = {"src": Domain.SRC, "dst": Domain.DST, "edge": Domain.EDGE, "param": Domain.PARAM}


def _check_region(region, ts, what: str) -> TensorType:
    """Operands agree with the region's ARG leaves; returns the region's result type."""
    for v in region.values:
        if v.op is Op.ARG:
            k, side = v.attr["index"], v.attr["side"]
            if not 0 <= k < len(ts):
                _fail(f"{what}: region reads operand {k} of {len(ts)}")
            if ts[k].domain is not SIDES[side]:
                _fail(f"{what}: operand {k} is a {ts[k].domain.value} value read as {side}")
            want = ts[k] if side == "param" else ts[k].with_(domain=Domain.EDGE)
            if v.type != want:
                _fail(f"{what}: operand {k} has type {ts[k]}, the region expects {v.type}")
    t = region.values[region.result].type
    if t.domain is not Domain.EDGE:
        _fail(f"{what}: a region computes a per-edge value, got {t}")
    return t


def _aggregate(ts, attrs):
    t = _check_region(attrs["body"], ts, "aggregate")
    if attrs["kind"] not in REDUCE_KINDS:
        _fail(f"unknown reduction {attrs['kind']!r}")
    return t.with_(domain=Domain.DST)


def _sddmm(ts, attrs):
    return _check_region(attrs["body"], ts, "sddmm")


def _softmax_aggregate(ts, attrs):
    s = _check_region(attrs["score"], ts, "softmax_aggregate score")
    v = _check_region(attrs["value"], ts, "softmax_aggregate value")
    if len(s.feat) > len(v.feat) or v.feat[: len(s.feat)] != s.feat:
        _fail(f"softmax_aggregate: scores {list(s.feat)} must prefix the value shape {list(v.feat)}")
    return v.with_(domain=Domain.DST)


def _leaf(ts, attrs):  # pragma: no cover - leaves are typed by the builder
    raise AssertionError("leaf types are given, not derived")


TypeRule = Callable[[Sequence[TensorType], Mapping], TensorType]

TYPE_RULES: dict[Op, TypeRule] = {
    Op.INPUT: _leaf,
    Op.PARAM: _leaf,
    Op.CONST: _leaf,
    Op.GATHER_SRC: _gather(Domain.SRC),
    Op.GATHER_DST: _gather(Domain.DST),
    Op.REDUCE: _reduce,
    Op.EDGE_SOFTMAX: _edge_softmax,
    Op.INDEX: _index,
    Op.LINEAR: _linear,
    Op.MATMUL: _matmul,
    Op.TYPED_LINEAR: _typed_linear,
    Op.RESHAPE: _reshape,
    Op.CONCAT: _concat,
    Op.SUM_AXIS: _sum_axis,
    Op.MAX_AXIS: _max_axis,
    Op.SLICE: _slice,
    Op.PERMUTE: _permute,
    Op.ARG: _leaf,
    Op.AGGREGATE: _aggregate,
    Op.SDDMM: _sddmm,
    Op.SOFTMAX_AGGREGATE: _softmax_aggregate,
    **{op: _unary for op in UNARY_ELEMENTWISE - {Op.DROPOUT}},
    Op.DROPOUT: _dropout,
    Op.CAST: _cast,
    **{op: (lambda ts, attrs: binary_type(*ts)) for op in BINARY_ELEMENTWISE},
}

ARITY: dict[Op, int | None] = {
    **{op: 0 for op in LEAVES},
    **{op: 1 for op in UNARY_ELEMENTWISE},
    **{op: 2 for op in BINARY_ELEMENTWISE},
    Op.GATHER_SRC: 1, Op.GATHER_DST: 1, Op.REDUCE: 1, Op.EDGE_SOFTMAX: 1,
    Op.INDEX: 2, Op.LINEAR: 2, Op.MATMUL: 2, Op.TYPED_LINEAR: 3,
    Op.RESHAPE: 1, Op.CONCAT: None, Op.SUM_AXIS: 1, Op.MAX_AXIS: 1, Op.SLICE: 1,
    Op.PERMUTE: 1, Op.CAST: 1,
    Op.ARG: 0, Op.AGGREGATE: None, Op.SDDMM: None, Op.SOFTMAX_AGGREGATE: None,
}
FUSED = frozenset({Op.AGGREGATE, Op.SDDMM, Op.SOFTMAX_AGGREGATE})


# --- ops of backward functions -------------------------------------------------------
# sarc.ir.autodiff writes the backward of a layer with these (plus the forward ops):
# transposed graph movement, parameter-gradient reductions over rows, and the masks of
# piecewise-linear derivatives. They read and write the same domains as forward ops.

BACKWARD_OPS = frozenset({Op.SCATTER_SRC, Op.DST_TO_SRC, Op.DIV_EDGE_COUNT, Op.SUM_ROWS,
                          Op.ROW_OUTER, Op.TYPED_OUTER, Op.INDEX_ADD, Op.TRANSPOSE,
                          Op.WHERE_POS, Op.EQ_MASK, Op.EXPAND, Op.PAD})


def _float(x: TensorType, what: str) -> None:
    if not x.dtype.is_float:
        _fail(f"{what} of an integer (index) value {_fmt(x)}")


def _domain_move(src: Domain, dst: Domain, what: str):
    def rule(ts, attrs):
        (x,) = ts
        if x.domain is not src:
            _fail(f"{what} takes {src.article} value, got {x.domain.article} value {_fmt(x)}")
        _float(x, what)
        return x.with_(domain=dst)
    return rule


def _sum_rows(ts, attrs):
    (x,) = ts
    if x.domain is Domain.PARAM:
        _fail(f"sum_rows sums the rows of a node or edge value, got a param {_fmt(x)}")
    _float(x, "sum_rows")
    return x.with_(domain=Domain.PARAM)


def _row_outer(ts, attrs):
    a, b = ts
    if a.domain is not b.domain or a.dtype is not b.dtype:
        _fail(f"row_outer of {a} and {b}: domains and dtypes must agree")
    if not a.feat or not b.feat or a.feat[:-1] != b.feat[:-1]:
        _fail(f"row_outer: shapes {_fmt(a)} and {_fmt(b)} must agree on all but the last axis")
    _float(a, "row_outer")
    return TensorType(Domain.PARAM, a.dtype, (a.feat[-1], b.feat[-1]))


def _typed_outer(ts, attrs):
    x, c, idx = ts
    if x.domain is Domain.PARAM or c.domain is not x.domain or idx.domain is not x.domain:
        _fail(f"typed_outer needs rows of one node or edge domain, got {x}, {c}, {idx}")
    if len(x.feat) != 1 or len(c.feat) != 1 or x.dtype is not c.dtype:
        _fail(f"typed_outer needs two vectors per row of one dtype, got {x} and {c}")
    if idx.dtype is not DType.I64 or idx.feat != ():
        _fail(f"typed_outer needs an int64 type id per row, got {idx}")
    _float(x, "typed_outer")
    return TensorType(Domain.PARAM, x.dtype, (int(attrs["num_types"]), x.feat[0], c.feat[0]))


def _index_add(ts, attrs):
    x, idx = ts
    if x.domain is Domain.PARAM or idx.domain is not x.domain:
        _fail(f"index_add adds rows of a node or edge value into a table, got {x} and {idx}")
    if idx.dtype is not DType.I64 or idx.feat != ():
        _fail(f"index_add needs an int64 row id per row, got {idx}")
    _float(x, "index_add")
    return TensorType(Domain.PARAM, x.dtype, (int(attrs["num_rows"]), *x.feat))


def _transpose(ts, attrs):
    (x,) = ts
    if x.domain is not Domain.PARAM or len(x.feat) < 2:
        _fail(f"transpose swaps the last two axes of a param of at least 2 dims, got {x}")
    return x.with_(feat=(*x.feat[:-2], x.feat[-1], x.feat[-2]))


def _where_pos(ts, attrs):
    c, a, b = ts
    return binary_type(binary_type(c, a), b)


def _pad(ts, attrs):
    (x,) = ts
    axis = _norm_axis(attrs["axis"], len(x.feat))
    before, after = attrs["before"], attrs["after"]
    if before < 0 or after < 0:
        _fail(f"pad by {before}, {after}: the counts are non-negative")
    feat = list(x.feat)
    feat[axis] += before + after
    return x.with_(feat=tuple(feat))


def _expand(ts, attrs):
    (x,) = ts
    feat = tuple(attrs["feat"])
    lead = len(feat) - len(x.feat)
    if lead < 0 or any(d != f and d != 1 for d, f in zip(x.feat, feat[lead:])):
        _fail(f"cannot expand features {list(x.feat)} to {list(feat)}")
    return x.with_(feat=feat)


TYPE_RULES.update({
    Op.SCATTER_SRC: _domain_move(Domain.EDGE, Domain.SRC, "scatter_src"),
    Op.DST_TO_SRC: _domain_move(Domain.DST, Domain.SRC, "dst_to_src"),
    Op.DIV_EDGE_COUNT: _domain_move(Domain.DST, Domain.DST, "div_edge_count"),
    Op.SUM_ROWS: _sum_rows,
    Op.ROW_OUTER: _row_outer,
    Op.TYPED_OUTER: _typed_outer,
    Op.INDEX_ADD: _index_add,
    Op.TRANSPOSE: _transpose,
    Op.WHERE_POS: _where_pos,
    Op.EQ_MASK: lambda ts, attrs: binary_type(*ts),
    Op.EXPAND: _expand,
    Op.PAD: _pad,
})
ARITY.update({
    Op.SCATTER_SRC: 1, Op.DST_TO_SRC: 1, Op.DIV_EDGE_COUNT: 1, Op.SUM_ROWS: 1,
    Op.ROW_OUTER: 2, Op.TYPED_OUTER: 3, Op.INDEX_ADD: 2, Op.TRANSPOSE: 1,
    Op.WHERE_POS: 3, Op.EQ_MASK: 2, Op.EXPAND: 1, Op.PAD: 1,
})


def infer_type(op: Op, input_types: Sequence[TensorType], attrs: Mapping) -> TensorType:
    """Apply ``op``'s type rule; raises ``TypeError_`` with a readable message."""
    arity = ARITY[op]
    if arity is not None and len(input_types) != arity:
        _fail(f"{op.value} takes {arity} inputs, got {len(input_types)}")
    return TYPE_RULES[op](input_types, attrs)
