"""Reading PyG's heterogeneous partitions: ``Partitioner`` on a ``HeteroData``.

    ROOT/META.json                {"num_parts": P, "is_hetero": true, "node_types": [...],
                                   "edge_types": [[SRC, REL, DST], ...], "node_offset": [...]}
    ROOT/node_map/NTYPE.pt        [N_t]: the part of each node of the type
    ROOT/edge_map/SRC__REL__DST.pt [E_t]: the part of each edge of the type
    ROOT/part_P/graph.pt          {(SRC, REL, DST): {"edge_id": [e] homogeneous edge ids,
                                   "row", "col": [e] ids within SRC and DST, "size"}}
    ROOT/part_P/node_feats.pt     {NTYPE: {"global_id": [n] homogeneous ids, "id": [n] ids
                                   within the type, "feats": {"x": [n, F] or None}, ("time")}}
    ROOT/part_P/edge_feats.pt     {(SRC, REL, DST): {"global_id": [e] ids within the type,
                                   "feats": {"edge_attr": ...}, ("edge_time")}}

PyG numbers the homogeneous graph as ``HeteroData.to_homogeneous`` does:
nodes by type in ``node_types`` order, then by id within the type; edges
likewise in ``edge_types`` order. sarc reads that graph, with ``ntype`` and
``etype`` (the types' positions in those lists), each type's data joined by
``foreign.merge_typed`` (``x`` becomes ``feat``; PyG keeps ``x`` only where
every type has it with one width, and writes NaN rows of ``edge_attr`` for
edge types without it), the types in the set's metadata (edge types named
``SRC__REL__DST``, as PyG names their files).

Labels and splits beside ROOT (``pyg_format.pyg_dataset_extras``) are those
of one target node type (PyG's examples save ``data[TARGET].y`` and the
target's split ids): ``target_type`` names it, or it is the one node type with
as many nodes as ``label.pt`` has rows. Nodes of the other types are
unlabeled (label -1) and in no split.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch

from ..errors import PartitionError
from .foreign import (ETYPE, NTYPE, ForeignGraph, as_index, check_cover, load_torch_file,
                      merge_typed, require_keys, scatter_rows, types_record)
from .relabel import relabel


def read_pyg_hetero(root: Path, meta: dict, *, node_data: Mapping[str, torch.Tensor] | None,
                    dataset_extras: bool, target_type: str | None) -> ForeignGraph:
    """The homogeneous graph with type ids of a heterogeneous PyG partition at ``root``."""
    from .pyg_format import FEATURE_NAMES, _feats, pyg_dataset_extras, _rows

    meta_file = root / "META.json"
    ntypes, etypes = _types(meta, meta_file)
    enames = ["__".join(t) for t in etypes]
    num_parts = int(meta["num_parts"])
    node_maps = [_part_map(root / "node_map" / f"{t}.pt", "node map", num_parts) for t in ntypes]
    edge_maps = [_part_map(root / "edge_map" / f"{t}.pt", "edge map", num_parts) for t in enames]
    ncounts = [int(m.numel()) for m in node_maps]
    ecounts = [int(m.numel()) for m in edge_maps]
    noff = _offsets(ncounts)
    eoff = _offsets(ecounts)
    if meta.get("node_offset") is not None and list(meta["node_offset"]) != noff[:-1]:
        raise PartitionError(f"{meta_file}: node_offset {meta['node_offset']} differs from the "
                             f"node maps' counts (offsets {noff[:-1]})")
    n, e = noff[-1], eoff[-1]
    node_part, edge_part = torch.cat(node_maps), torch.cat(edge_maps)
    src = torch.empty(e, dtype=torch.int64)
    dst = torch.empty(e, dtype=torch.int64)
    node_ids, edge_ids = [], []
    node_chunks: dict = {t: {} for t in ntypes}
    edge_chunks: dict = {t: {} for t in enames}
    times: dict = {t: {} for t in ntypes}
    for p in range(num_parts):
        part_dir = root / f"part_{p}"
        if not part_dir.is_dir():
            raise PartitionError(f"{part_dir}: part {p}'s directory is missing from {root}")
        graph_file = part_dir / "graph.pt"
        graph = load_torch_file(graph_file, "the part's graph")
        require_keys(graph, [tuple(t) for t in etypes], "the part's graph", graph_file)
        for k, (s, _, d) in enumerate(etypes):
            g = graph[etypes[k]]
            require_keys(g, ("edge_id", "row", "col"), f"edge type {enames[k]!r}", graph_file)
            eid, row, col = (as_index(g[x], x, graph_file) for x in ("edge_id", "row", "col"))
            si, di = ntypes.index(s), ntypes.index(d)
            _in_range(eid, eoff[k], eoff[k + 1], f"{enames[k]!r} edge", graph_file)
            _in_range(row, 0, ncounts[si], f"{s!r} node", graph_file)
            _in_range(col, 0, ncounts[di], f"{d!r} node", graph_file)
            if not eid.numel() == row.numel() == col.numel():
                raise PartitionError(f"{graph_file}: edge type {enames[k]!r}: edge_id, row and "
                                     f"col differ in length")
            if not bool((edge_part[eid] == p).all()):
                raise PartitionError(f"{graph_file}: holds edges the edge maps give other parts")
            src[eid], dst[eid] = row + noff[si], col + noff[di]
            edge_ids.append(eid)

        nf_file = part_dir / "node_feats.pt"
        nf = load_torch_file(nf_file, "the part's node features")
        require_keys(nf, ntypes, "the node feature file", nf_file)
        for t, name in enumerate(ntypes):
            f = nf[name]
            require_keys(f, ("global_id", "feats"), f"node type {name!r}", nf_file)
            gid = as_index(f["global_id"], "global_id", nf_file)
            _in_range(gid, noff[t], noff[t + 1], f"{name!r} node", nf_file)
            if not bool((node_part[gid] == p).all()):
                raise PartitionError(f"{nf_file}: holds nodes the node maps give other parts")
            node_ids.append(gid)
            for k, x in _feats(f, nf_file).items():
                node_chunks[name].setdefault(FEATURE_NAMES.get(k, k), []).append((gid - noff[t], x))
            if f.get("time") is not None:
                times[name]["time"] = _rows(f["time"], ncounts[t], "time", nf_file)

        ef_file = part_dir / "edge_feats.pt"
        ef = load_torch_file(ef_file, "the part's edge features") if ef_file.exists() else {}
        if not isinstance(ef, Mapping):
            raise PartitionError(f"{ef_file}: holds {type(ef).__name__}, expected a dict")
        for k, et in enumerate(etypes):
            f = ef.get(et) or {}
            if not f:
                continue
            require_keys(f, ("global_id",), f"edge type {enames[k]!r}", ef_file)
            eid = as_index(f["global_id"], "global_id", ef_file)
            _in_range(eid, 0, ecounts[k], f"{enames[k]!r} edge", ef_file)
            for name, x in _feats(f, ef_file).items():
                edge_chunks[enames[k]].setdefault(name, []).append((eid, x))
            if f.get("edge_time") is not None:
                edge_chunks[enames[k]].setdefault("edge_time", []).append(
                    (eid, _rows(f["edge_time"], eid.numel(), "edge_time", ef_file)))
    check_cover(torch.cat(edge_ids), e, "edge", root)
    check_cover(torch.cat(node_ids), n, "node", root)

    per_node = {t: {**{k: _whole(c, ncounts[i], k, t, num_parts, root)
                       for k, c in node_chunks[t].items()}, **times[t]}
                for i, t in enumerate(ntypes)}
    per_edge = {t: {k: _whole(c, ecounts[i], k, t, None, root)
                    for k, c in edge_chunks[t].items()} for i, t in enumerate(enames)}
    target, extras = None, {}
    if dataset_extras:
        target = _target_type(root, ntypes, ncounts, target_type)
        if target is not None:
            extras = pyg_dataset_extras(root, ncounts[ntypes.index(target)])
            for k, x in extras.items():
                if k in per_node[target]:
                    raise PartitionError(f"{root}: node data {k!r} of {target!r} is both in "
                                         f"the partition and beside it")
                per_node[target][k] = x
    data, node_shapes = merge_typed(dict(zip(ntypes, ncounts)), per_node, "node", root)
    edge_data, edge_shapes = merge_typed(dict(zip(enames, ecounts)), per_edge, "edge", root)
    for kind, d, counts in (("node", data, ncounts), ("edge", edge_data, ecounts)):
        key = NTYPE if kind == "node" else ETYPE
        if key in d:
            raise PartitionError(f"{root}: {kind} data {key!r} would be overwritten by the "
                                 f"{kind} type ids sarc adds to a heterogeneous graph")
        d[key] = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    for k, x in (node_data or {}).items():
        if k in data:
            raise PartitionError(f"{root}: node data {k!r} is both in the partition and given")
        data[k] = _rows(torch.as_tensor(x), n, k, root)
    source = {"format": "pyg", "path": str(root.resolve()), "extras": sorted(extras),
              "target_type": target}
    return ForeignGraph(src, dst, n, relabel(node_part, num_parts), data, edge_data,
                        method="pyg:metis", source=source,
                        types=types_record(ntypes, enames, node_shapes, edge_shapes))


def _types(meta: dict, meta_file: Path) -> tuple[list[str], list[tuple[str, str, str]]]:
    require_keys(meta, ("node_types", "edge_types"), "PyG's metadata", meta_file)
    ntypes, etypes = meta["node_types"], meta["edge_types"]
    if not isinstance(ntypes, list) or not ntypes or not all(isinstance(t, str) for t in ntypes) \
            or len(set(ntypes)) != len(ntypes):
        raise PartitionError(f"{meta_file}: corrupt PyG metadata: node_types={ntypes!r}")
    if not isinstance(etypes, list) or not all(
            isinstance(t, list) and len(t) == 3 and t[0] in ntypes and t[2] in ntypes
            for t in etypes):
        raise PartitionError(f"{meta_file}: corrupt PyG metadata: edge_types={etypes!r} (each "
                             f"[SRC, REL, DST] of the node types)")
    return ntypes, [tuple(t) for t in etypes]


def _part_map(file: Path, what: str, num_parts: int) -> torch.Tensor:
    m = as_index(load_torch_file(file, f"PyG's {what}"), what, file)
    if m.numel() and (int(m.min()) < 0 or int(m.max()) >= num_parts):
        raise PartitionError(f"{file}: part ids outside 0..{num_parts - 1}")
    return m


def _offsets(counts: list[int]) -> list[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def _in_range(ids: torch.Tensor, lo: int, hi: int, what: str, where: Path) -> None:
    if ids.numel() and (int(ids.min()) < lo or int(ids.max()) >= hi):
        raise PartitionError(f"{where}: {what} ids outside {lo}..{hi - 1}")


def _whole(chunks, rows: int, name: str, type_name: str, num_parts, where) -> torch.Tensor:
    """A type's data of ``name`` from the parts' chunks; every row given once."""
    if num_parts is not None and len(chunks) != num_parts:
        raise PartitionError(f"{where}: node data {name!r} of type {type_name!r} is missing "
                             f"from some parts")
    ids = torch.cat([i for i, _ in chunks])
    check_cover(ids, rows, f"{type_name!r} row of {name!r}", where)
    return scatter_rows(chunks, rows, name, where)


def _target_type(root: Path, ntypes: list[str], counts: list[int], given: str | None):
    """The node type the labels and splits beside ``root`` are of, or None without any."""
    from .pyg_format import label_file
    if given is not None:
        if given not in ntypes:
            raise PartitionError(f"{root}: no node type {given!r} (the types are "
                                 f"{', '.join(ntypes)})")
        return given
    f = label_file(root)
    if f is None:
        return None
    label = load_torch_file(f, "PyG's label file")
    rows = label.shape[0] if isinstance(label, torch.Tensor) and label.dim() else None
    match = [t for t, c in zip(ntypes, counts) if c == rows]
    if len(match) != 1:
        raise PartitionError(f"{f}: {rows} labels; "
                             + ("no node type has as many nodes" if not match else
                                f"the node types {', '.join(match)} all have as many nodes")
                             + f" ({', '.join(f'{t}: {c}' for t, c in zip(ntypes, counts))}); "
                               f"name the labeled type (target_type=; sarc partition "
                               f"--pyg-target-type TYPE)")
    return match[0]
