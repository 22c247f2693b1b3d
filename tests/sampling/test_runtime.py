"""sarc layers through the distributed runtime (``DistGraph``) on the per-layer blocks.

On P = 1, 2, 3 gloo workers, each layer of a two-layer model runs its distributed
schedule on that layer's ``LayerBlock.shard`` (a bipartite local block: the layer's
destinations are a prefix of its source rows): the outputs at the seeds, the
parameter gradients (summed over workers) and the input gradients equal the same
layers on the whole graph."""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.nn.functional as F

from sarc.sampling import Comm, NeighbourSampler, SamplingSpec

from .graphs import run_workers, shards, summed_grads, tiny_graph

SEEDS = [0, 4, 5, 9, 13, 21, 26, 28]
KINDS = ("sage", "gcn", "gat", "gin", "rgcn")


def _model(kind: str):
    import gat
    import gcn
    import gin
    import rgcn
    import sage
    torch.manual_seed(1)
    make = {"sage": lambda i, o: sage.SAGELayer(i, o), "gcn": lambda i, o: gcn.GCNLayer(i, o),
            "gat": lambda i, o: gat.GATLayer(i, o, heads=2, concat=o != 3),
            "gin": lambda i, o: gin.GINLayer(i, 6, o, eps=0.1, train_eps=True),
            "rgcn": lambda i, o: rgcn.RGCNLayer(i, o, 2)}[kind]
    return torch.nn.ModuleList([make(5, 4), make(8 if kind == "gat" else 4, 3)])


def _edge_inputs(kind: str, g, edge_ids: torch.Tensor) -> dict:
    """R-GCN's edge inputs of the edges ``edge_ids`` (original ids, in the graph's edge
    order): their relation and the whole graph's 1 / |N_r(v)|."""
    if kind != "rgcn":
        return {}
    from rgcn import relation_norm
    norm = relation_norm(g.full(), g.edata["etype"], 2)
    return {"etype": g.edata["etype"][edge_ids], "norm": norm[edge_ids]}


def _weights(n):
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(2))


SPECS = {"mfg": SamplingSpec.mfg(2), "sampled": SamplingSpec.of([2, 3], seed=4)}
RUNTIME = {"mfg": {}, "sampled": {"exec_mode": "oneshot", "chunk_rows": 2}}
"""The MFG with the planner's choices; the sample in oneshot mode, in messages of 2 rows."""


def _step(kind, graphs, mb, g, group):
    """One step of the two layers on ``graphs`` (DistGraphs, or for one process the local
    blocks as Graphs): the outputs, their original ids, the gradients."""
    model = _model(kind)
    edges = [_edge_inputs(kind, g, torch.cat(b.shard.orig_edge_ids)) for b in mb.blocks]
    x = mb.blocks[0].shard.ndata["feat"].clone().requires_grad_(True)
    y = model[1](graphs[1], F.relu(model[0](graphs[0], x, **edges[0])), **edges[1])
    ids = mb.blocks[1].shard.orig_node_ids[:mb.blocks[1].num_dst]
    (y * _weights(g.num_nodes)[ids]).sum().backward()
    return {"ids": ids, "y": y.detach(), "x_ids": mb.blocks[0].shard.orig_node_ids,
            "x_grad": x.grad, "grads": summed_grads(model, group)}


def _work(rank, group, g, parts):
    from sarc.distributed import DistGraph
    shs, rl = shards(g, parts)
    seeds = rl.orig_to_new[torch.tensor(SEEDS)]
    out = {}
    for spec_name, spec in SPECS.items():
        sampler = NeighbourSampler(shs[rank], spec, Comm(group))
        mb = sampler.sample(seeds[rank::parts], epoch=0)
        for kind in KINDS:
            graphs = [DistGraph(b.shard, group, timeout=datetime.timedelta(seconds=60),
                                **RUNTIME[spec_name]) for b in mb.blocks]
            out[spec_name, kind] = _step(kind, graphs, mb, g, group)
            if parts == 1:  # the single-process path: the local blocks are the whole MFG
                out[spec_name, kind, "graph"] = _step(kind, [b.local_block for b in mb.blocks],
                                                      mb, g, False)
    return out


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


@pytest.fixture(scope="module")
def runs(graph, tmp_path_factory):
    return {p: run_workers(_work, p, tmp_path_factory.mktemp(f"rt{p}"), graph, p)
            for p in (1, 2, 3)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", (1, 2, 3))
def test_layers_on_mfg_shards_equal_the_full_graph(runs, graph, kind, p):
    n = graph.num_nodes
    model = _model(kind)
    x = graph.ndata["feat"].clone().requires_grad_(True)
    full_g = graph.full()
    edges = _edge_inputs(kind, graph, torch.arange(graph.src.numel()))
    y = model[1](full_g, F.relu(model[0](full_g, x, **edges)), **edges)
    seeds = torch.tensor(SEEDS)
    (y[seeds] * _weights(n)[seeds]).sum().backward()
    got = [r["mfg", kind] for r in runs[p]]
    ids = torch.cat([r["ids"] for r in got])
    assert sorted(ids.tolist()) == SEEDS
    torch.testing.assert_close(torch.cat([r["y"] for r in got]), y[ids].detach(),
                               rtol=1e-5, atol=1e-6)
    for name, prm in model.named_parameters():
        torch.testing.assert_close(got[0]["grads"][name], prm.grad, rtol=1e-5, atol=1e-6,
                                   msg=name)
    x_grad = torch.zeros_like(x)
    for r in got:  # every input node is one worker's local row
        x_grad[r["x_ids"]] += r["x_grad"]
    torch.testing.assert_close(x_grad, x.grad, rtol=1e-5, atol=1e-6)


def _by_id(records, what):
    ids = torch.cat([r["ids" if what == "y" else "x_ids"] for r in records])
    rows = torch.cat([r[what] for r in records])
    return rows[torch.argsort(ids)], torch.sort(ids).values


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec", list(SPECS))
def test_sampled_layers_through_the_runtime_equal_the_single_process_blocks(runs, kind, spec):
    """Sampled blocks: the distributed schedules on P = 1, 2, 3 workers give what the
    single-process layers give on the P = 1 local blocks (the samples do not depend on P;
    a mean divides by the sampled in-degree in both)."""
    ref = runs[1][0][spec, kind, "graph"]
    for p in (1, 2, 3):
        got = [r[spec, kind] for r in runs[p]]
        for what in ("y", "x_grad"):
            rows, ids = _by_id(got, what)
            ref_rows, ref_ids = _by_id([ref], what)
            assert torch.equal(ids, ref_ids)
            torch.testing.assert_close(rows, ref_rows, rtol=1e-5, atol=1e-6)
        for name, g in ref["grads"].items():
            torch.testing.assert_close(got[0]["grads"][name], g, rtol=1e-5, atol=1e-6, msg=name)
