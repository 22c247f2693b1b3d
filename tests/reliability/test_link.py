"""``sarc train --task link`` with bad input: one line naming the problem, before any
epoch is trained."""
from __future__ import annotations

import pytest
import torch

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

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
