"""The IR verifier: runs after tracing and after every pass.

It re-derives every value's type from its operands (so a pass that produces an
ill-typed instruction is caught where it does it), checks SSA order, that leaves
of one name agree, and that a layer's outputs are destination values (a
backward function's outputs are gradients, in any domain). Errors name the
user's line of the offending instruction and print the instructions around it.
"""
from __future__ import annotations

from ..errors import DSLError
from .function import Function, Region
from .ops import FUSED, LEAVES, Op, TypeError_, infer_type
from .printer import format_value
from .types import Domain


ROLES = ("layer", "backward")
"""What a function computes: a layer (dst outputs) or a layer's backward (any domain)."""


class VerifyError(DSLError):
    """The IR is malformed; carries a listing of the instructions around the fault."""


def _context(fn: Function, i: int, radius: int = 2) -> str:
    lo, hi = max(0, i - radius), min(len(fn.values), i + radius + 1)
    rows = []
    for j in range(lo, hi):
        mark = ">>" if j == i else "  "
        rows.append(f"  {mark} {format_value(j, fn.values[j])}")
    return "\n".join(rows)


_NOT_IN_REGION = frozenset({Op.INPUT, Op.PARAM, Op.GATHER_SRC, Op.GATHER_DST, Op.REDUCE,
                            Op.EDGE_SOFTMAX, Op.DROPOUT}) | FUSED


def _verify_region(r: Region) -> str | None:
    """Problems inside a fused op's region, or None."""
    if not 0 <= r.result < len(r.values):
        return f"region result ^{r.result} does not exist"
    for i, v in enumerate(r.values):
        if v.op in _NOT_IN_REGION:
            return f"^{i}: {v.op.value} cannot appear inside a fused region"
        if any(not 0 <= j < i for j in v.inputs):
            return f"^{i} uses a value not defined before it"
        if v.op in (Op.ARG, Op.CONST):
            continue
        try:
            t = infer_type(v.op, [r.values[j].type for j in v.inputs], v.attr)
        except TypeError_ as e:
            return f"^{i}: {e}"
        if t != v.type:
            return f"^{i} is typed {v.type} but its operands give {t}"
    return None


def verify(fn: Function) -> Function:
    """Check ``fn``; return it unchanged or raise ``VerifyError``."""
    leaf_types: dict[tuple[Op, str], object] = {}
    for i, v in enumerate(fn.values):
        def fail(msg: str):
            raise VerifyError(f"{msg}\n{_context(fn, i)}", v.loc)

        for j in v.inputs:
            if not 0 <= j < i:
                fail(f"%{i} uses %{j}, which is not defined before it")
        if v.op is Op.ARG:
            fail("an arg outside a fused region")
        for _, a in v.attrs:
            if isinstance(a, Region):
                problem = _verify_region(a)
                if problem:
                    fail(problem)
        if v.op in LEAVES:
            if v.inputs:
                fail(f"leaf %{i} has operands")
            if v.op is Op.CONST and (v.type.domain is not Domain.PARAM or v.type.feat != ()):
                fail("a constant must be a param-domain scalar")
            if v.op is not Op.CONST:
                name = v.attr.get("name")
                if not isinstance(name, str):
                    fail(f"{v.op.value} without a name")
                if v.op is Op.PARAM and v.type.domain is not Domain.PARAM:
                    fail(f"parameter {name!r} must be in the param domain")
                if v.op is Op.INPUT and v.type.domain is Domain.PARAM:
                    fail(f"input {name!r} must be a node or edge value")
                key = (v.op, name)
                seen = leaf_types.get(key)
                if seen is not None and (seen.dtype, seen.feat) != (v.type.dtype, v.type.feat):
                    fail(f"{v.op.value} {name!r} is used with two types: {seen} and {v.type}")
                leaf_types[key] = v.type
            continue
        try:
            t = infer_type(v.op, [fn.values[j].type for j in v.inputs], v.attr)
        except TypeError_ as e:
            fail(str(e))
        if t != v.type:
            fail(f"%{i} is typed {v.type} but its operands give {t}")
    if not fn.outputs:
        raise VerifyError(f"layer {fn.name} has no outputs")
    for name, j in fn.outputs:
        if not 0 <= j < len(fn.values):
            raise VerifyError(f"output {name!r} refers to %{j}, which does not exist")
        t = fn.values[j].type
        if fn.role == "layer" and t.domain is not Domain.DST:
            raise VerifyError(f"output {name!r} must be a dst value, got {t}", fn.values[j].loc)
    if fn.role not in ROLES:
        raise VerifyError(f"function {fn.name} has role {fn.role!r}; expected one of "
                          f"{', '.join(ROLES)}")
    return fn
