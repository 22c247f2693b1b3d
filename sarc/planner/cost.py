"""The cost model: flops, bytes kept for backward, bytes exchanged, as sympy formulas.

Formulas are in the graph sizes of a layer's block (``N_src``, ``N_dst``, ``E``)
and, for distributed runs, ``B`` (remote rows a worker needs). They are
evaluated on real statistics by substitution.

Bytes kept for backward are what the PyTorch backend's kernel keeps when it runs
(``tests/planner/test_kept_bytes.py`` checks them against autograd's saved tensors):
each op keeps what its gradient rule reads (the ``SAVES`` table: operands, or the
output) for the operands that need a gradient, nothing when none does; views (a
reshape, a layer input's destination rows) keep their base once. Fused ops keep
what their lowering keeps: a sparse product its edge weights (a typed one also its
column index), attention its per-edge scores and weights (never E x heads x D),
any other fused op its node operands (its edge values are recomputed).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir.function import Function, Region, Value
from ..ir.ops import BINARY_ELEMENTWISE, FUSED, Op
from ..ir.reducers import reducer
from ..ir.types import E, N_DST, N_SRC, Domain, DType, TensorType

B = sympy.Symbol("B", integer=True, nonnegative=True)
"""Remote source rows one worker receives per exchange (each row once)."""

DTYPE_BYTES = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I64: 8}

OUT = "out"
# What each op's gradient rule reads: operand positions, or OUT for the result; a position
# is kept only when another operand (a unary op: the operand itself) needs a gradient.
SAVES: dict[Op, tuple] = {
    Op.LINEAR: (0, 1), Op.MATMUL: (0, 1), Op.TYPED_LINEAR: (0, 2),
    Op.MUL: (0, 1), Op.DIV: (0, 1),
    Op.EXP: (OUT,), Op.RELU: (OUT,), Op.SIGMOID: (OUT,), Op.TANH: (OUT,), Op.ELU: (OUT,),
    Op.LOG: (0,), Op.POW: (0,), Op.CLAMP_MIN: (0,), Op.LEAKY_RELU: (0,), Op.ERF: (0,),
    Op.SOFTPLUS: (0,),
    Op.COS: (0,), Op.SIN: (0,), Op.LOG1P: (0,),
    Op.MAX_AXIS: (0, OUT), Op.WHERE_POS: (0,),
    Op.EDGE_SOFTMAX: (OUT,), Op.DROPOUT: ("mask",),
}

SAVED_BY_REDUCER: dict[str, tuple] = {
    "sum": (), "mean": ("degree",),
    "max": (0, OUT), "min": (0, OUT),  # the edge values and the result, to find the ties
    "softmax": ("weights",),           # the softmax weights (score-sized)
}
"""What each reducer's backward keeps (``sarc.ir.reducers``): operand positions of a
``REDUCE`` or its result; ``degree``: the in-degree column a mean divides by; for
softmax, the weights of a softmax_aggregate (its scores are kept by the score's ops)."""


def nbytes(t: TensorType) -> sympy.Expr:
    return t.numel_expr() * DTYPE_BYTES[t.dtype]


class _Kept:
    """The tensors kept for backward, each once: key -> type. A key names a storage: a
    reshape keeps its input's, a layer input its name's (its src rows), a dst value the
    kernel takes as a src value's first rows (``patterns.dst_rows_of_src``) that value's."""

    def __init__(self, fn: Function, rows_of=None):
        from ..ir.patterns import dst_rows_of_src
        # dst values the kernel takes as src values' rows: any (a Graph's kernel), or the
        # exchanged ones ``rows_of`` (a distributed schedule's dst parts read them from x)
        twins = dst_rows_of_src(fn)
        self.twins = twins if rows_of is None else {i: j for i, j in twins.items()
                                                     if j in rows_of}
        self.inputs: dict[str, TensorType] = {}
        for v in fn.values:
            if v.op is Op.INPUT and (v.attr["name"] not in self.inputs
                                     or v.type.domain is Domain.SRC):
                self.inputs[v.attr["name"]] = v.type
        self.seen: dict[object, TensorType] = {}
        self.sized: dict[object, tuple[Domain, sympy.Expr]] = {}  # bytes not of one value's type

    def value(self, values, j: int, scope=()) -> None:
        while values[j].op is Op.RESHAPE or (not scope and j in self.twins):
            j = self.twins[j] if not scope and j in self.twins else values[j].inputs[0]
        v = values[j]
        if v.op is Op.INPUT:
            self.seen.setdefault(("input", v.attr["name"]), self.inputs[v.attr["name"]])
        elif v.type.domain is not Domain.PARAM:
            self.seen.setdefault((*scope, j), v.type)

    def other(self, key, t: TensorType) -> None:
        self.seen.setdefault(key, t)

    def bytes(self, key, domain: Domain, n: sympy.Expr) -> None:
        self.sized.setdefault(key, (domain, n))


def _float_needs(values, leaf) -> list[bool]:
    """Per value: a float computed from a leaf for which ``leaf(value)`` is true."""
    out: list[bool] = []
    for v in values:
        n = leaf(v) if v.op in (Op.INPUT, Op.PARAM, Op.ARG, Op.CONST) else any(out[j] for j in v.inputs)
        out.append(bool(n) and v.type.dtype.is_float)
    return out


def _keep_op(kept: _Kept, values, i: int, v: Value, need: list[bool], scope=()) -> None:
    """What op ``i`` (not fused) keeps, per its gradient rule."""
    if v.op is Op.REDUCE:
        x = v.inputs[0]
        if need[x]:
            for s in SAVED_BY_REDUCER[v.attr["kind"]]:
                if s == "degree":
                    kept.other(("degree", *scope, i), v.type.with_(feat=()))
                else:
                    kept.value(values, i if s == OUT else v.inputs[s], scope)
        return
    rule = SAVES.get(v.op, ())
    if not any(need[j] for j in v.inputs):
        return
    for s in rule:
        if s == OUT:
            kept.value(values, i, scope)
        elif s == "mask":  # the kernel multiplies by a scale of the operand's type
            kept.other(("mask", *scope, i), v.type)
        elif v.op is Op.TYPED_LINEAR and s == 2:  # its rows' order by type: an index per row
            kept.other(("order", *scope, i), values[v.inputs[2]].type)
        elif _read_by_a_gradient(v, s, rule, need):
            kept.value(values, v.inputs[s], scope)


def _read_by_a_gradient(v: Value, s: int, rule: tuple, need: list[bool]) -> bool:
    """Is operand ``s`` read by the gradient of an operand that needs one? A unary rule's by
    its own; a product's operand by the other's; a quotient's divisor by both."""
    if len(v.inputs) == 1 or len(rule) == 1 or (v.op is Op.DIV and s == 1):
        return True  # some operand needs a gradient (checked before)
    return any(need[k] for n, k in enumerate(v.inputs) if n != s)


def _keep_region(kept: _Kept, r: Region, operands: list[int], need: list[bool], i: int) -> list[bool]:
    """What a region run under plain autograd keeps (an sddmm, attention's scores): its ops'
    saves; an operand read per edge at src / dst is a gathered copy, one row per edge."""
    rneed = _float_needs(r.values, lambda a: a.op is Op.ARG and need[operands[a.attr["index"]]])
    for k, rv in enumerate(r.values):
        if rv.op is not Op.ARG:
            _keep_op(kept, r.values, k, rv, rneed, ("region", i))
    return rneed


def _keep_fused(kept: _Kept, values, i: int, v: Value, need: list[bool]) -> None:
    """What fused op ``i`` keeps, as the PyTorch backend lowers it."""
    from ..ir.patterns import lifted_extremum, softmax_value, spmm_pattern, typed_spmm_pattern
    ops = v.inputs
    if not any(need[j] for j in ops):
        return
    pattern = spmm_pattern(v)
    own_weights = pattern is not None and pattern[1] is None and pattern[2] == "src"
    if v.op is Op.AGGREGATE and reducer(v.attr["kind"]).by_degree and not own_weights:
        # a mean's divisor (an unweighted product of x[src] has it in the graph's weights)
        kept.other(("degree", i), v.type.with_(feat=()))
    typed = typed_spmm_pattern(v)
    if typed is not None:
        # x @ table[r] per (node, type) summed by a CSR product of column src * R + type when
        # nodes x types <= edges, else per edge from the gathered rows: either keeps an int64
        # per edge (the columns, or the types), x for the table's gradient, the weights, and
        # for theirs the products (per node and type, or per edge: the fewer)
        x, table, types, w = (None if k is None else ops[k] for k in typed)
        if need[table]:
            kept.value(values, x)
        kept.other(("columns", i), values[types].type)
        if w is not None:
            kept.value(values, w)
            if need[w]:
                t = values[table].type
                rows = sympy.Min(N_SRC * t.feat[0], E)
                kept.bytes(("products", i), Domain.EDGE, rows * t.feat[2] * DTYPE_BYTES[t.dtype])
        return
    if pattern is not None:  # a CSR product keeps its edge weights (and x, for theirs)
        x, w, _ = pattern
        if w is not None:
            kept.value(values, ops[w])
            if need[ops[w]]:
                kept.value(values, ops[x])
        return
    lifted = lifted_extremum(v)
    if lifted is not None:
        # the source feature's CSR extremum keeps it; the body's sums per destination keep
        # nothing; the rows without edges are a mask of one byte per destination
        if need[ops[lifted[0]]]:
            kept.value(values, ops[lifted[0]])
        kept.bytes(("mask", i), Domain.DST, N_DST)
        return
    if v.op is Op.SDDMM:
        _keep_region(kept, v.attr["body"], list(ops), need, i)
        return
    if v.op is Op.SOFTMAX_AGGREGATE:
        z = softmax_value(v)
        if z is not None:  # scores per edge, their softmax weights, a CSR product per head
            score = v.attr["score"]
            reads = [a.attr for a in score.values if a.op is Op.ARG]
            if (any(a["side"] in ("src", "dst", "edge") for a in reads)
                    and any(need[ops[a["index"]]] for a in reads)):
                # the scores are recomputed in backward from the operands they read
                # (torch_ops._RecomputedSoftmaxProduct): those are kept, none of the region's values
                rneed = _float_needs(score.values,
                                     lambda a: a.op is Op.ARG and need[ops[a.attr["index"]]])
                for a in reads:
                    kept.value(values, ops[a["index"]])
            else:
                rneed = _keep_region(kept, score, list(ops), need, i)
            kept.other(("weights", i), score.values[score.result].type)
            if rneed[score.result]:
                kept.value(values, ops[z])
            return
    for j in ops:  # recomputed block by block from its operands
        kept.value(values, j)


def saved_for_backward(fn: Function, inputs_need_grad: bool = True, *,
                       distributed: bool = False,
                       exchanged: tuple[int, ...] = ()) -> dict[str, sympy.Expr]:
    """Bytes kept between forward and backward, split by domain ("edge", "node", "total");
    ``inputs_need_grad``: whether the layer's node features need gradients.
    ``distributed``: of the layer's distributed schedule, which computes a dst value on
    the worker's own rows apart from the src value it equals unless that value is one of
    the ``exchanged`` (``sarc.ir.split``)."""
    memo: dict = {}
    need = [_needs_grad(fn, j, memo, inputs_need_grad) and v.type.dtype.is_float
            for j, v in enumerate(fn.values)]
    kept = _Kept(fn, rows_of=set(exchanged) if distributed else None)
    for i, v in enumerate(fn.values):
        if v.op in FUSED:
            _keep_fused(kept, fn.values, i, v, need)
        else:
            _keep_op(kept, fn.values, i, v, need)
    sized = [(t.domain, nbytes(t)) for t in kept.seen.values()] + list(kept.sized.values())
    edge = sum((n for d, n in sized if d is Domain.EDGE), sympy.Integer(0))
    node = sum((n for d, n in sized if d in (Domain.SRC, Domain.DST)), sympy.Integer(0))
    return {"edge": sympy.expand(edge), "node": sympy.expand(node), "total": sympy.expand(edge + node)}


def _value_flops(values, v: Value) -> sympy.Expr:
    t = v.type
    if v.op in (Op.LINEAR, Op.TYPED_LINEAR, Op.MATMUL):
        x = values[v.inputs[0]].type
        return 2 * x.numel_expr() * t.feat[-1]
    if v.op is Op.REDUCE:
        return values[v.inputs[0]].type.numel_expr()
    if v.op is Op.EDGE_SOFTMAX:
        return 5 * t.numel_expr()
    if v.op in FUSED:
        total = sympy.Integer(0)
        for _, r in v.attrs:
            if isinstance(r, Region):
                total += sum((_value_flops(r.values, rv) for rv in r.values), sympy.Integer(0))
                total += r.values[r.result].type.numel_expr()  # the reduction
        if v.op is Op.SOFTMAX_AGGREGATE:
            total += 5 * v.attr["score"].values[v.attr["score"].result].type.numel_expr()
        return total
    if v.op in BINARY_ELEMENTWISE or v.op in (Op.EXP, Op.LOG, Op.RELU, Op.SIGMOID, Op.TANH, Op.ERF,
                                               Op.COS, Op.SIN, Op.LOG1P, Op.CAST,
                                               Op.POW, Op.CLAMP_MIN, Op.LEAKY_RELU, Op.ELU,
                                               Op.SOFTPLUS, Op.DROPOUT, Op.NEG, Op.SUM_AXIS,
                                               Op.MAX_AXIS):
        return t.numel_expr()
    return sympy.Integer(0)


def forward_flops(fn: Function) -> sympy.Expr:
    return sympy.expand(sum((_value_flops(fn.values, v) for v in fn.values), sympy.Integer(0)))


def edge_tensor_bytes(fn: Function) -> sympy.Expr:
    """Bytes of every edge tensor the forward pass materializes (fused regions excluded)."""
    return sympy.expand(sum((nbytes(v.type) for v in fn.values if v.type.domain is Domain.EDGE
                             and v.op is not Op.INPUT), sympy.Integer(0)))


# --- memory traffic of the fused graph ops ----------------------------------------------

INDEX_BYTES = 8
"""An int64 graph index (a CSR column, a row pointer)."""


@dataclass(frozen=True)
class Traffic:
    """Bytes one fused op moves to and from memory in the forward pass.

    ``fused``: as one kernel (the Triton backend's): operands read at the source or
    per edge are loaded once per edge, operands read at the destination once per
    row, parameters once; the result written once (plus the per-row log-sum-exp
    of a softmax), and the CSR index read. ``naive``: the unfused plan, which
    materializes every edge value: each gather writes an E-row tensor, each edge
    intermediate is written once and read by each of its users, an edge softmax
    reads its scores three times (max, sum, normalize) and writes the weights, and
    the reduce reads the edge result back. Cache reuse of gathered rows is not
    modelled (both count what the code requests).
    """

    value: int
    op: str
    fused: sympy.Expr
    naive: sympy.Expr


def _region_naive(r: Region) -> sympy.Expr:
    """Bytes of a region evaluated op by op with every edge value materialized."""
    total = sympy.Integer(0)
    for v in r.values:
        if v.op is Op.ARG and v.attr["side"] in ("src", "dst"):
            total += 2 * nbytes(v.type) + E * INDEX_BYTES  # gather: read rows, write, index
        elif v.op not in (Op.ARG, Op.CONST) and v.type.domain is Domain.EDGE:
            total += nbytes(v.type)  # written once
        for i in v.inputs:  # read by each user
            total += nbytes(r.values[i].type)
    return total


def _typed_rows(fn: Function, v: Value) -> tuple[int, sympy.Expr] | None:
    """For an aggregate of a typed linear's rows (``fuse_typed_linear``): its input operand
    and the bytes that make the rows it reads, as the backends make them. Where nodes x
    types are no more than edges, the node x type table written in float32 (a batched GEMM
    reading x) and read per edge; otherwise each edge's row computed (x read per edge
    through the edge's source) and written, then read. The weights, the other operands,
    the index and the result are the aggregate's, counted as any fused op's."""
    from ..ir.patterns import typed_spmm_pattern
    typed = typed_spmm_pattern(v)
    if typed is None:
        return None
    x, table = (fn.values[v.inputs[k]].type for k in typed[:2])
    rows = next(r.type for r in v.attr["body"].values if r.op is Op.TYPED_LINEAR)
    acc = 8 if rows.dtype is DType.F64 else 4  # the table's entries
    by_table = nbytes(x) + (N_SRC * table.feat[0] + E) * _numel(rows) * acc
    by_edge = E * nbytes(x) / x.domain.rows + E * INDEX_BYTES + 2 * nbytes(rows)
    return typed[0], sympy.Piecewise((by_table, N_SRC * table.feat[0] <= E), (by_edge, True))


def fused_traffic(fn: Function) -> list[Traffic]:
    """``Traffic`` of each fused op of ``fn`` (an optimized layer), in order."""
    from ..ir.patterns import region_sides
    out = []
    for i, v in enumerate(fn.values):
        if v.op is Op.TYPED_LINEAR and fn.values[v.inputs[0]].op in (Op.GATHER_SRC, Op.GATHER_DST):
            # a segment GEMM reading its input rows through the gather's index
            x, w = fn.values[v.inputs[0]].type, fn.values[v.inputs[1]].type
            common = nbytes(x) + nbytes(w) + nbytes(v.type) + 2 * E * INDEX_BYTES
            naive = common + 2 * nbytes(x)  # the gather: rows read, the E-row copy written
            out.append(Traffic(i, v.op.value, sympy.expand(common), sympy.expand(naive)))
            continue
        if v.op not in FUSED:
            continue
        typed = _typed_rows(fn, v)
        fused = typed[1] if typed is not None else sympy.Integer(0)
        for k, (j, side) in enumerate(zip(v.inputs, region_sides(v))):
            if typed is not None and k == typed[0]:
                continue  # read through the typed rows
            t = fn.values[j].type
            per = nbytes(t) / t.domain.rows if t.domain.rows is not None else nbytes(t)
            # a row kernel reads destination operands once per row; an SDDMM, per edge
            dst = E if v.op is Op.SDDMM else N_DST
            fused += {"src": E, "edge": E, "dst": dst, "param": 1}[side] * per
        regions = [r for _, r in v.attrs if isinstance(r, Region)]
        naive = sum((_region_naive(r) for r in regions), sympy.Integer(0))
        if v.op is Op.SDDMM:
            fused += nbytes(v.type) + 2 * E * INDEX_BYTES
        else:
            index = E * INDEX_BYTES + (N_DST + 1) * INDEX_BYTES
            fused += nbytes(v.type) + index
            naive += nbytes(v.type) + index
            root = regions[-1].values[regions[-1].result].type
            naive += nbytes(root)  # the reduce reads the edge result
        if v.op is Op.SOFTMAX_AGGREGATE:
            s = v.attr["score"]
            st = s.values[s.result].type
            fused += N_DST * _numel(st) * 4  # log-sum-exp per row, float32
            naive += 4 * nbytes(st) + E * INDEX_BYTES  # softmax: 3 reads, 1 write
            naive += nbytes(st) + nbytes(v.type.with_(domain=Domain.EDGE))  # alpha * value
        out.append(Traffic(i, v.op.value, sympy.expand(sympy.piecewise_fold(fused)),
                           sympy.expand(naive)))
    return out


@dataclass(frozen=True)
class Exchange:
    """What one layer reads from source rows another worker owns."""

    values: tuple[int, ...]      # the values sent (indices in the optimized IR)
    names: tuple[str, ...]       # readable descriptions
    width: int                   # elements per row, all values together
    dtype_bytes: int
    needs_grad: bool             # gradients flow back to the rows' owners
    recompute: tuple[int, ...]   # values the receiver recomputes from what it got

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype_bytes


def src_operands(fn: Function) -> list[int]:
    """Node values read on the source side of edges (what remote shards must provide)."""
    out: list[int] = []
    for v in fn.values:
        if v.op is Op.GATHER_SRC:
            out.append(v.inputs[0])
        elif v.op in FUSED:
            from ..ir.patterns import region_sides
            for j, side in zip(v.inputs, region_sides(v)):
                if side == "src":
                    out.append(j)
    return sorted(set(out))


def _src_closure(fn: Function, roots: list[int]) -> set[int]:
    """The src-domain values the roots are computed from."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        j = stack.pop()
        if j in seen or fn.values[j].type.domain is not Domain.SRC:
            continue
        seen.add(j)
        stack.extend(fn.values[j].inputs)
    return seen


def _needs_grad(fn: Function, j: int, memo: dict, inputs_need_grad: bool) -> bool:
    """Does value ``j`` depend on a parameter (or on a node feature input that needs grad:
    ``inputs_need_grad``, a layer after the first; edge features come with the graph)?"""
    if j not in memo:
        v = fn.values[j]
        memo[j] = v.op is Op.PARAM or (
            inputs_need_grad and v.op is Op.INPUT and v.type.dtype.is_float
            and v.type.domain is not Domain.EDGE
            and v.attr["name"] not in ("in_degree", "out_degree")
        ) or any(_needs_grad(fn, k, memo, inputs_need_grad) for k in v.inputs)
    return memo[j]


def exchange_candidates(fn: Function, inputs_need_grad: bool = True) -> list[Exchange]:
    """Ways to cross the shard boundary: send the computed operands, or their inputs.

    Sending the operands (after pushdown, e.g. W h) costs their width; sending
    the src inputs they derive from (h) costs the inputs' width and has the
    receiver recompute the operands on the rows it got.
    """
    ops = src_operands(fn)
    if not ops:
        return []
    closure = _src_closure(fn, ops)
    leaves = sorted(j for j in closure if fn.values[j].op is Op.INPUT)
    memo: dict = {}

    def make(values, recompute):
        width = sum(_numel(fn.values[j].type) for j in values)
        dtb = max(DTYPE_BYTES[fn.values[j].type.dtype] for j in values)
        grad = any(_needs_grad(fn, j, memo, inputs_need_grad) and fn.values[j].type.dtype.is_float
                   for j in values)
        names = tuple(_describe(fn, j) for j in values)
        return Exchange(tuple(values), names, width, dtb, grad, tuple(sorted(recompute)))

    cands = [make(ops, ())]
    kept, derived = _underivable(fn, ops)
    if kept != ops:
        cands.append(make(kept, derived))
    if leaves != ops:
        cands.append(make(leaves, closure - set(leaves)))
    # a row of the exchange packs one dtype: a set that mixes them (a float32 score of a
    # bfloat16 layer beside its value) is no candidate where another is
    one_dtype = [c for c in cands if len({fn.values[j].type.dtype for j in c.values}) == 1]
    return one_dtype or cands


def _underivable(fn: Function, ops: list[int]) -> tuple[list[int], set[int]]:
    """The operands minus those the receiver can compute from the others and parameters
    (GAT's ``el = <W h, a_l>`` from ``W h``), and what it then computes.

    Sending ``W h`` alone and recomputing ``el`` on the rows received moves fewer bytes
    each way (the gradient of ``el`` folds into that of ``W h`` on the receiver)."""
    kept = list(ops)
    derived: set[int] = set()
    for j in ops:
        others = set(kept) - {j}
        path = _derivation(fn, j, others)
        if path is not None:
            kept.remove(j)
            derived |= path
    return kept, derived


def _derivation(fn: Function, j: int, others: set[int]) -> set[int] | None:
    """The src values computing ``j`` from ``others``, parameters and constants (None if
    it needs anything else: a src input, which only its owner has)."""
    seen: set[int] = set()
    stack = [j]
    while stack:
        k = stack.pop()
        if k in seen or k in others:
            continue
        v = fn.values[k]
        if v.op in (Op.PARAM, Op.CONST):
            continue
        if v.op is Op.INPUT or v.type.domain is not Domain.SRC:
            return None
        seen.add(k)
        stack.extend(v.inputs)
    return seen


def _numel(t: TensorType) -> int:
    n = 1
    for d in t.feat:
        n *= d
    return n


def _describe(fn: Function, j: int) -> str:
    v = fn.values[j]
    if v.op is Op.INPUT:
        return f"{v.attr['name']}[{_numel(v.type)}]"
    return f"%{j}:{v.op.value}[{_numel(v.type)}]"
