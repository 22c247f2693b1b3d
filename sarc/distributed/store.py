"""Sharded tensors addressed by global id: each worker holds its partition's rows.

A ``ShardedTensor`` has ``offsets[-1]`` rows; worker r holds rows
``offsets[r] .. offsets[r+1]-1`` (the partition's contiguous new global ids, as
``ShardedGraph.node_offsets``). ``pull(ids)`` returns the rows of any global ids
and ``push(ids, values)`` adds to (or sets) them, wherever they live:

- the ids are made unique first, so each row crosses the wire once however
  often a batch names it;
- one exchange per call, in the rounds of ``sarc.distributed.exchange`` (round k:
  send to ``r + k``, receive from ``r - k``): the counts, then the ids each
  owner is asked for, then (pull) the rows coming back; every byte is counted
  in the exchanger's ``ByteCounter`` under the call's phase;
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
from .exchange import Exchanger

IDS_TAG, ROWS_TAG = 1 << 20, (1 << 20) + 1
"""Message tags of the store, apart from the schedules' (``exchange``); a count message
goes under its payload's tag + ``COUNT``."""
COUNT = 1 << 10


class StoreError(SarcError):
    """A request the store cannot answer (an id out of range, a shape that does not fit)."""


def owners(offsets: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The worker holding each global id (``offsets``: [P + 1], ascending)."""
    return torch.searchsorted(offsets[1:], ids, right=True)


class ShardedTensor:
    """Rows ``offsets[r] .. offsets[r+1]-1`` of a [N, *shape] tensor live on worker r.

    ``local`` is this worker's rows (a plain tensor, updated in place by
    ``push``); ``exchanger`` the worker's exchanger (None: one worker).
    """

    def __init__(self, local: torch.Tensor, offsets: torch.Tensor, rank: int,
                 exchanger: Exchanger | None = None, name: str = "tensor"):
        offsets = torch.as_tensor(offsets, dtype=torch.int64).cpu()
        size = offsets.numel() - 1
        if exchanger is None and size != 1:
            raise StoreError(f"sharded tensor {name!r} spans {size} workers but has no exchanger")
        if exchanger is not None and exchanger.size != size:
            raise StoreError(f"sharded tensor {name!r} has {size} shards, the process group "
                             f"{exchanger.size} workers")
        rows = int(offsets[rank + 1] - offsets[rank])
        if local.dim() == 0 or local.shape[0] != rows:
            raise StoreError(f"worker {rank} holds {rows} rows of {name!r}, got a local tensor "
                             f"of shape {list(local.shape)}")
        self.local, self.offsets, self.rank, self.size = local, offsets, rank, size
        self.exchanger, self.name = exchanger, name

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def lo(self) -> int:
        return int(self.offsets[self.rank])

    def _check(self, ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(ids)
        if ids.dtype not in (torch.int64, torch.int32) or ids.dim() != 1:
            raise StoreError(f"ids into {self.name!r} must be a 1-D integer tensor, got "
                             f"{ids.dtype} of shape {list(ids.shape)}")
        ids = ids.to(torch.int64).cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_rows):
            bad = ids[(ids < 0) | (ids >= self.num_rows)][0]
            raise StoreError(f"id {int(bad)} is out of range for {self.name!r} "
                             f"({self.num_rows} rows)")
        return ids

    # -- the exchange --------------------------------------------------------------------
    def _requests(self, uniq: torch.Tensor):
        """Per owner, the positions in ``uniq`` it holds (``uniq`` sorted: owners ascend)."""
        own = owners(self.offsets, uniq)
        bounds = torch.searchsorted(own, torch.arange(self.size + 1), right=False)
        return [(int(bounds[j]), int(bounds[j + 1])) for j in range(self.size)]

    def _swap(self, out: list[torch.Tensor], like: torch.Tensor, tag: int, phase: str,
              row_shape=()) -> list[torch.Tensor | None]:
        """Round by round, send ``out[peer]`` and receive what ``peer`` sends (sizes first)."""
        ex = self.exchanger
        got: list[torch.Tensor | None] = [None] * self.size
        for _, to, frm in ex.rounds():
            n_out = torch.tensor([out[to].shape[0]], dtype=torch.int64)
            sent = ex.send(n_out, to, tag + COUNT, phase)
            n_in = ex.recv((1,), torch.int64, torch.device("cpu"), frm, tag + COUNT,
                           phase).wait()
            sent.wait()
            rows = int(n_in[0])
            pend = []
            if out[to].shape[0]:
                pend.append(ex.send(out[to], to, tag, phase))
            if rows:
                got[frm] = ex.recv((rows, *row_shape), like.dtype, like.device, frm, tag,
                                   phase).wait()
            else:
                got[frm] = like.new_empty((0, *row_shape))
            for p in pend:
                p.wait()
        return got

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
            asked = self._swap(asks, uniq, IDS_TAG, phase)  # the ids each peer wants of mine
            answers = [self.local.index_select(0, (a - self.lo).to(self.local.device))
                       if a is not None else self.local.new_empty((0, *self.local.shape[1:]))
                       for a in asked]
            back = self._swap(answers, self.local, ROWS_TAG, phase, self.local.shape[1:])
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
            got_ids = self._swap([i for i, _ in incoming], uniq, IDS_TAG, phase)
            got_rows = self._swap([v for _, v in incoming], merged, ROWS_TAG, phase,
                                  merged.shape[1:])
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
