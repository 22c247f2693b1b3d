"""Neighbour sampling in one process (P = 1, no process group): fanouts, replacement,
probabilities, MFG equivalence, and the distribution of the draws."""
from __future__ import annotations

import pytest
import torch

from sarc.sampling import NeighbourSampler, SamplingSpec
from sarc.sampling.draws import uniform

from .graphs import TinyGraph, shards, tiny_graph
from .stats import assert_fits


def _sampler(g, spec):
    (sh,), rl = shards(g, 1)
    return NeighbourSampler(sh, spec), rl


def _edges(block) -> dict[int, list[int]]:
    """dst original id -> the original ids of its sampled in-edges (P = 1: the local block)."""
    sh = block.shard
    b = sh.local_block
    out: dict[int, list[int]] = {int(v): [] for v in sh.orig_node_ids[:block.num_dst]}
    eids = sh.orig_edge_ids[sh.rank][b.perm]
    for d, e in zip(b.dst.tolist(), eids.tolist()):
        out[int(sh.orig_node_ids[d])].append(e)
    return out


def _in_edges(g: TinyGraph, v: int) -> list[int]:
    return (g.dst == v).nonzero().squeeze(1).tolist()


@pytest.mark.parametrize("replace", [False, True])
def test_fanouts_are_respected(replace):
    g = tiny_graph()
    sampler, rl = _sampler(g, SamplingSpec.of([2, 3, 1], replace=replace))
    mb = sampler.sample(torch.arange(0, g.num_nodes, 4), epoch=5)
    assert len(mb) == 3
    for block, fanout in zip(mb, (2, 3, 1)):
        for v, edges in _edges(block).items():
            deg = len(_in_edges(g, v))
            want = (fanout if deg else 0) if replace else min(fanout, deg)
            assert len(edges) == want, (block.layer, v, edges)
            assert all(g.dst[e] == v for e in edges)
        assert torch.equal(block.sampled_in_degree,
                           torch.bincount(block.local_block.dst, minlength=block.num_dst).float())


def test_without_replacement_no_edge_and_no_neighbour_twice():
    g = tiny_graph(n=40, e=300)
    pairs = torch.unique(torch.stack([g.src, g.dst], 1), dim=0)  # a simple graph as well
    simple = TinyGraph(g.num_nodes, pairs[:, 0], pairs[:, 1], g.ndata,
                       {k: v[:pairs.shape[0]] for k, v in g.edata.items()})
    for graph in (g, simple):
        sampler, _ = _sampler(graph, SamplingSpec.of([3, 3]))
        for epoch in range(5):
            for block in sampler.sample(torch.arange(graph.num_nodes), epoch):
                for v, edges in _edges(block).items():
                    assert len(set(edges)) == len(edges)
                    if graph is simple:
                        srcs = [int(graph.src[e]) for e in edges]
                        assert len(set(srcs)) == len(srcs)


def test_fanout_at_least_the_max_in_degree_is_the_mfg():
    g = tiny_graph()
    max_deg = int(torch.bincount(g.dst).max())
    seeds = torch.tensor([0, 3, 7, 11])
    full, _ = _sampler(g, SamplingSpec.mfg(2))
    # the largest fanout takes no memory of its own size (it was the sampler's scratch)
    for fanouts in ([max_deg, max_deg + 4], [2**31 - 1, 2**62]):
        capped, _ = _sampler(g, SamplingSpec.of(fanouts))
        for a, b in zip(full.sample(seeds, 0), capped.sample(seeds, 2)):
            assert torch.equal(a.src_nodes, b.src_nodes) and a.num_dst == b.num_dst
            assert _edges(a) == _edges(b)
            assert torch.equal(a.in_degree, b.in_degree)


def test_mfg_blocks_are_the_k_hop_in_edges():
    """Layer k's destinations are frontier_k, its edges every in-edge of them, its sources
    frontier_{k-1}; the destinations come first among the sources; degrees are whole-graph."""
    g = tiny_graph()
    sampler, rl = _sampler(g, SamplingSpec.mfg(3))
    seeds_orig = {2, 9, 17}
    mb = sampler.sample(rl.orig_to_new[torch.tensor(sorted(seeds_orig))], 0)
    frontier = seeds_orig
    in_deg = torch.bincount(g.dst, minlength=g.num_nodes).float()
    out_deg = torch.bincount(g.src, minlength=g.num_nodes).float()
    for block in reversed(mb.blocks):
        orig = block.shard.orig_node_ids
        assert set(orig[:block.num_dst].tolist()) == frontier
        edges = {e for v in frontier for e in _in_edges(g, v)}
        assert {e for es in _edges(block).values() for e in es} == edges
        frontier = frontier | {int(g.src[e]) for e in edges}
        assert set(orig.tolist()) == frontier
        lb = block.local_block
        assert torch.equal(lb.in_degree, in_deg[orig[:block.num_dst]])
        assert torch.equal(lb.out_degree, out_deg[orig])
    assert torch.equal(mb.seeds, mb.blocks[-1].dst_nodes)


def test_draws_are_pure_functions_of_their_key():
    keys = torch.arange(1000)
    a = uniform(7, 3, 2, keys)
    assert torch.equal(a, uniform(7, 3, 2, keys))
    assert torch.equal(a[torch.tensor([5, 999, 0])], uniform(7, 3, 2, torch.tensor([5, 999, 0])))
    assert not torch.equal(a, uniform(7, 4, 2, keys)) and not torch.equal(a, uniform(8, 3, 2, keys))
    assert float(a.min()) > 0 and float(a.max()) < 1
    tenths = (uniform(1, 2, torch.arange(20000)) * 10).long()
    assert_fits(torch.bincount(tenths, minlength=10), torch.full((10,), 0.1), 20000, "uniform")


def test_same_seed_and_epoch_same_sample_and_epochs_differ():
    g = tiny_graph()
    sampler, _ = _sampler(g, SamplingSpec.of([2, 2], seed=11))
    seeds = torch.arange(0, 20)
    a, b, c = sampler.sample(seeds, 1), sampler.sample(seeds, 1), sampler.sample(seeds, 2)
    assert all(_edges(x) == _edges(y) for x, y in zip(a, b))
    assert any(_edges(x) != _edges(y) for x, y in zip(a, c))
    # a node's sample does not depend on the other seeds of the step
    alone = sampler.sample(seeds[:1], 1)
    v = int(alone.blocks[-1].shard.orig_node_ids[0])
    assert _edges(alone.blocks[-1])[v] == _edges(a.blocks[-1])[v]


def _frequencies(g, spec, v: int, epochs: int) -> torch.Tensor:
    """How often each in-edge of v (original id) is sampled over ``epochs`` epochs."""
    sampler, rl = _sampler(g, spec)
    counts = torch.zeros(g.src.numel(), dtype=torch.int64)
    seed = rl.orig_to_new[torch.tensor([v])]
    for epoch in range(epochs):
        for e in _edges(sampler.sample(seed, epoch).blocks[-1])[v]:
            counts[e] += 1
    return counts


def _star(weights) -> TinyGraph:
    """Node 0 with one in-edge from each of nodes 1..d, of the given weights."""
    d = len(weights)
    src, dst = torch.arange(1, d + 1), torch.zeros(d, dtype=torch.int64)
    return TinyGraph(d + 1, src, dst, {"feat": torch.zeros(d + 1, 2)},
                     {"w": torch.tensor(weights, dtype=torch.float32)})


def test_uniform_sampling_frequency():
    g = _star([1.0] * 6)
    counts = _frequencies(g, SamplingSpec.of([2]), 0, 3000)
    # each edge in the sample with probability 2/6: as a distribution over edges, uniform
    assert int(counts.sum()) == 6000
    assert_fits(counts, torch.full((6,), 1 / 6), 6000, "without replacement")
    counts = _frequencies(g, SamplingSpec.of([4], replace=True), 0, 2000)
    assert_fits(counts, torch.full((6,), 1 / 6), 8000, "with replacement")


def test_probabilities_set_the_frequency():
    w = [0.0, 1.0, 2.0, 3.0, 4.0, 10.0]
    g = _star(w)
    wt = torch.tensor(w, dtype=torch.float64)
    counts = _frequencies(g, SamplingSpec.of([3], replace=True, prob="w"), 0, 2000)
    assert_fits(counts, wt / wt.sum(), 6000, "with replacement")
    counts = _frequencies(g, SamplingSpec.of([1], prob="w"), 0, 4000)
    assert_fits(counts, wt / wt.sum(), 4000, "one draw")
    # two draws without replacement: successive draws proportional to the weights left
    W = wt.sum()
    incl = torch.tensor([wt[i] / W + sum(float(wt[j] / W * wt[i] / (W - wt[j]))
                                         for j in range(6) if j != i) for i in range(6)])
    counts = _frequencies(g, SamplingSpec.of([2], prob="w"), 0, 4000)
    assert_fits(counts, incl / 2, 8000, "two draws without replacement")
    # weight 0 is never drawn, also when fewer edges have weight than the fanout asks
    counts = _frequencies(_star([0.0, 0.0, 1.0, 2.0]), SamplingSpec.of([3], prob="w"), 0, 50)
    assert counts.tolist() == [0, 0, 50, 50]


def test_nodes_without_in_edges_get_empty_samples():
    g = tiny_graph()
    isolated = torch.tensor([27, 28, 29])
    for spec in (SamplingSpec.of([2]), SamplingSpec.of([2], replace=True),
                 SamplingSpec.of([2], replace=True, prob="w"), SamplingSpec.of([2], prob="w")):
        sampler, rl = _sampler(g, spec)
        block = sampler.sample(rl.orig_to_new[isolated], 0).blocks[0]
        assert block.num_edges == 0 and block.num_dst == 3 and block.num_src == 3
        assert block.sampled_in_degree.tolist() == [0.0, 0.0, 0.0]


def _by_definition(table, rows, orig_ids, fanout, key):
    """Sampling without replacement as the module defines it, in the plainest terms: per
    destination, Floyd's draws of ``fanout`` of its ``d > fanout`` in-edges without
    weights, else its in-edges of the ``fanout`` largest keys ``log(u) / w`` (none of
    weight 0), listed in edge order."""
    from sarc.sampling.draws import NEIGHBOUR_KEY
    cand, pos = [], []
    for i, v in enumerate(rows.tolist()):
        a, b = int(table.rowptr[v]), int(table.rowptr[v + 1])
        edges = torch.arange(a, b)
        d = b - a
        if fanout == -1:
            keep = edges
        elif table.weight is None and d > fanout:
            drawn = set()
            for top in range(d - fanout, d):
                u = float(uniform(*key, int(orig_ids[i]), NEIGHBOUR_KEY, top)[0])
                t = min(int(u * (top + 1)), top)
                drawn.add(top if t in drawn else t)
            keep = a + torch.tensor(sorted(drawn), dtype=torch.int64)
        else:
            u = uniform(*key, int(orig_ids[i]), NEIGHBOUR_KEY, torch.arange(b - a))
            score = u if table.weight is None else torch.log(u) / table.weight[edges]
            best = torch.argsort(-score, stable=True)[:fanout]
            keep = torch.sort(edges[best[torch.isfinite(score[best])]]).values
        cand.append(keep)
        pos.append(torch.full((keep.numel(),), i, dtype=torch.int64))
    return torch.cat(cand), torch.cat(pos)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("case", range(12))
def test_sampling_is_the_definition(case, native, monkeypatch):
    """The sampler (sarc's C kernel, or the bucketed top-k in torch without it) equals the
    per-destination definition on random graphs with hubs, zero weights, any fanout and
    any order of the destinations."""
    from sarc.native import kernels
    from sarc.sampling import neighbours
    from sarc.sampling.neighbours import InEdges, sample
    if native and kernels.kernels() is None:
        pytest.skip("no C compiler builds the CPU kernels here")
    if not native:
        monkeypatch.setattr(neighbours, "kernels", lambda: None)
    gen = torch.Generator().manual_seed(case)
    n = 60
    hubs = torch.randint(0, n, (4,), generator=gen)
    dst = torch.cat([torch.randint(0, n, (300,), generator=gen),
                     hubs.repeat_interleave(torch.tensor([90, 45, 17, 8]))])
    src = torch.randint(0, n, (dst.numel(),), generator=gen)
    w = torch.rand(dst.numel(), generator=gen) * (torch.rand(dst.numel(), generator=gen) > 0.3)
    g = TinyGraph(n, src, dst, {"feat": torch.zeros(n, 2)}, {"w": w})
    (sh,), _ = shards(g, 1)
    weighted = case % 2 == 1
    table = InEdges.of(sh, "w" if weighted else None)
    rows = torch.randperm(n, generator=gen)[:40]
    orig = sh.orig_node_ids[rows]
    for fanout in (-1, 0, 1, 3, 8, 20, 100):
        key = (case, 2, 1)
        got = sample(table, rows, orig, fanout, False, key)
        want = _by_definition(table, rows, orig, fanout, key)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (fanout, weighted)


def test_weighted_draws_with_replacement_depend_on_the_destination_alone():
    """A destination's draws with replacement are its own inverse CDF: the same whichever
    other destinations share the batch (one with weights twelve orders of magnitude
    larger, before it in the table), and never an edge of weight 0."""
    from sarc.sampling.neighbours import InEdges, sample
    w = torch.cat([torch.full((1000,), 1e9, dtype=torch.float64),
                   torch.tensor([1e-4, 0.0, 3e-4, 0.0], dtype=torch.float64)])
    n = w.numel()
    table = InEdges(torch.tensor([0, 1000, n]), torch.zeros(n, dtype=torch.long),
                    torch.zeros(n, dtype=torch.long), torch.arange(n), torch.arange(n), w)
    together, alone = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    for epoch in range(50):
        cand, pos = sample(table, torch.tensor([0, 1]), torch.tensor([0, 1]), 5, True,
                           (0, epoch, 0))
        mine = cand[pos == 1] - 1000
        only, _ = sample(table, torch.tensor([1]), torch.tensor([1]), 5, True, (0, epoch, 0))
        assert torch.equal(mine, only - 1000)
        together += torch.bincount(mine, minlength=4)
        alone += torch.bincount(only - 1000, minlength=4)
    assert together[1] == together[3] == 0 and together.sum() == 250
    assert 30 < together[0] < 100  # a quarter of the draws, in expectation
