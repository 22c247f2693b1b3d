"""Where a run is stuck: every thread's Python stack of each of its processes, on ``SIGUSR1``.

A worker and the torchrun agent register ``faulthandler`` for the signal as they start
(``dump_on_signal``). Its handler runs in C, so a worker whose main thread waits in a
gloo collective (in C++, the GIL released) or is busy in Python still writes where it is.
Each writes to ``RUN_DIR/stacks/NAME.PID.txt`` (``RUN_DIR``: the run's directory,
``SARC_RUN_DIR``), from which ``ask`` reads them under the process's name ("worker 1");
without a run's directory (a worker under a user's own torchrun) to stderr.

Who asks:

- ``sarc train --workers P`` on its own SIGUSR1 (``kill -USR1 PID``, or a test whose time
  is up): its own stacks and every process's of the run (``printing_run``); any other
  ``sarc`` command prints its own;
- a worker that gave up waiting for a peer (``--timeout``): its peers' on this machine,
  printed under its error (``sarc.distributed.worker``).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

from .supervise import RUN_DIR_ENV, process_state

SIGNAL = signal.SIGUSR1
FOLDER = "stacks"
ANSWER_S = 2.0
"""How long an asker waits for the stacks (writing them takes milliseconds)."""
_QUIET_S = 0.2  # an answer that has not grown for this long is complete

_dump_file = None  # faulthandler writes to its descriptor for the process's life


def dump_on_signal(name: str, run_dir: str | os.PathLike | None) -> None:
    """From now on this process writes all its threads' stacks on ``SIGNAL``: into the run's
    directory under ``name`` ("worker 0"), or to stderr without one."""
    global _dump_file
    target = sys.stderr
    if run_dir:
        folder = Path(run_dir) / FOLDER
        with contextlib.suppress(OSError):
            folder.mkdir(exist_ok=True)
            # appended to: an asker reads what each signal adds
            target = _dump_file = open(folder / f"{name.replace(' ', '-')}.{os.getpid()}.txt", "a")
    faulthandler.register(SIGNAL, file=target, all_threads=True)


def ask(run_dir: str | os.PathLike, wanted: Callable[[str], bool] = lambda name: True) -> str:
    """The stacks of the run's live processes whose name is ``wanted``, each under its name
    and pid, or why it gave none ("" if there is no such process). Only a process that
    catches the signal now (``dump_on_signal``) is sent it: to any other it is fatal."""
    found: dict[int, tuple[str, Path]] = {}
    for path in sorted(Path(run_dir, FOLDER).glob("*.txt")):
        name, _, pid = path.stem.rpartition(".")
        name = name.replace("-", " ")
        if pid.isdigit() and wanted(name) and _in_run(int(pid), run_dir):
            found[int(pid)] = (name, path)
    asked = {}
    for pid, (_, path) in found.items():
        if _catches(pid):
            asked[pid] = (path, _size(path))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, SIGNAL)
    answers = _answers(asked)
    parts = []
    for pid, (name, _) in found.items():
        if answers.get(pid):
            parts.append(f"stacks of {name} (pid {pid}), most recent call first:\n"
                         f"{answers[pid].rstrip()}")
        else:
            why = _why_silent(pid) if pid in asked else "it does not catch SIGUSR1 now"
            parts.append(f"stacks of {name} (pid {pid}): none ({why})")
    return "\n".join(parts)


def _answers(asked: dict[int, tuple[Path, int]]) -> dict[int, str]:
    """pid -> what it appended to its file (path, size before the signal), once every one
    has written and stopped writing, or after ``ANSWER_S``."""
    deadline = time.monotonic() + ANSWER_S
    sizes: dict[int, int] = {}
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = {pid: _size(path) for pid, (path, _) in asked.items()}
        if now != sizes:
            sizes, quiet_since = now, time.monotonic()
        elif all(sizes[pid] > start for pid, (_, start) in asked.items()) and \
                time.monotonic() - quiet_since >= _QUIET_S:
            break
        time.sleep(0.05)
    answers = {}
    for pid, (path, start) in asked.items():
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            f.seek(start)
            answers[pid] = f.read()
    return answers


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _in_run(pid: int, run_dir: str | os.PathLike) -> bool:
    """``pid`` lives and is of this run (a pid reused by another process is not)."""
    needle = f"{RUN_DIR_ENV}={os.fspath(run_dir)}".encode()
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _catches(pid: int) -> bool:
    """``pid`` has a handler for ``SIGNAL`` (its ``SigCgt`` mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (SIGNAL - 1)))
    return False


def _why_silent(pid: int) -> str:
    """Why ``pid`` wrote nothing within ``ANSWER_S`` of the signal, in words."""
    state = process_state(pid)
    if state == "gone":
        return "it has exited"
    return f"it is {state}" if state != "running" else f"no answer within {ANSWER_S:g} s"


# --- sarc train --------------------------------------------------------------------------------

@contextlib.contextmanager
def printing_run(run_dir: str | os.PathLike) -> Iterator[None]:
    """Within the block, ``SIGNAL`` makes ``sarc train`` print its own threads' stacks and
    those of the processes of the run in ``run_dir``. A Python handler: the main thread
    of ``sarc train`` waits for the run in Python. Outside, ``sarc``'s own (``faulthandler``,
    to stderr) is back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    had_faulthandler = faulthandler.unregister(SIGNAL)
    previous = signal.signal(SIGNAL, lambda signum, frame: _print_stacks(run_dir))
    try:
        yield
    finally:
        signal.signal(SIGNAL, previous)
        if had_faulthandler:  # not where stderr is no file (captured, as by a test)
            with contextlib.suppress(OSError, ValueError):
                faulthandler.register(SIGNAL, all_threads=True)


def _print_stacks(run_dir: str | os.PathLike) -> None:
    out = sys.stderr
    out.write(f"sarc train (pid {os.getpid()}): stacks, most recent call first:\n")
    out.flush()
    faulthandler.dump_traceback(out, all_threads=True)
    out.write((ask(run_dir) or "no process of the run has started yet") + "\n")
    out.flush()
