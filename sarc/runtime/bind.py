"""Checking and binding a layer call's tensors before any kernel runs.

Every problem with the data (a missing feature, a wrong row count, a wrong
feature shape or dtype, a type id outside the table it indexes) is a ``GraphError``
(a ``ValueError``) naming the feature, what was expected and what was given.
"""
from __future__ import annotations

import weakref
from typing import Mapping

import torch

from ..amp import autocast_state
from ..errors import GraphError
from ..graph import Graph, derived
from ..ir.function import Function, Region
from ..ir.ops import Op
from ..ir.types import Domain

BUILTINS = ("in_degree", "out_degree")


def bind_inputs(layer, fn: Function, g, args: tuple, feats: Mapping) -> dict[str, torch.Tensor]:
    if not isinstance(g, Graph):
        raise GraphError(f"a sarc layer runs on a sarc.Graph, got {type(g).__name__} "
                         f"(build one with sarc.Graph.from_edges or sarc.interop)")
    if not g.dst_in_src:
        # Its node features would be the source rows only, read as dst rows too.
        raise GraphError(f"{g!r} is a split block (its dst nodes are not its first src nodes, "
                         f"as in a shard's block of remote edges); a layer runs on a block "
                         f"with dst_in_src=True")
    given = resolve_features(layer, args, feats)
    check_source_in_degree(layer, fn, g)
    node = layer._sarc_node
    # the sources' in-degrees where a source reads one (a destination's are their first rows)
    in_degree = g.source_in_degree if reads_source_in_degree(layer, fn) else g.in_degree
    out: dict[str, torch.Tensor] = {}
    for name, t in fn.inputs().items():
        if name in BUILTINS and name not in node:
            degree = g.out_degree if name == "out_degree" else in_degree
            out[name] = degree.to(t.dtype.to_torch())  # in the layer's precision
            continue
        is_edge = t.domain is Domain.EDGE
        x = check_feature(layer, name, given, t, g.num_edges if is_edge else g.num_src,
                          "edges" if is_edge else "source nodes", g.device)
        if is_edge:
            x = in_csr_order(x, g, name)
        out[name] = x
    check_type_ids(layer, fn, out)
    return out


def reads_source_in_degree(layer, fn: Function) -> bool:
    """Whether ``fn`` (``layer``'s trace) reads the built-in in-degree of source nodes."""
    return "in_degree" not in layer._sarc_node and any(
        v.op is Op.INPUT and v.attr["name"] == "in_degree" and v.type.domain is Domain.SRC
        for v in fn.values)


def check_source_in_degree(layer, fn: Function, g: Graph) -> None:
    """A layer reading its sources' in-degree (``src.in_degree``; DGL's SGConv, TAGConv and
    GCN2Conv scale source features by ``g.in_degrees()``) runs where the graph knows it
    (``Graph.source_in_degree``): every source a destination (a whole graph), or a block
    built with its sources' in-degrees (a mini-batch step's, ``src_in_degree``). A worker's
    shard always has them: its rows' in the whole graph."""
    if g.source_in_degree is None and reads_source_in_degree(layer, fn):
        raise GraphError(f"{layer.display_name()} reads the in-degree of source nodes "
                         f"(src.in_degree, or DGL's g.in_degrees() scaling source features), "
                         f"which this block does not know: it has {g.num_src} sources for "
                         f"{g.num_dst} destinations, and the in-edges of the others are not "
                         f"in it; build it with Graph.from_edges(..., src_in_degree=) (their "
                         f"in-degrees in the whole graph, as sarc's mini-batch blocks are)")


_INDEXED = {Op.INDEX: (0, 1), Op.TYPED_LINEAR: (1, 2)}
"""The ops that index a table by an integer value: op -> (table operand, index operand)."""


class _ByIdentity:
    """A value kept per live object, by identity, holding the object weakly: a later call
    with the same object finds it. Entries of dead objects go once ``limit`` are kept."""

    def __init__(self, limit: int = 256):
        self._entries: dict[int, tuple] = {}
        self._limit = limit

    def get(self, obj):
        hit = self._entries.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    def put(self, obj, value) -> None:
        if len(self._entries) > self._limit:
            for k in [k for k, (ref, _) in self._entries.items() if ref() is None]:
                del self._entries[k]
        self._entries[id(obj)] = (weakref.ref(obj), value)


_TABLES = _ByIdentity()
"""fn -> its type_id_tables: found once per compiled function."""


def type_id_tables(fn: Function) -> dict[str, tuple[int, str]]:
    """Integer input -> (rows of the smallest table it indexes, that table's name): the
    range its ids must be in (``W[edge.etype]``, ``TypedLinear(x, edge.etype)``), found in
    ``fn`` and in the regions its fused ops hold."""
    table = _TABLES.get(fn)
    if table is None:
        table = _find_tables(fn)
        _TABLES.put(fn, table)
    return table


def _find_tables(fn: Function) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}

    def walk(values, outer):
        for v in values:
            for attr in v.attr.values():
                if isinstance(attr, Region):
                    walk(attr.values, (values, v, outer))
            if v.op not in _INDEXED:
                continue
            t, i = _INDEXED[v.op]
            table, index = _origin(values, v.inputs[t], outer), _origin(values, v.inputs[i], outer)
            if index.op is not Op.INPUT or not table.type.feat:
                continue
            rows, name = table.type.feat[0], index.attr["name"]
            what = f"parameter {table.attr['name']!r}" if table.op is Op.PARAM else "a table"
            if name not in out or rows < out[name][0]:
                out[name] = (rows, what)

    walk(fn.values, None)
    return out


def _origin(values, j: int, outer):
    """Value ``j`` of ``values`` seen through a region's arguments (``outer``: the values
    holding the region, the fused op, their own outer) and through reshapes and gathers
    (``src.ntype``, ``edge.etype.view(-1)``): an input, a parameter, or what made it."""
    v = values[j]
    while True:
        if v.op is Op.ARG and outer is not None:
            values, fused, outer = outer
            v = values[fused.inputs[v.attr["index"]]]
        elif v.op in (Op.RESHAPE, Op.GATHER_SRC, Op.GATHER_DST):
            v = values[v.inputs[0]]
        else:
            return v


_CHECKED = _ByIdentity()
"""ids -> (its version, 1 + its largest id): a type-id tensor found in range, which the
next call need not scan again (a scan on a GPU waits for it)."""


def check_type_ids(layer, fn: Function, inputs: Mapping[str, torch.Tensor]) -> None:
    """Every id of an integer input indexes the tables it is used with: an id out of range
    would read another type's weights (a negative one wraps in torch) or past the table."""
    for name, (rows, table) in type_id_tables(fn).items():
        x = inputs.get(name)
        if x is None or not x.numel():
            continue
        hit = _CHECKED.get(x)
        if hit is not None and hit[0] == x._version and hit[1] <= rows:
            continue  # the same ids, unchanged, found in range of a table no larger
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi >= rows:
            raise GraphError(f"feature {name!r} holds type ids in "
                             f"[{lo}, {hi}], but it indexes {table} of {rows} rows (ids 0.."
                             f"{rows - 1})")
        _CHECKED.put(x, (x._version, hi + 1))


def in_csr_order(x: torch.Tensor, g: Graph, name: str) -> torch.Tensor:
    """Edge input ``x`` (given in the input edge order) in the graph's CSR order. An integer
    input (type ids) is permuted once per graph and tensor while unchanged, the copy kept
    with the graph (``graph.derived``, one per input name): the same tensor each call, so
    what the kernels derive from it (Triton's node x type graph) is built once. A float
    input is permuted on every call, its gradient flowing back through the permutation."""
    if x.is_floating_point():
        return x.index_select(0, g.perm)
    return derived(g, ("csr order", name), x, lambda: x.index_select(0, g.perm))


def resolve_features(layer, args: tuple, feats: Mapping) -> dict[str, object]:
    """The features of a layer call by name: positional ones in declaration order (node
    features, then edge features), a single mapping, or keywords."""
    node, edge = layer._sarc_node, layer._sarc_edge
    given = dict(feats)
    if len(args) == 1 and isinstance(args[0], Mapping):
        given = {**args[0], **given}
        args = ()
    order = [*node, *edge]
    if len(args) > len(order):
        raise GraphError(f"{type(layer).__name__} takes {len(order)} features "
                         f"({', '.join(order)}), got {len(args)} positional tensors")
    for name, t in zip(order, args):
        if name in given:
            raise GraphError(f"feature {name!r} given both positionally and by name")
        given[name] = t
    unknown = set(given) - set(order)
    if unknown:
        raise GraphError(f"{type(layer).__name__} declares no feature "
                         f"{', '.join(sorted(repr(u) for u in unknown))} (declared: {', '.join(order)})")
    return given


def check_feature(layer, name: str, given: Mapping, t, rows: int, what: str, device) -> torch.Tensor:
    """Feature ``name`` checked against its declared type ``t`` and ``rows`` rows of ``what``;
    integer features are converted to the declared int64."""
    if name not in given:
        raise GraphError(f"{type(layer).__name__} reads feature {name!r}, which was not given")
    x = given[name]
    if x is None:
        # A model passes None on for an input it was not given (forward(g, x, e=None)): a
        # trainer gives a model only the edge data its graph has.
        kind = "edge" if t.domain is Domain.EDGE else "node"
        raise GraphError(f"feature {name!r} is None: {type(layer).__name__} reads the {kind} "
                         f"feature {name!r}, and the graph or dataset the model runs on has no "
                         f"{kind} data {name!r} (a model that takes it as {name}=None gets None); "
                         f"give the data {name!r}, or use a layer that does not read it")
    if not isinstance(x, torch.Tensor):
        raise GraphError(f"feature {name!r} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[0] != rows:
        got = x.shape[0] if x.dim() else "no"
        hint = ""
        if x.dim() and x.shape[0] > rows and t.domain is not Domain.EDGE:
            hint = (f"; in a mini-batch step (--mode mfg / sampling) each layer runs on a "
                    f"block whose sources are the first rows of the previous layer's input: "
                    f"cut a value made before the first layer to them ({name}[:h.shape[0]], "
                    f"h the layer's other input), as a full graph's rows are all kept; or, "
                    f"where two sarc layers read one value (branches), each takes a block of "
                    f"its own, in call order: a step's layers are a chain, input layer first "
                    f"(--mode full runs branches)")
        raise GraphError(f"feature {name!r} has {got} rows but the graph has {rows} {what}"
                         f"{hint}")
    if tuple(x.shape[1:]) != t.feat:
        raise GraphError(f"feature {name!r} has per-row shape {list(x.shape[1:])}, "
                         f"declared {list(t.feat)}")
    want = t.dtype.to_torch()
    if x.dtype != want and t.dtype.is_float and x.dtype.is_floating_point:
        on, low = autocast_state(x.device.type)
        if on and x.dtype == low:
            # under autocast a layer's output may be in its low dtype (a matmul last); the
            # next float32 layer takes it, as autocast's own float32 ops do
            x = x.to(want)
    if x.dtype != want:
        if t.dtype.is_float and x.dtype.is_floating_point:
            raise GraphError(f"feature {name!r} is {x.dtype}, the layer computes in {want} (its "
                             f"parameters' dtype): convert the features ({name}.to({want})) or the "
                             f"layer (layer.to({x.dtype}))")
        if not t.dtype.is_float and not x.dtype.is_floating_point and x.dtype != torch.bool:
            x = x.to(want)
        else:
            raise GraphError(f"feature {name!r} is {x.dtype}, expected {want}")
    if x.device != device:
        raise GraphError(f"feature {name!r} is on {x.device} but the graph is on {device}")
    return x
