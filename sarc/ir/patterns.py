"""Analyses of fused ops (``sarc.ir.passes.fuse``) that the backends and the planner
share: how a fused op reads its operands, how wide its per-edge rows are, and whether an
aggregate is a (typed, weighted) sparse product, which kernels run as CSR SpMM and which
keep only their edge weights for the backward."""
from __future__ import annotations

from .function import Region, Value
from .ops import Op
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


def region_width(v: Value) -> int:
    """The widest per-edge row (elements) any of a fused op's regions computes."""
    width = 1
    for _, r in v.attrs:
        if isinstance(r, Region):
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
