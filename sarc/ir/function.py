"""The IR container: one immutable SSA instruction type and the function holding them.

A ``Function`` is a tuple of ``Value`` instructions in definition order; an
instruction names its operands by their index in that tuple, so every operand
is defined before its use (SSA). Passes build new functions with ``Builder``;
nothing is mutated in place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..errors import DSLError, SourceLoc
from .ops import Op, TypeError_, infer_type
from .types import Domain, TensorType


def _freeze(attrs: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if not attrs:
        return ()
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def upstream(values, roots: Iterable[int], through: Callable[[Value], bool] = lambda v: True):
    """Values ``roots`` and the values they are computed from, each once (indices into
    ``values``); only inputs that pass ``through`` are followed."""
    seen, stack = set(), list(roots)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        yield i
        stack.extend(j for j in values[i].inputs if through(values[j]))


@dataclass(frozen=True)
class Value:
    """One SSA instruction: ``op`` applied to earlier values, giving ``type``."""

    op: Op
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...]
    type: TensorType
    loc: SourceLoc | None = field(default=None, compare=False)

    @property
    def attr(self) -> dict[str, Any]:
        return dict(self.attrs)

    def key(self) -> tuple:
        """Structural identity (what CSE compares): op, operands, attributes."""
        return (self.op, self.inputs, self.attrs)


@dataclass(frozen=True)
class Region:
    """A per-edge expression held by a fused op: values over ARG leaves, one result.

    ARG ``k`` reads the fused op's operand ``k`` at each edge: a src or dst
    operand at the edge's endpoint, an edge operand at the edge, a param as is.
    """

    values: tuple[Value, ...]
    result: int

    def __str__(self) -> str:  # attributes print through the IR printer
        return f"<region of {len(self.values)} values>"


@dataclass(frozen=True)
class Function:
    """A traced layer: instructions plus the named outputs (dst values).

    ``role`` tells what the function computes: ``"layer"`` (a traced layer, whose
    outputs are dst values) or ``"backward"`` (the gradient of a layer written by
    ``sarc.ir.autodiff.grad``: outputs in the domains of the layer's params and
    inputs).
    """

    name: str
    values: tuple[Value, ...]
    outputs: tuple[tuple[str, int], ...]
    role: str = "layer"

    def __getitem__(self, i: int) -> Value:
        return self.values[i]

    def __len__(self) -> int:
        return len(self.values)

    def leaves(self, op: Op) -> dict[str, int]:
        """Name -> value index of every INPUT or PARAM leaf."""
        return {v.attr["name"]: i for i, v in enumerate(self.values) if v.op is op}

    def inputs(self) -> dict[str, TensorType]:
        """The node and edge features the layer reads (by name; src and dst share)."""
        out: dict[str, TensorType] = {}
        for v in self.values:
            if v.op is Op.INPUT:
                out.setdefault(v.attr["name"], v.type)
        return out

    def params(self) -> dict[str, TensorType]:
        return {v.attr["name"]: v.type for v in self.values if v.op is Op.PARAM}

    def users(self) -> list[list[int]]:
        users: list[list[int]] = [[] for _ in self.values]
        for i, v in enumerate(self.values):
            for j in v.inputs:
                users[j].append(i)
        return users

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for v in self.values:
            counts[v.op.value] = counts.get(v.op.value, 0) + 1
        return counts


class Builder:
    """Appends instructions, inferring each type; type errors carry the user's line."""

    def __init__(self, name: str, role: str = "layer"):
        self.name = name
        self.role = role
        self.values: list[Value] = []

    def add(self, op: Op, inputs: Iterable[int] = (), attrs: Mapping[str, Any] | None = None,
            loc: SourceLoc | None = None, type: TensorType | None = None) -> int:
        inputs = tuple(inputs)
        frozen = _freeze(attrs)
        if type is None:
            try:
                type = infer_type(op, [self.values[i].type for i in inputs], dict(frozen))
            except TypeError_ as e:
                raise DSLError(str(e), loc) from None
        self.values.append(Value(op, inputs, frozen, type, loc))
        return len(self.values) - 1

    def leaf(self, op: Op, name: str, type: TensorType, loc: SourceLoc | None = None) -> int:
        """An INPUT or PARAM leaf, shared by every use of the same name and domain."""
        for i, v in enumerate(self.values):
            if v.op is op and v.attr["name"] == name and v.type.domain is type.domain:
                return i
        return self.add(op, (), {"name": name}, loc, type)

    def const(self, value: float, type: TensorType, loc: SourceLoc | None = None) -> int:
        assert type.domain is Domain.PARAM and type.feat == ()
        return self.add(Op.CONST, (), {"value": float(value)}, loc, type)

    def reaches(self, index: int, hit: Callable[[int, Value], bool],
                through: Callable[[Value], bool] = lambda v: True) -> bool:
        """Whether value ``index``, or a value it is computed from, is a ``hit(i, value)``;
        only inputs that pass ``through`` are followed."""
        return any(hit(i, self.values[i]) for i in upstream(self.values, [index], through))

    def finish_region(self, result: int) -> Region:
        return Region(tuple(self.values), result)

    def finish(self, outputs: Iterable[tuple[str, int]]) -> Function:
        return Function(self.name, tuple(self.values), tuple(outputs), self.role)
