"""Link prediction on P workers equals one process, P in {1, 2, 3}.

A small random graph is split (``split_edges``), its message graph partitioned, and
each worker runs 3 training steps of ``LinkSteps`` (models/sage_lp.py, MLP scorer,
dropout off, degree-based negatives, 2 per edge) with the endpoint rows pulled from
their owners (``pull_rows``). The loss of every step, every parameter gradient after
the all-reduce, the final weights, each worker's negatives and the evaluation's MRR
and Hits@K equal the one-process run (rtol 1e-5).
"""
from __future__ import annotations

import datetime
import io
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sarc.datasets import Dataset
from sarc.distributed.graph import DistGraph
from sarc.distributed.link import link_source
from sarc.distributed.prepare import prepare_worker
from sarc.distributed.train import AllReduce, _build, broadcast_parameters
from sarc.loader import load_model_file
from sarc.partition import load_partitions, partition_graph
from sarc.runtime.sharded import ShardedGraph
from sarc.sampling import Comm
from sarc.sampling.negative import negative_sampler, train_negatives
from sarc.train import build, hyperparameters
from sarc.training.link import LinkSteps, split_edges
from sarc.training.loop import ONE_PROCESS, Batch
from sarc.training.optim import EagerAdam

from .harness import spawn

ROOT = Path(__file__).resolve().parents[2]
N, FEATS, STEPS, SEED = 40, 6, 3, 3
HP = {"dropout": 0.0, "hidden": 8, "out": 8, "scorer": "mlp", "negatives": "degree",
      "negatives_per_edge": 2, "eval_negatives": 12, "lr": 0.05}


def _graph():
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(0, N, (150,), generator=gen)
    dst = torch.randint(0, N, (150,), generator=gen)
    feat = torch.rand(N, FEATS, generator=gen)
    return torch.cat([src, dst]), torch.cat([dst, src]), feat


def _setup():
    spec = load_model_file(ROOT / "models" / "sage_lp.py")
    return spec, hyperparameters(spec, HP)


def _record(model, source, opt, reduction):
    out = {"losses": [], "grads": [], "negatives": []}
    for epoch in range(1, STEPS + 1):
        out["losses"].append(source.train_step(model, opt, type("S", (), {"epoch": epoch}),
                                               reduction))
        out["grads"].append({k: p.grad.clone() for k, p in model.named_parameters()})
        neg = train_negatives(source.sampler, source.mine["train"], source.k_train, seed=SEED,
                              epoch=epoch)
        out["negatives"].append(dict(zip(source.mine["train"].tolist(), neg.tolist())))
    model.eval()
    with torch.no_grad():
        out["metrics"] = source.evaluate(model, reduction)[0]
    out["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def _one_process():
    spec, hp = _setup()
    src, dst, feat = _graph()
    split = split_edges(src, dst, N, seed=SEED)
    from sarc.graph import Graph
    from sarc.training.inputs import node_features
    g = Graph.from_edges(*split.message_edges(), N)
    stub = Dataset("g", N, src, dst, feat, torch.zeros(N, dtype=torch.int64),
                   torch.ones(N, dtype=torch.bool), torch.zeros(N, dtype=torch.bool),
                   torch.zeros(N, dtype=torch.bool), 2)
    torch.manual_seed(SEED)
    model = build(spec, stub, hp)
    opt = EagerAdam(model.parameters(), lr=hp["lr"])
    mine = {s: torch.arange(split.pairs(s).shape[1]) for s in ("train", "val", "test")}
    empty = torch.zeros(0, dtype=torch.int64)
    source = LinkSteps(Batch(g, node_features(feat, hp), {}, empty, {}, train_total=0), split,
                       row_of=torch.arange(N), mine=mine, rows=lambda h, i: h.index_select(0, i),
                       sampler=negative_sampler("degree", N, split.degree()), hparams=hp,
                       seed=SEED)
    return _record(model, source, opt, ONE_PROCESS)


def _worker(rank, port, q, p, partition):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=p, timeout=datetime.timedelta(seconds=60))
    spec, hp = _setup()
    src, dst, _ = _graph()
    split = split_edges(src, dst, N, seed=SEED)
    shard = ShardedGraph.from_partitions(load_partitions(partition), rank)
    dg = DistGraph(shard, None)
    data = prepare_worker(shard, hp, None)
    torch.manual_seed(SEED)
    model = _build(spec, data, hp, N, name="the test graph")
    broadcast_parameters(model, None)
    opt = EagerAdam(model.parameters(), lr=hp["lr"])
    source = link_source(shard, dg, data, split, hp, SEED,
                         Comm(timeout=datetime.timedelta(seconds=60)), None)
    buf = io.BytesIO()  # bytes, not tensors: those would be shared memory of an ended process
    torch.save(_record(model, source, opt, AllReduce(None)), buf)
    q.put((rank, buf.getvalue()))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reference():
    return _one_process()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_p_workers_equal_one_process(reference, tmp_path, p):
    src, dst, feat = _graph()
    split = split_edges(src, dst, N, seed=SEED)
    msrc, mdst = split.message_edges()
    node_data = {"feat": feat, "label": torch.zeros(N, dtype=torch.int64),
                 "train_mask": torch.ones(N, dtype=torch.bool),
                 "val_mask": torch.zeros(N, dtype=torch.bool),
                 "test_mask": torch.zeros(N, dtype=torch.bool)}
    partition_graph(msrc, mdst, N, p, tmp_path / "parts", method="random", node_data=node_data,
                    seed=1)
    codes, reports = spawn(_worker, p, (p, str(tmp_path / "parts")), timeout_s=120)
    assert codes == [0] * p, codes
    reports = [torch.load(io.BytesIO(r), weights_only=False) for r in reports]
    want = reference
    for got in reports:
        for a, b in zip(got["losses"], want["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b)
        for step in range(STEPS):
            for k, g in want["grads"][step].items():
                assert _close(got["grads"][step][k], g), (p, step, k)
        for k, w in want["weights"].items():
            assert _close(got["weights"][k], w), (p, k)
        for k, v in want["metrics"].items():
            assert v == pytest.approx(got["metrics"][k], rel=1e-5, nan_ok=True), k
    for step in range(STEPS):  # the workers' pairs cover every training pair once, same negatives
        merged = {}
        for got in reports:
            assert not set(merged) & set(got["negatives"][step])
            merged.update(got["negatives"][step])
        assert merged == want["negatives"][step]
    assert want["losses"][0] != want["losses"][-1]  # the steps trained
    assert any(float(g.abs().sum()) > 0 for g in want["grads"][0].values())


def test_cli_on_two_workers_reports_the_one_process_result(tmp_path):
    """``sarc train --task link --workers 2`` (split, partition, the split beside the parts,
    the workers' dispatch) reports the metrics of the one-process run; on an ``.npz`` file
    whose arrays' ``name`` is not its file's (a copy of Cora), which the partition records
    by its path, as a node task's does."""
    import json
    import shutil
    import sys

    from timeouts import run_or_show_stacks

    data = tmp_path / "my copy.npz"
    shutil.copy(ROOT / "sarc" / "data" / "cora.npz", data)

    def run(*extra):
        out = tmp_path / f"r{len(extra)}.json"
        proc = run_or_show_stacks(
            [sys.executable, "-m", "sarc.cli", "train", "models/sage_lp.py", "--task", "link",
             "--dataset", data, "--epochs", "2", "--set", "eval_negatives=50",
             "--negatives", "degree", "--json", out, *extra], cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text()), proc.stdout

    one, _ = run()
    two, stdout = run("--workers", "2")
    assert "link prediction" in stdout and "2 workers" in stdout
    assert two["workers"] == 2 and one["workers"] == 1
    for k in ("val_mrr", "test_mrr", "test_hits@10", "test_hits@50", "final_loss"):
        assert two[k] == pytest.approx(one[k], rel=1e-5), k
