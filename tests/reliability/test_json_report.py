"""``sarc train --json``: strict JSON, a metric without a value (the accuracy of an empty
split) written as ``null``, on one process and on P workers."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from sarc.training.loop import result_json

from .harness import ROOT, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

SAGE = ROOT / "models" / "sage.py"


def strict(text: str):
    """``text`` parsed as JSON that every parser reads: NaN, Infinity and -Infinity refused."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def without_validation(path) -> str:
    """A dataset file whose validation split is empty."""
    n = 40
    ids = np.arange(n)
    np.savez(path, edge_src=ids, edge_dst=(ids + 1) % n,
             feat=np.random.default_rng(0).random((n, 4), dtype=np.float32), label=ids % 3,
             train_mask=ids % 2 == 0, val_mask=np.zeros(n, bool), test_mask=ids % 2 == 1,
             num_nodes=np.int64(n))
    return str(path)


def test_result_json_writes_null_for_what_has_no_value():
    result = {"val_acc": math.nan, "final_loss": math.inf, "test_acc": 0.5,
              "per_worker": [{"loss": -math.inf, "rss": 3}], "hparams": {"lr": np.float32(0.01)},
              "acc": (np.float64("nan"), torch.tensor(math.nan)), "ok": True, "none": None,
              "module": torch.nn.Linear(1, 1)}
    got = strict(result_json(result))
    assert got == {"val_acc": None, "final_loss": None, "test_acc": 0.5,
                   "per_worker": [{"loss": None, "rss": 3}],
                   "hparams": {"lr": pytest.approx(0.01)}, "acc": [None, None], "ok": True,
                   "none": None}


@pytest.mark.parametrize("workers", [1, 2])
def test_json_of_a_run_with_an_empty_split_is_strict(tmp_path, workers):
    data = without_validation(tmp_path / "noval.npz")
    out = tmp_path / "r.json"
    argv = ["train", SAGE, "--dataset", data, "--epochs", "1", "--json", out]
    if workers > 1:
        parts = tmp_path / "parts"
        assert run_sarc("partition", "--dataset", data, "--parts", "2", "--method", "random",
                        "--out", parts).returncode == 0
        argv += ["--workers", "2", "--partition", parts]  # the same dataset: accepted
    proc = run_sarc(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = strict(out.read_text())
    assert report["val_acc"] is None
    assert isinstance(report["test_acc"], float) and isinstance(report["train_acc"], float)
    assert report["dataset"] == str(Path(data).resolve())   # the file, on 1 process and on P
