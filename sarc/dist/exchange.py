"""Row exchanges between workers, in rounds, over torch.distributed point-to-point ops.

Round k (1 <= k < P): worker r sends to ``(r + k) % P`` and receives from
``(r - k) % P``, so in every round each worker sends to one peer and receives
from one, and no two workers send to the same peer at once. A message carries
exactly the rows its receiver needs (``ShardedGraph.send_rows`` /
``recv_rows``: each boundary row once, no padding), all the exchanged values
of a row packed side by side in one buffer; an empty message is not sent.

``RowFetch`` walks the blocks of one pass over a layer's edges: the local
block first (while round 1 is in flight), then round by round; round k+1 is
posted before round k's rows are handed out (prefetch), or every round at once
(oneshot). Rows of peers listed in ``keep`` are stored for later passes; in a
backward pass, row gradients go back to their owners (``give_grad``) and the
gradients of this worker's own rows come back from the readers, added into
place at the end of the pass.

Every byte sent or received goes through ``ByteCounter`` (``counter``), the
one place the instrumentation counts, per phase.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist

ROWS_TAG, GRADS_TAG = 1, 2


@dataclass
class ByteCounter:
    """Bytes sent and received by this worker, per phase (``forward``, ``backward``, ...)."""

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    messages: int = 0

    def add_sent(self, phase: str, nbytes: int) -> None:
        self.sent[phase] = self.sent.get(phase, 0) + nbytes
        self.messages += 1

    def add_received(self, phase: str, nbytes: int) -> None:
        self.received[phase] = self.received.get(phase, 0) + nbytes

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_received(self) -> int:
        return sum(self.received.values())

    def reset(self) -> None:
        self.sent.clear()
        self.received.clear()
        self.messages = 0

    def snapshot(self) -> dict:
        return {"sent": dict(self.sent), "received": dict(self.received),
                "total_sent": self.total_sent, "total_received": self.total_received}


class ExchangeError(RuntimeError):
    """A peer did not deliver (it died, or the exchange timed out)."""


class Exchanger:
    """Point-to-point transfers of one worker within a process group, counted."""

    def __init__(self, rank: int, size: int, group=None, counter: ByteCounter | None = None,
                 timeout: datetime.timedelta | None = None):
        self.rank, self.size, self.group = rank, size, group
        self.counter = counter if counter is not None else ByteCounter()
        self.timeout = timeout

    def rounds(self) -> list[tuple[int, int, int]]:
        """(k, send to, receive from) for k = 1 .. P-1."""
        r, p = self.rank, self.size
        return [(k, (r + k) % p, (r - k) % p) for k in range(1, p)]

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def send(self, tensor: torch.Tensor, to: int, tag: int, phase: str):
        tensor = tensor.contiguous()
        work = dist.isend(tensor, self._global(to), group=self.group, tag=tag)
        self.counter.add_sent(phase, tensor.numel() * tensor.element_size())
        return _Pending(work, tensor, to, "send", self.timeout)

    def recv(self, shape, dtype, device, frm: int, tag: int, phase: str):
        buf = torch.empty(shape, dtype=dtype, device=device)
        work = dist.irecv(buf, self._global(frm), group=self.group, tag=tag)
        self.counter.add_received(phase, buf.numel() * buf.element_size())
        return _Pending(work, buf, frm, "receive", self.timeout)


@dataclass
class _Pending:
    work: object
    tensor: torch.Tensor
    peer: int
    what: str
    timeout: datetime.timedelta | None

    def wait(self) -> torch.Tensor:
        try:
            if self.timeout is None:
                self.work.wait()
            else:
                self.work.wait(self.timeout)
        except RuntimeError as e:
            raise ExchangeError(f"exchange with worker {self.peer} failed ({self.what}; the "
                                f"worker died or did not answer in time): "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        return self.tensor


@dataclass
class Round:
    """One round's transfers: rows out and in, gradients out and in."""

    k: int
    to: int
    frm: int
    rows_out: _Pending | None = None
    rows_in: _Pending | None = None
    grads_in: _Pending | None = None
    grads_out: _Pending | None = None


class RowFetch:
    """One pass over the blocks of a layer's edges: which rows move, when, and their gradients.

    ``x``: this worker's packed rows [num_local, width]; ``send_to``: the peers
    this pass sends rows to; ``recv_from``: the peers it receives rows from
    (the others' rows come from ``kept``, or are not needed); ``keep``: the
    peers whose received rows are stored into ``kept``; ``grads``: backward
    pass, row gradients flow back (``grads_from``: the readers that return
    gradients of this worker's rows in this pass). ``all_at_once``: post every
    round before computing (oneshot), else one round ahead (prefetch).
    """

    def __init__(self, ex: Exchanger, shard, x: torch.Tensor | None, *, phase: str,
                 send_to: set[int], recv_from: set[int], keep: set[int],
                 kept: dict[int, torch.Tensor], grads_from: set[int] = frozenset(),
                 all_at_once: bool = False):
        self.ex, self.shard, self.x, self.phase = ex, shard, x, phase
        self.send_to, self.recv_from, self.keep, self.kept = send_to, recv_from, keep, kept
        self.grads_from = grads_from
        self.all_at_once = all_at_once
        self.rounds = [Round(k, to, frm) for k, to, frm in ex.rounds()]
        self.grad_local: torch.Tensor | None = None  # gradients of own rows, returned by readers
        self._posted = 0

    # -- posting -------------------------------------------------------------------------
    def _post(self, rnd: Round) -> None:
        sh, ex, x = self.shard, self.ex, self.x
        if x is None:  # the layer reads no source rows: only its edges' own data
            return
        out_rows = sh.send_rows[rnd.to]
        if rnd.to in self.send_to and out_rows.numel():
            rnd.rows_out = ex.send(x.index_select(0, out_rows), rnd.to, ROWS_TAG, self.phase)
        n_in = int(sh.recv_rows[rnd.frm].numel())
        if rnd.frm in self.recv_from and n_in:
            rnd.rows_in = ex.recv((n_in, x.shape[1]), x.dtype, x.device, rnd.frm, ROWS_TAG,
                                  self.phase)
        if rnd.to in self.grads_from and out_rows.numel():
            rnd.grads_in = ex.recv((int(out_rows.numel()), x.shape[1]), x.dtype, x.device,
                                   rnd.to, GRADS_TAG, self.phase)

    def _post_next(self) -> None:
        if self._posted < len(self.rounds):
            self._post(self.rounds[self._posted])
            self._posted += 1

    # -- the pass ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[int, torch.Tensor | None]]:
        """(source shard j, its rows for block j): the local block, then round by round."""
        sh = self.shard
        if self.all_at_once:
            while self._posted < len(self.rounds):
                self._post_next()
        else:
            self._post_next()
        if sh.local_block.num_edges:
            yield sh.rank, self.x
        for i, rnd in enumerate(self.rounds):
            self._post_next()  # the next round goes out while this one computes
            rows = None
            if rnd.rows_in is not None:
                rows = rnd.rows_in.wait()
                rnd.rows_in = None
                if rnd.frm in self.keep:
                    self.kept[rnd.frm] = rows
            elif rnd.frm in self.kept:
                rows = self.kept[rnd.frm]
            if sh.blocks[rnd.frm].num_edges:
                yield rnd.frm, rows
            if i > 0:  # a round late, so the peers' progress does not hold this worker up
                self._retire(self.rounds[i - 1])
        self.finish()

    def give_grad(self, j: int, grad_rows: torch.Tensor) -> None:
        """Gradients of block j's source rows: local ones are added here, remote ones go back
        to shard j in this round (the caller keeps the kept peers' until the end)."""
        if j == self.shard.rank:
            self.grad_local = grad_rows if self.grad_local is None else self.grad_local + grad_rows
            return
        rnd = next(r for r in self.rounds if r.frm == j)
        rnd.grads_out = self.ex.send(grad_rows, j, GRADS_TAG, self.phase)

    def _add_local(self, rows: torch.Tensor, g: torch.Tensor) -> None:
        if self.grad_local is None:
            self.grad_local = torch.zeros_like(self.x)
        self.grad_local.index_add_(0, rows, g)

    def _collect(self, rnd: Round) -> None:
        if rnd.grads_in is not None:
            g = rnd.grads_in.wait()
            rnd.grads_in = None
            self._add_local(self.shard.send_rows[rnd.to], g)

    def _retire(self, rnd: Round) -> None:
        """Finish a round: add the gradients it brought, and let its send buffers go (a
        send's buffer must live until the send completes; holding every round's until the
        end of the pass would keep all the boundary rows in memory at once)."""
        self._collect(rnd)
        for p in (rnd.rows_out, rnd.grads_out, rnd.rows_in):
            if p is not None:
                p.wait()
        rnd.rows_out = rnd.grads_out = rnd.rows_in = None

    def finish(self) -> None:
        """Wait for everything this pass posted."""
        while self._posted < len(self.rounds):
            self._post_next()
        for rnd in self.rounds:
            self._retire(rnd)


def send_kept_grads(ex: Exchanger, shard, x: torch.Tensor, grads: dict[int, torch.Tensor],
                    readers_keeping: set[int], phase: str) -> torch.Tensor | None:
    """Return the accumulated gradients of kept rows to their owners, every round at once;
    returns the gradients of this worker's rows that readers kept (None if none)."""
    pending_in, pending_out = [], []
    for k, to, frm in ex.rounds():
        if frm in grads:
            pending_out.append(ex.send(grads[frm], frm, GRADS_TAG, phase))
        n = int(shard.send_rows[to].numel())
        if to in readers_keeping and n:
            pending_in.append((to, ex.recv((n, x.shape[1]), x.dtype, x.device, to, GRADS_TAG, phase)))
    total = None
    for to, p in pending_in:
        g = p.wait()
        if total is None:
            total = torch.zeros_like(x)
        total.index_add_(0, shard.send_rows[to], g)
    for p in pending_out:
        p.wait()
    return total
