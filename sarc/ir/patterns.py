"""Analyses of fused ops (``sarc.ir.passes.fuse``) that the backends and the planner
share: how a fused op reads its operands, how wide its per-edge rows are, and whether an
aggregate is a (typed, weighted) sparse product, which kernels run as CSR SpMM and which
keep only their edge weights for the backward."""
from __future__ import annotations

from dataclasses import dataclass

from .function import Function, Region, Value
from .ops import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, Op
from .types import Domain
from .reducers import reducer


def region_sides(v: Value) -> tuple[str, ...]:
    """How a fused op reads each operand (src / dst / edge / param), from its regions."""
    sides: dict[int, str] = {}
    for _, r in v.attrs:
        if isinstance(r, Region):
            for a in r.values:
                if a.op is Op.ARG:
                    sides[a.attr["index"]] = a.attr["side"]
    return tuple(sides[k] for k in range(len(v.inputs)))


def region_width(v: Value, only: str | None = None) -> int:
    """The widest per-edge row (elements) any of a fused op's regions (the one named
    ``only``) computes."""
    width = 1
    for name, r in v.attrs:
        if isinstance(r, Region) and only in (None, name):
            for a in r.values:
                n = 1
                for d in a.type.feat:
                    n *= d
                width = max(width, n)
    return width


def arg_index(r: Region, j: int, side: str | None = None) -> int | None:
    """The operand index value ``j`` of ``r`` reads, if it is an ARG (of ``side``)."""
    v = r.values[j]
    if v.op is Op.ARG and (side is None or v.attr["side"] == side):
        return v.attr["index"]
    return None


def edge_scalar(r: Region, j: int) -> int | None:
    """The operand read by ``j`` if it is one scalar per edge (maybe reshaped to [1, ..])."""
    v = r.values[j]
    while v.op is Op.RESHAPE and all(d == 1 for d in v.type.feat):
        j = v.inputs[0]
        v = r.values[j]
    return arg_index(r, j, "edge") if (v.op is Op.ARG and all(d == 1 for d in v.type.feat)) else None


def edge_head_weight(r: Region, j: int, feat: tuple[int, ...]) -> int | None:
    """The operand read by ``j`` if it is an edge value weighing the leading axes of
    features ``feat``: of shape ``feat[:k] + (1, ...)``, k below ``len(feat)`` (a scalar
    per edge when k = 0, one per head for GAT's ``x[src] * alpha.unsqueeze(-1)``), maybe
    reshaped from the operand (a reshape keeps a row's element order: the operand holds
    those weights)."""
    t = r.values[j].type.feat
    k = len(t)
    while k and t[k - 1] == 1:
        k -= 1
    if len(t) != len(feat) or t[:k] != feat[:k] or (k and k == len(feat)):
        return None  # not a weight of leading axes (a full-width edge value is no weight)
    while r.values[j].op is Op.RESHAPE:
        j = r.values[j].inputs[0]
    return arg_index(r, j, "edge")


def spmm_pattern(v: Value) -> tuple[int, int | None, str] | None:
    """(feature operand, edge-weight operand or None, its side) when an aggregate is a
    (weighted) sparse product: ``sum/mean of x[src]`` or ``of x[src] * w[e]``, w a
    scalar per edge or one per head (``edge_head_weight``); x may also be an edge
    value: a weighted segment sum."""
    if v.op is not Op.AGGREGATE or not reducer(v.attr["kind"]).linear:
        return None
    r = v.attr["body"]
    res = r.values[r.result]
    x = arg_index(r, r.result, "src")
    if x is not None:
        return x, None, "src"
    if res.op is Op.MUL:
        a, b = res.inputs
        for p, q in ((a, b), (b, a)):
            w = edge_head_weight(r, q, res.type.feat)
            for side in ("src", "edge"):
                x = arg_index(r, p, side)
                if x is not None and w is not None and w != x and r.values[p].type == res.type:
                    return x, w, side
    return None


def extremum_pattern(v: Value) -> int | None:
    """The operand a max / min aggregate selects from when its message is that source
    feature as it is (DGL's ``copy_u`` max): a product over the CSR index that forms no
    edge tensor (None: another form)."""
    if v.op is not Op.AGGREGATE or not reducer(v.attr["kind"]).selects:
        return None
    r = v.attr["body"]
    return arg_index(r, r.result, "src")


_FLIP = {"max": "min", "min": "max"}


def lifted_extremum(v: Value) -> tuple[int, str] | None:
    """(source operand, the extremum to take of it) when a max / min aggregate's message is
    one source feature plus or minus values constant over a destination's edges (its own
    rows, parameters, constants; what is computed of them alone, ``pushdown`` computes per
    node): DGL's EdgeConv, ``(W h)_v - (W h)_u + b + (P h)_v`` once
    W is at the nodes, is ``(W h)_v - min_u (W h)_u + b + (P h)_v``. Rounding is monotone,
    so the extremum over a row's edges of the message is the message at the source
    feature's extremum (of the opposite kind where the feature is subtracted): the body
    evaluated once per destination, on that row (None: another form)."""
    if v.op is not Op.AGGREGATE or v.attr["kind"] not in _FLIP:
        return None
    r = v.attr["body"]
    found: list[tuple[Value, int]] = []

    def terms(j: int, sign: int) -> bool:
        x = r.values[j]
        if x.op is Op.CONST:
            return True
        if x.op is Op.ARG:
            if x.attr["side"] == "src":
                found.append((x, sign))
            return x.attr["side"] in ("src", "dst", "param")
        if x.op is Op.NEG:
            return terms(x.inputs[0], -sign)
        if x.op in (Op.ADD, Op.SUB):
            a, b = x.inputs
            return terms(a, sign) and terms(b, -sign if x.op is Op.SUB else sign)
        return False

    if not terms(r.result, 1) or len(found) != 1:
        return None
    arg, sign = found[0]
    if r.values[r.result].type.feat != arg.type.feat:
        return None   # the feature broadcast over the message: keep the edges' own form
    return arg.attr["index"], v.attr["kind"] if sign > 0 else _FLIP[v.attr["kind"]]


def softmax_value(v: Value) -> int | None:
    """The operand an attention (``softmax_aggregate``) weighs when its value is a source
    feature as it is (GAT's z): a sparse product per head weighted by the softmax, no
    message per edge (None: another form, or not an attention)."""
    if v.op is not Op.SOFTMAX_AGGREGATE:
        return None
    value = v.attr["value"]
    return arg_index(value, value.result, "src")


def dot_score(v: Value) -> tuple[int, int, str | None, float] | None:
    """(source operand, destination operand, ``"mul"`` / ``"div"`` / None, the constant)
    when an attention's score is the dot product of a source and a destination row per
    head, maybe scaled by a constant: DotGatConv's and a transformer's ``(q_v * k_u).sum(-1)
    / sqrt(d)``, one SDDMM (None: another form)."""
    if v.op is not Op.SOFTMAX_AGGREGATE:
        return None
    r = v.attr["score"]

    def unshaped(j: int) -> int:
        while r.values[j].op is Op.RESHAPE:
            j = r.values[j].inputs[0]
        return j

    j, scale, c = unshaped(r.result), None, 1.0
    x = r.values[j]
    if x.op in (Op.MUL, Op.DIV):
        a, b = x.inputs
        if x.op is Op.MUL and r.values[a].op is Op.CONST:
            a, b = b, a
        if r.values[b].op is Op.CONST and r.values[b].attr["value"] != 0:
            scale, c, j = x.op.value, float(r.values[b].attr["value"]), unshaped(a)
            x = r.values[j]
    if x.op is not Op.SUM_AXIS or r.values[x.inputs[0]].op is not Op.MUL:
        return None
    prod = r.values[x.inputs[0]]
    if x.attr["axis"] != len(prod.type.feat) - 1:
        return None
    ends = {r.values[k].attr["side"]: r.values[k] for k in prod.inputs
            if r.values[k].op is Op.ARG}
    if set(ends) != {"src", "dst"} or not (ends["src"].type == ends["dst"].type == prod.type):
        return None
    return ends["src"].attr["index"], ends["dst"].attr["index"], scale, c


def typed_spmm_pattern(v: Value) -> tuple[int, int, int, int | None] | None:
    """(x, table, types, weight or None) operands when an aggregate sums
    ``typed_linear(x[src], table, types[e]) [* w[e]]`` (see passes.fuse_typed)."""
    if v.op is not Op.AGGREGATE or not reducer(v.attr["kind"]).linear:
        return None
    r = v.attr["body"]
    res, w = r.result, None
    if r.values[res].op is Op.MUL:
        a, b = r.values[res].inputs
        for p, q in ((a, b), (b, a)):
            if r.values[p].op is Op.TYPED_LINEAR and edge_scalar(r, q) is not None:
                res, w = p, edge_scalar(r, q)
                break
    t = r.values[res]
    if t.op is not Op.TYPED_LINEAR:
        return None
    x, table, types = (arg_index(r, j, s) for j, s in zip(t.inputs, ("src", "param", "edge")))
    if None in (x, table, types) or r.values[r.result].type.feat != t.type.feat:
        return None
    return x, table, types, w


ROW_WISE = (UNARY_ELEMENTWISE - {Op.DROPOUT}) | BINARY_ELEMENTWISE | {
    Op.CAST, Op.LINEAR, Op.MATMUL, Op.RESHAPE, Op.CONCAT, Op.SUM_AXIS, Op.SLICE, Op.EXPAND,
    Op.PERMUTE, Op.MAX_AXIS, Op.WHERE_POS, Op.PAD}
"""Ops whose every row of the result is a function of the same row of their node operands
(and of params): computing them on the first rows gives the first rows of the result.
Dropout draws its mask for the whole tensor, so it is not one."""


def dst_rows_of_src(fn: Function, earlier: bool = True) -> dict[int, int]:
    """dst value -> the earlier src value whose first ``num_dst`` rows it is (``earlier``
    False: a src value anywhere in ``fn``, ``passes.twins_first`` moves it before).

    A destination node is the source node of the same index (``sarc.graph``), so a dst
    input is the source input's first rows, and a row-wise function (``ROW_WISE``) of
    the dst inputs is the same function of the src inputs, cut to the dst rows: GAT's
    ``lin(dst.h)`` is ``lin(src.h)[:num_dst]``, computed once instead of twice."""
    keys: dict[int, tuple] = {}
    src_value: dict[tuple, int] = {}
    dst_keyed: list[int] = []
    for i, v in enumerate(fn.values):
        key = _row_key(v, keys)
        if key is None:
            continue
        keys[i] = key
        if v.type.domain is Domain.SRC:
            src_value.setdefault(key, i)
        elif v.type.domain is Domain.DST and v.op is not Op.INPUT:
            dst_keyed.append(i)
    return {i: src_value[keys[i]] for i in dst_keyed
            if keys[i] in src_value and (not earlier or src_value[keys[i]] < i)}


def _row_key(v: Value, keys: dict[int, tuple]) -> tuple | None:
    """What a node value computes row by row, the same for its src and dst versions
    (None: not row-wise, or not a node value)."""
    if v.type.domain is Domain.PARAM:   # a parameter, or computed of them (a linear's bias
        # cast by autocast): the same value on both sides
        if any(j not in keys for j in v.inputs):
            return None
        return (v.op, v.attrs, tuple(keys[j] for j in v.inputs), v.type)
    if v.type.domain not in (Domain.SRC, Domain.DST):
        return None
    if v.op is Op.INPUT:
        return (v.op, v.attrs, v.type.with_(domain=Domain.SRC))
    if v.op not in ROW_WISE or any(j not in keys for j in v.inputs):
        return None
    return (v.op, v.attrs, tuple(keys[j] for j in v.inputs), v.type.feat, v.type.dtype)


def accumulating_adds(fn: Function, ops: tuple[Op, ...] = (Op.LINEAR, Op.MUL)
                      ) -> dict[int, tuple[int, int]]:
    """add value -> (its other operand, the value it adds) when ``other + linear(x, W)``
    can be one GEMM accumulating into ``other`` (``torch.addmm``, beta = 1), or
    ``other + a * b`` one ``torch.addcmul``: either saves the add's pass over the result.

    The added value (an op of ``ops``) has no reader but the add (a function output is
    a reader), so its result need never exist on its own; it has the add's type, so only
    ``other`` broadcasts; a linear's x is a matrix at run time: a node or edge value
    with one feature axis (a param, or rows of several feature axes such as heads, stay
    a matmul and an add). Where both operands qualify, a linear is fused before a
    product, else the second operand."""
    users, outputs = fn.users(), {j for _, j in fn.outputs}

    def accumulated(j: int, add: Value, op: Op) -> bool:
        v = fn.values[j]
        if v.op is not op or len(users[j]) != 1 or j in outputs or v.type != add.type:
            return False
        x = fn.values[v.inputs[0]].type
        return op is not Op.LINEAR or (x.domain is not Domain.PARAM and len(x.feat) == 1)

    fused: dict[int, tuple[int, int]] = {}
    for i, v in enumerate(fn.values):
        if v.op is Op.ADD:
            a, b = v.inputs
            found = next(((other, added) for op in ops for other, added in ((a, b), (b, a))
                          if accumulated(added, v, op)), None)
            if found is not None:
                fused[i] = found
    return fused


@dataclass(frozen=True)
class ScaledProduct:
    """A sparse product (``spmm_pattern``) with its operand's and its result's scaling by a
    number per node folded in: ``dst_scale * aggregate(x[src] * src_scale [* w[e]])``."""
    aggregate: int
    kind: str
    x: int
    weight: int | None
    src_scale: int | None
    dst_scale: int | None

    def reads(self) -> list[int]:
        return [j for j in (self.x, self.weight, self.src_scale, self.dst_scale) if j is not None]


def scaled_products(fn: Function) -> dict[int, ScaledProduct]:
    """value -> the scaled product it is, for the sparse products of source rows whose
    operand is ``x * s`` or whose result is multiplied by ``s``, s a number per source /
    destination node (GCN's ``h W / sqrt(deg_out(u))`` summed, times ``1 / sqrt(deg_in(v))``).
    The value is the result's product where it is folded in, else the aggregate.

    The product scales x's rows as it reads them and its result's as it writes them, and its
    backward the other way round: neither node-sized product is written, in either pass.
    Folded only where a reducer is linear (a scale commutes with it) and the product or
    scaled value has no other reader (nor is an output)."""
    users, outputs = fn.users(), {j for _, j in fn.outputs}

    def scale_of(m: int, domain: Domain) -> tuple[int, int] | None:
        """(the scaled value, the scale) when ``m`` multiplies a value by a number per node
        of ``domain``."""
        v = fn.values[m]
        if v.op is not Op.MUL:
            return None
        for a, s in (v.inputs, v.inputs[::-1]):
            t = fn.values[s].type
            if (fn.values[a].type == v.type and t.domain is domain and t.dtype == v.type.dtype
                    and all(d == 1 for d in t.feat) and a != s):
                return a, s
        return None

    found: dict[int, ScaledProduct] = {}
    for i, v in enumerate(fn.values):
        pattern = spmm_pattern(v)
        if pattern is None or pattern[2] != "src":
            continue
        x, w = v.inputs[pattern[0]], (None if pattern[1] is None else v.inputs[pattern[1]])
        src = scale_of(x, Domain.SRC) if users[x] == [i] and x not in outputs else None
        dst = None
        if len(users[i]) == 1 and i not in outputs:
            dst = scale_of(users[i][0], Domain.DST)
            dst = dst if dst is not None and dst[0] == i else None
        if src is None and dst is None:
            continue
        at = users[i][0] if dst is not None else i
        found[at] = ScaledProduct(i, v.attr["kind"], src[0] if src else x, w,
                                  src[1] if src else None, dst[1] if dst else None)
    return found


def contractions(fn: Function) -> dict[int, tuple[int, int]]:
    """sum value -> the two factors of the product it sums, for ``sum_axis(a * b)`` whose
    product has no other reader (nor is an output): one contraction that never writes
    the product (GAT's attention logits ``(z * att).sum(-1)``, node-sized z, a vector
    per head), nor, in backward, the product of the gradient with z."""
    users, outputs = fn.users(), {j for _, j in fn.outputs}
    found: dict[int, tuple[int, int]] = {}
    for i, v in enumerate(fn.values):
        if v.op is not Op.SUM_AXIS:
            continue
        m = v.inputs[0]
        if fn.values[m].op is Op.MUL and users[m] == [i] and m not in outputs:
            a, b = fn.values[m].inputs
            found[i] = (a, b)
    return found


FRESH = frozenset({Op.AGGREGATE, Op.SOFTMAX_AGGREGATE, Op.LINEAR, Op.MATMUL, Op.ADD, Op.SUB})
"""Ops whose result is a new tensor of their own in every backend (never an operand's
memory): what an add may write over."""


def inplace_adds(fn: Function) -> dict[int, tuple[int, tuple[int, ...]]]:
    """add value -> (the operand, 0 or 1, it may be written over; the values whose memory
    that is: the operand and those it is a reshape of) for an operand of the add's type
    (the other broadcasts to it), read by nothing else, nor an output, computed by an op
    of ``FRESH`` or a reshape of such a value that nothing else reads (GAT's
    ``agg.flatten(1) + bias``): the add then needs no memory of its own. Whether
    autograd still needs the operand's values is for the backend to see at run time."""
    users, outputs = fn.users(), {j for _, j in fn.outputs}

    def written_over(j: int, add: int) -> tuple[int, ...] | None:
        if fn.values[j].type != fn.values[add].type:
            return None
        chain: list[int] = []
        while True:
            if users[j] != [add] or j in outputs:
                return None
            chain.append(j)
            v = fn.values[j]
            if v.op is not Op.RESHAPE:
                return tuple(chain) if v.op in FRESH else None
            add, j = j, v.inputs[0]

    found: dict[int, tuple[int, tuple[int, ...]]] = {}
    for i, v in enumerate(fn.values):
        if v.op is Op.ADD:
            for k, j in enumerate(v.inputs):
                chain = written_over(j, i)
                if chain is not None:
                    found[i] = (k, chain)
                    break
    return found
