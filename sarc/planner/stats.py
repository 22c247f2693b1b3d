"""Shard statistics the planner evaluates its formulas on.

For P workers: nodes and in-edges per worker, and ``boundary[r][j]``, the
number of distinct source rows owned by worker ``j`` that worker ``r``'s
edges read (each sent once per exchange).

A minibatch layer's blocks (MFG or sampled, ``sarc.sampling``) are described the same
way, with the layer's destinations apart: ``nodes[r]`` are worker r's source rows of
the layer, ``dst_nodes[r]`` the first of them, its destinations. ``BlockSample``
holds such statistics for every layer of a sample of minibatches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class ShardStats:
    num_parts: int
    nodes: tuple[int, ...]
    edges: tuple[int, ...]
    boundary: tuple[tuple[int, ...], ...]
    dst_nodes: tuple[int, ...] | None = None  # a minibatch block's destinations (None: = nodes)

    def dst(self, r: int) -> int:
        """Worker r's destination rows (its nodes on a full-batch shard)."""
        return self.nodes[r] if self.dst_nodes is None else self.dst_nodes[r]

    @staticmethod
    def worker_figures(shard) -> list[int]:
        """One worker's figures of its shard (``sarc.runtime.sharded.ShardedGraph``: a
        full-batch shard or a minibatch layer's block): its local rows, its blocks' edges,
        the local block's destinations, then per worker the rows it reads from it (0 for
        its own). Local; ``from_figures`` joins every worker's."""
        p, r = shard.num_parts, shard.rank
        return [shard.num_local, sum(b.num_edges for b in shard.blocks), shard.local_block.num_dst,
                *(0 if j == r else int(shard.needed_rows[j].numel()) for j in range(p))]

    @staticmethod
    def from_figures(rows: Sequence[Sequence[int]]) -> "ShardStats":
        """The statistics of every worker's ``worker_figures``, by rank."""
        p = len(rows)
        return ShardStats(p, tuple(int(f[0]) for f in rows), tuple(int(f[1]) for f in rows),
                          tuple(tuple(int(b) for b in f[3:3 + p]) for f in rows),
                          tuple(int(f[2]) for f in rows))

    @staticmethod
    def from_shards(shards: Sequence) -> "ShardStats":
        """Statistics of the P workers' shards of one graph, in rank order: full-batch
        shards or one minibatch layer's blocks."""
        p = len(shards)
        if [sh.rank for sh in shards] != list(range(p)) or any(sh.num_parts != p for sh in shards):
            raise ValueError(f"expected the shards of ranks 0..{p - 1} of one {p}-part graph, got "
                             f"ranks {[sh.rank for sh in shards]} of "
                             f"{sorted({sh.num_parts for sh in shards})} parts")
        return ShardStats.from_figures([ShardStats.worker_figures(sh) for sh in shards])

    @staticmethod
    def of_worker(shard) -> "ShardStats":
        """What one worker knows of its own shard alone (``from_shards``' row of its rank;
        the other workers' figures are 0): enough to price its own memory, not its
        peers' traffic. Local."""
        none = [0] * (3 + shard.num_parts)
        return ShardStats.from_figures([ShardStats.worker_figures(shard) if j == shard.rank
                                        else none for j in range(shard.num_parts)])

    @staticmethod
    def elementwise_max(stats: Sequence["ShardStats"]) -> "ShardStats":
        """Per worker (and worker pair), the largest figure of ``stats``: the statistics no
        batch of a sample exceeds anywhere."""
        if not stats:
            raise ValueError("no statistics to take the maximum of")
        p = stats[0].num_parts
        if any(s.num_parts != p for s in stats):
            raise ValueError("statistics of different worker counts")
        big = lambda rows: tuple(max(r) for r in zip(*rows))  # noqa: E731
        return ShardStats(p, big([s.nodes for s in stats]), big([s.edges for s in stats]),
                          tuple(big([s.boundary[r] for s in stats]) for r in range(p)),
                          big([tuple(s.dst(r) for r in range(p)) for s in stats]))

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
        out = {"num_parts": self.num_parts, "nodes": list(self.nodes), "edges": list(self.edges),
               "boundary": [list(r) for r in self.boundary]}
        if self.dst_nodes is not None:
            out["dst_nodes"] = list(self.dst_nodes)
        return out


@dataclass(frozen=True)
class BlockSample:
    """The blocks of a sample of minibatches: ``batches[b][k]``, the statistics of layer
    k+1's blocks (input layer first) in batch b, over P workers.

    ``fanouts``: in-edges sampled per destination at each layer (None: every in-edge,
    the MFG); ``batch_size``: seeds per step over all workers (as in training)."""

    batches: tuple[tuple[ShardStats, ...], ...]
    batch_size: int
    fanouts: tuple[int, ...] | None = None

    def __post_init__(self):
        if not self.batches:
            raise ValueError("a block sample needs at least one batch")
        if len({len(b) for b in self.batches}) != 1:
            raise ValueError("every batch of a block sample has the same layers")

    @property
    def num_layers(self) -> int:
        return len(self.batches[0])

    @property
    def num_parts(self) -> int:
        return self.batches[0][0].num_parts

    def layer(self, k: int) -> tuple[ShardStats, ...]:
        """Layer k's statistics (0: the input layer), one per batch."""
        return tuple(b[k] for b in self.batches)

    def largest(self, k: int) -> ShardStats:
        """Layer k's largest figures over the batches (what its plan is made for)."""
        return ShardStats.elementwise_max(self.layer(k))

    def summary(self, k: int) -> dict:
        """Layer k's block sizes per worker, mean and max over the batches: destinations,
        source rows, edges, rows received from peers."""
        figures = {"dst": lambda s, r: s.dst(r), "src": lambda s, r: s.nodes[r],
                   "edges": lambda s, r: s.edges[r], "remote_rows": lambda s, r: s.received_rows(r)}
        stats = self.layer(k)
        out = {}
        for name, get in figures.items():
            values = [get(s, r) for s in stats for r in range(s.num_parts)]
            out[name] = {"mean": sum(values) / len(values), "max": max(values)}
        return out

    def to_json(self) -> dict:
        return {"batch_size": self.batch_size,
                "fanouts": None if self.fanouts is None else list(self.fanouts),
                "batches": len(self.batches),
                "layers": [self.summary(k) for k in range(self.num_layers)]}
