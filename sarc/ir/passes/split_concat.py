"""Score splitting: a linear map of a concatenation becomes a sum of linear maps.

    linear(concat(x_1, ..., x_k), W) -> sum_i linear(x_i, W[:, cols_i])
    matmul(concat(x_1, ..., x_k), B) -> sum_i matmul(x_i, B[rows_i, :])

Applied to ``W [h_u || h_v]`` this yields ``W_l h_u + W_r h_v``, two terms that
``pushdown`` then computes per node instead of per edge (GAT's score,
edge-conditioned MLPs). Only concatenations along the last axis of values of
one domain are split.
"""
from __future__ import annotations

from ..function import Function
from ..ops import Op
from .rewrite import Rewriter


def split_concat(fn: Function) -> Function:
    rw = Rewriter(fn)
    for i, v in enumerate(fn.values):
        if v.op in (Op.LINEAR, Op.MATMUL):
            x = fn.values[v.inputs[0]]
            if x.op is Op.CONCAT and x.attr["axis"] == len(x.type.feat) - 1 and len(x.inputs) > 1:
                w = rw.map[v.inputs[1]]
                w_axis = 1 if v.op is Op.LINEAR else 0
                start, acc = 0, None
                for j in x.inputs:
                    width = fn.values[j].type.feat[-1]
                    part = rw.emit(Op.SLICE, [w], {"axis": w_axis, "start": start,
                                                   "stop": start + width}, v)
                    term = rw.emit(v.op, [rw.map[j], part], None, v)
                    acc = term if acc is None else rw.emit(Op.ADD, [acc, term], None, v)
                    start += width
                rw.map[i] = acc
                continue
        rw.copy(i)
    return rw.finish()
