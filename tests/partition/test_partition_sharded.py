"""ShardedGraph: the shards of a partition set reproduce the graph, and their exchanges match."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarc.errors import PartitionError
from sarc.partition import load_partitions, partition_graph
from sarc.runtime.sharded import ShardedGraph, build_shard

from partition_graphs import cora  # noqa: F401  (a fixture)


def check_shards(pset, src, dst, n, node_data, edge_data):
    """Every invariant of the shards of ``pset`` against the graph it was cut from."""
    P = pset.num_parts
    shards = [ShardedGraph.from_partitions(pset, r) for r in range(P)]
    offsets = pset.node_offsets
    in_deg = torch.bincount(dst, minlength=n).float()
    out_deg = torch.bincount(src, minlength=n).float()
    new_to_orig = torch.cat([s.orig_node_ids for s in shards])
    assert torch.equal(torch.sort(new_to_orig).values, torch.arange(n))
    seen_src, seen_dst, seen_ids, seen_edata = [], [], [], {k: [] for k in edge_data}
    for r, s in enumerate(shards):
        lo, hi = s.local_range
        assert (lo, hi) == (int(offsets[r]), int(offsets[r + 1])) and s.num_nodes == n
        assert torch.equal(s.orig_node_ids, new_to_orig[lo:hi])  # contiguous range, in order
        assert torch.equal(s.in_degree, in_deg[s.orig_node_ids])
        assert torch.equal(s.out_degree, out_deg[s.orig_node_ids])
        for k, v in node_data.items():
            assert torch.equal(s.ndata[k], v[s.orig_node_ids])
        assert s.local_block.dst_in_src and s.local_block.num_src == s.num_local
        assert torch.equal(s.needed_rows[r], torch.arange(s.num_local))
        for j, b in enumerate(s.blocks):
            rows = s.needed_rows[j]
            assert b.num_dst == s.num_local and b.num_src == rows.numel()
            assert b.dst_in_src == (j == r)
            if j != r:  # each boundary row once, and every one used
                assert bool((rows[1:] > rows[:-1]).all())
                assert torch.equal(torch.unique(b.src), torch.arange(b.num_src))
            # whole-graph degrees on both sides of the block
            src_orig = new_to_orig[int(offsets[j]) + rows]
            assert torch.equal(b.out_degree, out_deg[src_orig])
            assert torch.equal(b.in_degree, in_deg[s.orig_node_ids])
            # CSR edge i is input edge b.perm[i]: back to original ids
            seen_src.append(src_orig[b.src])
            seen_dst.append(s.orig_node_ids[b.dst])
            seen_ids.append(s.orig_edge_ids[j][b.perm])
            for k in edge_data:
                seen_edata[k].append(s.edata[j][k][b.perm])
        # exchange lists: what r receives from j is what j sends to r
        assert s.recv_rows[r].numel() == 0 and s.send_rows[r].numel() == 0
        for j in range(P):
            assert torch.equal(s.recv_rows[j], shards[j].send_rows[r])
            assert torch.equal(s.send_rows[j], shards[j].recv_rows[r])
        assert set(s.peers()) == {j for j in range(P) if j != r and (
            s.recv_rows[j].numel() or s.send_rows[j].numel())}
    # the union of all blocks is exactly the edge list, each edge once, with its data
    ids = torch.cat(seen_ids)
    assert torch.equal(torch.sort(ids).values, torch.arange(src.numel()))
    assert torch.equal(torch.cat(seen_src), src[ids])
    assert torch.equal(torch.cat(seen_dst), dst[ids])
    for k, v in edge_data.items():
        assert torch.equal(torch.cat(seen_edata[k]), v[ids])
    return shards


@st.composite
def graphs(draw):
    n = draw(st.integers(0, 30))
    e = draw(st.integers(0, 90)) if n else 0
    ids = st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e)
    src, dst = torch.tensor(draw(ids), dtype=torch.int64), torch.tensor(draw(ids), dtype=torch.int64)
    bools = st.lists(st.booleans(), min_size=n, max_size=n)
    node_data = {"x": torch.randn(n, 2), "train_mask": torch.tensor(draw(bools), dtype=torch.bool)}
    edge_data = {"etype": torch.randint(0, 4, (e,)), "norm": torch.rand(e, 1)}
    return src, dst, n, node_data, edge_data


@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(1, 5), st.sampled_from(["metis", "random"]), st.integers(0, 2))
def test_shards_reproduce_random_graphs(g, num_parts, method, seed):
    src, dst, n, nd, ed = g
    num_parts = min(num_parts, max(n, 1))  # more parts than nodes is refused
    with tempfile.TemporaryDirectory() as tmp:
        partition_graph(src, dst, n, num_parts, Path(tmp) / "p", method=method, node_data=nd,
                        edge_data=ed, seed=seed)
        check_shards(load_partitions(Path(tmp) / "p"), src, dst, n, nd, ed)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_shards_reproduce_cora(cora, tmp_path, method):
    src, dst, n, nd, ed = cora
    pset = partition_graph(src, dst, n, 4, tmp_path / method, method=method, node_data=nd,
                           edge_data=ed)
    shards = check_shards(pset, src, dst, n, nd, ed)
    assert "rank=0/4" in repr(shards[0])


def test_aggregation_over_blocks_is_the_global_aggregation(cora, tmp_path):
    """Summing x_j[needed_rows[j]] over each block's edges gives sum_{u->v} x[u] for local v."""
    src, dst, n, _, _ = cora
    pset = partition_graph(src, dst, n, 3, tmp_path / "p")
    x = torch.randn(n, 4, dtype=torch.float64)
    want = torch.zeros(n, 4, dtype=torch.float64).index_add_(0, dst, x[src])
    shards = [ShardedGraph.from_partitions(pset, r) for r in range(3)]
    local_x = [x[s.orig_node_ids] for s in shards]
    for s in shards:
        got = torch.zeros(s.num_local, 4, dtype=torch.float64)
        for j, b in enumerate(s.blocks):
            rows = local_x[j][shards[j].send_rows[s.rank] if j != s.rank else s.needed_rows[j]]
            got.index_add_(0, b.dst, rows[b.src])
        assert torch.allclose(got, want[s.orig_node_ids])


def test_shard_checks_its_part(cora, tmp_path):
    src, dst, n, _, _ = cora
    pset = partition_graph(src, dst, n, 2, tmp_path / "p", method="random")
    with pytest.raises(PartitionError, match="rank 1 owns"):
        build_shard(pset.load_part(0), pset.node_offsets, 1)
