"""The cost model: flops, bytes kept for backward, bytes exchanged, as sympy formulas.

Formulas are in the graph sizes of a layer's block (``N_src``, ``N_dst``, ``E``)
and, for distributed runs, ``B`` (remote rows a worker needs). They are
evaluated on real statistics by substitution.

Bytes kept for backward follow what reverse mode needs from each op (the
``SAVES`` table: which operands, or the output, its gradient rule reads), as
the PyTorch backend runs it: fused ops keep their operands (their edge values
are recomputed), sparse products only their edge weights, attention its
per-edge scores and weights (4 tensors of E x heads, never E x heads x D).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir.function import Function, Region, Value
from ..ir.ops import BINARY_ELEMENTWISE, FUSED, Op
from ..ir.types import E, N_DST, N_SRC, Domain, DType, TensorType

B = sympy.Symbol("B", integer=True, nonnegative=True)
"""Remote source rows one worker receives per exchange (each row once)."""

DTYPE_BYTES = {DType.F32: 4, DType.F16: 2, DType.BF16: 2, DType.F64: 8, DType.I64: 8}

OUT = "out"
# What each op's gradient rule reads: operand positions, or OUT for the result.
SAVES: dict[Op, tuple] = {
    Op.LINEAR: (0,), Op.MATMUL: (0,), Op.TYPED_LINEAR: (0, 2),
    Op.MUL: (0, 1), Op.DIV: (0, 1),
    Op.EXP: (OUT,), Op.RELU: (OUT,), Op.SIGMOID: (OUT,), Op.TANH: (OUT,), Op.ELU: (OUT,),
    Op.LOG: (0,), Op.POW: (0,), Op.CLAMP_MIN: (0,), Op.LEAKY_RELU: (0,),
    Op.EDGE_SOFTMAX: (OUT,), Op.DROPOUT: ("mask",),
}


def nbytes(t: TensorType) -> sympy.Expr:
    return t.numel_expr() * DTYPE_BYTES[t.dtype]


def _saved(values, i: int, v: Value) -> list[tuple[object, TensorType]]:
    """(identity, type) of each tensor value ``i`` keeps for its backward."""
    if v.op in FUSED:
        from ..backends.torch_backend import spmm_pattern
        pattern = spmm_pattern(v)
        if pattern is not None:  # a sparse product keeps its edge weights (x only for dw)
            _, w, _ = pattern
            return [] if w is None else [(v.inputs[w], values[v.inputs[w]].type)]
        kept = [(j, values[j].type) for j in v.inputs if values[j].type.domain is not Domain.PARAM]
        if v.op is Op.SOFTMAX_AGGREGATE:  # raw and activated scores, exponentials, weights
            s = v.attr["score"]
            t = s.values[s.result].type
            kept += [(("softmax", i, k), t) for k in range(4)]
        return kept
    if v.op is Op.REDUCE and v.attr["kind"] in ("max", "min"):
        return [(v.inputs[0], values[v.inputs[0]].type)]
    out = []
    for s in SAVES.get(v.op, ()):
        if s == OUT:
            out.append((i, v.type))
        elif s == "mask":
            out.append((("mask", i), v.type.with_(dtype=DType.F16)))  # a byte per element; f16 ~ 2
        else:
            j = v.inputs[s]
            t = values[j].type
            if t.domain is not Domain.PARAM:
                out.append((j, t))
    return out


def saved_for_backward(fn: Function) -> dict[str, sympy.Expr]:
    """Bytes kept between forward and backward, split by domain ("edge", "node", "total")."""
    seen: dict[object, TensorType] = {}
    for i, v in enumerate(fn.values):
        for key, t in _saved(fn.values, i, v):
            seen.setdefault(key, t)
        for _, r in v.attrs:
            if isinstance(r, Region) and v.op is Op.SDDMM:  # an sddmm runs under plain autograd
                for k, rv in enumerate(r.values):
                    for key, t in _saved(r.values, k, rv):
                        seen.setdefault(("region", i, key), t)
    edge = sum((nbytes(t) for t in seen.values() if t.domain is Domain.EDGE), sympy.Integer(0))
    node = sum((nbytes(t) for t in seen.values() if t.domain in (Domain.SRC, Domain.DST)),
               sympy.Integer(0))
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
    if v.op in BINARY_ELEMENTWISE or v.op in (Op.EXP, Op.LOG, Op.RELU, Op.SIGMOID, Op.TANH,
                                               Op.POW, Op.CLAMP_MIN, Op.LEAKY_RELU, Op.ELU,
                                               Op.DROPOUT, Op.NEG, Op.SUM_AXIS):
        return t.numel_expr()
    return sympy.Integer(0)


def forward_flops(fn: Function) -> sympy.Expr:
    return sympy.expand(sum((_value_flops(fn.values, v) for v in fn.values), sympy.Integer(0)))


def edge_tensor_bytes(fn: Function) -> sympy.Expr:
    """Bytes of every edge tensor the forward pass materializes (fused regions excluded)."""
    return sympy.expand(sum((nbytes(v.type) for v in fn.values if v.type.domain is Domain.EDGE
                             and v.op is not Op.INPUT), sympy.Integer(0)))


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
            from ..backends.torch_backend import region_sides
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
    """Does value ``j`` depend on a parameter (or on a feature input that needs grad)?"""
    if j not in memo:
        v = fn.values[j]
        memo[j] = v.op is Op.PARAM or (
            inputs_need_grad and v.op is Op.INPUT and v.type.dtype.is_float
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
    if leaves != ops:
        cands.append(make(leaves, closure - set(leaves)))
    return cands


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
