"""sarc.train: the single-process trainer on the model zoo."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sarc.datasets import power_law_graph, sbm_graph
from sarc.errors import GraphError
from sarc.loader import load_model_file
from sarc.modules import input_dropout
from sarc.train import TrainError, train

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def one_thread():
    """One torch thread: on a busy 2-core machine OpenMP's second thread mostly waits."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_gcn_reaches_published_accuracy_on_cora(one_thread):
    result = train(load_model_file(MODELS / "gcn.py"), "cora", seed=0, log=None)
    assert result["epochs"] == 200
    assert result["test_acc"] >= 0.79, result
    assert result["train_acc"] > 0.9 and result["val_acc"] > 0.75


def test_training_is_deterministic_given_a_seed(one_thread):
    spec = load_model_file(MODELS / "gcn.py")
    runs = [train(spec, "cora", epochs=5, seed=s, log=None) for s in (3, 3, 4)]
    keys = ("final_loss", "test_acc", "final_test_acc", "best_epoch")
    assert [runs[0][k] for k in keys] == [runs[1][k] for k in keys]
    assert runs[0]["final_loss"] != runs[2]["final_loss"]


@pytest.mark.parametrize("model,dataset", [("gat.py", "cora"), ("sage.py", "cora"),
                                           ("gin.py", "cora"), ("rgcn.py", "aifb"),
                                           ("edgeconv.py", "cora")])
def test_every_zoo_model_trains(model, dataset, one_thread):
    lines = []
    result = train(load_model_file(MODELS / model), dataset, epochs=3, seed=0, log=lines.append)
    assert result["dataset"] == dataset and result["epochs"] == 3
    assert 0.0 <= result["test_acc"] <= 1.0 and result["final_loss"] > 0
    assert sum(line.startswith("epoch") for line in lines) == 3
    assert lines[-1].startswith("selected epoch")


def test_model_hparams_and_overrides(one_thread):
    spec = load_model_file(MODELS / "gcn.py")
    result = train(spec, "cora", epochs=1, hparams={"hidden": 4, "lr": 0.1}, log=None)
    assert result["hparams"]["hidden"] == 4 and result["hparams"]["self_loops"] is True
    assert result["module"].conv1.lin.weight.shape == (4, 1433)


def test_trains_on_a_synthetic_graph(one_thread):
    data = sbm_graph([100, 100, 100], p_in=0.05, p_out=0.002, num_features=8, seed=0)
    result = train(load_model_file(MODELS / "gcn.py"), data, epochs=50, seed=0, log=None,
                   hparams={"norm_features": False})
    assert result["test_acc"] > 0.8


def test_featureless_dataset_needs_an_embedding(one_thread):
    spec = load_model_file(MODELS / "gcn.py")
    data = power_law_graph(500, 4000, num_features=0, seed=0)
    with pytest.raises(TrainError, match="no node features; set embedding_dim"):
        train(spec, data, epochs=1, log=None)
    result = train(spec, data, epochs=1, log=None, hparams={"embedding_dim": 8})
    assert result["module"].embedding.weight.shape == (500, 8)


def test_self_loops_on_a_relational_graph_are_refused():
    """R-GCN reads its edge type, which an added self loop has none of."""
    with pytest.raises(GraphError, match="edge feature 'etype'.*self loop has no edge type"):
        train(load_model_file(MODELS / "rgcn.py"), "aifb", epochs=1, log=None,
              hparams={"self_loops": True})


def test_a_model_without_parameters_is_refused():
    from sarc.loader import ModelSpec
    spec = ModelSpec("identity", lambda in_feats, num_classes, **_: torch.nn.Identity())
    with pytest.raises(TrainError, match="identity: the model has no parameters"):
        train(spec, "cora", epochs=1, log=None)


def test_input_dropout_follows_an_input_changed_in_place_or_replaced():
    """The nonzeros' positions are kept for the last input while it is unchanged: an
    in-place write, or another tensor, is seen."""
    torch.manual_seed(0)
    x = torch.zeros(50, 40)
    x[3, 5] = 1.0
    assert input_dropout(x, 0.5, True)[x == 0].abs().sum() == 0
    x.zero_()
    x[7, 9] = 1.0                                  # moved, in place
    for _ in range(20):
        y = input_dropout(x, 0.5, True)
        assert y[x == 0].abs().sum() == 0 and float(y[7, 9]) in (0.0, 2.0)
    assert any(float(input_dropout(x, 0.5, True)[7, 9]) == 2.0 for _ in range(40))
    other = torch.zeros(50, 40)
    other[1, 1] = 3.0
    assert any(float(input_dropout(other, 0.5, True)[1, 1]) == 6.0 for _ in range(40))


def test_input_dropout_matches_dropout():
    torch.manual_seed(0)
    x = (torch.rand(300, 200) < 0.02).float() * torch.rand(300, 200)
    y = input_dropout(x, 0.5, True)
    assert torch.equal(y[x == 0], torch.zeros_like(y[x == 0]))  # zeros stay zero
    kept = y[x != 0] != 0
    assert torch.allclose(y[x != 0][kept], 2 * x[x != 0][kept])  # survivors scaled by 1/(1-p)
    assert 0.4 < kept.float().mean() < 0.6
    assert torch.equal(input_dropout(x, 0.5, False), x)
    dense = torch.rand(10, 10, requires_grad=True)  # needs a gradient: plain dropout
    input_dropout(dense, 0.5, True).sum().backward()
    assert set(dense.grad.unique().tolist()) <= {0.0, 2.0}
