"""Heterogeneous graphs as a homogeneous graph with an edge type per edge (``etype``)
and, optionally, a node type per node (``ntype``).

- ``HeteroConv({relation: layer, ...}, aggregate="sum")`` is DGL's ``HeteroGraphConv``:
  each relation's layer (any ``sarc.Layer``) runs on that relation's sub-graph alone
  (the edges whose ``etype`` is the relation, over the same nodes), and the outputs are
  combined per destination node by ``sum``, ``mean``, ``max`` or ``min``.
- ``TypedInput({ntype: in_width, ...}, out_width)`` projects each node type's features
  (of its own width, the first columns of a zero-padded matrix) to one width.

A relation's sub-graph has its own degrees (``dst.in_degree``, ``src.out_degree``,
``sarc.mean``'s counts are the relation's, as DGL computes them on a relation's graph).
On a worker's ``sarc.distributed.DistGraph`` (the whole graph's shard, or a mini-batch
step's block) without a memory budget, or under one the fetched rows fit
(``DistGraph.fetches_once``), the conv fetches each node input's boundary rows once for
all its relations (``sarc.distributed.halo``), and each relation's layer runs on its edges
of the worker's rows and those; under a budget they do not fit (or in ``sar`` or
``hybrid`` execution, or the SAR baseline) a
relation's sub-graph is a ``DistGraph`` of its own (``DistGraph.edge_subgraph``): its
layer exchanges only the rows its edges read, in its memory-bounded schedule, planned on
the relation's shard statistics. Sub-graphs are built on a graph's
first call with an ``etype`` tensor and kept with the graph for that ``etype``'s values
(compared at each call, as a change in place may not show in torch's version counter).

As in DGL, a relation counts for the nodes of its destination type: with ``ntype``, the
type every one of its destinations has (one per relation; its layer's output on nodes
of other types is left out), or for a relation without edges the type ``dst_types``
gives it; without, every node. A node no relation counts for gets 0.

In a mini-batch step (``sarc.training.minibatch``) a ``HeteroConv`` takes one block, and
each relation's layer runs on the block's edges of its relation. What a relation's
layer reads of the graph is the whole graph's, as a sarc layer's on a block is: its
degrees are the whole graph's relation's (found on the whole graph, which the step
evaluates on, and read at the block's rows), and so are the relations' destination
types and the check that every edge type has a layer. A relation without edges in a
block still runs (its layer's terms of the destinations themselves are its output, as
on the whole graph), so an MFG step equals the full-batch step on its seeds.
"""
from __future__ import annotations

import functools
import math
import operator
import weakref
from typing import Mapping, NamedTuple, Sequence

import torch
from torch import nn

from .dsl import Layer
from .errors import DSLError, GraphError
from .graph import Graph
from .trace import user_loc

AGGREGATES = ("sum", "mean", "max", "min")
"""How ``HeteroConv`` combines the relations' outputs at a destination node."""


class RelationRun(NamedTuple):
    """What a relation's layer runs on in one call: its graph, its edges' positions in the
    edge inputs, which nodes its output rows count for (``combine``'s ``counted``), and
    the rows of the node inputs it reads (None: all of them; a ``compact`` graph's
    sources)."""

    graph: object
    edges: torch.Tensor
    place: torch.Tensor | None
    rows: torch.Tensor | None = None


class HeteroConv(nn.Module):
    """One layer per relation, each on its relation's edges; outputs combined per node.

    ``layers`` maps a relation (an edge type id, or a name of ``relations``, the edge
    types' names in id order) to a ``sarc.Layer``. Called as
    ``conv(g, x, etype=etype, ntype=ntype, **features)``: ``x`` (and any positional
    features) go to every layer; a keyword feature goes to the layers that declare it,
    an edge feature cut to the relation's edges.

    ``dst_types`` maps a relation to the node type of its destinations, where the edges
    cannot say it: a relation without edges (DGL's heterograph knows each relation's
    types from its canonical edge type; a graph of one node id space knows them from the
    edges). With node types, such a relation runs for the nodes of that type; without, it
    runs for every node, as DGL runs a relation with no edges.
    """

    sarc_inputs = ("etype", "ntype")
    """What the trainer hands a model that holds this module (``sarc.dsl.edge_inputs_for``)."""

    def __init__(self, layers: Mapping[int | str, Layer], aggregate: str = "sum", *,
                 relations: Sequence[str] | None = None,
                 dst_types: Mapping[int | str, int] | None = None):
        super().__init__()
        if aggregate not in AGGREGATES:
            raise DSLError(f"HeteroConv: unknown aggregate {aggregate!r}; the aggregates: "
                           f"{', '.join(AGGREGATES)}", user_loc())
        if not layers:
            raise DSLError("HeteroConv needs at least one relation's layer", user_loc())
        if relations is not None:
            if not isinstance(relations, str):
                relations = tuple(relations)   # a generator read once
            if isinstance(relations, str) or not all(isinstance(r, str) for r in relations):
                raise DSLError(f"HeteroConv: relations= takes the edge types' names in id "
                               f"order, a list of str, got {relations!r}", user_loc())
            twice = sorted({r for r in relations if relations.count(r) > 1})
            if twice:
                raise DSLError(f"HeteroConv: relations= names {twice[0]!r} twice; each edge "
                               f"type has a name of its own", user_loc())
        self.aggregate = aggregate
        ids: dict[int, Layer] = {}
        for key, layer in layers.items():
            rid = _relation_id(key, relations)
            if rid in ids:
                raise DSLError(f"HeteroConv: relation {_named(rid, relations)} is given twice",
                               user_loc())
            if not isinstance(layer, Layer):
                raise DSLError(f"HeteroConv: the layer of relation {_named(rid, relations)} is "
                               f"a {type(layer).__name__}, not a sarc.Layer", user_loc())
            taken = [k for k in self.sarc_inputs if k in layer._sarc_edge or k in layer._sarc_node]
            if taken:
                raise DSLError(f"HeteroConv: the layer of relation {_named(rid, relations)} "
                               f"declares feature {taken[0]!r}, which HeteroConv takes itself "
                               f"(to pick each relation's edges and nodes; a relation's layer "
                               f"sees its one edge type): name the layer's feature otherwise",
                               user_loc())
            ids[rid] = layer
        self.relation_ids = tuple(ids)
        self.relation_names = tuple(relations) if relations is not None else None
        self.layers = nn.ModuleDict({str(rid): layer for rid, layer in ids.items()})
        self.dst_types = _dst_types(dst_types or {}, relations, self.relation_ids)
        self._check_widths()

    def _check_widths(self) -> None:
        shapes = {}
        for rid in self.relation_ids:
            fn = self.layers[str(rid)].trace()
            if len(fn.outputs) != 1:
                names = ", ".join(k for k, _ in fn.outputs)
                raise DSLError(f"HeteroConv: the layer of relation {self._name(rid)} has "
                               f"{len(fn.outputs)} outputs ({names}); a relation's layer "
                               f"returns one value per node", user_loc())
            shapes[rid] = tuple(fn[fn.outputs[0][1]].type.feat)
        first = self.relation_ids[0]
        for rid, shape in shapes.items():
            if shape != shapes[first]:
                raise DSLError(f"HeteroConv: aggregate {self.aggregate!r} combines outputs of one "
                               f"shape, but relation {self._name(first)}'s layer returns "
                               f"{list(shapes[first])} per node and relation {self._name(rid)}'s "
                               f"{list(shape)}", user_loc())

    def _name(self, rid: int) -> str:
        return _named(rid, self.relation_names)

    def forward(self, g, *args, etype: torch.Tensor, ntype: torch.Tensor | None = None,
                **feats):
        if torch.is_inference_mode_enabled():
            # the relations' graphs are kept for later calls, where a training call saves
            # them for its backward: made as ordinary tensors (no gradient is taken here)
            with torch.inference_mode(False), torch.no_grad():
                return self._forward(g, args, etype, ntype, feats)
        return self._forward(g, args, etype, ntype, feats)

    def _forward(self, g, args, etype, ntype, feats):
        unread = [k for k in feats if not any(k in m._sarc_edge or k in m._sarc_node
                                              for m in self.layers.values())]
        if unread:
            raise GraphError(f"HeteroConv: no relation's layer reads {', '.join(unread)}")
        take_block = getattr(type(g), "take_block", None)
        if take_block is not None:   # a mini-batch step's graph: this conv's block
            return self._on_block(take_block(g, self), args, etype, ntype, feats)
        if getattr(g, "fetches_once", False):   # a worker's shard, its fetches within budget
            return self._on_halo(g, args, etype, ntype, feats)
        rel = relation_graphs(g, etype, self.relation_ids, ntype, self.relation_names,
                              self.dst_types)
        if rel.types is not None and isinstance(g, Graph) and g.dst_in_src:
            return self._run(args, feats, {r: rel.compact_graph(g, r) for r in self.relation_ids},
                             g.num_dst)
        return self._run(args, feats, {r: RelationRun(rel.graph(g, r), rel.edges[r],
                                                      rel.counted(r))
                                       for r in self.relation_ids}, g.num_dst)

    def _run(self, args, feats, runs: dict[int, RelationRun], num_dst: int,
             nodes: dict | None = None, halo=None) -> torch.Tensor:
        """Each relation's layer on its ``RelationRun``, the outputs combined over the nodes
        each relation counts for. ``nodes``: the keyword features as node features, where
        they differ from ``feats`` (fetched rows); ``halo``: the worker's halo they were
        fetched to, where a training call records each layer's run (``Halo.layer_ran``)."""
        nodes = feats if nodes is None else nodes
        outs = []
        for rid in self.relation_ids:
            layer, run = self.layers[str(rid)], runs[rid]
            mine = {k: (v.index_select(0, run.edges) if k in layer._sarc_edge else
                        _rows_of(nodes[k], run.rows))
                    for k, v in feats.items() if k in layer._sarc_edge or k in layer._sarc_node}
            given = tuple(_rows_of(a, run.rows) for a in args)
            outs.append(layer(run.graph, *given, **mine))
            if halo is not None and torch.is_grad_enabled():
                halo.layer_ran(layer, given, mine)
        return combine(outs, [runs[r].place for r in self.relation_ids], self.aggregate,
                       num_dst)

    def _on_halo(self, g, args, etype, ntype, feats) -> torch.Tensor:
        """This conv on a worker's whole-graph ``DistGraph`` (``g.fetches_once``): each node
        input's boundary rows fetched once (``sarc.distributed.halo``), then each
        relation's layer on its edges of the worker's halo graph, normalized by the whole
        graph's relation degrees."""
        rel = relation_graphs(g, etype, self.relation_ids, ntype, self.relation_names,
                              self.dst_types, subgraphs=False)
        halo = g.halo()
        args, nodes = self._fetched(g, halo, args, feats)
        runs = {r: rel.halo_run(halo, r) for r in self.relation_ids}
        return self._run(args, feats, runs, g.num_dst, nodes, halo)

    def fetched_inputs(self, args, feats) -> list[tuple[str, torch.Tensor]]:
        """What a worker's halo fetches of a call's inputs (``sarc.distributed.halo``), by
        label: each positional tensor (``input<i>``) and each keyword feature some
        relation's layer reads as a node feature (its name)."""
        out = [(f"input{i}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        return out + [(k, v) for k, v in feats.items() if isinstance(v, torch.Tensor)
                      and any(k in m._sarc_node for m in self.layers.values())]

    def declared_fetches(self, needs_grad: bool) -> tuple[tuple[str, int, int, bool], ...]:
        """What a call's fetches are where no call was seen (``fetched_inputs``' labels):
        the first relation layer's node features, positionally, each ``(label, values a
        row, bytes a value, needs_grad)``: what a plan made before the first step prices."""
        first = next(iter(self.layers.values()))
        nodes = [t for n, t in first.trace().inputs().items() if n in first._sarc_node]
        return tuple((f"input{i}", math.prod(t.feat), t.dtype.to_torch().itemsize, needs_grad)
                     for i, t in enumerate(nodes))

    def _fetched(self, g, halo, args, feats) -> tuple[tuple, dict]:
        """The node inputs (``fetched_inputs``) on every row of ``halo``'s graph, each
        fetched once."""
        name = g.layer_name(self)
        got = {label: _fetched(halo, t, f"{name}.{label}", g.num_local)
               for label, t in self.fetched_inputs(args, feats)}
        args = tuple(got.get(f"input{i}", a) for i, a in enumerate(args))
        nodes = {k: got[k] for k in feats if k in got}
        return args, nodes

    def _on_block(self, call, args, etype, ntype, feats) -> torch.Tensor:
        """This conv on a mini-batch step's block (``call``: a ``BlockCall``): each relation's
        layer on the block's edges of the relation, normalized by the whole graph's
        relation degrees at the block's rows."""
        whole = call.whole
        if whole is None or call.rows is None or "etype" not in whole.edge_inputs:
            raise GraphError("HeteroConv in a mini-batch step reads the whole graph's relations "
                             "(its degrees and node types): the step has no whole graph with "
                             "an etype input")
        lo, hi = call.edges
        etype = torch.as_tensor(etype)
        if etype.dim() != 1 or etype.shape[0] != call.step_edges:
            raise GraphError(f"HeteroConv: etype must hold an edge type per edge of the step's "
                             f"blocks ({call.step_edges}), got shape {list(etype.shape)}")
        b = call.graph
        _step_types(etype, call)
        if ntype is not None:   # the step's input rows' types: the block's are the first
            ntype = _whole_types(torch.as_tensor(ntype)[:b.num_src], whole, call.rows)
        fetch = getattr(b, "fetches_once", False)   # a worker's block: its rows fetched once
        rel = relation_graphs(whole.graph, whole.edge_inputs["etype"], self.relation_ids,
                              None if ntype is None else whole.edge_inputs.get("ntype"),
                              self.relation_names, self.dst_types, compare=False,
                              subgraphs=not fetch)
        feats = {k: (v[lo:hi] if any(k in m._sarc_edge for m in self.layers.values()) else v)
                 for k, v in feats.items()}
        etype, rows = etype[lo:hi], call.rows
        keeps = [etype == r for r in self.relation_ids]
        degrees = [] if fetch else [tuple(d.index_select(0, rows.to(d.device))
                                          for d in rel.degrees(whole.graph, r))
                                    for r in self.relation_ids]
        counted = [None if ntype is None else ntype[:b.num_dst] == rel.dst_type[r]
                   for r in self.relation_ids]
        if ntype is not None and isinstance(b, Graph) and b.dst_in_src:
            graphs = {r: compact(b, k, c, d) for r, k, c, d in
                      zip(self.relation_ids, keeps, counted, degrees)}
            return self._run(args, feats, graphs, b.num_dst)
        if fetch:   # the whole graph's relation degrees of the block's rows, local and not
            halo, known = b.halo(), whole.graph.halo()
            at = known.positions(halo, rows)
            degrees = [tuple(d.index_select(0, at) for d in rel.halo_degrees_of(known, r))
                       for r in self.relation_ids]
            args, nodes = self._fetched(b, halo, args, feats)
            graphs = {r: _halo_run(halo.graph, k, c, d) for r, k, c, d in
                      zip(self.relation_ids, keeps, counted, degrees)}
            return self._run(args, feats, graphs, b.num_dst, nodes)
        subs = ([_edge_subgraph(b, k, d) for k, d in zip(keeps, degrees)] if isinstance(b, Graph)
                else b.edge_subgraphs(keeps, degrees))   # set up together
        graphs = {r: RelationRun(sub, torch.nonzero(k).squeeze(1), c)
                  for r, k, sub, c in zip(self.relation_ids, keeps, subs, counted)}
        return self._run(args, feats, graphs, b.num_dst)


def _halo_run(graph: Graph, keep: torch.Tensor, counted: torch.Tensor | None,
              degrees: tuple) -> RelationRun:
    """A relation's run on a worker's halo ``graph``: its edges ``keep`` marks there, over
    the rows of its destination type (``counted``) and the sources they read where there
    are node types (``compact``), else over every row; normalized by ``degrees``, the
    whole graph's relation's at every row."""
    if counted is not None:
        return compact(graph, keep, counted, degrees)
    return RelationRun(_edge_subgraph(graph, keep, degrees), torch.nonzero(keep).squeeze(1),
                       None)


def _fetched(halo, t, name: str, num_local: int):
    """A node input of a worker's rows on every row of ``halo``'s graph (anything that is
    not a tensor as it is)."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.dim() == 0 or t.shape[0] != num_local:
        raise GraphError(f"HeteroConv on a DistGraph: node input {name.split('.', 1)[1]} has "
                         f"shape {list(t.shape)}, not a row per local node ({num_local})")
    return halo.fetch(t, name)


def _step_types(etype: torch.Tensor, call) -> None:
    """The edge types a model gives a ``HeteroConv`` in a mini-batch step, checked to be the
    step's (its etype input, cut from the whole graph's): a relation's degrees and
    destination type are found over the whole graph's etype, so types the model makes
    otherwise (its own relabeling) would read another relation's."""
    given = (call.inputs or {}).get("etype")
    if given is None or etype is given:
        return
    other = torch.tensor([int(etype.shape != given.shape or not torch.equal(etype.to(given),
                                                                              given))],
                         device=given.device)
    _all_reduce(call.whole.graph, other, "max")   # every worker raises, none waits
    if int(other):
        raise GraphError("HeteroConv in a mini-batch step was given edge types other than the "
                         "step's (its etype input, which the trainer hands the model): a "
                         "relation's degrees and destination type are found over the whole "
                         "graph's etype, so pass the model's etype input unchanged")


def _whole_types(ntype: torch.Tensor, whole, rows: torch.Tensor) -> torch.Tensor:
    """The node types a model gives a ``HeteroConv`` in a mini-batch step (``ntype``, of the
    block's rows ``rows``), checked to be the whole graph's there: a relation's destination
    type is found over the whole graph, from its ``ntype`` input (the dataset's), so types
    the model makes otherwise (its own, relabeled) would count for other nodes."""
    known = whole.edge_inputs.get("ntype")
    if known is None:
        raise GraphError("HeteroConv in a mini-batch step was given node types, but the whole "
                         "graph has none (no ntype input, the dataset's): a relation's "
                         "destination type is found over the whole graph; give the dataset "
                         "an ntype array, or call the conv without ntype")
    known = torch.as_tensor(known).index_select(0, rows.to(known.device))
    other = torch.tensor([int(ntype.shape != known.shape or not torch.equal(ntype.to(known),
                                                                              known))],
                         device=known.device)
    _all_reduce(whole.graph, other, "max")   # every worker raises, none waits in an exchange
    if int(other):
        raise GraphError("HeteroConv in a mini-batch step was given node types other than the "
                         "whole graph's (the dataset's ntype, which the trainer hands the "
                         "model) at the step's rows: a relation's destination type is found "
                         "over the whole graph, so pass the model's ntype input unchanged")
    return ntype


def combine(outs: list[torch.Tensor], counted: list[torch.Tensor | None], aggregate: str,
            num_rows: int | None = None) -> torch.Tensor:
    """The relations' outputs ``outs`` combined per node, of ``num_rows`` nodes: over the
    relations that count for the node; 0 where none does. ``counted[i]`` says which nodes
    ``outs[i]`` counts for: None, every node (its rows); a bool mask per node (its rows);
    or the nodes its rows are (int64). A sum or a mean adds the relations one after
    another into one tensor (no tensor of every relation's output, no copy per relation).
    Outputs of several dtypes (layers under autocast, some ending in a product, some not)
    combine in their promoted dtype, as DGL's stack of them does."""
    n = outs[0].shape[0] if num_rows is None else num_rows
    dev = outs[0].device
    dt = functools.reduce(torch.promote_types, (o.dtype for o in outs))
    outs = [o.to(dt) for o in outs]
    if aggregate in ("sum", "mean"):   # into one tensor, in place, relation by relation
        total = outs[0].new_zeros(n, *outs[0].shape[1:])
        count = torch.zeros(n, dtype=dt, device=dev)
        for o, c in zip(outs, counted):
            if c is None:
                total.add_(o)
                count += 1
            elif c.dtype == torch.bool:
                total.add_(torch.where(c.reshape(-1, *([1] * (o.dim() - 1))), o,
                                       torch.zeros((), dtype=dt, device=dev)))
                count += c.to(dt)
            else:
                total.index_add_(0, c, o)
                count.index_add_(0, c, torch.ones(c.numel(), dtype=dt, device=dev))
        if aggregate == "sum":
            return total
        return total / count.clamp_min(1).reshape(-1, *([1] * (total.dim() - 1)))
    dense, masks = [], []
    for o, c in zip(outs, counted):
        if c is not None and c.dtype != torch.bool:   # the rows it gives, spread out
            o = o.new_zeros(n, *o.shape[1:]).index_put((c,), o)
            c = torch.zeros(n, dtype=torch.bool, device=dev).index_fill(0, c, True)
        dense.append(o)
        masks.append(torch.ones(n, dtype=torch.bool, device=dev) if c is None else c)
    stacked = torch.stack(dense)
    if all(c is None for c in counted):
        return _extremum(stacked, aggregate)
    mask = torch.stack(masks).reshape(len(masks), n, *([1] * (stacked.dim() - 2)))
    fill = float("-inf") if aggregate == "max" else float("inf")
    picked = torch.where(mask, stacked, torch.full((), fill, dtype=dt, device=dev))
    best = _extremum(picked, aggregate)
    return torch.where(mask.any(0), best, torch.zeros((), dtype=dt, device=dev))


def _extremum(stacked: torch.Tensor, aggregate: str) -> torch.Tensor:
    """The max (min) over the relations; on a tie the gradient goes to the first relation
    that attains it, as DGL's ``HeteroGraphConv`` (``torch.max`` over the stacked outputs)."""
    return (stacked.max(0) if aggregate == "max" else stacked.min(0)).values


class TypedInput(nn.Module):
    """Per node type, a linear map of that type's features to ``out_feats``.

    ``in_widths[t]`` is the width of type t's features: the first ``in_widths[t]`` columns
    of the input rows (a dataset's node features of types of different widths, padded
    with zeros to the widest). ``forward(x, ntype)`` gives ``[N, out_feats]``:
    ``x[v, :w_t] @ W_t + b_t`` for a node v of type t.
    """

    sarc_inputs = ("ntype",)

    def __init__(self, in_widths: Mapping[int, int], out_feats: int, bias: bool = True):
        super().__init__()
        if not in_widths:
            raise DSLError("TypedInput needs the input width of at least one node type",
                           user_loc())
        for t, w in in_widths.items():
            if not isinstance(t, int) or t < 0 or not isinstance(w, int) or w < 1:
                raise DSLError(f"TypedInput: node type {t!r} has width {w!r}; node types are "
                               f"ints >= 0 and widths ints >= 1", user_loc())
        self.in_widths = dict(in_widths)
        self.out_feats = out_feats
        self.lins = nn.ModuleDict({str(t): nn.Linear(w, out_feats, bias=bias)
                                   for t, w in self.in_widths.items()})

    def forward(self, x: torch.Tensor, ntype: torch.Tensor) -> torch.Tensor:
        if ntype.shape != (x.shape[0],):
            longer = ntype.dim() == 1 and ntype.shape[0] > x.shape[0]
            raise GraphError(f"TypedInput: ntype has shape {list(ntype.shape)}, but x has "
                             f"{x.shape[0]} rows (one node type per row)" +
                             ("; in mfg and sampling modes a layer's output has its block's "
                              "destination rows, the first of its input's: cut the node types "
                              "to them, ntype[:h.shape[0]]" if longer else ""))
        if ntype.dtype.is_floating_point or ntype.dtype.is_complex or ntype.dtype is torch.bool:
            raise GraphError(f"TypedInput: ntype must hold integer node types, got "
                             f"{ntype.dtype}")
        present = torch.unique(ntype).tolist()
        unknown = [t for t in present if t not in self.in_widths]
        if unknown:
            given = ", ".join(map(str, sorted(self.in_widths)))
            raise GraphError(f"TypedInput: no input width for node type "
                             f"{', '.join(map(str, unknown))} (widths are given for types "
                             f"{given})")
        out = x.new_zeros(x.shape[0], self.out_feats)
        for t in present:
            w = self.in_widths[t]
            if w > x.shape[1]:
                raise GraphError(f"TypedInput: node type {t}'s features are {w} wide, but x "
                                 f"has {x.shape[1]} columns")
            rows = torch.nonzero(ntype == t).squeeze(1)
            out = out.index_put((rows,), self.lins[str(t)](x.index_select(0, rows)[:, :w]))
        return out


# --- relation sub-graphs ------------------------------------------------------------------

class _Kept:
    """A tensor's values, copied (the caller's may change in place), and the tensor itself
    with its version counter, to know it again without comparing values."""

    def __init__(self, t: torch.Tensor):
        self.values, self.given, self.version = t.clone(), t, _version(t)

    def is_unchanged(self, t: torch.Tensor) -> bool:
        version = _version(t)
        return t is self.given and version is not None and version == self.version

    def holds(self, t: torch.Tensor, compare: bool = True) -> bool:
        """``t`` holds the kept values: equal ones (``compare``: compared, since a write
        through a numpy view or ``.data`` leaves the version counter as it was), or
        without ``compare`` the same unchanged tensor (a run's own input)."""
        return (not compare and self.is_unchanged(t)) or (t.shape == self.values.shape
                                        and torch.equal(t, self.values))


class RelationGraphs:
    """The sub-graphs of some relations of one graph (and, with node types, the nodes each
    relation counts for). On a ``DistGraph`` each relation's sub-graph is made with its
    edges (collectively); on a ``Graph`` at first use (``graph``): one process with node
    types runs the ``compact`` ones, and a mini-batch step reads only their degrees."""

    def __init__(self, etype: torch.Tensor):
        self.etype = _Kept(etype)
        self.edges: dict[int, torch.Tensor] = {}  # relation -> its edges' positions
        self.graphs: dict[int, object] = {}       # relation -> its sub-graph
        self._degrees: dict[int, tuple] = {}      # relation -> its rows' in- and out-degrees
        self.dst_type: dict[int, int] = {}        # relation -> its destinations' node type
        self.types: _Kept | None = None           # the node types dst_type was found with
        self.num_dst = 0
        self.edge_counts: torch.Tensor | None = None   # edges per edge type, whole graph
        self.carried: frozenset[int] = frozenset()     # the edge types with edges
        self.checked: set[tuple] = set()          # relation sets _check_relations passed (and
        #                                           the convs' dst_types and names)
        self.compacts: dict[int, RelationRun] = {}  # relation -> its compact graph (types')
        # a DistGraph's halo (sarc.distributed.halo): every relation's degrees on its rows,
        # and per relation what its layer runs on there (types')
        self.halo_degrees: dict[int, tuple] | None = None
        self.halo_runs: dict[int, RelationRun] = {}

    def same_types(self, ntype: torch.Tensor | None, compare: bool = True) -> bool:
        """Whether ``ntype`` holds the node types ``dst_type`` was found with."""
        if ntype is None or self.types is None:
            return ntype is None and self.types is None
        return self.types.holds(torch.as_tensor(ntype), compare)

    def graph(self, g, rid: int):
        """Relation ``rid``'s sub-graph of ``g``: its edges over the same nodes."""
        if rid not in self.graphs:   # a Graph's, made at first use
            self.graphs[rid] = _edge_subgraph(g, self._keep(g, rid))
        return self.graphs[rid]

    def degrees(self, g, rid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The in- and out-degree of each of ``g``'s local rows in relation ``rid`` (a
        ``Graph``'s counted on its edges, without its sub-graph; a DistGraph's found on its
        halo where its relations' sub-graphs were not made)."""
        if rid in self.graphs:
            return _local_degrees(self.graphs[rid])
        if not isinstance(g, Graph):
            ins, outs = self.halo_degrees_of(g.halo(), rid)
            return ins[:g.num_local], outs[:g.num_local]
        if rid not in self._degrees:   # every relation's at once: one pass to input order
            ends = g.input_edges()
            for r, edges in self.edges.items():
                if r not in self._degrees:
                    src, dst = (e.index_select(0, edges) for e in ends)
                    self._degrees[r] = tuple(torch.bincount(e, minlength=g.num_src)
                                             .to(torch.float32) for e in (dst, src))
        return self._degrees[rid]

    def _keep(self, g, rid: int) -> torch.Tensor:
        keep = torch.zeros(g.num_edges, dtype=torch.bool, device=g.perm.device)
        keep[self.edges[rid]] = True
        return keep

    def counted(self, rid: int) -> torch.Tensor | None:
        if self.types is None:
            return None
        return self.types.values[:self.num_dst] == self.dst_type[rid]

    def halo_degrees_of(self, halo, rid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Relation ``rid``'s whole-graph in- and out-degree of every row of ``halo``'s
        graph: found for every relation with edges at first need (collective), 0 for one
        without."""
        if self.halo_degrees is None:
            self.halo_degrees = halo.relation_degrees(self.etype.values, sorted(self.carried))
        if rid not in self.halo_degrees:
            zero = torch.zeros(halo.num_rows, dtype=torch.float32, device=halo.graph.perm.device)
            return zero, zero
        return self.halo_degrees[rid]

    def halo_run(self, halo, rid: int) -> RelationRun:
        """What relation ``rid``'s layer runs on in a worker's halo (``halo``,
        ``_halo_run``), made at first use."""
        if rid not in self.halo_runs:
            self.halo_runs[rid] = _halo_run(halo.graph, self._keep(halo.graph, rid),
                                            self.counted(rid), self.halo_degrees_of(halo, rid))
        return self.halo_runs[rid]

    def compact_graph(self, g: Graph, rid: int) -> RelationRun:
        """Relation ``rid``'s ``compact`` graph of ``g`` (over the nodes of its destination
        type and the sources its edges read), made at first use for these node types."""
        if rid not in self.compacts:
            self.compacts[rid] = compact(g, self._keep(g, rid), self.counted(rid))
        return self.compacts[rid]


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place change); None where it keeps none
    (an inference-mode tensor)."""
    try:
        return t._version
    except RuntimeError:   # inference mode
        return None


def call_blocks(model: nn.Module, layers) -> list[int]:
    """The block each of a step's sarc layer calls runs on (``layers``: the called layers,
    in call order): a block each, but the relations' layers of one ``sarc.HeteroConv``
    call share its block (``MiniBatchGraph.take_block``)."""
    conv_of = {id(sub): id(c) for c in model.modules() if isinstance(c, HeteroConv)
               for sub in c.modules() if sub is not c}
    out, last = [], None
    for layer in layers:
        conv = conv_of.get(id(layer))
        out.append((out[-1] if out else -1) + (conv is None or conv != last))
        last = conv
    return out


def relation_fetches(model: nn.Module, layers: Sequence[Layer]) -> tuple[list[bool], int] | None:
    """What ``model``'s HeteroConvs fetch where they fetch their inputs once (priced by
    ``sarc.planner.plan.fetch_within``): per layer of ``layers`` (a step's sarc layers)
    whether it is a relation's (runs on the fetched rows), and the bytes of a fetched row,
    every conv's inputs together (``declared_fetches``); None without a conv."""
    convs = [m for m in model.modules() if isinstance(m, HeteroConv)]
    if not convs:
        return None
    relations = {id(layer) for conv in convs for layer in conv.layers.values()}
    row = sum(width * size for conv in convs
              for _, width, size, _ in conv.declared_fetches(True))
    return [id(layer) in relations for layer in layers], row


def relation_graphs(g, etype: torch.Tensor, relations: Sequence[int],
                    ntype: torch.Tensor | None = None,
                    names: Sequence[str] | None = None,
                    dst_types: Mapping[int, int] | None = None,
                    compare: bool = True, subgraphs: bool = True) -> RelationGraphs:
    """Each of ``relations``' sub-graph of ``g`` (a ``Graph`` or a full-graph
    ``DistGraph``; on a DistGraph collective), kept with ``g`` for the same ``etype``.
    With node types, a relation whose destinations are of several types, or without
    edges and not in ``dst_types``, or whose edges' type is not the one ``dst_types``
    gives, is a ``GraphError``. The kept sub-graphs serve an ``etype`` (``ntype``) of the
    kept values: compared (O(E), as a layer's pass over the edges), so a change made in
    place is seen even where torch's version counter misses it (numpy writing into it,
    ``.data``); without ``compare`` (the whole graph's inputs of a mini-batch run, which
    the run keeps), the same unchanged tensor is known by its version counter. Without
    ``subgraphs`` a DistGraph's relations get no sub-graphs of their own (its conv runs
    them on the worker's halo, ``HeteroConv._on_halo``)."""
    dst_types = dst_types or {}
    if not isinstance(g, Graph) and not hasattr(g, "edge_subgraph"):
        raise GraphError(f"HeteroConv runs on a sarc.Graph, a worker's DistGraph or a "
                         f"mini-batch step's blocks, got {type(g).__name__}")
    etype = torch.as_tensor(etype)
    if etype.shape != (g.num_edges,) or etype.dtype.is_floating_point:
        raise GraphError(f"HeteroConv: etype must hold an integer edge type per edge "
                         f"({g.num_edges}), got {etype.dtype} of shape {list(etype.shape)}")
    entries = _CACHE.setdefault(g, [])
    rel = None if compare else next((e for e in entries if e.etype.is_unchanged(etype)), None)
    if rel is None:
        rel = next((e for e in entries if e.etype.holds(etype)), None)
    if rel is None:
        rel = RelationGraphs(etype)
        entries.append(rel)
    # a DistGraph's relations whose sub-graphs were not made (found by a halo's call) too
    missing = [r for r in relations if r not in rel.edges or (
        subgraphs and not isinstance(g, Graph) and r not in rel.graphs)]
    if not rel.same_types(ntype, compare):   # found with other types: found again, as asked
        rel.dst_type.clear()
        rel.compacts.clear()
        rel.halo_runs.clear()
        rel.types = None
    if rel.edge_counts is None:   # once: read at every call without a device sync
        rel.edge_counts = _count_edges(g, etype)
        rel.carried = frozenset(torch.nonzero(rel.edge_counts).squeeze(1).tolist())
    key = (tuple(relations), tuple(sorted(dst_types)), None if names is None else len(names))
    if key not in rel.checked:   # once per conv's relations: not at every call
        _check_relations(rel, relations, names, dst_types)
        rel.checked.add(key)
    if ntype is not None:
        _dst_types_of(g, rel, etype, relations, ntype, names, dst_types)
    keeps = [etype == r for r in missing]
    subs = (g.edge_subgraphs(keeps) if subgraphs and not isinstance(g, Graph) and keeps
            else [None] * len(keeps))   # on every worker
    for r, keep, sub in zip(missing, keeps, subs):   # kept once all are made
        rel.edges[r] = torch.nonzero(keep).squeeze(1)
        if sub is not None:
            rel.graphs[r] = sub
    return rel


def _dst_types_of(g, rel: RelationGraphs, etype, relations, ntype, names,
                  dst_types: Mapping[int, int]) -> None:
    """Each relation's destination type in ``rel.dst_type``: found over the whole graph for
    a relation with edges (once per node types), the conv's ``dst_types`` entry for one
    without (its own: two convs may give it two types)."""
    empty = {r for r in relations if r not in rel.carried}
    for r in relations:
        if r in empty and r not in dst_types:
            raise GraphError(f"HeteroConv: relation {_named(r, names)} has no edges in the "
                             f"graph, so the node type it counts for is not known: give it, "
                             f"HeteroConv(..., dst_types={{{r}: <its destinations' node "
                             f"type>}}) (its edge types are the etype values the edges carry)")
    if rel.types is None or any(r not in rel.dst_type for r in relations if r not in empty):
        _find_dst_types(g, rel, etype, [r for r in relations if r not in empty], ntype, names)
    for r in relations:
        if r in empty and rel.dst_type.get(r) != dst_types[r]:
            rel.dst_type[r] = dst_types[r]
            rel.compacts.pop(r, None)   # made for another type
            rel.halo_runs.pop(r, None)
        elif r not in empty and rel.dst_type[r] != dst_types.get(r, rel.dst_type[r]):
            raise GraphError(f"HeteroConv: relation {_named(r, names)} is given destination "
                             f"node type {dst_types[r]} (dst_types), but its edges go into "
                             f"nodes of type {rel.dst_type[r]}")


def _edge_subgraph(g: Graph, keep: torch.Tensor, degrees: tuple | None = None) -> Graph:
    """The sub-graph of ``g``'s edges ``keep`` marks (in their input order), over the same
    nodes; ``degrees``: the in- and out-degree of each source row, to read instead of the
    kept edges' counts (a block's, in the whole graph)."""
    src, dst = g.input_edges()
    given = {} if degrees is None else {"in_degree": degrees[0][:g.num_dst],
                                        "out_degree": degrees[1], "src_in_degree": degrees[0]}
    return Graph.from_edges(src[keep], dst[keep], num_src=g.num_src, num_dst=g.num_dst,
                            dst_in_src=g.dst_in_src, **given)


def compact(g: Graph, keep: torch.Tensor, counted: torch.Tensor,
            degrees: tuple | None = None) -> RelationRun:
    """The sub-graph of ``g``'s edges ``keep`` marks (in their input order) over the nodes
    its layer computes for: the destinations ``counted`` marks (bool per destination, a
    relation's destination type), then the other sources those edges read, as a block
    (its output rows count for those destinations; its inputs are those sources' rows).
    Its degrees are counted on the kept edges, or read from ``degrees`` (each of ``g``'s
    source rows' in- and out-degree)."""
    src, dst = (ends[keep] for ends in g.input_edges())
    dst_rows = torch.nonzero(counted).squeeze(1)
    is_dst = torch.zeros(g.num_src, dtype=torch.bool, device=src.device)
    is_dst[dst_rows] = True
    rows = torch.cat([dst_rows, torch.unique(src[~is_dst[src]])])
    at = torch.full((g.num_src,), -1, dtype=torch.int64, device=src.device)
    at[rows] = torch.arange(rows.numel(), device=src.device)
    src, dst = at[src], at[dst]
    if degrees is None:
        in_degree = torch.bincount(dst, minlength=rows.numel()).to(torch.float32)
        out_degree = None
    else:
        in_degree, out_degree = (d.index_select(0, rows) for d in degrees)
    sub = Graph.from_edges(src, dst, num_src=rows.numel(), num_dst=dst_rows.numel(),
                           in_degree=in_degree[:dst_rows.numel()], out_degree=out_degree,
                           src_in_degree=in_degree)
    return RelationRun(sub, torch.nonzero(keep).squeeze(1), dst_rows, rows)


def _rows_of(t, rows: torch.Tensor | None):
    """A node input's ``rows`` (None: all of it); anything else as it is."""
    if rows is None or not isinstance(t, torch.Tensor):
        return t
    return t.index_select(0, rows)


def _local_degrees(g) -> tuple[torch.Tensor, torch.Tensor]:
    """The in- and out-degree of each of ``g``'s local rows (a whole graph's relation: a
    ``Graph`` over every node, or a worker's full-graph ``DistGraph``)."""
    if isinstance(g, Graph):
        return g.in_degree, g.out_degree
    return g.shard.in_degree, g.shard.out_degree


def _count_edges(g, etype: torch.Tensor) -> torch.Tensor:
    """The edges of each edge type over the whole graph (on a DistGraph collective)."""
    ends = torch.tensor([int(etype.max()) + 1, -int(etype.min())] if etype.numel() else
                        [0, 0], dtype=torch.int64, device=g.device)
    _all_reduce(g, ends, "max")
    if int(ends[1]) > 0:
        raise GraphError(f"HeteroConv: etype holds negative edge types (down to "
                         f"{-int(ends[1])}); edge types are ids >= 0")
    counts = torch.bincount(etype.to(torch.int64), minlength=int(ends[0])).to(g.device)
    _all_reduce(g, counts, "sum")
    return counts


def _check_relations(rel: RelationGraphs, relations, names, dst_types) -> None:
    """Every edge is of one of ``relations`` (DGL's HeteroGraphConv refuses a relation of the
    graph it has no module for: its edges would be left out silently). A relation without
    edges runs, as DGL runs one of the graph's (with node types, for the type ``dst_types``
    gives it); one past every edge type the edges carry is the graph's only where said so:
    among the ``relations`` names, or in ``dst_types`` (else a relation the graph lacks, a
    typo, which DGL would not run)."""
    counts = rel.edge_counts
    beyond = [r for r in relations if r >= counts.numel() and r not in dst_types
              and (names is None or r >= len(names))]
    others = sorted(rel.carried.difference(relations))
    if beyond and not others:
        raise GraphError(f"HeteroConv: relation {_named(beyond[0], names)} is past every edge "
                         f"type the graph's edges carry (0..{counts.numel() - 1}): a relation "
                         f"the graph lacks? A relation of the graph without edges is said so "
                         f"by its name among relations=[...], or by its node type in "
                         f"dst_types={{{beyond[0]}: ...}}")
    if others:
        shown = ", ".join(map(str, others[:8])) + (" ..." if len(others) > 8 else "")
        empty = [_named(r, names) for r in relations if r not in rel.carried]
        hint = (f"; relation {', '.join(empty)} {'has' if len(empty) == 1 else 'have'} a "
                f"layer but no edges in the graph" if empty else "")
        raise GraphError(f"HeteroConv: the graph has edges of edge types {shown}, which no "
                         f"relation's layer is given for: give each edge type of the graph a "
                         f"layer, or leave its edges out of the graph{hint}")


def _find_dst_types(g, rel: RelationGraphs, etype, relations, ntype, names) -> None:
    """Each of ``relations``' (with edges) destinations' node type, over the whole graph
    (collective on a DistGraph): destinations of two types are an error."""
    dst = g.input_dst   # each edge's destination, in the graph's edge order
    num_dst = g.num_dst
    ntype = torch.as_tensor(ntype)
    if (ntype.dim() != 1 or ntype.shape[0] < num_dst or ntype.dtype.is_floating_point
            or ntype.dtype is torch.bool or (ntype.numel() and int(ntype.min()) < 0)):
        raise GraphError(f"HeteroConv: ntype must hold an integer node type (>= 0) per node "
                         f"({num_dst}), got {ntype.dtype} of shape {list(ntype.shape)}")
    top = torch.tensor([int(ntype.max()) if ntype.numel() else 0],
                       dtype=torch.int64, device=g.device)
    _all_reduce(g, top, "max")
    types = int(top) + 1
    table = torch.zeros(len(relations), types, dtype=torch.int64, device=g.device)
    for i, r in enumerate(relations):
        table[i] = torch.bincount(ntype.index_select(0, dst[etype == r]),
                                  minlength=types)[:types]
    _all_reduce(g, table, "sum")
    for i, r in enumerate(relations):
        seen = torch.nonzero(table[i]).squeeze(1).tolist()
        if len(seen) > 1:
            raise GraphError(f"HeteroConv: relation {_named(r, names)} has destinations of "
                             f"node types {', '.join(map(str, seen))}; a relation counts for "
                             f"the nodes of one type (split it into one edge type per "
                             f"destination type)")
        rel.dst_type[r] = seen[0]
    rel.num_dst, rel.types = num_dst, _Kept(ntype)


def _all_reduce(g, t: torch.Tensor, op: str) -> None:
    """Over the workers of a DistGraph (nothing on a Graph)."""
    if isinstance(g, Graph):
        return
    import torch.distributed as dist
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM,
                    group=g.group)


def _dst_types(given: Mapping, names: Sequence[str] | None, relations) -> dict[int, int]:
    """``HeteroConv``'s ``dst_types``, keyed by relation id; each a relation of the conv and
    a node type (an int >= 0)."""
    out = {}
    for key, t in given.items():
        rid = _relation_id(key, names)
        if rid not in relations:
            raise DSLError(f"HeteroConv: dst_types gives relation {_named(rid, names)}, which "
                           f"has no layer", user_loc())
        try:
            t = operator.index(t)   # numpy's integers too
        except TypeError:
            t = -1
        if isinstance(given[key], bool) or t < 0:
            raise DSLError(f"HeteroConv: dst_types gives relation {_named(rid, names)} node "
                           f"type {given[key]!r}; a node type is an int >= 0", user_loc())
        out[rid] = t
    return out


def _relation_id(key, names: Sequence[str] | None) -> int:
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise DSLError(f"HeteroConv: a relation is an edge type id (int) or name (str), "
                       f"got {key!r}", user_loc())
    if isinstance(key, str):
        if names is None:
            raise DSLError(f"HeteroConv: relation {key!r} is a name, but no relations=[...] "
                           f"(the edge types' names, in id order) was given", user_loc())
        if key not in names:
            raise DSLError(f"HeteroConv: relation {key!r} is not one of the {len(names)} "
                           f"relation names given", user_loc())
        return list(names).index(key)
    if key < 0 or (names is not None and key >= len(names)):
        bound = f" (relations 0..{len(names) - 1})" if names is not None else ""
        raise DSLError(f"HeteroConv: relation id {key} is out of range{bound}", user_loc())
    return key


def _named(rid: int, names: Sequence[str] | None) -> str:
    return f"{rid} ({names[rid]!r})" if names is not None and rid < len(names) else str(rid)
