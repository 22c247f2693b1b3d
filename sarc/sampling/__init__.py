"""Minibatches across shards: the K-hop closure of a step's seeds (MFG), sampled or
whole, the seeds of each worker per step, and their rows of node data.

    comm = Comm(group)                                   # or Comm(): one process
    loader = SeedLoader(shard, "train_mask", batch_size=B, comm=comm)
    sampler = NeighbourSampler(shard, SamplingSpec.of([10, 25], layers=2), comm)
    for seeds in loader.epoch(e):                        # as many steps on every worker
        mb = sampler.sample(seeds, e)                    # collective: ids cross, nothing else
        mb.blocks[k - 1].shard                           # layer k's block, a ShardedGraph

Modules: ``spec`` (fanouts, replacement, probabilities, checked before anything is
exchanged), ``draws`` (counter-based uniforms: a node's sample depends on (seed,
epoch, layer, its original id) only), ``comm`` (sizes gathered, tensors exchanged;
identity in one process), ``neighbours`` (a shard's in-edges and the neighbour
sample), ``blocks`` (a layer's block as a ``ShardedGraph``), ``closure`` (the
layers, from the seeds down), ``loader`` (``node_split`` and the seed batches),
``fetch`` (rows of node data from their owners), ``negative`` (link prediction's
negative edges, drawn by key).
"""
from .blocks import LayerBlock, MiniBatch
from .closure import NeighbourSampler
from .comm import Comm
from .fetch import fetch_rows
from .loader import SeedLoader, node_split
from .spec import ALL, SamplingError, SamplingSpec

__all__ = ["SamplingSpec", "SamplingError", "ALL", "Comm", "NeighbourSampler", "LayerBlock",
           "MiniBatch", "SeedLoader", "node_split", "fetch_rows"]
