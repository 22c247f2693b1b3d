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


def pushdown(fn: Function) -> Function:
    rw = Rewriter(fn)
    gathered: dict[int, tuple[Op, int]] = {}  # old edge value -> (gather op, new node value)
    for i, v in enumerate(fn.values):
        if v.op in GATHERS:
            rw.copy(i)
            gathered[i] = (v.op, rw.map[v.inputs[0]])
            continue
        if v.op in HOISTABLE and v.type.domain is Domain.EDGE:
            graph_ops = [j for j in v.inputs if fn.values[j].type.domain is not Domain.PARAM]
            sides = {gathered[j][0] for j in graph_ops if j in gathered}
            if graph_ops and all(j in gathered for j in graph_ops) and len(sides) == 1:
                (gop,) = sides
                inputs = [gathered[j][1] if j in gathered else rw.map[j] for j in v.inputs]
                node = rw.emit(v.op, inputs, v.attr, v)
                rw.map[i] = rw.emit(gop, [node], None, v)
                gathered[i] = (gop, node)
                continue
        rw.copy(i)
    return rw.finish()
