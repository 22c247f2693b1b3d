"""The collectives of mini-batches and sharded tensors: sizes gathered, tensors exchanged
with every peer (``sarc.sampling``, ``sarc.distributed.store``).

``Comm`` wraps a torch.distributed process group, or nothing (one process: every
exchange is the identity), so the single-process sampler and loader run the same
code. ``exchange`` is an all-to-all of variable-length tensors built from
point-to-point messages in rounds (round k: send to ``(r + k) % P``, receive
from ``(r - k) % P``), because gloo before torch 2.3 has no ``all_to_all``; an
empty message is not sent. A peer that fails or times out raises
``SamplingError`` naming it, instead of leaving this worker waiting. Messages carry no
tag: NCCL matches them by the order they are posted in (``sarc.distributed.exchange``),
and where a round's peer is the same both ways the lower rank sends first.
"""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ..errors import agreed
from .spec import SamplingError



def receives_first(rank: int, to: int, frm: int) -> bool:
    """Whether worker ``rank``, in a round that sends to ``to`` and receives from ``frm``,
    posts its receive first: where both are one peer (two workers, or round P/2), the
    lower rank of the two sends first, so that the pair's ops line up one to one on the
    stream NCCL runs them on (``sarc.distributed.exchange``)."""
    return to == frm and rank > to


class Comm:
    def __init__(self, group=None, *, timeout: datetime.timedelta | None = None):
        self.distributed = dist.is_available() and dist.is_initialized()
        self.group = group
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.size = dist.get_world_size(group) if self.distributed else 1
        self.timeout = timeout
        self.rows_received: dict[str, int] = {}  # per kind of exchange: rows from peers
        self.bytes_sent = 0                       # by this worker's exchanges to its peers
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.distributed and dist.get_backend(group) == "nccl"
                       else torch.device("cpu"))

    def all_gather(self, values: list[int]) -> list[list[int]]:
        """Every worker's ``values`` (the same length on all), by rank."""
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        if self.size == 1:
            return [mine.cpu().tolist()]
        out = [torch.zeros_like(mine) for _ in range(self.size)]
        try:
            dist.all_gather(out, mine, group=self.group)
        except RuntimeError as e:
            raise SamplingError(f"gathering sizes from the workers failed: "
                                f"{_first_line(e)}") from e
        return [t.cpu().tolist() for t in out]

    def agree(self, problem: str | None) -> None:
        """Raise on every worker if any found a problem in its own input (``problem``: its
        message, or None), so that none is left waiting in the next exchange for a peer
        that gave up."""
        if self.size == 1:
            if problem is not None:
                raise SamplingError(problem)
            return
        stop_with(problem, [bool(f[0]) for f in self.all_gather([int(problem is not None)])])

    def exchange(self, outgoing: list[torch.Tensor], sizes: list[int] | None = None,
                 kind: str = "ids") -> list[torch.Tensor]:
        """``outgoing[j]`` goes to worker j; returns what each worker sent this one (its own
        ``outgoing[rank]`` as is, not sent). All tensors share dtype and trailing shape;
        ``sizes[j]``: the rows worker j sends here, when known (else one ``all_gather``
        finds them). The rows received from peers are counted under ``kind``."""
        r, p = self.rank, self.size
        if len(outgoing) != p:
            raise SamplingError(f"an exchange needs one tensor per worker ({p}), got {len(outgoing)}")
        if p == 1:
            return [outgoing[0]]
        if sizes is None:
            table = self.all_gather([int(t.shape[0]) for t in outgoing])
            sizes = [table[j][r] for j in range(p)]
        like = outgoing[r]
        self.rows_received[kind] = self.rows_received.get(kind, 0) + sum(
            n for j, n in enumerate(sizes) if j != r)
        incoming: list = [None] * p
        incoming[r] = like
        pending = []
        for k in range(1, p):
            to, frm = (r + k) % p, (r - k) % p
            out = outgoing[to].to(self.device).contiguous()
            self.bytes_sent += out.numel() * out.element_size()
            buf = torch.empty((sizes[frm], *like.shape[1:]), dtype=like.dtype, device=self.device)
            incoming[frm] = buf
            ops = []
            if out.shape[0]:
                ops.append((to, "send", dist.isend, out))
            if sizes[frm]:
                ops.append((frm, "receive", dist.irecv, buf))
            if receives_first(r, to, frm):
                ops.reverse()
            for peer, what, post, t in ops:
                pending.append((peer, what, post(t, self._global(peer), group=self.group), t))
        for peer, what, work, _ in pending:
            try:
                work.wait() if self.timeout is None else work.wait(self.timeout)
            except RuntimeError as e:
                raise SamplingError(f"exchange with worker {peer} failed ({what}; the "
                                    f"worker died or did not answer in time): "
                                    f"{_first_line(e)}") from e
        return [t.to(like.device) for t in incoming]

    def _global(self, peer: int) -> int:
        return peer if self.group is None else dist.get_global_rank(self.group, peer)


def stop_with(problem: str | None, failed: list[bool]) -> None:
    """``agree``'s verdict, given this worker's ``problem`` and which workers had one: raise
    this worker's own, else one naming the workers that could not go on."""
    if problem is not None:
        raise agreed(SamplingError(problem))
    bad = [str(j) for j, f in enumerate(failed) if f]
    if bad:
        raise agreed(SamplingError(
            f"worker{'s' * (len(bad) > 1)} {', '.join(bad)} could not go on (see "
            f"{'their errors' if len(bad) > 1 else 'its error'}); this worker stops with them"))


def _first_line(e: Exception) -> str:
    s = str(e)
    return s.splitlines()[0] if s else type(e).__name__
