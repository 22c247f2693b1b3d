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


@case("cli", "`--embedding-lr` / `--embedding-optimizer` / `--set embedding_dim` on a dataset "
             "with node features (no learned input to apply them to), on one process and "
             "`--workers 2`", "error")
def test_embedding_options_on_a_featured_dataset_are_refused():
    assert_error(run_sarc("train", GCN, "--dataset", "cora", "--embedding-lr", "0.1",
                          "--epochs", "1"),
                 "embedding_lr=0.1", "dataset cora has node features", "leave it out")
    proc = run_sarc("train", GCN, "--set", "embedding_dim=8", "--embedding-optimizer",
                    "sparse_adagrad", "--workers", "2", "--epochs", "1")
    assert_error(proc, "embedding_dim=8, embedding_optimizer='sparse_adagrad'",
                 "dataset cora has node features", "leave them out")
    assert proc.stdout == ""   # refused before partitioning


def test_a_model_files_embedding_hparams_serve_only_its_featureless_datasets():
    """``HPARAMS`` may set the embedding for a featureless default dataset; on a dataset with
    features it is not the run's choice, and the run trains on the features."""
    from sarc.loader import load_model_file
    from sarc.train import build, hyperparameters
    from sarc.datasets import load_dataset
    from sarc.training.inputs import EmbeddingInput, TrainError
    import pytest

    import dataclasses
    gcn = load_model_file(GCN)
    spec = dataclasses.replace(gcn, hparams={**gcn.hparams, "embedding_dim": 8})
    hp = hyperparameters(spec, {"epochs": 1})
    assert hp.given == {"epochs"}
    cora = load_dataset("cora")
    model = build(spec, cora, hp)
    assert not isinstance(model, EmbeddingInput)
    with pytest.raises(TrainError, match="embedding_lr=0.5: dataset cora has node features"):
        build(spec, cora, hyperparameters(spec, {"embedding_lr": 0.5}))
