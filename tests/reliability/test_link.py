"""``sarc train --task link`` with bad input: one line naming the problem, before any
epoch is trained."""
from __future__ import annotations

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
