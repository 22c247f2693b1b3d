"""sarc's neighbour sampling against DGL's ``dgl.sampling.sample_neighbors``: the same
per-edge frequencies on the same small graph (a two-sample chi-square per setting)."""
from __future__ import annotations

import pytest
import torch

from sarc.sampling import NeighbourSampler, SamplingSpec

from .graphs import shards, tiny_graph
from .stats import chi2_critical

dgl = pytest.importorskip("dgl")

DRAWS = 400


def _sarc_counts(g, fanout, replace, prob):
    (sh,), rl = shards(g, 1)
    sampler = NeighbourSampler(sh, SamplingSpec.of([fanout], replace=replace, prob=prob, seed=1))
    counts = torch.zeros(g.src.numel(), dtype=torch.int64)
    nodes = torch.arange(g.num_nodes)
    for epoch in range(DRAWS):
        b = sampler.sample(nodes, epoch).blocks[0].shard
        counts += torch.bincount(b.orig_edge_ids[0], minlength=counts.numel())
    return counts


def _dgl_counts(g, fanout, replace, prob):
    dg = dgl.graph((g.src, g.dst), num_nodes=g.num_nodes)
    if prob is not None:
        dg.edata[prob] = g.edata[prob].float()
    dgl.seed(1)
    counts = torch.zeros(g.src.numel(), dtype=torch.int64)
    for _ in range(DRAWS):
        sub = dgl.sampling.sample_neighbors(dg, torch.arange(g.num_nodes), fanout, prob=prob,
                                            replace=replace)
        counts += torch.bincount(sub.edata[dgl.EID], minlength=counts.numel())
    return counts


@pytest.mark.parametrize("fanout,replace,prob", [(2, False, None), (3, True, None),
                                                 (2, False, "w"), (3, True, "w")])
def test_frequencies_match_dgl(fanout, replace, prob):
    g = tiny_graph(n=24, e=200, seed=5)
    ours, theirs = _sarc_counts(g, fanout, replace, prob), _dgl_counts(g, fanout, replace, prob)
    assert int(ours.sum()) == int(theirs.sum())  # as many edges per node in both
    stat, dof = 0.0, 0
    for v in range(g.num_nodes):
        e = (g.dst == v).nonzero().squeeze(1)
        a, b = ours[e].double(), theirs[e].double()
        assert a.sum() == b.sum(), v
        live = (a + b) > 0
        if int(live.sum()) > 1:
            stat += float(((a[live] - b[live]) ** 2 / (a[live] + b[live])).sum())
            dof += int(live.sum()) - 1
    assert dof > 20 and stat < chi2_critical(dof), (stat, dof)
