"""Common-subexpression elimination: one value per (op, operands, attributes).

Dropout is never merged: two dropouts of one value draw different masks.
"""
from __future__ import annotations

from ..function import Function
from ..ops import Op
from .rewrite import Rewriter


def cse(fn: Function) -> Function:
    rw = Rewriter(fn)
    seen: dict[tuple, int] = {}
    for i, v in enumerate(fn.values):
        key = (v.op, tuple(rw.map[j] for j in v.inputs), v.attrs,
               v.type if v.op is Op.INPUT else None)
        if v.op is not Op.DROPOUT and key in seen:
            rw.map[i] = seen[key]
            continue
        seen[key] = rw.copy(i)
    return rw.finish()
