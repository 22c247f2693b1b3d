"""``python -m sarc.cli ARGV`` for the tests, forked from an interpreter that has imported sarc.

Each ``sarc`` command a test runs would start by importing torch, sympy and sarc: about
3 s of CPU on the 2-core CI machine, most of a one-process run and a quarter of a
two-worker one, a few hundred times a suite. A preloaded interpreter imports them once,
as building ``sarc``'s parser does, and forks a child per command (two per test process,
started at its first commands, taking turns: two commands in a row differ in their hash
seed, as two fresh interpreters would). The child is a process of its own, as the command's
would be: its pid, session (``start_new_session``), stdin (``/dev/null``), stdout and stderr
pipes, working directory, environment, ``sys.argv`` / ``sys.path`` as ``python -m`` sets
them, and exit status (a signal's as negative); it runs the ``__main__`` of ``sarc.cli``
and ends as an interpreter does (threads joined, ``atexit``, streams flushed).

What a fresh interpreter reads only when it starts cannot be given to a fork: a command
whose environment differs from the preloaded one's in anything but the variables sarc,
Triton and Python's path read while running (``RUNTIME_ENV``) runs in a fresh interpreter,
as does any command other than ``python -m sarc.cli`` / ``sarc`` or with other
``Popen`` options. ``SARC_TESTS_FRESH=1`` runs every command in a fresh interpreter.

    python tests/preloaded.py FD     the preloaded interpreter (FD: its socket)
"""
from __future__ import annotations

import io
import json
import locale
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_ENV = ("SARC_", "TRITON_", "TORCHELASTIC_", "MASTER_", "XDG_", "PYTEST_", "PYTHONPATH",
               "HOME", "TMPDIR", "COLUMNS", "LINES")
"""Variables (a name, or its start) that are read while a command runs, not when its
interpreter starts: a command's environment may differ from the preloaded one's in these."""
_MAX_REQUEST = 1 << 20


# -- the preloaded interpreter --------------------------------------------------------------

def serve(fd: int) -> int:
    """Fork a child per request on the socket ``fd`` until it closes; in the parent this
    returns 0 at the end, in each child the command's run raises or returns its status."""
    sys.path[0] = os.getcwd()        # as for python -m (not this file's folder, the tests')
    import sarc.cli
    sarc.cli.build_parser()          # imports every subcommand, as each command does first
    sock = socket.socket(fileno=fd)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
        except OSError:
            return 0
        if not msg:
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            return _run_command(json.loads(msg), fds)
        for f in fds:
            os.close(f)
        sock.send(str(pid).encode())
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        try:
            sock.send(str(status).encode())
        except OSError:
            return 0


def _run_command(request: dict, fds: list[int]) -> int:
    """In the child: become the command's process and run ``python -m MODULE ARGV``."""
    import importlib.util
    import runpy
    os.setsid()
    for target, f in enumerate(fds):
        os.dup2(f, target)
    for f in fds:
        if f > 2:
            os.close(f)
    os.chdir(request["cwd"])
    before = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    after = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    dropped = {os.path.abspath(p) for p in before.split(os.pathsep) if p}
    sys.path[:] = [request["path0"], *map(os.path.abspath, after),
                   *(p for p in sys.path[1:] if os.path.abspath(p) not in dropped)]
    module = request["module"]
    sys.argv = [importlib.util.find_spec(module + ".__main__").origin, *request["argv"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


# -- the tests' side ------------------------------------------------------------------------

class _Server:
    """A preloaded interpreter of this test process, and the one command it runs at a time."""

    def __init__(self):
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        # its own output is nobody's: a command's goes to the pipes its request passes
        self.proc = subprocess.Popen([sys.executable, __file__, str(its.fileno())],
                                     pass_fds=[its.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     cwd=ROOT, env=self.env)
        its.close()
        self.sock = mine
        self.running: ForkedProcess | None = None
        self.lock = threading.Lock()

    def idle(self) -> bool:
        """No command of this process runs (one that was left running is asked first)."""
        return self.running is None or self.running.poll() is not None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_servers: list[_Server] = []
_turn = 0


def _preloaded() -> _Server | None:
    """The preloaded interpreter for this process's next command, started at first use;
    None once it is gone (it failed to start, or died): commands then run fresh. Commands
    alternate between two, so that two in a row (a run and its resumption, compared) differ
    in their hash seed as fresh interpreters would."""
    global _turn
    if len(_servers) < 2:
        import atexit
        _servers.append(_Server())
        atexit.register(_servers[-1].close)
    server = _servers[_turn % 2]
    _turn += 1
    return server if server.alive() else None


_SCRIPT = Path(sys.executable).with_name("sarc")


def _module(cmd: list[str]) -> str | None:
    """The module ``cmd`` runs as ``__main__``, where it is sarc's command line (``python -m
    sarc.cli``, ``python -m sarc`` or the ``sarc`` script)."""
    if cmd[:2] == [sys.executable, "-m"] and cmd[2:3] in (["sarc.cli"], ["sarc"]):
        return cmd[2]
    if cmd and Path(cmd[0]) == _SCRIPT:
        return "sarc.cli"
    return None


ANSWER_S = 120.0
"""How long the preloaded interpreter has to fork a command and name its pid."""


def _start_differs(env: dict, base: dict) -> bool:
    """``env`` differs from ``base`` in a variable read when an interpreter starts."""
    keys = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
    return any(not k.startswith(RUNTIME_ENV) for k in keys)


def popen(cmd: list[str], *, cwd=None, env=None, stdin=None, text=True, **kwargs):
    """A started command: a ``ForkedProcess`` where the preloaded interpreter can run it,
    else None (the caller starts it as usual)."""
    module = _module(cmd)
    if module is None or kwargs or stdin not in (None, subprocess.DEVNULL) \
            or os.environ.get("SARC_TESTS_FRESH", "") not in ("", "0"):
        return None
    env = dict(os.environ if env is None else env)
    server = _preloaded()
    if server is None or _start_differs(env, server.env) \
            or not server.lock.acquire(blocking=False):
        return None
    try:
        if not server.idle():
            return None
        script = cmd[1:2] != ["-m"]     # the sarc script: its folder first on the path
        cwd = os.path.abspath(cwd or os.getcwd())
        request = json.dumps({"module": module, "argv": cmd[1 if script else 3:], "env": env,
                              "cwd": cwd, "path0": str(_SCRIPT.parent) if script else cwd})
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            try:
                socket.send_fds(server.sock, [request.encode()], [null, out_w, err_w])
            except OSError:       # nothing was sent: the command runs fresh
                os.close(out_r)
                os.close(err_r)
                return None
            server.sock.settimeout(ANSWER_S)
            try:
                pid = int(server.sock.recv(64))
            except BaseException as e:   # it may have forked the command: never run it twice
                server.proc.kill()
                os.close(out_r)
                os.close(err_r)
                raise AssertionError(f"the preloaded interpreter (tests/preloaded.py) did not "
                                     f"start {cmd}: {e!r}") from e
            server.sock.settimeout(None)
        finally:
            for f in (null, out_w, err_w):
                os.close(f)
        server.running = ForkedProcess(cmd, pid, server, out_r, err_r, text)
        return server.running
    finally:
        server.lock.release()


class ForkedProcess:
    """What ``subprocess.Popen`` offers of a command the preloaded interpreter forked:
    ``pid``, ``args``, ``returncode``, ``stdout`` / ``stderr`` (the pipes' read ends),
    ``poll``, ``wait`` and ``communicate`` (output kept across timeouts)."""

    def __init__(self, args, pid: int, server: _Server, out_r: int, err_r: int, text: bool):
        self.args, self.pid, self.returncode = args, pid, None
        self._server, self._text = server, text
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)
        self._read = {self.stdout: [], self.stderr: []}
        self._open = [self.stdout, self.stderr]

    def poll(self):
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status the preloaded interpreter relays (-9 if it is gone)."""
        if self.returncode is None:
            with selectors.DefaultSelector() as sel:
                sel.register(self._server.sock, selectors.EVENT_READ)
                if not sel.select(timeout):
                    raise subprocess.TimeoutExpired(self.args, timeout)
            said = self._server.sock.recv(64)
            self.returncode = int(said) if said else -9
        return self.returncode

    def communicate(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for f in self._open:
                sel.register(f, selectors.EVENT_READ)
            while self._open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    chunk = key.fileobj.read(1 << 16)
                    if chunk:
                        self._read[key.fileobj].append(chunk)
                    else:
                        sel.unregister(key.fileobj)
                        self._open.remove(key.fileobj)
                        key.fileobj.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tuple(self._decoded(b"".join(self._read[f])) for f in (self.stdout, self.stderr))

    def _decoded(self, data: bytes):
        if not self._text:
            return data
        return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
