"""Minibatch plans (``--mode mfg|sampling``): each layer planned on its own blocks.

The bytes the planner predicts for a layer's blocks are the bytes the distributed
runtime sends on them: on P = 2, 3 gloo workers, each layer of a two-layer model runs
its schedule (``DistGraph``) on the layer's sampled blocks, forward and backward, and
every worker's ``ByteCounter`` for that layer equals the plan made from the blocks'
own statistics (``ShardStats.from_shards``), in sar and oneshot mode. The in-process
driver ``sarc compile`` measures blocks with (P threads, ``block_sample``) draws the
blocks the gloo workers draw.
"""
from __future__ import annotations

import datetime
import json

import pytest
import torch
import torch.nn.functional as F

from sarc.cli import main
from sarc.cli.block_sample import run_threads, sample_blocks
from sarc.compiler import compile_layer
from sarc.planner.plan import format_plan, plan_layer, plan_minibatch, plan_model
from sarc.planner.stats import BlockSample, ShardStats
from sarc.sampling import NeighbourSampler, SamplingError, SamplingSpec
from sarc.training.minibatch import MiniBatchConfig, SeedBatches
from sampling.graphs import run_workers, shards, tiny_graph

KINDS = ("gcn", "sage", "gat")
EXECS = ("sar", "oneshot")
SPECS = {"mfg": SamplingSpec.mfg(2), "sampling": SamplingSpec.of([2, 3], seed=4)}
BATCH = 4
STEPS = 2


def _model(kind: str):
    import gat
    import gcn
    import sage
    torch.manual_seed(1)
    make = {"gcn": lambda i, o: gcn.GCNLayer(i, o), "sage": lambda i, o: sage.SAGELayer(i, o),
            "gat": lambda i, o: gat.GATLayer(i, o, heads=2, concat=o != 3)}[kind]
    return torch.nn.ModuleList([make(5, 4), make(8 if kind == "gat" else 4, 3)])


def _layers(kind: str):
    return [(f"conv{k + 1}", compile_layer(layer, through="optimize").optimized)
            for k, layer in enumerate(_model(kind))]


def _work(rank, group, g, parts):
    """Per spec: the first STEPS batches' block shards; on the first batch, per model and
    execution mode, the bytes each layer's DistGraph counted over a training step."""
    from sarc.distributed import DistGraph
    from sarc.sampling import Comm
    shs, _ = shards(g, parts)
    out = {}
    for name, spec in SPECS.items():
        comm = Comm(group)
        loader = SeedBatches(shs[rank], shs[rank].ndata["train_mask"],
                             MiniBatchConfig("mfg", batch_size=BATCH), spec.seed, comm)
        sampler = NeighbourSampler(shs[rank], spec, comm)
        mbs = [sampler.sample(seeds, 0) for _, (seeds, _) in zip(range(STEPS), loader.epoch(0))]
        out[name, "blocks"] = [[b.shard for b in mb.blocks] for mb in mbs]
        mb = mbs[0]
        for kind in KINDS:
            for em in EXECS:
                model = _model(kind)
                graphs = [DistGraph(b.shard, group, exec_mode=em,
                                    timeout=datetime.timedelta(seconds=60)) for b in mb.blocks]
                x = mb.blocks[0].shard.ndata["feat"]  # the input features need no gradient
                y = model[1](graphs[1], F.relu(model[0](graphs[0], x)))
                y.square().sum().backward()
                out[name, kind, em] = [dg.counter.total_sent for dg in graphs]
                out[name, kind, em, "received"] = [dg.counter.total_received for dg in graphs]
    return out


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


@pytest.fixture(scope="module")
def runs(graph, tmp_path_factory):
    return {p: run_workers(_work, p, tmp_path_factory.mktemp(f"bytes{p}"), graph, p)
            for p in (2, 3)}


def _sample(records, spec_name, fanouts=None) -> BlockSample:
    """The gloo workers' blocks as the planner's statistics."""
    p = len(records)
    steps = len(records[0][spec_name, "blocks"])
    return BlockSample(tuple(
        tuple(ShardStats.from_shards([records[r][spec_name, "blocks"][s][k] for r in range(p)])
              for k in range(2))
        for s in range(steps)), BATCH, fanouts)


@pytest.mark.parametrize("em", EXECS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("p", (2, 3))
def test_bytes_each_layer_sends_equal_the_plan_on_its_blocks(runs, kind, spec, em, p):
    records = runs[p]
    first = _sample(records, spec)
    one = BlockSample(first.batches[:1], BATCH)
    plan = plan_minibatch(_layers(kind), one, mode="sampling" if spec == "sampling" else "mfg",
                          workers=p, exec_mode=em)
    for k, lp in enumerate(plan.layers):
        counted = [r[spec, kind, em][k] for r in records]
        assert list(lp.bytes_sent) == counted, (lp.name, counted)
        assert list(lp.batches.bytes_sent[0]) == counted
        assert sum(counted) == sum(r[spec, kind, em, "received"][k] for r in records)
    assert sum(sum(lp.bytes_sent) for lp in plan.layers) > 0


def test_oneshot_sends_less_than_sar_on_the_same_blocks(runs):
    for p, records in runs.items():
        for spec in SPECS:
            sar = sum(sum(r[spec, "gcn", "sar"]) for r in records)
            one = sum(sum(r[spec, "gcn", "oneshot"]) for r in records)
            assert 0 < one < sar, (p, spec)


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("p", (2, 3))
def test_the_thread_driver_draws_the_blocks_of_the_gloo_workers(runs, graph, spec, p):
    """``sarc compile``'s in-process driver (P threads) measures the blocks P gloo
    processes sample: the same statistics, batch by batch, layer by layer."""
    shs, _ = shards(graph, p)
    got = sample_blocks(shs, SPECS[spec], batch_size=BATCH, batches=STEPS, epoch=0)
    assert got.batches == _sample(runs[p], spec).batches
    assert got.fanouts == (None if spec == "mfg" else (2, 3))


def test_a_sample_plans_each_layer_for_its_largest_batch_then_evaluates_every_batch():
    layers = _layers("gcn")
    small = ShardStats(2, (10, 12), (30, 30), ((0, 4), (5, 0)), (4, 4))
    big = ShardStats(2, (14, 11), (40, 31), ((0, 9), (2, 0)), (4, 4))
    top = ShardStats(2, (4, 4), (8, 8), ((0, 2), (1, 0)), (2, 2))
    sample = BlockSample(((small, top), (big, top)), 4, (2, 3))
    assert sample.largest(0) == ShardStats(2, (14, 12), (40, 31), ((0, 9), (5, 0)), (4, 4))
    plan = plan_model(layers, mode="sampling", workers=2, sample=sample)
    for k, lp in enumerate(plan.layers):
        each = [plan_layer(lp.name, layers[k][1], mode="sampling", workers=2, stats=st,
                           exec_mode=lp.exec_mode, inputs_need_grad=k > 0).bytes_sent
                for st in sample.layer(k)]
        assert [list(b) for b in lp.batches.bytes_sent] == [list(b) for b in each]
        assert list(lp.bytes_sent) == [max(c) for c in zip(*each)]
        assert lp.batches.fanout == (2, 3)[k]
    assert plan.layers[0].exec_mode == "oneshot"  # the minibatch modes' default
    assert plan.layers[0].batches.blocks["edges"] == {"mean": 32.75, "max": 40}
    text = format_plan(plan)
    assert "fanouts 2,3" in text and "fanout 2" in text and "bytes sent / worker / step" in text
    data = json.loads(plan.dumps())
    assert data["minibatch"]["batch_size"] == 4
    assert data["layers"][1]["batches"]["bytes_sent_per_step"]["per_batch"] == \
        [list(b) for b in plan.layers[1].batches.bytes_sent]


def test_a_budget_keeps_only_what_fits_the_largest_batch():
    layers = _layers("gcn")
    a = ShardStats(2, (10, 10), (30, 30), ((0, 4), (4, 0)), (4, 4))
    b = ShardStats(2, (10, 10), (30, 30), ((0, 40), (4, 0)), (4, 4))
    top = ShardStats(2, (4, 4), (8, 8), ((0, 0), (0, 0)), (2, 2))
    sample = BlockSample(((a, top), (b, top)), 4)
    local = plan_layer("c", layers[0][1], workers=2, stats=b, exec_mode="sar",
                       inputs_need_grad=False).bytes_kept
    row = plan_layer("c", layers[0][1], workers=2, stats=b).exchange.row_bytes
    top_local = plan_layer("c", layers[1][1], workers=2, stats=top, exec_mode="sar").bytes_kept
    budget = max(l + t for l, t in zip(local, top_local)) + 10 * row  # 4 rows fit, not 40
    plan = plan_model(layers, mode="mfg", workers=2, sample=sample, mem_budget=budget)
    lp = plan.layers[0]
    assert lp.exec_mode == "hybrid" and lp.kept_peers == ((), (0,))
    assert all(k <= budget for k in plan.step_bytes_kept())


def test_a_sample_must_fit_the_model_and_the_workers():
    layers = _layers("gcn")
    st = ShardStats(2, (4, 4), (8, 8), ((0, 1), (1, 0)), (2, 2))
    sample = BlockSample(((st, st),), 4)
    with pytest.raises(ValueError, match="3 workers"):
        plan_minibatch(layers, sample, mode="mfg", workers=3)
    with pytest.raises(ValueError, match="step takes 1 blocks"):
        plan_minibatch(layers[:1], sample, mode="mfg", workers=2)
    with pytest.raises(ValueError, match="step takes 1 blocks"):   # two layers on one block
        plan_minibatch(layers, sample, mode="mfg", workers=2, blocks=[0, 0])
    for blocks in ([0, 2], [1, 0], [0], [0, 1, 1]):
        with pytest.raises(ValueError, match="in call order from block 0"):
            plan_minibatch(layers, sample, mode="mfg", workers=2, blocks=blocks)
    with pytest.raises(ValueError, match="minibatch mode"):
        plan_minibatch(layers, sample, mode="full", workers=2)
    with pytest.raises(ValueError, match="at least one batch"):
        BlockSample((), 4)


def test_a_worker_error_stops_every_thread_and_is_raised():
    def work(rank, comm):
        comm.agree(None)
        if rank == 1:
            raise SamplingError("worker 1's own problem")
        comm.all_gather([rank])  # the peers wait here for worker 1, which has stopped
    with pytest.raises(SamplingError, match="worker 1's own problem"):
        run_threads(3, work)


def test_sarc_compile_plans_mfg_and_sampling_on_sampled_blocks(tmp_path, capsys):
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent.parent
    parts = tmp_path / "parts"
    assert main(["partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                 "--out", str(parts)]) == 0
    capsys.readouterr()
    for mode, extra in (("mfg", []), ("sampling", ["--fanouts", "5,10"])):
        out = tmp_path / mode
        assert main(["compile", str(root / "models" / "sage.py"), "--mode", mode,
                     "--partition", str(parts), "--batch-size", "32", "--batches", "3",
                     *extra, "--emit", "plan", "--out", str(out)]) == 0
        text = capsys.readouterr().out
        assert "blocks / worker (mean / max)" in text and "bytes sent / worker / step" in text
        plan = json.loads((out / "plan.json").read_text())
        mb = plan["minibatch"]
        assert mb["batch_size"] == 32 and mb["sample"]["batches"] == 3
        assert mb["fanouts"] == (None if mode == "mfg" else [5, 10])
        for k, layer in enumerate(plan["layers"]):
            blocks = layer["batches"]["blocks"]
            assert 0 < blocks["dst"]["mean"] <= blocks["src"]["mean"]
            assert layer["batches"]["fanout"] == (None if mode == "mfg" else [5, 10][k])
            assert layer["batches"]["bytes_sent_per_step"]["max"] > 0
        top = plan["layers"][-1]["batches"]["blocks"]["dst"]["max"]
        assert top <= 32  # the top layer's destinations are a worker's seeds
    # without a partition the block sizes stay symbols
    assert main(["compile", str(root / "models" / "sage.py"), "--mode", "sampling",
                 "--workers", "2", "--fanouts", "5,10", "--emit", "plan",
                 "--out", str(tmp_path / "sym")]) == 0
    assert "symbolic" in capsys.readouterr().out
    plan = json.loads((tmp_path / "sym" / "plan.json").read_text())
    assert plan["minibatch"]["sample"] is None and plan["minibatch"]["fanouts"] == [5, 10]
    assert plan["layers"][0]["bytes_sent_per_worker"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_layers_sharing_a_block_are_each_priced_on_it(kind):
    """A HeteroConv's relations' layers run on their conv's block (``blocks``): each is
    planned for that block's largest figures and priced on each batch's, as if alone."""
    layers = _layers(kind)
    small = ShardStats(2, (5, 6), (9, 12), ((0, 2), (3, 0)), (3, 2))
    large = ShardStats(2, (7, 6), (14, 10), ((0, 4), (1, 0)), (4, 3))
    sample = BlockSample(((small,), (large,)), 4)
    plan = plan_minibatch(layers, sample, mode="mfg", workers=2, blocks=[0, 0],
                          needs=[True, True])
    top = ShardStats.elementwise_max([small, large])
    for (name, fn), lp in zip(layers, plan.layers):
        alone = plan_layer(name, fn, mode="mfg", workers=2, stats=top)
        assert lp.exec_mode == alone.exec_mode and lp.exchange == alone.exchange
        fixed = None if alone.exec_mode == "local" else alone.exec_mode
        each = [plan_layer(name, fn, mode="mfg", workers=2, stats=st, exec_mode=fixed,
                           kept_peers=alone.kept_peers) for st in (small, large)]
        assert lp.batches.bytes_sent == tuple(b.bytes_sent for b in each)
        assert lp.batches.bytes_kept == tuple(b.bytes_kept for b in each)
        assert lp.bytes_sent == tuple(map(max, zip(*(b.bytes_sent for b in each))))
        assert any(s > 0 for s in lp.bytes_sent)
