"""Pieces: a worker's source blocks cut into chunks of source rows, one message each.

A remote block (``ShardedGraph.blocks[j]``) reads ``needed_rows[j]``, often tens of
thousands of rows: exchanged whole, every buffer of a round (the rows out, the rows
in, the rows prefetched, their gradients both ways) is that large, and several are
alive at once, so a worker's peak memory would grow with the cut, not with its
shard. The schedule therefore moves a peer's rows in chunks of at most
``chunk_rows`` rows (the same count on sender and receiver, so both cut a message
at the same rows) and aggregates the edges of one chunk at a time: ``Piece``
``(j, c)`` is rows ``lo .. hi-1`` of the message from shard j and the edges of
block j whose source is one of them, a split block of its own whose destinations
are only the local nodes those edges reach (``rows``), so what a piece computes per
destination (partial aggregates, their cotangents) is as large as the piece, not
as the shard. The partial aggregates of the pieces merge as the blocks' do (sum,
max with tie counts, online softmax are all associative; ``sarc.distributed.merge`` adds a
piece at its rows), so the result is the same; the bytes are the same (each row
still crosses once per round), in more messages.

The local block is one piece, itself, over every local node (``rows`` None).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..graph import Graph

DEFAULT_CHUNK_ROWS = 16384
"""Rows per message: at 128 float32 features, 8 MiB."""


@dataclass(frozen=True, eq=False)
class Piece:
    peer: int      # the shard whose rows the piece reads (this worker's rank: the local block)
    chunk: int     # its index among that shard's pieces
    lo: int        # it reads rows lo .. hi-1 of the shard's message (block src rows)
    hi: int
    block: Graph   # those rows' edges; src row k is message row lo + k, dst row i local node rows[i]
    rows: torch.Tensor | None = None  # the local nodes the edges reach, sorted (None: all)

    @property
    def key(self) -> tuple[int, int]:
        return self.peer, self.chunk

    def __repr__(self) -> str:
        return f"Piece(peer={self.peer}, chunk={self.chunk}, rows=[{self.lo}, {self.hi}), {self.block!r})"


def chunks(n: int, chunk_rows: int | None) -> list[tuple[int, int]]:
    """Rows 0 .. n-1 cut into consecutive ranges of at most ``chunk_rows`` (None: one range)."""
    if n == 0:
        return []
    if chunk_rows is None or n <= chunk_rows:
        return [(0, n)]
    return [(a, min(n, a + chunk_rows)) for a in range(0, n, chunk_rows)]


def cut_blocks(shard, chunk_rows: int | None) -> tuple[tuple[Piece, ...], ...]:
    """``[P]``: the pieces of each source block of ``shard`` (a ``ShardedGraph``)."""
    out = []
    for j, b in enumerate(shard.blocks):
        if j == shard.rank:
            out.append((Piece(j, 0, 0, b.num_src, b),))
            continue
        out.append(tuple(Piece(j, c, lo, hi, *_cut(b, lo, hi))
                         for c, (lo, hi) in enumerate(chunks(b.num_src, chunk_rows))))
    return tuple(out)


def whole_blocks(shard) -> tuple[tuple[Piece, ...], ...]:
    """``[P]``: each block as one piece over every local node, without a copy (an exchange
    that moves a peer's rows in one message, e.g. degrees at setup). A peer's block of no
    source rows has no piece, as in ``cut_blocks``: the peer sends nothing for it (``chunks``
    of 0 rows), so a piece would wait for a message that never comes."""
    return tuple((Piece(j, 0, 0, b.num_src, b),) if b.num_src or j == shard.rank else ()
                 for j, b in enumerate(shard.blocks))


def _cut(b: Graph, lo: int, hi: int) -> tuple[Graph, torch.Tensor]:
    """The edges of split block ``b`` whose source row is in [lo, hi), sources renumbered
    from 0 and destinations from the distinct ones they reach (returned, sorted); CSR
    order kept (a subsequence of a dst-sorted list is dst-sorted)."""
    e = ((b.src >= lo) & (b.src < hi)).nonzero().squeeze(1) if (lo, hi) != (0, b.num_src) else None
    src, dst, perm = (b.src, b.dst, b.perm) if e is None else (
        b.src.index_select(0, e), b.dst.index_select(0, e), b.perm.index_select(0, e))
    rows, inv, counts = torch.unique_consecutive(dst, return_inverse=True, return_counts=True)
    rowptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=dst.device)
    rowptr[1:] = torch.cumsum(counts, 0)
    block = Graph(hi - lo, int(rows.numel()), src - lo, inv, perm, rowptr,
                  b.in_degree.index_select(0, rows), b.out_degree[lo:hi], dst_in_src=False)
    return block, rows
