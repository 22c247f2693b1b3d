"""``sarc train --workers P`` end to end (torchrun, gloo on 127.0.0.1) and ``sarc compile
--emit schedule``.

The distributed runs train with dropout off (``--set dropout=0``): with dropout on, one
worker and four draw different masks (each worker draws for its own rows), and on Cora
the test accuracy after 50 epochs varies by ~3 points from seed to seed, so only a
step-for-step identical run can be held to 0.5 points. With dropout off both runs do
the same arithmetic up to float rounding.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sarc.loader import load_model_file
from sarc.train import train
from sarc.training.minibatch import MiniBatchConfig
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[2]


def _sarc(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # a generous limit: on a loaded 2-core machine 4 workers run several times slower
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *argv], cwd=ROOT,
                              timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_gcn_on_cora_4_workers_matches_1_worker(tmp_path):
    out = tmp_path / "four.json"
    proc = _sarc("train", "models/gcn.py", "--dataset", "cora", "--workers", "4", "--epochs", "50",
                 "--set", "dropout=0", "--log-every", "10", "--json", str(out))
    four = json.loads(out.read_text())
    one = train(load_model_file(ROOT / "models/gcn.py"), "cora", epochs=50,
                hparams={"dropout": 0.0}, log=None)
    assert abs(four["test_acc"] - one["test_acc"]) <= 0.005, (four["test_acc"], one["test_acc"])
    assert four["test_acc"] > 0.7
    # the per-worker report: peak memory, and the bytes of a training step as planned
    assert len(four["per_worker"]) == 4
    for w in four["per_worker"]:
        assert w["rss_peak"] > 0 and w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0
    assert "epoch   50/50" in proc.stdout and "peak RSS" in proc.stdout


def test_rgcn_on_aifb_2_workers_oneshot_matches_1_worker(tmp_path):
    """A featureless graph (a learned embedding's local rows), edge types through the
    partition, the oneshot mode."""
    out = tmp_path / "two.json"
    proc = _sarc("train", "models/rgcn.py", "--workers", "2", "--exec", "oneshot", "--epochs",
                 "4", "--method", "random", "--json", str(out))
    two = json.loads(out.read_text())
    one = train(load_model_file(ROOT / "models/rgcn.py"), "aifb", epochs=4, log=None)
    # the whole model's parameters, the sharded embedding's rows at the table's full size
    count = sum(p.numel() for p in one["module"].parameters())
    assert f"{count} parameters" in proc.stdout, (count, proc.stdout[:400])
    # the report records what was trained on, as one process's does
    assert two["dataset"] == one["dataset"] == "aifb"
    assert two["hparams"] == {k: v for k, v in one["hparams"].items()}
    assert abs(two["test_acc"] - one["test_acc"]) <= 0.005
    assert abs(two["final_loss"] - one["final_loss"]) <= 1e-4 * one["final_loss"]
    assert {p["exec_mode"] for p in two["plans"]} == {"oneshot"}


def test_hetero_sage_on_aifb_2_workers_sampling_matches_1_worker(tmp_path):
    """A HeteroConv on sampled blocks: each relation's layer on the block's edges of its
    relation, normalized as on the whole graph; the steps' samples do not depend on the
    worker count, so two workers train as one process (dropout and weight decay off), and
    each worker's layer bytes per step are the planner's for the relations' programs."""
    out = tmp_path / "two.json"
    opts = ["--mode", "sampling", "--fanouts", "4,4", "--batch-size", "40", "--epochs", "2",
            "--set", "dropout=0", "--set", "weight_decay=0"]
    proc = _sarc("train", "models/hetero_sage.py", "--dataset", "aifb", "--workers", "2",
                 "--method", "random", *opts, "--json", str(out))
    two = json.loads(out.read_text())
    one = train(load_model_file(ROOT / "models/hetero_sage.py"), "aifb", epochs=2,
                hparams={"dropout": 0.0, "weight_decay": 0.0}, log=None,
                minibatch=MiniBatchConfig("sampling", (4, 4), batch_size=40))
    assert two["mode"] == one["mode"] == "sampling"
    assert abs(two["final_loss"] - one["final_loss"]) <= 1e-4 * one["final_loss"]
    for w in two["per_worker"]:
        assert w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0
        assert w["epoch_setup_bytes_sent"] > 0
    assert "MiB relations" in proc.stdout


BATCH_NORM_MODEL = """
import torch
import torch.nn.functional as F
from torch import nn
import sarc


class Mean(sarc.Layer):
    def __init__(self, d, c):
        super().__init__(node={"h": d})
        self.lin = nn.Linear(d, c)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.lin(agg.agg + dst.h)


HPARAMS = {"dataset": "cora", "lr": 0.01, "epochs": 3, "self_loops": False}


def build_model(in_feats, num_classes, **_):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = Mean(in_feats, 16), Mean(16, num_classes)
            self.norm = nn.Sequential(nn.BatchNorm1d(16))

        def forward(self, g, x):
            return self.conv2(g, F.relu(self.norm(self.conv1(g, x))))
    return Net()
"""


def test_a_plain_batch_norm_normalizes_over_every_worker(tmp_path):
    """A model's own nn.BatchNorm1d trains on 2 workers as on one process: each worker's is
    made a SyncBatchNorm (over a worker's rows alone the losses drift apart)."""
    model = tmp_path / "bn.py"
    model.write_text(BATCH_NORM_MODEL)
    out = tmp_path / "two.json"
    proc = _sarc("train", str(model), "--workers", "2", "--json", str(out))
    two = json.loads(out.read_text())
    one = train(load_model_file(model), "cora", log=None)
    assert abs(two["final_loss"] - one["final_loss"]) <= 1e-5 * one["final_loss"]
    assert two["best_epoch"] == one["best_epoch"]
    assert abs(two["test_acc"] - one["test_acc"]) <= 1e-6
    assert "batch norm norm.0: normalized over every worker's rows" in proc.stdout


SHARED_MODEL = BATCH_NORM_MODEL.replace(
    "self.conv1, self.conv2 = Mean(in_feats, 16), Mean(16, num_classes)",
    "self.enc, self.conv, self.out = nn.Linear(in_feats, 16), Mean(16, 16), nn.Linear(16, num_classes)"
).replace(
    "return self.conv2(g, F.relu(self.norm(self.conv1(g, x))))",
    "h = self.enc(x)\n            for _ in range(3):\n                h = F.relu(self.conv(g, h))\n"
    "            return self.out(h)")


def test_a_layer_called_three_times_a_step_is_planned_three_times_within_the_budget(tmp_path):
    """Weight sharing: the report's planned bytes counted a layer once a step where it ran
    three times (a third of what was sent), and each call kept the rows of the one share
    the layer had of the budget. A call while an earlier one awaits its backward now runs
    in sar, and the step's calls are counted."""
    model = tmp_path / "shared.py"
    model.write_text(SHARED_MODEL)
    assert "for _ in range(3)" in SHARED_MODEL
    out = tmp_path / "three.json"
    _sarc("train", str(model), "--workers", "3", "--method", "random", "--exec", "hybrid",
          "--mem-budget", "20K", "--json", str(out))
    three = json.loads(out.read_text())
    for w in three["per_worker"]:
        assert w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0, w
    # the last step's calls: the first keeps its share, the two while it awaits its backward
    # keep nothing
    assert [p["exec_mode"] for p in three["plans"]] == ["hybrid", "sar", "sar"], three["plans"]
    one = train(load_model_file(model), "cora", log=None)
    assert abs(three["final_loss"] - one["final_loss"]) <= 1e-5 * one["final_loss"]


def test_compile_emits_the_generated_schedules(tmp_path):
    parts = tmp_path / "parts"
    _sarc("partition", "--dataset", "cora", "--parts", "3", "--out", str(parts))
    out = tmp_path / "art"
    _sarc("compile", "models/gat.py", "--workers", "3", "--partition", str(parts),
          "--emit", "schedule", "--out", str(out))
    files = sorted(p.name for p in out.iterdir())
    assert files == ["conv1.schedule.py", "conv2.schedule.py", "sarc-set.json", "schedule.txt"]
    for name in ("conv1", "conv2"):
        text = (out / f"{name}.schedule.py").read_text()
        compile(text, name, "exec")
        assert text.startswith(f"# Generated by sarc: layer {name} (GATLayer)")
        assert "def forward(rt):" in text and "def backward(rt, grad_out):" in text


def test_train_on_a_partition_runs_a_worker_per_part_unless_told(tmp_path):
    """``sarc train --partition DIR`` without --workers runs one worker per part, as ``sarc
    compile --partition`` plans them (it said "--workers is 1"); a --workers of another
    count is refused, naming both."""
    parts = tmp_path / "parts"
    _sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random",
          "--out", str(parts))
    out = tmp_path / "run.json"
    _sarc("train", "models/gcn.py", "--partition", str(parts), "--epochs", "1",
          "--json", str(out))
    assert json.loads(out.read_text())["workers"] == 2
    proc = subprocess.run([sys.executable, "-m", "sarc.cli", "train", "models/gcn.py",
                           "--partition", str(parts), "--workers", "3", "--epochs", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has 2 parts but --workers is 3" in proc.stderr
