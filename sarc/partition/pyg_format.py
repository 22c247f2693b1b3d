"""Reading PyG's partitions: the output of ``torch_geometric.distributed.Partitioner``.

    ROOT/META.json               {"num_parts": P, "is_hetero": false, "node_types": null, ...}
    ROOT/node_map.pt             [N]: the part of each node
    ROOT/edge_map.pt             [E]: the part of each edge (the part of its destination)
    ROOT/part_P/graph.pt         {"edge_id": [e], "row": [e] sources, "col": [e] destinations,
                                  "size": (N, N)}: the part's edges, in global ids
    ROOT/part_P/node_feats.pt    {"global_id": [n] the part's nodes, "feats": {"x": [n, F] or None}}
                                 (and "time": every node's time, when the graph has times)
    ROOT/part_P/edge_feats.pt    {} or {"global_id": [e], "feats": {"edge_attr": [e, ...]}}
                                 (and "edge_time", the part's edges' times)

PyG keeps the original ids everywhere, so sarc relabels as for its own
partitions (``relabel``: part p owns a contiguous range of new ids, its nodes
in original order), and part p owns the nodes ``node_map`` gives it.

Data: ``x`` becomes sarc's node data ``feat`` (the name sarc's trainer
reads); ``edge_attr``, ``time`` and ``edge_time`` keep their names.

The Partitioner stores no labels or splits. PyG's distributed examples keep
them beside ROOT, in the layout its documentation describes:

    PARENT/NAME-partitions/                    ROOT
    PARENT/NAME-label/label.pt                 [N] node labels (or NAME-labels/)
    PARENT/NAME-train-partitions/partitionI.pt training node ids, in chunks (and -val-, -test-)

``pyg_dataset_extras(ROOT, N)`` reads those present as ``label``,
``train_mask``, ``val_mask`` and ``test_mask``; ``read_pyg_partitions`` adds
them (``dataset_extras=True``) and any other per-node data given as
``node_data``, in original order.

A heterogeneous partition (``is_hetero``, a ``HeteroData`` partitioned) is
read by ``pyg_hetero`` as the homogeneous graph with type ids.

Not read: edge-level labels and link-prediction splits. Writing with the Partitioner needs pyg-lib or
torch-sparse (for METIS); reading needs neither, nor PyG itself.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import torch

from ..errors import PartitionError
from .foreign import (ForeignGraph, as_index, check_cover, load_torch_file, require_keys,
                      scatter_rows)
from .relabel import relabel

FEATURE_NAMES = {"x": "feat"}
"""PyG's names of node data that sarc names otherwise."""

SPLITS = ("train", "val", "test")


def read_pyg_partitions(root, *, node_data: Mapping[str, torch.Tensor] | None = None,
                        dataset_extras: bool = True, target_type: str | None = None
                        ) -> ForeignGraph:
    """The graph and partition of a ``torch_geometric.distributed.Partitioner`` output at ``root``.

    ``node_data``: more per-node data (``[N, ...]``, original order) to carry;
    ``dataset_extras``: also read the labels and splits PyG's examples keep
    beside ``root`` (``pyg_dataset_extras``); ``target_type``: the node type they are of,
    in a heterogeneous partition (``pyg_hetero``).
    """
    root = Path(root)
    meta = _read_meta(root)
    if meta["is_hetero"]:
        from .pyg_hetero import read_pyg_hetero
        return read_pyg_hetero(root, meta, node_data=node_data, dataset_extras=dataset_extras,
                               target_type=target_type)
    if target_type is not None:
        raise PartitionError(f"{root}: a target type names the labeled type of a heterogeneous "
                             f"partition; this one has one node type")
    num_parts = int(meta["num_parts"])
    node_map = as_index(load_torch_file(root / "node_map.pt", "PyG's node map"), "node_map",
                        root / "node_map.pt")
    edge_map = as_index(load_torch_file(root / "edge_map.pt", "PyG's edge map"), "edge_map",
                        root / "edge_map.pt")
    n, e = node_map.numel(), edge_map.numel()
    for t, what in ((node_map, "node_map.pt"), (edge_map, "edge_map.pt")):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_parts):
            raise PartitionError(f"{root / what}: part ids outside 0..{num_parts - 1}")

    src = torch.empty(e, dtype=torch.int64)
    dst = torch.empty(e, dtype=torch.int64)
    node_ids, edge_ids, node_chunks, edge_chunks, times = [], [], {}, {}, {}
    for p in range(num_parts):
        part_dir = root / f"part_{p}"
        if not part_dir.is_dir():
            raise PartitionError(f"{part_dir}: part {p}'s directory is missing from {root}")
        eid, row, col = _read_graph(part_dir / "graph.pt", n, e)
        if not bool((edge_map[eid] == p).all()):
            raise PartitionError(f"{part_dir / 'graph.pt'}: holds edges edge_map.pt gives "
                                 f"other parts")
        src[eid], dst[eid] = row, col
        edge_ids.append(eid)

        nf_file = part_dir / "node_feats.pt"
        nf = load_torch_file(nf_file, "the part's node features")
        require_keys(nf, ("global_id", "feats"), "the node feature file", nf_file)
        gid = as_index(nf["global_id"], "global_id", nf_file)
        if gid.numel() and (int(gid.min()) < 0 or int(gid.max()) >= n):
            raise PartitionError(f"{nf_file}: node ids outside 0..{n - 1}")
        if not bool((node_map[gid] == p).all()):
            raise PartitionError(f"{nf_file}: holds nodes node_map.pt gives other parts")
        node_ids.append(gid)
        for name, t in _feats(nf, nf_file).items():
            node_chunks.setdefault(FEATURE_NAMES.get(name, name), []).append((gid, t))
        if nf.get("time") is not None:  # the whole graph's, in every part
            times["time"] = _rows(nf["time"], n, "time", nf_file)

        ef_file = part_dir / "edge_feats.pt"
        ef = load_torch_file(ef_file, "the part's edge features") if ef_file.exists() else {}
        if not isinstance(ef, Mapping):
            raise PartitionError(f"{ef_file}: holds {type(ef).__name__}, expected a dict")
        if "global_id" in ef and not torch.equal(as_index(ef["global_id"], "global_id", ef_file),
                                                 eid):
            raise PartitionError(f"{ef_file}: its edge ids differ from graph.pt's")
        for name, t in _feats(ef, ef_file).items():
            edge_chunks.setdefault(name, []).append((eid, t))
        if ef.get("edge_time") is not None:
            edge_chunks.setdefault("edge_time", []).append((eid, _rows(ef["edge_time"], eid.numel(),
                                                                       "edge_time", ef_file)))
    check_cover(torch.cat(edge_ids), e, "edge", root)
    check_cover(torch.cat(node_ids), n, "node", root)

    for what, chunks in (("node", node_chunks), ("edge", edge_chunks)):
        partial = [k for k, c in chunks.items() if len(c) != num_parts]
        if partial:
            raise PartitionError(f"{root}: {what} data {', '.join(map(repr, partial))} is "
                                 f"missing from some parts")
    data = {k: scatter_rows(c, n, k, root) for k, c in node_chunks.items()}
    data.update(times)
    edge_data = {k: scatter_rows(c, e, k, root) for k, c in edge_chunks.items()}
    extras = pyg_dataset_extras(root, n) if dataset_extras else {}
    for k, t in {**extras, **(node_data or {})}.items():
        if k in data:
            raise PartitionError(f"{root}: node data {k!r} is both in the partition and given")
        data[k] = _rows(torch.as_tensor(t), n, k, root)
    return ForeignGraph(src, dst, n, relabel(node_map, num_parts), data, edge_data,
                        method="pyg:metis",
                        source={"format": "pyg", "path": str(root.resolve()),
                                "extras": sorted(extras)})


def pyg_dataset_extras(root, num_nodes: int) -> dict[str, torch.Tensor]:
    """The node labels and split masks PyG's examples keep beside ``root`` (``NAME-partitions``).

    ``label``: ``NAME-label/label.pt`` (or ``NAME-labels/``); ``train_mask``,
    ``val_mask``, ``test_mask``: the node ids of every ``partition*.pt`` in
    ``NAME-{train,val,test}-partitions/``. Those absent are left out; a
    directory not named ``NAME-partitions`` has none.
    """
    root = Path(root)
    name = root.name.removesuffix("-partitions")
    if name == root.name:
        return {}
    out = {}
    f = label_file(root)
    if f is not None:
        label = load_torch_file(f, "PyG's label file")
        out["label"] = _rows(label, num_nodes, "label", f"{f} (node labels; edge-level "
                                                           f"labels are not read)")
    for split in SPLITS:
        d = root.parent / f"{name}-{split}-partitions"
        if not d.is_dir():
            continue
        files = sorted(d.glob("partition*.pt"))
        if not files:
            raise PartitionError(f"{d}: no partition*.pt files of {split} node ids")
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        for f in files:
            ids = as_index(load_torch_file(f, f"PyG's {split} node ids"), f"{split} node ids", f)
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
                raise PartitionError(f"{f}: {split} node ids outside 0..{num_nodes - 1}")
            mask[ids] = True
        out[f"{split}_mask"] = mask
    return out


def label_file(root: Path) -> Path | None:
    """``NAME-label/label.pt`` (or ``NAME-labels/``) beside ``root`` (``NAME-partitions``)."""
    name = root.name.removesuffix("-partitions")
    if name == root.name:
        return None
    for d in (f"{name}-label", f"{name}-labels"):
        f = root.parent / d / "label.pt"
        if f.is_file():
            return f
    return None


def _read_meta(root: Path) -> dict:
    if not root.is_dir():
        raise PartitionError(f"{root}: no PyG partition directory here (not a directory)")
    meta_file = root / "META.json"
    if not meta_file.is_file():
        raise PartitionError(f"{root}: not a PyG partition directory: META.json is missing")
    try:
        meta = json.loads(meta_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise PartitionError(f"{meta_file}: corrupt PyG metadata: {e}") from e
    require_keys(meta, ("num_parts", "is_hetero"), "PyG's metadata", meta_file)
    if not isinstance(meta["num_parts"], int) or meta["num_parts"] < 1:
        raise PartitionError(f"{meta_file}: corrupt PyG metadata: num_parts={meta['num_parts']!r}")
    return meta


def _read_graph(file: Path, n: int, e: int):
    g = load_torch_file(file, "the part's graph")
    require_keys(g, ("edge_id", "row", "col"), "the part's graph", file)
    eid, row, col = (as_index(g[k], k, file) for k in ("edge_id", "row", "col"))
    if not eid.numel() == row.numel() == col.numel():
        raise PartitionError(f"{file}: edge_id, row and col differ in length "
                             f"({eid.numel()}, {row.numel()}, {col.numel()})")
    if "size" in g and tuple(g["size"]) != (n, n):
        raise PartitionError(f"{file}: a graph of size {tuple(g['size'])}, node_map.pt has "
                             f"{n} nodes")
    for t, count, what in ((eid, e, "edge"), (row, n, "node"), (col, n, "node")):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= count):
            raise PartitionError(f"{file}: {what} ids outside 0..{count - 1}")
    return eid, row, col


def _feats(d: Mapping, where: Path) -> dict[str, torch.Tensor]:
    feats = d.get("feats") or {}
    if not isinstance(feats, Mapping) or not all(
            t is None or isinstance(t, torch.Tensor) for t in feats.values()):
        raise PartitionError(f"{where}: 'feats' must be a dict of tensors")
    return {k: t for k, t in feats.items() if t is not None}


def _rows(t, rows: int, name: str, where) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.shape[0] != rows:
        got = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise PartitionError(f"{where}: data {name!r} must have {rows} rows, got {got}")
    return t
