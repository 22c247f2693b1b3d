"""A step's rows of node data (features, labels) from their owners: one exchange.

``fetch_rows(shard, ids, names)`` returns, for any new global ids, the rows of node
data ``names`` (each row fetched once, however often it is asked for; a worker's
own rows are not sent). The ids go to their owners and the rows come back, every
named tensor of a row packed side by side (as exact 64-bit words) in one message
per peer.
"""
from __future__ import annotations

import math

import torch

from ..runtime.sharded import ShardedGraph
from .comm import Comm
from .spec import SamplingError


def fetch_rows(shard: ShardedGraph, ids, names, comm: Comm | None = None) -> dict[str, torch.Tensor]:
    """``{name: rows of ndata[name] at ids}`` (collective: every worker calls it)."""
    comm = comm if comm is not None else Comm()
    missing = [n for n in names if n not in shard.ndata]
    if missing:
        raise SamplingError(f"no node data {', '.join(map(repr, missing))} to fetch (the graph "
                            f"has: {', '.join(sorted(shard.ndata)) or 'none'})")
    ids = torch.as_tensor(ids).cpu().reshape(-1)
    n = shard.num_nodes
    problem = None
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        problem = f"node ids to fetch must be integers, got {ids.dtype}"
    elif ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        problem = f"node {bad} is not a node of the graph (ids 0..{n - 1})"
    comm.agree(problem)
    ids = ids.to(torch.int64)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    owner = torch.searchsorted(shard.node_offsets.cpu(), uniq, right=True) - 1
    asks = [uniq[owner == j] for j in range(comm.size)]
    asked = comm.exchange(asks)
    lo = shard.local_range[0]
    cols = [shard.ndata[n] for n in names]
    packed = (torch.cat([_words(c) for c in cols], 1).cpu() if cols
              else torch.zeros(shard.num_local, 0, dtype=torch.int64))
    rows = comm.exchange([packed.index_select(0, a - lo) for a in asked],
                         sizes=[int(a.numel()) for a in asks], kind="rows")
    got = torch.zeros(uniq.numel(), packed.shape[1], dtype=torch.int64)
    for j in range(comm.size):
        got[owner == j] = rows[j]
    result, off = {}, 0
    for n, c in zip(names, cols):
        w = math.prod(c.shape[1:])
        result[n] = _unwords(got[:, off:off + w], c).reshape(uniq.numel(), *c.shape[1:])[inverse]
        off += w
    return result


def _words(t: torch.Tensor) -> torch.Tensor:
    """[n, width] int64 holding ``t``'s rows exactly: floats as the bits of their float64
    value, integers and bools as int64 (so features and labels go in one message)."""
    t = t.reshape(t.shape[0], -1)
    return t.to(torch.float64).view(torch.int64) if t.dtype.is_floating_point else t.to(torch.int64)


def _unwords(words: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    words = words.contiguous()
    return (words.view(torch.float64) if like.dtype.is_floating_point else words).to(like.dtype)
