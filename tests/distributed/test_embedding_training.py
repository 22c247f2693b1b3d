"""A featureless graph trains its learned input as a sharded embedding on P workers, step
for step the single process's run.

GCN on a small synthetic featureless graph (``embedding_dim=8``, dropout off, no
validation nodes, so the last epoch is the one kept): one process trains an
``nn.Embedding(sparse=True)`` with torch's ``SparseAdam`` (or ``Adagrad``), P workers
(``train_worker``, real gloo processes) a ``sarc.distributed.Embedding`` sharded with the
partition and sarc's sparse optimizers. Held equal: every step's loss, the embedding rows
after training (gathered by original id) and the dense weights, full-batch and sampling
mode, P = 2 (and 3 with ``SARC_SLOW_TESTS=1``); each worker holds and reports its own
rows and their optimizer state only; a P-worker run resumed from its checkpoint is the
uninterrupted run bit for bit, and ``--save`` writes the whole table
``sarc.load_trained`` loads; link prediction (``SARC_SLOW_TESTS=1``) reports the
one-process metrics.
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sarc.checkpoint import CheckpointConfig
from sarc.datasets import Dataset
from sarc.training.minibatch import MiniBatchConfig

from .harness import spawn

ROOT = Path(__file__).resolve().parents[2]
GCN = ROOT / "models" / "gcn.py"
N, DIM, CLASSES = 48, 8, 3
HP = {"embedding_dim": DIM, "dropout": 0.0, "hidden": 6, "lr": 0.05, "weight_decay": 0.0}
SAMPLING = MiniBatchConfig("sampling", (3, 4), batch_size=8)
RTOL, ATOL = 1e-4, 1e-6


def _arrays() -> dict:
    gen = torch.Generator().manual_seed(4)
    src = torch.randint(0, N, (240,), generator=gen)
    dst = torch.randint(0, N, (240,), generator=gen)
    keep = src != dst
    r = torch.rand(N, generator=gen)
    return {"edge_src": src[keep], "edge_dst": dst[keep], "num_nodes": N,
            "label": torch.randint(0, CLASSES, (N,), generator=gen), "num_classes": CLASSES,
            "train_mask": r < 0.6, "val_mask": torch.zeros(N, dtype=torch.bool),
            "test_mask": r >= 0.6}


def _dataset() -> Dataset:
    return Dataset.from_arrays(_arrays(), name="featureless")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Partition sets of the graph into 2 and 3 parts (METIS), as ``sarc train`` makes them."""
    from sarc.partition import partition_graph
    data, root, out = _dataset(), tmp_path_factory.mktemp("parts"), {}
    node_data = {"feat": data.feat, "label": data.label, "train_mask": data.train_mask,
                 "val_mask": data.val_mask, "test_mask": data.test_mask}
    for p in (2, 3):
        partition_graph(data.edge_src, data.edge_dst, N, p, root / f"p{p}", node_data=node_data)
        out[p] = str(root / f"p{p}")
    return out


def _recording_losses() -> list:
    """Every training step's loss from here on (the loop's ``train_step``, wrapped)."""
    import sarc.training.loop as loop
    losses, step = [], loop.train_step

    def recorded(*args, **kwargs):
        losses.append(step(*args, **kwargs))
        return losses[-1]
    loop.train_step = recorded
    return losses


def _one_process(rank, port, q, out, epochs, minibatch, hparams):
    # in a child: torch's sparse optimizers in the test process would enter its OpenMP pool,
    # which the workers forked after it can hang in (libgomp is not fork-safe)
    from sarc.loader import load_model_file
    from sarc.train import train
    losses = _recording_losses()
    result = train(load_model_file(GCN), _dataset(), epochs=epochs, hparams=hparams, log=None,
                   minibatch=minibatch)
    torch.save({"losses": losses, "state": result["module"].state_dict()}, Path(out) / "one.pt")
    q.put((rank, "ok"))


def _worker(rank, port, q, p, partition, out, epochs, minibatch, hparams, ckpt=None,
            resume=False, save=None):
    from sarc.distributed.train import WorkerConfig, train_worker
    from sarc.loader import load_model_file
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=p, timeout=datetime.timedelta(seconds=60))
    try:
        losses = _recording_losses()
        cfg = WorkerConfig(partition=partition, epochs=epochs, hparams=hparams, timeout_s=60,
                           minibatch=minibatch, save_path=save,
                           checkpoint=CheckpointConfig(ckpt, 2, resume) if ckpt else None)
        result = train_worker(load_model_file(GCN), cfg, log=None)
        shard = ShardedGraph.from_partitions(load_partitions(partition, verify=False), rank)
        torch.save({"losses": losses, "state": result["module"].state_dict(),
                    "ids": shard.orig_node_ids, "per_worker": result["per_worker"]},
                   Path(out) / f"r{rank}.pt")
        dist.barrier()
        q.put((rank, "ok"))
    finally:
        dist.destroy_process_group()


def _spawned(fn, nprocs: int, tmp: Path, args: tuple) -> list[dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    codes, reports = spawn(fn, nprocs, args, timeout_s=120)
    assert codes == [0] * nprocs and reports == ["ok"] * nprocs, (codes, reports)
    names = ["one.pt"] if fn is _one_process else [f"r{r}.pt" for r in range(nprocs)]
    return [torch.load(tmp / n, weights_only=False) for n in names]


def _one(tmp: Path, epochs: int, minibatch=None, hparams=HP) -> dict:
    return _spawned(_one_process, 1, tmp, (str(tmp), epochs, minibatch, hparams))[0]


def _workers(p: int, partition: str, tmp: Path, epochs: int, minibatch=None, hparams=HP,
             ckpt=None, resume=False, save=None) -> list[dict]:
    return _spawned(_worker, p, tmp, (p, partition, str(tmp), epochs, minibatch, hparams, ckpt,
                                      resume, save))


def _whole_table(ranks: list[dict]) -> torch.Tensor:
    table = torch.full((N, DIM), float("nan"))
    for r in ranks:
        table[r["ids"]] = r["state"]["embedding.weight"]
    return table


def _assert_same_run(ranks: list[dict], one: dict) -> None:
    want_losses = one["losses"]
    assert len(want_losses) >= 3  # several steps
    for r in ranks:
        assert r["losses"] == pytest.approx(want_losses, rel=1e-5)
    table = _whole_table(ranks)
    want = one["state"]["embedding.weight"]
    assert torch.allclose(table, want, rtol=RTOL, atol=ATOL), (table - want).abs().max()
    dense = {k: v for k, v in one["state"].items() if not k.startswith("embedding.")}
    assert dense and set(dense) == {k for k in ranks[0]["state"] if k != "embedding.weight"}
    for r in ranks:
        for k, v in dense.items():
            assert torch.allclose(r["state"][k], v, rtol=RTOL, atol=ATOL), k


ADAGRAD = {**HP, "embedding_optimizer": "sparse_adagrad", "embedding_lr": 0.2}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one")
    return {"full": _one(tmp / "full", 4),
            "sampling": _one(tmp / "sampling", 2, SAMPLING, hparams=ADAGRAD)}


@pytest.fixture(scope="module")
def two_workers(parts, tmp_path_factory):
    """4 full-batch epochs on 2 workers, checkpointed every 2 epochs, the model saved."""
    tmp = tmp_path_factory.mktemp("two")
    ranks = _workers(2, parts[2], tmp / "run", 4, ckpt=str(tmp / "ckpt"),
                     save=str(tmp / "model.pt"))
    return ranks, tmp


def test_full_batch_on_workers_is_the_single_process_run(two_workers, reference):
    ranks, tmp = two_workers
    _assert_same_run(ranks, reference["full"])
    want = reference["full"]["state"]["embedding.weight"]
    assert not torch.equal(want, _initial_table())  # it trained
    # each worker holds its rows and their Adam moments, and reports their bytes
    for rank, r in enumerate(ranks):
        rows = r["ids"].numel()
        assert r["state"]["embedding.weight"].shape == (rows, DIM) and 0 < rows < N
        w = r["per_worker"][rank]
        assert w["embedding_bytes"] == rows * DIM * 4
        assert w["embedding_state_bytes"] == 2 * rows * DIM * 4
    # --save gathers the whole table, in original node order, for sarc.load_trained
    import sarc
    saved = sarc.load_trained(tmp / "model.pt", GCN)
    assert torch.allclose(saved.embedding.weight.detach(), want, rtol=RTOL, atol=ATOL)


def test_sampling_with_sparse_adagrad_on_workers_is_the_single_process_run(parts, reference,
                                                                          tmp_path):
    ranks = _workers(2, parts[2], tmp_path / "p2", 2, SAMPLING, hparams=ADAGRAD)
    one = reference["sampling"]
    assert len(one["losses"]) > 2  # several steps an epoch
    _assert_same_run(ranks, one)


@pytest.mark.skipif(not os.environ.get("SARC_SLOW_TESTS"),
                    reason="another ~20 s of workers; set SARC_SLOW_TESTS=1")
def test_three_workers(parts, reference, tmp_path):
    _assert_same_run(_workers(3, parts[3], tmp_path / "p3", 4), reference["full"])


def test_resume_from_a_checkpoint_is_the_uninterrupted_run(parts, two_workers, tmp_path):
    whole, tmp = two_workers
    _workers(2, parts[2], tmp_path / "first", 2, ckpt=str(tmp_path / "ckpt"))
    resumed = _workers(2, parts[2], tmp_path / "rest", 4, ckpt=str(tmp_path / "ckpt"),
                       resume=True)
    for a, b in zip(whole, resumed):
        assert b["losses"] == a["losses"][2:]
        for k, v in a["state"].items():
            assert torch.equal(b["state"][k], v), k
    for rank in range(2):  # each worker's checkpoint holds its rows and their state only
        a, b = (torch.load(d / f"epoch-000004.rank-{rank}.pt", weights_only=True)
                for d in (tmp / "ckpt", tmp_path / "ckpt"))
        emb = a["optimizer"]["embedding"]
        rows = whole[rank]["ids"].numel()
        assert emb["steps"] == [4] and all(t.shape == (rows, DIM) for t in emb["state"][0].values())
        for part in ("model", "optimizer"):
            _assert_equal(a[part], b[part])


def _assert_equal(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _assert_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_equal(x, y)
    else:
        assert a == b


def _initial_table() -> torch.Tensor:
    from sarc.training.inputs import EMBEDDING_SCALE, initial_embedding
    return initial_embedding(torch.arange(N), DIM, 0, EMBEDDING_SCALE)


@pytest.mark.skipif(not os.environ.get("SARC_SLOW_TESTS"),
                    reason="two sarc train runs (~45 s); set SARC_SLOW_TESTS=1")
def test_link_prediction_on_two_workers_is_the_single_process_run(tmp_path):
    """``sarc train --task link`` on a featureless graph: the sharded embedding on 2 workers
    reports the one-process metrics; each worker holds its rows."""
    import json
    import sys

    import numpy as np

    from timeouts import run_or_show_stacks
    np.savez(tmp_path / "g.npz", **{k: np.asarray(v) for k, v in _arrays().items()})

    def run(*extra):
        out = tmp_path / f"r{len(extra)}.json"
        proc = run_or_show_stacks(
            [sys.executable, "-m", "sarc.cli", "train", "models/sage_lp.py", "--task", "link",
             "--dataset", tmp_path / "g.npz", "--epochs", "3", "--set", f"embedding_dim={DIM}",
             "--set", "eval_negatives=20", "--set", "dropout=0.0", "--json", out, *extra],
            cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text())

    one, two = run("--threads", "1"), run("--workers", "2")
    for k in ("val_mrr", "test_mrr", "test_hits@10", "final_loss"):
        assert two[k] == pytest.approx(one[k], rel=1e-5), k
    held = [w["embedding_bytes"] for w in two["per_worker"]]
    assert sum(held) == N * DIM * 4 and max(held) < N * DIM * 4


def test_one_process_sparse_adagrad_is_torchs_without_its_warning():
    """The one-process table's Adagrad is torch's (the same rows after two steps), its
    sparse invariant checks explicitly off: torch warns at every step where that is
    implicit."""
    import warnings

    from torch import nn

    from sarc.training.inputs import embedding_optimizer
    rows = []
    for make in (lambda t: embedding_optimizer(t, "sparse_adagrad", 0.1),
                 lambda t: torch.optim.Adagrad(t.parameters(), lr=0.1)):
        torch.manual_seed(0)
        table = nn.Embedding(10, 3, sparse=True)
        opt = make(table)
        for ids in (torch.tensor([1, 2, 2]), torch.tensor([2, 5])):
            opt.zero_grad()
            (table(ids) ** 2).sum().backward()
            if not rows:  # sarc's: no warning
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    opt.step()
            else:
                opt.step()
        rows.append(table.weight.detach())
    assert torch.equal(rows[0], rows[1])
