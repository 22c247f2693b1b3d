"""``sarc train --mode mfg|sampling`` with bad options, and a worker lost mid-epoch.

Bad options are one-line errors before any work: before the dataset is loaded or
partitioned and before any worker starts. A worker killed in the middle of a sampling
epoch stops the others with an error naming it, without a hang."""
from __future__ import annotations

import datetime
import traceback

import pytest
import torch
import torch.distributed as dist

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc
from .test_hetero import MISSING_RELATION

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

SAGE = str(ROOT / "models" / "sage.py")
GCN = str(ROOT / "models" / "gcn.py")


def _refused(*argv: str, needles: tuple[str, ...], workers: int = 2) -> None:
    proc = run_sarc("train", SAGE, "--dataset", "cora", "--workers", str(workers), *argv)
    assert_error(proc, *needles)
    assert "partitioned" not in proc.stdout and "epoch" not in proc.stdout, proc.stdout


@case("cli", "`--mode sampling --fanouts 2,2` of a model of one `sarc.HeteroConv` (one "
      "block, one fanout)", "error")
def test_a_heteroconv_takes_one_fanout(tmp_path):
    """A HeteroConv's relations' layers run on one block: they count as one graph layer
    (they were counted one each, so no --fanouts was accepted). With one fanout the model
    trains until its relation 95, which AIFB lacks, is refused."""
    model = tmp_path / "hetero.py"
    model.write_text(MISSING_RELATION)
    proc = run_sarc("train", model, "--mode", "sampling", "--fanouts", "2,2")
    assert_error(proc, "--fanouts 2,2", "2 fanouts", "1 sarc layer")
    assert "epoch" not in proc.stdout, proc.stdout
    proc = run_sarc("train", model, "--mode", "sampling", "--fanouts", "2", "--threads", "1")
    assert_error(proc, "edges of edge types 0, 1, 2, 4",
                 "relation 95 has a layer but no edges in the graph")
    assert not any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout


@case("cli", "`--fanouts 10,25,5` for a model of 2 sarc layers", "error")
def test_fanouts_of_another_length_than_the_model_layers():
    _refused("--mode", "sampling", "--fanouts", "10,25,5",
             needles=("--fanouts 10,25,5", "3 fanouts", "2 sarc layers"))


@case("cli", "`--batch-size 0`", "error")
def test_batch_size_zero():
    _refused("--mode", "sampling", "--fanouts", "10,25", "--batch-size", "0",
             needles=("--batch-size must be at least 1, got 0",), workers=1)


@case("cli", "`--fanouts` with `--mode full`", "error")
def test_fanouts_with_mode_full():
    _refused("--fanouts", "10,25", needles=("--fanouts", "need --mode sampling"))


@case("cli", "`--mode sampling` without `--fanouts`", "error")
def test_sampling_without_fanouts():
    _refused("--mode", "sampling", needles=("--mode sampling needs --fanouts",), workers=1)


@case("cli", "`--fanouts 10,x` (not integers)", "error")
def test_fanouts_that_are_not_integers():
    _refused("--mode", "sampling", "--fanouts", "10,x", needles=("--fanouts", "'10,x'"))


@case("cli", "`--fanouts` or `--replace` with `--mode mfg`", "error")
def test_sampling_options_with_mode_mfg():
    _refused("--mode", "mfg", "--fanouts", "10,25", "--replace",
             needles=("--fanouts, --replace", "--mode mfg takes every in-edge"))


def _sampling_worker(rank, port, queue):
    from sampling.graphs import shards, tiny_graph
    from sarc.distributed.train import AllReduce, BlockGraphs, sampling_group
    from sarc.sampling import Comm
    from sarc.training.loop import train_step
    from sarc.training.minibatch import MiniBatchConfig, MiniBatchSteps, ShardRows
    import sage

    timeout = datetime.timedelta(seconds=20)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=3, timeout=timeout)
    try:
        shard = shards(tiny_graph(), 3)[0][rank]
        nd = shard.ndata
        counts = {"train": 0, "val": 0, "test": 0}
        t = torch.tensor([int(nd["train_mask"].sum())])
        dist.all_reduce(t)
        counts["train"] = int(t)
        steps = MiniBatchSteps(shard, MiniBatchConfig("sampling", (2, 2), batch_size=3), layers=2,
                               seed=0, comm=Comm(sampling_group(None, timeout), timeout=timeout),
                               prefetch=True,  # as the trainer: the sampler a step ahead
                               rows=ShardRows(nd["feat"], nd["label"], nd["train_mask"]),
                               evaluation=None, counts=counts,
                               graphs_of=BlockGraphs(None, "sampling", torch.device("cpu"),
                                                     timeout=timeout))
        torch.manual_seed(0)
        model = sage.build_model(5, 3, hidden=4, dropout=0.0)
        opt = torch.optim.Adam(model.parameters())
        for epoch in (1, 2, 3):
            for batch in steps.steps(epoch):
                train_step(model, opt, batch, AllReduce())
        queue.put((rank, "finished"))
    except Exception as e:
        queue.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


@case("faults", "one worker killed (SIGKILL) in the middle of a sampling epoch", "error")
def test_a_worker_killed_mid_epoch_stops_the_others_with_an_error(monkeypatch):
    from distributed.harness import spawn
    monkeypatch.setenv("SARC_TEST_KILL_AT", "1:2.3")  # worker 1, epoch 2, before step 3
    codes, reports = spawn(_sampling_worker, 3, timeout_s=90)
    assert codes[1] == -9, (codes, reports)
    firsts = {r: str(reports[r]).splitlines()[0] for r in (0, 2)}
    # A survivor fails in the step's layer exchange or size gathering, or in the sampler's.
    # Its error names the peer it lost: worker 1, or the other survivor when that one failed
    # first and went away (in CI, worker 2 left while worker 0 was receiving from it).
    for r, first in firsts.items():
        other = 2 - r
        assert first.startswith(tuple(
            f"{kind}: {what} with worker {peer} failed"
            for kind, what in (("ExchangeError", "exchange"), ("SamplingError", "sampling exchange"))
            for peer in (1, other)) + (
            "ExchangeError: gathering the step's block sizes from the workers failed",
            "SamplingError: gathering sizes from the workers failed")), first
        assert "peer" in first, first
    # The first survivor to fail lost worker 1, as both were alive until one failed.
    assert any("worker 1 failed" in f or "from the workers failed" in f
               for f in firsts.values()), firsts


@case("checkpoint", "`--resume` of a full-batch checkpoint with `--mode sampling`", "error")
def test_resuming_a_checkpoint_of_another_training_mode(tmp_path):
    ckpt = tmp_path / "ckpt"
    run = ("train", SAGE, "--dataset", "cora", "--epochs", "2", "--checkpoint", ckpt)
    first = run_sarc(*run)
    assert first.returncode == 0, first.stderr[-2000:]
    proc = run_sarc(*run, "--resume", "--mode", "sampling", "--fanouts", "5,5")
    err = assert_error(proc, "the mode differs (--mode full in the checkpoint, --mode sampling "
                             "now)")
    assert "hyperparameters differ" not in err and "(unset)" not in err, err

