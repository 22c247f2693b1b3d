"""A featureless graph's learned embedding: its options checked before any work, and a
checkpoint of one embedding optimizer not resumed by a run of another."""
from __future__ import annotations

import numpy as np

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

RGCN, GCN = ROOT / "models" / "rgcn.py", ROOT / "models" / "gcn.py"


@case("cli", "`--embedding-lr 0` (a learned embedding's learning rate not > 0)", "error")
def test_a_learning_rate_not_above_zero_is_refused():
    assert_error(run_sarc("train", RGCN, "--embedding-lr", "0", "--epochs", "1"),
                 "embedding_lr=0.0", "a finite number > 0")


@case("cli", "`--set embedding_optimizer=sgd` (not a sparse optimizer)", "error")
def test_an_unknown_embedding_optimizer_is_refused():
    assert_error(run_sarc("train", RGCN, "--set", "embedding_optimizer=sgd", "--epochs", "1"),
                 "embedding_optimizer='sgd'", "sparse_adam or sparse_adagrad")


@case("checkpoint", "`--resume` of a featureless run with another `--embedding-optimizer`",
      "error")
def test_resume_refuses_another_embedding_optimizer(tmp_path):
    gen = np.random.default_rng(0)
    n = 40
    r = gen.random(n)
    np.savez(tmp_path / "g.npz", edge_src=gen.integers(0, n, 120), edge_dst=gen.integers(0, n, 120),
             label=gen.integers(0, 3, n), train_mask=r < 0.6, val_mask=r >= 0.8,
             test_mask=(r >= 0.6) & (r < 0.8))
    run = ("train", GCN, "--dataset", tmp_path / "g.npz", "--set", "embedding_dim=4",
           "--epochs", "1", "--threads", "1", "--checkpoint", tmp_path / "ckpt")
    first = run_sarc(*run)
    assert first.returncode == 0, first.stderr[-2000:]
    assert_error(run_sarc(*run, "--resume", "--embedding-optimizer", "sparse_adagrad"),
                 "embedding_optimizer: 'sparse_adam' in the checkpoint, 'sparse_adagrad' now")
