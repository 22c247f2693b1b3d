"""Fuse a per-type linear map of source rows into the aggregate that sums it (RGCN).

    t = typed_linear(gather_src(h), W, etype)          # E x out, one matmul row per edge
    aggregate(sum|mean, t[e] * w[e])
->  aggregate(sum|mean, typed_linear(h[src], W, etype[e]) * w[e])

The region then reads ``h`` at the source and the table ``W`` itself, so a
backend can compute ``h @ W[r]`` once per (node, type) pair instead of once
per edge and aggregate straight from that table (a sparse product whose
columns are ``src * R + etype``): no E x D tensor, and N x R instead of E
matrix rows when nodes times types are fewer than edges. Applied only where
the typed linear feeds nothing else.
"""
from __future__ import annotations

from ..function import Builder, Function, Region
from ..ops import Op
from ..reducers import reducer
from ..types import Domain
from .rewrite import Rewriter


def fuse_typed_linear(fn: Function) -> Function:
    users = fn.users()
    outputs = {i for _, i in fn.outputs}
    rw = Rewriter(fn)
    absorbed: set[int] = set()
    plans: dict[int, tuple[list[int], dict]] = {}
    for i, v in enumerate(fn.values):
        if v.op is not Op.AGGREGATE or not reducer(v.attr["kind"]).linear:
            continue
        body: Region = v.attr["body"]
        for k, j in enumerate(v.inputs):
            t = fn.values[j]
            if t.op is not Op.TYPED_LINEAR or users[j] != [i] or j in outputs:
                continue
            x, w, idx = t.inputs
            gx = fn.values[x]
            if gx.op is not Op.GATHER_SRC or fn.values[idx].type.domain is not Domain.EDGE:
                continue
            inputs = list(v.inputs)
            # operand k becomes the source rows h; W and the type ids are appended
            inputs[k] = gx.inputs[0]
            k_w, k_idx = len(inputs), len(inputs) + 1
            inputs += [w, idx]
            b = Builder("body")
            remap: dict[int, int] = {}
            for r, rv in enumerate(body.values):
                if rv.op is Op.ARG and rv.attr["index"] == k:
                    a_x = b.add(Op.ARG, (), {"index": k, "side": "src"}, rv.loc,
                                fn.values[gx.inputs[0]].type.with_(domain=Domain.EDGE))
                    a_w = b.add(Op.ARG, (), {"index": k_w, "side": "param"}, rv.loc, fn.values[w].type)
                    a_i = b.add(Op.ARG, (), {"index": k_idx, "side": "edge"}, rv.loc, fn.values[idx].type)
                    remap[r] = b.add(Op.TYPED_LINEAR, [a_x, a_w, a_i], None, t.loc)
                elif rv.op in (Op.ARG, Op.CONST):
                    remap[r] = b.add(rv.op, (), rv.attr, rv.loc, rv.type)
                else:
                    remap[r] = b.add(rv.op, [remap[q] for q in rv.inputs], rv.attr, rv.loc)
            plans[i] = (inputs, {"kind": v.attr["kind"], "body": b.finish_region(remap[body.result])})
            absorbed.add(j)
            if users[x] == [j]:
                absorbed.add(x)
            break
    for i, v in enumerate(fn.values):
        if i in absorbed:
            continue
        if i in plans:
            inputs, attrs = plans[i]
            rw.map[i] = rw.emit(Op.AGGREGATE, [rw.map[j] for j in inputs], attrs, v)
        else:
            rw.copy(i)
    return rw.finish()
