"""The cost model and the planner: formulas, choices, budgets, rounds, golden plans."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sympy
import torch

from gat import GATLayer
from gcn import GCNLayer
from gin import GINLayer
from rgcn import RGCNLayer
from sage import SAGELayer
from sarc.compiler import UNFUSED, optimize
from sarc.ir.types import E, N_DST, N_SRC
from sarc.planner.cost import B, exchange_candidates, saved_for_backward
from sarc.planner.plan import format_plan, plan_layer, plan_model
from sarc.planner.stats import BlockSample, ShardStats

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "plan"


def _stats_ring(p: int, rows: int = 10, nodes: int = 100, edges: int = 400) -> ShardStats:
    """Every worker reads `rows` rows from every other worker."""
    bnd = tuple(tuple(0 if i == j else rows for j in range(p)) for i in range(p))
    return ShardStats(p, (nodes,) * p, (edges,) * p, bnd)


def test_from_assignment_counts_each_boundary_row_once():
    # 0,1 on part 0; 2,3 on part 1. Edges 2->0, 2->1 (row 2 needed once by part 0), 3->0, 0->2
    src = torch.tensor([2, 2, 3, 0])
    dst = torch.tensor([0, 1, 0, 2])
    st = ShardStats.from_assignment(src, dst, torch.tensor([0, 0, 1, 1]), 2)
    assert st.boundary == ((0, 2), (1, 0))
    assert st.nodes == (2, 2) and st.edges == (3, 1)


def test_gcn_exchanges_the_narrow_projection_not_the_input():
    fn = optimize(GCNLayer(1433, 16).trace())
    cands = exchange_candidates(fn)
    assert [c.width for c in cands] == [16, 1434]  # W h (16) vs h + out_degree (1433 + 1)
    lp = plan_layer("conv1", fn, workers=2, stats=_stats_ring(2))
    assert lp.exchange.width == 16 and lp.exchange.needs_grad


def test_wide_output_layer_exchanges_the_input():
    """When a layer widens (in < out), sending h and projecting after receipt is narrower."""
    fn = optimize(GCNLayer(8, 64).trace())
    lp = plan_layer("c", fn, workers=2, stats=_stats_ring(2))
    assert lp.exchange.width == 9  # h[8] + out_degree
    assert lp.exchange.recompute  # the receiver recomputes W h on the rows it got


def test_first_layer_input_sends_no_gradient_back():
    fn = optimize(GCNLayer(8, 64).trace())
    lp = plan_layer("c", fn, workers=2, stats=_stats_ring(2), inputs_need_grad=False)
    assert not lp.exchange.needs_grad


def test_bytes_sent_formulas_sar_oneshot_baseline():
    fn = optimize(GCNLayer(32, 16).trace())
    st = _stats_ring(3, rows=10)
    rb = 16 * 4
    sar = plan_layer("c", fn, workers=3, stats=st, exec_mode="sar")
    one = plan_layer("c", fn, workers=3, stats=st, exec_mode="oneshot")
    # each worker sends 2 peers x 10 rows forward, again in backward (sar), and gradients of
    # the 20 rows it received
    assert sar.bytes_sent == (rb * (20 + 20 + 20),) * 3
    assert one.bytes_sent == (rb * (20 + 20),) * 3
    assert sympy.simplify(sar.bytes_sent_expr - 3 * rb * B) == 0
    base = plan_layer("c", fn, workers=3, stats=st, exec_mode="sar", baseline=True)
    assert base.exchange.width == 33 and base.bytes_sent[0] > sar.bytes_sent[0]


def test_attention_baseline_fetches_twice_online_softmax_once():
    fn = optimize(GATLayer(16, 8, heads=2).trace())
    assert plan_layer("g", fn, workers=2, stats=_stats_ring(2)).fetch_passes == 1
    assert plan_layer("g", fn, workers=2, stats=_stats_ring(2), baseline=True).fetch_passes == 2


def test_memory_budget_picks_oneshot_hybrid_or_sar():
    fn = optimize(GCNLayer(32, 16).trace())
    st = _stats_ring(3, rows=10)
    local = plan_layer("c", fn, workers=3, stats=st, exec_mode="sar").bytes_kept[0]
    row = 16 * 4
    assert plan_layer("c", fn, workers=3, stats=st, mem_budget=10**9).exec_mode == "oneshot"
    hy = plan_layer("c", fn, workers=3, stats=st, mem_budget=local + 10 * row)
    assert hy.exec_mode == "hybrid" and all(len(k) == 1 for k in hy.kept_peers)
    assert all(k <= local + 10 * row for k in hy.bytes_kept)
    assert plan_layer("c", fn, workers=3, stats=st, mem_budget=local).exec_mode == "sar"


def test_rounds_never_send_two_workers_to_one_peer():
    plan = plan_model([("c", optimize(GCNLayer(4, 4).trace()))], workers=5, stats=_stats_ring(5))
    assert len(plan.rounds) == 4
    for rnd in plan.rounds:
        targets = [to for _, to, _ in rnd]
        assert sorted(targets) == list(range(5))
        for r, to, frm in rnd:
            assert to != r and frm != r
            assert (frm, r) in {(w, t) for w, t, _ in rnd}


def test_fusion_removes_edge_tensors_kept_for_backward():
    for layer in (GCNLayer(32, 16), SAGELayer(32, 16), GATLayer(32, 8, heads=4)):
        fn = layer.trace()
        before = saved_for_backward(optimize(fn, UNFUSED))["edge"]
        after = saved_for_backward(optimize(fn))["edge"]
        sizes = {E: 10**6, N_SRC: 10**4, N_DST: 10**4}
        assert after.subs(sizes) < before.subs(sizes) or before.subs(sizes) == 0


def test_plan_rejects_mismatched_workers_and_unknown_modes():
    fn = optimize(GCNLayer(4, 4).trace())
    with pytest.raises(ValueError, match="2 parts but 3 workers"):
        plan_layer("c", fn, workers=3, stats=_stats_ring(2))
    with pytest.raises(ValueError, match="unknown mode"):
        plan_layer("c", fn, mode="bogus")
    with pytest.raises(ValueError, match="unknown execution mode"):
        plan_layer("c", fn, exec_mode="bogus")


MODELS = {
    "gcn": lambda: [("conv1", GCNLayer(1433, 16)), ("conv2", GCNLayer(16, 7))],
    "sage": lambda: [("conv1", SAGELayer(1433, 64)), ("conv2", SAGELayer(64, 7))],
    "gat": lambda: [("conv1", GATLayer(1433, 8, heads=8)), ("conv2", GATLayer(64, 7, heads=1))],
    "gin": lambda: [("conv1", GINLayer(1433, 64, 64)), ("conv2", GINLayer(64, 64, 7))],
    "rgcn": lambda: [("conv1", RGCNLayer(16, 16, 90, num_bases=30)), ("conv2", RGCNLayer(16, 4, 90, num_bases=30))],
}


def _block_sample(p: int, fanouts) -> BlockSample:
    """Two batches of a two-layer step on ``p`` workers: 64 seeds per worker at the top,
    the input layer's blocks wider; the second batch's blocks a little larger on worker 0."""
    def layer(dst, src, edges, rows, extra):
        bnd = tuple(tuple(0 if i == j else rows + (extra if i == 0 else 0) for j in range(p))
                    for i in range(p))
        return ShardStats(p, tuple(src + (extra if r == 0 else 0) for r in range(p)),
                          (edges,) * p, bnd, (dst,) * p)
    batches = tuple((layer(300, 900, 3000, 120, extra), layer(64, 300, 640, 40, extra))
                    for extra in (0, 7))
    return BlockSample(batches, 64, None if fanouts is None else tuple(fanouts))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("mode", ["full", "mfg", "sampling"])
def test_golden_plan(name, mode):
    layers = [(n, optimize(l.trace())) for n, l in MODELS[name]()]
    if mode == "full":
        plan = plan_model(layers, mode=mode, workers=4,
                          stats=_stats_ring(4, rows=50, nodes=677, edges=3316))
    else:
        plan = plan_model(layers, mode=mode, workers=4,
                          sample=_block_sample(4, [10, 25] if mode == "sampling" else None))
    text = format_plan(plan) + "\n" + plan.dumps()
    path = GOLDEN / f"{name}.{mode}.plan"
    if os.environ.get("SARC_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden plan {path}; run with SARC_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"the plan of {name} ({mode}) changed; review and rerun with SARC_UPDATE_GOLDEN=1"
    json.loads(plan.dumps())  # the JSON form parses
