"""The exchange layer's byte counters equal the planner's prediction (``LayerPlan.bytes_sent``).

Every byte a worker sends or receives passes through ``sarc.distributed.exchange.ByteCounter``;
for one training step (forward and backward of every layer) the count of each worker
must be what the planner predicted for it, in every execution mode (sar re-fetches
rows in the backward pass, oneshot keeps them, hybrid keeps some peers' rows, the
baseline sends the raw input and runs a normalizer pass, an unfused edge_softmax runs
two passes each way).
"""
from __future__ import annotations

import pytest

from .conftest import _cases
from .harness import gather


@pytest.mark.parametrize("name", [c.name for c in _cases() if c.parts > 1])
def test_bytes_sent_equal_the_plan(dist_results, name):
    cases, _, out = dist_results
    ranks = gather(out, cases[name])["ranks"]
    sent = [r["counted"]["total_sent"] for r in ranks]
    assert sent == [r["planned"] for r in ranks]
    assert all(s > 0 for s in sent)
    # what was sent was received: nothing lost, nothing padded
    assert sum(sent) == sum(r["counted"]["total_received"] for r in ranks)


def test_sar_sends_more_than_oneshot_and_rows_cross_once_per_round(dist_results):
    cases, _, out = dist_results
    total = {name: sum(r["counted"]["total_sent"] for r in gather(out, cases[name])["ranks"])
             for name in ("gcn_p3_sar", "gcn_p3_hybrid", "gcn_p3_oneshot")}
    assert total["gcn_p3_oneshot"] < total["gcn_p3_hybrid"] < total["gcn_p3_sar"]
    # oneshot: rows once forward, gradients once back; sar: rows again in backward
    ranks = gather(out, cases["gcn_p3_oneshot"])["ranks"]
    for r in ranks:
        assert r["counted"]["sent"]["forward"] > 0 and r["counted"]["sent"]["backward"] > 0


@pytest.mark.parametrize("name", [c.name for c in _cases()])
def test_a_step_leaves_no_layer_call_alive(dist_results, name):
    """Once the step's graph is gone, every layer call (its saved aggregates, kept rows,
    row buffers) is freed by reference counting, not left in a cycle for the collector:
    otherwise each epoch's saved tensors pile onto the next one's peak."""
    cases, _, out = dist_results
    assert [r["calls_alive"] for r in gather(out, cases[name])["ranks"]] == [0] * cases[name].parts
