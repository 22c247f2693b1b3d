"""Reading DGL's partitions: the output of ``dgl.distributed.partition_graph`` (DGL 2.x).

    OUT/NAME.json             num_parts, num_nodes, num_edges, part_method, node_map and
                              edge_map (per type, one [start, end) range of shuffled ids per
                              part), ntypes, etypes, and per part ("part-P") its files:
    OUT/partP/graph.dgl       the part's graph: its inner nodes and HALO nodes, ndata
                              ``_ID`` (shuffled global id) and ``inner_node``; edata ``_ID``
                              and ``inner_edge``
    OUT/partP/node_feat.dgl   {"_N/NAME": rows of the inner nodes, in local order}
    OUT/partP/edge_feat.dgl   {"_N:_E:_N/NAME": rows of the inner edges, in local order}

DGL 2.x always reshuffles: part p owns the shuffled node ids ``node_map[p]``
and the edges into them (its inner edges), which have the shuffled edge ids
``edge_map[p]``. sarc keeps DGL's shuffled node ids as its new ids: node v of
DGL's partition is new id v of sarc's, and each part owns the same nodes.

Original ids: DGL does not write them. ``partition_graph(...,
return_mapping=True)`` returns them (``orig_nids[shuffled id]`` is the
original id, ``orig_eids`` likewise); pass them as ``orig_ids`` (tensors, or
``.pt`` / ``.npy`` files), or save them as ``orig_nids.pt`` and
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

Not read: heterogeneous graphs (more than one node or edge type), partition
books that are not ranges (DGL before 0.8 without reshuffling), GraphBolt's
``fused_csc_sampling_graph.pt`` (DGL 2.1 writes it beside ``graph.dgl``, which
is read).
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..errors import PartitionError
from .foreign import (ForeignGraph, MissingDependencyError, as_index, check_cover,
                      load_torch_file, permutation_relabeling, require_keys, scatter_rows)
from .pipeline import BALANCE_MASKS

ORIG_IDS_FILES = ("orig_nids.pt", "orig_eids.pt")
"""Where the reader looks for ``return_mapping``'s ids when none are given: beside the config."""

_NID, _EID = "_ID", "_ID"  # dgl.NID, dgl.EID


def read_dgl_partitions(config, *, orig_ids: Sequence | None = None,
                        shuffled_ids: bool = False) -> ForeignGraph:
    """The graph and partition of a ``dgl.distributed.partition_graph`` output.

    ``config`` is its ``NAME.json`` (or the directory holding just one
    ``.json``). ``orig_ids``: ``(orig_nids, orig_eids)`` as
    ``partition_graph(..., return_mapping=True)`` returned them, or the files
    they were saved to. See the module's docstring for ``shuffled_ids``.
    """
    config = _config_path(Path(config))
    meta = _read_config(config)
    num_parts, n, e = (int(meta[k]) for k in ("num_parts", "num_nodes", "num_edges"))
    ntype, etype = _single_types(meta, config)
    node_ranges = _ranges(meta["node_map"], ntype, num_parts, n, "node_map", config)
    edge_ranges = _ranges(meta["edge_map"], etype, num_parts, e, "edge_map", config)
    new_to_orig, orig_eids, ids = _orig_ids(config, meta, orig_ids, shuffled_ids, n, e)
    dgl = _import_dgl()

    src_s = torch.empty(e, dtype=torch.int64)  # in shuffled node and edge ids
    dst_s = torch.empty(e, dtype=torch.int64)
    edge_ids, node_chunks, edge_chunks = [], {}, {}
    for p in range(num_parts):
        files = meta.get(f"part-{p}")
        require_keys(files, ("part_graph", "node_feats", "edge_feats"), f"part-{p}", config)
        graph_file = config.parent / files["part_graph"]
        g = _load_graph(dgl, graph_file)
        nid = g.ndata[_NID].to(torch.int64)
        if nid.numel() and (int(nid.min()) < 0 or int(nid.max()) >= n):
            raise PartitionError(f"{graph_file}: node ids outside 0..{n - 1}")
        inner = g.ndata["inner_node"].to(torch.bool)
        inner_nodes = nid[inner]
        lo, hi = node_ranges[p]
        if not torch.equal(inner_nodes, torch.arange(lo, hi)):
            raise PartitionError(f"{graph_file}: its inner nodes are not the shuffled ids "
                                 f"[{lo}, {hi}) node_map gives part {p}")
        inner_edge = g.edata["inner_edge"].to(torch.bool)
        u, v = (t[inner_edge].to(torch.int64) for t in g.edges(order="eid"))
        eid = g.edata[_EID][inner_edge].to(torch.int64)
        elo, ehi = edge_ranges[p]
        if eid.numel() and (int(eid.min()) < elo or int(eid.max()) >= ehi):
            raise PartitionError(f"{graph_file}: inner edge ids outside the range [{elo}, {ehi}) "
                                 f"edge_map gives part {p}")
        if not bool(inner[v].all()):
            raise PartitionError(f"{graph_file}: an inner edge leads to a HALO node; DGL assigns "
                                 f"an edge to the part of its destination")
        src_s[eid], dst_s[eid] = nid[u], nid[v]
        edge_ids.append(eid)
        for name, t in _load_feats(config.parent / files["node_feats"], ntype).items():
            node_chunks.setdefault(name, []).append((inner_nodes, t))
        for name, t in _load_feats(config.parent / files["edge_feats"], etype).items():
            edge_chunks.setdefault(name, []).append((eid, t))
    check_cover(torch.cat(edge_ids), e, "edge", config)
    for what, chunks in (("node", node_chunks), ("edge", edge_chunks)):
        partial = [k for k, c in chunks.items() if len(c) != num_parts]
        if partial:
            raise PartitionError(f"{config}: {what} data {', '.join(map(repr, partial))} is "
                                 f"missing from some parts")

    offsets = torch.tensor([lo for lo, _ in node_ranges] + [n], dtype=torch.int64)
    relabeling = permutation_relabeling(offsets, new_to_orig, f"{config}: orig_nids")
    check_cover(orig_eids, e, "edge", f"{config}: orig_eids")
    src = torch.empty(e, dtype=torch.int64)
    dst = torch.empty(e, dtype=torch.int64)
    src[orig_eids], dst[orig_eids] = new_to_orig[src_s], new_to_orig[dst_s]
    # By name: the order of DGL's files is its dict's, not the graph's.
    node_data = {k: _restore_mask(k, relabeling.to_orig(scatter_rows(c, n, k, config)))
                 for k, c in sorted(node_chunks.items())}
    edge_data = {}
    for k, c in sorted(edge_chunks.items()):
        rows = scatter_rows(c, e, k, config)
        edge_data[k] = torch.empty_like(rows)
        edge_data[k][orig_eids] = rows
    return ForeignGraph(src, dst, n, relabeling, node_data, edge_data,
                        method=f"dgl:{meta.get('part_method', 'unknown')}",
                        source={"format": "dgl", "path": str(config.resolve()),
                                "graph_name": meta.get("graph_name"), "ids": ids})


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


def _single_types(meta: dict, config: Path) -> tuple[str, str]:
    ntypes = meta.get("ntypes", {"_N": 0})
    etypes = meta.get("etypes", {"_N:_E:_N": 0})
    if len(ntypes) != 1 or len(etypes) != 1:
        raise PartitionError(f"{config}: a heterogeneous DGL partition (node types "
                             f"{list(ntypes)}, edge types {list(etypes)}); sarc reads "
                             f"homogeneous ones (convert the graph with dgl.to_homogeneous "
                             f"before partitioning)")
    return next(iter(ntypes)), next(iter(etypes))


def _ranges(id_map, key: str, num_parts: int, total: int, what: str, config: Path
            ) -> list[tuple[int, int]]:
    """Each part's [start, end) in ``id_map`` (DGL's range partition book), checked."""
    if isinstance(id_map, dict):
        if key not in id_map:
            raise PartitionError(f"{config}: {what} has no entry for type {key!r}")
        id_map = id_map[key]
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
    starts = [0] + [b for _, b in ranges[:-1]]
    if len(ranges) != num_parts or [a for a, _ in ranges] != starts or \
            any(a > b for a, b in ranges) or (ranges and ranges[-1][1] != total):
        raise PartitionError(f"{config}: corrupt {what}: {ranges} are not {num_parts} "
                             f"consecutive ranges covering 0..{total}")
    return ranges


def _import_dgl():
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
        raise PartitionError(f"{path}: cannot be read as a DGL graph: {e}") from e
    if len(graphs) != 1:
        raise PartitionError(f"{path}: holds {len(graphs)} graphs, a part file holds one")
    g = graphs[0]
    missing = [f"ndata {k}" for k in (_NID, "inner_node") if k not in g.ndata] + \
              [f"edata {k}" for k in (_EID, "inner_edge") if k not in g.edata]
    if missing:
        raise PartitionError(f"{path}: not a DGL partition graph (lacks {', '.join(missing)})")
    return g


def _load_feats(path: Path, type_name: str) -> dict[str, torch.Tensor]:
    """The tensors of a part's feature file, named without their ``TYPE/`` prefix."""
    out = {}
    for name, t in read_dgl_tensors(path).items():
        prefix, sep, rest = name.partition("/")
        if sep and prefix != type_name:
            raise PartitionError(f"{path}: data {name!r} is of type {prefix!r}, not {type_name!r}")
        out[rest if sep else name] = t
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


def _orig_ids(config: Path, meta: dict, orig_ids, shuffled_ids: bool, n: int, e: int):
    """(orig_nids, orig_eids, how they were found) for the reader."""
    if orig_ids is not None and shuffled_ids:
        raise ValueError("orig_ids and shuffled_ids=True contradict each other; pass one")
    if shuffled_ids or (orig_ids is None and int(meta["num_parts"]) == 1):
        return torch.arange(n), torch.arange(e), "dgl-shuffled" if shuffled_ids else "original"
    if orig_ids is None:
        files = [config.parent / f for f in ORIG_IDS_FILES]
        if not all(f.is_file() for f in files):
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
    nids, eids = (_id_tensor(x, what) for x, what in zip(orig_ids, ("orig_nids", "orig_eids")))
    for t, count, what in ((nids, n, "orig_nids"), (eids, e, "orig_eids")):
        if t.numel() != count:
            raise PartitionError(f"{config}: {what} has {t.numel()} ids, the partitioned graph "
                                 f"has {count}; is it the mapping of this partition?")
    return nids, eids, "original"


def _id_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, (str, Path)):
        path = Path(x)
        if path.suffix == ".npy":
            try:
                x = torch.from_numpy(np.load(path, allow_pickle=False))
            except (OSError, ValueError) as err:
                raise PartitionError(f"{path}: cannot be read as {what}: {err}") from err
        else:
            x = load_torch_file(path, what)
        return as_index(x, what, path)
    if isinstance(x, dict):
        raise PartitionError(f"{what} is a dict of per-type ids (a heterogeneous graph); sarc "
                             f"reads homogeneous DGL partitions")
    return as_index(torch.as_tensor(x), what, what)


def _restore_mask(name: str, t: torch.Tensor) -> torch.Tensor:
    if name in BALANCE_MASKS and t.dtype == torch.uint8 and bool((t <= 1).all()):
        return t.to(torch.bool)
    return t
