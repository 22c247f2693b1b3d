"""Push node-local work ahead of gathers: ``f(gather(a), gather(b), W) -> gather(f(a, b, W))``.

A message computed from one side of the edge only (``lin(src.h)``,
``src.h * att``) is the same for every edge leaving that node: compute it once
per node (N rows) and gather the result, instead of once per edge (E rows).
Values of both sides (``el[u] + er[v]``) stay per edge. Dropout never moves:
a per-node mask is not a per-edge mask.
"""
from __future__ import annotations

from ..function import Function
from ..ops import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, Op
from ..types import Domain
from .rewrite import Rewriter

HOISTABLE = (UNARY_ELEMENTWISE - {Op.DROPOUT}) | BINARY_ELEMENTWISE | {
    Op.CAST, Op.LINEAR, Op.MATMUL, Op.RESHAPE, Op.SUM_AXIS, Op.CONCAT, Op.SLICE, Op.INDEX,
    Op.TYPED_LINEAR, Op.PERMUTE, Op.MAX_AXIS, Op.WHERE_POS}
GATHERS = (Op.GATHER_SRC, Op.GATHER_DST)


def gathered_sides(fn: Function) -> dict[int, Op]:
    """Each edge value that is (or ``pushdown`` makes) a gather of node work from one end:
    value -> that gather op. An op that may be singular at a node no edge reads
    (``singular``) stays per edge, and so does what it feeds."""
    sides: dict[int, Op] = {}
    positive = positive_values(fn)
    for i, v in enumerate(fn.values):
        if v.op in GATHERS:
            sides[i] = v.op
        elif (v.op in HOISTABLE and v.type.domain is Domain.EDGE
              and not singular(v, positive)):
            graph_ops = [j for j in v.inputs if fn.values[j].type.domain is not Domain.PARAM]
            ends = {sides.get(j) for j in graph_ops}
            if graph_ops and len(ends) == 1 and None not in ends:
                sides[i] = ends.pop()
    return sides


# A per-node copy of an edge op is computed at every node, also at the nodes no edge
# reads (a source without out-edges, whose out-degree is 0). Their rows are never
# gathered, so their gradient is 0, but an op whose derivative is infinite there (1 / 0,
# 0 ** -0.5, sqrt at 0, log at 0) turns that 0 into NaN, and through a linear before it,
# the weight's whole gradient. torch, computing the op per edge, never meets those
# rows. Such an op moves only where its operand is positive at every node (a degree
# clamped to 1, 1 + exp(x)).

_KEEPS_SIGN = frozenset({Op.CAST, Op.RESHAPE, Op.SLICE, Op.INDEX, Op.PERMUTE, Op.EXPAND,
                         Op.GATHER_SRC, Op.GATHER_DST, Op.EXP, Op.SIGMOID})
"""Ops whose result is positive where their (first) operand is (EXP and SIGMOID always)."""


def positive_values(fn: Function) -> set[int]:
    """Values > 0 at every row for any inputs: positive constants, ``clamp_min`` by a
    positive bound, ``exp``, ``sigmoid``, and sums, products, quotients, powers and
    reshapes of positive values."""
    pos: set[int] = set()
    for i, v in enumerate(fn.values):
        ins = list(v.inputs)
        if (v.op is Op.CONST and isinstance(v.attr.get("value"), (int, float))
                and v.attr["value"] > 0
                or v.op is Op.CLAMP_MIN and v.attr["min"] > 0
                or v.op in (Op.EXP, Op.SIGMOID)
                or v.op in _KEEPS_SIGN and ins and ins[0] in pos
                or v.op in (Op.ADD, Op.MUL, Op.DIV) and all(j in pos for j in ins)
                or v.op is Op.POW and ins[0] in pos):
            pos.add(i)
    return pos


def singular(v, positive: set[int]) -> bool:
    """Whether edge op ``v`` may have an infinite derivative, or an undefined value, at a
    finite operand: a division by a value not known positive, a log of one, a negative
    or fractional power of one."""
    if v.op is Op.DIV:
        return v.inputs[1] not in positive
    if v.op in (Op.LOG, Op.LOG1P):
        return v.inputs[0] not in positive
    if v.op is Op.POW:
        e = v.attr["exponent"]
        return not (e >= 0 and float(e).is_integer()) and v.inputs[0] not in positive
    return False


def pushdown(fn: Function) -> Function:
    sides = gathered_sides(fn)
    rw = Rewriter(fn)
    node: dict[int, int] = {}  # old gathered edge value -> the new node value gathered
    for i, v in enumerate(fn.values):
        if v.op in GATHERS:
            rw.copy(i)
            node[i] = rw.map[v.inputs[0]]
        elif i in sides:
            node[i] = rw.emit(v.op, [node.get(j, rw.map[j]) for j in v.inputs], v.attr, v)
            rw.map[i] = rw.emit(sides[i], [node[i]], None, v)
        else:
            rw.copy(i)
    return rw.finish()
