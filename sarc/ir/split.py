"""The cut at the exchange: one optimized layer -> four IR functions.

A worker owns some destination nodes and receives, per source shard j, the rows
of the exchanged values X (the values the planner chose to send,
``sarc.planner.cost.Exchange.values``: e.g. ``W h`` and GAT's ``el``, or the raw
``h`` in baseline mode) that its edges from shard j read. ``split_layer`` cuts
the layer's IR into the parts a schedule runs:

- ``src``: on the worker's owned rows, X from the layer's src-side inputs
  (node-local: its values are written in the dst domain, one row per owned node);
- ``dst_pre``: the dst-domain values the edge computations read (GAT's ``er``),
  from the dst inputs and, where a dst value is an exchanged value's first rows
  (``patterns.dst_rows_of_src``: GAT's ``lin(dst.h)`` is ``lin(src.h)``'s rows), from
  X on the worker's own rows (DST inputs ``$x<k>``) instead of computed again;
- ``edge``: per source block, from X's rows of that shard (SRC inputs ``$x<k>``),
  the ``dst_pre`` values (DST inputs ``$d<k>``) and the block's edge features, the
  *partial* aggregates of the block (outputs ``$agg<k>``): every REDUCE and fused
  aggregate of the layer, with ``mean`` written as ``sum`` (the merge divides by
  the whole-graph in-degree). Values of the src domain that the receiver
  recomputes from X (baseline mode: ``W h`` from ``h``) are part of it;
- ``dst_post``: from the merged aggregates (DST inputs ``$agg<k>``), the
  ``dst_pre`` values it needs (``$d<k>``), X's rows as ``dst_pre`` reads them and the
  dst inputs, the layer's outputs.

Each part is an ordinary verified ``Function`` (role ``layer``) that the
interpreter and every backend run. Aggregates of kind sum (and mean) are plain
block aggregates in ``edge``; how partials of max / min / softmax_aggregate
combine, and how an unfused ``edge_softmax`` (whose normalization spans every
block) reads global normalizers, is the merge rules' business
(``sarc.distributed.merge``), which the distributed backend lowers those ops to.
"""
from __future__ import annotations

from dataclasses import dataclass

from collections.abc import Sequence

from ..errors import DSLError, SarcError
from .function import Builder, Function
from .ops import Op
from .patterns import dst_rows_of_src
from .reducers import REDUCERS
from .types import Domain, TensorType
from .verifier import verify

AGGREGATE_OPS = (Op.REDUCE, Op.AGGREGATE, Op.SOFTMAX_AGGREGATE)


def aggregates(fn) -> bool:
    """Does ``fn`` aggregate over edges? A layer that does not has no cut: each worker runs
    it on its own rows (``sarc.distributed.schedule.run_layer``)."""
    return any(v.op in AGGREGATE_OPS for v in fn.values)

BLOCK_KIND = {name: "sum" for name, r in REDUCERS.items() if r.node_level and r.by_degree}
"""What an edge block computes for a reducer that divides by the degree: its partial sums
(the merge divides by the whole graph's in-degree)."""
X_PREFIX, D_PREFIX, AGG_PREFIX = "$x", "$d", "$agg"


class SplitError(SarcError):
    """The layer cannot be cut at the given exchange."""


@dataclass(frozen=True)
class Slot:
    """A value that crosses a part boundary: its name there, its type, where it was."""

    name: str
    type: TensorType
    index: int  # in the layer's (optimized) IR


@dataclass(frozen=True)
class Aggregate:
    """One aggregate of the layer, computed per block in ``edge`` and merged.

    ``kind``: sum, mean, max, min or softmax (a fused softmax_aggregate);
    ``score_feat``: a softmax's score shape (a prefix of ``feat``).
    """

    name: str
    kind: str
    index: int
    feat: tuple[int, ...]
    score_feat: tuple[int, ...] = ()


@dataclass(frozen=True)
class SoftmaxSite:
    """An unfused ``edge_softmax`` (in ``edge``): it needs per-destination normalizers
    over *all* blocks, so the schedule runs a normalizer pass first."""

    name: str        # "$sm<k>"
    index: int       # in the edge part
    feat: tuple[int, ...]


@dataclass(frozen=True)
class LayerSplit:
    layer: Function
    src: Function | None          # None when nothing crosses the network
    dst_pre: Function | None      # None when the edges read no dst value
    edge: Function
    dst_post: Function
    exchanged: tuple[Slot, ...]   # X, in the order rows pack them ($x0, $x1, ...)
    dst_values: tuple[Slot, ...]  # $d0, ...: dst_pre's outputs
    aggregates: tuple[Aggregate, ...]
    softmax_sites: tuple[SoftmaxSite, ...]

    @property
    def row_width(self) -> int:
        """Elements per exchanged row, all X values together."""
        return sum(_numel(s.type.feat) for s in self.exchanged)

    def fetch_passes(self) -> int:
        """Forward passes over the blocks: 2 when unfused edge_softmax needs normalizers first."""
        return 2 if self.softmax_sites else 1


def _numel(feat) -> int:
    n = 1
    for d in feat:
        n *= d
    return n


class _Part:
    """Copies values of the layer into one part, depth first from what the part must output.

    ``leaf(i)`` decides whether old value ``i`` enters this part as an input leaf:
    it returns (name, type) of that leaf, or None to copy the value (recursively).
    """

    def __init__(self, fn: Function, name: str, leaf, domain_map=None, kind_map=None):
        self.fn, self.leaf = fn, leaf
        self.b = Builder(name)
        self.map: dict[int, int] = {}
        self.leaves: dict[str, int] = {}  # one input per leaf name
        self.domain_map = domain_map or {}
        self.kind_map = kind_map or {}

    def get(self, i: int) -> int:
        if i in self.map:
            return self.map[i]
        v = self.fn.values[i]
        as_leaf = self.leaf(i)
        if as_leaf is not None:
            name, t = as_leaf
            if name not in self.leaves:
                self.leaves[name] = self.b.leaf(Op.INPUT, name, t, v.loc)
            new = self.leaves[name]
        elif v.op in (Op.INPUT, Op.PARAM):
            t = v.type.with_(domain=self.domain_map.get(v.type.domain, v.type.domain))
            new = self.b.leaf(v.op, v.attr["name"], t, v.loc)
        elif v.op is Op.CONST:
            new = self.b.const(v.attr["value"], v.type, v.loc)
        else:
            inputs = [self.get(j) for j in v.inputs]
            attrs = v.attr
            if v.op in (Op.REDUCE, Op.AGGREGATE) and attrs["kind"] in self.kind_map:
                attrs = {**attrs, "kind": self.kind_map[attrs["kind"]]}
            new = self.b.add(v.op, inputs, attrs, v.loc)
        self.map[i] = new
        return new

    def finish(self, outputs: list[tuple[str, int]]) -> Function:
        return verify(self.b.finish(outputs))


def _depends_on(fn: Function, roots: set[int]) -> list[bool]:
    dep = [False] * len(fn.values)
    for i, v in enumerate(fn.values):
        dep[i] = i in roots or any(dep[j] for j in v.inputs)
    return dep


NESTED_SOFTMAX = (
    "an edge_softmax (or a softmax aggregate's score) computed from another edge_softmax's "
    "weights is not supported in a distributed schedule (--workers, a DistGraph): its "
    "normalizers need the inner one's, merged over every block, first (a second normalizer "
    "pass, which sarc does not schedule). It runs on a Graph; on workers, aggregate the inner "
    "softmax itself (sarc.sum(z * sarc.edge_softmax(s)) fuses) or compute the outer score "
    "without it")
"""Why a softmax of another's weights is refused in a distributed schedule."""

EDGES_AFTER_AGGREGATE = (
    "an edge computation reads an aggregate of the same layer (a second pass over the edges "
    "after the first, e.g. apply_edges or update_all reading an update_all's result) is not "
    "supported in a distributed schedule (--workers, a DistGraph): a worker's edge blocks "
    "each see part of the edges into a node, and the aggregate is whole only once every "
    "block is merged (a second pass over the blocks, which sarc does not schedule). It runs "
    "on a Graph; on workers, make the second pass a layer of its own")
"""Why a layer whose edges read its own aggregate is refused in a distributed schedule."""


def refuse_edges_after_aggregate(fn: Function, after_agg: list[bool]) -> None:
    """Refuse, at the user's line, a layer whose edge computations read one of its aggregates
    (directly, or through dst values computed from it): the edge part computes every
    aggregate per block, and a block's partial is not the aggregate."""
    for v in fn.values:   # an edge value, or a fused aggregate (its edge math inside)
        if (v.type.domain is Domain.EDGE or v.op in AGGREGATE_OPS) \
                and any(after_agg[j] for j in v.inputs):
            raise DSLError(f"layer {fn.name}: {EDGES_AFTER_AGGREGATE}", v.loc)


def refuse_nested_softmax(edge: Function, sites: Sequence[SoftmaxSite],
                          normalized: Sequence[int]) -> None:
    """Refuse, at the user's line, a value of ``normalized`` (indices in the edge part whose
    normalizers a normalizer pass computes: the unfused sites, and a baseline schedule's
    softmax aggregates) that reads an unfused site's weights: the pass computes every
    normalizer at once, each site's weights block-local there."""
    reads_site = _depends_on(edge, {s.index for s in sites})
    for i in normalized:
        v = edge.values[i]
        if any(reads_site[j] for j in v.inputs):
            raise DSLError(f"layer {edge.name.removesuffix('_edge')}: {NESTED_SOFTMAX}", v.loc)


def split_layer(fn: Function, exchanged: Sequence[int] | None) -> LayerSplit:
    """Cut the optimized layer ``fn`` where the values ``exchanged`` (indices in ``fn``, in
    the order rows pack them: the planner's choice) cross the network; None when the layer
    reads no source rows."""
    values = fn.values
    aggs = [i for i, v in enumerate(values) if v.op in AGGREGATE_OPS]
    if not aggs:
        raise SplitError(f"layer {fn.name} aggregates nothing over edges; it needs no exchange "
                         f"and no split (run it on each worker's nodes)")
    after_agg = _depends_on(fn, set(aggs))
    refuse_edges_after_aggregate(fn, after_agg)
    exchanged = tuple(exchanged or ())
    x_index = {j: k for k, j in enumerate(exchanged)}
    for j in x_index:
        if values[j].type.domain is not Domain.SRC:
            raise SplitError(f"exchanged value %{j} is a {values[j].type.domain.value} value; "
                             f"only src values cross the network")
    dtypes = {values[j].type.dtype for j in x_index}
    if len(dtypes) > 1:
        made = "; ".join(f"{values[j].type.dtype.value} at {values[j].loc.file}:"
                         f"{values[j].loc.line}" if values[j].loc is not None
                         else values[j].type.dtype.value for j in x_index)
        raise SplitError(f"the exchanged values of {fn.name} mix dtypes "
                         f"({', '.join(sorted(d.value for d in dtypes))}: {made}), and so do "
                         f"the inputs they are computed from; a row of the exchange packs "
                         f"one dtype: give the layer's source features one dtype")

    # edge part: every aggregate, from X rows, dst values and edge inputs --------------
    d_slots: dict[int, Slot] = {}

    def edge_leaf(i: int):
        v = values[i]
        if i in x_index:
            return f"{X_PREFIX}{x_index[i]}", v.type
        if v.type.domain is Domain.SRC and v.op is Op.INPUT:
            raise SplitError(f"the edges of {fn.name} read src input {v.attr['name']!r}, which "
                             f"the exchange ({', '.join(f'%{j}' for j in exchanged) or 'none'}) "
                             f"does not carry")
        if v.type.domain is Domain.DST and v.op not in AGGREGATE_OPS:
            if after_agg[i]:   # (refused above, at the edge computation's line)
                raise DSLError(f"layer {fn.name}: {EDGES_AFTER_AGGREGATE}", v.loc)
            if i not in d_slots:
                d_slots[i] = Slot(f"{D_PREFIX}{len(d_slots)}", v.type, i)
            return d_slots[i].name, v.type
        return None

    edge = _Part(fn, f"{fn.name}_edge", edge_leaf, kind_map=BLOCK_KIND)
    aggregates = []
    for k, i in enumerate(aggs):
        v = values[i]
        name = f"{AGG_PREFIX}{k}"
        if v.op is Op.SOFTMAX_AGGREGATE:
            score = v.attr["score"]
            aggregates.append(Aggregate(name, "softmax", i, v.type.feat,
                                        score.values[score.result].type.feat))
        else:
            aggregates.append(Aggregate(name, v.attr["kind"], i, v.type.feat))
        edge.get(i)
    edge_fn = edge.finish([(a.name, edge.map[a.index]) for a in aggregates])
    sites = tuple(SoftmaxSite(f"$sm{k}", i, v.type.feat) for k, i in enumerate(
        i for i, v in enumerate(edge_fn.values) if v.op is Op.EDGE_SOFTMAX))
    refuse_nested_softmax(edge_fn, sites, [s.index for s in sites])

    # src part: X on owned rows (written as dst values: one row per owned node) ----------
    src_fn = None
    slots = tuple(Slot(f"{X_PREFIX}{k}", values[j].type, j) for k, j in enumerate(exchanged))
    if slots:
        src = _Part(fn, f"{fn.name}_src", lambda i: None, domain_map={Domain.SRC: Domain.DST})
        src_fn = src.finish([(s.name, src.get(s.index)) for s in slots])

    # dst parts: before the edges (what they read), after the merge (the outputs) ---------
    # a dst value that is an exchanged value's first rows is read from X, not computed
    twins = {i: x_index[j] for i, j in dst_rows_of_src(fn).items() if j in x_index}

    def twin_leaf(i: int):
        return (f"{X_PREFIX}{twins[i]}", values[i].type) if i in twins else None

    dst_values = tuple(d_slots.values())
    dst_pre_fn = None
    if dst_values:
        pre = _Part(fn, f"{fn.name}_dst_pre", twin_leaf)
        dst_pre_fn = pre.finish([(s.name, pre.get(s.index)) for s in dst_values])
    agg_names = {a.index: a.name for a in aggregates}

    def post_leaf(i: int):
        if i in agg_names:
            return agg_names[i], values[i].type
        if i in d_slots:
            return d_slots[i].name, values[i].type
        return twin_leaf(i)

    post = _Part(fn, f"{fn.name}_dst_post", post_leaf)
    post_fn = post.finish([(name, post.get(i)) for name, i in fn.outputs])
    return LayerSplit(fn, src_fn, dst_pre_fn, edge_fn, post_fn, slots,
                      dst_values, tuple(aggregates), sites)


def format_split(split: LayerSplit) -> str:
    """The four parts as IR text, with the slots that join them."""
    from .printer import format_function
    out = [f"# {split.layer.name} split at the exchange: "
           + (", ".join(f"{s.name} = %{s.index}" for s in split.exchanged) or "nothing exchanged")]
    for title, part in (("src (owned rows)", split.src), ("dst_pre", split.dst_pre),
                        ("edge (per source block)", split.edge), ("dst_post", split.dst_post)):
        if part is not None:
            out.append(f"# --- {title} ---")
            out.append(format_function(part).rstrip("\n"))
    out.append("# merges: " + ", ".join(f"{a.name} {a.kind}" for a in split.aggregates)
               + ("; global normalizers: " + ", ".join(s.name for s in split.softmax_sites)
                  if split.softmax_sites else ""))
    return "\n".join(out) + "\n"
