"""Process supervision for ``sarc train --workers P``: nothing of a run outlives it.

A run is ``sarc train`` -> the agent (torchrun, ``sarc.distributed.agent``) -> P workers.
Each level dies with the one above it, and ``sarc train`` checks before it says so:

- The agent and the workers ask the kernel for a signal when their parent dies
  (``die_with_parent``: Linux's ``PR_SET_PDEATHSIG``; SIGTERM for the agent, on which
  torchrun stops its workers and the agent removes the run's directory; SIGKILL for a
  worker). A parent that died before the request is seen right after it: each process
  knows its parent's pid from ``SARC_PARENT_PID``, which every level sets for the next.
- The agent runs in a session of its own, so a signal to the terminal's process group
  reaches ``sarc train`` alone, which stops the agent (SIGTERM, then SIGKILL) and so
  the workers (torchrun starts each in a session of its own).
- Every process of a run carries ``SARC_RUN=<token>`` in its environment: however the
  agent ended, ``sarc train`` kills any process that still carries it and waits until
  none does (``Run.stop``) before it reports. A process of the run that has had a
  SIGTERM pending for a second (it is stopped, or stuck in the kernel) gets SIGKILL,
  where torchrun would wait 30 s.
- Files: a run's directory (its temporary partition, torchrun's logs) is
  ``TMPDIR/sarc-train-<pid namespace>.<pid>.<start time>-<random>``. ``sarc train``
  removes it when it ends; the agent, when ``sarc train`` was killed (SIGKILL: its
  threads end one by one, and the agent is told at the first, ``parent_gone``), after
  ending every other process of the run, which could still write into it; where
  both were killed outright, the next ``sarc train`` does: it removes every such
  directory whose process (that pid, started at that time) is gone (``sweep_run_dirs``).

Linux only where it says so (``/proc``, ``prctl``); elsewhere the run is torchrun's alone.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

RUN_ENV = "SARC_RUN"
"""Every process of a run has ``SARC_RUN=<token>`` in its environment."""
PARENT_ENV = "SARC_PARENT_PID"
"""The pid of the process that started this one (set by that process)."""
RUN_DIR_ENV = "SARC_RUN_DIR"
"""The run's directory, which the agent removes when ``sarc train`` died."""
RUN_DIR_PREFIX = "sarc-train-"
FAILURES = "failures.json"
"""In the run's directory: the workers that failed, as the agent saw them."""

STOP_GRACE_S = 5.0      # how long torchrun has to stop its workers after SIGTERM
UNRESPONSIVE_S = 1.0    # SIGTERM pending this long: the process cannot act on it
GONE_WAIT_S = 10.0      # how long SIGKILLed processes get to disappear

_PR_SET_PDEATHSIG = 1


# --- one process: its parent, its start time, its pending signals ------------------------------

def die_with_parent(sig: int) -> bool:
    """Ask for ``sig`` when this process's parent dies; False if it is already gone.

    The parent is the pid in ``SARC_PARENT_PID`` where set (else only an orphan adopted
    by init is seen); afterwards ``SARC_PARENT_PID`` is this process, for its children.
    """
    expected = os.environ.get(PARENT_ENV)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    parent = os.getppid()
    os.environ[PARENT_ENV] = str(os.getpid())
    if expected is not None and expected.isdigit():
        return parent == int(expected)
    return parent != 1


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot; None if there is no such process).
    With the pid, it names a process for good: a reused pid starts later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _state_letter(pid: int) -> str | None:
    """``pid``'s state as ``/proc/PID/stat`` gives it ("R", "S", "Z", ...; None: no such
    process). A process's state is its main thread's."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_state(pid: int) -> str:
    """``pid``'s state in words where it cannot act on a signal (else "running")."""
    letter = _state_letter(pid)
    if letter is None:
        return "gone"
    return {"T": "stopped", "t": "stopped by a debugger", "D": "stuck in the kernel"}.get(
        letter, "running")


def parent_gone(parent: int) -> bool:
    """This process's parent ``parent`` has died or is dying.

    A killed process ends a thread at a time, and the kernel hands the children of an ended
    thread to a live one of the same process (signalling them then: ``PR_SET_PDEATHSIG`` is
    per thread), so until its last thread ends it is still their parent, its main thread a
    zombie. Its main thread ends only with the process.
    """
    if os.getppid() != parent:
        return True
    return _state_letter(parent) in (None, "Z", "X")


def _worker_name(pid: int) -> str:
    """"worker R" for a worker (its ``RANK``), else "process PID"."""
    with contextlib.suppress(OSError):
        for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if var.startswith(b"RANK=") and var[5:].isdigit():
                return f"worker {int(var[5:])}"
    return f"process {pid}"


def _pending_sigterm(pid: int) -> bool:
    """``pid`` has a SIGTERM it has not acted on (it is stopped, or in the kernel)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signal.SIGTERM - 1)
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & bit:
            return True
    return False


def run_processes(token: str) -> list[int]:
    """The live processes carrying ``SARC_RUN=token`` (zombies have no environment; none
    where there is no ``/proc``)."""
    needle = f"{RUN_ENV}={token}".encode()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    found = []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def end_run_processes(token: str, timeout: float) -> list[int]:
    """SIGKILL every live process carrying ``SARC_RUN=token`` but this one, again and again,
    until none is left or ``timeout`` s have passed; returns those still left."""
    deadline = time.monotonic() + timeout
    left = run_processes(token)
    while left and time.monotonic() < deadline:
        for pid in left:
            _kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        left = run_processes(token)
    return left


def descendants(pid: int) -> list[int]:
    """The processes started by ``pid``, their children, and so on (Linux). A process or
    thread that ends while it is read is skipped (its ``/proc`` entries go at any time)."""
    found, todo = [], [pid]
    while todo:
        tasks = f"/proc/{todo.pop()}/task"
        try:
            tids = os.listdir(tasks)
        except OSError:  # gone
            continue
        for tid in tids:
            try:
                kids = [int(c) for c in Path(f"{tasks}/{tid}/children").read_text().split()]
            except (OSError, ValueError):  # the thread ended
                continue
            found += kids
            todo += kids
    return found


def _kill(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


# --- the run's directory ------------------------------------------------------------------------

@contextlib.contextmanager
def run_directory() -> Iterator[Path]:
    """A fresh directory for one run, in ``TMPDIR``, removed when the block ends; the
    directories of runs whose ``sarc train`` is gone are removed first."""
    sweep_run_dirs()
    me = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{_pid_namespace()}.{me}."
                                        f"{start_time(me) or 0}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_run_dirs(root: Path | None = None) -> list[Path]:
    """Remove this user's run directories under ``root`` (``TMPDIR``) whose ``sarc train``
    is gone; returns them."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            owner = _owner(d.name)
            if owner is None or start_time(owner[0]) == owner[1]:
                continue
            with contextlib.suppress(OSError):
                if d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid():
                    shutil.rmtree(d)
                    removed.append(d)
    return removed


def _owner(name: str) -> tuple[int, int] | None:
    """(pid, start time) from ``sarc-train-<pid namespace>.<pid>.<start>-<random>``, where
    the pid is of this process's pid namespace (a /tmp shared with another container
    holds directories of processes this one cannot see)."""
    if not name.startswith(RUN_DIR_PREFIX):
        return None
    fields = name[len(RUN_DIR_PREFIX):].split("-", 1)[0].split(".")
    if len(fields) != 3 or not all(f.isdigit() for f in fields) or int(fields[0]) != _pid_namespace():
        return None
    return int(fields[1]), int(fields[2])


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


# --- the rendezvous port -----------------------------------------------------------------------

class PortInUse(OSError):
    """The rendezvous port is taken."""


def reserve_port(port: int = 0) -> socket.socket:
    """A socket bound to ``port`` (0: one the system picks) on every interface, not
    listening, held while the run starts: torchrun's store binds it too (both set
    ``SO_REUSEADDR``), and no other program can bind or be given it meanwhile."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
    except OSError as e:
        s.close()
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUse(e.errno, f"port {port}: {os.strerror(e.errno)}") from None
        raise
    return s


# --- signals to sarc train ---------------------------------------------------------------------

class Stopped(BaseException):
    """``sarc train`` received a signal that asks it to stop (SIGTERM, SIGINT, SIGHUP)."""

    def __init__(self, signum: int, outcome: "Outcome | None" = None):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.outcome = outcome  # what was left of the run, once it was stopped


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _StopState:
    signum: int | None = None   # the first stop signal received
    deferring: int = 0          # inside ``deferred_stop``: the signal is kept, not raised


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, the first of ``STOP_SIGNALS`` raises ``Stopped`` (so the run's
    ``finally`` clauses stop it), or, inside ``deferred_stop``, is kept for later; the
    ones after it are ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if _StopState.signum is None:
            _StopState.signum = signum
            if not _StopState.deferring:
                raise Stopped(signum)

    _StopState.signum = None
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _StopState.signum = None


@contextlib.contextmanager
def deferred_stop() -> Iterator[None]:
    """A block that a stop signal does not interrupt (stopping the run is one)."""
    _StopState.deferring += 1
    try:
        yield
    finally:
        _StopState.deferring -= 1


def stop_received() -> int | None:
    """The stop signal received within ``stop_on_signals``, if any."""
    return _StopState.signum


def stops_on_signals(command=None, *, workers: bool = True):
    """``command(args, ...) -> exit status`` (a sarc command), stopped by ``STOP_SIGNALS`` as
    by Ctrl-C: the run stops (``stop_on_signals``; its ``finally`` clauses remove what it
    was writing), one line says so, and the status is 128 + the signal. ``workers``: the
    command launches workers (``sarc train --workers``), and the line says what became of
    them. ``@stops_on_signals`` or ``@stops_on_signals(workers=False)``."""
    if command is None:
        return functools.partial(stops_on_signals, workers=workers)

    @functools.wraps(command)
    def run(args, *more) -> int:
        try:
            with stop_on_signals():
                return command(args, *more)
        except Stopped as e:
            line = f"sarc {getattr(args, 'command', 'train')}: stopped by {e}"
            if workers:
                line += ": " + ("no worker was running" if e.outcome is None else
                                e.outcome.leftovers() or "torchrun and every worker were stopped")
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            return 128 + e.signum
    return run


# --- the run ------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """How the agent ended, and what was left of the run."""

    agent_pid: int | None
    returncode: int                 # the agent's exit status (negative: killed by that signal)
    survivors: list[int]            # processes of the run that would not die (should be none)
    failures: list[dict] = field(default_factory=list)  # the agent's FAILURES, where written
    forced: dict[int, str] = field(default_factory=dict)  # pid -> what sarc train killed, in words

    def summary(self) -> str:
        """What happened, in words; "every worker was stopped" only where none is left."""
        parts = []
        if self.returncode < 0:
            parts.append(f"torchrun (pid {self.agent_pid}) was killed by {_signame(-self.returncode)}")
        reported = [f["rank"] for f in self.failures if f["exitcode"] == ERROR_EXIT]
        parts += self.forced.values()
        for f in self.failures:
            if f["pid"] in self.forced:
                continue
            if f["exitcode"] < 0:
                parts.append(f"worker {f['rank']} was killed by {_signame(-f['exitcode'])}")
            elif f["exitcode"] == INTERRUPTED_EXIT:
                parts.append(f"worker {f['rank']} was interrupted (SIGINT)")
            elif f["exitcode"] != ERROR_EXIT:
                parts.append(f"worker {f['rank']} exited with status {f['exitcode']}")
        if reported:
            parts.append(f"{_workers(reported)} stopped with the error{'s' * (len(reported) > 1)} "
                         f"printed above")
        if self.returncode > 0 and not self.failures:
            parts.append(f"torchrun exited with status {self.returncode} (its errors are printed above)")
        parts.append(self.leftovers() or "every worker was stopped")
        return "; ".join(parts)

    def leftovers(self) -> str:
        """The processes of the run that would not stop, in words ("" if none)."""
        if not self.survivors:
            return ""
        return (f"{len(self.survivors)} of its processes would not stop, even on SIGKILL "
                f"(pids {', '.join(map(str, self.survivors))})")


ERROR_EXIT = 2
"""A worker's exit status after it printed its error."""

INTERRUPTED_EXIT = 128 + 2
"""A worker's exit status after SIGINT (KeyboardInterrupt), the shell's for it."""


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _workers(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"worker {ranks[0]}"
    return f"workers {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def run_agent(cmd: list[str], env: dict[str, str], run_dir: Path) -> Outcome:
    """Run the agent ``cmd`` to its end and stop whatever is left of the run. On
    ``Stopped`` (a signal), the run is stopped first and the exception carries its
    ``outcome``."""
    run = Run(run_dir)
    try:
        run.start(cmd, env)
        run.wait()
    except BaseException as e:
        outcome = run.stop()
        if isinstance(e, Stopped):
            e.outcome = outcome
        raise
    outcome = run.stop()
    if stop_received() is not None:  # it came while the run was being stopped
        raise Stopped(stop_received(), outcome)
    return outcome


class Run:
    """The agent of one run and everything it starts."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.proc: subprocess.Popen | None = None
        self._pending_since: dict[int, float] = {}
        self.forced: dict[int, str] = {}  # pid -> who, killed for sitting on a SIGTERM, in words

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        env = {**env, RUN_ENV: self.token, PARENT_ENV: str(os.getpid()),
               RUN_DIR_ENV: str(self.run_dir)}
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True)

    def wait(self) -> int:
        """Wait for the agent; meanwhile a process that ignores SIGTERM gets SIGKILL."""
        while True:
            try:
                return self.proc.wait(0.5)
            except subprocess.TimeoutExpired:
                self._kill_unresponsive()

    def stop(self) -> Outcome:
        """Stop what is left of the run: the agent (SIGTERM, which torchrun passes on to the
        workers; SIGKILL after ``STOP_GRACE_S``), then every process of the run; returns
        once none is left (or some would not die within ``GONE_WAIT_S``). A stop signal
        does not interrupt it."""
        with deferred_stop():
            return self._stop()

    def _stop(self) -> Outcome:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            _kill(proc.pid, signal.SIGTERM, group=True)
            deadline = time.monotonic() + STOP_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
                self._kill_unresponsive()
            if proc.poll() is None:  # not reaped: its pid is still its group's
                _kill(proc.pid, signal.SIGKILL, group=True)
            proc.wait()
        left = end_run_processes(self.token, GONE_WAIT_S)
        failures = []
        with contextlib.suppress(OSError, ValueError):
            failures = json.loads((self.run_dir / FAILURES).read_text())
        return Outcome(proc.pid if proc is not None else None,
                       proc.returncode if proc is not None else 0, left, failures, self.forced)

    def _kill_unresponsive(self) -> None:
        now = time.monotonic()
        pending = {pid for pid in [self.proc.pid, *descendants(self.proc.pid)]
                   if _pending_sigterm(pid)}
        for pid in list(self._pending_since):
            if pid not in pending:
                del self._pending_since[pid]
        for pid in pending:
            since = self._pending_since.setdefault(pid, now)
            if now - since >= UNRESPONSIVE_S and pid not in self.forced:
                who = "torchrun" if pid == self.proc.pid else _worker_name(pid)
                self.forced[pid] = (f"{who} did not stop when asked ({process_state(pid)}) "
                                    f"and was killed")
                _kill(pid, signal.SIGKILL)
