"""The backward pass of a fused op, as regions the Triton kernels compute.

A fused op reads each operand per edge (at the edge's source, its destination,
the edge itself, or a parameter). Its gradient with respect to an operand is,
per edge, the vector-Jacobian product of the region with the edge's *seed* (the
cotangent of the region's result at that edge), summed over where the operand
was read:

- operand read at the rows the op aggregates into (dst of a CSR aggregate):
  a CSR aggregate (sum) of the per-edge cotangent;
- read at the other endpoint (src): a *transposed* aggregate, over CSC;
- read per edge: an SDDMM (one cotangent per edge);
- a parameter: a CSR aggregate (sum) of the per-edge cotangent, then a sum
  over the rows (no E x |param| tensor, no atomics).

The per-edge cotangent is a region over the op's operands plus a few
*extras* (``EXTRAS``, appended after the operands in this order), which the
runtime computes from the op's output cotangent ``dy``:

- aggregate sum: ``dy`` at the row; mean: ``dy / degree``; max / min: the
  forward result ``y`` and ``dy / ties`` (the gradient is split evenly among the
  edges that attain the extremum, as the interpreter's ``amax`` does; ties are
  counted by one more aggregate, ``count_region``);
- SDDMM: ``dy`` at the edge;
- softmax_aggregate: ``dy``, the forward's per-row max score ``m`` and sum ``l`` of
  ``exp(score - m)`` (kept apart: ``m + log(l)`` rounds l away at a max far from zero),
  ``delta = <dy, y>`` (summed over the value's trailing axes) and ``sigma``:
  with ``a = exp(score - m) / l`` and ``ds = a * (<dy, value> - delta)``,
  ``dscore = ds - a * sigma`` where ``sigma`` is the per-row sum of ``ds`` (one
  more aggregate, ``sigma_region``): the cancellation-free form of
  ``sarc.ir.softmax``, whose rows sum to zero as the softmax's shift invariance
  says; ``dvalue = a * dy``. Nothing of size E is saved by the forward pass.

The VJPs themselves come from the IR autodiff's table (``sarc.ir.autodiff.VJP_RULES``),
applied to the region's values, so a fused op's gradient and a layer's
backward function follow the same rules.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.autodiff import VJP_RULES, _Backward
from ..ir.function import Builder, Region, Value, upstream
from ..ir.ops import Op
from ..ir.reducers import reducer
from ..ir.types import Domain, TensorType
from .triton_lower import TritonLoweringError

EXTRAS = {
    "sum": ("dy",),
    "mean": ("dy_over_degree",),
    "max": ("y", "dy_over_ties"),
    "min": ("y", "dy_over_ties"),
    "sddmm": ("dy",),
    "softmax": ("dy", "m", "l", "delta", "sigma"),
}
"""What the backward regions read after the operands, by op kind (runtime computes them):
one entry per reducer (``sarc.ir.reducers``) and the sddmm's."""


@dataclass(frozen=True)
class GradRegion:
    """Operand ``operand`` (read at ``side``) gets the sum of ``region`` over where it was read."""

    operand: int
    side: str
    region: Region


class _RegionBackward(_Backward):
    """autodiff's VJP builder writing into a region's builder.

    The one difference: a parameter's cotangent is not summed over the rows here
    (``sum_rows`` is no per-edge op); it stays per edge, summed over the
    broadcast feature axes and shaped as the parameter, and the gradient kernel
    sums it over the edges.
    """

    def __init__(self, b: Builder):  # noqa: D107 - no forward to copy: the region is in b
        self.b = b
        self.loc = None

    def unbroadcast(self, ct: int, to: TensorType) -> int:
        t = self.type(ct)
        if to.domain is not Domain.PARAM or t.domain is Domain.PARAM:
            return super().unbroadcast(ct, to)
        return self.sum_to_feat(ct, to)


def _edge_type(t: TensorType) -> TensorType:
    return t if t.domain is Domain.PARAM else t.with_(domain=Domain.EDGE)


class _Grads:
    """A builder holding the forward region(s), the seeds and the VJPs."""

    def __init__(self, name: str, types: list[TensorType], sides: tuple[str, ...]):
        self.b = Builder(name)
        self.types, self.sides = types, sides
        self.args: dict[int, int] = {}   # operand -> its ARG value in b
        self.forward: set[int] = set()   # values of the inlined forward regions

    def arg(self, k: int, side: str, t: TensorType) -> int:
        if k not in self.args:
            self.args[k] = self.b.add(Op.ARG, (), {"index": k, "side": side}, None,
                                      _edge_type(t))
        return self.args[k]

    def inline(self, r: Region) -> int:
        local: dict[int, int] = {}
        for j, v in enumerate(r.values):
            if v.op is Op.ARG:
                k = v.attr["index"]
                local[j] = self.arg(k, v.attr["side"], self.types[k])
            else:
                local[j] = self.b.add(v.op, [local[i] for i in v.inputs], v.attr, v.loc, type=v.type)
            self.forward.add(local[j])
        return local[r.result]

    def emit(self, op: Op, inputs, **attrs) -> int:
        return self.b.add(op, inputs, attrs)

    def vjp(self, seeds: dict[int, int], needs_operand: tuple[bool, ...]) -> dict[int, int]:
        """Operand -> the value of its per-edge cotangent, for the operands that need one."""
        values = self.b.values
        needs: dict[int, bool] = {}
        for j in sorted(self.forward):
            v = values[j]
            if v.op is Op.ARG:
                k = v.attr["index"]
                needs[j] = needs_operand[k] and v.type.dtype.is_float
            elif v.op is Op.CONST or not v.type.dtype.is_float:
                needs[j] = False
            else:
                needs[j] = any(needs.get(i, False) for i in v.inputs)
        bw = _RegionBackward(self.b)
        cts = dict(seeds)
        out: dict[int, int] = {}
        for j in sorted(self.forward, reverse=True):
            if j not in cts or not needs[j]:
                continue
            v = values[j]
            if v.op is Op.ARG:
                out[v.attr["index"]] = cts[j]
                continue
            rule = VJP_RULES.get(v.op)
            if rule is None:
                raise TritonLoweringError(f"{v.op.value} inside a fused region has no gradient rule")
            bw.loc = v.loc
            for i, c in zip(v.inputs, rule(bw, v, j, cts[j], tuple(needs[i] for i in v.inputs))):
                if c is not None and needs[i]:
                    cts[i] = c if i not in cts else self.emit(Op.ADD, [cts[i], c])
        return out

    def regions(self, cts: dict[int, int]) -> list[GradRegion]:
        return [GradRegion(k, self.sides[k], prune(Region(tuple(self.b.values), c)))
                for k, c in sorted(cts.items())]


def prune(r: Region) -> Region:
    """Only the values the result depends on, renumbered in order."""
    order = sorted(upstream(r.values, [r.result]))
    new = {j: n for n, j in enumerate(order)}
    values = tuple(Value(r.values[j].op, tuple(new[i] for i in r.values[j].inputs),
                         r.values[j].attrs, r.values[j].type, r.values[j].loc) for j in order)
    return Region(values, new[r.result])


def _needs(types: list[TensorType]) -> tuple[bool, ...]:
    return tuple(t.dtype.is_float for t in types)


def aggregate_grads(body: Region, kind: str, row_side: str, types: list[TensorType],
                    sides: tuple[str, ...], out: TensorType) -> tuple[list[GradRegion], Region | None]:
    """Gradients of ``y[r] = kind over the edges of row r of body(e)``; ``r`` a ``row_side`` node.

    Returns the per-operand cotangent regions and, for max / min, the region whose
    sum per row counts the edges attaining the extremum.
    """
    n = len(types)
    g = _Grads("grad", types, sides)
    res = g.inline(body)
    seed_t = out.with_(domain=Domain.EDGE)
    count = None
    if not reducer(kind).selects:  # sum: dy, mean: dy / degree (EXTRAS)
        seed = g.arg(n, row_side, seed_t)
    else:
        y = g.arg(n, row_side, seed_t)
        tie = g.emit(Op.EQ_MASK, [res, y])
        seed = g.emit(Op.MUL, [tie, g.arg(n + 1, row_side, seed_t)])
        count = prune(Region(tuple(g.b.values), tie))
    return g.regions(g.vjp({res: seed}, _needs(types))), count


def sddmm_grads(body: Region, types: list[TensorType], sides: tuple[str, ...],
                out: TensorType) -> list[GradRegion]:
    """Gradients of ``y[e] = body(e)``."""
    g = _Grads("grad", types, sides)
    res = g.inline(body)
    seed = g.arg(len(types), "edge", out)
    return g.regions(g.vjp({res: seed}, _needs(types)))


def softmax_grads(score: Region, value: Region, types: list[TensorType],
                  sides: tuple[str, ...], out: TensorType) -> tuple[list[GradRegion], Region]:
    """Gradients of ``y[v] = sum_e softmax_v(score)(e) * value(e)`` (see the module doc),
    and the region whose sum per row is ``sigma``."""
    n = len(types)
    g = _Grads("grad", types, sides)
    s = g.inline(score)
    val = g.inline(value)
    st, vt = g.b.values[s].type, g.b.values[val].type
    dy = g.arg(n, "dst", vt)
    m = g.arg(n + 1, "dst", st)
    l_ = g.arg(n + 2, "dst", st)
    delta = g.arg(n + 3, "dst", st)
    a = g.emit(Op.DIV, [g.emit(Op.EXP, [g.emit(Op.SUB, [s, m])]), l_])
    da = g.emit(Op.MUL, [dy, val])
    for _ in range(len(vt.feat) - len(st.feat)):
        da = g.emit(Op.SUM_AXIS, [da], axis=-1)
    ds = g.emit(Op.MUL, [a, g.emit(Op.SUB, [da, delta])])
    sigma_region = prune(Region(tuple(g.b.values), ds))
    sigma = g.arg(n + 4, "dst", st)
    ds = g.emit(Op.SUB, [ds, g.emit(Op.MUL, [a, sigma])])
    a_x = a
    if len(vt.feat) > len(st.feat):
        a_x = g.emit(Op.RESHAPE, [a], feat=st.feat + (1,) * (len(vt.feat) - len(st.feat)))
    dv = g.emit(Op.MUL, [a_x, dy])
    return g.regions(g.vjp({s: ds, val: dv}, _needs(types))), sigma_region


def extra_types(kind: str, out: TensorType, score: TensorType | None = None) -> list[TensorType]:
    """The types of ``EXTRAS[kind]`` (what the runtime passes after the operands)."""
    if kind == "softmax":
        assert score is not None
        return [out, *[score.with_(domain=Domain.DST)] * 4]
    return [out] * len(EXTRAS[kind])

