"""The agent (``sarc.distributed.agent``, torchrun as ``sarc train`` runs it): whichever
way torchrun ends, once ``sarc train`` is gone the agent removes the run's directory,
since nobody else is left to.

torchrun itself is replaced by a stand-in that ends one way or another; "``sarc train``
is gone" is the agent's parent pid changing while torchrun runs (the agent was adopted).
"""
from __future__ import annotations

import os
import signal

import pytest
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from sarc.distributed import agent
from sarc.distributed.supervise import FAILURES, PARENT_ENV, RUN_DIR_ENV


def _failed(tmp_path):
    failure = ProcessFailure(local_rank=0, pid=123, exitcode=-signal.SIGTERM,
                             error_file=str(tmp_path / "no-error-file"))
    return ChildFailedError("worker", {0: failure})


SARC_TRAIN = 4242  # the agent's parent while sarc train lives; init (1) adopts it after

ENDINGS = {
    "returns": lambda tmp: None,
    "its workers failed": lambda tmp: _failed(tmp),
    "it was signalled": lambda tmp: SignalException("SIGTERM", signal.SIGTERM),
}


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    d = tmp_path / "sarc-train-run"
    (d / "partition").mkdir(parents=True)
    monkeypatch.setenv(RUN_DIR_ENV, str(d))
    # sarc train's pid, whatever started the tests (their parent may be init itself)
    monkeypatch.setattr(os, "getppid", lambda: SARC_TRAIN)
    monkeypatch.setenv(PARENT_ENV, str(SARC_TRAIN))
    # never ask the kernel to signal the test process when its parent dies
    monkeypatch.setattr(agent, "die_with_parent", lambda sig: True)
    monkeypatch.setattr(agent.tempfile, "tempdir", agent.tempfile.tempdir)
    return d


def _torchrun(monkeypatch, ending, parent_dies: bool):
    def main(argv):
        if parent_dies:
            monkeypatch.setattr(os, "getppid", lambda: 1)
        if ending is not None:
            raise ending
    monkeypatch.setattr(torchrun, "main", main)


@pytest.mark.parametrize("how", list(ENDINGS))
def test_the_run_directory_goes_when_sarc_train_died_during_the_run(run_dir, monkeypatch, how):
    _torchrun(monkeypatch, ENDINGS[how](run_dir), parent_dies=True)
    agent.main([])
    assert not run_dir.exists()


@pytest.mark.parametrize("how", list(ENDINGS))
def test_the_run_directory_stays_for_a_live_sarc_train(run_dir, monkeypatch, how):
    _torchrun(monkeypatch, ENDINGS[how](run_dir), parent_dies=False)
    agent.main([])
    assert (run_dir / "partition").is_dir()


def test_failed_workers_are_written_for_sarc_train(run_dir, monkeypatch):
    _torchrun(monkeypatch, _failed(run_dir), parent_dies=False)
    assert agent.main([]) == 1
    assert '"exitcode": -15' in (run_dir / FAILURES).read_text()


def test_descendants_of_processes_that_end_while_they_are_read(monkeypatch):
    """The supervisor lists a run's processes every half second while it waits; one that
    ends meanwhile takes its /proc entries with it. It is skipped, not an error (sarc train
    failed after a finished run when a worker's task directory went during the listing)."""
    import subprocess
    import sys

    from sarc.distributed import supervise

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in supervise.descendants(os.getpid())
        real_scandir, real_listdir = os.scandir, os.listdir

        def gone(path, real):
            if f"/proc/{child.pid}" in str(path) or str(path).endswith("/task"):
                raise FileNotFoundError(2, "No such file or directory", str(path))
            return real(path)
        monkeypatch.setattr(os, "scandir", lambda path=".": gone(path, real_scandir))
        monkeypatch.setattr(os, "listdir", lambda path=".": gone(path, real_listdir))
        assert supervise.descendants(os.getpid()) == []
    finally:
        child.kill()
        child.wait()
