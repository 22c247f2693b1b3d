"""The backend interface and the registry of backends.

A ``Backend`` is what the compiler and the distributed schedules need of one code
generator: its name, the passes it adds after the pipeline (fusions only its kernels
implement), ``compile(fn, backward)`` (the layer's callable kernel), and what a
distributed schedule needs to run a layer's edge blocks on its kernels:

- ``blocks``: the module of its *block ops*, the partials and backward surrogates of
  each reducer's distributed merge (``BLOCK_OPS``) and of an unfused edge_softmax
  (``SITE_OPS``), with the API of ``torch_blocks``;
- ``edge_lowering(edge, layer)``: how the lines of the edge part (``sarc.ir.split``)
  are lowered (an ``EdgeLowering``), sum and mean aggregates included: their partial is
  the block's aggregate, their surrogate ``sum(agg * cot)`` takes its gradient from the
  aggregate's backward (``EdgeLowering.surrogate``: that backward alone, where it can).

``get_backend(name)`` returns one; backends are built on first use, so importing the
registry imports no backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Protocol

from ..ir.function import Function, Value
from ..ir.passes import dce, fuse_typed_linear
from .codegen import RegionNames

BLOCK_OPS: dict[str, tuple[str, ...]] = {
    "sum": (),   # the partial is the block's aggregate, lowered with the edge part
    "mean": (),  # a sum on the block (``split.BLOCK_KIND``); the merge divides
    "max": ("extremum_partial", "reduce_extremum_partial", "extremum_select",
            "reduce_extremum_select"),
    "min": ("extremum_partial", "reduce_extremum_partial", "extremum_select",
            "reduce_extremum_select"),
    "softmax": ("softmax_partial", "softmax_surrogate", "softmax_normalizer",
                "softmax_normalized"),
}
"""Per reducer (``sarc.ir.reducers.REDUCERS``), the block ops its distributed merge calls."""

SITE_OPS: tuple[str, ...] = ("score_normalizer", "edge_softmax_global",
                             "score_normalizer_surrogate")
"""The block ops of an unfused edge_softmax (global normalizers from a normalizer pass)."""


class EdgeLowering(Protocol):
    """How one backend lowers one layer's edge part in a distributed schedule.

    The schedule's lines call the backend's runtime ops (``K``), its block ops (``DK``)
    and, where the backend builds them, the objects in the schedule's ``ops`` tuple.
    """

    fallbacks: list[str]
    """Ops that run on the torch backend's kernels instead, each with the reason."""
    op_lines: list[str]
    """What each object of ``ops()`` is (``ops[n]: %i op -> kernels ...``), for the header."""

    def lower(self, i: int, v: Value, regions: RegionNames, operands: list[str]) -> str:
        """Value ``i`` (not an aggregate a block op computes) as an expression; calling
        ``regions`` writes its region functions and names them."""

    def surrogate(self, i: int, v: Value, regions: RegionNames, operands: list[str],
                  cot: str) -> str | None:
        """The backward surrogate of sum / mean aggregate ``i``, ``sum(v_i * cot)``, as an
        expression: only its gradient is read, so a backend whose aggregate has its
        backward apart runs that alone, not the aggregate; None where it has none (the
        caller then writes ``sum(v_i * cot)`` over ``lower``)."""

    def block_op(self, name: str, i: int, v: Value,
                 bodies: RegionNames) -> tuple[str, list[str]]:
        """Block op ``name`` called for value ``i``: the function's expression and what it
        gets in place of ``bodies()`` (the value's region functions; for an unfused reduce,
        its kind): the same, or the value's compiled op. A ``SITE_OPS`` op has no bodies
        (``bodies()`` is empty): what is returned is passed after its arguments."""

    def ops(self) -> tuple:
        """The runtime objects the lines call as ``ops[n]`` (built once, after lowering)."""


@dataclass(frozen=True)
class Backend:
    """One backend: see the module doc."""

    name: str
    passes: tuple[Callable[[Function], Function], ...]
    compile: Callable[..., object]            # (fn, backward=None) -> the layer's kernel
    blocks: ModuleType                        # BLOCK_OPS and SITE_OPS, torch_blocks' API
    edge_lowering: Callable[[Function, str], EdgeLowering]  # (edge part, layer name)


class UnknownBackend(ValueError):
    """A backend name no backend has."""


def _torch() -> Backend:
    from . import torch_backend, torch_blocks
    return Backend("torch", (fuse_typed_linear, dce), torch_backend.compile, torch_blocks,
                   torch_backend.EdgeLowering)


def _triton() -> Backend:
    from . import triton_backend, triton_blocks, triton_edge
    return Backend("triton", (fuse_typed_linear, dce), triton_backend.compile, triton_blocks,
                   triton_edge.EdgeLowering)


_FACTORIES: dict[str, Callable[[], Backend]] = {"torch": _torch, "triton": _triton}
_BUILT: dict[str, Backend] = {}

BACKENDS: tuple[str, ...] = tuple(_FACTORIES)
"""The backends' names."""


def get_backend(name: str) -> Backend:
    """The backend called ``name``; an unknown name is an error naming the available ones."""
    if name not in _FACTORIES:
        raise UnknownBackend(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    if name not in _BUILT:
        _BUILT[name] = _FACTORIES[name]()
    return _BUILT[name]
