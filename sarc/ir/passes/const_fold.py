"""Constant folding and algebraic identities.

Ops whose operands are all scalar constants become constants; ``x * 1``,
``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` and ``x ** 1`` become
``x`` when that does not change ``x``'s type (no broadcasting happens), and so
does dropout with rate 0.
"""
from __future__ import annotations

import math

from ..function import Function, Value
from ..ops import Op
from .rewrite import Rewriter

_FOLD = {
    Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b,
    Op.MUL: lambda a, b: a * b, Op.DIV: lambda a, b: a / b,
    Op.NEG: lambda a: -a, Op.EXP: math.exp,
}


def _const_value(rw: Rewriter, j: int):
    v = rw.b.values[rw.map[j]]
    return v.attr["value"] if v.op is Op.CONST else None


def const_fold(fn: Function) -> Function:
    rw = Rewriter(fn)
    for i, v in enumerate(fn.values):
        consts = [_const_value(rw, j) for j in v.inputs]
        if v.op in _FOLD and v.inputs and all(c is not None for c in consts):
            try:
                value = _FOLD[v.op](*consts)
            except (OverflowError, ValueError, ZeroDivisionError):
                value = None
            if value is not None:
                rw.map[i] = rw.b.const(value, v.type, v.loc)
                continue
        same = _identity(v, consts, rw)
        if same is not None:
            rw.map[i] = same
            continue
        rw.copy(i)
    return rw.finish()


def _identity(v: Value, consts, rw: Rewriter) -> int | None:
    """The (new) index of the operand ``v`` reduces to, or None."""
    if (v.op is Op.POW and v.attr["exponent"] == 1.0) or (v.op is Op.DROPOUT and v.attr["p"] == 0.0):
        return rw.map[v.inputs[0]]
    neutral = {Op.MUL: 1.0, Op.ADD: 0.0, Op.SUB: 0.0, Op.DIV: 1.0}.get(v.op)
    if neutral is None or len(v.inputs) != 2:
        return None
    a, b = v.inputs
    if consts[1] == neutral and rw.b.values[rw.map[a]].type == v.type:
        return rw.map[a]
    if v.op in (Op.MUL, Op.ADD) and consts[0] == neutral and rw.b.values[rw.map[b]].type == v.type:
        return rw.map[b]
    return None
