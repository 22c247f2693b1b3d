"""Graph preparation written in a traced conv's ``forward``: run by the conv's own code on
the real graph when the inputs are prepared.

PyG's tutorial GCN computes, in its ``forward``, self loops (``add_self_loops``), the
degrees (``degree(col, x.size(0))``) and a weight per edge (``deg_inv_sqrt[row] *
deg_inv_sqrt[col]``) before it calls ``propagate(edge_index, x=x, norm=norm)``. What it
computes from ``edge_index`` alone is the graph's, the same for every call on that graph:
sarc computes it once, when the inputs are prepared (``TracedConv.prepare`` in
``frontends.pyg``), by running the forward up to ``propagate`` on real tensors. The edge list given to ``propagate`` is the
graph the layer runs on, and each per-edge value computed from ``edge_index`` that is
given to ``propagate`` is an edge feature of that name; ``message`` reads it per edge
as it reads any edge feature.

While ``message`` and ``update`` are traced, the forward runs again on a small stand-in
graph (``stand_in_edges``), so that its graph code runs as written, and the values it gives
``propagate`` from ``edge_index`` are replaced by those edge features.

The two kinds of values never meet before ``propagate``: a value computed from both
``edge_index`` and ``x`` (or a parameter, whose gradient would be lost) is refused at
the forward's line. Values are told apart by their class: ``Structure`` (computed from
``edge_index``), ``NodeValue`` (computed from ``x``) and ``EdgeValue`` (from the edge
feature the forward is given, where the graph code does not read it; where it does, the
feature is graph code's too, and keeps its gradient).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from ..errors import DSLError
from ..trace import Proxy, RowCount, _is_library, user_loc

STAND_IN_NODES = 4
"""The stand-in graph's node count while message and update are traced."""


def stand_in_edges() -> torch.Tensor:
    # a cycle and a chord: every node has an in-edge and an out-edge, one node two
    return torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 3]])


def stand_in_edge_values(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """The edge feature forward is given, on the stand-in graph, where its graph code
    reads it."""
    return torch.ones(stand_in_edges().size(1), *shape, dtype=dtype)


class GraphRows(RowCount):
    """``x.size(0)`` of a traced value while a preparing conv's forward runs on the stand-in
    graph: the row count of the traced value (a view's row dim), known to no code the user
    wrote (``x.size(0) == 4``, ``range(x.size(0))`` are refused as a row count is); torch's
    fills and ``arange`` (routed while the forward runs: ``trace_torch._valued``) and
    library code (PyG's ``add_self_loops``, ``scatter``) take it as the stand-in's node
    count, for the graph code they run."""

    __slots__ = ()
    value = STAND_IN_NODES

    def _message(self) -> str:
        return ("the node count (x.size(0)) is not known while sarc traces the conv (the "
                "layer runs on any graph): graph code passes it on to torch.zeros, ones, full, "
                "arange or PyG's utils (add_self_loops, degree, scatter), which run on the "
                "real graph when the inputs are prepared; other code may not read it")

    def __index__(self) -> int:
        if not _is_library(sys._getframe(1).f_code.co_filename):
            raise DSLError(self._message(), user_loc())
        return self.value


def _name(func) -> str:
    name = torch.overrides.resolve_name(func) or getattr(func, "__name__", repr(func))
    return name[:-len(".__get__")] if name.endswith(".__get__") else name


def flat(value):
    """The leaves of nested lists, tuples and dicts (a torch function's arguments)."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from flat(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from flat(v)
    else:
        yield value


class _Tagged(torch.Tensor):
    """A real tensor that says where it comes from; what is computed from it says so too."""

    _sarc_watch: "Watch"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = list(flat((args, kwargs)))
        watch = next(a._sarc_watch for a in leaves if isinstance(a, _Tagged))
        graph = any(isinstance(a, Structure) for a in leaves)
        nodes = any(isinstance(a, (NodeValue, EdgeValue)) for a in leaves)
        traced = any(isinstance(a, Proxy) for a in leaves)   # x's, or a parameter's or buffer's
        learned = any(isinstance(a, torch.Tensor) and not isinstance(a, (_Tagged, Proxy))
                      and a.requires_grad for a in leaves)
        if graph:
            watch.used = True
            if nodes or traced or learned:
                watch.met_edge = any(isinstance(a, EdgeValue) for a in leaves)
                watch.refuse(_name(func), "x or an edge feature" if nodes else
                             "a traced value (x, a parameter or a buffer)" if traced
                             else "a parameter")
        kind = (Structure if graph else NodeValue if any(isinstance(a, NodeValue) for a in leaves)
                else EdgeValue)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if _name(func) in _FRESH and not graph:   # x.new_ones(E): x's dtype, none of its values
            return out
        return _tag(out, kind, watch)


_FRESH = frozenset(f"torch.Tensor.{m}" for m in ("new_ones", "new_zeros", "new_full",
                                                  "new_empty", "new_tensor"))


def fresh(x, name: str, args: tuple, kwargs: dict):
    """``x.new_ones(5)`` of a traced ``x`` while the forward's graph code runs on the
    stand-in graph: a tensor of graph code (sized by numbers, not a row count), in x's
    dtype; None where it is sized by a row count (a traced value's)."""
    if any(isinstance(a, RowCount) for a in flat((args, kwargs))):
        return None
    kwargs = {"dtype": x.dtype, **kwargs}
    kwargs.pop("device", None)
    return getattr(torch.empty(0, dtype=x.dtype), name)(*args, **kwargs)


class Structure(_Tagged):
    """A value computed from ``edge_index`` alone."""

    def _sarc_refusal(self) -> str:   # met by a traced value (``Tracer.lift``)
        return MIXED


MIXED = ("a value computed from edge_index (the forward's graph code) is combined with x, "
         "an edge feature or a parameter: sarc runs the graph code once per graph, when the "
         "inputs are prepared, and traces what is computed from x; give each to propagate on "
         "its own and combine them in message")


class NodeValue(_Tagged):
    """A value computed from ``x``."""


class EdgeValue(_Tagged):
    """A value computed from the edge feature the forward is given (where the graph code
    does not read it)."""


def _tag(value, kind, watch):
    if isinstance(value, torch.Tensor) and not isinstance(value, _Tagged):
        t = value.as_subclass(kind)
        t._sarc_watch = watch
        return t
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        return type(value)(_tag(v, kind, watch) for v in value)
    return value


def plain(value: torch.Tensor) -> torch.Tensor:
    return value.as_subclass(torch.Tensor) if isinstance(value, _Tagged) else value


class Watch:
    """What one run of a forward did with its graph: whether it used ``edge_index``
    (``used``) and the first mixing of graph values with x or parameters (``refused``,
    raised after the forward even where its code catches it)."""

    def __init__(self, refusal):
        self.used = False
        self.met_edge = False   # the refused mixing was with the edge feature forward is given
        self.refused: list[Exception] = []
        self._refusal = refusal   # (function name, what it met) -> the error to raise

    def refuse(self, func: str, met: str):
        error = self._refusal(func, met)
        self.refused.append(error)
        raise error

    def tagged(self, value: torch.Tensor, kind) -> "_Tagged":
        return _tag(value, kind, self)

    def check(self) -> None:
        if self.refused:
            raise self.refused[0]


@dataclass
class Prepared:
    """The graph a preparing forward gives ``propagate``, and its per-edge values by name."""

    edge_index: torch.Tensor
    edge: dict


@contextlib.contextmanager
def quiet_run(modules, grad: bool = False):
    """A forward run for its graph values alone: no gradient is recorded (but where the
    graph code reads an edge feature that needs one: ``grad``), the random streams are left
    as they were, and what the code stores on its modules is put back."""
    from ..trace_guards import _put_back
    stored = [(m, dict(vars(m))) for m in modules]
    try:
        with torch.set_grad_enabled(grad), torch.random.fork_rng(devices=[]):
            yield
    finally:
        _put_back(stored)
