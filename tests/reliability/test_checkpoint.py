"""Checkpoints and resume (``sarc train --checkpoint DIR [--resume]``), ``--save`` and
``sarc.load_trained``: kills mid-run and mid-save, resuming another run's checkpoint,
files only ``torch.load(weights_only=True)`` reads.

Every run trains GCN on Cora with its dropout (0.5) on, so a resumed run equals an
uninterrupted one only if the random states came back too; weights are compared
bitwise (``torch.equal``).
"""
from __future__ import annotations

import hashlib
import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sarc
from sarc.checkpoint import (MANIFEST, CheckpointConfig, CheckpointError, check_plain,
                             read_saved, rng_state, set_rng_state)
from sarc.datasets import load_dataset
from sarc.loader import load_model_file
from sarc.train import prepare, train
from timeouts import run_or_show_stacks

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

GCN = ROOT / "models" / "gcn.py"
GAT = ROOT / "models" / "gat.py"
RUN = ("--epochs", "6", "--checkpoint-every", "2", "--threads", "1", "--log-every", "3")
"""Every single-process run here: checkpoints after epochs 2, 4 and 6."""


def _train(ckpt: Path, *extra, model: Path = GCN, env: dict | None = None):
    return run_sarc("train", model, *RUN, "--checkpoint", ckpt, *extra, env=env)


def _ok(proc):
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _assert_equal(a, b, where: str = "") -> None:
    """Nested dicts / lists of tensors and numbers, equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), (where, a, b)


def _final_files(ckpt: Path) -> dict:
    """The published checkpoint: {file name: contents}, each checked against the manifest."""
    meta = json.loads((ckpt / MANIFEST).read_text())
    out = {}
    for entry in meta["files"]:
        data = (ckpt / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry
        out[entry["file"]] = _load(ckpt / entry["file"])
    return out


def _same_training_state(a: dict, b: dict) -> None:
    for key in ("epoch", "model", "optimizer", "selection", "rng", "last", "stopped_early"):
        _assert_equal(a[key], b[key], key)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted single-process run: its checkpoint directory and --save file."""
    work = tmp_path_factory.mktemp("reference")
    _ok(_train(work / "ckpt", "--save", work / "model.pt"))
    return work / "ckpt", work / "model.pt"


# --- resume equals an uninterrupted run ---------------------------------------------------

@case("checkpoint", "the training process killed (SIGKILL) mid-run, then `--resume`", "exact")
def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path, reference):
    ref_dir, ref_model = reference
    ckpt = tmp_path / "ckpt"
    killed = _train(ckpt, "--save", tmp_path / "model.pt", env={"SARC_TEST_KILL_AT": "0:5"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert json.loads((ckpt / MANIFEST).read_text())["epoch"] == 4
    assert not (tmp_path / "model.pt").exists()
    resumed = _ok(_train(ckpt, "--resume", "--save", tmp_path / "model.pt"))
    assert "resuming from" in resumed.stdout and "epoch 4 done" in resumed.stdout
    assert [l.split("|")[0].split()[1] for l in resumed.stdout.splitlines()
            if l.startswith("epoch")] == ["6"]
    (name, mine), = _final_files(ckpt).items()
    theirs = _final_files(ref_dir)[name]
    _same_training_state(mine, theirs)
    _assert_equal(_load(tmp_path / "model.pt")["state_dict"], _load(ref_model)["state_dict"])


def test_resuming_a_checkpoint_past_the_epochs_asked_for_says_so(tmp_path, reference):
    """A checkpoint of 6 epochs resumed with --epochs 3: nothing is trained, and the run
    says why (it said only that it resumed)."""
    import shutil
    ref_dir, _ = reference
    ckpt = tmp_path / "ckpt"
    shutil.copytree(ref_dir, ckpt)
    resumed = _ok(_train(ckpt, "--resume", "--epochs", "3"))
    assert "epoch 6 is at or past --epochs 3: nothing left to train" in resumed.stdout
    assert not [line for line in resumed.stdout.splitlines() if line.startswith("epoch")]


@case("checkpoint", "two runs started at once with one `--checkpoint DIR`", "error")
def test_a_checkpoint_directory_holds_one_run_at_a_time(tmp_path):
    """Each removed the other's epoch files as leftovers, and the last manifest won."""
    from sarc.checkpoint import Checkpointer
    cfg = CheckpointConfig(str(tmp_path / "ckpt"))
    first = Checkpointer(cfg, {"seed": 0}, log=None)
    assert first.load() is None
    first_fd = os.open(cfg.directory, os.O_RDONLY)   # as another process: its own open
    import fcntl
    with pytest.raises(BlockingIOError):
        fcntl.flock(first_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(first_fd)
    del first   # the run has ended: its lock goes with it
    assert Checkpointer(cfg, {"seed": 1}, log=None).load() is None
    assert list((tmp_path / "ckpt").iterdir()) == []   # the lock adds no file
    # another process is refused while this one holds it
    kept = Checkpointer(cfg, {"seed": 2}, log=None)
    kept.load()
    code = ("import sys; from sarc.checkpoint import *; "
            "Checkpointer(CheckpointConfig(sys.argv[1]), {}, log=None).load()")
    proc = subprocess.run([sys.executable, "-c", code, cfg.directory], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode != 0 and "is in use by another run" in proc.stderr, proc.stderr


@case("checkpoint", "a `--workers 2` run that fails before its first checkpoint, one worker "
      "creating `--checkpoint DIR` before the other looks", "nothing-lost")
def test_a_failed_runs_checkpoint_directory_goes_whichever_worker_made_it(tmp_path):
    """Each worker asked whether DIR existed before making it: where worker 1 made it first,
    worker 0, which alone removes it, took it for the user's and left it, empty. The
    workers look before any of them makes it."""
    import threading
    import time
    from sarc.checkpoint import Checkpointer
    cfg = CheckpointConfig(str(tmp_path / "ckpt"))
    slots, barrier = [None, None], threading.Barrier(2, timeout=60)

    def gather_of(rank):
        def gather(obj):   # all_gather_object between the two threads
            slots[rank] = obj
            barrier.wait()
            got = list(slots)
            barrier.wait()
            return got
        return gather

    workers = [Checkpointer(cfg, {"seed": 0}, rank=r, world_size=2, gather=gather_of(r),
                            log=None) for r in (0, 1)]

    def run(rank):
        if rank == 0:
            time.sleep(0.5)   # worker 1 is at DIR first
        workers[rank].load()

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert (tmp_path / "ckpt").is_dir()
    for w in workers:   # the run failed before its first checkpoint
        w.discard_if_unused()
    assert not (tmp_path / "ckpt").exists()


def test_a_later_run_of_a_process_takes_the_lock_an_earlier_one_kept(tmp_path):
    """A run whose Checkpointer a kept traceback holds has ended: the next run of the same
    process takes its lock over (and the first one's finalizer leaves it)."""
    from sarc.checkpoint import Checkpointer
    cfg = CheckpointConfig(str(tmp_path / "ckpt"))
    earlier = Checkpointer(cfg, {"seed": 0}, log=None)
    earlier.load()
    later = Checkpointer(cfg, {"seed": 0}, log=None)
    assert later.load() is None
    del earlier   # its finalizer must not drop the lock the later run holds
    code = ("import sys; from sarc.checkpoint import *; "
            "Checkpointer(CheckpointConfig(sys.argv[1]), {}, log=None).load()")
    proc = subprocess.run([sys.executable, "-c", code, cfg.directory], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert "is in use by another run" in proc.stderr, proc.stderr


@case("checkpoint", "`--checkpoint DIR` that holds files of the user's named like epoch "
                    "files (`epoch-1.rank-0.pt`)", "nothing-lost")
def test_a_run_removes_only_the_files_it_names_itself(tmp_path):
    """Leftovers are the files sarc writes, named as it names them (epochs of six digits
    or more, no padded rank): a file of the user's that only looks like one stays."""
    from sarc.checkpoint import Checkpointer
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    mine = ["epoch-1.rank-0.pt", "epoch-0000002.rank-0.pt", "epoch-000002.rank-01.pt",
            "epoch-000002.rank-0.pt.bak", ".epoch-1.rank-0.pt.ab_c1234.tmp",
            ".checkpoint.json.mine.tmp", "notes.txt"]
    for name in mine:
        (ckpt / name).write_text(name)
    leftovers = ["epoch-000002.rank-1.pt", "epoch-1000000.rank-0.pt",
                 ".epoch-000002.rank-0.pt.ab_c1234.tmp", ".checkpoint.json.x1y2z3w4.tmp"]
    for name in leftovers:
        (ckpt / name).write_text("a dead run's")
    cp = Checkpointer(CheckpointConfig(str(ckpt)), {"seed": 0}, log=None)
    assert cp.load() is None
    assert sorted(f.name for f in ckpt.iterdir()) == sorted(mine)
    cp.save(1, {"x": torch.ones(1)})
    assert sorted(f.name for f in ckpt.iterdir()) == sorted(
        mine + [MANIFEST, "epoch-000001.rank-0.pt"])
    assert all((ckpt / n).read_text() == n for n in mine)


HELPER = """\
from torch import nn
import torch.nn.functional as F
import sarc


class L(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h)

    def reduce(self, msg):
        return sarc.mean(msg.m)


class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.a, self.b = L(i, 16), L(16, c)

    def forward(self, g, x):
        return self.b(g, F.relu(self.a(g, x)))
"""


@case("checkpoint", "`--resume`, or `load_trained` of a `--save` file, after a module the "
                    "model file imports from its folder changed", "error")
def test_resume_and_load_trained_see_a_changed_helper_module(tmp_path):
    """Only the model file's sha256 was recorded: a helper's reduce changed from mean to
    sum resumed silently, another model from the old one's weights (and load_trained
    predicted with it)."""
    (tmp_path / "helper.py").write_text(HELPER)
    model = tmp_path / "model.py"
    model.write_text("from helper import Net\n\n\ndef build_model(in_feats, num_classes, **_):\n"
                     "    return Net(in_feats, num_classes)\n")
    ckpt, saved = tmp_path / "ck", tmp_path / "model.pt"
    _ok(_train(ckpt, "--save", saved, model=model))
    (tmp_path / "helper.py").write_text(HELPER.replace("sarc.mean(", "sarc.sum("))
    assert_error(_train(ckpt, "--resume", model=model), "a checkpoint of another run",
                 "a module the model file imports differs (helper.py: changed")
    try:
        with pytest.raises(CheckpointError, match=r"model.pt was trained with helper.py as it "
                                                  r"was then: it has changed since"):
            sarc.load_trained(saved, model)
        assert isinstance(sarc.load_trained(saved, model, check_digest=False), torch.nn.Module)
    finally:
        sys.modules.pop("helper", None)   # this test's, imported by name in this process


@case("checkpoint", "`--resume` into a model whose parameters' shapes differ from the "
                    "checkpoint's (the model reads what the run record does not hold: an "
                    "environment variable)", "error")
def test_resume_into_a_model_of_other_shapes_is_an_error_naming_the_checkpoint(tmp_path,
                                                                              monkeypatch):
    """It was a raw traceback (load_state_dict's RuntimeError), where load_trained of the
    same weights says they do not fit."""
    model = tmp_path / "model.py"
    model.write_text(GCN.read_text().replace(
        "return GCN(in_feats, hidden, num_classes, dropout)",
        'import os; return GCN(in_feats, int(os.environ.get("WIDTH", hidden)), num_classes, '
        'dropout)'))
    ckpt, saved = tmp_path / "ck", tmp_path / "model.pt"
    _ok(_train(ckpt, "--save", saved, model=model, env={**os.environ, "WIDTH": "16"}))
    before = _snapshot(ckpt)
    proc = _train(ckpt, "--resume", "--epochs", "8", model=model, env={**os.environ, "WIDTH": "8"})
    assert_error(proc, str(ckpt), "does not fit the model", "size mismatch for conv1.bias",
                 "and 2 more")
    assert _snapshot(ckpt) == before
    monkeypatch.setenv("WIDTH", "8")
    with pytest.raises(CheckpointError, match="the weights do not fit .* size mismatch for "):
        sarc.load_trained(saved, model)


def test_restoring_the_random_state_is_what_makes_resume_exact(tmp_path, monkeypatch):
    """The exactness above is not vacuous: resuming with the right weights and optimizer
    but another random state (dropout masks) gives other weights."""
    spec = load_model_file(GCN)

    def run(directory, epochs, resume=False):
        train(spec, "cora", epochs=epochs, log=None,
              checkpoint=CheckpointConfig(str(directory), every=2, resume=resume))
        return _final_files(directory)

    whole = run(tmp_path / "whole", 4)["epoch-000004.rank-0.pt"]
    run(tmp_path / "resumed", 2)
    torch.manual_seed(1234)  # the resumed run must not depend on the state it starts in
    resumed = run(tmp_path / "resumed", 4, resume=True)["epoch-000004.rank-0.pt"]
    _same_training_state(resumed, whole)

    run(tmp_path / "no_rng", 2)
    monkeypatch.setattr("sarc.checkpoint.set_rng_state", lambda state: None)
    torch.manual_seed(1234)
    other = run(tmp_path / "no_rng", 4, resume=True)["epoch-000004.rank-0.pt"]
    assert not all(torch.equal(other["model"][k], whole["model"][k]) for k in whole["model"])


@case("checkpoint", "a worker of `--workers 2 --max-restarts 1` killed (SIGKILL) mid-run",
      "exact")
def test_distributed_resume_after_a_killed_worker(tmp_path):
    parts = tmp_path / "parts"
    _ok(run_sarc("partition", "--dataset", "cora", "--parts", "2", "--out", parts))
    common = ("--workers", "2", "--partition", parts, "--timeout", "30")
    _ok(_train(tmp_path / "ref", *common, "--save", tmp_path / "ref.pt"))
    proc = _ok(_train(tmp_path / "ckpt", *common, "--max-restarts", "1", "--save",
                      tmp_path / "model.pt", env={"SARC_TEST_KILL_AT": "1:5"}))
    # the survivor may report its peer's death or be stopped by torchrun first: either way
    # the workers restart and resume from epoch 4's checkpoint
    assert "resuming from" in proc.stdout and "epoch 4 done" in proc.stdout
    mine, theirs = _final_files(tmp_path / "ckpt"), _final_files(tmp_path / "ref")
    assert sorted(mine) == sorted(theirs) == ["epoch-000006.rank-0.pt", "epoch-000006.rank-1.pt"]
    for name in mine:  # each worker's weights, optimizer and own random states
        _same_training_state(mine[name], theirs[name])
    assert not torch.equal(mine["epoch-000006.rank-0.pt"]["rng"]["torch"],
                           mine["epoch-000006.rank-1.pt"]["rng"]["torch"])
    _assert_equal(_load(tmp_path / "model.pt")["state_dict"],
                  _load(tmp_path / "ref.pt")["state_dict"])


def test_distributed_minibatch_resume_equals_an_uninterrupted_run(tmp_path):
    """``--resume`` of a ``--workers 2 --mode mfg`` run: the launcher's check records the
    mode as the workers do (it refused every such resume as another run's checkpoint)."""
    parts = tmp_path / "parts"
    _ok(run_sarc("partition", "--dataset", "cora", "--parts", "2", "--out", parts))
    common = ("--threads", "1", "--workers", "2", "--partition", parts, "--timeout", "30",
              "--mode", "mfg", "--batch-size", "512", "--checkpoint-every", "1")
    _ok(run_sarc("train", GCN, "--epochs", "3", *common, "--checkpoint", tmp_path / "ref",
                 "--save", tmp_path / "ref.pt"))
    _ok(run_sarc("train", GCN, "--epochs", "2", *common, "--checkpoint", tmp_path / "ckpt"))
    proc = _ok(run_sarc("train", GCN, "--epochs", "3", *common, "--checkpoint",
                        tmp_path / "ckpt", "--resume", "--save", tmp_path / "model.pt"))
    assert "resuming from" in proc.stdout
    _assert_equal(_load(tmp_path / "model.pt")["state_dict"],
                  _load(tmp_path / "ref.pt")["state_dict"])


# --- a kill during a save -----------------------------------------------------------------

KILL_DURING_SAVE = r"""
import os, signal, sys, tempfile
from pathlib import Path

moment, ckpt = sys.argv[1], Path(sys.argv[2])
target = "epoch-000004.rank-0.pt"
real = {"replace": os.replace, "fsync": os.fsync, "unlink": os.unlink, "mkstemp": tempfile.mkstemp}
last_temp = []

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def mkstemp(*a, **kw):
    fd, name = real["mkstemp"](*a, **kw)
    last_temp.append(Path(name).name)
    return fd, name

def fsync(fd):
    if moment == "write" and last_temp and last_temp[-1].startswith("." + target):
        os.ftruncate(fd, os.fstat(fd).st_size // 2)  # half of the file reached the disk
        die()
    return real["fsync"](fd)

def replace(src, dst):
    if moment == "rename" and Path(dst).name == target:
        die()
    if moment == "manifest" and Path(dst).name == "checkpoint.json" and (ckpt / target).exists():
        die()
    return real["replace"](src, dst)

def unlink(path, *a, **kw):
    if moment == "cleanup" and Path(path).name == "epoch-000002.rank-0.pt":
        die()
    return real["unlink"](path, *a, **kw)

os.replace, os.fsync, os.unlink, tempfile.mkstemp = replace, fsync, unlink, mkstemp
from sarc.cli import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("moment, published", [("write", 2), ("rename", 2), ("manifest", 2),
                                               ("cleanup", 4)])
@case("checkpoint", "the process killed while it writes, renames, publishes or cleans up "
                    "a checkpoint", "old-or-new")
def test_a_kill_during_a_save_leaves_a_loadable_checkpoint(tmp_path, reference, moment, published):
    ckpt = tmp_path / "ckpt"
    argv = ["train", str(GCN), *RUN, "--checkpoint", str(ckpt)]
    proc = run_or_show_stacks([sys.executable, "-c", KILL_DURING_SAVE, moment, str(ckpt), *argv],
                              cwd=ROOT, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    # the manifest names the previous checkpoint (or, once published, the new one): whole
    assert json.loads((ckpt / MANIFEST).read_text())["epoch"] == published
    (name, state), = _final_files(ckpt).items()
    assert name == f"epoch-{published:06d}.rank-0.pt" and state["epoch"] == published
    leftovers = {"write": ".epoch-000004", "rename": ".epoch-000004", "manifest": "epoch-000004",
                 "cleanup": "epoch-000002"}[moment]
    assert any(f.name.startswith(leftovers) for f in ckpt.iterdir())
    # the next run resumes from it, removes the leftovers and ends where an uninterrupted one does
    _ok(_train(ckpt, "--resume"))
    assert sorted(f.name for f in ckpt.iterdir()) == [MANIFEST, "epoch-000006.rank-0.pt"]
    _same_training_state(_final_files(ckpt)["epoch-000006.rank-0.pt"],
                         _final_files(reference[0])["epoch-000006.rank-0.pt"])


# --- refusals -----------------------------------------------------------------------------

def _snapshot(directory: Path) -> dict:
    return {f.name: f.read_bytes() for f in directory.iterdir()}


@case("checkpoint", "`--resume` of a checkpoint another model file wrote", "error")
def test_resume_refuses_another_models_checkpoint(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    before = _snapshot(ckpt)
    proc = run_sarc("train", GAT, *RUN, "--checkpoint", ckpt, "--resume")
    assert_error(proc, "is a checkpoint of another run", "the model file differs", "gcn.py",
                 "gat.py")
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume` with other hyperparameters (`--set hidden=32`)", "error")
def test_resume_refuses_other_hyperparameters(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    proc = run_sarc("train", GCN, *RUN, "--checkpoint", ckpt, "--resume", "--set", "hidden=32")
    assert_error(proc, "hyperparameters differ (hidden: 16 in the checkpoint, 32 now)")


@case("checkpoint", "HPARAMS holding a function (`act: F.elu`): `--resume`, `--save` and "
                     "`sarc.load_trained`", "exact")
def test_a_function_among_the_hyperparameters_resumes_and_loads(tmp_path):
    """Recorded by its name, not its repr (whose address differs in every process: a resume
    was always refused), and loaded as the model file's own function, not that string."""
    model = tmp_path / "gcn_elu.py"
    model.write_text(GCN.read_text().replace('    "norm_features": True,\n}',
                                             '    "norm_features": True,\n    "act": F.elu,\n}')
                     .replace("                **_) -> nn.Module:",
                              "                act=F.relu, **_) -> nn.Module:")
                     .replace("return GCN(in_feats, hidden, num_classes, dropout)",
                              "return GCN(in_feats, hidden, num_classes, dropout, act)")
                     .replace("dropout: float = 0.5):", "dropout: float = 0.5, act=F.relu):")
                     .replace("        self.dropout = dropout\n",
                              "        self.dropout = dropout\n        self.act = act\n")
                     .replace("x = F.relu(self.conv1(g, x))", "x = self.act(self.conv1(g, x))"))
    ckpt = tmp_path / "ckpt"
    _ok(run_sarc("train", model, "--epochs", "2", "--checkpoint", ckpt, "--threads", "1"))
    _ok(run_sarc("train", model, "--epochs", "3", "--checkpoint", ckpt, "--resume",
                 "--threads", "1", "--save", tmp_path / "m.pt"))
    loaded = sarc.load_trained(tmp_path / "m.pt", model)
    assert loaded.act is torch.nn.functional.elu


@case("checkpoint", "`--save` of a run on an `.npz` copy of a dataset (named as the "
                     "original inside)", "exact")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_saved_model_records_where_its_npz_dataset_is(tmp_path, workers):
    """``load_dataset(saved["dataset"])`` (README's recipe) reads the file trained on, not the
    embedded dataset its arrays' name names, on one process and on workers alike."""
    import numpy as np
    from sarc.checkpoint import read_saved
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["label"] = np.random.default_rng(0).permutation(data["label"])
    relabeled = tmp_path / "cora_relabeled.npz"
    np.savez(relabeled, **data)
    _ok(run_sarc("train", GCN, "--epochs", "1", "--dataset", relabeled, "--save",
                 tmp_path / "m.pt", "--workers", workers, "--threads", "1"))
    again = load_dataset(read_saved(tmp_path / "m.pt")["dataset"])
    assert torch.equal(again.label, torch.from_numpy(data["label"]).to(torch.int64))


@case("checkpoint", "`--save` of a run on a set `sarc partition --dataset COPY.npz` wrote "
                     "(named as the original inside), with and without `--dataset`", "exact")
@pytest.mark.parametrize("given", [True, False], ids=["dataset", "no-dataset"])
def test_saved_model_of_a_partition_records_where_its_npz_dataset_is(tmp_path, given):
    """The set recorded the arrays' name ("cora") and the workers recorded it: the saved
    model then named the embedded Cora, not the relabeled file it was trained on. The set
    now records the file's absolute path, and so do the workers."""
    import numpy as np
    from sarc.checkpoint import read_saved
    from sarc.partition import load_partitions
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["label"] = np.random.default_rng(0).permutation(data["label"])
    relabeled = tmp_path / "cora_relabeled.npz"
    np.savez(relabeled, **data)
    parts = tmp_path / "parts"
    _ok(run_sarc("partition", "--dataset", relabeled, "--parts", "2", "--method", "random",
                 "--out", parts))
    assert load_partitions(parts).dataset == str(relabeled.resolve())
    _ok(run_sarc("train", GCN, "--epochs", "1", *(["--dataset", relabeled] if given else []),
                 "--partition", parts, "--save", tmp_path / "m.pt", "--workers", "2",
                 "--threads", "1"))
    saved = read_saved(tmp_path / "m.pt")["dataset"]
    assert saved == str(relabeled.resolve())
    again = load_dataset(saved)
    assert torch.equal(again.label, torch.from_numpy(data["label"]).to(torch.int64))


@case("checkpoint", "a manifest naming a file outside its directory (`../stolen.pt`)", "error")
def test_manifest_files_stay_in_the_checkpoint_directory(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    meta = json.loads((ckpt / MANIFEST).read_text())
    (ckpt / meta["files"][0]["file"]).rename(tmp_path / "stolen.pt")
    meta["files"][0]["file"] = "../stolen.pt"
    (ckpt / MANIFEST).write_text(json.dumps(meta))
    proc = run_sarc("train", GCN, *RUN, "--checkpoint", ckpt, "--resume")
    assert_error(proc, "corrupt manifest", "../stolen.pt")


@case("checkpoint", "a manifest whose `run` section is of another type (a list; hparams an "
                     "int, a list, text that is not JSON)", "error")
@pytest.mark.parametrize("run", [[1, 2], {"hparams": 3}, {"hparams": "[1]"},
                                 {"hparams": "not json"}])
def test_manifest_run_of_another_type_is_corrupt(tmp_path, reference, run):
    """Each was a traceback (TypeError, JSONDecodeError, AttributeError)."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    meta = json.loads((ckpt / MANIFEST).read_text())
    meta["run"] = run if isinstance(run, list) else {**meta["run"], **run}
    (ckpt / MANIFEST).write_text(json.dumps(meta))
    assert_error(run_sarc("train", GCN, *RUN, "--checkpoint", ckpt, "--resume"),
                 "corrupt manifest (its run:")


@case("checkpoint", "`--resume` on a dataset with the same graph but other labels", "error")
def test_resume_refuses_the_same_graph_with_other_node_data(tmp_path, reference):
    """Cora's edges with its labels permuted: the graph fingerprint alone took it for Cora."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["label"] = np.random.default_rng(0).permutation(data["label"])
    relabeled = tmp_path / "cora_relabeled.npz"
    np.savez(relabeled, **data)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    before = _snapshot(ckpt)
    proc = run_sarc("train", GCN, *RUN, "--checkpoint", ckpt, "--resume", "--dataset", relabeled)
    assert_error(proc, "is a checkpoint of another run", "the dataset differs", "label")
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume` on a dataset with the same graph and node data but other "
                    "edge types or edge weights", "error")
@pytest.mark.parametrize("change, named", [("etype", "edge:etype"),
                                           ("edge_weight", "edge:edge_weight"),
                                           ("no edge_weight", "edge:edge_weight")])
def test_resume_refuses_the_same_graph_with_other_edge_data(tmp_path, change, named):
    """A model reads edge types (R-GCN) and edge weights (--prob, an edge feature): a
    dataset whose edge data differ is another run's, as one whose labels do."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    e = len(data["edge_src"])
    data.update(etype=np.arange(e) % 2, num_etypes=np.int64(2),
                edge_weight=np.linspace(0.5, 1, e).astype(np.float32))
    first, other = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(first, **data)
    if change == "no edge_weight":
        del data["edge_weight"]
    else:
        data[change] = data[change][::-1].copy()
    np.savez(other, **data)
    ckpt = tmp_path / "ckpt"
    short = ("--epochs", "2", "--threads", "1")
    assert run_sarc("train", GCN, *short, "--checkpoint", ckpt, "--dataset", first
                    ).returncode == 0
    before = _snapshot(ckpt)
    proc = run_sarc("train", GCN, *short, "--checkpoint", ckpt, "--resume", "--dataset", other)
    assert_error(proc, "is a checkpoint of another run", "the dataset differs", named)
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume` with another `--eval-every` (the epochs model selection sees)",
      "error")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_resume_refuses_another_eval_every(tmp_path, workers):
    """Which epochs are evaluated decides the selected epoch and early stopping: a resumed
    run with another period equals no uninterrupted run."""
    ckpt = tmp_path / "ckpt"
    more = ("--workers", "2", "--method", "random") if workers == "2" else ()
    _ok(run_sarc("train", GCN, "--epochs", "2", "--checkpoint-every", "2", "--threads", "1",
                 "--checkpoint", ckpt, "--eval-every", "2", *more))
    before = _snapshot(ckpt)
    proc = run_sarc("train", GCN, "--epochs", "4", "--checkpoint-every", "2", "--threads", "1",
                    "--checkpoint", ckpt, "--resume", *more)
    assert_error(proc, "is a checkpoint of another run",
                 "--eval-every differs (2 in the checkpoint, 1 now)")
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume` of workers' checkpoint with `--baseline` added or dropped",
      "error")
@pytest.mark.parametrize("first, then", [((), ("--baseline",)), (("--baseline",), ())],
                         ids=["added", "dropped"])
def test_resume_refuses_another_baseline(tmp_path, first, then):
    """The baseline schedule sums the exchanged rows in another order (about 3e-7 apart):
    a run resumed with it added or dropped equalled no uninterrupted run, and was taken."""
    ckpt = tmp_path / "ckpt"
    run = ("--checkpoint-every", "2", "--threads", "1", "--checkpoint", ckpt, "--workers", "2",
           "--method", "random")
    _ok(run_sarc("train", GCN, "--epochs", "2", *run, *first))
    before = _snapshot(ckpt)
    proc = run_sarc("train", GCN, "--epochs", "4", *run, "--resume", *then)
    err = assert_error(proc, "is a checkpoint of another run", "--baseline differs ("
                       + ("given" if first else "not given") + " in the checkpoint")
    assert "sarc worker" not in err  # refused before any worker started
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume --workers 2` of a single-process checkpoint", "error")
def test_distributed_resume_refuses_another_world_size(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    proc = run_sarc("train", GCN, *RUN, "--checkpoint", ckpt, "--resume", "--workers", "2",
                    "--method", "random")
    err = assert_error(proc, "the world size differs (1 in the checkpoint, 2 now)")
    assert "sarc worker" not in err  # refused before any worker started


@case("checkpoint", "`--checkpoint DIR` without `--resume` where DIR holds a checkpoint",
      "nothing-lost")
def test_a_checkpoint_is_not_overwritten_without_resume(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    before = _snapshot(ckpt)
    assert_error(_train(ckpt), "holds a checkpoint (epoch 6); pass --resume")
    assert _snapshot(ckpt) == before


@case("checkpoint", "a run that fails before its first checkpoint (its layer refused at "
      "the first trace)", "error")
@pytest.mark.parametrize("made", [False, True], ids=["new_dir", "users_dir"])
def test_a_run_failing_before_its_first_checkpoint_leaves_no_directory(tmp_path, made):
    """The directory a failed run created goes (nothing of the run is in it); one the user
    made stays."""
    model = tmp_path / "bad.py"
    text = GCN.read_text()
    assert "src.h" in text
    model.write_text(text.replace("src.h", "src.missing", 1))
    ckpt = tmp_path / "ckpt"
    if made:
        ckpt.mkdir()
    assert_error(_train(ckpt, model=model), "missing")
    assert ckpt.exists() == made
    assert not made or not any(ckpt.iterdir())


@case("checkpoint", "`--resume` where a checkpoint file's bytes changed", "error")
def test_a_corrupt_checkpoint_file_is_refused(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    f = ckpt / "epoch-000006.rank-0.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    assert_error(_train(ckpt, "--resume"), "epoch-000006.rank-0.pt: corrupt")


@case("checkpoint", "`--resume` where a checkpoint file lacks a field or holds one of another "
                     "type (its sha256 in the manifest matching)", "error")
@pytest.mark.parametrize("field,value,needle", [
    ("rng", None, "lacks rng"), ("last", None, "lacks last"), ("optimizer", None, "lacks optimizer"),
    ("last", {"acc": {}}, "lacks last.loss"), ("stopped_early", "no", "stopped_early must be"),
    ("model", [1, 2], "model must be an object")])
def test_a_checkpoint_file_lacking_a_field_is_refused(tmp_path, reference, field, value, needle):
    """A file of another sarc, or written by hand: a KeyError or TypeError traceback before."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    f = ckpt / "epoch-000006.rank-0.pt"
    state = _load(f)
    if value is None:
        del state[field]
    else:
        state[field] = value
    torch.save(state, f)
    meta = json.loads((ckpt / MANIFEST).read_text())
    meta["files"][0]["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
    (ckpt / MANIFEST).write_text(json.dumps(meta))
    before = _snapshot(ckpt)
    assert_error(_train(ckpt, "--resume"), f"{f}: corrupt checkpoint", needle)
    assert _snapshot(ckpt) == before


@case("checkpoint", "`--resume` where DIR holds no checkpoint yet", "exact")
def test_resume_without_a_checkpoint_starts_fresh(tmp_path, reference):
    proc = _ok(_train(tmp_path / "ckpt", "--resume"))
    assert f"--resume: no checkpoint in {tmp_path / 'ckpt'}; starting at epoch 1" in proc.stdout
    _same_training_state(_final_files(tmp_path / "ckpt")["epoch-000006.rank-0.pt"],
                         _final_files(reference[0])["epoch-000006.rank-0.pt"])


@case("checkpoint", "`--resume` without `--checkpoint`, `--checkpoint-every 0`", "error")
def test_checkpoint_options_are_checked(tmp_path):
    assert_error(run_sarc("train", GCN, "--resume"), "--resume needs --checkpoint DIR")
    assert_error(run_sarc("train", GCN, "--checkpoint", tmp_path, "--checkpoint-every", "0"),
                 "--checkpoint-every must be at least 1, got 0")
    assert_error(run_sarc("train", GCN, "--checkpoint", ""), "--checkpoint names no directory")
    assert not any(tmp_path.iterdir())


@case("checkpoint", "`--checkpoint DIR` inside a set sarc wrote (a `sarc partition` or "
                     "`sarc compile --out` set) or inside the `--partition` directory",
      "nothing-lost")
def test_a_checkpoint_directory_inside_a_set_is_refused(tmp_path):
    """The run wrote its checkpoint into the set, which sarc then refused to replace (it held
    files sarc did not write there)."""
    parts = tmp_path / "parts"
    _ok(run_sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                 "--out", parts))
    before = sorted(p.name for p in parts.iterdir())
    for ckpt in (parts, parts / "ckpt"):
        assert_error(run_sarc("train", GCN, "--epochs", "1", "--checkpoint", ckpt),
                     f"--checkpoint {ckpt} is inside a set sarc wrote")
    assert_error(run_sarc("train", GCN, "--epochs", "1", "--workers", "2", "--partition", parts,
                          "--checkpoint", parts / "ckpt"), "is inside the --partition directory")
    assert sorted(p.name for p in parts.iterdir()) == before


# --- the files, and a saved model for inference -------------------------------------------

@case("checkpoint", "every checkpoint and saved-model file opened with "
                    "`torch.load(weights_only=True)`", "exact")
def test_every_file_loads_with_weights_only(tmp_path):
    spec = load_model_file(GCN)
    result = train(spec, "cora", epochs=5, log=None, save=str(tmp_path / "model.pt"),
                   checkpoint=CheckpointConfig(str(tmp_path / "ckpt"), every=2))
    files = sorted(tmp_path.rglob("*.pt"))
    assert [f.name for f in files] == ["epoch-000005.rank-0.pt", "model.pt"]
    state, saved = (torch.load(f, weights_only=True) for f in files)
    selected = result["module"].state_dict()
    _assert_equal(saved["state_dict"], selected)
    _assert_equal(state["selection"]["best"]["state"], selected)
    assert state["run"]["model_sha256"] == saved["model_sha256"] == hashlib.sha256(
        GCN.read_bytes()).hexdigest()
    assert (state["epoch"], saved["metrics"]["epoch"]) == (5, result["best_epoch"])
    assert json.loads(saved["hparams"])["hidden"] == 16 and saved["dataset"] == "cora"


@case("checkpoint", "a `--save` model loaded with `sarc.load_trained` for inference", "exact")
def test_a_saved_model_gives_the_same_test_accuracy(tmp_path):
    model_file = tmp_path / "model.pt"
    _ok(run_sarc("train", GCN, "--epochs", "6", "--threads", "1", "--save", model_file,
                 "--json", tmp_path / "r.json"))  # no --checkpoint, so no --checkpoint-every
    result = json.loads((tmp_path / "r.json").read_text())
    model = sarc.load_trained(model_file, GCN)
    assert not model.training
    saved = read_saved(model_file)
    prep = prepare(load_dataset(saved["dataset"]), saved["hparams"])
    with torch.no_grad():
        logits = model(prep.graph, prep.x)
    test = prep.masks["test"]
    acc = int((logits.argmax(1)[test] == prep.label[test]).sum()) / int(test.sum())
    assert acc == result["test_acc"] == saved["metrics"]["test_acc"]
    assert saved["metrics"]["epoch"] == result["best_epoch"]
    with torch.no_grad():  # the same outputs, loaded twice
        _assert_equal(sarc.load_trained(model_file, GCN)(prep.graph, prep.x), logits)


# --- units ----------------------------------------------------------------------------------

def test_load_trained_refuses_an_edited_model_file(tmp_path):
    copy = tmp_path / "gcn.py"
    shutil.copy(GCN, copy)
    train(load_model_file(copy), "cora", epochs=2, log=None, save=str(tmp_path / "m.pt"))
    copy.write_text(copy.read_text() + "\n# edited\n")
    with pytest.raises(CheckpointError, match=r"m.pt was trained from .*gcn.py \(sha256 .*differs"):
        sarc.load_trained(tmp_path / "m.pt", copy)
    assert not sarc.load_trained(tmp_path / "m.pt", copy, check_digest=False).training
    with pytest.raises(CheckpointError, match="no saved model here"):
        sarc.load_trained(tmp_path / "missing.pt", copy)



_SAVED = {"format": "sarc-model", "version": 1, "model": "gcn.py",
          "model_sha256": hashlib.sha256(GCN.read_bytes()).hexdigest(), "dataset": "cora",
          "hparams": "{}", "metrics": {}, "state_dict": {},
          "sizes": {"in_feats": 5, "num_classes": 3, "num_nodes": 10, "num_etypes": 0}}
_ABSENT = object()


@case("checkpoint", "a file tagged as a saved model whose fields are missing or of the wrong "
      "type (`hparams` a list, `state_dict` not tensors, a negative size), to `load_trained`",
      "error")
@pytest.mark.parametrize("change, message", [
    ({"hparams": _ABSENT}, "lacks hparams"),
    ({"hparams": 7}, "hparams must be a JSON object in a string, got 7"),
    ({"hparams": "{oops"}, "hparams is not JSON"),
    ({"hparams": "[1]"}, r"hparams must be a JSON object, got \[1\]"),
    ({"model_sha256": None}, "model_sha256 must be a sha256 hex digest, got None"),
    ({"state_dict": [1]}, r"state_dict must be a dict of named tensors, got \[1\]"),
    ({"state_dict": {"w": 1.0}}, "state_dict must be a dict of named tensors"),
    ({"sizes": {}}, "lacks sizes.in_feats"),
    ({"sizes": {**_SAVED["sizes"], "in_feats": -5}}, "sizes.in_feats must be a non-negative "
                                                     "integer, got -5"),
    ({"sizes": {**_SAVED["sizes"], "num_ntypes": "2"}}, "sizes.num_ntypes must be"),
    ({"dataset": 3}, "dataset must be a string, got 3"),
])
def test_a_damaged_saved_model_names_the_field(tmp_path, change, message):
    path = tmp_path / "m.pt"
    torch.save({k: v for k, v in {**_SAVED, **change}.items() if v is not _ABSENT}, path)
    with pytest.raises(CheckpointError, match=r"m\.pt: corrupt saved model.*" + message):
        sarc.load_trained(path, GCN)

def test_random_states_round_trip_as_plain_data():
    import random

    import numpy as np
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    random.gauss(0, 1)  # a cached Gaussian in Python's state
    state = rng_state()
    check_plain(state)
    draws = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand())
    torch.manual_seed(9), random.seed(9), np.random.seed(9)
    set_rng_state(state)
    again = (torch.rand(3), random.random(), random.gauss(0, 1), np.random.rand())
    assert torch.equal(draws[0], again[0]) and draws[1:] == again[1:]


def test_check_plain_names_what_is_not_plain():
    check_plain({"a": [torch.zeros(1), 1, 2.0, "x", None, True, (1, 2)]})
    with pytest.raises(TypeError, match=r"checkpoint\['a'\]\[1\]: a \w*Path, not plain data"):
        check_plain({"a": [1, Path(".")]})


class _NotPlainData:
    pass


@case("checkpoint", "a `.pt` file holding a Python object (a pickled class), given to "
      "`load_trained`", "error")
def test_a_file_of_python_objects_is_refused_without_advice_to_run_it(tmp_path):
    """torch's refusal goes on to say how to load such a file anyway (running its code);
    sarc's says what the file is, and nothing of the sort."""
    path = tmp_path / "m.pt"
    torch.save({"format": "sarc-model", "obj": _NotPlainData()}, path)
    with pytest.raises(CheckpointError) as info:
        sarc.load_trained(path, GCN)
    text = str(info.value)
    assert "m.pt: not a sarc checkpoint file: it holds Python objects" in text, text
    assert "weights_only" not in text and "trust" not in text and "\x1b" not in text, text


@case("checkpoint", "a JSON file (a checkpoint's manifest), a text file or an empty file "
      "given to `load_trained`", "error")
@pytest.mark.parametrize("content,says", [
    (b'{"format": "sarc-checkpoint"}', "not a file torch.save wrote (it begins b'{\"format': JSON)"),
    (b"hello\n", "not a file torch.save wrote (it begins b'hello\\n': another format)"),
    (b"", "the file is empty")])
def test_a_file_torch_save_did_not_write_is_named_as_such(tmp_path, content, says):
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        sarc.load_trained(path, GCN)
    assert str(info.value) == f"{path}: not a sarc checkpoint file: {says}"


def test_node_data_compared_only_where_both_runs_recorded_it():
    """A checkpoint of an older sarc (or a partition set without digests) records no node
    data: it is not a difference; recorded digests that differ are."""
    from sarc.checkpoint import run_differences
    base = {"model_sha256": "m", "hparams": "{}", "seed": 0, "graph": "g", "world_size": 1,
            "partition": "", "dataset": "cora", "model": "gcn.py"}
    now = {**base, "node_data": {"feat": "a", "label": "b"}}
    assert run_differences(dict(base), now) == []
    assert run_differences({**base, "node_data": {}}, now) == []
    diff = run_differences({**base, "node_data": {"feat": "a", "label": "c"}}, now)
    assert len(diff) == 1 and "label" in diff[0] and "feat" not in diff[0], diff
    assert run_differences({**base, "eval_every": 3}, now) == []   # a period one side lacks


@case("checkpoint", "`--checkpoint DIR` holding a directory or a link named as a checkpoint's "
                    "file (`checkpoint.json`, `epoch-000007.rank-0.pt`)", "error")
@pytest.mark.parametrize("entry", ["checkpoint.json", "epoch-000007.rank-0.pt", "link"])
def test_entries_in_the_way_of_a_checkpoints_files_are_refused_before_training(tmp_path, entry):
    """A directory named as an old epoch's file was a traceback (its removal); one named as
    the manifest failed the first save, after training; a link would have been written
    through, outside DIR."""
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    if entry == "link":
        entry = "epoch-000001.rank-0.pt"
        (ckpt / entry).symlink_to(tmp_path / "elsewhere.pt")
    else:
        (ckpt / entry).mkdir()
    proc = _train(ckpt)
    assert_error(proc, str(ckpt / entry), "is not a file")
    assert "epoch" not in proc.stdout
    assert not (tmp_path / "elsewhere.pt").exists()


@case("checkpoint", "a manifest whose epoch is `1e400` (past any integer)", "error")
def test_a_manifest_epoch_past_any_integer_is_corrupt(tmp_path, reference):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    manifest = ckpt / MANIFEST
    manifest.write_text(re.sub(r'"epoch": \d+', '"epoch": 1e400', manifest.read_text()))
    assert_error(_train(ckpt, "--resume"), "corrupt manifest (OverflowError")


@case("checkpoint", "a checkpoint edited by hand, its manifest's digest made to match: a "
                    "selection state of another form, an optimizer state of other groups",
      "error")
@pytest.mark.parametrize("part", ["selection", "optimizer"])
def test_a_hand_edited_state_that_does_not_fit_is_refused_naming_it(tmp_path, reference, part):
    """The selection's was a KeyError traceback, the optimizer's a ValueError one."""
    from sarc.checkpoint import serialize
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    path = ckpt / manifest["files"][0]["file"]
    state = _load(path)
    if part == "selection":
        state["selection"] = {}
    else:
        state["optimizer"]["param_groups"] = state["optimizer"]["param_groups"] * 2
    data = serialize(state)
    path.write_bytes(data)
    manifest["files"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    assert_error(_train(ckpt, "--resume"), str(ckpt), f"the checkpoint's {part} state does not "
                                                      f"fit the run")


@case("checkpoint", "`--checkpoint DIR` holding a checkpoint's epoch files without its "
      "`checkpoint.json`", "old-or-new")
def test_epoch_files_no_manifest_names_are_removed_saying_so(tmp_path):
    """Sarc resumes from no checkpoint its manifest does not name (one left unfinished, or
    whose manifest was removed) and removes its files: it did so without a word."""
    ckpt = tmp_path / "ckpt"
    _ok(_train(ckpt))
    (ckpt / MANIFEST).unlink()
    epochs = sorted(f.name for f in ckpt.iterdir())
    assert epochs and all(f.startswith("epoch-") for f in epochs)
    proc = _ok(_train(ckpt, "--resume"))
    assert re.search(r"ckpt: removed the files of epoch \d+, which checkpoint\.json does not "
                     r"name \(there is none\): a checkpoint left unfinished", proc.stdout), \
        proc.stdout
    assert "no checkpoint" in proc.stdout
    assert proc.stdout.count("removed the files") == 1   # not at each save's replacement
