"""``sarc train --backend triton`` in Triton's interpreter (``TRITON_INTERPRET=1``, set by
this directory's conftest) trains as ``--backend torch`` does: the same losses and
accuracies, on one process and on two workers. The graph is tiny and the model a 2-layer
GCN (the interpreter is slow); the GPU versions are in tests/gpu/test_gpu_train.py."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from sarc.datasets import Dataset
from sarc.loader import load_model_file
from sarc.train import train
from sarc.training.minibatch import MiniBatchConfig
from timeouts import run_or_show_stacks

ROOT = Path(__file__).resolve().parents[3]
GCN = ROOT / "models" / "gcn.py"
RTOL = 1e-5


def tiny_arrays(n: int = 30, e: int = 120, feats: int = 6, classes: int = 3, seed: int = 0):
    """A random graph with a few self loops and isolated nodes, its labels and splits."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n - 2, e), rng.integers(0, n - 2, e)
    src[:3] = dst[:3]
    split = rng.integers(0, 3, n)
    return {"edge_src": src, "edge_dst": dst, "feat": rng.random((n, feats), np.float32),
            "label": rng.integers(0, classes, n), "train_mask": split == 0,
            "val_mask": split == 1, "test_mask": split == 2, "num_nodes": np.int64(n),
            "num_classes": np.int64(classes)}


def one_process(backend: str, epochs: int = 2, **options) -> dict:
    data = Dataset.from_arrays(tiny_arrays(), name="tiny")
    return train(load_model_file(GCN), data, epochs=epochs, log=None, backend=backend,
                 **options)


def assert_same_run(got: dict, want: dict) -> None:
    assert got["epochs"] == want["epochs"]
    assert math.isclose(got["final_loss"], want["final_loss"], rel_tol=RTOL), (got, want)
    assert got["best_epoch"] == want["best_epoch"]
    for k in ("train_acc", "val_acc", "test_acc", "final_test_acc"):  # float32 or float64 sums
        assert math.isclose(got[k], want[k], rel_tol=1e-6), (k, got[k], want[k])


@pytest.mark.parametrize("mode", ["full", "mfg"])
def test_triton_trains_as_torch_on_one_process(mode):
    """With dropout (sarc's masks are the backends' alike; the input dropout is torch's)."""
    config = MiniBatchConfig("mfg", batch_size=4) if mode == "mfg" else None
    got = one_process("triton", minibatch=config)
    want = one_process("torch", minibatch=config)
    assert_same_run(got, want)
    layers = [m for m in got["module"].modules() if hasattr(m, "_sarc_backend")]
    assert layers and {m._sarc_backend for m in layers} == {"triton"}
    assert (got["backend"], got["device"]) == ("triton", "cpu")


def test_triton_on_two_workers_trains_as_torch_on_one_process(tmp_path):
    """``sarc train --workers 2 --backend triton``: the workers' kernels in the interpreter
    (it reaches them through the environment), dropout off so that two workers are the one
    process's arithmetic."""
    np.savez(tmp_path / "tiny.npz", **tiny_arrays())
    out = tmp_path / "run.json"
    proc = run_or_show_stacks(
        [sys.executable, "-m", "sarc.cli", "train", str(GCN), "--dataset",
         str(tmp_path / "tiny.npz"), "--workers", "2", "--method", "random", "--epochs", "2",
         "--set", "dropout=0", "--backend", "triton", "--json", str(out)],
        cwd=ROOT, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert (got["workers"], got["backend"], got["device"]) == (2, "triton", "cpu")
    assert_same_run(got, one_process("torch", hparams={"dropout": 0.0}))


@pytest.mark.skipif(not os.environ.get("SARC_SLOW_TESTS"),
                    reason="link prediction in the interpreter (about 10 s); set SARC_SLOW_TESTS=1")
def test_triton_link_prediction_as_torch_on_one_process():
    from sarc.training.link import train_links
    data = Dataset.from_arrays(tiny_arrays(n=40, e=200), name="tiny")
    spec = load_model_file(ROOT / "models" / "sage_lp.py")
    got, want = (train_links(spec, data, epochs=2, log=None, backend=b,
                             hparams={"eval_negatives": 20}) for b in ("triton", "torch"))
    assert math.isclose(got["final_loss"], want["final_loss"], rel_tol=RTOL)
    for k in ("val_mrr", "test_mrr", "best_epoch"):
        assert math.isclose(got[k], want[k], rel_tol=1e-6), (k, got[k], want[k])


def test_without_backend_each_layer_keeps_its_own(tmp_path):
    """A layer that says ``backend="triton"`` trains with Triton's kernels unless
    ``--backend`` names one for every layer: the default no longer set them all to torch."""
    text = GCN.read_text().replace(
        "self.conv2 = GCNLayer(hidden, num_classes)",
        "self.conv2 = GCNLayer(hidden, num_classes).set_backend(\"triton\")")
    assert "set_backend" in text
    model = tmp_path / "mixed.py"
    model.write_text(text)
    np.savez(tmp_path / "tiny.npz", **tiny_arrays())
    runs = {}
    for flag in ((), ("--backend", "torch"), ("--backend", "triton")):
        out = tmp_path / f"run{len(runs)}.json"
        proc = run_or_show_stacks(
            [sys.executable, "-m", "sarc.cli", "train", str(model), "--dataset",
             str(tmp_path / "tiny.npz"), "--epochs", "2", *flag, "--json", str(out)],
            cwd=ROOT, timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[flag[1] if flag else "own"] = json.loads(out.read_text())
        assert "kernels" in proc.stdout
    assert runs["own"]["backend"] == "torch+triton"
    assert (runs["torch"]["backend"], runs["triton"]["backend"]) == ("torch", "triton")
    for got in runs.values():
        assert_same_run(got, runs["torch"])
