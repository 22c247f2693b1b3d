"""Common-subexpression elimination: one value per (op, operands, attributes).

Dropout is never merged: two dropouts of one value draw different masks.
Leaves compare by type too: ``const 2.0`` in f32 and in f64 are different values,
as are a feature read as src and as dst.
"""
from __future__ import annotations

from ..function import Function
from ..ops import LEAVES, Op
from .rewrite import Rewriter


def cse(fn: Function) -> Function:
    rw = Rewriter(fn)
    seen: dict[tuple, int] = {}
    for i, v in enumerate(fn.values):
        key = (v.op, tuple(rw.map[j] for j in v.inputs), v.attrs,
               v.type if v.op in LEAVES else None)
        if v.op is not Op.DROPOUT and key in seen:
            rw.map[i] = seen[key]
            continue
        seen[key] = rw.copy(i)
    return rw.finish()
