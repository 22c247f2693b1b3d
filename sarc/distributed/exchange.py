"""Row exchanges between workers, in rounds, over torch.distributed point-to-point ops.

Round k (1 <= k < P): worker r sends to ``(r + k) % P`` and receives from
``(r - k) % P``, so in every round each worker sends to one peer and receives
from one, and no two workers send to the same peer at once. The rows a round
moves are exactly those its receiver needs (``ShardedGraph.send_rows`` /
``recv_rows``: each boundary row once, no padding), all the exchanged values
of a row packed side by side, in messages of at most ``chunk_rows`` rows (the
pieces of ``sarc.distributed.pieces``); an empty message is not sent.

``RowFetch`` walks the pieces of one pass over a layer's edges: the local
block first (while the first message is in flight), then round by round,
chunk by chunk; the next step is posted before the current one's rows are
handed out (prefetch), or every step at once (oneshot). Rows of peers listed
in ``keep`` are stored for later passes; in a backward pass, row gradients go
back to their owners (``give_grad``) and the gradients of this worker's own
rows come back from the readers, added into place as their steps retire.

Every byte sent or received goes through ``ByteCounter`` (``counter``), the
one place the instrumentation counts, per phase.

**Order, not tags.** NCCL ignores a point-to-point message's tag: the i-th message one
worker sends another is the other's i-th receive from it. And torch runs all of two
workers' point-to-point ops, in both directions, in the order posted on one stream per
pair, where a receive waits for its send (and a large send for its receive). So every
message is posted in the same order on both sides of each pair (``Exchanger`` passes no
tag, and gloo matches them by that order as NCCL does):

- a step that sends to and receives from the same peer (two workers, or round P/2)
  posts the lower rank's send first on both sides (``Exchanger.in_order``);
- gradients go back on a second process group of the same workers
  (``Exchanger.grads``), so that a pass's row messages, posted a step ahead, never sit
  between two of its gradient messages; a step's gradients are sent and received after
  its piece is computed, on every worker, in step order.
"""
from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from ..sampling.comm import receives_first
from .pieces import Piece, chunks, whole_blocks

ROWS_TAG, GRADS_TAG, KEPT_GRADS_TAG = 1, 2, 3


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


_GRADS_GROUPS: dict = {}
"""Per process group (None: the world): (the world it was made in, its gradients' group)."""


def grads_group(group=None, ranks: list[int] | None = None):
    """The second process group of ``group``'s workers, for gradient messages (see the
    module's docstring): made on first use, collectively over the whole world, as
    ``dist.new_group``. The world's is made by the first ``Exchanger`` of every process;
    a subgroup's must be made where the subgroup is, by every process (``ranks``: the
    subgroup's, on a process that is not in it)."""
    world = dist.group.WORLD
    made = _GRADS_GROUPS.get(group)
    if made is not None and made[0] is world:
        return made[1]
    if ranks is None:
        ranks = (list(range(dist.get_world_size())) if group is None
                 else dist.get_process_group_ranks(group))
    grads = dist.new_group(sorted(ranks))
    if group is None or dist.get_rank() in ranks:
        _GRADS_GROUPS[group] = (world, grads)
    return grads


class Exchanger:
    """Point-to-point transfers of one worker within a process group, counted. Rows go on
    ``group``, gradients on ``grads`` (``grads_group``); messages are matched by the order
    they are posted in (see the module's docstring), the tags only name them."""

    makes_groups = True
    """Whether it makes the gradients' process group (``grads_group``); an exchanger of
    threads (``sarc.cli.block_sample``) has none."""

    def __init__(self, rank: int, size: int, group=None, counter: ByteCounter | None = None,
                 timeout: datetime.timedelta | None = None):
        self.rank, self.size, self.group = rank, size, group
        self.counter = counter if counter is not None else ByteCounter()
        self.timeout = timeout
        self.grads = (grads_group(group) if self.makes_groups and size > 1
                      and dist.is_available() and dist.is_initialized() else group)

    def in_order(self, to: int, frm: int, send: Callable[[], None],
                 recv: Callable[[], None]) -> None:
        """Post a step's send to ``to`` and receive from ``frm`` in the order both sides of
        a pair post them (``sampling.comm.receives_first``)."""
        for post in ((recv, send) if receives_first(self.rank, to, frm) else (send, recv)):
            post()

    def rounds(self) -> list[tuple[int, int, int]]:
        """(k, send to, receive from) for k = 1 .. P-1."""
        r, p = self.rank, self.size
        return [(k, (r + k) % p, (r - k) % p) for k in range(1, p)]

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)

    def _channel(self, tag: int):
        """Gradient messages (tags ``GRADS_TAG + 4 * chunk``, ``KEPT_GRADS_TAG``) go on
        ``grads``, every other one on ``group``."""
        return self.grads if tag % 4 in (GRADS_TAG, KEPT_GRADS_TAG) else self.group

    def send(self, tensor: torch.Tensor, to: int, tag: int, phase: str):
        tensor = tensor.contiguous()
        work = dist.isend(tensor, self._global(to), group=self._channel(tag))
        self.counter.add_sent(phase, tensor.numel() * tensor.element_size())
        return _Pending(work, tensor, to, "send", self.timeout)

    def recv(self, shape, dtype, device, frm: int, tag: int, phase: str):
        buf = torch.empty(shape, dtype=dtype, device=device)
        work = dist.irecv(buf, self._global(frm), group=self._channel(tag))
        self.counter.add_received(phase, buf.numel() * buf.element_size())
        return _Pending(work, buf, frm, "receive", self.timeout)

    def swap(self, out: dict, shapes: dict, dtype, device, tag: int, phase: str
             ) -> tuple[list, dict]:
        """Every round at once: ``out[j]`` (a tensor, or None) to each peer j, a tensor of
        ``shapes[j]`` (None: nothing) from each; an empty one is not sent (both sides know
        the sizes). Returns (the sends, the receives by peer), to be waited for."""
        sends, recvs = [], {}
        for _, to, frm in self.rounds():
            def send():
                t = out.get(to)
                if t is not None and t.numel():
                    sends.append(self.send(t, to, tag, phase))

            def recv():
                shape = shapes.get(frm)
                if shape is not None and math.prod(shape):
                    recvs[frm] = self.recv(shape, dtype, device, frm, tag, phase)
            self.in_order(to, frm, send, recv)
        return sends, recvs


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
class Step:
    """One message's worth of a round: a chunk of rows out and a piece's rows in, and the
    gradients of both (either side may be absent: a round's two directions need not have
    as many chunks)."""

    k: int
    c: int                               # the chunk index, on both sides
    to: int
    frm: int
    out: tuple[int, int] | None          # rows lo .. hi-1 of this worker's message to ``to``
    piece: Piece | None                  # the piece of ``frm`` read in this step
    rows_out: _Pending | None = None
    rows_in: _Pending | None = None
    grads_in: _Pending | None = None
    grads_out: _Pending | None = None
    grad_rows: torch.Tensor | None = None   # the piece's row gradients, given, not yet sent
    grads_done: bool = False                # the step's gradient messages are posted


def _tag(base: int, chunk: int) -> int:
    """Messages between two workers in one direction are told apart by chunk and kind."""
    return base + 4 * chunk


class RowFetch:
    """One pass over the pieces of a layer's edges: which rows move, when, and their gradients.

    ``x``: this worker's packed rows [num_local, width]; ``send_to``: the peers
    this pass sends rows to; ``recv_from``: the peers it receives rows from
    (the others' rows come from ``kept``, or are not needed); ``keep``: the
    peers whose received rows are stored into ``kept`` (by piece key); ``grads_from``:
    backward pass, the readers that return gradients of this worker's rows;
    ``returns_grads``: backward pass, this worker returns the gradients of the rows it
    receives (``give_grad``).
    ``pieces``: each source block cut into chunks of at most ``chunk_rows`` source
    rows (``sarc.distributed.pieces``; None: whole blocks). ``all_at_once``: post every
    message before computing (oneshot), else one step ahead (prefetch).

    Round k's messages go in steps, one chunk each way per step; at any time the
    buffers alive are those of the step being computed, the one prefetched and the
    one before (retired a step late, so a slow peer does not hold this worker up).
    """

    def __init__(self, ex: Exchanger, shard, x: torch.Tensor | None, *, phase: str,
                 send_to: set[int], recv_from: set[int], keep: set[int],
                 kept: dict[tuple[int, int], torch.Tensor], grads_from: set[int] = frozenset(),
                 all_at_once: bool = False, pieces=None, chunk_rows: int | None = None,
                 returns_grads: bool = False):
        self.ex, self.shard, self.x, self.phase = ex, shard, x, phase
        self.send_to, self.recv_from, self.keep, self.kept = send_to, recv_from, keep, kept
        self.grads_from, self.returns_grads = grads_from, returns_grads
        self.all_at_once = all_at_once
        if pieces is None:
            pieces, chunk_rows = whole_blocks(shard), None
        self.pieces = pieces
        self.steps: list[Step] = []
        for k, to, frm in ex.rounds():
            outs = chunks(int(shard.send_rows[to].numel()), chunk_rows)
            ins = pieces[frm]
            for c in range(max(len(outs), len(ins))):
                self.steps.append(Step(k, c, to, frm, outs[c] if c < len(outs) else None,
                                       ins[c] if c < len(ins) else None))
        self._by_piece = {st.piece.key: st for st in self.steps if st.piece is not None}
        self.grad_local: torch.Tensor | None = None  # gradients of own rows, returned by readers
        self._own_grad_local = False  # grad_local is a tensor of this fetch's own
        self._posted = 0

    # -- posting -------------------------------------------------------------------------
    def _post(self, st: Step) -> None:
        """A step's row messages (``Exchanger.in_order`` orders them)."""
        sh, ex, x = self.shard, self.ex, self.x
        if x is None:  # the layer reads no source rows: only its edges' own data
            return

        def send():
            if st.out is not None and st.to in self.send_to:
                lo, hi = st.out
                st.rows_out = ex.send(x.index_select(0, sh.send_rows[st.to][lo:hi]), st.to,
                                      _tag(ROWS_TAG, st.c), self.phase)

        def recv():
            p = st.piece
            if p is not None and st.frm in self.recv_from:
                st.rows_in = ex.recv((p.hi - p.lo, x.shape[1]), x.dtype, x.device, st.frm,
                                     _tag(ROWS_TAG, p.chunk), self.phase)
        ex.in_order(st.to, st.frm, send, recv)

    def _post_grads(self, st: Step) -> None:
        """A step's gradient messages, once its piece is computed: the piece's row gradients
        back to their owner (zeros for a piece without edges, which is not computed), and
        the gradients of this worker's chunk from its reader. Every worker posts them
        after the step's piece, in step order, so that they pair up on ``Exchanger.grads``."""
        if st.grads_done:
            return
        st.grads_done = True
        ex, x = self.ex, self.x
        if x is None:
            return

        def send():
            p = st.piece
            if self.returns_grads and p is not None and st.frm in self.recv_from:
                g = st.grad_rows
                if g is None:
                    g = x.new_zeros((p.hi - p.lo, x.shape[1]))
                st.grad_rows = None
                st.grads_out = ex.send(g, st.frm, _tag(GRADS_TAG, p.chunk), self.phase)

        def recv():
            if st.out is not None and st.to in self.grads_from:
                lo, hi = st.out
                st.grads_in = ex.recv((hi - lo, x.shape[1]), x.dtype, x.device, st.to,
                                      _tag(GRADS_TAG, st.c), self.phase)
        ex.in_order(st.to, st.frm, send, recv)

    def _post_next(self) -> None:
        if self._posted < len(self.steps):
            self._post(self.steps[self._posted])
            self._posted += 1

    # -- the pass ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[Piece, torch.Tensor | None]]:
        """(piece, its source rows): the local block, then round by round, chunk by chunk.
        A piece's row gradients are given (``give_grad``) before the next piece is asked for."""
        sh = self.shard
        if self.all_at_once:
            while self._posted < len(self.steps):
                self._post_next()
        else:
            self._post_next()
        (local,) = self.pieces[sh.rank]
        if local.block.num_edges:
            yield local, self.x
        for i, st in enumerate(self.steps):
            self._post_next()  # the next step goes out while this one computes
            p = st.piece
            if p is not None:
                rows = None
                if st.rows_in is not None:
                    rows = st.rows_in.wait()
                    st.rows_in = None
                    if st.frm in self.keep:
                        self.kept[p.key] = rows
                elif p.key in self.kept:
                    rows = self.kept[p.key]
                if p.block.num_edges:
                    yield p, rows
                del rows
            self._post_grads(st)
            if i > 0:  # a step late, so the peers' progress does not hold this worker up
                self._retire(self.steps[i - 1])
        self.finish()

    def give_grad(self, piece: Piece, grad_rows: torch.Tensor) -> None:
        """Gradients of a piece's source rows: local ones are added here, remote ones go back
        to their owner after the piece's step (the caller keeps the kept peers' until the
        end)."""
        if piece.peer == self.shard.rank:
            # autograd's tensor, maybe another name's too: never added to in place
            # (``_collect`` adds to a copy)
            self.grad_local, self._own_grad_local = (
                (grad_rows, False) if self.grad_local is None
                else (self.grad_local + grad_rows, True))
            return
        st = self._by_piece[piece.key]
        if st.grads_done:
            raise RuntimeError(f"the gradients of piece {piece.key} came after its step: they "
                               f"must be given before the next piece is asked for")
        st.grad_rows = grad_rows

    def _collect(self, st: Step) -> None:
        if st.grads_in is not None:
            g = st.grads_in.wait()
            st.grads_in = None
            lo, hi = st.out
            if self.grad_local is None:
                self.grad_local = torch.zeros_like(self.x)
            elif not self._own_grad_local:
                self.grad_local = self.grad_local.clone()
            self._own_grad_local = True
            self.grad_local.index_add_(0, self.shard.send_rows[st.to][lo:hi], g)

    def _retire(self, st: Step) -> None:
        """Finish a step: add the gradients it brought, and let its buffers go (a send's
        buffer must live until the send completes; holding every step's until the end of
        the pass would keep all the boundary rows in memory at once)."""
        self._collect(st)
        for p in (st.rows_out, st.grads_out, st.rows_in):
            if p is not None:
                p.wait()
        st.rows_out = st.grads_out = st.rows_in = None

    def finish(self) -> None:
        """Post what this pass has not (a step not iterated to sends zero gradients) and
        wait for everything it posted."""
        while self._posted < len(self.steps):
            self._post_next()
        for st in self.steps:
            self._post_grads(st)
        for st in self.steps:
            self._retire(st)


def send_kept_grads(ex: Exchanger, shard, x: torch.Tensor, grads: dict[int, torch.Tensor],
                    readers_keeping: set[int], phase: str) -> torch.Tensor | None:
    """Return the accumulated gradients of kept rows to their owners (one message per
    peer, every round at once); returns the gradients of this worker's rows that readers
    kept (None if none)."""
    shapes = {j: (int(shard.send_rows[j].numel()), x.shape[1]) for j in readers_keeping}
    sends, recvs = ex.swap(grads, shapes, x.dtype, x.device, KEPT_GRADS_TAG, phase)
    total = None
    for to, p in recvs.items():
        g = p.wait()
        if total is None:
            total = torch.zeros_like(x)
        total.index_add_(0, shard.send_rows[to], g)
    for p in sends:
        p.wait()
    return total
