"""Sharded tensors addressed by global id: each worker holds its partition's rows.

A ``ShardedTensor`` has ``offsets[-1]`` rows; worker r holds rows
``offsets[r] .. offsets[r+1]-1`` (the partition's contiguous new global ids, as
``ShardedGraph.node_offsets``). ``pull(ids)`` returns the rows of any global ids
and ``push(ids, values)`` adds to (or sets) them, wherever they live:

- the ids are made unique first, so each row crosses the wire once however
  often a batch names it;
- one exchange per call (``sarc.sampling.Comm.exchange``: the ids each owner is
  asked for, then (pull) the rows coming back, in rounds of point-to-point
  messages); the rows received from peers are counted in the comm's
  ``rows_received`` under the call's kind;
- every worker takes part in every call (a worker that wants no rows sends
  empty requests), so calls are collective: all workers call ``pull`` /
  ``push`` on the same tensor in the same order.

With one worker and no process group the same code runs with no messages.
This is DistDGL's DistTensor / KVStore without a server: the owners answer in
the same collective call.
"""
from __future__ import annotations

import torch

from ..errors import SarcError
from ..sampling.comm import Comm


class StoreError(SarcError):
    """A request the store cannot answer (an id out of range, a shape that does not fit)."""


def owners(offsets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The worker holding each global id (``offsets``: [P + 1], ascending)."""
    return torch.searchsorted(offsets[1:], ids, right=True)


class ShardedTensor:
    """Rows ``offsets[r] .. offsets[r+1]-1`` of a [N, *shape] tensor live on worker r.

    ``local`` is this worker's rows (a plain tensor, updated in place by
    ``push``); ``comm`` the workers' ``Comm`` (None: one worker, no process group).
    """

    def __init__(self, local: torch.Tensor, offsets: torch.Tensor, rank: int,
                 comm: Comm | None = None, name: str = "tensor"):
        offsets = torch.as_tensor(offsets, dtype=torch.int64).cpu()
        size = offsets.numel() - 1
        comm = comm if comm is not None else (Comm() if size == 1 else None)
        if comm is None or comm.size != size:
            raise StoreError(f"sharded tensor {name!r} has {size} shards but the process group "
                             f"{'is missing' if comm is None else f'has {comm.size} workers'}")
        rows = int(offsets[rank + 1] - offsets[rank])
        if local.dim() == 0 or local.shape[0] != rows:
            raise StoreError(f"worker {rank} holds {rows} rows of {name!r}, got a local tensor "
                             f"of shape {list(local.shape)}")
        self.local, self.offsets, self.rank, self.size = local, offsets, rank, size
        self.comm, self.name = comm, name

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def lo(self) -> int:
        return int(self.offsets[self.rank])

    def _check(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` as int64 on the CPU; a bad id on any worker stops every worker."""
        ids = torch.as_tensor(ids)
        problem = None
        if ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 1:
            problem = (f"ids into {self.name!r} must be a 1-D integer tensor, got {ids.dtype} "
                       f"of shape {list(ids.shape)}")
        elif ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_rows):
            bad = ids[(ids < 0) | (ids >= self.num_rows)][0]
            problem = f"id {int(bad)} is out of range for {self.name!r} ({self.num_rows} rows)"
        if self.size == 1 and problem is not None:
            raise StoreError(problem)
        self.comm.agree(problem)
        return ids.to(torch.int64).cpu()

    # -- the exchange --------------------------------------------------------------------
    def _requests(self, uniq: torch.Tensor):
        """Per owner, the positions in ``uniq`` it holds (``uniq`` sorted: owners ascend)."""
        own = owners(self.offsets, uniq)
        bounds = torch.searchsorted(own, torch.arange(self.size + 1), right=False)
        return [(int(bounds[j]), int(bounds[j + 1])) for j in range(self.size)]

    def pull(self, ids, phase: str = "pull") -> torch.Tensor:
        """The rows of global ``ids`` (any order, repeats allowed): [len(ids), *shape]."""
        ids = self._check(ids)
        uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        rows = self.local.new_empty((uniq.numel(), *self.local.shape[1:]))
        spans = self._requests(uniq)
        lo, hi = spans[self.rank]
        rows[lo:hi] = self.local.index_select(0, (uniq[lo:hi] - self.lo).to(self.local.device))
        if self.size > 1:
            asks = [uniq[a:b] for a, b in spans]
            asked = self.comm.exchange(asks, kind=f"{phase} ids")  # what each peer wants of mine
            answers = [self.local.index_select(0, (a - self.lo).to(self.local.device))
                       for a in asked]
            back = self.comm.exchange(answers, sizes=[b - a for a, b in spans], kind=phase)
            for j, (a, b) in enumerate(spans):
                if j != self.rank and b > a:
                    rows[a:b] = back[j]
        return rows.index_select(0, inverse.to(rows.device))

    __getitem__ = pull

    def route(self, ids, values: torch.Tensor, op: str = "add", phase: str = "push"):
        """Send ``values`` of global ``ids`` to their owners; (local rows, values) of what
        arrives here, from every worker in rank order, each sender's repeats merged
        (``op``: summed for ``"add"``, the last one for ``"set"``). Collective."""
        ids = self._check(ids)
        if op not in ("add", "set"):
            raise StoreError(f"push op must be 'add' or 'set', got {op!r}")
        if values.shape[0] != ids.numel() or tuple(values.shape[1:]) != tuple(self.local.shape[1:]):
            raise StoreError(f"push to {self.name!r}: {ids.numel()} ids with values of shape "
                             f"{list(values.shape)}, rows are {list(self.local.shape[1:])}")
        uniq, merged = coalesce(ids, values.to(self.local.dtype), op)
        spans = self._requests(uniq)
        incoming = [(uniq[a:b], merged[a:b]) for a, b in spans]
        if self.size > 1:
            got_ids = self.comm.exchange([i for i, _ in incoming], kind=f"{phase} ids")
            got_rows = self.comm.exchange([v for _, v in incoming],
                                          sizes=[int(i.numel()) for i in got_ids], kind=phase)
            for j in range(self.size):
                if j != self.rank:
                    incoming[j] = (got_ids[j], got_rows[j])
        rows = torch.cat([i for i, _ in incoming]) - self.lo
        return rows.to(self.local.device), torch.cat([v for _, v in incoming]).to(self.local.device)

    def push(self, ids, values: torch.Tensor, op: str = "add", phase: str = "push") -> None:
        """Add ``values`` to (``op="add"``) or set (``"set"``) the rows of global ``ids``.

        Repeated ids are summed first (add) or the last one wins (set, and among
        workers the highest rank's); each row crosses the wire once. Collective.
        """
        rows, vals = self.route(ids, values, op, phase)
        if op == "add":
            self.local.index_add_(0, rows, vals)
        else:
            rows, vals = coalesce(rows, vals, "set")
            self.local.index_copy_(0, rows.to(self.local.device), vals)


def coalesce(ids: torch.Tensor, values: torch.Tensor, op: str = "add"):
    """(sorted unique ids, their values): repeats summed (add) or the last kept (set)."""
    uniq, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    out = values.new_zeros((uniq.numel(), *values.shape[1:]))
    if op == "add":
        out.index_add_(0, inverse.to(values.device), values)
    else:
        last = torch.full((uniq.numel(),), -1, dtype=torch.int64, device=ids.device)
        last.scatter_reduce_(0, inverse, torch.arange(ids.numel(), device=ids.device), "amax")
        out = values.index_select(0, last.to(values.device))
    return uniq, out
