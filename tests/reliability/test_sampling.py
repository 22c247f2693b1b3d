"""Sampling and seed loading with bad input: one-line errors before anything is
exchanged, on every worker at once (none is left waiting for a peer that gave up), and
workers without seeds that take part in every step."""
from __future__ import annotations

import pytest
import torch

from sarc.sampling import (Comm, NeighbourSampler, SamplingError, SamplingSpec, SeedLoader,
                           fetch_rows)

from sampling.graphs import run_workers, shards, tiny_graph

from .catalogue import case


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


@case("cli", "fanouts of another length than the model's graph layers", "error")
def test_fanouts_of_the_wrong_length():
    with pytest.raises(SamplingError) as e:
        SamplingSpec.of([10, 25, 5], layers=2)
    _one_line(e, "3 fanouts", "2 graph layers")


@case("cli", "a fanout below -1 (`-2`)", "error")
def test_negative_fanout():
    with pytest.raises(SamplingError) as e:
        SamplingSpec.of([10, -2])
    _one_line(e, "layer 2", "-2", "-1 for all")
    with pytest.raises(SamplingError, match="fanout of layer 1 is -5"):
        SamplingSpec((-5,))  # built directly, checked the same
    assert SamplingSpec.of([-1, 0]).fanouts == (-1, 0)


@case("cli", "batch size 0", "error")
def test_batch_size_zero():
    (sh,), _ = shards(tiny_graph(), 1)
    for bad in (0, -3, 2.5):
        with pytest.raises(SamplingError) as e:
            SeedLoader(sh, "train_mask", batch_size=bad)
        _one_line(e, "batch size", repr(bad))


@case("partition", "sampling probabilities from edge data the graph does not have", "error")
def test_unknown_probability_edge_data(tmp_path):
    def work(rank, group, g):
        shs, _ = shards(g, 2)
        try:
            NeighbourSampler(shs[rank], SamplingSpec.of([2], prob="weight"), Comm(group))
        except SamplingError as e:
            return str(e)
        return None
    msgs = run_workers(work, 2, tmp_path, tiny_graph())
    assert msgs[0] == msgs[1] and msgs[0] is not None
    assert "'weight'" in msgs[0] and "etype, w" in msgs[0]


@case("partition", "negative sampling probabilities on one worker's edges", "error")
def test_negative_probabilities_on_one_worker(tmp_path):
    g = tiny_graph()
    g.edata["w"] = g.edata["w"].clone()
    g.edata["w"][(g.dst == int(g.dst[0]))] = -1.0   # edges into one node: one worker's

    def work(rank, group, g):
        shs, _ = shards(g, 3)
        try:
            NeighbourSampler(shs[rank], SamplingSpec.of([2], prob="w"), Comm(group))
        except SamplingError as e:
            return str(e)
        return None
    msgs = run_workers(work, 3, tmp_path, g)
    own = [m for m in msgs if "negative" in m]
    assert len(own) == 1 and "'w'" in own[0]
    assert all("could not go on" in m for m in msgs if m not in own)


@case("cli", "seed ids outside the graph on one worker", "error")
def test_bad_seeds_on_one_worker(tmp_path):
    def work(rank, group, g):
        shs, _ = shards(g, 2)
        sampler = NeighbourSampler(shs[rank], SamplingSpec.of([2, 2]), Comm(group))
        try:
            sampler.sample([1, 2] if rank == 0 else [3, 10_000])
        except SamplingError as e:
            return str(e)
        return None
    msgs = run_workers(work, 2, tmp_path, tiny_graph())
    assert "seed node 10000 is not a node" in msgs[1]
    assert "worker 1 could not go on" in msgs[0]


@case("faults", "workers with no training nodes (fewer training nodes than workers)", "exact")
def test_workers_without_training_nodes_take_part(tmp_path):
    """One training node, three workers: every worker runs the same number of steps, the two
    without seeds sample and fetch with the third (no hang), and the blocks are the
    single-process ones."""
    g = tiny_graph()
    g.ndata["train_mask"] = torch.zeros(g.num_nodes, dtype=torch.bool)
    g.ndata["train_mask"][5] = True

    def work(rank, group, g, parts, drop_last):
        shs, rl = shards(g, parts)
        comm = Comm(group)
        loader = SeedLoader(shs[rank], "train_mask", batch_size=4, drop_last=drop_last, comm=comm)
        sampler = NeighbourSampler(shs[rank], SamplingSpec.of([3, 3]), comm)
        steps = []
        for seeds in loader.epoch(0):
            mb = sampler.sample(seeds, 0)
            feats = fetch_rows(shs[rank], mb.input_nodes, ["feat"], comm)["feat"]
            steps.append({"seeds": rl.new_to_orig[seeds], "edges": [
                sorted(e for j in range(parts) for e in b.shard.orig_edge_ids[j].tolist())
                for b in mb], "inputs": mb.blocks[0].shard.orig_node_ids, "feats": feats})
        return {"steps": len(loader), "ran": steps}

    ref = run_workers(work, 1, tmp_path / "p1", g, 1, False)[0]
    got = run_workers(work, 3, tmp_path / "p3", g, 3, False)
    assert ref["steps"] == 1 and [r["steps"] for r in got] == [1, 1, 1]
    assert sorted(int(s) for r in got for s in r["ran"][0]["seeds"]) == [5]
    for layer in range(2):
        assert sorted(e for r in got for e in r["ran"][0]["edges"][layer]) == \
            ref["ran"][0]["edges"][layer]
    for r in got:
        assert torch.equal(r["ran"][0]["feats"], g.ndata["feat"][r["ran"][0]["inputs"]])
    dropped = run_workers(work, 3, tmp_path / "p3d", g, 3, True)
    assert [r["steps"] for r in dropped] == [0, 0, 0]
