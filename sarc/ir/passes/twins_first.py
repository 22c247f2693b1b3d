"""Order src values before their dst twins, so that a kernel computes each once.

A dst value computed as a src value is, row by row, is that value's first rows
(``patterns.dst_rows_of_src``): the backends and the distributed split read it so,
where the src value comes first. Code may compute the dst one first (EdgeConv's
``theta(dst.h - src.h)``, taken through the aggregate, gives ``theta(dst.h)`` before
``theta(src.h)``; a message ``q(dst.h) * q(src.h)``): this pass moves the src value,
with what it is computed of (inputs, params and row-wise ops of them, nothing computed
after the dst value needs), to just before its dst twin. Nothing else moves.
"""
from __future__ import annotations

from ..function import Function, upstream
from ..patterns import dst_rows_of_src
from .rewrite import Rewriter


def twins_first(fn: Function) -> Function:
    later = {i: j for i, j in dst_rows_of_src(fn, earlier=False).items() if j > i}
    if not later:
        return fn
    rw = Rewriter(fn)
    for i in range(len(fn.values)):
        if i in rw.map:
            continue
        if i in later:
            for j in sorted(upstream(fn.values, [later[i]])):
                if j not in rw.map:
                    rw.copy(j)
        rw.copy(i)
    return rw.finish()
