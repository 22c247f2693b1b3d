"""A graph's fingerprint: a hash of its node count and edge list.

Partitions record the fingerprint of the graph they were cut from, so node
data, a model's outputs or another partition set of a different graph (or of
the same nodes with other edges, or the edges in another order) cannot be
matched to them by mistake.

    fingerprint = "sha256:" + sha256("sarc-graph-v1" | N | E | src | dst)

with N, E and the ids as little-endian int64.
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
