"""What one worker holds: its shard of a partitioned graph.

Worker ``rank`` of P owns the nodes of part ``rank``: the contiguous new
global ids ``lo .. hi-1`` (``local_range``), local row i being global id
``lo + i``. It holds every edge into those nodes, as one block per source
shard j (``blocks[j]``):

- ``blocks[rank]``, the local block: edges between local nodes, an ordinary
  block (``num_src == num_dst ==`` the local node count, src row = local row).
- ``blocks[j]``, j != rank: the edges from shard j's nodes into local nodes,
  a split block (``dst_in_src=False``): ``num_dst`` local nodes, and
  ``num_src`` the distinct rows of shard j these edges read, which are
  ``needed_rows[j]`` (sorted, in j's local numbering): src row k of the block
  is row ``needed_rows[j][k]`` of shard j.

The exchange, per peer j (each boundary row listed once, sorted):

- ``recv_rows[j]``: rows of shard j this worker receives (= ``needed_rows[j]``;
  empty for j == rank);
- ``send_rows[j]``: local rows shard j needs, which this worker sends; they
  are exactly shard j's ``recv_rows[rank]``.

So an aggregation over all edges into the local nodes is the sum (or max,
...) over j of the aggregation on ``blocks[j]`` of the rows ``x_j[needed_rows[j]]``.

A minibatch layer's shard (``sarc.sampling.blocks``) has the same fields over the
minibatch's nodes, with one difference: its local block is bipartite, the layer's
destinations being the first ``local_block.num_dst`` of its ``num_local`` rows, and
the other blocks have those ``num_dst`` destinations (``DistGraph`` runs a layer on
either).

Degrees are the whole graph's: ``in_degree``/``out_degree`` of the local
nodes, and every block's ``in_degree`` (its dst nodes) and ``out_degree``
(its src rows) are whole-graph degrees, as layers normalize by them.
``ndata`` is the node data of the local nodes; ``edata[j]`` the edge data of
block j's edges, in the order the block was built from (``Graph.perm`` maps
it to CSR order, as for any graph).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..errors import PartitionError
from ..graph import Graph


@dataclass(frozen=True, eq=False)
class ShardedGraph:
    rank: int
    num_parts: int
    node_offsets: torch.Tensor              # [P + 1] int64, shard j owns new ids [offsets[j], offsets[j+1])
    blocks: tuple[Graph, ...]               # [P]: edges from shard j into local nodes
    needed_rows: tuple[torch.Tensor, ...]   # [P]: block j's src rows, in shard j's local ids
    send_rows: tuple[torch.Tensor, ...]     # [P]: local rows shard j needs (empty for j == rank)
    in_degree: torch.Tensor                 # [num_local] float32, whole-graph in-degree
    out_degree: torch.Tensor                # [num_local] float32, whole-graph out-degree
    ndata: dict[str, torch.Tensor]          # [num_local, ...] each
    edata: tuple[dict[str, torch.Tensor], ...]  # [P]: per block, in block input order
    orig_node_ids: torch.Tensor             # [num_local]: original id of each local node
    orig_edge_ids: tuple[torch.Tensor, ...]  # [P]: original id of each block edge (input order)

    @property
    def num_nodes(self) -> int:
        """Nodes in the whole graph."""
        return int(self.node_offsets[-1])

    @property
    def local_range(self) -> tuple[int, int]:
        return int(self.node_offsets[self.rank]), int(self.node_offsets[self.rank + 1])

    @property
    def num_local(self) -> int:
        lo, hi = self.local_range
        return hi - lo

    @property
    def local_block(self) -> Graph:
        return self.blocks[self.rank]

    @property
    def recv_rows(self) -> tuple[torch.Tensor, ...]:
        """[P]: rows of shard j this worker receives, in j's local ids (empty for j == rank)."""
        empty = torch.zeros(0, dtype=torch.int64, device=self.in_degree.device)
        return tuple(empty if j == self.rank else r for j, r in enumerate(self.needed_rows))

    def peers(self) -> list[int]:
        """The other ranks this worker exchanges rows with, in either direction."""
        return [j for j in range(self.num_parts) if j != self.rank
                and (self.needed_rows[j].numel() or self.send_rows[j].numel())]

    @staticmethod
    def from_partitions(pset, rank: int) -> "ShardedGraph":
        """Worker ``rank``'s shard of a loaded partition set (``sarc.partition.load_partitions``)."""
        return build_shard(pset.load_part(rank), pset.node_offsets, rank)

    def boundary_digests(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(sends, reads): per peer j, a digest of the rows this shard sends to j and of the
        rows it reads from j, each row as its global id and whole-graph out-degree (0 for
        j == rank). In one partition set, shard i's ``sends[j]`` is shard j's ``reads[i]``;
        shards of different sets (another graph, another partitioning) differ, and their
        exchanges would not match in size."""
        sends, reads = [], []
        for j in range(self.num_parts):
            if j == self.rank:
                sends.append(0)
                reads.append(0)
                continue
            rows = self.send_rows[j]
            sends.append(_rows_digest(rows + self.local_range[0], self.out_degree[rows]))
            reads.append(_rows_digest(self.needed_rows[j] + int(self.node_offsets[j]),
                                      self.blocks[j].out_degree))
        return tuple(sends), tuple(reads)

    def to(self, device) -> "ShardedGraph":
        def move(ts):
            return tuple(t.to(device) for t in ts)
        return ShardedGraph(
            self.rank, self.num_parts, self.node_offsets, tuple(b.to(device) for b in self.blocks),
            move(self.needed_rows), move(self.send_rows), self.in_degree.to(device),
            self.out_degree.to(device), {k: v.to(device) for k, v in self.ndata.items()},
            tuple({k: v.to(device) for k, v in e.items()} for e in self.edata),
            self.orig_node_ids.to(device), move(self.orig_edge_ids))

    def __repr__(self) -> str:
        lo, hi = self.local_range
        return (f"ShardedGraph(rank={self.rank}/{self.num_parts}, nodes=[{lo}, {hi}), "
                f"edges={sum(b.num_edges for b in self.blocks)}, "
                f"recv={sum(int(r.numel()) for r in self.recv_rows)} rows, "
                f"send={sum(int(s.numel()) for s in self.send_rows)} rows)")


def build_shard(part, node_offsets: torch.Tensor, rank: int) -> ShardedGraph:
    """The shard of ``part`` (a ``sarc.partition.Part``), the part of ``rank``."""
    num_parts = int(node_offsets.numel()) - 1
    lo, hi = int(node_offsets[rank]), int(node_offsets[rank + 1])
    if (part.lo, part.hi) != (lo, hi):
        raise PartitionError(f"part holds nodes [{part.lo}, {part.hi}) but rank {rank} owns "
                             f"[{lo}, {hi}) in this partition set")
    n = hi - lo
    in_degree = part.in_degree().to(torch.float32)
    out_degree = part.out_degree.to(torch.float32)
    # Edges grouped by the shard owning their source, in part order within a shard.
    shard = torch.searchsorted(node_offsets, part.edge_src, right=True) - 1
    order = torch.argsort(shard, stable=True)
    counts = torch.bincount(shard, minlength=num_parts).tolist()
    blocks, needed, edata, edge_ids = [], [], [], []
    for j, e in enumerate(torch.split(order, counts)):
        src = part.edge_src[e] - int(node_offsets[j])
        dst = part.edge_dst[e] - lo
        if j == rank:
            rows = torch.arange(n)
            block = Graph.from_edges(src, dst, num_src=n, num_dst=n,
                                     in_degree=in_degree, out_degree=out_degree)
        else:
            rows, src = torch.unique(src, return_inverse=True)
            block = Graph.from_edges(src, dst, num_src=rows.numel(), num_dst=n, dst_in_src=False,
                                     in_degree=in_degree,
                                     out_degree=_halo_out_degree(part, rows + int(node_offsets[j])))
        blocks.append(block)
        needed.append(rows)
        edata.append({k: v.index_select(0, e) for k, v in part.edata.items()})
        edge_ids.append(part.orig_edge_ids[e])
    send = tuple(part.send_rows_to(j) for j in range(num_parts))
    return ShardedGraph(rank, num_parts, node_offsets, tuple(blocks), tuple(needed), send,
                        in_degree, out_degree, dict(part.ndata), tuple(edata),
                        part.orig_node_ids, tuple(edge_ids))


def _halo_out_degree(part, nodes: torch.Tensor) -> torch.Tensor:
    """Whole-graph out-degree of remote ``nodes`` (new global ids), from the part's halo table."""
    at = torch.searchsorted(part.halo_nodes, nodes)
    if nodes.numel() and (int(at.max()) >= part.halo_nodes.numel()
                          or not torch.equal(part.halo_nodes[at], nodes)):
        raise PartitionError("corrupt part: its halo table lacks some remote source nodes")
    return part.halo_out_degree[at].to(torch.float32)


def _rows_digest(ids: torch.Tensor, degree: torch.Tensor) -> int:
    """A signed 64-bit digest of rows (global ids, out-degrees)."""
    h = hashlib.sha256(ids.cpu().to(torch.int64).numpy().astype("<i8").tobytes())
    h.update(degree.cpu().to(torch.float32).numpy().astype("<f4").tobytes())
    return int.from_bytes(h.digest()[:8], "little", signed=True)
