"""Dead-code elimination: drop values no output depends on."""
from __future__ import annotations

from ..function import Function, upstream
from .rewrite import Rewriter


def live_set(fn: Function) -> set[int]:
    return set(upstream(fn.values, [i for _, i in fn.outputs]))


def dce(fn: Function) -> Function:
    live = live_set(fn)
    rw = Rewriter(fn)
    for i in range(len(fn.values)):
        if i in live:
            rw.copy(i)
    return rw.finish()
