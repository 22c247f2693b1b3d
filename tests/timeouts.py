"""A command the tests run in a subprocess, and what it shows when it runs past its time.

``subprocess.run(..., timeout=T)`` says only that the time was up. ``run_or_show_stacks``
asks the command where it is first: ``sarc`` prints its threads' stacks on SIGUSR1, and
``sarc train --workers P`` its agent's and workers' too (``sarc.distributed.stacks``).
Then it stops the command (SIGTERM: ``sarc train`` stops its run; SIGKILL after
``STOP_S``), and the test fails with the command's output, stacks included.

``sarc`` commands run forked from a preloaded interpreter where they can (``preloaded``):
each a process of its own, without the seconds of importing torch and sarc.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
from pathlib import Path

import preloaded

STACKS_S = 5.0   # how long the command has to print its stacks
STOP_S = 30.0    # how long it has to stop after SIGTERM
TAIL = 30_000    # the characters of stderr the failure shows (the stacks are at its end)


def run_or_show_stacks(cmd, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)``,
    except that a command still running after ``timeout`` seconds is asked for its stacks
    and stopped, and the test fails (AssertionError) with its output."""
    cmd = [os.fspath(c) if isinstance(c, os.PathLike) else c for c in cmd]
    kwargs.setdefault("text", True)
    proc = preloaded.popen(cmd, **kwargs) or subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(_hung(proc, cmd, timeout)) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _hung(proc: subprocess.Popen, cmd, timeout: float) -> str:
    """Ask ``proc`` for its stacks, stop it and whatever holds its output; what it said."""
    command = f"`{shlex.join(map(str, cmd))}`"
    if proc.poll() is None:
        what = f"{command} still ran after {timeout:g} s"
        if _catches_sigusr1(proc.pid):
            os.kill(proc.pid, signal.SIGUSR1)
            what += "; asked for its stacks (SIGUSR1), which end its stderr"
            _communicate(proc, STACKS_S)
        _signal_group(proc.pid, signal.SIGTERM)
        output = _communicate(proc, STOP_S)
        if output is None:
            _signal_group(proc.pid, signal.SIGKILL)
            output = _communicate(proc, STOP_S)
    else:
        what = f"{command} exited with status {proc.returncode}"
        output = None
    if output is None:  # processes it left hold its stdout or stderr open
        holders = _holders(proc)
        what += f"; after {timeout:g} s processes it left held its output open: {holders} (killed)"
        for pid in holders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output = _communicate(proc, STOP_S) or ("", "")
    out, err = output
    return f"{what}\n--- stdout (tail)\n{out[-4000:]}\n--- stderr (tail)\n{err[-TAIL:]}"


def _communicate(proc: subprocess.Popen, timeout: float) -> tuple[str, str] | None:
    """(stdout, stderr) once both are closed, else None after ``timeout`` (the output read
    so far is kept for the next call)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _catches_sigusr1(pid: int) -> bool:
    """``pid`` has a handler for SIGUSR1 (to a process without one it is fatal)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _holders(proc: subprocess.Popen) -> dict[int, str]:
    """pid -> command line of the processes that hold ``proc``'s stdout or stderr pipe."""
    pipes = {f"pipe:[{os.fstat(f.fileno()).st_ino}]" for f in (proc.stdout, proc.stderr)
             if f is not None and not f.closed}
    found = {}
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        with contextlib.suppress(OSError):
            pid = int(fd.parts[2])
            if pid != os.getpid() and os.readlink(fd) in pipes:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") \
                    .decode(errors="replace").strip()
    return found
