"""The agent (``sarc.distributed.agent``, torchrun as ``sarc train`` runs it): whichever
way torchrun ends, once ``sarc train`` is gone the agent removes the run's directory,
since nobody else is left to.

torchrun itself is replaced by a stand-in that ends one way or another; "``sarc train``
is gone" is the agent's parent pid changing while torchrun runs (the agent was adopted).
The last test runs the real agent and torchrun under a parent that ends a thread at a
time, as a killed ``sarc train`` does.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

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


SARC_TRAIN = os.getpid()  # the agent's parent while sarc train lives (a live process);
# init (1) adopts the agent after

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
    # the agent (and torchrun) install SIGTERM handlers that raise: not past the test
    previous = signal.getsignal(signal.SIGTERM)
    yield d
    signal.signal(signal.SIGTERM, previous)


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


def test_the_run_directory_goes_when_sarc_train_signals_again_while_it_is_checked(
        run_dir, monkeypatch):
    """A killed sarc train signals the agent once per thread it ends: a SIGTERM that comes
    while the agent checks whether sarc train is gone does not stop the removal (it did:
    torchrun's handler raised, and the directory stayed)."""
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    def main(argv):  # torchrun, stopped by the first SIGTERM
        signal.signal(signal.SIGTERM, _terminate_process_handler)
        monkeypatch.setattr(os, "getppid", lambda: 1)
        raise SignalException("SIGTERM", signal.SIGTERM)
    monkeypatch.setattr(torchrun, "main", main)
    checks = []

    def gone(parent):
        checks.append(parent)
        os.kill(os.getpid(), signal.SIGTERM)  # the next thread of sarc train ends
        return True
    monkeypatch.setattr(agent, "parent_gone", gone)
    assert agent.main([]) == 128 + signal.SIGTERM
    assert checks and not run_dir.exists()


def test_a_stop_signal_before_the_removal_starts_it_again(run_dir, monkeypatch):
    """However early in the removal a stop signal's handler raises, the removal starts
    again and the directory goes."""
    _torchrun(monkeypatch, SignalException("SIGTERM", signal.SIGTERM), parent_dies=True)
    raised = []

    def gone(parent):
        if not raised:
            raised.append(parent)
            raise SignalException("SIGTERM", signal.SIGTERM)
        return True
    monkeypatch.setattr(agent, "parent_gone", gone)
    assert agent.main([]) == 128 + signal.SIGTERM
    assert raised and not run_dir.exists()


WRITER = """
import itertools, os, sys, time
d, end = sys.argv[1], time.monotonic() + 60
for i in itertools.count():
    if time.monotonic() > end:
        break
    try:
        open(os.path.join(d, f"log{i % 1000}.{os.getpid()}"), "w").close()
    except OSError:
        pass
"""


def test_the_run_directory_goes_while_a_process_of_the_run_writes_into_it(run_dir, monkeypatch):
    """A killed sarc train leaves the agent to remove the run's directory; a process of the
    run that still writes into it (a worker torchrun has not stopped yet, writing its logs
    or its error file) is ended first: a removal racing a writer left the directory behind
    (under load, once in a CI run)."""
    import subprocess
    import time
    from sarc.distributed.supervise import RUN_ENV
    token = f"test-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(RUN_ENV, token)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir)],
                              env={**os.environ, RUN_ENV: token})
    try:
        deadline = time.monotonic() + 30
        while len(list(run_dir.iterdir())) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)  # writing
        _torchrun(monkeypatch, None, parent_dies=True)
        agent.main([])
        assert not run_dir.exists()
        assert writer.wait(timeout=10) == -signal.SIGKILL
    finally:
        writer.kill()
        writer.wait()


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


# --- a parent whose threads end one by one --------------------------------------------------

# The stand-in for sarc train: it starts the agent from its main thread (torchrun running
# `sleep` as its one worker), says so, and on a line from stdin ends its main thread alone
# (the exit system call) while another thread lives on: the kernel then hands the agent to
# that thread and signals it (PR_SET_PDEATHSIG is per thread), and signals it again when
# the last thread goes. A killed multi-threaded sarc train ends this way, a thread at a time.
_PARENT = r"""
import ctypes, os, subprocess, sys, threading, time
run_dir, port, exit_call = sys.argv[1:]
env = {**os.environ, "SARC_PARENT_PID": str(os.getpid()), "SARC_RUN_DIR": run_dir}
agent = subprocess.Popen(
    [sys.executable, "-m", "sarc.distributed.agent", "--nnodes", "1", "--nproc-per-node", "1",
     "--master-addr", "127.0.0.1", "--master-port", port, "--no-python", "sleep", "600"],
    env=env, start_new_session=True)
print(agent.pid, flush=True)
sys.stdin.readline()
threading.Thread(target=time.sleep, args=(60,)).start()
time.sleep(0.2)
ctypes.CDLL(None, use_errno=True).syscall(int(exit_call), 0)
"""

_EXIT_CALL = {"x86_64": 60, "aarch64": 93}.get(os.uname().machine)


def _ended(pid: int) -> bool:
    """Gone, or a zombie (its parent, stuck in a thread of its own, never reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux") or _EXIT_CALL is None,
                    reason="Linux's per-thread parent death signal, on x86_64 or aarch64")
def test_the_run_directory_goes_when_sarc_trains_threads_end_one_by_one(tmp_path):
    import subprocess
    import time

    from sarc.distributed import supervise

    from .harness import free_port

    run_dir = tmp_path / "sarc-train-run"
    (run_dir / "partition").mkdir(parents=True)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(run_dir), str(free_port()),
                               str(_EXIT_CALL)], cwd=root, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": root})
    agent_pid = int(parent.stdout.readline())

    def worker_started():
        return any(supervise.start_time(pid) is not None
                   for pid in supervise.descendants(agent_pid))
    try:
        deadline = time.monotonic() + 60
        while not worker_started():
            assert time.monotonic() < deadline, "the agent started no worker"
            time.sleep(0.1)
        parent.stdin.write("end the main thread\n")
        parent.stdin.flush()
        deadline = time.monotonic() + 30
        while not _ended(agent_pid):
            assert time.monotonic() < deadline, "the agent did not end with its parent"
            time.sleep(0.1)
        # sarc train's last thread still lives: nobody but the agent removes the directory
        assert parent.poll() is None
        assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    finally:
        parent.kill()
        parent.wait()
        for pid in supervise.descendants(agent_pid) + [agent_pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
