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
    value -> that gather op."""
    sides: dict[int, Op] = {}
    for i, v in enumerate(fn.values):
        if v.op in GATHERS:
            sides[i] = v.op
        elif v.op in HOISTABLE and v.type.domain is Domain.EDGE:
            graph_ops = [j for j in v.inputs if fn.values[j].type.domain is not Domain.PARAM]
            ends = {sides.get(j) for j in graph_ops}
            if graph_ops and len(ends) == 1 and None not in ends:
                sides[i] = ends.pop()
    return sides


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
