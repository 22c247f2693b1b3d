"""A memory budget in a mini-batch mode is the whole step's, on every step.

The first step's blocks share the budget over the layers (``BlockGraphs``); a later
step whose blocks are larger would keep more under that plan, so it runs in sar
instead. Checked on 3 gloo workers sampling a small graph: with the budget set to what
the first step keeps when every remote row is kept,

- every step's kept bytes (the programs that ran, priced on that step's blocks) stay
  within the budget on every worker;
- some later step exceeds the first step's plan (so the fallback is exercised) and ran
  in sar;
- the losses are those of the run without a budget (kept or re-fetched rows change the
  traffic, never the result);
- each epoch's bytes, as the exchanges count them, are the planner's prediction for its
  steps, each priced on its own blocks with the programs it ran (``planned_bytes_sent``).
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from sarc.compiler import compile_layer
from sarc.planner.plan import step_kept_bytes
from sarc.planner.stats import ShardStats
from sarc.sampling import Comm
from sarc.training.loop import train_step
from sarc.training.minibatch import MiniBatchConfig, MiniBatchSteps, ShardRows, sarc_layers
from sarc.training.optim import EagerAdam

from .graphs import run_workers, shards, tiny_graph

P = 3
CONFIG = MiniBatchConfig("sampling", (2, 3), batch_size=4)
EPOCHS = (1, 2)
TIMEOUT = datetime.timedelta(seconds=60)


def _model():
    import sage
    torch.manual_seed(1)
    return sage.build_model(5, 3, hidden=6, dropout=0.0)


def _source(shard, group, budget):
    from sarc.distributed.exchange import ByteCounter
    from sarc.distributed.train import BlockGraphs
    nd = shard.ndata
    model = _model()
    counts = torch.tensor([int(nd["train_mask"].sum())])
    dist.all_reduce(counts, group=group)
    counter = ByteCounter()
    blocks = BlockGraphs(group, CONFIG.mode, torch.device("cpu"), layers=sarc_layers(model),
                         mem_budget=budget, timeout=TIMEOUT, counter=counter)
    src = MiniBatchSteps(shard, CONFIG, layers=2, seed=5, comm=Comm(group), prefetch=False,
                         rows=ShardRows(nd["feat"], nd["label"], nd["train_mask"]),
                         evaluation=None, counts={"train": int(counts), "val": 0, "test": 0},
                         graphs_of=blocks, counter=counter)
    return model, src, blocks


def _layers(model):
    layers = sarc_layers(model)
    return layers, [(compile_layer(l, through="optimize").optimized, k > 0)
                    for k, l in enumerate(layers)]


def _max(values, group) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _work(rank, group, g):
    shard = shards(g, P)[0][rank]
    # what every step would keep with no remote row kept, and with every one kept
    model, src, _ = _source(shard, group, None)
    _, fns = _layers(model)
    everyone = [tuple(j for j in range(P) if j != r) for r in range(P)]
    own, whole = [], []
    for e in EPOCHS:
        for batch in src.steps(e):
            stats = [ShardStats.of_worker(dg.shard) for dg in batch.graph.graphs]
            own.append(step_kept_bytes(fns, stats, [((),) * P] * len(fns), rank))
            whole.append(step_kept_bytes(fns, stats, [everyone] * len(fns), rank))
    own, whole = _max(own, group), _max(whole, group)
    budget = whole[0]

    runs = {}
    for name, b in (("budgeted", budget), ("free", None)):
        model, src, blocks = _source(shard, group, b)
        layers, fns = _layers(model)
        opt = EagerAdam(model.parameters(), lr=0.05)
        losses, kept, modes, sent = [], [], [], []
        from sarc.distributed.train import AllReduce
        for e in EPOCHS:
            for batch in src.steps(e):
                losses.append(train_step(model, opt, batch, AllReduce(group)))
                dgs = batch.graph.graphs
                progs = [dg.training_programs[id(l)] for dg, l in zip(dgs, layers)]
                kept.append(step_kept_bytes(fns, [ShardStats.of_worker(dg.shard) for dg in dgs],
                                            [p.plan.kept_peers for p in progs], rank))
                modes.append(tuple(p.plan.exec_mode for p in progs))
            h = src.history[-1]
            sent.append((h["bytes_sent"], blocks.planned_bytes_sent(h["steps"])))
        runs[name] = {"losses": losses, "kept": kept, "modes": modes, "sent": sent,
                      "over": blocks.over_budget_steps}
    return {"own": own, "whole": whole, "budget": budget, **runs}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    g = tiny_graph(n=40, e=220, seed=11, isolated=3)
    return run_workers(_work, P, tmp_path_factory.mktemp("budget"), g, timeout_s=240)


def test_a_later_step_larger_than_the_first_runs_in_sar(records):
    whole, budget = records[0]["whole"], records[0]["budget"]
    larger = [s for s, w in enumerate(whole) if s and w > budget]
    assert larger, "no step keeps more than the first when every remote row is kept"
    for rec in records:
        run = rec["budgeted"]
        assert run["over"] >= 1
        assert run["modes"][0] == ("oneshot", "oneshot")  # the first step keeps everything
        assert all(m == ("sar", "sar") for s, m in enumerate(run["modes"]) if s in larger)
        assert rec["free"]["over"] == 0


def test_every_step_keeps_within_the_budget(records):
    for rec in records:
        for s, (kept, own) in enumerate(zip(rec["budgeted"]["kept"], rec["own"])):
            if own <= rec["budget"]:  # the blocks' own share fits: so must the step
                assert kept <= rec["budget"], (s, kept, rec["budget"])


def test_the_budget_changes_the_traffic_not_the_losses(records):
    for rec in records:
        got, want = rec["budgeted"]["losses"], rec["free"]["losses"]
        assert len(got) == len(want) >= 4
        for a, b in zip(got, want):
            assert abs(a - b) <= 1e-5 * max(abs(b), 1e-12)


def test_every_epoch_sends_the_bytes_planned_for_its_steps(records):
    for rec in records:
        for run in ("budgeted", "free"):
            for counted, planned in rec[run]["sent"]:
                assert counted > 0 and counted == planned, (run, counted, planned)
