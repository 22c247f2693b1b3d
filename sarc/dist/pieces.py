"""Pieces: a worker's source blocks cut into chunks of source rows, one message each.

A remote block (``ShardedGraph.blocks[j]``) reads ``needed_rows[j]``, often tens of
thousands of rows: exchanged whole, every buffer of a round (the rows out, the rows
in, the rows prefetched, their gradients both ways) is that large, and several are
alive at once, so a worker's peak memory would grow with the cut, not with its
shard. The schedule therefore moves a peer's rows in chunks of at most
``chunk_rows`` rows (the same count on sender and receiver, so both cut a message
at the same rows) and aggregates the edges of one chunk at a time: ``Piece``
``(j, c)`` is rows ``lo .. hi-1`` of the message from shard j and the edges of
block j whose source is one of them, a split block of its own. The partial
aggregates of the pieces merge as the blocks' do (sum, max with tie counts,
online softmax are all associative), so the result is the same; the bytes are the
same (each row still crosses once per round), in more messages.

The local block is one piece, and a block no larger than a chunk is its own piece
(no copy).
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
    block: Graph   # those rows' edges into the local nodes; src row k is message row lo + k

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
        out.append(tuple(Piece(j, c, lo, hi, b if (lo, hi) == (0, b.num_src) else _cut(b, lo, hi))
                         for c, (lo, hi) in enumerate(chunks(b.num_src, chunk_rows))))
    return tuple(out)


def _cut(b: Graph, lo: int, hi: int) -> Graph:
    """The edges of split block ``b`` whose source row is in [lo, hi), sources renumbered
    from 0; CSR order kept (a subsequence of a dst-sorted list is dst-sorted)."""
    e = ((b.src >= lo) & (b.src < hi)).nonzero().squeeze(1)
    dst = b.dst.index_select(0, e)
    rowptr = torch.zeros(b.num_dst + 1, dtype=torch.int64, device=dst.device)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=b.num_dst), 0)
    return Graph(hi - lo, b.num_dst, b.src.index_select(0, e) - lo, dst, b.perm.index_select(0, e),
                 rowptr, b.in_degree, b.out_degree[lo:hi], dst_in_src=False)
