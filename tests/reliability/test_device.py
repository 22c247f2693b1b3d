"""``sarc train --device / --backend`` that this machine cannot honour: one-line errors
before any work (no dataset loaded or partitioned, no worker started, no epoch), saying
what to do instead. A GPU machine is made to look like one without CUDA through
``CUDA_VISIBLE_DEVICES``; the GPU counts a worker checks against are faked in-process."""
from __future__ import annotations

import pytest
import torch

from sarc.cli.options import UsageError, check_device
from sarc.distributed.graph import DistError
from sarc.distributed.worker import worker_device

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

GCN = str(ROOT / "models" / "gcn.py")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _refused(*argv: str, needles: tuple[str, ...], env: dict | None = None) -> None:
    proc = run_sarc("train", GCN, "--dataset", "cora", "--epochs", "1", *argv, env=env)
    assert_error(proc, *needles)
    assert "partitioned" not in proc.stdout and "epoch" not in proc.stdout, proc.stdout


@case("cli", "`--device cuda` on a machine without CUDA", "error")
def test_device_cuda_without_cuda():
    _refused("--device", "cuda", env=NO_GPU,
             needles=("sarc train: error: --device cuda: no CUDA device", "--device cpu"))


@case("cli", "`--backend triton` on the CPU without `TRITON_INTERPRET=1`", "error")
def test_triton_on_the_cpu_without_the_interpreter():
    _refused("--backend", "triton", env={"TRITON_INTERPRET": ""},
             needles=("--backend triton on the CPU", "--device cuda", "TRITON_INTERPRET=1"))


@case("cli", "`--device gpu` (not a device name)", "error")
def test_unknown_device():
    _refused("--device", "gpu", needles=("--device gpu: not a device", "cpu, cuda or cuda:N"))


@pytest.fixture
def two_gpus(monkeypatch):
    """This process sees two CUDA devices (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@case("cli", "`--device cuda --workers 3` with 2 GPUs", "error")
def test_more_workers_than_gpus(two_gpus):
    with pytest.raises(UsageError, match=r"--device cuda: 3 workers need 3 GPUs; this machine "
                                         r"has 2 CUDA devices \(cuda:0 \.\. cuda:1\)"):
        check_device("cuda", processes=3)
    assert check_device("cuda", processes=2) == torch.device("cuda")


@case("cli", "`--device cuda:1 --workers 2` (one GPU named for many workers)", "error")
def test_one_gpu_named_for_many_workers(two_gpus):
    with pytest.raises(UsageError, match="names one GPU, but 2 workers each take a GPU of "
                                         "their own .* give --device cuda"):
        check_device("cuda:1", processes=2)
    with pytest.raises(UsageError, match="cuda:2: there is no GPU 2; this machine has 2"):
        check_device("cuda:2")


@case("faults", "a worker on `--device cuda` whose LOCAL_RANK is beyond the machine's GPUs",
      "error")
def test_worker_local_rank_beyond_the_gpus(two_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert worker_device("cuda") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(DistError, match=r"local worker 2 \(LOCAL_RANK\) but this machine has 2 "
                                        r"CUDA devices; start at most 2 workers per machine"):
        worker_device("cuda")
    with pytest.raises(DistError, match="names one GPU, but this machine runs 3 workers"):
        worker_device("cuda:0")
