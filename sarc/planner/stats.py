"""Shard statistics the planner evaluates its formulas on.

For P workers: nodes and in-edges per worker, and ``boundary[r][j]``, the
number of distinct source rows owned by worker ``j`` that worker ``r``'s
edges read (each sent once per exchange).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ShardStats:
    num_parts: int
    nodes: tuple[int, ...]
    edges: tuple[int, ...]
    boundary: tuple[tuple[int, ...], ...]

    @staticmethod
    def from_assignment(src, dst, part, num_parts: int) -> "ShardStats":
        """Statistics of a partitioned graph: ``part[v]`` is node v's worker."""
        src, dst, part = (torch.as_tensor(t, dtype=torch.int64) for t in (src, dst, part))
        nodes = torch.bincount(part, minlength=num_parts)
        edges = torch.bincount(part[dst], minlength=num_parts)
        p_dst, p_src = part[dst], part[src]
        remote = p_dst != p_src
        n = max(int(part.numel()), 1)
        # distinct (reader worker, source node) pairs among remote edges
        pairs = torch.unique(p_dst[remote] * n + src[remote])
        readers, rows = pairs // n, pairs % n
        owners = part[rows]
        mat = torch.zeros(num_parts, num_parts, dtype=torch.int64)
        mat.index_put_((readers, owners), torch.ones_like(readers), accumulate=True)
        return ShardStats(num_parts, tuple(nodes.tolist()), tuple(edges.tolist()),
                              tuple(tuple(r) for r in mat.tolist()))

    @staticmethod
    def from_partition_set(pset) -> "ShardStats":
        """Statistics of a partition set written by ``sarc partition`` (``sarc.partition``)."""
        offsets = pset.node_offsets
        src, dst = [], []
        for p in range(pset.num_parts):
            part = pset.load_part(p)
            src.append(part.edge_src)
            dst.append(part.edge_dst)
        n = int(offsets[-1])
        part_of = torch.bucketize(torch.arange(n), offsets[1:], right=True)
        return ShardStats.from_assignment(torch.cat(src), torch.cat(dst), part_of, pset.num_parts)

    def received_rows(self, r: int) -> int:
        return sum(self.boundary[r])

    def to_json(self) -> dict:
        return {"num_parts": self.num_parts, "nodes": list(self.nodes), "edges": list(self.edges),
                "boundary": [list(r) for r in self.boundary]}
