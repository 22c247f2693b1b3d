"""Link prediction on one process: the edge split, the ranks behind MRR and Hits@K (on
hand-built examples), and ``sarc train --task link`` on Cora beating a random scorer."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from sarc.graph import Graph
from sarc.sampling.negative import eval_negatives, negative_sampler
from sarc.training.link import LinkSteps, link_line, rank_sums, ranks, split_edges
from sarc.training.loop import ONE_PROCESS, Batch
from timeouts import run_or_show_stacks

ROOT = Path(__file__).resolve().parents[2]


def test_split_keeps_both_directions_together_and_out_of_the_message_graph():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 50, (400,), generator=gen), torch.randint(0, 50, (400,), generator=gen)
    split = split_edges(torch.cat([src, dst]), torch.cat([dst, src]), 50, seed=2)
    keys = {s: {(int(u), int(v)) for u, v in split.pairs(s).T} for s in ("train", "val", "test")}
    every = {(min(a, b), max(a, b)) for a, b in zip(src.tolist(), dst.tolist()) if a != b}
    assert keys["train"] | keys["val"] | keys["test"] == every
    assert not keys["train"] & keys["val"] and not keys["train"] & keys["test"]
    assert not keys["val"] & keys["test"]
    assert len(keys["val"]) == round(0.05 * len(every)) and len(keys["test"]) == round(0.1 * len(every))
    assert all(u < v for s in keys.values() for u, v in s)
    msrc, mdst = split.message_edges()
    message = set(zip(msrc.tolist(), mdst.tolist()))
    assert message == keys["train"] | {(v, u) for u, v in keys["train"]}
    assert torch.equal(split.degree(), torch.bincount(msrc, minlength=50))
    again = split_edges(torch.cat([src, dst]), torch.cat([dst, src]), 50, seed=2)
    assert torch.equal(again.test, split.test)
    assert not torch.equal(split_edges(src, dst, 50, seed=3).test, split.test)


def test_ranks_count_ties_half():
    pos = torch.tensor([3.0, 1.0, 0.5])
    neg = torch.tensor([[1.0, 2.0, 4.0], [1.0, 1.0, 0.0], [0.5, 0.5, 0.7]])
    r = ranks(pos, neg)
    assert r.tolist() == [2.0, 2.0, 3.0]
    mrr, hits1, hits2 = rank_sums(r, (1, 2))
    assert mrr == pytest.approx(0.5 + 0.5 + 1 / 3) and (hits1, hits2) == (0, 2)


class Fixed(nn.Module):
    """Embeddings set by hand, scored by a dot product."""

    def __init__(self, h: torch.Tensor):
        super().__init__()
        self.h = nn.Parameter(h)

    def forward(self, g, x):
        return self.h

    def score(self, h_u, h_v):
        return (h_u * h_v).sum(-1)


def test_evaluation_is_the_brute_force_mrr_and_hits():
    n = 120
    gen = torch.Generator().manual_seed(5)
    src, dst = torch.randint(0, n, (600,), generator=gen), torch.randint(0, n, (600,), generator=gen)
    split = split_edges(src, dst, n, seed=1)
    model = Fixed(torch.randn(n, 4, generator=gen))
    sampler = negative_sampler("uniform", n)
    hp = {"negatives_per_edge": 1, "eval_negatives": 110}
    mine = {s: torch.arange(split.pairs(s).shape[1]) for s in ("train", "val", "test")}
    empty = torch.zeros(0, dtype=torch.int64)
    g = Graph.from_edges(*split.message_edges(), n)
    source = LinkSteps(Batch(g, torch.zeros(n, 1), {}, empty, {}, train_total=0), split,
                       row_of=torch.arange(n), mine=mine, rows=lambda h, i: h[i],
                       sampler=sampler, hparams=hp, seed=7)
    with torch.no_grad():
        got, _ = source.evaluate(model, ONE_PROCESS)
    h = model.h.detach()
    for i, s in enumerate(("val", "test")):
        negs = eval_negatives(sampler, mine[s], 110, seed=7, split=i)
        rr, hits = [], {10: 0, 50: 0, 100: 0}
        for e, (u, v) in enumerate(split.pairs(s).T.tolist()):
            pos = float(h[u] @ h[v])
            scores = [float(h[u] @ h[w]) for w in negs[e].tolist()]
            rank = 1 + sum(x > pos for x in scores) + 0.5 * sum(x == pos for x in scores)
            rr.append(1 / rank)
            for k in hits:
                hits[k] += rank <= k
        m = len(rr)
        assert got[f"{s}_mrr"] == pytest.approx(sum(rr) / m, rel=1e-6)
        for k in hits:
            assert got[f"{s}_hits@{k}"] == pytest.approx(hits[k] / m)
        assert 0 < got[f"{s}_hits@10"] < got[f"{s}_hits@100"] < 1


def test_a_hits_at_k_past_the_negatives_is_not_measured():
    """With k negatives a pair ranks at most k + 1, so Hits@K for K > k is 1 whatever the
    model: it is NaN (JSON null) and left out of the lines, never a 1.0 that looks good."""
    n = 40
    gen = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, n, (200,), generator=gen), torch.randint(0, n, (200,), generator=gen)
    split = split_edges(src, dst, n, seed=1)
    mine = {s: torch.arange(split.pairs(s).shape[1]) for s in ("train", "val", "test")}
    g = Graph.from_edges(*split.message_edges(), n)
    empty = torch.zeros(0, dtype=torch.int64)
    source = LinkSteps(Batch(g, torch.zeros(n, 1), {}, empty, {}, train_total=0), split,
                       row_of=torch.arange(n), mine=mine, rows=lambda h, i: h[i],
                       sampler=negative_sampler("uniform", n),
                       hparams={"negatives_per_edge": 1, "eval_negatives": 30}, seed=7)
    with torch.no_grad():
        got, _ = source.evaluate(Fixed(torch.randn(n, 4, generator=gen)), ONE_PROCESS)
    for s in ("val", "test"):
        assert 0 < got[f"{s}_hits@10"] < 1, got
        assert math.isnan(got[f"{s}_hits@50"]) and math.isnan(got[f"{s}_hits@100"]), got
    line = link_line(1, 0.5, got, 0.01)
    assert "hits@10 " in line and "hits@50" not in line and "hits@100" not in line, line


def test_cli_on_cora_beats_a_random_scorer(tmp_path):
    out = tmp_path / "r.json"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", "models/sage_lp.py",
                               "--task", "link", "--epochs", "5", "--set", "eval_negatives=100",
                               "--negatives", "degree", "--json", out], cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test mrr" in proc.stdout and "hits@10" in proc.stdout
    r = json.loads(out.read_text())
    assert r["task"] == "link" and r["negatives"] == "degree" and r["epochs"] == 5
    # a random scorer ranks a held-out edge uniformly among 101: Hits@K = K / 101, MRR ~ 0.05
    assert r["test_hits@10"] > 3 * 10 / 101
    assert r["test_hits@50"] > 1.4 * 50 / 101
    assert r["test_mrr"] > 0.15
