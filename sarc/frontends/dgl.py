"""DGL's nn modules, unmodified, compiled by sarc.

``from_dgl_module(module, node=..., edge=...)`` wraps a DGL module (``GraphConv``,
``SAGEConv``, ``GATConv``...) as a ``sarc.Layer`` sharing its parameters. Tracing the
layer runs the module's own ``forward`` once, on a ``ProxyGraph`` (an object that
answers the part of ``DGLGraph``'s interface DGL's layers use) and proxy features,
and records what it does as sarc IR:

- node code runs on source rows; ``feat[:g.num_dst_nodes()]`` (DGL's block
  convention: the destinations are the first source rows) replays that code on the
  destination rows, so the graph is presented as a block (``is_block`` is True);
- ``g.srcdata``, ``g.dstdata`` and ``g.ndata`` are one store, as on a DGL graph: a
  value written through one is read through the others (node code replayed on the
  other side's rows), and a source and a destination value combine per node. What an
  ``update_all`` computed per destination node and a later message reads per source
  node (a second hop) is refused: one sarc layer is one round of message passing;
- ``update_all`` / ``apply_edges`` with DGL's builtins (``fn.copy_u``, ``fn.u_mul_e``,
  ``fn.u_add_v``, ``fn.e_dot_v``, ... and ``fn.sum`` / ``mean`` / ``max`` / ``min``)
  become gathers, edge math and reductions; message UDFs are traced as written
  (``edges.src``, ``edges.dst``, ``edges.data``), reduce UDFs when they sum, average
  or take the extremum of ``nodes.mailbox[...]`` over its mailbox axis, of the messages or
  of each message's own arithmetic, and a softmax over that axis is an edge softmax
  (their results are 0 on nodes without in-edges, where DGL does not call them);
- ``dgl.ops.edge_softmax`` / ``dgl.nn.functional.edge_softmax`` become sarc's;
  ``dgl.nn.TypedLinear`` (RelGraphConv's ``W[etype]``) becomes sarc's typed linear;
- ``g.in_degrees()`` / ``g.out_degrees()`` are sarc's degree inputs (whole-graph
  degrees on a shard too), read per source or per destination node as the code uses
  them (SGConv, TAGConv and GCN2Conv scale source features by in-degrees: a whole
  graph or its shards, not a mini-batch block, has them); DGL's zero-in-degree check
  runs on the graph of each call;
- buffers holding one number (GINConv's fixed ``eps``) are read as constants when
  the layer is traced (a later change to them needs a new layer);
- ``torch.ones`` / ``zeros`` / ``full`` sized by a graph size (APPNPConv's
  ``th.ones(g.num_edges(), 1)``) are constants per row of that domain;
- a module returning a tuple of node values (EGNNConv's ``(h, x)``) is a layer returning
  that tuple; an edge value among its outputs is refused.

``patch()`` makes DGL's conv modules do this by themselves when called on a sarc graph
(``GraphConv(...)(g, x)`` with ``g`` a ``sarc.Graph`` or a worker's ``DistGraph``), so a
DGL model runs unchanged; ``from_dgl`` converts a ``DGLGraph``.

The result is a sarc ``Function``: planned, compiled by sarc's backends and run by
its distributed schedules like any DSL layer. A construct sarc cannot lower exactly
(an LSTM over the mailbox, a second round of message passing, ``dgl.to_homogeneous``,
random draws, a tensor that is not a parameter) is a ``DSLError`` naming the module class and the
construct, at the line that used it. DGL is imported only inside these functions.
"""
from __future__ import annotations

import contextlib
import copy
import operator
import os
import sys
from collections import ChainMap
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ..dsl import BACKEND_OF_MADE_LAYERS, Layer, _params_as_proxies
from ..errors import DSLError, GraphError, SourceLoc
from ..interop import from_dgl
from ..ir.ops import Op
from ..ir.types import Domain, TensorType
from ..trace import Proxy, RowCount, Tracer, _is_int, user_loc
from ..trace_guards import builtins_take_tensor_proxies, code_namespaces, tracing
from . import follow_mode, in_module

__all__ = ["DGLLayer", "from_dgl_module", "from_dgl", "patch", "ProxyGraph"]

_REDUCERS = ("sum", "mean", "max", "min")
_BINARY = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV}


def from_dgl_module(module: torch.nn.Module, *, node: Mapping[str, Any],
                    edge: Mapping[str, Any] | None = None, backend: str = "torch") -> "DGLLayer":
    """``module`` (a DGL nn module) as a ``sarc.Layer`` sharing its parameters.

    ``node`` and ``edge`` name the module's ``forward`` arguments the layer reads and
    declare them as a DSL layer does (width, shape or ``sarc.Feature``): for GraphConv
    ``node={"feat": 16}, edge={"edge_weight": ()}``, for RelGraphConv
    ``node={"feat": 16}, edge={"etypes": sarc.INDEX}``. The layer is then called as
    ``layer(g, feat, edge_weight)`` (or by name) on a ``sarc.Graph`` or a worker's
    ``DistGraph``. SGConv, TAGConv and APPNPConv with k > 1 are a module of a layer per
    round instead (``dgl_rounds.DGLRounds``), called the same way.
    """
    from .dgl_rounds import rounds_of
    rounds = rounds_of(module, dict(node), dict(edge or {}))
    if rounds is not None:   # SGConv, TAGConv, APPNPConv with k > 1: a layer per round
        for layer in rounds.rounds:
            layer.set_backend(backend)
        return rounds
    return DGLLayer(module, node=node, edge=edge, backend=backend)


def refuse_zero_in_degree(owner: str, g, asked=True) -> None:
    """DGL's check of a module built with ``allow_zero_in_degree=False``: nodes without
    in-edges are refused on a ``sarc.Graph``, and on a worker's whole-graph ``DistGraph``
    by every worker at once (the in-degrees are the whole graph's; whether any is 0 is
    all-reduced, so no worker raises while its peers wait). A mini-batch step's blocks
    are not checked. ``asked``: where the module asked (a ``SourceLoc``: a module of the
    user's own, which branches there), else True."""
    from ..graph import Graph
    if isinstance(g, Graph):
        zero = bool((g.in_degree == 0).any())
    elif getattr(g, "mode", None) == "full" and hasattr(g, "shard"):
        import torch.distributed as dist
        flag = torch.tensor([int(bool((g.in_degree == 0).any()))], device=g.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=g.group)
        zero = bool(flag.item())
    else:
        return
    if not zero:
        return
    import dgl
    if isinstance(asked, SourceLoc) and not asked.file.startswith(
            os.path.dirname(dgl.__file__) + os.sep):
        raise GraphError(f"{owner}: there are nodes without incoming edges, and the module "
                         f"branches on whether there are ((g.in_degrees() == 0).any() at "
                         f"{asked.file}:{asked.line}), which sarc traced as False, as DGL's "
                         f"convs ask it to raise; compute without the branch (a mask, "
                         f"torch.where(g.in_degrees() == 0, ...)), or add self loops",
                         loc=user_loc())
    raise GraphError(f"{owner}: there are nodes without incoming edges, whose output "
                     f"DGL's module refuses as invalid; add self loops (dgl.add_self_loop "
                     f"before building the graph, or the model's self_loops) or build the "
                     f"module with allow_zero_in_degree=True", loc=user_loc())


def _check_arguments(module: torch.nn.Module, node: Mapping, edge: Mapping) -> None:
    """The declared features are ``forward``'s arguments after the graph, and every one
    of them without a default is declared."""
    import inspect
    try:
        every = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return
    params = every[1:]
    if every and (every[0].name in node or every[0].name in edge):
        first = every[0].name
        raise DSLError(f"{type(module).__name__}: forward({', '.join(p.name for p in every)}) "
                       f"takes the feature {first!r} first, where sarc gives it the graph: a "
                       f"module runs through sarc as forward(graph, {first}, ...), as DGL's "
                       f"convs do (a graph the module holds, self.g, is not the one each call "
                       f"runs on)", user_loc())
    kinds = inspect.Parameter
    if any(p.kind is kinds.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD,
                                                  kinds.KEYWORD_ONLY)]
    owner = type(module).__name__
    for kind, feats in (("node", node), ("edge", edge)):
        for name in feats:
            if name not in names:
                raise DSLError(f"{owner}: {kind}={{{name!r}: ...}} is not an argument of its "
                               f"forward(graph, {', '.join(names)}): node= and edge= declare "
                               f"forward's arguments by name", user_loc())
    missing = [p.name for p in params if p.default is kinds.empty
               and p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
               and p.name not in node and p.name not in edge]
    if missing:
        raise DSLError(f"{owner}: forward's argument{'s' * (len(missing) > 1)} "
                       f"{', '.join(map(repr, missing))} (no default) "
                       f"{'are' if len(missing) > 1 else 'is'} declared in neither node= nor "
                       f"edge=", user_loc())


class DGLLayer(Layer):
    """A DGL module traced into sarc's IR (see the module docstring)."""

    def __init__(self, module: torch.nn.Module, *, node: Mapping[str, Any],
                 edge: Mapping[str, Any] | None = None, backend: str = "torch"):
        super().__init__(node=node, edge=edge, backend=backend)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"from_dgl_module takes a DGL nn module, got {type(module).__name__}")
        _check_arguments(module, self._sarc_node, self._sarc_edge)
        self.module = module
        self._sarc_checks_in_degree = False
        self._sarc_outputs: tuple[str, ...] | None = None   # set when forward returns a tuple
        # a patched conv's layer (``_layer_for``): DGL's class whose forward the module's
        # call reached. Its hooks, and a subclass's forward around DGL's (``return
        # super().forward(g, 2 * x)``), ran on the real tensors, so the trace runs that
        # forward alone (else they would act twice)
        self.routed_class: type | None = None

    @property
    def module_name(self) -> str:
        return type(self.module).__name__

    def display_name(self) -> str:
        return self.module_name

    def trace(self):
        self._check_init()
        name = self.module_name
        precision = self.precision()
        tracer = _DGLTracer(name, precision)
        graph = ProxyGraph(tracer, name)
        b = tracer.builder
        feats: dict[str, Proxy] = {}
        for fname, feat in self._sarc_node.items():
            feats[fname] = _DGLProxy(tracer, b.leaf(Op.INPUT, fname,
                                                    feat.ir_type(Domain.SRC, precision)))
        for fname, feat in self._sarc_edge.items():
            feats[fname] = _DGLProxy(tracer, b.leaf(Op.INPUT, fname,
                                                    feat.ir_type(Domain.EDGE, precision)))
        try:
            with _params_as_proxies(self, tracer, precision), _scalar_buffers(self.module), \
                    tracing(self.modules()), _dgl_routes(self.module, graph):
                call = self.module if self.routed_class is None else _dgls_forward(
                    self.routed_class).__get__(self.module)
                out = call(graph, **feats)
        except DSLError as e:
            raise in_module(name, e) from None
        outs = list(out) if isinstance(out, tuple) else [out]
        if not outs or not all(isinstance(o, Proxy) for o in outs):
            what = ("a tuple holding " + ", ".join(type(o).__name__ for o in outs)
                    if isinstance(out, tuple) else type(out).__name__)
            raise DSLError(f"{name}: forward returned {what}; sarc compiles a module that returns "
                           f"node tensors (one, or a tuple of them)", None)
        for i, o in enumerate(outs):
            if o.type.domain is Domain.SRC:
                # a value per node of the graph, read per destination
                outs[i] = o = _as_dst(graph, o)
            if o.type.domain is not Domain.DST:
                which = f" as output {i + 1} of {len(outs)}" if isinstance(out, tuple) else ""
                hint = ("; sarc compiles a module whose outputs are node values (an edge "
                        "output, as get_attention=True's attention or EGATConv's and "
                        "GatedGCNConv's edge features, is not one)")
                raise DSLError(f"{name}: forward returned {o.type.domain.article} value "
                               f"{list(o.type.feat)}{which}, not a value per destination "
                               f"node{hint}", None)
        self._sarc_checks_in_degree = graph.checks_in_degree
        self._sarc_outputs = (tuple(f"h{i}" for i in range(len(outs)))
                              if isinstance(out, tuple) else None)
        from ..ir.verifier import verify
        names = self._sarc_outputs or ("h",)
        fn = b.finish([(k, o.index) for k, o in zip(names, outs)])
        verify(fn)
        return fn

    def forward(self, g, *args, **feats):
        """As ``Layer.forward``. A module that refuses nodes without in-edges (DGL's
        ``allow_zero_in_degree=False``) refuses them on a ``sarc.Graph`` and on a whole
        graph's ``DistGraph`` (every worker, ``refuse_zero_in_degree``)."""
        follow_mode(self, self.module)
        # DGL's minibatch idiom, a (h, h[:num_dst]) pair, is h here as after patch()
        names = list(self._sarc_node)
        args = tuple(_source_of_pair(self.module_name, names[i] if i < len(names) else str(i),
                                     a, g) if _is_pair(a) else a for i, a in enumerate(args))
        feats = {k: _source_of_pair(self.module_name, k, v, g) if _is_pair(v) else v
                 for k, v in feats.items()}
        self.compiled()   # traced: whether the module checks for nodes without in-edges
        if self._sarc_checks_in_degree:
            refuse_zero_in_degree(self.module_name, g, self._sarc_checks_in_degree)
        out = super().forward(g, *args, **feats)
        if self._sarc_outputs is not None:   # the module returned a tuple: so does the layer
            return tuple(out[k] for k in self._sarc_outputs) if isinstance(out, Mapping) else (out,)
        return out


# --- proxies ---------------------------------------------------------------------------------

class _DGLTracer(Tracer):
    """A tracer whose values are ``_DGLProxy``s (DGL's code slices and converts them); it
    knows the layer's precision (the degrees' dtype) and the graph it traces on."""

    def __init__(self, name: str, precision):
        super().__init__(name, precision)
        self.graph: ProxyGraph | None = None
        # node code replayed on the other side's rows (source index -> destination index and
        # back), shared by every read so that a value has one form per side
        self.dst_of: dict[int, int] = {}
        self.src_of: dict[int, int] = {}

    def emit(self, op, inputs, attrs=None):
        domains = {p.type.domain for p in inputs if isinstance(p, Proxy)}
        if Domain.SRC in domains and Domain.DST in domains:
            # a source and a destination value combined: on a DGL graph both are per node,
            # the same nodes, so the source value is read on the destination rows
            inputs = [_DGLProxy(self, _replay(self, p.index, Domain.DST))
                      if isinstance(p, Proxy) and p.type.domain is Domain.SRC else p
                      for p in inputs]
        return _DGLProxy(self, super().emit(op, inputs, attrs).index)

    def const(self, value, like):
        return _DGLProxy(self, super().const(value, like).index)


class _DGLProxy(Proxy):
    """A traced value with what DGL's layers do to node tensors besides math:
    ``x[:g.num_dst_nodes()]`` (its destination rows), ``.to(device)``,
    ``.device`` and ``g.in_degrees() == 0`` (DGL's zero-in-degree check)."""

    __slots__ = ()
    __hash__ = Proxy.__hash__

    @property
    def __class__(self):
        """``isinstance(value, torch.Tensor)`` holds, as the module's code sees a tensor
        there (``if isinstance(w, torch.Tensor): ...``); it traces as a Proxy."""
        return torch.Tensor

    def __getitem__(self, key):
        if isinstance(key, tuple) and key and (_is_dst_rows(key[0])
                                               or _is_rows(key[0], Domain.SRC)):
            # x[:g.num_dst_nodes(), :8]: the rows, then the feature axes
            return self[key[0]][(slice(None), *key[1:])]
        if _is_rows(key, Domain.SRC) and self.type.domain is Domain.SRC:
            return self   # x[:g.num_src_nodes()]: every source row
        if _is_dst_rows(key):
            domain = self.type.domain
            if domain is Domain.DST:
                return self
            if domain is Domain.SRC:
                return _DGLProxy(self.tracer, _replay(self.tracer, self.index, Domain.DST))
            raise DSLError(f"{_owner(self.tracer)}: the first num_dst_nodes() rows of "
                           f"{domain.article} value are not destination nodes", user_loc())
        return super().__getitem__(key)

    def to(self, *args, **kwargs):
        """A device (``norm.to(feat.device)``) is the graph's: dropped. A dtype, or another
        value's, converts as a sarc layer's value does (``Tensor.to``: a cast)."""
        args = list(args)
        if args and (isinstance(args[0], (str, torch.device)) or _is_int(args[0])):
            args.pop(0)
        kwargs.pop("device", None)
        if not args and not kwargs:
            return self
        return Proxy.to(self, *args, **kwargs)

    @property
    def device(self):
        """The device of the traced value: the graph's (``norm.to(feat.device)``, a no-op on a
        traced value, runs as DGL's layers write it; each call runs where its graph is)."""
        return self.tracer.graph.device if self.tracer.graph is not None else torch.device("cpu")

    def __eq__(self, other):
        v = self.tracer.builder.values[self.index]
        mask = Proxy.__eq__(self, other)
        if (v.op is Op.INPUT and v.attr["name"] == "in_degree" and isinstance(other, int)
                and other == 0):
            return _ZeroInDegree(mask.tracer, mask.index)
        return mask


class _ZeroInDegree(_DGLProxy):
    """``g.in_degrees() == 0`` while tracing: the mask of the nodes without in-edges, and,
    asked whether any node is one (``.any()``, ``bool``: DGL's convs raise if so), False,
    recording where it was asked: each call of the compiled layer refuses a graph where it
    is True (``refuse_zero_in_degree``)."""

    __slots__ = ()

    def any(self, *args, **kwargs):
        if args or kwargs:   # over a feature axis: the traced op
            return super().any(*args, **kwargs)
        graph = self.tracer.graph
        if not graph.checks_in_degree:
            graph.checks_in_degree = user_loc() or True
        return False

    def __bool__(self):
        return self.any()


def _is_dst_rows(key) -> bool:
    return _is_rows(key, Domain.DST)


def _is_rows(key, domain: Domain) -> bool:
    """``key`` is ``[:n]``, ``n`` the row count of ``domain`` (``g.num_dst_nodes()``)."""
    return (isinstance(key, slice) and key.step is None and key.start in (None, 0)
            and isinstance(key.stop, RowCount) and key.stop.symbol == domain.rows)


_EDGE_MADE = (Op.GATHER_SRC, Op.GATHER_DST, Op.REDUCE, Op.EDGE_SOFTMAX, Op.SCATTER_SRC,
              Op.DST_TO_SRC)
"""Ops whose result was computed from the graph's edges: node code made from one has no
form on the other side's rows."""


@dataclass(frozen=True)
class _Side:
    """What replaying node code onto one side's rows needs to say: the rows' name, and why
    a value made from edges cannot cross."""

    name: str
    from_edges: str


_SIDES = {
    Domain.DST: _Side(
        "destination",
        "{what} is a source value computed from the graph's edges and read per destination "
        "node: it cannot be replayed on the destination rows"),
    Domain.SRC: _Side(
        "source",
        "{what} holds what message passing computed per destination node (an update_all's "
        "result) and is read per source node (by a message's source side, edges.src or "
        "g.srcdata): a second round of message passing inside one module, which one sarc "
        "layer does not compute; split the module into one layer per round"),
}


def _replay(tracer: "_DGLTracer", index: int, to: Domain, what: str = "the value") -> int:
    """The node value ``index`` on the rows of side ``to`` (``Domain.SRC`` / ``DST``): the
    value it was replayed from, or its instructions replayed from ``to``'s rows of the same
    inputs. DGL keeps one tensor per node for both sides; sarc has a value per side, and
    each value has one form per side (``tracer.src_of`` / ``dst_of``, both directions)."""
    memo, back = ((tracer.dst_of, tracer.src_of) if to is Domain.DST
                  else (tracer.src_of, tracer.dst_of))
    if index in memo:
        return memo[index]
    b, side = tracer.builder, _SIDES[to]
    v = b.values[index]
    if v.type.domain in (to, Domain.PARAM):
        return index
    if v.type.domain not in _SIDES:
        raise DSLError(f"{_owner(tracer)}: {what} is {v.type.domain.article} value, read per "
                       f"{side.name} node", user_loc())
    if v.op is Op.EQ_MASK and _is_degree(b, v.inputs[0]) and v.inputs[0] == v.inputs[1]:
        # ones over the rows (torch.ones(g.num_src_nodes())): the other side's degree's
        degree = b.leaf(Op.INPUT, "in_degree" if to is Domain.DST else "out_degree",
                        b.values[v.inputs[0]].type.with_(domain=to), v.loc)
        out = b.add(Op.EQ_MASK, [degree, degree], v.attr, v.loc)
        memo[index] = out
        back.setdefault(out, index)
        return out
    if v.op in _EDGE_MADE:
        raise DSLError(f"{_owner(tracer)}: {side.from_edges.format(what=what)}", user_loc())
    if v.op is Op.INPUT:
        out = b.leaf(Op.INPUT, v.attr["name"], v.type.with_(domain=to), v.loc)
    else:
        out = b.add(v.op, [_replay(tracer, i, to, what) for i in v.inputs], v.attr, v.loc)
    memo[index] = out
    back.setdefault(out, index)
    return out


def _one_node_value(b, i: int, j: int, memo: dict) -> bool:
    """Whether values ``i`` and ``j`` are one node value, on either side: the same
    instructions from the same inputs (``srcdata[k][:num_dst_nodes()]``, or DGL's layers
    computing ``norm(feat_src)`` and ``norm(feat_dst)`` alike)."""
    if i == j:
        return True
    if (i, j) not in memo:
        vi, vj = b.values[i], b.values[j]
        memo[i, j] = (vi.op is vj.op and vi.attr == vj.attr and vi.type.feat == vj.type.feat
                      and vi.type.dtype == vj.type.dtype
                      and (vi.type.domain is vj.type.domain
                           or {vi.type.domain, vj.type.domain} <= {Domain.SRC, Domain.DST})
                      and len(vi.inputs) == len(vj.inputs)
                      and all(_one_node_value(b, a, c, memo)
                              for a, c in zip(vi.inputs, vj.inputs)))
    return memo[i, j]


def _is_degree(b, index: int) -> bool:
    v = b.values[index]
    return v.op is Op.INPUT and v.attr["name"] in ("in_degree", "out_degree")


def _owner(tracer) -> str:
    return tracer.builder.name


class _Rows(RowCount):
    """A graph size (``g.num_dst_nodes()``, ``g.num_edges()``) while tracing: usable as the
    row dim of a view and as the end of ``x[:n]``. Compared with 0 it is False: DGL's
    layers guard empty graphs that way, and sarc's reductions give 0 to a node without
    edges, as DGL's guards do."""

    __slots__ = ("written",)

    def __init__(self, symbol, tracer, written: str):
        super().__init__(symbol, tracer)
        self.written = written   # how the module asked for it: g.num_edges()

    def _message(self) -> str:
        return (f"{self.written} used as a number is not known while tracing: sarc compiles "
                f"the module once for every graph it runs on (a block, a worker's shard), "
                f"where it sizes a tensor of constants (torch.ones({self.written}, 1)) and "
                f"ends a slice (x[:{self.written}]) only")

    def __eq__(self, other):
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return False
        return RowCount.__eq__(self, other)

    __hash__ = RowCount.__hash__


# --- the graph ---------------------------------------------------------------------------------

_NODE_VIEWS = ("srcdata", "dstdata")


class _Frame(MutableMapping):
    """``g.srcdata`` / ``g.dstdata`` / ``g.ndata`` (views of one node store, as on a DGL graph:
    a value written through one is read through the others, per source or per destination
    node as the view reads it) or ``g.edata``."""

    def __init__(self, graph: "ProxyGraph", domain: Domain | None, what: str,
                 data: dict[str, Proxy] | None = None):
        self._graph, self._domain, self._what = graph, domain, what
        self._data: dict[str, Proxy] = {} if data is None else data

    def __getitem__(self, key):
        """The user's ``g.srcdata[key]`` (``read``'s, and what it says where it is refused)."""
        value = self._data.get(key)
        if (self._domain is Domain.SRC and value is not None
                and value.type.domain is Domain.DST and _from_edges(self._graph.tracer, value)):
            raise DSLError(f"{self._graph.owner}: g.srcdata[{key!r}] reads per source node what "
                           f"update_all computed per destination node. On a DGL graph srcdata "
                           f"and dstdata are one store, but on a block (a mini-batch's message "
                           f"flow graph) update_all writes dstdata only and srcdata[{key!r}] "
                           f"stays the sources' own; sarc runs a layer on both: read it as "
                           f"g.dstdata[{key!r}] (a second round of message passing from it is a "
                           f"layer of its own)", user_loc())
        return self.read(key)

    def read(self, key):
        """``key``'s value as this view reads it (per source or destination node), for the
        user's code and DGL's builtins and message UDFs alike."""
        if key not in self._data:
            raise DSLError(f"{self._graph.owner}: g.{self._what}[{key!r}] is read before it is "
                           f"set (set: {', '.join(map(repr, self._data)) or 'nothing'}); a sarc "
                           f"graph does not carry a DGL graph's data: make {key!r} an argument "
                           f"of forward, set g.{self._what}[{key!r}] from it, and declare it "
                           f"({'edge' if self._what == 'edata' else 'node'}={{{key!r}: ...}})",
                           user_loc())
        value = self._data[key]
        if self._what in _NODE_VIEWS:
            self._check_one_store(key, value)
        if self._domain is Domain.SRC:
            return _as_src(self._graph, value, f"node data {key!r}")
        if self._domain is Domain.DST:
            return _as_dst(self._graph, value)
        return value

    def __setitem__(self, key, value):
        if not isinstance(value, Proxy):
            raise DSLError(f"{self._graph.owner}: g.{self._what}[{key!r}] is set to "
                           f"{type(value).__name__}, not a value computed from the layer's "
                           f"inputs and parameters", user_loc())
        node = self._domain is not Domain.EDGE
        if (value.type.domain not in (Domain.SRC, Domain.DST)) if node else \
                (value.type.domain is not Domain.EDGE):
            raise DSLError(f"{self._graph.owner}: g.{self._what}[{key!r}] is set to "
                           f"{value.type.domain.article} value; it holds "
                           f"{'node' if node else 'edge'} values", user_loc())
        self._data[key] = value
        if node:
            writes = self._graph.node_writes.setdefault(key, {})
            for side in ((self._what,) if self._what in _NODE_VIEWS else _NODE_VIEWS):
                writes[side] = value

    def _check_one_store(self, key, value) -> None:
        """A value of ``key`` read through srcdata (dstdata) that the other view wrote over
        the value this view wrote: on a DGL graph the two are one store and the read gives
        the later value, on a block they are two and it gives this view's own; sarc runs a
        layer on both, so it refuses rather than guess which."""
        own = self._graph.node_writes.get(key, {}).get(self._what)
        tracer = self._graph.tracer
        if self._domain is Domain.SRC and value.type.domain is Domain.DST \
                and _from_edges(tracer, value):
            return   # a second round of message passing: refused as one when replayed
        if own is not None and not _one_node_value(tracer.builder, own.index, value.index, {}):
            other = next(s for s in _NODE_VIEWS if s != self._what)
            raise DSLError(f"{self._graph.owner}: g.{self._what}[{key!r}] is read after "
                           f"g.{other}[{key!r}] was set to another value than "
                           f"g.{self._what}[{key!r}]'s: on a DGL graph srcdata and dstdata are "
                           f"one store (the read gives the later value), on a block (a "
                           f"mini-batch's message flow graph) two (it gives its own); sarc runs "
                           f"a layer on both: give the two values different names", user_loc())

    def __delitem__(self, key):
        del self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data


def _as_dst(graph: "ProxyGraph", value: Proxy) -> Proxy:
    """A node value read per destination node (a source value's replay on the dst rows)."""
    if value.type.domain is Domain.SRC:
        return _DGLProxy(graph.tracer, _replay(graph.tracer, value.index, Domain.DST))
    return value


def _from_edges(tracer, value: Proxy) -> bool:
    """Whether the node value ``value`` is computed, through node values, from the graph's
    edges (``_EDGE_MADE``): what ``_replay`` cannot carry to the other side."""
    return tracer.builder.reaches(value.index, lambda i, v: v.op in _EDGE_MADE,
                                  through=lambda v: v.type.domain in (Domain.SRC, Domain.DST))


def _as_src(graph: "ProxyGraph", value: Proxy, what: str) -> Proxy:
    """A node value read per source node: a destination value is one only when it is node
    code on the layer's inputs (replayed on the source rows); a value a message passing
    computed per destination node, read again as a source value (a second hop inside one
    module), is not something one sarc layer computes."""
    if value.type.domain is Domain.DST:
        return _DGLProxy(graph.tracer, _replay(graph.tracer, value.index, Domain.SRC, what))
    return value


class _EdgeBatch:
    """What a message UDF receives: ``edges.src``, ``edges.dst`` (read per edge), ``edges.data``."""

    def __init__(self, graph: "ProxyGraph"):
        self.src = _Gathered(graph, graph.srcdata, Op.GATHER_SRC)
        self.dst = _Gathered(graph, graph.dstdata, Op.GATHER_DST)
        self.data = graph.edata
        self._graph = graph

    def __getattr__(self, name):
        raise DSLError(f"{self._graph.owner}: edges.{name} in a message function is not "
                       f"supported by sarc (edges.src, edges.dst and edges.data are)", user_loc())


class _Gathered(Mapping):
    def __init__(self, graph, frame, gather):
        self._graph, self._frame, self._gather = graph, frame, gather

    def __getitem__(self, key):
        return self._graph.tracer.emit(self._gather, [self._frame.read(key)])

    def __iter__(self):
        return iter(self._frame)

    def __len__(self):
        return len(self._frame)


class _NodeBatch:
    """What a reduce UDF receives: ``nodes.mailbox`` and ``nodes.data`` (destination rows);
    an ``apply_node_func``, ``nodes.data`` (``data``: the rows and the reduced values)
    and an empty mailbox."""

    def __init__(self, graph: "ProxyGraph", messages: dict[str, Proxy], data=None):
        self.mailbox = {k: _Mailbox(graph, k, v) for k, v in messages.items()}
        self.data = graph.dstdata if data is None else data
        self._graph = graph

    def __getattr__(self, name):
        raise DSLError(f"{self._graph.owner}: nodes.{name} in a reduce function is not "
                       f"supported by sarc (nodes.mailbox and nodes.data are)", user_loc())


_ELEMENTWISE = frozenset({
    "relu", "exp", "abs", "sigmoid", "tanh", "square", "sqrt", "log", "neg", "sin", "cos",
    "elu", "leaky_relu", "gelu", "silu", "softplus", "selu", "celu", "relu6", "hardtanh",
    "mish", "hardswish", "hardsigmoid", "logsigmoid", "softsign", "tanhshrink", "rsqrt",
    "expm1", "log1p", "log2", "exp2", "clamp", "clamp_min", "clamp_max", "clip", "sign", "erf",
    "reciprocal"})
"""torch's pointwise functions: of one mailbox (and numbers: a slope, a bound) they apply to
each message alone, a message computed again (traced as the message functions are)."""


def _settings_only(args, kwargs) -> bool:
    """A pointwise function's other arguments are settings (numbers, a mode), not tensors,
    and it does not write its input (``inplace=True``)."""
    return (all(a is None or isinstance(a, (int, float, str)) for a in (*args, *kwargs.values()))
            and not kwargs.get("inplace"))

_ARITHMETIC = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
               "truediv": operator.truediv, "pow": operator.pow}


def _arithmetic_of(name: str, reflected: bool = False):
    """``_Mailbox``'s operator ``name`` (``__mul__``, or ``__rmul__`` where ``reflected``)."""
    def method(self, other):
        return self._arithmetic(name, other, reflected)
    method.__name__ = f"__{'r' * reflected}{name}__"
    return method


class _Mailbox:
    """``nodes.mailbox[name]``: only a sum, mean, max or min over the mailbox axis (dim 1)
    lowers to a sarc reduction, of the messages or of each message's own arithmetic (with
    numbers, another mailbox, ``_ELEMENTWISE``: ``(m * 2).relu().sum(1)``,
    ``F.leaky_relu(m, 0.2).max(1)``); anything else
    (an LSTM, sorting, indexing, node data broadcast over the mailbox) is refused."""

    def __init__(self, graph, name, value):
        self._graph, self._name, self._value = graph, name, value

    def _sarc_refusal(self) -> str:
        """Why a traced value cannot take the mailbox (``nodes.data['h'].unsqueeze(1) * m``)."""
        return self._refusal("arithmetic with a traced value (compute per-edge values in the "
                             "message function, reading edges.dst / edges.src)")

    def _each(self, value) -> "_Mailbox":
        return _Mailbox(self._graph, self._name, value)

    def _operand(self, other, what: str):
        if isinstance(other, _Mailbox):
            return other._value
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return other
        self._refuse(f"{what} with {type(other).__name__} (compute per-edge values in the "
                     f"message function, reading edges.dst / edges.src)")

    def _refusal(self, what: str) -> str:
        return (f"{self._graph.owner}: nodes.mailbox[{self._name!r}] used by {what}: sarc "
                f"lowers a reduce function only when it sums, averages or takes the max / min "
                f"over dim 1 of the mailbox or of each message's own arithmetic, pointwise "
                f"functions and softmax (over dim 1: an edge softmax) (e.g. "
                f"fn.{_REDUCERS[0]}, mailbox.sum(1), (mailbox * 2).relu().mean(1), "
                f"(F.softmax(e, dim=1) * z).sum(1))")

    def _refuse(self, what: str):
        raise DSLError(self._refusal(what), user_loc())

    def _reduce(self, kind, dim, keepdim=False):
        feat = tuple(self._value.type.feat)
        full = 2 + len(feat)
        if isinstance(dim, (tuple, list)) and len(dim) == 1:   # .sum((1,))
            dim = dim[0]
        if not isinstance(dim, int) or isinstance(dim, bool) or dim not in (1, 1 - full):
            self._refuse(f"a {kind} over dim={dim!r}")
        tracer = self._graph.tracer
        out = tracer.emit(Op.REDUCE, [self._value], {"kind": kind})
        if keepdim:   # [nodes, 1, ...]: the mailbox axis kept, of one entry
            out = tracer.emit(Op.RESHAPE, [out], {"feat": (1, *feat)})
        return out

    def sum(self, dim=None, keepdim=False):
        return self._reduce("sum", dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return self._reduce("mean", dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return _Extremum(self, self._reduce("max", dim, keepdim))

    def min(self, dim=None, keepdim=False):
        return _Extremum(self, self._reduce("min", dim, keepdim))

    def amax(self, dim=None, keepdim=False):
        return self._reduce("max", dim, keepdim)

    def amin(self, dim=None, keepdim=False):
        return self._reduce("min", dim, keepdim)

    def softmax(self, dim=None, _stacklevel=None, dtype=None):
        """Over dim 1, each node's messages: an edge softmax (DGL's GAT tutorial's
        ``F.softmax(nodes.mailbox['e'], dim=1)``); over a feature dim, each message's own."""
        full = 2 + len(self._value.type.feat)
        if dtype is not None:
            self._refuse("a softmax with dtype (the messages' own dtype is kept)")
        if not isinstance(dim, int) or not -full <= dim < full or dim % full == 0:
            self._refuse(f"a softmax over dim={dim!r}")
        if dim % full == 1:
            return self._each(_edge_softmax(self._graph, self._value))
        return self._each(torch.softmax(self._value, dim % full - 1))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        box = args[0] if args else None
        name = getattr(func, "__name__", "")
        if isinstance(box, _Mailbox) and name in ("sum", "mean", "max", "min", "amax", "amin",
                                                  "softmax"):
            return getattr(box, name)(*args[1:], **kwargs)
        if isinstance(box, _Mailbox) and name in _ELEMENTWISE and \
                _settings_only(args[1:], kwargs):   # F.relu(m) passes inplace=False
            return box._each(func(box._value, *args[1:], **kwargs))
        mailbox = next(a for a in (*args, *kwargs.values()) if isinstance(a, _Mailbox))
        mailbox._refuse(f"torch.{name}")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _ELEMENTWISE:
            def pointwise(*args, **kwargs):
                if not _settings_only(args, kwargs):
                    self._refuse(f".{name}")
                return self._each(getattr(self._value, name)(*args, **kwargs))
            return pointwise
        self._refuse(f".{name}")

    def __neg__(self):
        return self._each(-self._value)

    def _arithmetic(self, name: str, other, reflected: bool = False) -> "_Mailbox":
        b = self._operand(other, f"__{'r' * reflected}{name}__")
        op = _ARITHMETIC[name]
        return self._each(op(b, self._value) if reflected else op(self._value, b))

    __add__, __radd__ = _arithmetic_of("add"), _arithmetic_of("add", reflected=True)
    __sub__, __rsub__ = _arithmetic_of("sub"), _arithmetic_of("sub", reflected=True)
    __mul__, __rmul__ = _arithmetic_of("mul"), _arithmetic_of("mul", reflected=True)
    __truediv__ = _arithmetic_of("truediv")
    __rtruediv__ = _arithmetic_of("truediv", reflected=True)
    __pow__, __rpow__ = _arithmetic_of("pow"), _arithmetic_of("pow", reflected=True)

    def __getitem__(self, key):
        self._refuse("indexing")


class _Extremum(tuple):
    """``mailbox.max(1)``: ``(values, indices)``; the indices are not traced (any use of
    them, unpacked or as ``.indices``, is refused)."""

    def __new__(cls, box, values):
        self = super().__new__(cls, (values, _Indices(box)))
        self._box = box
        return self

    @property
    def values(self):
        return self[0]

    @property
    def indices(self):
        self._box._refuse("the arg-max / arg-min indices")


class _Indices:
    """The arg-max / arg-min of a mailbox extremum: refused wherever it is used."""

    def __init__(self, box):
        self._box = box

    def _sarc_refusal(self) -> str:
        return self._box._refusal("the arg-max / arg-min indices")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise DSLError(self._sarc_refusal(), user_loc())


class ProxyGraph:
    """What a DGL module's ``forward`` receives while sarc traces it: a homogeneous graph
    whose data are traced values. It says it is a block (``is_block``), so that DGL's layers
    take their destination features as the first source rows (``feat[:num_dst_nodes()]``,
    the same rows of a graph); its node data are one store, as a DGL graph's are:
    ``g.srcdata``, ``g.dstdata`` and ``g.ndata`` read and write the same values."""

    is_block = True
    is_homogeneous = True
    ntypes = srctypes = dsttypes = ("_N",)
    etypes = ("_E",)
    canonical_etypes = (("_N", "_E", "_N"),)

    def __init__(self, tracer: "_DGLTracer", owner: str):
        self.tracer, self.owner = tracer, owner
        tracer.graph = self
        self.checks_in_degree = False
        self._nodes: dict[str, Proxy] = {}
        # per node data key, the value last written through srcdata and through dstdata
        # (ndata: both), which a block keeps apart (``_Frame._check_one_store``)
        self.node_writes: dict[str, dict[str, Proxy]] = {}
        self.edata = _Frame(self, Domain.EDGE, "edata")

    @property
    def srcdata(self):
        return _Frame(self, Domain.SRC, "srcdata", self._nodes)

    @property
    def dstdata(self):
        return _Frame(self, Domain.DST, "dstdata", self._nodes)

    @property
    def ndata(self):
        return _Frame(self, None, "ndata", self._nodes)

    def _refuse(self, what: str, hint: str = ""):
        raise DSLError(f"{self.owner}: {what} is not supported by sarc's DGL front end"
                       + (f" ({hint})" if hint else ""), user_loc())

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        reader = _dgl_function_reading()
        self._refuse(f"g.{name}" + (f", which {reader} reads," if reader else ""),
                     "a sarc graph is one homogeneous graph or block, fixed when the layer is "
                     "traced: DGL's batched graphs, heterographs and graph internals are not "
                     "modelled")

    @property
    def device(self):
        return torch.device("cpu")

    @contextlib.contextmanager
    def local_scope(self):
        nodes, edges = dict(self._nodes), dict(self.edata._data)
        writes = {k: dict(v) for k, v in self.node_writes.items()}
        try:
            yield self
        finally:
            self._nodes.clear()
            self._nodes.update(nodes)
            self.edata._data = edges
            self.node_writes = writes

    def local_var(self):
        """DGL's ``g.local_var()``: this graph, with data stores of its own (copies), so
        what the module writes into it leaves this one's as they were."""
        other = copy.copy(self)
        other._nodes = dict(self._nodes)
        other.node_writes = {k: dict(v) for k, v in self.node_writes.items()}
        other.edata = _Frame(other, Domain.EDGE, "edata", dict(self.edata._data))
        return other

    # sizes and degrees
    def num_src_nodes(self, ntype=None):
        return _Rows(Domain.SRC.rows, self.tracer, "g.num_src_nodes()")

    def num_dst_nodes(self, ntype=None):
        return _Rows(Domain.DST.rows, self.tracer, "g.num_dst_nodes()")

    def num_edges(self, etype=None):
        return _Rows(Domain.EDGE.rows, self.tracer, "g.num_edges()")

    number_of_src_nodes = num_src_nodes
    number_of_dst_nodes = num_dst_nodes
    number_of_edges = num_edges

    def num_nodes(self, ntype=None):
        self._refuse("g.num_nodes()", "sarc traces the module once for a graph and a block, "
                     "and a block has two node counts: write g.num_src_nodes() (the rows of "
                     "g.ndata and g.srcdata) or g.num_dst_nodes() (those of g.dstdata)")

    number_of_nodes = num_nodes

    def in_degrees(self, v=None, etype=None):
        if v is not None:
            self._refuse("g.in_degrees(v)", "the degrees of all destination nodes are")
        return self._leaf("in_degree", Domain.DST)

    def out_degrees(self, u=None, etype=None):
        if u is not None:
            self._refuse("g.out_degrees(u)", "the degrees of all source nodes are")
        return self._leaf("out_degree", Domain.SRC)

    def _leaf(self, name, domain):
        b = self.tracer.builder
        t = TensorType(domain, self.tracer.precision, ())
        return _DGLProxy(self.tracer, b.leaf(Op.INPUT, name, t, user_loc()))

    # message passing
    def apply_edges(self, func, edges=None, etype=None):
        if edges is not None:
            self._refuse("g.apply_edges(func, edges)", "on all edges it is")
        self.edata.update(self._messages(func))

    def update_all(self, message_func, reduce_func, apply_node_func=None, etype=None):
        messages = self._messages(message_func)
        reduced = self._reduce(reduce_func, messages)
        if apply_node_func is not None:   # as DGL: on every destination, its data and the
            # reduced values; what it returns (only) is written
            extremum = _builtin_extremum(reduce_func)
            given = reduced if extremum is None else {
                k: self._unreached(v, extremum) for k, v in reduced.items()}
            out = apply_node_func(_NodeBatch(self, {}, ChainMap(given, self.dstdata)))
            if not isinstance(out, Mapping) or not all(isinstance(v, Proxy)
                                                       for v in out.values()):
                self._refuse(f"an apply_node_func returning {type(out).__name__}",
                             "it returns a dict of destination values")
            reduced = {k: _as_dst(self, v) if v.type.domain is Domain.SRC else v
                       for k, v in out.items()}
            for k, v in reduced.items():
                if v.type.domain is not Domain.DST:
                    self._refuse(f"apply_node_func result {k!r} is {v.type.domain.article} "
                                 f"value", "it returns values per destination node")
            if extremum is not None and reduced:   # DGL zeroes +-inf in the first key only
                first = next(iter(reduced))
                reduced[first] = self._infinities_zeroed(reduced[first])
        self.dstdata.update(reduced)

    def _unreached(self, value: Proxy, kind: str) -> Proxy:
        """``value`` (a builtin max / min) with DGL's -inf / +inf on a destination without
        in-edges, where sarc's reduction is 0: what DGL's apply_node_func reads there."""
        from ..trace_torch import degree_over, ones_over_rows
        t = self.tracer
        ones = ones_over_rows(degree_over(t, Domain.EDGE, value.type.dtype), (), 1.0, None,
                              "fn.max")
        reached = t.emit(Op.REDUCE, [ones], {"kind": "max"})   # 1 with in-edges, else 0
        if value.type.feat:
            reached = t.emit(Op.RESHAPE, [reached], {"feat": (1,) * len(value.type.feat)})
        inf = float("-inf") if kind == "max" else float("inf")
        return t.emit(Op.WHERE_POS, [reached, value, t.lift(inf, value)])

    def _infinities_zeroed(self, value: Proxy) -> Proxy:
        """DGL's ``replace_inf_with_zero``: +-inf -> 0, other values as they are."""
        t = self.tracer
        inf = t.emit(Op.ADD, [t.emit(Op.EQ_MASK, [value, t.lift(float("inf"), value)]),
                              t.emit(Op.EQ_MASK, [value, t.lift(float("-inf"), value)])])
        return t.emit(Op.WHERE_POS, [inf, t.lift(0.0, value), value])

    def multi_update_all(self, *args, **kwargs):
        self._refuse("g.multi_update_all", "a sarc graph is homogeneous")

    def _messages(self, func) -> dict[str, Proxy]:
        from dgl.function.message import BinaryMessageFunction, CopyMessageFunction
        if isinstance(func, CopyMessageFunction):
            return {func.out_field: self._operand(func.target, func.in_field)}
        if isinstance(func, BinaryMessageFunction):
            lhs = self._operand(func.lhs, func.lhs_field)
            rhs = self._operand(func.rhs, func.rhs_field)
            fa, fb = lhs.type.feat, rhs.type.feat
            if func.binary_op == "dot" and (not fa or not fb or fa[-1] != fb[-1]):
                self._refuse(f"fn.{func.name} of features {list(fa)} and {list(fb)}",
                             "DGL's dot needs the same size on the last dimension of both "
                             "operands, and raises")
            lhs, rhs = self._aligned(lhs, rhs)
            if func.binary_op == "dot":
                prod = lhs * rhs
                return {func.out_field: prod.sum(-1).unsqueeze(-1)}
            return {func.out_field: self.tracer.emit(_BINARY[func.binary_op], [lhs, rhs])}
        if callable(func) and not _is_dgl_builtin(func):
            out = func(_EdgeBatch(self))
            if not isinstance(out, Mapping) or not all(isinstance(v, Proxy) for v in out.values()):
                self._refuse(f"a message function returning {type(out).__name__}",
                             "it returns a dict of edge values")
            for k, v in out.items():
                if v.type.domain is not Domain.EDGE:
                    self._refuse(f"message {k!r} is {v.type.domain.article} value",
                                 "messages are per edge")
            return dict(out)
        self._refuse(f"message function {func!r}")

    def _aligned(self, a: Proxy, b: Proxy) -> tuple[Proxy, Proxy]:
        """Operands of a builtin broadcast as DGL's builtins do (NumPy's rule on the feature
        shapes: the shorter padded with leading 1s; an [E] edge weight scales [E, D])."""
        fa, fb = a.type.feat, b.type.feat
        if len(fa) < len(fb):
            a = self.tracer.emit(Op.RESHAPE, [a], {"feat": (1,) * (len(fb) - len(fa)) + fa})
        elif len(fb) < len(fa):
            b = self.tracer.emit(Op.RESHAPE, [b], {"feat": (1,) * (len(fa) - len(fb)) + fb})
        return a, b

    def _operand(self, target: int, field: str) -> Proxy:
        from dgl.function.base import TargetCode
        if target == TargetCode.SRC:
            return self.tracer.emit(Op.GATHER_SRC, [self.srcdata.read(field)])
        if target == TargetCode.DST:
            return self.tracer.emit(Op.GATHER_DST, [self.dstdata.read(field)])
        return self.edata.read(field)

    def _reduce(self, func, messages: dict[str, Proxy]) -> dict[str, Proxy]:
        from dgl.function.reducer import SimpleReduceFunction
        if isinstance(func, SimpleReduceFunction):
            if func._name not in _REDUCERS:
                self._refuse(f"reducer fn.{func._name}")
            return {func.out_field: self.tracer.emit(Op.REDUCE, [messages[func.msg_field]],
                                                     {"kind": func._name})}
        if callable(func) and not _is_dgl_builtin(func):
            out = func(_NodeBatch(self, messages))
            if not isinstance(out, Mapping) or not all(isinstance(v, Proxy) for v in out.values()):
                self._refuse(f"a reduce function returning {type(out).__name__}",
                             "it returns a dict of destination values")
            return {k: self._received_only(k, v) for k, v in out.items()}
        self._refuse(f"reduce function {func!r}")

    def _received_only(self, key: str, value: Proxy) -> Proxy:
        """A reduce UDF's result as DGL gives it: DGL runs the UDF on the nodes with in-edges
        only and fills the others with 0, so what the UDF adds to its reductions (node data,
        constants, a bias, an activation) is masked off the nodes without in-edges. A plain
        reduction of the mailbox is 0 there already."""
        if value.type.domain is Domain.SRC:
            value = _as_dst(self, value)
        if value.type.domain is not Domain.DST:
            self._refuse(f"reduce result {key!r} is {value.type.domain.article} value",
                         "a reduce function returns values per destination node")
        if self.tracer.builder.values[value.index].op is Op.REDUCE:
            return value
        tracer = self.tracer
        degree = self.in_degrees()
        if value.type.feat:
            degree = tracer.emit(Op.RESHAPE, [degree], {"feat": (1,) * len(value.type.feat)})
        # a select, not a product with a 0/1 mask: an inf or NaN the UDF makes from an empty
        # mailbox is not there to multiply
        return tracer.emit(Op.WHERE_POS, [degree, value, tracer.const(0.0, value)])


def _is_dgl_builtin(func) -> bool:
    from dgl.function.base import BuiltinFunction
    return isinstance(func, BuiltinFunction)


# --- DGL's functions, routed while a module is traced ------------------------------------------

def _edge_softmax(graph, logits, eids=None, norm_by="dst"):
    from dgl.base import ALL, is_all
    if not isinstance(graph, ProxyGraph):
        raise TypeError("sarc's edge_softmax runs on the graph sarc traces a module with")
    if eids is not None and eids is not ALL and not is_all(eids):
        graph._refuse("edge_softmax(..., eids)", "over all edges it is")
    if norm_by != "dst":
        graph._refuse(f"edge_softmax(..., norm_by={norm_by!r})",
                      "sarc normalizes over each destination's incoming edges")
    if not isinstance(logits, Proxy) or logits.type.domain is not Domain.EDGE:
        graph._refuse("edge_softmax of a value that is not per edge")
    feat = logits.type.feat
    if feat and feat[-1] == 1:
        # DGL's attention scores are [E, heads, 1] or [E, 1]; sarc fuses softmax-weighted sums of
        # a score whose shape prefixes the value's ([E, heads] against [E, heads, D]).
        tracer = graph.tracer
        score = tracer.emit(Op.RESHAPE, [logits], {"feat": feat[:-1]})
        return tracer.emit(Op.RESHAPE, [tracer.emit(Op.EDGE_SOFTMAX, [score])], {"feat": feat})
    return graph.tracer.emit(Op.EDGE_SOFTMAX, [logits])


_SIDE_DATA = {"u": "srcdata", "v": "dstdata", "e": "edata"}
_REDUCES = ("sum", "max", "min", "mean")


def _dgl_op_parts(name: str):
    """``dgl.ops``' named message functions: ``u_mul_e_sum`` -> (("u", "e"), "u_mul_e",
    "sum"), ``copy_u`` -> (("u",), "copy_u", None); None for another name."""
    parts = name.split("_")
    reduce = parts[-1] if len(parts) > 2 and parts[-1] in _REDUCES else None
    msg = parts[:-1] if reduce else parts
    if len(msg) == 2 and msg[0] == "copy" and msg[1] in ("u", "e"):
        return (msg[1],), name if reduce is None else "_".join(msg), reduce
    if len(msg) == 3 and msg[0] in _SIDE_DATA and msg[2] in _SIDE_DATA and msg[0] != msg[2] \
            and msg[1] in ("add", "sub", "mul", "div", "dot"):
        return (msg[0], msg[2]), "_".join(msg), reduce
    return None


def _dgl_op(name: str):
    """``dgl.ops.u_mul_e_sum(g, x, y)`` and its kin on the graph sarc traces a module with:
    DGL's builtin message (``fn.u_mul_e``) and reduction (``fn.sum``) through
    ``update_all``, or ``apply_edges`` for an edge result (``dgl.ops.u_dot_v``)."""
    import dgl.function as fn
    sides, msg, reduce = _dgl_op_parts(name)

    def run(graph, *operands):
        if not isinstance(graph, ProxyGraph) or len(operands) != len(sides):
            raise DSLError(f"dgl.ops.{name} takes the graph and {len(sides)} operand"
                           f"{'s' * (len(sides) > 1)} while sarc traces a module", user_loc())
        keys = [f"_sarc_{k}" for k in ("lhs", "rhs")[:len(sides)]]
        with graph.local_scope():
            for side, key, value in zip(sides, keys, operands):
                getattr(graph, _SIDE_DATA[side])[key] = value
            message = getattr(fn, msg)(*keys, "_sarc_m")
            if reduce is None:
                graph.apply_edges(message)
                return graph.edata["_sarc_m"]
            graph.update_all(message, getattr(fn, reduce)("_sarc_m", "_sarc_out"))
            out = graph.dstdata["_sarc_out"]
            if reduce in ("max", "min"):
                # DGL's gspmm leaves a node without in-edges at -inf (max) / inf (min), where
                # update_all's max and min give it 0
                fed = graph.in_degrees() > 0
                for _ in out.shape[1:]:
                    fed = fed.unsqueeze(-1)
                out = torch.where(fed, out, float("-inf" if reduce == "max" else "inf"))
            return out
    run.__name__ = name
    return run


def _dgl_function_reading() -> str:
    """``dgl.readout.mean_nodes``: the DGL library function (not a module's forward, which
    the error names as its owner) that is reading an attribute of the graph, if one is."""
    import dgl
    root = os.path.dirname(dgl.__file__) + os.sep
    f, found = sys._getframe(2), ""
    while f is not None and not f.f_code.co_filename.startswith(root):
        f = f.f_back   # sarc's own frames
    while f is not None and f.f_code.co_filename.startswith(root):
        if "self" in f.f_code.co_varnames[:1]:
            break   # a DGL module's method: the owner the error names
        found = f"{f.f_globals.get('__name__', 'dgl')}.{f.f_code.co_name}"
        f = f.f_back   # the outermost: the function the user called
    return found


def _typed_linear(self, x, x_type, sorted_by_type=False):
    """dgl.nn.TypedLinear's forward, traced: ``x[i] @ W[x_type[i]]``."""
    if self.regularizer == "bdd":
        raise DSLError(f"TypedLinear with regularizer='bdd' (block-diagonal weights) is not "
                       f"supported by sarc's DGL front end (None and 'basis' are)", user_loc())
    if not (isinstance(x, Proxy) and isinstance(x_type, Proxy)):
        raise DSLError("TypedLinear needs traced features and a traced int64 type per row",
                       user_loc())
    return x.tracer.emit(Op.TYPED_LINEAR, [x, self.get_weight(), x_type])


def _refusal(name: str):
    def refuse(*args, **kwargs):
        raise DSLError(f"{name} is not supported by sarc's DGL front end (a sarc graph is one "
                       f"homogeneous block, fixed when the layer is traced)", user_loc())
    return refuse


@contextlib.contextmanager
def _dgl_routes(module: torch.nn.Module, graph: "ProxyGraph"):
    """While ``module`` is traced: DGL's edge_softmax is sarc's, its TypedLinear emits a typed
    linear, and DGL functions that change the graph are refused by name (in every loaded
    ``dgl`` module and in the user's code, ``trace_guards.code_namespaces``). (``torch.ones`` sized by ``g.num_edges()`` and the like are traced by
    ``trace_guards.tracing``: a graph size is a row count.)"""
    import dgl
    from dgl.nn.pytorch.linear import TypedLinear
    routes = {dgl.ops.edge_softmax: _edge_softmax}
    for name in dir(dgl.ops):
        if _dgl_op_parts(name) is not None:
            routes[getattr(dgl.ops, name)] = _dgl_op(name)
    for name in ("to_homogeneous", "to_heterogeneous", "add_self_loop", "remove_self_loop",
                 "to_bidirected", "add_reverse_edges", "to_simple", "node_subgraph",
                 "edge_subgraph", "in_subgraph", "reverse"):
        if hasattr(dgl, name):
            routes[getattr(dgl, name)] = _refusal(f"dgl.{name}")
    def spaces():
        return [vars(mod) for modname, mod in list(sys.modules.items())
                if mod is not None and (modname == "dgl" or modname.startswith("dgl."))
                ] + code_namespaces([module])
    forward = TypedLinear.forward
    try:
        TypedLinear.forward = _typed_linear
        with builtins_take_tensor_proxies(spaces, also=routes):
            yield
    finally:
        TypedLinear.forward = forward


@contextlib.contextmanager
def _scalar_buffers(module: torch.nn.Module):
    """Buffers of one element that are not PARAM leaves (``_params_as_proxies`` made the
    floating-point ones leaves) read as 0-d tensors (constants) while tracing."""
    saved = []
    try:
        for mod in module.modules():
            for name, buf in list(mod._buffers.items()):
                if isinstance(buf, torch.Tensor) and buf.numel() == 1 and buf.dim() == 1:
                    saved.append((mod, name, buf))
                    mod._buffers[name] = buf.detach().reshape(())
        yield
    finally:
        for mod, name, buf in saved:
            mod._buffers[name] = buf


# --- DGL's modules called on sarc graphs ---------------------------------------------------

def patch() -> None:
    """Make every module of ``dgl.nn.pytorch.conv`` run through sarc when its graph is a
    sarc graph: ``GraphConv(...)(g, x)`` with ``g`` a ``sarc.Graph`` or a worker's
    ``DistGraph`` runs the module as ``from_dgl_module`` would, on the same parameters;
    on a ``DGLGraph`` it runs DGL's own code. The features are declared from the first
    call's tensors (rows of nodes: node features; rows of edges: edge features; int64:
    types), one compiled layer per declaration; DGL's minibatch pair ``(h, h[:num_dst])``
    on a block is ``h``. Process-wide; calling it again is a no-op.
    """
    import inspect

    from dgl.nn.pytorch import conv
    for name in dir(conv):
        cls = getattr(conv, name)
        if (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)
                and "forward" in vars(cls) and not getattr(cls.forward, "_sarc_routed", False)):
            cls.forward = _routed(cls)
    from ..graph import on_missing_attribute
    on_missing_attribute(_not_a_dgl_graph)


def unpatch() -> None:
    """Undo ``patch()``: DGL's convs run DGL's own ``forward`` again on any graph, and a
    DGLGraph method called on a sarc graph is a plain AttributeError. Layers compiled
    while patched stay cached on their modules, unused."""
    import inspect

    from dgl.nn.pytorch import conv
    for name in dir(conv):
        cls = getattr(conv, name)
        if inspect.isclass(cls) and getattr(vars(cls).get("forward"), "_sarc_routed", False):
            cls.forward = cls.forward.__wrapped__
    from ..graph import off_missing_attribute
    off_missing_attribute(_not_a_dgl_graph)


class NotADGLGraphError(DSLError, AttributeError):
    """A module that is not one of DGL's convs used a ``DGLGraph`` method on a sarc graph."""


def _not_a_dgl_graph(self, name: str) -> None:
    """The hook sarc's graphs call, after ``patch()``, for an attribute they lack
    (``graph.on_missing_attribute``): a ``DGLGraph`` method a user's own module calls on a
    sarc graph (``g.local_scope()``, ``g.update_all``...) says how to run the module through
    sarc, instead of "'Graph' object has no attribute"."""
    import dgl
    if name.startswith("_") or not hasattr(dgl.DGLGraph, name):
        return
    caller = sys._getframe(2).f_locals.get("self")  # the reader (under graph.missing_attribute)
    who = (f"{type(caller).__name__}: " if isinstance(caller, torch.nn.Module) else "")
    raise NotADGLGraphError(
        f"{who}g.{name} on a sarc graph ({type(self).__name__}), which is not a DGLGraph: "
        f"patch() runs dgl.nn.pytorch.conv's modules through sarc by themselves; a module of "
        f"your own runs through sarc as sarc.frontends.dgl.from_dgl_module(module, "
        f"node={{...}}, edge={{...}}) called on the sarc graph (or call it on the DGL graph)",
        user_loc())


def _routed(cls):
    """``cls.forward`` run through sarc on a sarc graph (``patch``)."""
    import functools
    import inspect
    forward = cls.forward
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def run(self, graph, *args, **kwargs):
        if isinstance(graph, ProxyGraph) or not hasattr(graph, "run_layer"):
            return forward(self, graph, *args, **kwargs)   # a DGL graph, or sarc tracing it
        bound = signature.bind(self, graph, *args, **kwargs)
        names = list(signature.parameters)
        # a value given as its default (None, get_attention=False) is the default: the traced
        # forward takes it so
        feats = {k: v for k, v in bound.arguments.items() if k not in names[:2] and v is not None
                 and not _is_default(v, signature.parameters[k].default)
                 and not (k in _SPEED_ONLY and isinstance(v, bool))}
        owner = type(self).__name__
        for k, v in feats.items():
            if _is_pair(v):
                feats[k] = v = _source_of_pair(owner, k, v, graph)
            if not isinstance(v, torch.Tensor):
                raise DSLError(f"{owner}: argument {k}={_described(v)} on a sarc graph; sarc "
                               f"compiles the module's forward with tensor arguments only",
                               user_loc())
        if hasattr(graph, "check_call"):   # a mini-batch step: a block left for this call
            graph.check_call(self)
        if isinstance(feats.get("weight"), torch.Tensor):
            w = feats["weight"]
            raise DSLError(f"{owner}: an external weight argument (weight= a tensor of shape "
                           f"{list(w.shape)}) is not supported on a sarc graph: sarc compiles "
                           f"the module with its own parameters. Multiply the features first, "
                           f"conv(g, x @ W) (the same result: GraphConv's weight multiplies "
                           f"each node's features, before or after the aggregation), or build "
                           f"the module with weight=True", user_loc())
        layer = _rounds_for(self, feats) or _layer_for(self, graph, feats, cls)
        layer.train(self.training)
        return layer(graph, **feats)

    run._sarc_routed = True
    run._sarc_round_count = _round_count
    run._sarc_held = _held_layers
    return run


_SPEED_ONLY = frozenset({"presorted"})
"""Flags of DGL's convs that say how DGL may compute, not what (RelGraphConv's
``presorted``: the edges come sorted by type): read by DGL alone."""


def _is_default(value, default) -> bool:
    """``value`` is the plain constant ``default`` (a bool, number or string of its type)."""
    return (type(value) is type(default) and isinstance(value, (bool, int, float, str))
            and value == default)


def _round_count(module) -> int:
    """The rounds of message passing a patched conv runs on a sarc graph, before its first
    call made its layers: a sarc layer each (k for SGConv, TAGConv and APPNPConv with k > 1,
    1 for another conv): the blocks a mini-batch step gives it."""
    from .dgl_rounds import round_count
    return round_count(module)


def _held_layers(module) -> list[tuple[str, Layer]]:
    """The sarc layers a patched conv made at its calls so far (one per feature
    declaration; a K-round conv's rounds), named relative to the conv (``""``: the conv's
    own name; ``rounds.0``, ...; a further declaration ``~1``, ...)."""
    out: list[tuple[str, Layer]] = []
    for i, layer in enumerate(module.__dict__.get("_sarc_layers", {}).values()):
        out.append(("" if i == 0 else f"~{i}", layer))
    for i, rounds in enumerate(r for r in module.__dict__.get("_sarc_rounds", {}).values()
                               if r is not None):
        tag = "" if i == 0 else f"~{i}"
        out.extend((f"rounds{tag}.{k}", layer) for k, layer in enumerate(rounds.rounds))
    return out


def _described(v) -> str:
    """An argument as an error names it: a tensor by its shape, never its values."""
    if isinstance(v, torch.Tensor):
        return f"a tensor of shape {list(v.shape)}"
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_described(x) for x in v)
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    text = repr(v)
    return text if len(text) <= 60 else type(v).__name__


def _block_of(graph):
    """The block a call on ``graph`` runs on: a mini-batch step's next
    (``MiniBatchGraph.current``, whose edges alone are the step's), else the graph."""
    return getattr(graph, "current", graph)


def _builtin_extremum(func) -> str | None:
    """``max`` / ``min`` for DGL's builtin reducer of that name (``fn.max``), else None."""
    from dgl.function.reducer import SimpleReduceFunction
    name = getattr(func, "_name", None)
    return name if isinstance(func, SimpleReduceFunction) and name in ("max", "min") else None


def _is_pair(v) -> bool:
    return isinstance(v, tuple) and len(v) == 2


def _source_of_pair(owner: str, name: str, pair: tuple, graph) -> Any:
    """DGL's minibatch idiom ``conv(block, (h, h[:block.num_dst_nodes()]))``: sarc reads a
    block's destination features as the first source rows, so the pair is ``h``, when its
    second tensor is the first's leading num_dst rows (a view of them, or equal values);
    anything else is refused, saying what differs."""
    src, dst = pair
    if not (isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor)):
        return pair
    num_dst = _block_of(graph).num_dst
    if dst is src and src.dim() and src.shape[0] == num_dst:
        return src   # (h, h) on a graph: the same rows, gradient and all
    what = (f"argument {name}=(h_src {list(src.shape)}, h_dst {list(dst.shape)}): sarc reads a "
            f"block's destination features as the first num_dst ({num_dst}) rows of its source "
            f"features (DGL's block convention), so pass h_src alone")
    if src.dim() == 0 or dst.shape[1:] != src.shape[1:] or dst.shape[0] != num_dst:
        raise DSLError(f"{owner}: {what}; here h_dst is not h_src[:{num_dst}] (its shape is "
                       f"not [{num_dst}, {', '.join(map(str, src.shape[1:]))}])", user_loc())
    if src.shape[0] < num_dst:
        raise DSLError(f"{owner}: {what}; here h_src has fewer rows than the destinations",
                       user_loc())
    view = (dst.device == src.device and dst.dtype == src.dtype
            and dst.data_ptr() == src.data_ptr() and dst.stride() == src.stride())
    if src.requires_grad and torch.is_grad_enabled():   # h_dst must carry h_src's gradient,
        #                                                    as h_src[:num_dst] does
        base = src if src._base is None else src._base
        if not (view and dst.requires_grad and dst.grad_fn is not None and dst._base is base):
            raise DSLError(f"{owner}: {what}; here h_dst does not carry h_src's gradient as "
                           f"h_src[:{num_dst}] would (detached, copied or another tensor), and "
                           f"sarc would give h_src the destinations' gradient too", user_loc())
        return src
    if view:
        return src
    if dst.requires_grad:
        raise DSLError(f"{owner}: {what}; here h_dst is a separate tensor that takes a "
                       f"gradient (not a view of h_src[:{num_dst}]), which sarc would not "
                       f"give it", user_loc())
    if dst.dtype != src.dtype or dst.device != src.device:
        raise DSLError(f"{owner}: {what}; here h_dst's dtype or device differs from h_src's",
                       user_loc())
    if not torch.equal(src[:num_dst], dst):
        raise DSLError(f"{owner}: {what}; here h_dst's values differ from h_src[:{num_dst}]",
                       user_loc())
    return src


def _rounds_for(module, feats: Mapping[str, torch.Tensor]):
    """The ``DGLRounds`` of a stock K-round conv (k > 1) called on a sarc graph, kept on the
    module per feature width; None for another module."""
    from .dgl_rounds import rounds_of
    feat = feats.get("feat")
    width = feat.shape[1] if isinstance(feat, torch.Tensor) and feat.dim() == 2 else None
    cache = module.__dict__.setdefault("_sarc_rounds", {})
    if width in cache and cache[width] is not None and len(cache[width].rounds) != module._k:
        del cache[width]   # k set since: converted again
    if width not in cache:
        # an edge_weight given to the call is refused by the rounds' forward
        cache[width] = rounds_of(module, {"feat": width} if width else {}, {})
        for layer in cache[width].rounds if cache[width] is not None else ():
            layer.set_backend(_backend_of_made_layers(module))
    return cache[width]


NODE_ARGUMENTS = frozenset({"feat", "feats", "h", "x", "nfeat", "nfeats", "node_feat",
                            "node_feats", "coord_feat", "feat_0", "eig_vec", "ntype",
                            "node_type"})
EDGE_ARGUMENTS = frozenset({"edge_weight", "efeat", "efeats", "edge_feat", "edge_feats",
                            "e_feat", "etypes", "etype", "norm", "eweight", "pseudo",
                            "distances"})
"""The arguments of DGL's convs that are node (edge) data by their name, as DGL documents
them: read so where a tensor's rows fit both (a graph with as many edges as nodes)."""


def _dgls_forward(cls):
    """The forward DGL's class ``cls`` defines (under ``patch()``, the one it wraps)."""
    forward = vars(cls)["forward"]
    return getattr(forward, "__wrapped__", forward) if getattr(
        forward, "_sarc_routed", False) else forward


def _layer_for(module, graph, feats: Mapping[str, torch.Tensor], owner: type) -> DGLLayer:
    """The layer of a patched conv for the features of this call, declared from their
    tensors: rows of the graph's source nodes (a worker's local rows) are node features,
    rows of its edges edge features, 1-d int64 tensors types; ``owner``: DGL's class whose
    forward the call reached, which the layer traces. One layer per declaration and class,
    kept on the module. A tensor whose rows could be either (a block with as many edges
    as nodes) is what its argument's name says (``NODE_ARGUMENTS``, ``EDGE_ARGUMENTS``),
    else takes the declaration of an earlier call with the same names and shapes."""
    from ..dsl import INDEX, Feature
    block = _block_of(graph)
    num_nodes = next(getattr(block, a) for a in ("num_src", "num_local", "num_dst")
                     if hasattr(block, a))
    num_edges = graph.num_edges
    decls, sides = {}, {}
    for k, v in feats.items():
        rows = v.shape[0] if v.dim() else None
        sides[k] = {side for side, n in (("node", num_nodes), ("edge", num_edges)) if rows == n}
        decls[k] = (INDEX if v.dim() == 1 and not v.is_floating_point()
                    else Feature(tuple(v.shape[1:])))
    cache = module.__dict__.setdefault("_sarc_layers", {})

    def fits(key) -> bool:
        declared = {k: ("node", d) for k, d in key[0]} | {k: ("edge", d) for k, d in key[1]}
        return key[2] is owner and declared.keys() == feats.keys() and all(
            declared[k][0] in sides[k] and declared[k][1] == decls[k] for k in feats)
    for k in feats:   # as many rows as nodes and edges: DGL's convs name their arguments
        if sides[k] == {"node", "edge"} and k in NODE_ARGUMENTS | EDGE_ARGUMENTS:
            sides[k] = {"node" if k in NODE_ARGUMENTS else "edge"}
    unclear = [k for k in feats if len(sides[k]) != 1]
    if unclear:
        earlier = [key for key in cache if fits(key)]
        if len(earlier) == 1:
            return cache[earlier[0]]
        k = unclear[0]
        raise GraphError(f"{type(module).__name__}: cannot tell whether {k!r} "
                         f"({list(feats[k].shape)}) is per node ({num_nodes}) or per edge "
                         f"({num_edges}); declare it with sarc.frontends.dgl.from_dgl_module")
    node = {k: d for k, d in decls.items() if sides[k] == {"node"}}
    edge = {k: d for k, d in decls.items() if sides[k] == {"edge"}}
    key = (tuple(node.items()), tuple(edge.items()), owner)
    if key not in cache:
        cache[key] = DGLLayer(module, node=node, edge=edge,
                              backend=_backend_of_made_layers(module))
        cache[key].routed_class = owner
    return cache[key]


def _backend_of_made_layers(module) -> str:
    """The backend a patched conv's layers are made for: the one ``placed`` gave the model
    (``sarc.training.device``; it sets those made before), else torch's."""
    return module.__dict__.get(BACKEND_OF_MADE_LAYERS, "torch")
