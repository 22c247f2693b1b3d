"""Dead-code elimination: drop values no output depends on."""
from __future__ import annotations

from ..function import Function
from .rewrite import Rewriter


def live_set(fn: Function) -> set[int]:
    live: set[int] = set()
    stack = [i for _, i in fn.outputs]
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(fn.values[i].inputs)
    return live


def dce(fn: Function) -> Function:
    live = live_set(fn)
    rw = Rewriter(fn)
    for i in range(len(fn.values)):
        if i in live:
            rw.copy(i)
    return rw.finish()
