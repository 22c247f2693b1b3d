"""A graph's fingerprint: a hash of its node count and edge list.

Partitions record the fingerprint of the graph they were cut from, so node
data, a model's outputs or another partition set of a different graph (or of
the same nodes with other edges, or the edges in another order) cannot be
matched to them by mistake.

    fingerprint = "sha256:" + sha256("sarc-graph-v1" | N | E | src | dst)

with N, E and the ids as little-endian int64. The node data a dataset brings
beyond its graph (features, labels, the three splits) have digests of their own
(``node_data_digests``), recorded beside the fingerprint.
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
                    "val_mask": "bool", "test_mask": "bool"}
"""The node data a dataset brings beyond its graph, each digested as this dtype."""

_DTYPES = {"float32": "<f4", "int64": "<i8", "bool": "|b1"}


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
        t = torch.as_tensor(node_data[name]).detach().cpu()
        a = np.ascontiguousarray(t.numpy(), dtype=_DTYPES[dtype])
        h = hashlib.sha256(b"sarc-node-data-v1")
        h.update(f"{name}:{dtype}".encode())
        h.update(np.array([a.ndim, *a.shape], dtype="<i8").tobytes())
        h.update(a.reshape(-1).view(np.uint8))
        out[name] = "sha256:" + h.hexdigest()
    return out
