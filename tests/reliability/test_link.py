"""``sarc train --task link`` with bad input: one line naming the problem, before any
epoch is trained."""
from __future__ import annotations

import pytest
import torch

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

SAGE = ROOT / "models" / "sage.py"
SAGE_LP = ROOT / "models" / "sage_lp.py"


@case("cli", "`--task link` with a node-classification model file", "error")
def test_link_task_with_a_node_classification_model():
    proc = run_sarc("train", SAGE, "--task", "link", "--epochs", "1")
    assert_error(proc, "sage.py is not a link-prediction model file", "score(h_u, h_v)")
    assert proc.stdout == "", proc.stdout


@case("cli", "`--set eval_negatives=5000` (more negatives than Cora's 2708 nodes)", "error")
def test_more_eval_negatives_than_nodes():
    proc = run_sarc("train", SAGE_LP, "--task", "link", "--epochs", "1",
                    "--set", "eval_negatives=5000")
    assert_error(proc, "eval_negatives=5000", "2708 nodes")
    assert "epoch" not in proc.stdout, proc.stdout


@case("cli", "`--negatives zipf` (an unknown negative sampler)", "error")
def test_unknown_negative_sampler():
    proc = run_sarc("train", SAGE_LP, "--task", "link", "--negatives", "zipf")
    assert_error(proc, "--negatives", "zipf", "uniform", "degree")
    assert proc.stdout == "", proc.stdout


@case("cli", "`--set negatives=zipf` (an unknown sampler in a hyperparameter)", "error")
def test_unknown_negative_sampler_hyperparameter():
    proc = run_sarc("train", SAGE_LP, "--task", "link", "--set", "negatives=zipf")
    assert_error(proc, "negatives='zipf'", "uniform, degree")
    assert "epoch" not in proc.stdout, proc.stdout


@case("cli", "`--negatives degree` without `--task link`", "error")
def test_negatives_without_the_link_task():
    proc = run_sarc("train", SAGE, "--negatives", "degree")
    assert_error(proc, "--negatives", "--task link")
    assert proc.stdout == "", proc.stdout


@case("files", "a damaged link split file (`link_split.pt` of a link set: Python objects, "
      "a missing split, pairs of the wrong shape)", "error")
@pytest.mark.parametrize("content, message", [
    ({"num_nodes": 4, "obj": object}, "holds Python objects other than tensors"),
    ({"num_nodes": 4, "train": torch.zeros(2, 3, dtype=torch.int64)}, "lacks val"),
    ({"num_nodes": 4, "train": torch.zeros(3, 3, dtype=torch.int64),
      "val": torch.zeros(2, 0, dtype=torch.int64), "test": torch.zeros(2, 0, dtype=torch.int64)},
     r"train must be a \[2, n\] int64 tensor"),
])
def test_a_damaged_link_split_names_what_is_wrong(tmp_path, content, message):
    from sarc.training.inputs import TrainError
    from sarc.training.link import LinkSplit
    path = tmp_path / "split.pt"
    torch.save(content, path)
    with pytest.raises(TrainError, match=message):
        LinkSplit.load(path)


WEIGHTED_LP = '''
import sarc
from torch import nn


class Weighted(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i}, edge={"edge_weight": ()})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return src.h * edge.edge_weight.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.lin(agg.agg)


class Encoder(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.conv = Weighted(i, 8)

    def forward(self, g, x, edge_weight):
        return self.conv(g, x, edge_weight=edge_weight)

    def score(self, h_u, h_v):
        return (h_u * h_v).sum(-1)


def build_model(in_feats, num_classes, **_):
    return Encoder(in_feats)


HPARAMS = {"epochs": 1, "eval_negatives": 50, "negatives": "uniform", "negatives_per_edge": 1}
'''


@case("cli", "`--task link` with a model whose forward needs edge data (`edge_weight`), on a "
             "dataset that has it", "error")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_link_model_needing_edge_data_is_refused_by_what_it_needs(tmp_path, workers):
    """The error said the dataset had no edge data of that name, though it had: link
    prediction passes the model none."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["edge_weight"] = np.ones(len(data["edge_src"]), dtype=np.float32)
    np.savez(tmp_path / "w.npz", **data)
    (tmp_path / "weighted_lp.py").write_text(WEIGHTED_LP)
    more = ("--workers", "2", "--method", "random") if workers == "2" else ()
    proc = run_sarc("train", tmp_path / "weighted_lp.py", "--task", "link", "--dataset",
                    tmp_path / "w.npz", *more)
    needle = "forward needs 'edge_weight', which link prediction does not pass"
    if workers == "1":
        err = assert_error(proc, needle)
    else:   # each worker says it (the model is built there), then the launcher
        err = proc.stderr
        assert proc.returncode == 2 and "Traceback" not in err, err
        said = [line for line in err.splitlines() if line.startswith("sarc worker")]
        assert len(said) == 2 and all(needle in line for line in said), err
    assert "the dataset has no edge data" not in err
    assert "epoch" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("task", ["node", "link"])
def test_a_dataset_file_is_recorded_by_its_path_on_one_process(tmp_path, task):
    """One process's link run recorded the file's own name (``cora``) where its workers,
    and node classification, record what the run was given (the file)."""
    import json
    import shutil
    data = tmp_path / "graph.npz"
    shutil.copy(ROOT / "sarc" / "data" / "cora.npz", data)
    out = tmp_path / "result.json"
    model = SAGE_LP if task == "link" else SAGE
    proc = run_sarc("train", model, "--task", task, "--dataset", data, "--epochs", "1",
                    "--quiet", "--json", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(data) in json.loads(out.read_text())["dataset"]
