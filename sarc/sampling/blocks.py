"""One layer of a sampled (or MFG) minibatch on one worker: a ``ShardedGraph``.

Layer k's block on worker r (``LayerBlock.shard``) has the fields and invariants of a
full-batch shard (``sarc.runtime.sharded``), over the nodes of the minibatch instead
of the whole graph:

- its *local rows* are the nodes of frontier_{k-1} that r owns: first the owned
  nodes of frontier_k (the layer's destinations, ``num_dst`` of them, in the order
  of layer k+1's source rows, or sorted seeds at the top layer), then the other
  owned sources, by id. Layer k-1's destinations are exactly layer k's local rows,
  in that order, so a layer's output rows are the next layer's input rows.
- ``node_offsets`` number the minibatch's layer-k source nodes worker by worker
  (worker j's local rows are ``offsets[j] .. offsets[j+1]-1``), so ``needed_rows`` /
  ``send_rows`` are rows of the peers' local rows, as in a full shard.
- ``blocks[rank]``, the local block, is bipartite: ``num_src`` = the local rows,
  ``num_dst`` = the destinations, a prefix of the sources (DGL's MFG blocks);
  ``blocks[j]`` (j != rank) are split blocks from worker j's rows into the
  destinations (``num_dst`` rows, not ``num_local``).
- degrees are the whole graph's: ``in_degree``/``out_degree`` of the local rows,
  each block's ``in_degree`` (its dst nodes) and ``out_degree`` (its src rows).
  ``sampled_in_degree`` is the number of sampled edges into each destination: a
  layer that normalizes by degree chooses the whole graph's (``in_degree``, the
  MFG's exact value) or the sample's (an unbiased mean over the sample).
- ``ndata``: the node data of the local rows; ``edata[j]``/``orig_edge_ids[j]``: of
  block j's edges, in the block's input order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import Graph
from ..runtime.sharded import ShardedGraph


@dataclass(frozen=True, eq=False)
class LayerBlock:
    layer: int                           # k, 1 = the input layer
    shard: ShardedGraph                  # the layer's block on this worker (see the module)
    num_dst: int                         # its destinations: the first num_dst local rows
    src_nodes: torch.Tensor              # [num_local] new global id of each local row
    remote_src_nodes: tuple[torch.Tensor, ...]  # [P]: new global id of block j's src rows
                                                # (empty for j == rank)
    sampled_in_degree: torch.Tensor      # [num_dst] float32, sampled edges into each destination

    @property
    def num_src(self) -> int:
        return self.shard.num_local

    @property
    def dst_nodes(self) -> torch.Tensor:
        return self.src_nodes[:self.num_dst]

    @property
    def local_block(self) -> Graph:
        """The bipartite block of this worker's own edges (every edge when P = 1)."""
        return self.shard.local_block

    @property
    def in_degree(self) -> torch.Tensor:
        """[num_dst] whole-graph in-degree of the destinations."""
        return self.shard.in_degree[:self.num_dst]

    @property
    def num_edges(self) -> int:
        return sum(b.num_edges for b in self.shard.blocks)

    def __repr__(self) -> str:
        return (f"LayerBlock(layer={self.layer}, rank={self.shard.rank}/{self.shard.num_parts}, "
                f"dst={self.num_dst}, src={self.num_src}, edges={self.num_edges})")


@dataclass(frozen=True, eq=False)
class MiniBatch:
    """A step's blocks on one worker, input layer first; the seeds are the last layer's
    destinations (the seeds this worker owns), the input nodes the first layer's sources."""

    blocks: tuple[LayerBlock, ...]

    @property
    def seeds(self) -> torch.Tensor:
        return self.blocks[-1].dst_nodes

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.blocks[0].src_nodes

    def __iter__(self):
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)
