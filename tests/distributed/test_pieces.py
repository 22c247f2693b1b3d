"""Pieces: a remote block cut by source-row chunks, each over the destinations it
reaches, loses, duplicates and reorders nothing."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarc.distributed.pieces import chunks, cut_blocks
from sarc.graph import Graph


@given(n=st.integers(0, 50), rows=st.one_of(st.none(), st.integers(1, 20)))
def test_chunks_cover_the_rows_once_in_order(n, rows):
    cs = chunks(n, rows)
    assert [i for lo, hi in cs for i in range(lo, hi)] == list(range(n))
    assert all(0 < hi - lo <= (rows or n) for lo, hi in cs)


class _Shard:
    """What ``cut_blocks`` reads of a ShardedGraph."""

    def __init__(self, rank, blocks):
        self.rank, self.blocks = rank, blocks


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 9), n_src=st.integers(1, 30),
       n_dst=st.integers(1, 12), e=st.integers(0, 80))
def test_pieces_partition_a_split_block(seed, rows, n_src, n_dst, e):
    gen = torch.Generator().manual_seed(seed)
    local = Graph.from_edges(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), n_dst)
    src = torch.randint(0, n_src, (e,), generator=gen)
    dst = torch.randint(0, n_dst, (e,), generator=gen)
    b = Graph.from_edges(src, dst, num_src=n_src, num_dst=n_dst, dst_in_src=False)
    local_pieces, pieces = cut_blocks(_Shard(0, (local, b)), rows)
    assert len(local_pieces) == 1 and local_pieces[0].block is local
    assert [(p.lo, p.hi) for p in pieces] == chunks(n_src, rows)
    seen = []
    for c, p in enumerate(pieces):
        g = p.block
        assert p.key == (1, c) and g.num_src == p.hi - p.lo and g.num_dst == p.rows.numel()
        # its destinations: the distinct local nodes its edges reach, sorted
        assert torch.equal(p.rows, torch.unique(b.dst[(b.src >= p.lo) & (b.src < p.hi)]))
        assert torch.equal(g.rowptr[1:] - g.rowptr[:-1], torch.bincount(g.dst, minlength=g.num_dst))
        assert bool((g.dst[1:] >= g.dst[:-1]).all()) if g.num_edges > 1 else True
        assert torch.equal(g.out_degree, b.out_degree[p.lo:p.hi])
        assert torch.equal(g.in_degree, b.in_degree[p.rows])
        # each edge keeps its input position (perm) and its endpoints
        for i in range(g.num_edges):
            seen.append((int(g.perm[i]), int(g.src[i]) + p.lo, int(p.rows[g.dst[i]])))
    assert sorted(seen) == sorted((i, int(src[i]), int(dst[i])) for i in range(e))


def test_gradients_of_pieces_add_up_when_autograd_gives_one_tensor_for_two_names():
    """Autograd gives an add's operands their sum's gradient, the same tensor: a piece over
    every row stores it for both names; a later piece adds to each in place, and neither
    sees the other's additions (``Call._accumulate``)."""
    from types import SimpleNamespace

    from sarc.distributed.schedule import Call
    call = SimpleNamespace(_owned=set())  # the call's record of the sums it owns
    g = torch.ones(4, 2)
    store: dict = {}
    Call._accumulate(call, store, "$d0", g)   # the piece over every row
    Call._accumulate(call, store, "$d1", g)
    rows = torch.tensor([1, 3])
    Call._accumulate(call, store, "$d0", torch.full((2, 2), 5.0), rows, 4)
    Call._accumulate(call, store, "$d1", torch.full((2, 2), 7.0), rows, 4)
    assert torch.equal(store["$d0"], torch.tensor([[1.0, 1], [6, 6], [1, 1], [6, 6]]))
    assert torch.equal(store["$d1"], torch.tensor([[1.0, 1], [8, 8], [1, 1], [8, 8]]))
    assert torch.equal(g, torch.ones(4, 2))
