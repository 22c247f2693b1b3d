"""Reading DGL's partitions: the output of ``dgl.distributed.partition_graph`` (DGL 2.x).

    OUT/NAME.json             num_parts, num_nodes, num_edges, part_method, node_map and
                              edge_map (per type, one [start, end) range of shuffled ids per
                              part), ntypes, etypes, and per part ("part-P") its files:
    OUT/partP/graph.dgl       the part's graph: its inner nodes and HALO nodes, ndata
                              ``_ID`` (shuffled global id) and ``inner_node``; edata ``_ID``
                              and ``inner_edge``
    OUT/partP/node_feat.dgl   {"NTYPE/NAME": rows of the type's inner nodes, in local order}
    OUT/partP/edge_feat.dgl   {"SRC:ETYPE:DST/NAME": rows of the type's inner edges, in
                              local order} (one type: "_N" and "_N:_E:_N")

DGL 2.x always reshuffles: part p owns the shuffled node ids ``node_map[p]``
and the edges into them (its inner edges), which have the shuffled edge ids
``edge_map[p]``. sarc keeps DGL's shuffled node ids as its new ids: node v of
DGL's partition is new id v of sarc's, and each part owns the same nodes.

A heterogeneous graph (several node or edge types; ``dgl.heterograph``) is
partitioned by DGL in homogeneous shuffled ids too: part p owns one range per
node type, consecutive, in type id order. sarc reads it as the homogeneous
graph with type ids that ``dgl.to_homogeneous`` makes of the original graph
(``ntype`` node data and ``etype`` edge data hold DGL's type ids; the data of
the types is joined as ``foreign.merge_typed`` says), and records the types
in the set's metadata.

Original ids: DGL does not write them. ``partition_graph(...,
return_mapping=True)`` returns them (``orig_nids[shuffled id]`` is the
original id, ``orig_eids`` likewise; per type, dicts, for a heterogeneous
graph); pass them as ``orig_ids`` (tensors or dicts, or ``.pt`` / ``.npy`` files), or save them as ``orig_nids.pt`` and
``orig_eids.pt`` beside the config, where the reader looks when none are
given. ``shuffled_ids=True`` instead takes DGL's shuffled ids as the graph's
own (the fingerprint is then that of the shuffled graph). One part is never
shuffled: its ids are the original ones.

Data keeps its names, without DGL's type prefix. DGL's ``save_tensors``
writes a bool tensor as uint8; sarc's masks (``BALANCE_MASKS``) holding only
0 and 1 come back as bool.

The feature files are read by sarc (``read_dgl_tensors``, DGL's
``save_tensors`` layout below), not by DGL's ``load_tensors``, which on a
truncated file returns partial tensors or crashes the process. DGL itself
reads ``graph.dgl`` (its loader raises on damaged files): it is imported when
a reader runs.

Not read: partition books that are not ranges (DGL before 0.8 without reshuffling), GraphBolt's
``fused_csc_sampling_graph.pt`` (DGL 2.1 writes it beside ``graph.dgl``, which
is read).
"""
from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..errors import PartitionError
from .foreign import (ETYPE, NTYPE, ForeignGraph, MissingDependencyError, as_index,
                      check_cover, load_torch_file, merge_typed, permutation_relabeling,
                      require_keys, scatter_rows, types_record)
from .pipeline import BALANCE_MASKS

ORIG_IDS_FILES = ("orig_nids.pt", "orig_eids.pt")
"""Where the reader looks for ``return_mapping``'s ids when none are given: beside the config."""

_NID, _EID = "_ID", "_ID"  # dgl.NID, dgl.EID


def read_dgl_partitions(config, *, orig_ids: Sequence | None = None,
                        shuffled_ids: bool = False) -> ForeignGraph:
    """The graph and partition of a ``dgl.distributed.partition_graph`` output.

    ``config`` is its ``NAME.json`` (or the directory holding just one
    ``.json``). ``orig_ids``: ``(orig_nids, orig_eids)`` as
    ``partition_graph(..., return_mapping=True)`` returned them (per type, a
    dict, for a heterogeneous graph), or the files they were saved to. See the
    module's docstring for ``shuffled_ids``.
    """
    layout = dgl_layout(config, orig_ids=orig_ids, shuffled_ids=shuffled_ids)
    config, n, e = layout.config, layout.num_nodes, layout.num_edges
    dgl = import_dgl()
    check_part_entries(layout)
    src_s = torch.empty(e, dtype=torch.int64)  # in shuffled node and edge ids
    dst_s = torch.empty(e, dtype=torch.int64)
    edge_ids, node_chunks, edge_chunks, shapes = [], {}, {}, ({}, {})
    for p in range(layout.num_parts):
        part = read_dgl_part(layout, dgl, p)
        src_s[part.eid], dst_s[part.eid] = part.src, part.dst
        edge_ids.append(part.eid)
        inner_nodes = torch.arange(part.lo, part.hi)
        for name, t in part.node_data.items():
            node_chunks.setdefault(name, []).append((inner_nodes, t))
        for name, t in part.edge_data.items():
            edge_chunks.setdefault(name, []).append((part.eid, t))
        for mine, got in zip(shapes, part.shapes):
            for name, per_type in got.items():
                mine.setdefault(name, {}).update(per_type)
    check_cover(torch.cat(edge_ids), e, "edge", config)
    for what, chunks in (("node", node_chunks), ("edge", edge_chunks)):
        partial = [k for k, c in chunks.items() if len(c) != layout.num_parts]
        if partial:
            raise PartitionError(f"{config}: {what} data {', '.join(map(repr, partial))} is "
                                 f"missing from some parts")

    new_to_orig = layout.node_orig(torch.arange(n))
    orig_eids = layout.edge_orig(torch.arange(e))
    offsets = torch.tensor([lo for lo, _ in layout.part_ranges] + [n], dtype=torch.int64)
    relabeling = permutation_relabeling(offsets, new_to_orig, f"{config}: orig_nids")
    check_cover(orig_eids, e, "edge", f"{config}: orig_eids")
    src = torch.empty(e, dtype=torch.int64)
    dst = torch.empty(e, dtype=torch.int64)
    src[orig_eids], dst[orig_eids] = new_to_orig[src_s], new_to_orig[dst_s]
    # By name: the order of DGL's files is its dict's, not the graph's.
    node_data = {k: relabeling.to_orig(scatter_rows(c, n, k, config))
                 for k, c in sorted(node_chunks.items())}
    edge_data = {}
    for k, c in sorted(edge_chunks.items()):
        rows = scatter_rows(c, e, k, config)
        edge_data[k] = torch.empty_like(rows)
        edge_data[k][orig_eids] = rows
    return ForeignGraph(src, dst, n, relabeling, node_data, edge_data, method=layout.method,
                        source=layout.source(), types=layout.types_record(*shapes))


# --- the config: which part and type each shuffled id is ----------------------------------

class IdRanges:
    """DGL's range partition book of one kind (nodes or edges): per type and part, one
    range ``[start, end)`` of shuffled ids; together they tile ``0 .. total``."""

    def __init__(self, id_map, types: Sequence[str], num_parts: int, total: int, what: str,
                 config: Path):
        if not isinstance(id_map, dict):
            id_map = {types[0]: id_map} if len(types) == 1 else id_map
        rows = []  # (start, end, type, part, the type's id of start)
        for t, name in enumerate(types):
            if not isinstance(id_map, dict) or name not in id_map:
                raise PartitionError(f"{config}: {what} has no entry for type {name!r}")
            before = 0
            for p, (a, b) in enumerate(_ranges(id_map[name], num_parts, what, config)):
                rows.append((a, b, t, p, before))
                before += b - a
        rows.sort()
        ends = 0
        for a, b, *_ in rows:
            if a != ends:
                raise PartitionError(f"{config}: corrupt {what}: its ranges do not tile "
                                     f"0..{total} (a gap or an overlap at {min(a, ends)})")
            ends = b
        if ends != total:
            raise PartitionError(f"{config}: corrupt {what}: its ranges cover 0..{ends}, the "
                                 f"graph has {total}")
        self.total, self.num_types = total, len(types)
        kept = [r for r in rows if r[1] > r[0]]
        self.start, self.end, self.type, self.part, self.first = (
            torch.tensor([r[i] for r in kept], dtype=torch.int64).reshape(-1) for i in range(5))
        self.counts = [sum(b - a for a, b, t, *_ in rows if t == k) for k in range(len(types))]
        self.part_ranges = []
        for p in range(num_parts):
            mine = sorted((a, b) for a, b, _, q, _ in rows if q == p)
            lo, hi = mine[0][0], mine[-1][1]
            if any(x[1] != y[0] for x, y in zip(mine, mine[1:])):
                raise PartitionError(f"{config}: corrupt {what}: part {p}'s ranges are not "
                                     f"contiguous ({mine})")
            self.part_ranges.append((lo, hi))

    def locate(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(type, part, id within the type) of each shuffled id in ``0 .. total``."""
        r = torch.searchsorted(self.start, ids, right=True) - 1
        return self.type[r], self.part[r], ids - self.start[r] + self.first[r]


@dataclass(frozen=True, eq=False)
class DglLayout:
    """A DGL partition's config, checked: its parts, types, ranges and the original ids.

    DGL's shuffled (homogeneous) ids are sarc's new ids; ``node_orig`` and
    ``edge_orig`` give the original homogeneous ids (``module docstring``).
    """

    config: Path
    meta: dict
    num_parts: int
    ntypes: tuple[str, ...]       # by DGL's type id
    etypes: tuple[str, ...]       # canonical "src:rel:dst", by DGL's type id
    nodes: IdRanges
    edges: IdRanges
    orig_nids: tuple | None       # per type: original id within the type of each shuffled
    orig_eids: tuple | None       # one; None: the shuffled ids are the ids
    ids: str                      # "original" or "dgl-shuffled"

    @property
    def num_nodes(self) -> int:
        return self.nodes.total

    @property
    def num_edges(self) -> int:
        return self.edges.total

    @property
    def part_ranges(self) -> list[tuple[int, int]]:
        return self.nodes.part_ranges

    @property
    def heterogeneous(self) -> bool:
        return len(self.ntypes) > 1 or len(self.etypes) > 1

    @property
    def method(self) -> str:
        return f"dgl:{self.meta.get('part_method', 'unknown')}"

    def source(self) -> dict:
        return {"format": "dgl", "path": str(self.config.resolve()),
                "graph_name": self.meta.get("graph_name"), "ids": self.ids}

    def node_orig(self, ids: torch.Tensor) -> torch.Tensor:
        """The original homogeneous ids of shuffled node ids."""
        return _orig(self.nodes, self.orig_nids, ids)

    def edge_orig(self, ids: torch.Tensor) -> torch.Tensor:
        return _orig(self.edges, self.orig_eids, ids)

    def types_record(self, node_shapes: dict, edge_shapes: dict) -> dict | None:
        if not self.heterogeneous:
            return None
        return types_record(self.ntypes, self.etypes, node_shapes, edge_shapes)


def _orig(ranges: IdRanges, orig, ids: torch.Tensor) -> torch.Tensor:
    if orig is None:
        return ids.clone()
    types, _, within = ranges.locate(ids)
    out = torch.empty_like(ids)
    offset = 0
    for t, count in enumerate(ranges.counts):
        m = types == t
        out[m] = orig[t][within[m]] + offset
        offset += count
    return out


def dgl_layout(config, *, orig_ids: Sequence | None = None, shuffled_ids: bool = False,
               default_shuffled: bool = False) -> DglLayout:
    """The checked config of a DGL partition and its original ids (``read_dgl_partitions``);
    ``default_shuffled``: without ``orig_ids`` nor the files beside the config, take DGL's
    shuffled ids as the ids instead of raising."""
    config = _config_path(Path(config))
    meta = _read_config(config)
    num_parts, n, e = (_count(meta, k, config) for k in ("num_parts", "num_nodes", "num_edges"))
    ntypes = _type_names(meta.get("ntypes", {"_N": 0}), "ntypes", config)
    etypes = _type_names(meta.get("etypes", {"_N:_E:_N": 0}), "etypes", config)
    nodes = IdRanges(meta["node_map"], ntypes, num_parts, n, "node_map", config)
    edges = IdRanges(meta["edge_map"], etypes, num_parts, e, "edge_map", config)
    nids, eids, ids = _orig_ids(config, num_parts, orig_ids, shuffled_ids, default_shuffled)
    if nids is not None:
        nids = _per_type(nids, ntypes, nodes.counts, "orig_nids", config)
        eids = _per_type(eids, etypes, edges.counts, "orig_eids", config)
    return DglLayout(config, meta, num_parts, ntypes, etypes, nodes, edges, nids, eids, ids)


def check_part_entries(layout: DglLayout) -> None:
    """Every part's entry in the config names its files: checked where DGL is found to
    read them, before any worker starts."""
    for p in range(layout.num_parts):
        _check_part_files(layout.meta, p, layout.num_parts, layout.config)


def _check_part_files(meta: dict, p: int, num_parts: int, config: Path) -> None:
    files = meta.get(f"part-{p}")
    if files is None:
        raise PartitionError(f"{config}: no entry \"part-{p}\" (its files) for part {p} of "
                             f"{num_parts}")
    require_keys(files, ("part_graph", "node_feats", "edge_feats"), f"part-{p}", config)
    for key in ("part_graph", "node_feats", "edge_feats"):
        if not isinstance(files[key], str) or not files[key]:
            raise PartitionError(f"{config}: part-{p}'s {key} holds {files[key]!r}, expected "
                                 f"the name of a file")


def _count(meta: dict, key: str, config: Path) -> int:
    v = meta[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "num_parts" else 0):
        raise PartitionError(f"{config}: corrupt DGL partition config: {key}={v!r}")
    return v


def _type_names(types, what: str, config: Path) -> tuple[str, ...]:
    """Type names in the order of DGL's type ids (``{"name": id}``)."""
    if not isinstance(types, dict) or sorted(types.values()) != list(range(len(types))):
        raise PartitionError(f"{config}: corrupt {what} {types!r}: expected names with the "
                             f"ids 0..{len(types) - 1 if isinstance(types, dict) else 'T-1'}")
    return tuple(sorted(types, key=types.get))


@dataclass(frozen=True, eq=False)
class DglPart:
    """What one part's files hold, in DGL's shuffled ids: its nodes ``lo .. hi-1`` and
    their data (rows in that order), its inner edges (those into its nodes; ``eid``
    sorted) and their data (rows in ``eid``'s order). A heterogeneous graph's data is
    joined across types (``merge_typed``), with ``ntype`` and ``etype``."""

    lo: int
    hi: int
    src: torch.Tensor
    dst: torch.Tensor
    eid: torch.Tensor
    node_data: dict[str, torch.Tensor]
    edge_data: dict[str, torch.Tensor]
    shapes: tuple[dict, dict]  # per data name, each type's per-row shape (heterogeneous)
    graph_file: Path


def read_dgl_part(layout: DglLayout, dgl, p: int) -> DglPart:
    """Part ``p`` of ``layout``, read from its files only, checked against the config."""
    config = layout.config
    files = layout.meta.get(f"part-{p}")
    graph_file = config.parent / files["part_graph"]
    g = _load_graph(dgl, graph_file)
    n, e = layout.num_nodes, layout.num_edges
    nid = g.ndata[_NID].to(torch.int64)
    if nid.numel() and (int(nid.min()) < 0 or int(nid.max()) >= n):
        raise PartitionError(f"{graph_file}: node ids outside 0..{n - 1}")
    inner = g.ndata["inner_node"].to(torch.bool)
    lo, hi = layout.part_ranges[p]
    if not torch.equal(nid[inner], torch.arange(lo, hi)):
        raise PartitionError(f"{graph_file}: its inner nodes are not the shuffled ids "
                             f"[{lo}, {hi}) node_map gives part {p}")
    inner_edge = g.edata["inner_edge"].to(torch.bool)
    u, v = (t[inner_edge].to(torch.int64) for t in g.edges(order="eid"))
    m = g.num_nodes()
    if u.numel() and not (0 <= int(torch.minimum(u.min(), v.min()))
                          and int(torch.maximum(u.max(), v.max())) < m):
        # DGL loads a graph file's edge arrays unchecked: a damaged one reads as any ids
        raise PartitionError(f"{graph_file}: an edge's endpoints are outside its 0..{m - 1} "
                             f"nodes (a corrupt file)")
    eid = g.edata[_EID][inner_edge].to(torch.int64)
    if eid.numel() and (int(eid.min()) < 0 or int(eid.max()) >= e):
        raise PartitionError(f"{graph_file}: edge ids outside 0..{e - 1}")
    order = torch.argsort(eid)
    u, v, eid = u[order], v[order], eid[order]
    etype, owner, _ = layout.edges.locate(eid)
    if not bool((owner == p).all()):
        raise PartitionError(f"{graph_file}: inner edge ids outside the ranges edge_map gives "
                             f"part {p}")
    if not bool(inner[v].all()):
        raise PartitionError(f"{graph_file}: an inner edge leads to a HALO node; DGL assigns "
                             f"an edge to the part of its destination")
    ntype = layout.nodes.locate(torch.arange(lo, hi))[0]
    node_feats = _load_feats(config.parent / files["node_feats"], layout.ntypes)
    edge_feats = _load_feats(config.parent / files["edge_feats"], layout.etypes)
    if not layout.heterogeneous:
        node_data = next(iter(node_feats.values()), {})
        edge_data = next(iter(edge_feats.values()), {})
        shapes = ({}, {})
    else:
        node_data, node_shapes = _merge(node_feats, layout.ntypes, ntype, NTYPE, "node",
                                        config.parent / files["node_feats"])
        edge_data, edge_shapes = _merge(edge_feats, layout.etypes, etype, ETYPE, "edge",
                                        config.parent / files["edge_feats"])
        shapes = (node_shapes, edge_shapes)
    return DglPart(lo, hi, nid[u], nid[v], eid, node_data, edge_data, shapes, graph_file)


def _merge(feats: dict, names: Sequence[str], types: torch.Tensor, type_key: str, what: str,
           where: Path):
    """A part's per-type data joined (``merge_typed``), its rows grouped by type as DGL
    numbers them; plus the type ids as ``type_key``."""
    if any(type_key in d for d in feats.values()):
        raise PartitionError(f"{where}: {what} data {type_key!r} would be overwritten by the "
                             f"{what} type ids sarc adds to a heterogeneous graph")
    if types.numel() and not bool((types[1:] >= types[:-1]).all()):
        raise PartitionError(f"{where}: the part's {what}s are not grouped by type")
    counts = torch.bincount(types, minlength=len(names)).tolist()
    rows_of = {name: counts[t] for t, name in enumerate(names)}
    data, shapes = merge_typed(rows_of, feats, what, where)
    data[type_key] = types.clone()
    return data, shapes


def _config_path(path: Path) -> Path:
    if path.is_dir():
        configs = sorted(path.glob("*.json"))
        if len(configs) != 1:
            found = ", ".join(c.name for c in configs) or "none"
            raise PartitionError(f"{path}: expected one DGL partition config (NAME.json) in "
                                 f"this directory, found {found}; name the .json file")
        return configs[0]
    if not path.is_file():
        raise PartitionError(f"{path}: no DGL partition config here (the NAME.json "
                             f"dgl.distributed.partition_graph writes)")
    return path


def _read_config(config: Path) -> dict:
    try:
        meta = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise PartitionError(f"{config}: corrupt DGL partition config: {e}") from e
    require_keys(meta, ("num_parts", "num_nodes", "num_edges", "node_map", "edge_map"),
                 "the DGL partition config", config)
    return meta



def _ranges(id_map, num_parts: int, what: str, config: Path) -> list[tuple[int, int]]:
    """One type's [start, end) per part in ``id_map`` (DGL's range partition book)."""
    if not isinstance(id_map, list):
        raise PartitionError(f"{config}: {what} is {id_map!r}, not ranges of ids; sarc reads "
                             f"reshuffled DGL partitions (DGL 0.8 and later)")
    try:
        if all(isinstance(r, list) for r in id_map):
            ranges = [(int(a), int(b)) for a, b in id_map]
        else:  # DGL's older layout: the end of each range
            ends = [int(x) for x in id_map]
            ranges = list(zip([0, *ends[:-1]], ends))
    except (TypeError, ValueError):
        raise PartitionError(f"{config}: corrupt {what}: {id_map!r}") from None
    if len(ranges) != num_parts or any(a > b or a < 0 for a, b in ranges):
        raise PartitionError(f"{config}: corrupt {what}: {ranges} are not {num_parts} "
                             f"ranges of ids")
    return ranges


def import_dgl():
    """DGL, imported when a reader needs it (never at sarc's import)."""
    try:
        import dgl
    except Exception as e:  # ImportError, or DGL's own errors against a torch it was not built for
        raise MissingDependencyError(f"reading DGL partitions needs DGL, for its graph.dgl "
                                     f"files (pip install sarc[dgl]): {e}") from e
    return dgl


def _load_graph(dgl, path: Path):
    if not path.is_file():
        raise PartitionError(f"{path}: the part's graph file is missing")
    try:
        graphs, _ = dgl.load_graphs(str(path))
    except Exception as e:  # DGLError on a corrupt or truncated file
        raise PartitionError(f"{path}: cannot be read as a DGL graph: {_first_line(e)}") from e
    if len(graphs) != 1:
        raise PartitionError(f"{path}: holds {len(graphs)} graphs, a part file holds one")
    g = graphs[0]
    missing = [f"ndata {k}" for k in (_NID, "inner_node") if k not in g.ndata] + \
              [f"edata {k}" for k in (_EID, "inner_edge") if k not in g.edata]
    if missing:
        raise PartitionError(f"{path}: not a DGL partition graph (lacks {', '.join(missing)})")
    return g


def _first_line(e: Exception) -> str:
    """DGL's C++ errors span lines (a stack trace follows): the line that says what failed."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()] or [type(e).__name__]
    line = next((l for l in lines if "Check failed" in l or "Error" in l), lines[0])
    return re.sub(r"^\[[\d:]+\]\s*", "", line)


def _load_feats(path: Path, type_names: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    """A part's feature file as {type: {name: rows}} (DGL names them ``TYPE/NAME``)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in read_dgl_tensors(path).items():
        prefix, sep, name = key.partition("/")
        if not sep and len(type_names) == 1:
            prefix, name = type_names[0], key
        if prefix not in type_names:
            raise PartitionError(f"{path}: data {key!r} is of type {prefix!r}, which the "
                                 f"config does not list ({', '.join(type_names)})")
        out.setdefault(prefix, {})[name] = _restore_mask(name, t)
    return out


# --- DGL's tensor files -------------------------------------------------------------------
#
# dgl.data.utils.save_tensors (DGL's tensor_serialize.cc and NDArray::Save), little-endian:
#
#   u64 0xDD5A9FBE3FA2443F, u64 count, u64 count again (the vector's length), then per tensor:
#   u64 name length, name (utf-8), u64 0xDD5E40F096B4A13F, u64 reserved,
#   i32 device type (1 = CPU), i32 device id, i32 ndim, u8 type code, u8 bits, u16 lanes,
#   i64 shape[ndim], i64 byte size, the data (row-major)

_TENSORS_MAGIC = 0xDD5A9FBE3FA2443F
_NDARRAY_MAGIC = 0xDD5E40F096B4A13F
_DGL_DTYPES = {(0, 8): torch.int8, (0, 16): torch.int16, (0, 32): torch.int32, (0, 64): torch.int64,
               (1, 8): torch.uint8, (2, 16): torch.float16, (2, 32): torch.float32,
               (2, 64): torch.float64, (4, 16): torch.bfloat16}
"""DGL's (type code, bits) of one lane: DLPack's codes (0 int, 1 uint, 2 float, 4 bfloat)."""


def read_dgl_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The named tensors of a ``dgl.data.utils.save_tensors`` file, every length checked."""
    if not path.is_file():
        raise PartitionError(f"{path}: the part's feature file is missing")
    r = _Reader(path.read_bytes(), path)
    if r.unpack("<Q")[0] != _TENSORS_MAGIC:
        raise PartitionError(f"{path}: not a DGL tensor file (no save_tensors header)")
    count, length = r.unpack("<QQ")
    if count != length:
        raise PartitionError(f"{path}: corrupt DGL tensor file ({count} tensors, {length} listed)")
    out = {}
    for _ in range(count):
        name = bytes(r.take(r.unpack("<Q")[0])).decode("utf-8", errors="replace")
        magic, _reserved, device, _device_id, ndim, code, bits, lanes = r.unpack("<QQiiiBBH")
        if magic != _NDARRAY_MAGIC or device != 1 or not 0 <= ndim <= 32:
            raise PartitionError(f"{path}: corrupt DGL tensor file (tensor {name!r})")
        dtype = _DGL_DTYPES.get((code, bits)) if lanes == 1 else None
        if dtype is None:
            raise PartitionError(f"{path}: tensor {name!r} has a DGL dtype sarc does not read "
                                 f"(type code {code}, {bits} bits, {lanes} lanes)")
        shape = r.unpack(f"<{ndim}q")
        (nbytes,) = r.unpack("<q")
        if min(shape, default=0) < 0 or nbytes != math.prod(shape) * (bits // 8):
            raise PartitionError(f"{path}: corrupt DGL tensor file (tensor {name!r}: shape "
                                 f"{list(shape)}, {nbytes} bytes)")
        data = bytearray(r.take(nbytes))
        t = torch.frombuffer(data, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape)
    if r.pos != len(r.data):
        raise PartitionError(f"{path}: corrupt DGL tensor file ({len(r.data) - r.pos} bytes "
                             f"after its last tensor)")
    return out


class _Reader:
    """Reads a byte string front to back; running past its end is a PartitionError."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.path, self.pos = memoryview(data), path, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise PartitionError(f"{self.path}: truncated or corrupt DGL tensor file (needs "
                                 f"{n} bytes at offset {self.pos}, has {len(self.data)} in all)")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))



def _orig_ids(config: Path, num_parts: int, orig_ids, shuffled_ids: bool,
              default_shuffled: bool):
    """(orig_nids, orig_eids, how the ids were found) for the reader; None, None for DGL's
    shuffled ids."""
    if orig_ids is not None and shuffled_ids:
        raise ValueError("orig_ids and shuffled_ids=True contradict each other; pass one")
    if shuffled_ids:
        return None, None, "dgl-shuffled"
    if orig_ids is None and num_parts == 1:
        return None, None, "original"
    if orig_ids is None:
        files = [config.parent / f for f in ORIG_IDS_FILES]
        there = [f for f in files if f.is_file()]
        if there and len(there) < len(files):   # half a mapping: the ids would be DGL's
            missing = [f.name for f in files if f not in there]
            raise PartitionError(f"{config}: {there[0].name} is beside it but "
                                 f"{', '.join(missing)} is not: save both of the mapping "
                                 f"partition_graph(..., return_mapping=True) returned, or "
                                 f"neither (DGL's shuffled ids)")
        if not there:
            if default_shuffled:
                return None, None, "dgl-shuffled"
            raise PartitionError(
                f"{config}: DGL's partition_graph does not store the original node and edge ids, "
                f"and {' and '.join(ORIG_IDS_FILES)} are not beside it. Pass the mapping "
                f"partition_graph(..., return_mapping=True) returned (orig_ids=(orig_nids, "
                f"orig_eids); sarc partition --dgl-orig-ids NIDS EIDS), save it there with "
                f"torch.save, or take DGL's shuffled ids as the graph's own ids "
                f"(shuffled_ids=True; --dgl-shuffled-ids)")
        orig_ids = files
    if len(orig_ids) != 2:
        raise ValueError(f"orig_ids is (orig_nids, orig_eids), got {len(orig_ids)} items")
    nids, eids = (_id_data(x, what) for x, what in zip(orig_ids, ("orig_nids", "orig_eids")))
    return nids, eids, "original"


def _id_data(x, what: str):
    """A tensor of ids, or a dict of them per type, from a tensor, a dict or a file."""
    if isinstance(x, (str, Path)):
        path = Path(x)
        if path.suffix == ".npy":
            try:
                return as_index(torch.from_numpy(np.load(path, allow_pickle=False)), what, path)
            except (OSError, ValueError) as err:
                raise PartitionError(f"{path}: cannot be read as {what}: {err}") from err
        x = load_torch_file(path, what)
        return {k: as_index(v, f"{what}[{k!r}]", path) for k, v in x.items()} \
            if isinstance(x, dict) else as_index(x, what, path)
    if isinstance(x, dict):
        return {k: as_index(torch.as_tensor(v), f"{what}[{k!r}]", what) for k, v in x.items()}
    return as_index(torch.as_tensor(x), what, what)


def _per_type(ids, names: Sequence[str], counts: Sequence[int], what: str, config: Path
              ) -> tuple[torch.Tensor, ...]:
    """``ids`` (a tensor, or a dict by type name; DGL keys edge types by their canonical
    tuple) as one tensor per type, each a permutation of the type's ids."""
    if not isinstance(ids, dict):
        if len(names) != 1:
            raise PartitionError(f"{config}: {what} is one tensor, the partition has the "
                                 f"types {', '.join(names)}: pass the dict of per-type ids "
                                 f"partition_graph(..., return_mapping=True) returned")
        ids = {names[0]: ids}
    ids = {":".join(k) if isinstance(k, tuple) else k: v for k, v in ids.items()}
    if len(names) == 1 and len(ids) == 1:
        ids = {names[0]: next(iter(ids.values()))}
    missing = [n for n in names if n not in ids]
    if missing:
        raise PartitionError(f"{config}: {what} has no ids of type "
                             f"{', '.join(map(repr, missing))}")
    out = []
    for name, count in zip(names, counts):
        t = ids[name]
        if t.numel() != count:
            raise PartitionError(f"{config}: {what} has {t.numel()} ids"
                                 f"{'' if len(names) == 1 else f' of type {name!r}'}, the "
                                 f"partitioned graph has {count}; is it the mapping of this "
                                 f"partition?")
        check_cover(t, count, "node" if what == "orig_nids" else "edge",
                    f"{config}: {what}" + ("" if len(names) == 1 else f" of type {name!r}"))
        out.append(t)
    return tuple(out)


def _restore_mask(name: str, t: torch.Tensor) -> torch.Tensor:
    if name in BALANCE_MASKS and t.dtype == torch.uint8 and bool((t <= 1).all()):
        return t.to(torch.bool)
    return t
