"""Rebuilding a function value by value: the machinery passes share."""
from __future__ import annotations

from typing import Any, Mapping

from ..function import Builder, Function, Value
from ..ops import Op


class Rewriter:
    """Copies values into a new function, remapping operand indices.

    ``copy(i)`` re-emits value ``i`` of the old function (operands remapped) and
    records where it went; ``emit`` adds a new instruction. ``finish`` keeps the
    outputs pointing at their remapped values.
    """

    def __init__(self, fn: Function):
        self.old = fn
        self.b = Builder(fn.name, fn.role)
        self.map: dict[int, int] = {}

    def copy(self, i: int) -> int:
        v = self.old.values[i]
        new = self.emit(v.op, [self.map[j] for j in v.inputs], v.attr, v, keep_type=True)
        self.map[i] = new
        return new

    def emit(self, op: Op, inputs, attrs: Mapping[str, Any] | None, like: Value | None,
             keep_type: bool = False) -> int:
        loc = like.loc if like is not None else None
        t = like.type if (keep_type and like is not None and op in (Op.INPUT, Op.PARAM, Op.CONST)) else None
        return self.b.add(op, inputs, attrs, loc, t)

    def finish(self) -> Function:
        return self.b.finish((k, self.map[i]) for k, i in self.old.outputs)
