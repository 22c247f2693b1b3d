"""Fusion: gather + edge math + reduce become one fused graph op.

- ``reduce(kind, expr(gather_src(a), gather_dst(b), edge c, W))`` ->
  ``aggregate(a, b, c, W, kind, body=expr)``: generalized SpMM;
- ``reduce(sum, edge_softmax(s) * v)`` -> ``softmax_aggregate(score=s, value=v)``:
  attention in one pass with online normalization;
- an edge expression used by anything else (edge_softmax, dropout, a typed
  linear) -> ``sddmm(body=expr)``: generalized SDDMM.

The body is a ``Region`` whose ARG leaves read operands per edge; backends
evaluate it edge block by edge block, so the E x D edge tensors of the unfused
program exist only transiently (and are recomputed in the backward pass rather
than stored). An edge value is absorbed into a region only when that region is
its single user; values with other users become operands. A factor of the message
computed from edge features alone and narrower than it (a weight per edge and head)
stays out: one small edge tensor, and the aggregate a weighted sparse product.
"""
from __future__ import annotations

import math

from ..function import Builder, Function, Region, upstream
from ..ops import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, Op
from ..reducers import SUM, reducer
from ..types import Domain
from .rewrite import Rewriter

FUSIBLE = (UNARY_ELEMENTWISE - {Op.DROPOUT}) | BINARY_ELEMENTWISE | {
    Op.CAST, Op.RESHAPE, Op.SUM_AXIS, Op.CONCAT, Op.SLICE, Op.INDEX}


def fusible(v) -> bool:
    """Whether edge value ``v`` may be computed inside a region: not a cast by autocast,
    which a region's kernel cannot see (the bias of a linear, where given per edge)."""
    return v.op in FUSIBLE and not (v.op is Op.CAST and v.attr.get("autocast"))


class _Regions:
    """Collects regions over one shared operand list (old value, side) -> ARG index."""

    def __init__(self, fn: Function, users: list[list[int]], outputs: set[int]):
        self.fn, self.users, self.outputs = fn, users, outputs
        self.operands: list[tuple[int, str]] = []
        self.absorbed: set[int] = set()

    def _operand(self, j: int, side: str) -> int:
        key = (j, side)
        if key not in self.operands:
            self.operands.append(key)
        return self.operands.index(key)

    def _single_use(self, j: int) -> bool:
        return len(self.users[j]) == 1 and j not in self.outputs

    def build(self, root: int, name: str, inline_root: bool,
              feat: tuple[int, ...] | None = None, apart: frozenset = frozenset()) -> Region:
        """The region computing old value ``root``; single-use subterms are absorbed.

        With ``inline_root`` False a root that has other users is read as an
        operand instead of recomputed. ``feat``: the result reshaped to these features.
        ``apart``: values read as operands, computed outside the region.
        """
        b = Builder(name)
        memo: dict[int, int] = {}

        def visit(j: int, is_root: bool) -> int:
            if j in memo:
                return memo[j]
            v = self.fn.values[j]
            inline = self._single_use(j) or (is_root and inline_root)
            if v.op is Op.CONST:
                out = b.const(v.attr["value"], v.type, v.loc)
            elif v.op in (Op.GATHER_SRC, Op.GATHER_DST):
                side = "src" if v.op is Op.GATHER_SRC else "dst"
                k = self._operand(v.inputs[0], side)
                out = b.add(Op.ARG, (), {"index": k, "side": side}, v.loc, v.type)
                if self._single_use(j):
                    self.absorbed.add(j)
            elif fusible(v) and v.type.domain is Domain.EDGE and inline and j not in apart:
                out = b.add(v.op, [visit(i, False) for i in v.inputs], v.attr, v.loc)
                self.absorbed.add(j)
            else:
                side = "param" if v.type.domain is Domain.PARAM else "edge"
                k = self._operand(j, side)
                out = b.add(Op.ARG, (), {"index": k, "side": side}, v.loc, v.type)
            memo[j] = out
            return out

        out = visit(root, True)
        if feat is not None and feat != self.fn.values[root].type.feat:
            out = b.add(Op.RESHAPE, [out], {"feat": feat}, self.fn.values[root].loc)
        return b.finish_region(out)


def _softmax_parts(fn: Function, users, e: int):
    """If edge value ``e`` is ``[reshape(]edge_softmax(s)[)] * v`` and the weights meet v's
    features as a prefix of them: (s, v, absorbed values, the score's features there).

    The weights are ``s``'s features, trailing size-1 axes appended by the reshapes, so
    softmax_aggregate's score is ``s`` reshaped to the weights' features up to their
    trailing ones (softmax is per element: it commutes with the reshape): ``[H, 1]``
    against ``[H, C]`` is the score ``[H]``. Where the weights broadcast along a leading
    axis of v (``[1, C]`` against ``[H, C]``) they are no prefix: the product stays
    unfused."""
    v = fn.values[e]
    if v.op is not Op.MUL:
        return None
    for a, other in (v.inputs, tuple(reversed(v.inputs))):
        chain, j = [], a
        while fn.values[j].op is Op.RESHAPE and len(users[j]) == 1:
            t_in, t_out = fn.values[fn.values[j].inputs[0]].type, fn.values[j].type
            n = len(t_in.feat)
            if t_out.feat[:n] != t_in.feat or any(d != 1 for d in t_out.feat[n:]):
                break
            chain.append(j)
            j = fn.values[j].inputs[0]
        sm = fn.values[j]
        feat, weights = fn.values[other].type.feat, fn.values[a].type.feat
        if (sm.op is not Op.EDGE_SOFTMAX or len(users[j]) != 1 or feat != v.type.feat
                or len(weights) != len(feat)):  # fewer: broadcast from the right
            continue
        n = len(weights)
        while n and weights[n - 1] == 1:
            n -= 1
        if weights[:n] == feat[:n]:
            return sm.inputs[0], other, [*chain, j], weights[:n]
    return None


def _edge_weights(fn: Function, e: int) -> frozenset:
    """The factors of edge product ``e`` computed from edge features and parameters alone
    (no gather) and narrower than ``e``: GMMConv's Gaussian weight per kernel,
    ``exp(-(u - mu)^2 / sigma^2 / 2)`` of ``[E, K, 1]`` against messages ``[E, K, D]``. Left
    out of the region, each is an edge tensor computed once (E x K), and the aggregate a
    product weighted per edge and head (``patterns.spmm_pattern``)."""
    v = fn.values[e]
    if v.op is not Op.MUL:
        return frozenset()

    def gathered(j: int) -> bool:
        return any(fn.values[k].op in (Op.GATHER_SRC, Op.GATHER_DST)
                   for k in upstream(fn.values, [j]))

    def computed(j: int) -> bool:   # more than a view of one edge feature
        u = fn.values[j]
        return u.op is not Op.INPUT and (u.op is not Op.RESHAPE or computed(u.inputs[0]))

    return frozenset(j for j in v.inputs if fn.values[j].type.domain is Domain.EDGE
                     and not gathered(j) and computed(j)
                     and math.prod(fn.values[j].type.feat) < math.prod(v.type.feat))


def fuse(fn: Function) -> Function:
    users = fn.users()
    outputs = {i for _, i in fn.outputs}
    plans: dict[int, tuple[Op, dict, list[tuple[int, str]]]] = {}
    absorbed: set[int] = set()
    for i in reversed(range(len(fn.values))):
        v = fn.values[i]
        if v.op is not Op.REDUCE or i in absorbed:
            continue
        e = v.inputs[0]
        regions = _Regions(fn, users, outputs)
        single = regions._single_use(e)
        parts = _softmax_parts(fn, users, e) if single and reducer(v.attr["kind"]) is SUM else None
        if parts is not None:
            s, val, chain, score_feat = parts
            attrs = {"score": regions.build(s, "score", regions._single_use(s), score_feat),
                     "value": regions.build(val, "value", regions._single_use(val))}
            regions.absorbed.update([e, *chain])
            plans[i] = (Op.SOFTMAX_AGGREGATE, attrs, regions.operands)
        else:
            body = regions.build(e, "body", single, apart=_edge_weights(fn, e) if single
                                 else frozenset())
            attrs = {"kind": v.attr["kind"], "body": body}
            plans[i] = (Op.AGGREGATE, attrs, regions.operands)
        absorbed |= regions.absorbed
    # What is left: edge expressions of node values used by non-fusible ops -> SDDMM.
    for i in reversed(range(len(fn.values))):
        v = fn.values[i]
        if i in absorbed or v.type.domain is not Domain.EDGE or v.op not in FUSIBLE:
            continue
        regions = _Regions(fn, users, outputs)
        body = regions.build(i, "body", True)
        if not any(r.op is Op.ARG and r.attr["side"] in ("src", "dst") for r in body.values):
            continue
        plans[i] = (Op.SDDMM, {"body": body}, regions.operands)
        absorbed |= regions.absorbed - {i}
    rw = Rewriter(fn)
    for i, v in enumerate(fn.values):
        if i in plans:
            op, attrs, operands = plans[i]
            rw.map[i] = rw.emit(op, [rw.map[j] for j, _ in operands], attrs, v)
        elif i not in absorbed:
            rw.copy(i)
    return rw.finish()
