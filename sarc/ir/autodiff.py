"""Reverse-mode autodiff on the IR: the backward of a layer is IR too.

``grad(fn)`` returns the backward function of the layer ``fn`` (role
``"backward"``), a function like any other that the verifier checks, the
passes optimize, the planner schedules and the backends compile:

- its leaves are ``fn``'s INPUTs and PARAMs (same names, same types) and, per
  output ``o`` of ``fn``, an INPUT ``grad:o`` (a dst value): the cotangent of ``o``;
- it recomputes the forward values it needs (rematerialization; DCE drops the
  rest; which values a schedule saves instead is the planner's choice) and then
  applies the vector-Jacobian product of every op in reverse order, adding up
  the cotangents of values used more than once;
- its outputs are ``grad:<param>`` and ``grad:<feature>`` for every float param
  and every float node or edge feature with a differentiable path to an output
  (the others have a zero gradient and no output). A node feature
  read as ``src.h`` and as ``dst.h`` gets one gradient of ``N_src`` rows (the dst
  part padded with zero rows by ``dst_to_src`` and added: dst nodes are the first
  src nodes); an edge feature's gradient is in CSR edge order, as it is read.
  The builtins ``in_degree`` / ``out_degree`` and int64 inputs get none.

The vector-Jacobian products live in one table, ``VJP_RULES`` (as JAX's
per-primitive rules): ``rule(bw, v, y, ct, needs)`` gets the backward builder,
the forward value ``v`` (its operands are forward indices, valid in the backward
function too, since it starts with a copy of the forward), ``v``'s own index
``y``, its cotangent ``ct`` and which operands need a gradient, and returns one
cotangent (a value index) or None per operand. Ops with no rule are listed with
the reason in ``NOT_DIFFERENTIABLE``; ``tests/ir/test_autodiff.py`` fails when an
op is in neither table. Parameters used inside messages (``W[etype]``, an
edge-conditioned MLP) are ordinary PARAM leaves here, so their gradients (a
``typed_outer``, an ``index_add``, a ``sum_rows``) need no annotation.

The rules follow torch's derivative formulas where a choice exists (ties of a
max split the gradient evenly, ``clamp_min`` passes it where ``x >= min``,
``relu`` where ``x > 0``), so the backward function matches torch autograd
through the reference interpreter (the tests' check), and a dropout's
backward is the same dropout (same ``key``, same seed) of the cotangent.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

from ..errors import DSLError
from .function import Builder, Function, Value
from .ops import LEAVES, Op
from .reducers import reducer
from .passes.cse import cse
from .passes.dce import dce
from .types import Domain, TensorType
from .verifier import verify

GRAD_PREFIX = "grad:"
"""Names of a backward function's cotangent inputs and gradient outputs: ``grad:<name>``."""

NO_GRAD_INPUTS = frozenset({"in_degree", "out_degree"})
"""Builtin inputs (graph structure, not data): no gradient by default."""


class AutodiffError(DSLError):
    """A layer cannot be differentiated as it is (points at the user's line)."""


class _Backward:
    """Builds the backward function: the forward copied verbatim, then the VJPs.

    Every emitted instruction carries the source line of the forward value it
    differentiates, so errors and dumps of the backward point at the user's code.
    """

    def __init__(self, fn: Function):
        self.b = Builder(f"{fn.name}_grad", role="backward")
        for v in fn.values:  # same indices as in fn
            self.b.add(v.op, v.inputs, v.attr, v.loc, type=v.type)
        self.loc = None

    def type(self, i: int) -> TensorType:
        return self.b.values[i].type

    def emit(self, op: Op, inputs: Sequence[int], **attrs) -> int:
        return self.b.add(op, inputs, attrs, self.loc)

    def const(self, value: float, like: int) -> int:
        """A scalar constant of ``like``'s dtype."""
        t = TensorType(Domain.PARAM, self.type(like).dtype, ())
        return self.b.const(value, t, self.loc)

    def mul(self, a: int, b: int) -> int:
        return self.emit(Op.MUL, [a, b])

    def unbroadcast(self, ct: int, to: TensorType) -> int:
        """Sum ``ct`` down to the type of an operand that was broadcast (torch's sum_to_size).

        A param combined with node or edge values is summed over the rows; a
        param's leading dim of 1 that lined up with the row axis is dropped, then
        restored by the final reshape; feature axes an operand lacks, or had as 1,
        are summed.
        """
        t = self.type(ct)
        if t == to:
            return ct
        if to.domain is Domain.PARAM and t.domain is not Domain.PARAM:
            ct = self.emit(Op.SUM_ROWS, [ct])
        return self.sum_to_feat(ct, to)

    def sum_to_feat(self, ct: int, to: TensorType) -> int:
        """Sum ``ct``'s feature axes down to ``to``'s feature shape (rows untouched).

        A target with more dims than ``ct`` has features (a param's leading 1s
        that lined up with the row axis) is matched on its trailing dims.
        """
        feat, target = self.type(ct).feat, to.feat
        if len(target) > len(feat):
            target = target[len(target) - len(feat):]
        lead = len(feat) - len(target)
        for _ in range(lead):
            ct = self.emit(Op.SUM_AXIS, [ct], axis=0)
        feat = feat[lead:]
        for k in reversed(range(len(feat))):
            if target[k] == 1 and feat[k] != 1:
                ct = self.emit(Op.SUM_AXIS, [ct], axis=k)
        if self.type(ct).feat != to.feat:
            ct = self.emit(Op.RESHAPE, [ct], feat=to.feat)
        return ct


VJPRule = Callable[[_Backward, Value, int, int, tuple[bool, ...]], Sequence[int | None]]


# --- graph movement ---------------------------------------------------------------------

def _vjp_gather_src(bw, v, y, ct, needs):
    return (bw.emit(Op.SCATTER_SRC, [ct]),)


def _vjp_gather_dst(bw, v, y, ct, needs):
    return (bw.emit(Op.REDUCE, [ct], kind="sum"),)


def _vjp_linear_reduce(bw, v, y, ct, needs):
    """sum: ct at each edge; a by-degree reducer (mean): ct / count."""
    if reducer(v.attr["kind"]).by_degree:
        ct = bw.emit(Op.DIV_EDGE_COUNT, [ct])
    return (bw.emit(Op.GATHER_DST, [ct]),)


def _vjp_selecting_reduce(bw, v, y, ct, needs):
    """max, min: ct split evenly among the edges attaining the extremum (the rule of
    ``sarc.ir.reducers.tie_shares``, as IR)."""
    (x,) = v.inputs
    tie = bw.emit(Op.EQ_MASK, [x, bw.emit(Op.GATHER_DST, [y])])
    count = bw.emit(Op.CLAMP_MIN, [bw.emit(Op.REDUCE, [tie], kind="sum")], min=1.0)
    share = bw.emit(Op.DIV, [ct, count])
    return (bw.mul(tie, bw.emit(Op.GATHER_DST, [share])),)


def _vjp_edge_softmax(bw, v, y, ct, needs):
    """dx = y * (ct - gather_dst(sum_{e->v} y * ct)), then dx - y * gather_dst(sum_{e->v} dx):
    the cancellation-free form of ``sarc.ir.softmax`` (each row of dx sums to zero)."""
    s = bw.emit(Op.REDUCE, [bw.mul(y, ct)], kind="sum")
    dx = bw.mul(y, bw.emit(Op.SUB, [ct, bw.emit(Op.GATHER_DST, [s])]))
    sigma = bw.emit(Op.REDUCE, [dx], kind="sum")
    return (bw.emit(Op.SUB, [dx, bw.mul(y, bw.emit(Op.GATHER_DST, [sigma]))]),)


REDUCE_VJPS = {
    "sum": _vjp_linear_reduce,
    "mean": _vjp_linear_reduce,
    "max": _vjp_selecting_reduce,
    "min": _vjp_selecting_reduce,
    "softmax": _vjp_edge_softmax,
}
"""Each reducer's VJP rule (``sarc.ir.reducers``). A softmax_aggregate is formed only by
the passes after autodiff: the IR differentiates its softmax weights (``EDGE_SOFTMAX``)
and then their weighted sum."""


def _vjp_reduce(bw, v, y, ct, needs):
    return REDUCE_VJPS[v.attr["kind"]](bw, v, y, ct, needs)


def _vjp_index(bw, v, y, ct, needs):
    table, idx = v.inputs
    return (bw.emit(Op.INDEX_ADD, [ct, idx], num_rows=bw.type(table).feat[0]), None)


# --- elementwise --------------------------------------------------------------------------

def _vjp_neg(bw, v, y, ct, needs):
    return (bw.emit(Op.NEG, [ct]),)


def _vjp_exp(bw, v, y, ct, needs):
    return (bw.mul(ct, y),)


def _vjp_log(bw, v, y, ct, needs):
    return (bw.emit(Op.DIV, [ct, v.inputs[0]]),)


def _vjp_relu(bw, v, y, ct, needs):
    return (bw.emit(Op.WHERE_POS, [y, ct, bw.const(0.0, ct)]),)


def _vjp_sigmoid(bw, v, y, ct, needs):
    return (bw.mul(ct, bw.mul(bw.emit(Op.SUB, [bw.const(1.0, y), y]), y)),)


def _vjp_tanh(bw, v, y, ct, needs):
    return (bw.mul(ct, bw.emit(Op.SUB, [bw.const(1.0, y), bw.mul(y, y)])),)


def _vjp_erf(bw, v, y, ct, needs):
    # d erf(x) = 2 / sqrt(pi) * exp(-x^2)
    x = v.inputs[0]
    d = bw.mul(bw.const(2.0 / math.sqrt(math.pi), x),
               bw.emit(Op.EXP, [bw.emit(Op.NEG, [bw.mul(x, x)])]))
    return (bw.mul(ct, d),)


def _vjp_cos(bw, v, y, ct, needs):
    return (bw.mul(ct, bw.emit(Op.NEG, [bw.emit(Op.SIN, [v.inputs[0]])])),)


def _vjp_sin(bw, v, y, ct, needs):
    return (bw.mul(ct, bw.emit(Op.COS, [v.inputs[0]])),)


def _vjp_log1p(bw, v, y, ct, needs):
    x = v.inputs[0]
    return (bw.emit(Op.DIV, [ct, bw.emit(Op.ADD, [bw.const(1.0, x), x])]),)


def _vjp_cast(bw, v, y, ct, needs):
    # the cotangent converted back to the operand's dtype (as torch's .to); an integer
    # operand has none. A cast by autocast is of the operand's own IR dtype: its cotangent
    # is in autocast's dtype as every value's under autocast is (torch's autograd gives
    # a parameter's gradient in the parameter's dtype)
    if not needs[0]:
        return (None,)
    if v.attr.get("autocast"):
        return (ct,)
    return (bw.emit(Op.CAST, [ct], dtype=bw.type(v.inputs[0]).dtype),)


def _vjp_pow(bw, v, y, ct, needs):
    e = v.attr["exponent"]
    if e == 0.0:
        return (None,)
    x = v.inputs[0]
    if e < 0.0:
        # e x^(e-1) = e y / x, the cotangent multiplied in first: a zero cotangent gives 0
        # where x^(e-1) overflows (a half-precision layer norm's rsqrt of a variance of 0)
        return (bw.mul(bw.const(e, x), bw.emit(Op.DIV, [bw.mul(ct, y), x])),)
    d = bw.mul(bw.const(e, x), bw.emit(Op.POW, [x], exponent=e - 1.0))
    return (bw.mul(ct, d),)


def _vjp_clamp_min(bw, v, y, ct, needs):
    # torch passes the gradient where x >= min: where(min - x > 0, 0, ct)
    x = v.inputs[0]
    below = bw.emit(Op.SUB, [bw.const(v.attr["min"], x), x])
    return (bw.emit(Op.WHERE_POS, [below, bw.const(0.0, ct), ct]),)


def _vjp_leaky_relu(bw, v, y, ct, needs):
    x = v.inputs[0]
    return (bw.emit(Op.WHERE_POS, [x, ct, bw.mul(ct, bw.const(v.attr["slope"], ct))]),)


def _vjp_elu(bw, v, y, ct, needs):
    x = v.inputs[0]
    neg = bw.mul(ct, bw.mul(bw.const(v.attr["alpha"], x), bw.emit(Op.EXP, [x])))
    return (bw.emit(Op.WHERE_POS, [x, ct, neg]),)


def _vjp_softplus(bw, v, y, ct, needs):
    """torch's: the cotangent where beta x > threshold, else times sigmoid(beta x)."""
    x = v.inputs[0]
    beta = v.attr["beta"]
    z = x if beta == 1.0 else bw.mul(x, bw.const(beta, x))
    over = bw.emit(Op.SUB, [z, bw.const(v.attr["threshold"], x)])
    return (bw.emit(Op.WHERE_POS, [over, ct, bw.mul(ct, bw.emit(Op.SIGMOID, [z]))]),)


def _vjp_where_pos(bw, v, y, ct, needs):
    """y = a where c > 0 else b: the cotangent goes to the operand each row took (where, not
    a product with a 0/1 mask, so an inf or NaN the other operand holds never reaches it);
    c is piecewise constant."""
    c, _, _ = v.inputs
    _, ta, tb = _operand_types(bw, v)
    zero = bw.const(0.0, ct)
    return (None,
            bw.unbroadcast(bw.emit(Op.WHERE_POS, [c, ct, zero]), ta) if needs[1] else None,
            bw.unbroadcast(bw.emit(Op.WHERE_POS, [c, zero, ct]), tb) if needs[2] else None)


def _vjp_dropout(bw, v, y, ct, needs):
    # the same mask (same key, same call seed) applied to the cotangent
    return (bw.emit(Op.DROPOUT, [ct], p=v.attr["p"], key=v.attr["key"]),)


def _operand_types(bw, v) -> list[TensorType]:
    return [bw.type(j) for j in v.inputs]


def _vjp_add(bw, v, y, ct, needs):
    ta, tb = _operand_types(bw, v)
    return (bw.unbroadcast(ct, ta) if needs[0] else None,
            bw.unbroadcast(ct, tb) if needs[1] else None)


def _vjp_sub(bw, v, y, ct, needs):
    ta, tb = _operand_types(bw, v)
    return (bw.unbroadcast(ct, ta) if needs[0] else None,
            bw.unbroadcast(bw.emit(Op.NEG, [ct]), tb) if needs[1] else None)


def _vjp_mul(bw, v, y, ct, needs):
    a, b = v.inputs
    ta, tb = _operand_types(bw, v)
    return (bw.unbroadcast(bw.mul(ct, b), ta) if needs[0] else None,
            bw.unbroadcast(bw.mul(ct, a), tb) if needs[1] else None)


def _vjp_div(bw, v, y, ct, needs):
    # torch: da = ct / b, db = -ct * ((a / b) / b)
    a, b = v.inputs
    ta, tb = _operand_types(bw, v)
    da = bw.unbroadcast(bw.emit(Op.DIV, [ct, b]), ta) if needs[0] else None
    db = None
    if needs[1]:
        q = bw.emit(Op.DIV, [y, b])
        db = bw.unbroadcast(bw.emit(Op.NEG, [bw.mul(ct, q)]), tb)
    return da, db


# --- linear algebra ---------------------------------------------------------------------

def _vjp_linear(bw, v, y, ct, needs):
    """y = x W^T: dx = ct W, dW = sum_i ct_i^T x_i."""
    x, w = v.inputs
    return (bw.emit(Op.MATMUL, [ct, w]) if needs[0] else None,
            bw.emit(Op.ROW_OUTER, [ct, x]) if needs[1] else None)


def _vjp_matmul(bw, v, y, ct, needs):
    """y = a b: da = ct b^T (a linear by b), db = sum_i a_i^T ct_i."""
    a, b = v.inputs
    return (bw.emit(Op.LINEAR, [ct, b]) if needs[0] else None,
            bw.emit(Op.ROW_OUTER, [a, ct]) if needs[1] else None)


def _vjp_typed_linear(bw, v, y, ct, needs):
    """y_i = x_i W[t_i]: dx_i = ct_i W[t_i]^T, dW[r] = sum_{t_i = r} x_i^T ct_i."""
    x, w, idx = v.inputs
    dx = bw.emit(Op.TYPED_LINEAR, [ct, bw.emit(Op.TRANSPOSE, [w]), idx]) if needs[0] else None
    dw = (bw.emit(Op.TYPED_OUTER, [x, ct, idx], num_types=bw.type(w).feat[0])
          if needs[1] else None)
    return dx, dw, None


# --- shape ------------------------------------------------------------------------------

def _vjp_reshape(bw, v, y, ct, needs):
    return (bw.emit(Op.RESHAPE, [ct], feat=bw.type(v.inputs[0]).feat),)


def _vjp_concat(bw, v, y, ct, needs):
    ndim = len(v.type.feat)
    axis = v.attr["axis"] % ndim
    out, start = [], 0
    for j, need in zip(v.inputs, needs):
        stop = start + bw.type(j).feat[axis]
        out.append(bw.emit(Op.SLICE, [ct], axis=axis, start=start, stop=stop) if need else None)
        start = stop
    return out


def _vjp_max_axis(bw, v, y, ct, needs):
    """torch.amax's gradient: the entries equal to the maximum share it evenly."""
    x = v.inputs[0]
    feat = bw.type(x).feat
    axis = v.attr["axis"] % len(feat)
    kept = (*feat[:axis], 1, *feat[axis + 1:])
    hit = bw.emit(Op.EQ_MASK, [x, bw.emit(Op.RESHAPE, [y], feat=kept)])
    count = bw.emit(Op.RESHAPE, [bw.emit(Op.SUM_AXIS, [hit], axis=axis)], feat=kept)
    share = bw.emit(Op.DIV, [bw.emit(Op.RESHAPE, [ct], feat=kept), count])
    return (bw.mul(hit, share),)


def _vjp_permute(bw, v, y, ct, needs):
    perm = tuple(v.attr["perm"])
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return (bw.emit(Op.PERMUTE, [ct], perm=inverse),)


def _vjp_slice(bw, v, y, ct, needs):
    size = bw.type(v.inputs[0]).feat[v.attr["axis"]]
    return (bw.emit(Op.PAD, [ct], axis=v.attr["axis"], before=v.attr["start"],
                    after=size - v.attr["stop"]),)


def _vjp_sum_axis(bw, v, y, ct, needs):
    feat = bw.type(v.inputs[0]).feat
    axis = v.attr["axis"] % len(feat)
    kept = bw.emit(Op.RESHAPE, [ct], feat=(*feat[:axis], 1, *feat[axis + 1:]))
    return (kept if feat[axis] == 1 else bw.emit(Op.EXPAND, [kept], feat=feat),)


VJP_RULES: dict[Op, VJPRule] = {
    Op.GATHER_SRC: _vjp_gather_src,
    Op.GATHER_DST: _vjp_gather_dst,
    Op.REDUCE: _vjp_reduce,
    Op.EDGE_SOFTMAX: REDUCE_VJPS["softmax"],
    Op.INDEX: _vjp_index,
    Op.NEG: _vjp_neg,
    Op.EXP: _vjp_exp,
    Op.LOG: _vjp_log,
    Op.RELU: _vjp_relu,
    Op.SIGMOID: _vjp_sigmoid,
    Op.TANH: _vjp_tanh,
    Op.ERF: _vjp_erf,
    Op.COS: _vjp_cos,
    Op.SIN: _vjp_sin,
    Op.LOG1P: _vjp_log1p,
    Op.CAST: _vjp_cast,
    Op.POW: _vjp_pow,
    Op.CLAMP_MIN: _vjp_clamp_min,
    Op.LEAKY_RELU: _vjp_leaky_relu,
    Op.ELU: _vjp_elu,
    Op.SOFTPLUS: _vjp_softplus,
    Op.DROPOUT: _vjp_dropout,
    Op.WHERE_POS: _vjp_where_pos,
    Op.ADD: _vjp_add,
    Op.SUB: _vjp_sub,
    Op.MUL: _vjp_mul,
    Op.DIV: _vjp_div,
    Op.LINEAR: _vjp_linear,
    Op.MATMUL: _vjp_matmul,
    Op.TYPED_LINEAR: _vjp_typed_linear,
    Op.RESHAPE: _vjp_reshape,
    Op.CONCAT: _vjp_concat,
    Op.SUM_AXIS: _vjp_sum_axis,
    Op.SLICE: _vjp_slice,
    Op.MAX_AXIS: _vjp_max_axis,
    Op.PERMUTE: _vjp_permute,
}

_BACKWARD_ONLY = "an op of backward functions (second-order gradients are not supported)"
_AFTER_PASSES = ("made by the optimizing passes; differentiate the traced layer "
                 "(autodiff runs before them) and optimize its backward")

NOT_DIFFERENTIABLE: dict[Op, str] = {
    Op.INPUT: "a leaf: its cotangent is a gradient output",
    Op.PARAM: "a leaf: its cotangent is a gradient output",
    Op.CONST: "a constant",
    Op.EQ_MASK: "piecewise constant: zero gradient",
    Op.DETACH: "detached: zero gradient",
    Op.ARG: _AFTER_PASSES,
    Op.AGGREGATE: _AFTER_PASSES,
    Op.SDDMM: _AFTER_PASSES,
    Op.SOFTMAX_AGGREGATE: _AFTER_PASSES,
    Op.SCATTER_SRC: _BACKWARD_ONLY,
    Op.DST_TO_SRC: _BACKWARD_ONLY,
    Op.DIV_EDGE_COUNT: _BACKWARD_ONLY,
    Op.SUM_ROWS: _BACKWARD_ONLY,
    Op.ROW_OUTER: _BACKWARD_ONLY,
    Op.TYPED_OUTER: _BACKWARD_ONLY,
    Op.INDEX_ADD: _BACKWARD_ONLY,
    Op.TRANSPOSE: _BACKWARD_ONLY,
    Op.EXPAND: _BACKWARD_ONLY,
    Op.PAD: _BACKWARD_ONLY,
}

ZERO_GRADIENT = frozenset({Op.EQ_MASK, Op.DETACH})
"""Non-differentiable ops whose gradient is zero (nothing flows through them)."""


def _needs_grad(fn: Function, wrt_inputs: frozenset[str]) -> list[bool]:
    """Which values depend differentiably on a float param or a differentiated input."""
    needs: list[bool] = []
    for v in fn.values:
        if v.op is Op.PARAM:
            needs.append(v.type.dtype.is_float)
        elif v.op is Op.INPUT:
            needs.append(v.type.dtype.is_float and v.attr["name"] in wrt_inputs)
        elif v.op in LEAVES or v.op in ZERO_GRADIENT or not v.type.dtype.is_float:
            needs.append(False)
        else:   # a where's condition selects; no gradient flows to it
            need = any(needs[j] for k, j in enumerate(v.inputs)
                       if not (v.op is Op.WHERE_POS and k == 0))
            if need and v.op not in VJP_RULES:
                why = NOT_DIFFERENTIABLE.get(v.op, "no VJP rule")
                raise AutodiffError(f"cannot differentiate {v.op.value}: {why}", v.loc)
            needs.append(need)
    return needs


def _wrt(fn: Function, wrt_inputs: Iterable[str] | None) -> frozenset[str]:
    return frozenset(n for n, t in fn.inputs().items() if t.dtype.is_float and (
        n in wrt_inputs if wrt_inputs is not None else n not in NO_GRAD_INPUTS))


def has_gradient(fn: Function, wrt_inputs: Iterable[str] | None = None) -> bool:
    """Whether an output of layer ``fn`` depends differentiably on a float param or input
    (``grad``'s ``wrt_inputs``): where none does (a count of comparisons, a detached value)
    there is no backward function to build, as torch's autograd gives such an output no
    ``grad_fn``."""
    needs = _needs_grad(fn, _wrt(fn, wrt_inputs))
    return any(needs[i] for _, i in fn.outputs)


def grad(fn: Function, wrt_inputs: Iterable[str] | None = None) -> Function:
    """The backward function of layer ``fn`` (see the module docstring).

    ``wrt_inputs`` names the node and edge features to differentiate; by default
    every float feature except the builtin degrees.
    """
    if fn.role != "layer":
        raise ValueError(f"grad takes a layer, got {fn.name} with role {fn.role!r}")
    params = fn.params()
    wrt = _wrt(fn, wrt_inputs)
    clash = wrt & {n for n, t in params.items() if t.dtype.is_float}
    if clash:
        raise AutodiffError(f"layer {fn.name} has a feature and a parameter both named "
                            f"{sorted(clash)[0]!r}; their gradients would share the name "
                            f"{GRAD_PREFIX}{sorted(clash)[0]}: rename one")
    needs = _needs_grad(fn, wrt)
    bw = _Backward(fn)
    cts: dict[int, int] = {}

    def accumulate(i: int, c: int) -> None:
        want = fn.values[i].type
        if bw.type(c) != want:  # a rule's bug, not the user's
            raise AssertionError(f"cotangent of %{i} typed {bw.type(c)}, expected {want}")
        cts[i] = c if i not in cts else bw.emit(Op.ADD, [cts[i], c])

    for name, i in fn.outputs:
        if needs[i]:
            bw.loc = fn.values[i].loc
            accumulate(i, bw.b.leaf(Op.INPUT, GRAD_PREFIX + name, fn.values[i].type, bw.loc))
    for i in reversed(range(len(fn.values))):
        v = fn.values[i]
        if i not in cts or v.op in LEAVES:
            continue
        bw.loc = v.loc
        operand_needs = tuple(needs[j] for j in v.inputs)
        for j, c in zip(v.inputs, VJP_RULES[v.op](bw, v, i, cts[i], operand_needs)):
            if c is not None and needs[j]:
                accumulate(j, c)
    # CSE merges the twins the rules emit (one reshape of a cotangent per operand
    # of a broadcast, repeated constants); DCE drops the forward values not needed.
    return verify(dce(cse(bw.b.finish(_gradient_outputs(fn, bw, cts)))))


def differentiated_params(fn: Function) -> frozenset[str]:
    """The params of layer ``fn`` its gradient reaches (``differentiated_leaves``)."""
    return differentiated_leaves(fn)[0]


def differentiated_leaves(fn: Function) -> tuple[frozenset[str], frozenset[str]]:
    """The params, and the float features (but the builtin degrees), of layer ``fn`` its
    gradient reaches: each one an output depends on differentiably, whose gradient is a
    tensor, zero where nothing flows (a layer on a block without edges; an edge feature's
    is empty there), as torch gives a leaf an op it feeds reads; not one read only by a
    comparison or detached (no gradient). ``fn`` is a traced layer (``grad``'s); where a
    value has no VJP rule (a layer only torch's autograd differentiates), every path counts
    but those through ``ZERO_GRADIENT`` ops, non-float values and a ``where``'s condition."""
    features = _wrt(fn, None)
    try:
        needs = _needs_grad(fn, features)
        if not any(needs[i] for _, i in fn.outputs):   # no leaf reaches an output
            return frozenset(), frozenset()
        names = {n[len(GRAD_PREFIX):] for n, _ in grad(fn).outputs}
        return (frozenset(n for n in fn.params() if n in names),
                frozenset(n for n in features if n in names))
    except AutodiffError:
        pass
    params, inputs = reached_leaves(fn, [i for _, i in fn.outputs])
    return params, inputs & features


def reached_leaves(fn: Function, outputs: Iterable[int]) -> tuple[frozenset[str], frozenset[str]]:
    """The params, and the inputs, the values ``outputs`` (indices in ``fn``) depend on along
    paths a gradient may take: float values, not through a ``ZERO_GRADIENT`` op or a
    ``where``'s condition (what torch's autograd would give a gradient tensor)."""
    reach = [False] * len(fn.values)
    for i in outputs:
        reach[i] = fn.values[i].type.dtype.is_float
    for i in reversed(range(len(fn.values))):
        v = fn.values[i]
        if reach[i] and v.op not in ZERO_GRADIENT and v.op not in LEAVES:
            for k, j in enumerate(v.inputs):
                if not (v.op is Op.WHERE_POS and k == 0):
                    reach[j] = reach[j] or fn.values[j].type.dtype.is_float
    reached = [(v.op, v.attr["name"]) for i, v in enumerate(fn.values)
               if v.op in (Op.PARAM, Op.INPUT) and reach[i]]
    return (frozenset(n for op, n in reached if op is Op.PARAM),
            frozenset(n for op, n in reached if op is Op.INPUT))


def _gradient_outputs(fn: Function, bw: _Backward, cts: dict[int, int]) -> list[tuple[str, int]]:
    """``grad:<name>`` per param, then per feature (src and dst reads of a node feature summed)."""
    outputs = [(GRAD_PREFIX + v.attr["name"], cts[i]) for i, v in enumerate(fn.values)
               if v.op is Op.PARAM and i in cts]
    reads: dict[str, dict[Domain, int]] = {}
    for i, v in enumerate(fn.values):
        if v.op is Op.INPUT and i in cts:
            reads.setdefault(v.attr["name"], {})[v.type.domain] = i
    for name, by_domain in reads.items():
        bw.loc = fn.values[next(iter(by_domain.values()))].loc
        if Domain.EDGE in by_domain:
            outputs.append((GRAD_PREFIX + name, cts[by_domain[Domain.EDGE]]))
            continue
        parts = []
        if Domain.SRC in by_domain:
            parts.append(cts[by_domain[Domain.SRC]])
        if Domain.DST in by_domain:
            parts.append(bw.emit(Op.DST_TO_SRC, [cts[by_domain[Domain.DST]]]))
        total = parts[0] if len(parts) == 1 else bw.emit(Op.ADD, parts)
        outputs.append((GRAD_PREFIX + name, total))
    return outputs
