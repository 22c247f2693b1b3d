"""A graph's fingerprint: a hash of its node count and edge list.

Partitions record the fingerprint of the graph they were cut from, so node
data, a model's outputs or another partition set of a different graph (or of
the same nodes with other edges, or the edges in another order) cannot be
matched to them by mistake.

    fingerprint = "sha256:" + sha256("sarc-graph-v1" | N | E | src | dst)

with N, E and the ids as little-endian int64. The data a dataset brings
beyond its graph (features, labels, the three splits, node types; edge types and other
edge arrays) have digests of their own (``data_digests``), recorded beside the
fingerprint.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch


def graph_fingerprint(src, dst, num_nodes: int) -> str:
    h = hashlib.sha256(b"sarc-graph-v1")
    src, dst = (np.ascontiguousarray(torch.as_tensor(t).to(torch.int64).cpu().numpy(), dtype="<i8")
                for t in (src, dst))
    h.update(np.array([num_nodes, src.size], dtype="<i8").tobytes())
    h.update(src.tobytes())
    h.update(dst.tobytes())
    return "sha256:" + h.hexdigest()


NODE_DIGEST_KEYS = {"feat": "float32", "label": "int64", "train_mask": "bool",
                    "val_mask": "bool", "test_mask": "bool", "ntype": "int64"}
"""The node data a dataset brings beyond its graph, each digested as this dtype."""

_DTYPES = {"float32": "<f4", "int64": "<i8", "bool": "|b1", "float64": "<f8"}

EDGE_DATA = "edge data"
"""The key of a digest record that names its edge arrays (``edge:<name>`` their digests),
and whose presence says the record covers edge data and node types (``"ntype"``:
``"none"`` for a graph without)."""


def dataset_digests(data) -> dict[str, str]:
    """``data_digests`` of a ``sarc.datasets.Dataset``: its node data and node types, its
    edge data (what ``sarc partition`` cuts of it)."""
    node = dict(data.node_data)
    if data.ntype is not None:
        node["ntype"] = data.ntype
    return data_digests(node, data.edge_data)


def data_digests(node_data, edge_data) -> dict[str, str]:
    """The digests of a graph's node data (``node_data_digests``) and edge data (its edge
    types and other edge arrays, each ``edge:<name>``: integers as int64, others as
    float64, so a file and the set partitioned from it agree), with ``EDGE_DATA`` naming
    the edge arrays and ``ntype`` ``"none"`` where the graph has no node types: a record
    of a graph without them is told from a record of an older sarc, which has no such
    keys and is checked by its node data alone."""
    out = node_data_digests(node_data)
    out.setdefault("ntype", "none")
    names = sorted(edge_data)
    out[EDGE_DATA] = ",".join(names)
    for name in names:
        t = torch.as_tensor(edge_data[name])
        kind = "int64" if not (t.is_floating_point() or t.is_complex()) else "float64"
        out[f"edge:{name}"] = _digest(name, kind, t)
    return out


def node_data_digests(node_data, keys=None) -> dict[str, str]:
    """Digests of a graph's node data, in the original node order: for each of
    ``NODE_DIGEST_KEYS`` in ``node_data`` (of those in ``keys``, where given)

        "sha256:" + sha256("sarc-node-data-v1" | name | dtype | ndim | shape | data)

    with the data as that key's dtype, little-endian (what ``sarc.datasets`` loads it
    as, so a dataset file and the set partitioned from it agree), ndim and shape as
    int64. One pass over each array's bytes (a copy only where it is of another dtype).
    Partition sets record them (``PartitionSet.node_digests``) so that a dataset with the
    set's edges but other features, labels or splits is not taken for it.
    """
    out = {}
    for name, dtype in NODE_DIGEST_KEYS.items():
        if name not in node_data or node_data[name] is None or (keys is not None
                                                                and name not in keys):
            continue
        out[name] = _digest(name, dtype, node_data[name])
    return out


def _digest(name: str, dtype: str, data) -> str:
    t = torch.as_tensor(data).detach().cpu()
    a = np.ascontiguousarray(t.numpy(), dtype=_DTYPES[dtype])
    h = hashlib.sha256(b"sarc-node-data-v1")
    h.update(f"{name}:{dtype}".encode())
    h.update(np.array([a.ndim, *a.shape], dtype="<i8").tobytes())
    h.update(a.reshape(-1).view(np.uint8))
    return "sha256:" + h.hexdigest()
