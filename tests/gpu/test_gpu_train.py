"""``sarc train --device cuda --backend triton`` on Cora: in one process, and as one NCCL
worker under torchrun (``--workers 1 --partition``), it reaches the losses of ``--device
cpu --backend torch`` epoch by epoch, within 1e-4 (scripts/gpu_session.sh runs the same two
commands in its ``train`` step). Dropout is off: the input dropout draws from the device's
generator, which is not the CPU's (sarc's own masks are the same on every device)."""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from gpu_check import needs_gpu
from timeouts import run_or_show_stacks

pytestmark = [pytest.mark.gpu, needs_gpu]

ROOT = Path(__file__).resolve().parents[2]
RUN = ["models/gcn.py", "--dataset", "cora", "--epochs", "3", "--set", "dropout=0"]
RTOL = 1e-4
LOSS = re.compile(r"epoch +\d+(?:/\d+)? \| loss (\d+\.\d+) \|")


def _nccl_missing() -> bool:
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_nccl_available())


def sarc(*argv: str) -> str:
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *argv], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def train(tmp_path: Path, name: str, *argv: str) -> tuple[dict, list[float]]:
    """The run's result and its printed per-epoch losses (4 decimals)."""
    out = sarc("train", *RUN, *argv, "--json", str(tmp_path / f"{name}.json"))
    losses = [float(m) for m in LOSS.findall(out)]
    assert len(losses) == 3, out
    return json.loads((tmp_path / f"{name}.json").read_text()), losses


def assert_same_losses(got, want) -> None:
    (result, losses), (ref, ref_losses) = got, want
    assert result["epochs"] == ref["epochs"] == 3
    assert result["final_loss"] == pytest.approx(ref["final_loss"], rel=RTOL)
    # printed with 4 decimals: half a unit of the last one on each side, and the tolerance
    assert losses == pytest.approx(ref_losses, rel=RTOL, abs=1.1e-4)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    return train(tmp_path_factory.mktemp("cpu"), "cpu", "--device", "cpu", "--backend", "torch")


def test_triton_on_cuda_trains_as_torch_on_the_cpu(tmp_path, cpu_run):
    got = train(tmp_path, "cuda", "--device", "cuda", "--backend", "triton")
    assert (got[0]["device"], got[0]["backend"]) == ("cuda:0", "triton")
    assert_same_losses(got, cpu_run)


@pytest.mark.skipif(_nccl_missing(), reason="this torch build has no NCCL")
def test_one_nccl_worker_on_triton_trains_as_torch_on_the_cpu(tmp_path, cpu_run):
    parts = tmp_path / "parts"
    sarc("partition", "--dataset", "cora", "--parts", "1", "--method", "random", "--out",
         str(parts))
    got = train(tmp_path, "worker", "--workers", "1", "--partition", str(parts), "--device",
                "cuda", "--backend", "triton")
    assert (got[0]["workers"], got[0]["device"], got[0]["backend"]) == (1, "cuda:0", "triton")
    assert_same_losses(got, cpu_run)


def _typed_dataset():
    """hetero_layers' random typed graph (two node types, four relations) as a dataset."""
    import hetero_layers
    from sarc.datasets import Dataset
    g = hetero_layers.typed_graph(300, 3000, 4, {0: 6, 1: 9}, 3, seed=5, isolated=5, train=0.5)
    train = g["train_mask"].numpy()
    return Dataset.from_arrays({
        "edge_src": g["src"].numpy(), "edge_dst": g["dst"].numpy(),
        "etype": g["etype"].numpy(), "ntype": g["ntype"].numpy(), "feat": g["feat"].numpy(),
        "label": g["label"].numpy(), "train_mask": train, "val_mask": ~train,
        "test_mask": ~train, "num_classes": 3}, name="typed")


def hetero_losses(device: str) -> float:
    """``models/hetero_sage.py`` trained in sampled steps on ``device`` (torch kernels, no
    dropout): its final loss."""
    from sarc.loader import load_model_file
    from sarc.train import train as train_model
    from sarc.training.minibatch import MiniBatchConfig
    out = train_model(load_model_file(ROOT / "models" / "hetero_sage.py"), _typed_dataset(),
                      epochs=3, hparams={"dropout": 0.0}, log=None, device=device,
                      backend="torch", minibatch=MiniBatchConfig("sampling", (5, 5),
                                                                 batch_size=40))
    assert out["device"].startswith(device)
    return out["final_loss"]


def test_a_hetero_model_in_sampled_steps_on_cuda_trains_as_on_the_cpu():
    """A HeteroConv per block on CUDA (each relation's block with the whole graph's
    relation degrees at the block's rows, its rows compacted to its destination type)."""
    assert hetero_losses("cuda") == pytest.approx(hetero_losses("cpu"), rel=RTOL)
