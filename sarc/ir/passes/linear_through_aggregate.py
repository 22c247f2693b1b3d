"""Apply a narrowing linear map before a linear aggregation instead of after it.

    linear(sum_or_mean(e), W)      -> sum_or_mean(linear(e, W))
    linear(a + sum_or_mean(e), W)  -> linear(a, W) + sum_or_mean(linear(e, W))
    linear(a_src + b_dst, W)       -> linear(a_src, W) + linear(b_dst, W)

Sum and mean are linear, so both orders compute the same function; when W
maps to fewer features than it reads (``out < in``), the aggregation (and,
after ``pushdown``, what crosses shards) runs on the narrow side: GraphSAGE's
``W_neigh mean(h)`` and GIN's ``MLP(h + sum h)`` aggregate ``W h``. The rewrite
applies only to values no one else reads, only when it narrows, and only through sums
whose terms have the sum's features (a broadcast term, ``agg + deg.unsqueeze(-1)``, is
not W's input: ``W(a + b)`` is no ``Wa + Wb`` there).

A sum of both ends' values is such a sum too: EdgeConv's ``W (h_u - h_v)`` is
``(W h)_u - (W h)_v``, each end's product per node (``pushdown``), and the edges carry W's
narrow output instead of h. Of both ends, a linear that keeps the width moves too: it runs
on N rows instead of E, and what crosses shards is as wide; one that widens stays (the
exchange would carry its wider output).

W also commutes with a scale per row, broadcast over the features it reads
(``W (w_e h_u) = w_e (W h_u)``, and ``/``): GraphConv's edge weights,
``sum_e w_e h_u``, aggregate ``w_e (W h)_u``. The linear moves only where it then
reaches the nodes (``pushdown`` computes it per node and gathers it): on an edge
value of both ends (``h_u * h_v``) it would be a product per edge, E rows instead
of N. Under autocast a linear's output is in the low dtype, and a float32 scale after
it promotes the product: a linear moved ahead of a scale is followed by a cast by
autocast (``cast(x, autocast=True)``, nothing without autocast), so the result has the
dtype the linear of the sum has.
"""
from __future__ import annotations

from ..function import Function
from ..ops import Op
from ..reducers import reducer
from ..types import Domain, TensorType
from .pushdown import gathered_sides
from .rewrite import Rewriter


def _row_scale(scale: TensorType, of: TensorType) -> bool:
    """``scale`` is a number per row, broadcast over every feature of ``of``'s last axis."""
    return scale.feat == () or (len(scale.feat) <= len(of.feat) and scale.feat[-1] == 1)


def linear_through_aggregate(fn: Function) -> Function:
    users = fn.users()
    outputs = {i for _, i in fn.outputs}
    to_nodes = gathered_sides(fn)   # edge values pushdown computes per node and gathers

    def single(j: int) -> bool:
        return len(users[j]) == 1 and j not in outputs

    def scaled(j: int) -> tuple[int, list[tuple[Op, int]]]:
        """Value j as value k scaled per row: (k, [(MUL or DIV, scale)], innermost first)."""
        chain: list[tuple[Op, int]] = []
        while single(j) and fn.values[j].op in (Op.MUL, Op.DIV):
            v = fn.values[j]
            a, b = v.inputs
            pairs = [(a, b)] if v.op is Op.DIV else [(a, b), (b, a)]
            hit = next(((x, s) for x, s in pairs if fn.values[x].type.feat == v.type.feat
                        and _row_scale(fn.values[s].type, v.type)), None)
            if hit is None:
                break
            chain.append((v.op, hit[1]))
            j = hit[0]
        return j, chain[::-1]

    def movable(j: int) -> bool:
        """Value j is (a sum of terms with) a linear aggregate, or an edge value of both
        ends, we may rewrite."""
        v = fn.values[j]
        if not single(j):
            return False
        if v.op is Op.REDUCE:
            return reducer(v.attr["kind"]).linear and scaled(v.inputs[0])[0] in to_nodes
        if v.op in (Op.ADD, Op.SUB):  # W(a + b) = Wa + Wb for terms of the sum's shape
            return all(fn.values[k].type.domain is not Domain.PARAM
                       and fn.values[k].type.feat == v.type.feat for k in v.inputs) and \
                any(movable(k) or (j not in to_nodes and k in to_nodes) for k in v.inputs)
        return False

    rw = Rewriter(fn)
    skip: set[int] = set()
    scales: list[int] = []   # the scales the linear being moved now precedes

    def apply(j: int, w: int, like) -> int:
        """New value: linear(old value j, new weight w), pushed through aggregates."""
        v = fn.values[j]
        if movable(j) and v.op is Op.REDUCE:
            k, chain = scaled(v.inputs[0])
            inner = rw.emit(Op.LINEAR, [rw.map[k], w], None, like)
            scales.extend(s for _, s in chain)
            for op, s in chain:
                inner = rw.emit(op, [inner, rw.map[s]], None, fn.values[s])
            return rw.emit(Op.REDUCE, [inner], v.attr, v)
        if movable(j) and v.op in (Op.ADD, Op.SUB):
            a, b = (apply(k, w, like) for k in v.inputs)
            return rw.emit(v.op, [a, b], None, v)
        return rw.emit(Op.LINEAR, [rw.map[j], w], None, like)

    def of_nodes(j: int) -> bool:
        """Edge value j is a sum of node values gathered (each a product per node, moved)."""
        v = fn.values[j]
        return j in to_nodes or (v.op in (Op.ADD, Op.SUB) and movable(j)
                                 and all(of_nodes(k) for k in v.inputs))

    def worth(v) -> bool:
        """Linear ``v`` narrows (``out < in``), or keeps the width of an edge value of both
        ends: moved, it runs on the nodes' rows instead of the edges'."""
        x = fn.values[v.inputs[0]].type
        return v.type.feat[-1] < x.feat[-1] or (v.type.feat[-1] == x.feat[-1]
                                                and x.domain is Domain.EDGE
                                                and of_nodes(v.inputs[0]))

    # values only a rewritten linear reads are not copied
    for i, v in enumerate(fn.values):
        if v.op is Op.LINEAR and worth(v) and movable(v.inputs[0]):
            stack = [v.inputs[0]]
            while stack:
                j = stack.pop()
                if movable(j):
                    skip.add(j)
                    if fn.values[j].op in (Op.ADD, Op.SUB):
                        stack.extend(fn.values[j].inputs)
    for i, v in enumerate(fn.values):
        if i in skip:
            continue
        if v.op is Op.LINEAR and v.inputs[0] in skip:
            scales.clear()
            rw.map[i] = apply(v.inputs[0], rw.map[v.inputs[1]], v)
            if scales:   # the linear's dtype under autocast, which a scale may promote
                rw.map[i] = rw.emit(Op.CAST, [rw.map[i]], {"dtype": v.type.dtype,
                                                          "autocast": True}, v)
            continue
        rw.copy(i)
    return rw.finish()
