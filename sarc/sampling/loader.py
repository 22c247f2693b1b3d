"""The training seeds of each worker, step by step: DistDGL's ``node_split``.

``node_split``: the training nodes, by id (so by owner, as a part's ids are
contiguous), are cut into P consecutive runs of ``n // P`` or ``n // P + 1`` nodes,
run t for worker t: every worker gets as many nodes as any other (to one), and they
are its own nodes where the balance allows (the cut moves only the nodes that spill
over a part's share). Construction is collective: one ``all_gather`` of the counts,
one exchange of the nodes that move.

``SeedLoader`` iterates a worker's split in batches. Every worker has the same
number of steps per epoch (``len(loader)``): with ``drop_last`` the steps that fill
a batch on the smallest split, else enough for the largest; a worker whose split
runs out yields empty batches, and still takes part in every step's collectives.
With ``shuffle``, epoch e's order is the nodes sorted by ``draws.uniform(seed, e,
original id)``: a reshuffle per epoch that any worker count reproduces.
"""
from __future__ import annotations

import torch

from ..runtime.sharded import ShardedGraph
from .comm import Comm
from .draws import SHUFFLE_KEY, uniform
from .spec import SamplingError


def node_split(shard: ShardedGraph, mask, comm: Comm | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(this worker's training nodes as new global ids sorted, their original ids, the number
    of training nodes in the graph). ``mask``: a bool node-data name or a [num_local] bool
    tensor (collective)."""
    comm = comm if comm is not None else Comm()
    if isinstance(mask, str):
        if mask not in shard.ndata:
            raise SamplingError(f"no node data {mask!r} for the training nodes (the graph has: "
                                f"{', '.join(sorted(shard.ndata)) or 'none'})")
        mask = shard.ndata[mask]
    mask = torch.as_tensor(mask).cpu()
    ok = mask.dtype == torch.bool and mask.shape == (shard.num_local,)
    comm.agree(None if ok else f"the training mask must be a bool tensor with one entry per "
                               f"local node ({shard.num_local}), got {mask.dtype} {list(mask.shape)}")
    lo = shard.local_range[0]
    local = mask.nonzero().squeeze(1)
    mine = torch.stack([local + lo, shard.orig_node_ids.cpu()[local]], 1)
    counts = [c[0] for c in comm.all_gather([int(local.numel())])]
    total, p, r = sum(counts), comm.size, comm.rank
    start = sum(counts[:r])
    bounds = torch.tensor([t * (total // p) + min(t, total % p) for t in range(p + 1)])
    target = torch.searchsorted(bounds, torch.arange(start, start + local.numel()), right=True) - 1
    got = torch.cat(comm.exchange([mine[target == t] for t in range(p)]))
    order = torch.argsort(got[:, 0])
    return got[order, 0].contiguous(), got[order, 1].contiguous(), total


class SeedLoader:
    """Per epoch, the batches of seeds of this worker (new global ids)."""

    def __init__(self, shard: ShardedGraph, mask="train_mask", *, batch_size: int,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0,
                 comm: Comm | None = None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise SamplingError(f"batch size must be a positive number of seed nodes, got "
                                f"{batch_size!r}")
        self.comm = comm if comm is not None else Comm()
        self.nodes, self.orig_ids, self.total = node_split(shard, mask, self.comm)
        self.batch_size, self.shuffle, self.drop_last, self.seed = batch_size, shuffle, drop_last, seed
        p = self.comm.size
        smallest, largest = self.total // p, -(-self.total // p)
        self.steps = smallest // batch_size if drop_last else -(-largest // batch_size)

    def __len__(self) -> int:
        return self.steps

    def epoch(self, epoch: int):
        """The epoch's batches: ``len(self)`` tensors of at most ``batch_size`` seeds."""
        nodes = self.nodes
        if self.shuffle:
            key = uniform(self.seed, epoch, SHUFFLE_KEY, self.orig_ids)
            nodes = nodes[torch.argsort(key)] if nodes.numel() else nodes
        b = self.batch_size
        for s in range(self.steps):
            yield nodes[s * b:(s + 1) * b]
