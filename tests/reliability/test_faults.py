"""Faults in distributed training: whatever dies, stalls or is killed, ``sarc train`` leaves
no process and no file behind, and says what happened.

Each test runs ``sarc train`` as a user does (a subprocess, with ``TMPDIR`` in the test's
folder, so its temporary partition and everything it starts carry that folder's path) on
the embedded Cora with a tiny run, and finds the processes it started through ``/proc``:
any whose command line holds the test's folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sarc.partition import partition_graph

from .catalogue import case
from .harness import ROOT, assert_error, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

GCN = str(ROOT / "models" / "gcn.py")
LONG_RUN = ("--dataset", "cora", "--method", "random", "--epochs", "100000", "--log-every", "1")


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def processes_with(marker: Path) -> dict[int, list[bytes]]:
    """Live processes whose command line mentions ``marker`` (zombies have none)."""
    needle = os.fsencode(marker)
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            args = _cmdline(int(entry))
            if any(needle in a for a in args):
                found[int(entry)] = args
    return found


def is_worker(args: list[bytes]) -> bool:
    """``python [-u] -m sarc.cli.worker ...`` (torchrun's command line names it too)."""
    return b"-m" in args and args[args.index(b"-m") + 1:][:1] == [b"sarc.cli.worker"]


def leftovers(tmp: Path) -> list[str]:
    """What a run may leave in its temporary folder: its directory, torchrun's."""
    return sorted(p.name for p in tmp.iterdir()
                  if p.name.startswith(("sarc-train-", "torchelastic_")))


def left_files(tmp: Path) -> dict[str, list[str]]:
    """Each leftover directory and the files in it (what a failed wait names)."""
    found = {}
    for d in leftovers(tmp):
        try:
            found[d] = sorted(str(p.relative_to(tmp / d)) for p in (tmp / d).rglob("*"))
        except OSError as e:  # going meanwhile
            found[d] = [f"({e})"]
    return found


def wait_until(predicate, timeout: float = 20.0, what: str = "", left=None) -> None:
    """Wait for ``predicate``; a timeout names ``what``, and ``left()`` if given (what is
    still there)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, (f"still not {what} after {timeout} s"
                                             + (f": {left()}" if left else ""))
        time.sleep(0.1)


class Training:
    """``sarc train`` in the background, in a session of its own (as from a shell), its
    output in files."""

    def __init__(self, tmp: Path, *argv: str, env: dict | None = None):
        self.tmp = tmp
        self.out, self.err = tmp / "stdout.txt", tmp / "stderr.txt"
        env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "sarc.cli", "train", GCN, *argv],
                                         cwd=ROOT, env=env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def output(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {text!r} in the output:\n" + "\n".join(self.output()))
            time.sleep(0.1)

    def workers(self) -> list[int]:
        """The workers' pids, by rank."""
        ws = [pid for pid, args in processes_with(self.tmp).items() if is_worker(args)]
        return sorted(ws, key=_rank)

    def agent(self) -> int:
        (pid,) = [pid for pid, args in processes_with(self.tmp).items() if not is_worker(args)]
        return pid

    def finish(self, timeout: float = 90.0) -> tuple[int, str, str]:
        """sarc train's exit status and output (what it left is for the test to see)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return (code, *self.output())

    def kill(self) -> None:
        """Everything this test started, whatever sarc left (so one failure stays one)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in processes_with(self.tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _rank(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(int(v[5:]) for v in env if v.startswith(b"RANK="))


@pytest.fixture
def start(tmp_path):
    """``start(*argv, workers=2)``: ``sarc train`` past its second epoch, its agent and
    workers running. Whatever a test leaves running is killed after it."""
    runs = []

    def start(*argv: str, workers: int = 2) -> Training:
        run = Training(tmp_path, "--workers", str(workers), *argv)
        runs.append(run)
        run.wait_for("epoch    2/")
        assert len(run.workers()) == workers, processes_with(tmp_path)
        return run
    yield start
    for run in runs:
        run.kill()


def assert_stopped(run: Training) -> None:
    """Nothing of the run is left: no process, no temporary directory."""
    assert processes_with(run.tmp) == {}, processes_with(run.tmp)
    assert leftovers(run.tmp) == [], leftovers(run.tmp)


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines, err
    return lines[-1]


# --- signals to sarc train ------------------------------------------------------------------

@case("faults", "`sarc train` killed with SIGKILL while its workers train", "no-orphans")
def test_sigkill_of_sarc_train_stops_torchrun_and_the_workers(tmp_path, start):
    run = start(*LONG_RUN, "--timeout", "30")
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    wait_until(lambda: not processes_with(tmp_path), 15, "stopped",
               lambda: processes_with(tmp_path))
    wait_until(lambda: not leftovers(tmp_path), 15, "removed", lambda: left_files(tmp_path))


@case("faults", "`sarc train` killed with SIGKILL while it partitions (nothing can clean up)",
      "no-orphans")
def test_a_run_directory_left_by_a_killed_sarc_train_goes_at_the_next_run(tmp_path):
    run = Training(tmp_path, "--workers", "2", *LONG_RUN, "--timeout", "30")
    try:
        wait_until(lambda: leftovers(tmp_path), 60, "started")
        os.kill(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        wait_until(lambda: not processes_with(tmp_path), 15, "stopped",
                   lambda: processes_with(tmp_path))
    finally:
        run.kill()
    # whatever was left (a partial partition), the next sarc train removes it
    proc = run_sarc("train", GCN, "--workers", "2", "--partition", tmp_path / "missing",
                    env={"TMPDIR": str(tmp_path)})
    assert_error(proc, "missing")
    assert leftovers(tmp_path) == []


@case("faults", "`sarc train` stopped with SIGTERM while its workers train", "no-orphans")
def test_sigterm_of_sarc_train_stops_everything_and_says_so(start):
    run = start(*LONG_RUN, "--timeout", "30")
    run.proc.send_signal(signal.SIGTERM)
    code, out, err = run.finish(30)
    assert code == 128 + signal.SIGTERM, err
    line = last_line(err)
    assert line.startswith("sarc train: stopped by SIGTERM") and "every worker" in line, err
    assert_stopped(run)


@case("faults", "`sarc train` on one process stopped with SIGTERM before its first checkpoint",
      "nothing-lost")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_one_process_cleans_up_and_says_so(tmp_path, sig):
    """SIGTERM ended the process where it stood: the --checkpoint directory it had made,
    still empty, stayed (a run that fails is cleaned up; a stopped one was not)."""
    ckpt = tmp_path / "ckpt"
    run = Training(tmp_path, "--dataset", "cora", "--epochs", "100000", "--log-every", "1",
                   "--checkpoint", str(ckpt), "--checkpoint-every", "100000")
    try:
        run.wait_for("epoch    2 |")   # one process: no epoch count in the line
        assert ckpt.is_dir()
        run.proc.send_signal(sig)
        code, out, err = run.finish(30)
    finally:
        run.kill()
    assert code == 128 + sig, err
    assert last_line(err) == f"sarc train: stopped by {signal.Signals(sig).name}", err
    assert not ckpt.exists()


@case("faults", "`sarc train` interrupted with Ctrl-C (SIGINT) while its workers train",
      "no-orphans")
def test_sigint_of_sarc_train_stops_everything_and_says_so(start):
    run = start(*LONG_RUN, "--timeout", "30")
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish(30)
    assert code == 128 + signal.SIGINT, err
    assert last_line(err).startswith("sarc train: stopped by SIGINT"), err
    assert_stopped(run)


# --- deaths and stalls under sarc train -------------------------------------------------------

@case("faults", "the torchrun agent killed with SIGKILL while its workers train", "no-orphans")
def test_sigkill_of_the_agent_stops_the_workers_and_says_so(start):
    run = start(*LONG_RUN, "--timeout", "30")
    workers = run.workers()
    os.kill(run.agent(), signal.SIGKILL)
    code, out, err = run.finish(30)
    assert code == 2, err
    line = last_line(err)
    assert line.startswith("sarc train: error:") and "torchrun" in line and "SIGKILL" in line, err
    assert not [w for w in workers if is_worker(_cmdline(w))]
    assert_stopped(run)


@case("faults", "one worker killed with SIGKILL mid-training", "no-orphans")
def test_sigkill_of_a_worker_stops_the_others_with_an_error(start):
    run = start(*LONG_RUN, "--timeout", "30")
    os.kill(run.workers()[1], signal.SIGKILL)
    code, out, err = run.finish(60)
    assert code == 2, err
    line = last_line(err)
    assert line.startswith("sarc train: error: distributed training failed"), err
    assert "worker 1 was killed by SIGKILL" in line, err
    assert_stopped(run)


@case("faults", "one worker stalls (SIGSTOP) mid-training, --timeout 5", "no-orphans")
def test_a_stalled_worker_times_the_others_out_and_everything_stops(start):
    run = start(*LONG_RUN, "--timeout", "5")
    os.kill(run.workers()[1], signal.SIGSTOP)
    code, out, err = run.finish(60)
    assert code == 2, err
    (report,) = [l for l in err.splitlines() if l.startswith("sarc worker 0: error:")]
    assert "no answer from a peer within --timeout 5 s" in report, err
    line = last_line(err)
    assert line.startswith("sarc train: error: distributed training failed"), err
    assert "worker 1 did not stop when asked (stopped) and was killed" in line, err
    assert_stopped(run)


def stacks_of(err: str, name: str) -> list[str]:
    """The stacks printed for ``name`` ("worker 1"), each dump's frames as one text."""
    dumps = err.split("\nstacks of ")
    return [d.split("\n", 1)[1] for d in dumps[1:]
            if d.startswith(f"{name} (pid ") and "), most recent call first:\n" in d]


@case("faults", "one worker stops making progress, alive and outside any collective "
      "(`SARC_TEST_STALL_AT`), --timeout 5; `kill -USR1` to sarc train meanwhile", "stacks")
def test_a_stuck_worker_is_found_by_its_stacks(tmp_path, request):
    run = Training(tmp_path, "--workers", "2", *LONG_RUN, "--timeout", "5",
                   env={"SARC_TEST_STALL_AT": "1:2"})
    request.addfinalizer(run.kill)
    run.wait_for("epoch    1/")
    # on SIGUSR1, sarc train prints its own stacks and every process's of the run: the
    # stuck worker sleeps in stall_forever, its peer waits in gloo (C++, the GIL released)
    waiting = []
    for _ in range(3):
        time.sleep(0.5)
        os.kill(run.proc.pid, signal.SIGUSR1)
        wait_until(lambda: len(stacks_of(run.output()[1], "worker 0")) > len(waiting),
                   what="printed the stacks")
        waiting = stacks_of(run.output()[1], "worker 0")
        if "in wait\n" in waiting[-1]:
            break
    err = run.output()[1]
    assert "sarc train (pid " in err and stacks_of(err, "torchrun"), err
    assert "exchange.py" in waiting[-1] and "in wait\n" in waiting[-1], err
    assert "in stall_forever\n" in stacks_of(err, "worker 1")[0], err
    # then worker 0 gives up on its peer, and prints where the peer is
    code, out, err = run.finish(60)
    assert code == 2, err
    gave_up = err[err.index("sarc worker 0: error: no answer from a peer within --timeout 5 s"):]
    assert "in stall_forever\n" in stacks_of(gave_up, "worker 1")[0], err
    assert not stacks_of(gave_up, "worker 0"), err
    assert last_line(err).startswith("sarc train: error: distributed training failed"), err
    assert_stopped(run)


# --- bad input ---------------------------------------------------------------------------------

@case("faults", "`--master-port` on a port another program listens on", "error")
def test_a_busy_master_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_sarc("train", GCN, "--workers", "2", "--epochs", "1", "--master-port", port,
                        env={"TMPDIR": str(tmp_path)})
    assert_error(proc, f"--master-port {port}", "in use")
    assert leftovers(tmp_path) == []


@case("faults", "`--master-port 70000` (not a TCP port)", "error")
def test_a_master_port_out_of_range_is_refused(tmp_path):
    proc = run_sarc("train", GCN, "--workers", "2", "--master-port", "70000",
                    env={"TMPDIR": str(tmp_path)})
    assert_error(proc, "--master-port must be a TCP port", "70000")
    assert leftovers(tmp_path) == []


def _graph_parts(path: Path, parts: int, seed: int, n: int = 60):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (300,), generator=gen), torch.randint(0, n, (300,), generator=gen)
    node_data = {"feat": torch.randn(n, 5, generator=gen), "label": torch.randint(0, 3, (n,), generator=gen),
                 "train_mask": torch.ones(n, dtype=torch.bool), "val_mask": torch.zeros(n, dtype=torch.bool),
                 "test_mask": torch.zeros(n, dtype=torch.bool)}
    return partition_graph(src, dst, n, parts, path, method="random", node_data=node_data, seed=0)


def transplant(into, donor, p: int, edges: bool = True) -> None:
    """Put ``donor``'s part ``p`` (of another graph) in ``into``, its metadata entry patched
    to the new file's sha256 and size, and with ``edges`` its edge count, as a careful
    forger would."""
    shutil.copy(donor.part_path(p), into.part_path(p))
    meta_file = into.path / "metadata.json"
    meta = json.loads(meta_file.read_text())
    data = into.part_path(p).read_bytes()
    meta["parts"][p].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    if edges:
        meta["parts"][p]["num_edges"] = donor.meta["parts"][p]["num_edges"]
    meta_file.write_text(json.dumps(meta))


def same_error_from_every_worker(proc, workers: int) -> str:
    """``sarc train`` failed (exit 2, no abort, no traceback), every worker with one and the
    same error (the others quote a worker's own: "worker R: ..."), which it returns."""
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "SIGABRT" not in err and "terminate called" not in err, err
    reports = [l for l in err.splitlines() if l.startswith("sarc worker")]
    assert len(reports) == workers, err
    messages = {l.split(": error: ", 1)[1] for l in reports}
    messages = {m.split(": ", 1)[1] if m.startswith("worker ") else m for m in messages}
    assert len(messages) == 1, reports
    assert last_line(err).startswith("sarc train: error: distributed training failed"), err
    return messages.pop()


@case("partition", "a part of another graph in the set, its sha256 in the metadata patched to match",
      "error")
def test_a_part_of_another_graph_with_a_patched_hash_is_refused_by_every_worker(tmp_path):
    pset = _graph_parts(tmp_path / "parts", 3, seed=0)
    transplant(pset, _graph_parts(tmp_path / "other", 3, seed=1), 1)
    proc = run_sarc("train", GCN, "--workers", "3", "--partition", pset.path, "--epochs", "2",
                    "--timeout", "20", env={"TMPDIR": str(tmp_path)}, timeout=120)
    message = same_error_from_every_worker(proc, 3)
    assert str(pset.part_path(1)) in message and "part-0.pt" not in message, message
    assert "does not fit the other parts" in message, message
    assert processes_with(tmp_path) == {}


@case("partition", "a part of another graph in the set, only its sha256 in the metadata patched",
      "error")
def test_a_part_of_another_graph_is_named_by_its_edge_count(tmp_path):
    pset = _graph_parts(tmp_path / "parts", 2, seed=0)
    transplant(pset, _graph_parts(tmp_path / "other", 2, seed=1), 1, edges=False)
    proc = run_sarc("train", GCN, "--workers", "2", "--partition", pset.path, "--epochs", "2",
                    "--timeout", "20", env={"TMPDIR": str(tmp_path)}, timeout=120)
    message = same_error_from_every_worker(proc, 2)
    assert message.startswith(f"{pset.part_path(1)}: holds ") and "edges" in message, message


def _dist_graph(rank, port, q, path):
    """Build a DistGraph on this rank's shard of ``path``, the parts unchecked before."""
    import datetime

    import torch.distributed as dist

    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=3, timeout=datetime.timedelta(seconds=20))
        DistGraph(ShardedGraph.from_partitions(load_partitions(path), rank))
        q.put((rank, "built"))
    except Exception as e:
        q.put((rank, f"{type(e).__name__}: {e}"))


@case("partition", "shards of a set with a part of another graph, given to `DistGraph` directly",
      "error")
def test_dist_graph_refuses_shards_that_do_not_fit(tmp_path):
    from distributed.harness import spawn
    pset = _graph_parts(tmp_path / "parts", 3, seed=0)
    transplant(pset, _graph_parts(tmp_path / "other", 3, seed=1), 1)
    codes, reports = spawn(_dist_graph, 3, (str(pset.path),))
    assert len(set(reports)) == 1, reports
    assert reports[0].startswith("DistError: the shard of part 1 does not fit the other parts"), reports
