"""A worker whose run is over exits with the run's status, whatever tearing down its process
group would do: torch 2.2's gloo can block in it for good, holding the GIL (one worker of
a finished two-worker run was seen stuck there, every other process of the run waiting
for it).

The worker runs for real (``sarc.cli.worker`` as torchrun starts it, a world of one on
gloo), with ``destroy_process_group`` blocking in C with the GIL held, as gloo's
destructor does: a watchdog thread in Python cannot end such a wait.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from sarc.partition import partition_graph
from timeouts import run_or_show_stacks

from .harness import free_port

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import ctypes, sys
import torch.distributed as dist

def teardown_holding_the_gil(*args, **kwargs):
    ctypes.PyDLL(None).sleep(600)  # a C call that keeps the GIL, as gloo's destructor does

dist.destroy_process_group = teardown_holding_the_gil
from sarc.cli.worker import main
main(sys.argv[1:])
"""


def _one_part(path: Path, n: int = 60):
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (300,), generator=gen), torch.randint(0, n, (300,), generator=gen)
    node_data = {"feat": torch.rand(n, 6, generator=gen),
                 "label": torch.randint(0, 3, (n,), generator=gen),
                 "train_mask": torch.rand(n, generator=gen) < 0.6,
                 "val_mask": torch.rand(n, generator=gen) < 0.2,
                 "test_mask": torch.rand(n, generator=gen) < 0.2}
    return partition_graph(src, dst, n, 1, path, method="random", node_data=node_data, seed=0)


def test_a_worker_exits_with_its_status_whatever_the_teardown_would_do(tmp_path):
    pset = _one_part(tmp_path / "parts")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = run_or_show_stacks([sys.executable, "-c", WORKER, str(ROOT / "models" / "gcn.py"),
                               "--partition", pset.path, "--epochs", "2", "--threads", "1",
                               "--timeout", "20"], env=env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "selected epoch" in proc.stdout, proc.stdout


def test_the_run_gives_back_sarcs_own_stack_dump_where_stderr_is_captured(tmp_path, capsys):
    """``printing_run`` puts faulthandler's dump back after the run, except where stderr
    has no file descriptor (a test calling ``main`` with its output captured)."""
    import faulthandler
    import sys

    from sarc.distributed.stacks import SIGNAL, printing_run
    faulthandler.register(SIGNAL, file=sys.__stderr__, all_threads=True)
    try:
        with printing_run(tmp_path):
            pass
        assert not faulthandler.unregister(SIGNAL)   # captured stderr: none put back
        faulthandler.register(SIGNAL, file=sys.__stderr__, all_threads=True)
        with capsys.disabled(), printing_run(tmp_path):
            pass
        assert faulthandler.unregister(SIGNAL)       # a real stderr: put back
    finally:
        faulthandler.unregister(SIGNAL)


def _agreeing_worker(rank, port, queue):
    """A worker of two whose run stops on a problem worker 1 found and both agreed on
    (``agree``); worker 1 is slow to say it."""
    import time

    import sarc.distributed.train as train
    import sarc.distributed.worker as worker
    from sarc.distributed.train import WorkerConfig, agree

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    said = []

    def say(text):
        if rank == 1:
            time.sleep(1.5)
        said.append((time.monotonic(), text))

    worker._say_error = say
    train.train_worker = lambda spec, cfg: agree(rank != 1, "part-1.pt holds 153 edges")
    code = worker.run_worker(None, WorkerConfig(partition="unused", timeout_s=20))
    queue.put((rank, (code, said, time.monotonic())))


def test_every_worker_says_an_agreed_error_before_any_leaves():
    """torchrun stops the other workers as soon as one exits: a worker that left as soon
    as it said an error all of them agreed on could get a slower peer killed before that
    peer said it (seen: one report of two)."""
    from .harness import spawn

    codes, reports = spawn(_agreeing_worker, 2, timeout_s=60)
    assert codes == [0, 0], reports
    assert [r[0] for r in reports] == [2, 2], reports
    said = [r[1] for r in reports]
    assert said[0][0][1] == "sarc worker 0: error: worker 1: part-1.pt holds 153 edges", said
    assert said[1][0][1] == "sarc worker 1: error: part-1.pt holds 153 edges", said
    last_said = max(s[0][0] for s in said)
    assert all(left >= last_said for _, _, left in reports), reports


@pytest.mark.parametrize("env, says", [
    ({"RANK": "x"}, "RANK='x'"),
    ({"RANK": "5"}, "RANK=5"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"MASTER_PORT": "CLOSED"}, "could not join"),
])
def test_a_worker_in_a_malformed_launch_says_what_is_wrong(tmp_path, env, says):
    """A worker started by hand, or by a launcher other than torchrun, with its place in
    the run malformed (or no master to reach): one ``sarc worker`` error naming it, no
    traceback."""
    pset = _one_part(tmp_path / "parts")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    if env["MASTER_PORT"] == "CLOSED":   # RANK 1 of 2: it connects to a master nobody runs
        env.update(MASTER_PORT=str(free_port()), RANK="1")
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "worker",
                               str(ROOT / "models" / "gcn.py"), "--partition", pset.path,
                               "--epochs", "1", "--timeout", "3"], env=env, cwd=tmp_path,
                              timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [l for l in proc.stderr.splitlines() if l.startswith("sarc worker")]
    assert says in line, proc.stderr


SIGTERMED = r"""
import os, sys, threading
from sarc import checkpoint

checkpoint.remove_temporaries_on_sigterm()   # as a worker does when it starts
tmp = os.path.join(sys.argv[1], ".epoch-000003.rank-0.pt.abcd1234.tmp")
with open(tmp, "wb") as f:
    f.write(b"half a checkpoint")
if sys.argv[2] == "writing":
    with checkpoint.writing(tmp):   # as write_atomic holds it while it writes
        print("ready", flush=True)
        threading.Event().wait(60)  # the main thread in C (a file write), the GIL released
else:
    print("ready", flush=True)
    threading.Event().wait(60)
"""


@pytest.mark.parametrize("when", ["writing", "between-writes"])
def test_sigterm_while_a_checkpoint_is_written_removes_its_temporary_file(tmp_path, when):
    """torchrun stops a worker with SIGTERM (a peer failed, or sarc train was stopped); a
    checkpoint file it was writing leaves no temporary file behind (one it is not writing is
    not its to remove), and the worker still dies by the signal (what sarc train's message
    reports), promptly."""
    import signal
    import subprocess
    import time
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SIGTERMED, str(tmp_path), when], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - start < 10
    finally:
        proc.kill()
    assert len(list(tmp_path.iterdir())) == (0 if when == "writing" else 1)
