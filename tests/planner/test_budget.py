"""The memory budget is the whole step's: the layers of a model share it.

Per worker, the bytes every layer keeps for backward, summed over the layers,
stay within ``--mem-budget`` whenever what the layers keep of the worker's own
shard does; a layer planned alone would take the whole budget for itself (as it
did when the budget was per layer). More budget never sends more bytes; the plan
says what each layer keeps and the step's total, and says when the budget is
below what the shards' own share needs.
"""
from __future__ import annotations

import random

import pytest
from gat import GATLayer
from gcn import GCNLayer
from sage import SAGELayer

from sarc.compiler import optimize
from sarc.planner.plan import (fetch_within, format_plan, plan_fetch, plan_layer, plan_model,
                               share_budget, share_step)
from sarc.planner.stats import ShardStats


def _stats(p: int, seed: int) -> ShardStats:
    rnd = random.Random(seed)
    bnd = tuple(tuple(0 if i == j else rnd.choice([0, 5, 20, 60, 200]) for j in range(p))
                for i in range(p))
    nodes = tuple(rnd.randint(200, 400) for _ in range(p))
    return ShardStats(p, nodes, tuple(4 * n for n in nodes), bnd)


def _model():
    return [("conv1", optimize(GCNLayer(32, 16).trace())),
            ("conv2", optimize(GATLayer(16, 8, heads=2).trace())),
            ("conv3", optimize(SAGELayer(16, 5).trace()))]


def _local(layers, stats) -> list[int]:
    plans = [plan_layer(n, fn, workers=stats.num_parts, stats=stats, exec_mode="sar",
                        inputs_need_grad=k > 0) for k, (n, fn) in enumerate(layers)]
    return [sum(lp.bytes_kept[r] for lp in plans) for r in range(stats.num_parts)]


@pytest.mark.parametrize("seed", range(6))
def test_the_step_fits_the_budget_and_more_budget_sends_less(seed):
    p = 4
    stats, layers = _stats(p, seed), _model()
    floor = max(_local(layers, stats))
    sent_before = None
    for extra in (0, 1_000, 5_000, 20_000, 80_000, 10**9):
        budget = floor + extra
        plan = plan_model(layers, workers=p, stats=stats, mem_budget=budget)
        assert plan.over_budget() == []
        assert max(plan.step_bytes_kept()) <= budget
        sent = sum(plan.total_bytes_sent())
        assert sent_before is None or sent <= sent_before
        sent_before = sent
    assert all(lp.exec_mode == "oneshot" for lp in plan.layers)  # room for everything


def test_a_layer_alone_would_take_the_budget_the_step_shares():
    p = 4
    stats, layers = _stats(p, 3), _model()
    budget = max(_local(layers, stats)) + 30_000
    alone = [plan_layer(n, fn, workers=p, stats=stats, mem_budget=budget, inputs_need_grad=k > 0)
             for k, (n, fn) in enumerate(layers)]
    assert any(sum(lp.bytes_kept[r] for lp in alone) > budget for r in range(p))
    plan = plan_model(layers, workers=p, stats=stats, mem_budget=budget)
    assert max(plan.step_bytes_kept()) <= budget
    assert {lp.exec_mode for lp in plan.layers} & {"hybrid", "oneshot"}  # some rows kept


def test_the_rows_that_save_most_transfers_are_kept_first():
    """A layer with a normalizer pass (unfused edge_softmax: two forward fetches, two
    backward passes) saves more re-fetches per kept row than a GCN layer."""
    p = 2
    stats = ShardStats(p, (100, 100), (400, 400), ((0, 10), (10, 0)))
    gcn = optimize(GCNLayer(16, 16).trace())
    gat = optimize(GATLayer(16, 8, heads=2, attn_drop=0.5).trace())
    local = [plan_layer("x", fn, workers=p, stats=stats, exec_mode="sar").bytes_kept
             for fn in (gcn, gat)]
    row = max(plan_layer("x", fn, workers=p, stats=stats).exchange.row_bytes for fn in (gcn, gat))
    budget = max(a + b for a, b in zip(*local)) + 10 * row  # room for one layer's remote rows
    kept = share_budget([(gcn, True), (gat, True)], stats, budget)
    assert kept[1] == ((1,), (0,)) and kept[0] == ((), ())


def test_the_plan_says_the_step_total_and_when_the_budget_is_too_small():
    p = 3
    stats, layers = _stats(p, 2), _model()
    ok = format_plan(plan_model(layers, workers=p, stats=stats,
                                mem_budget=max(_local(layers, stats)) + 10_000))
    assert "step: bytes kept / worker (all layers): max" in ok and "of the budget" in ok
    assert "over the budget" not in ok
    tight = plan_model(layers, workers=p, stats=stats, mem_budget=1000)
    assert tight.over_budget() == list(range(p))
    assert all(lp.exec_mode == "sar" for lp in tight.layers)
    assert "over the budget on workers [0, 1, 2]" in format_plan(tight)


@pytest.mark.parametrize("seed", range(6))
def test_fetches_are_made_once_where_they_fit_with_the_others_share(seed):
    """Under a budget a HeteroConv's fetched rows and its relations' layers' own shares
    come first (``fetch_within``): where they fit, the layers that are no relation's share
    what is left, and the whole step (fetch, relations, the others with their kept peers)
    stays within the budget on every worker; where they do not, none is fetched once."""
    p = 4
    stats, layers = _stats(p, seed), _model()
    fns = [(fn, k > 0) for k, (_, fn) in enumerate(layers)]
    on_halo = [False, True, True]   # conv2 and conv3: a conv's relations
    fetch = plan_fetch("conv.input0", ["input0[16]"], 16, 4, True, workers=p, stats=stats)
    local = _local(layers, stats)
    relations = [plan_layer(n, fn, workers=p, stats=stats, exec_mode="sar", inputs_need_grad=True)
                 for n, fn in layers[1:]]
    need = [fetch.bytes_kept[r] + sum(lp.bytes_kept[r] for lp in relations) for r in range(p)]
    floor = max(need[r] + local[r] - sum(lp.bytes_kept[r] for lp in relations) for r in range(p))
    assert fetch_within(fns, on_halo, 64, stats, floor - 1) is None
    for extra in (0, 1_000, 20_000, 10**9):
        room = fetch_within(fns, on_halo, 64, stats, floor + extra)
        assert room == floor + extra - max(need)
        kept = share_budget(fns[:1], stats, room)[0]
        first = plan_layer("conv1", fns[0][0], workers=p, stats=stats, inputs_need_grad=False,
                           kept_peers=kept)
        assert all(need[r] + first.bytes_kept[r] <= floor + extra for r in range(p))
        assert share_step(fns, (on_halo, 64), stats, floor + extra) == ([kept, None, None], True)
    # where the fetches do not fit, every layer shares the whole budget
    assert share_step(fns, (on_halo, 64), stats, floor - 1) == (
        share_budget(fns, stats, floor - 1), False)
