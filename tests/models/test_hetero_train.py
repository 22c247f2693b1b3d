"""``models/hetero_sage.py`` through the trainer on a small typed dataset: the node types
reach the model (``ntype`` beside ``etype``), a saved model loads and predicts as trained,
and it trains in the mini-batch modes (one process: ``tests/sampling/test_hetero.py`` has
the steps on workers)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import sarc
from sarc.datasets import Dataset
from sarc.loader import load_model_file
from sarc.train import prepare, train
from sarc.training.inputs import TrainError
from sarc.training.minibatch import MiniBatchConfig, check_minibatch_budget

ROOT = Path(__file__).resolve().parents[2]
N, E, RELS = 50, 300, 4


def typed_dataset() -> Dataset:
    """Two node types (features 3 and 5 wide, zero-padded), relation r into type r % 2."""
    rng = np.random.default_rng(0)
    ntype = rng.integers(0, 2, N)
    etype = rng.integers(0, RELS, E)
    src = rng.integers(0, N, E)
    dst = np.array([rng.choice(np.flatnonzero(ntype == r % 2)) for r in etype])
    feat = rng.standard_normal((N, 5)).astype(np.float32)
    feat[ntype == 0, 3:] = 0.0
    label = np.where(ntype == 0, rng.integers(0, 3, N), -1)
    train_mask = (rng.random(N) < 0.6) & (ntype == 0)
    return Dataset.from_arrays({
        "edge_src": src, "edge_dst": dst, "etype": etype, "ntype": ntype, "feat": feat,
        "label": label, "train_mask": train_mask, "val_mask": ~train_mask & (ntype == 0),
        "test_mask": ~train_mask & (ntype == 0), "num_classes": np.int64(3)}, name="typed")


def test_hetero_sage_trains_saves_and_loads(tmp_path):
    spec = load_model_file(str(ROOT / "models" / "hetero_sage.py"))
    data = typed_dataset()
    hp = {"epochs": 3}
    out = train(spec, data, hparams=hp, log=None, save=str(tmp_path / "m.pt"))
    model = out["module"]
    assert {m.__class__ for m in model.modules()} >= {sarc.HeteroConv, sarc.TypedInput}
    assert model.input.in_widths == {0: 5, 1: 5}
    prep = prepare(data, out["hparams"], model)
    assert set(prep.edge_inputs) == {"etype", "ntype"}
    loaded = sarc.load_trained(str(tmp_path / "m.pt"), str(ROOT / "models" / "hetero_sage.py"))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(prep.graph, prep.x, **prep.edge_inputs),
                                   model(prep.graph, prep.x, **prep.edge_inputs))


def test_hetero_sage_trains_in_minibatch_modes():
    """With every training node in one MFG batch a step is the full-batch step, so three
    epochs end at the full-batch run's loss (dropout and weight decay off); sampled
    batches train too, each HeteroConv on a block of its own."""
    spec = load_model_file(str(ROOT / "models" / "hetero_sage.py"))
    hp = {"epochs": 3, "dropout": 0.0, "weight_decay": 0.0}
    full = train(spec, typed_dataset(), hparams=hp, log=None)
    mfg = train(spec, typed_dataset(), hparams=hp, log=None, minibatch=MiniBatchConfig("mfg"))
    assert mfg["mode"] == "mfg"
    assert abs(mfg["final_loss"] - full["final_loss"]) <= 1e-5 * full["final_loss"]
    sampled = train(spec, typed_dataset(), hparams=hp, log=None,
                    minibatch=MiniBatchConfig("sampling", (3, 2), batch_size=8))
    assert sampled["minibatch"]["fanouts"] == [3, 2]
    assert abs(sampled["final_loss"] - full["final_loss"]) > 1e-3   # other steps, other weights
    assert torch.isfinite(torch.tensor(sampled["final_loss"]))


def test_a_memory_budget_with_a_hetero_conv_in_minibatch_steps_is_refused():
    """Workers share a budget over a step's blocks, one sarc layer each; a HeteroConv's
    block runs a layer per relation."""
    spec = load_model_file(str(ROOT / "models" / "hetero_sage.py"))
    model = spec.build_model(5, 3, num_etypes=RELS, num_ntypes=2)
    check_minibatch_budget(model, None)
    with pytest.raises(TrainError, match="--mem-budget .* sarc.HeteroConv"):
        check_minibatch_budget(model, 1 << 20)
