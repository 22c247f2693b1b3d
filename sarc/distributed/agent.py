"""torchrun as ``sarc train`` runs it: ``python -m sarc.distributed.agent [torchrun's arguments]``.

It is ``torch.distributed.run``, with what a run of ``sarc train`` needs around it
(``sarc.distributed.supervise``):

- it dies with ``sarc train``: SIGTERM when its parent dies, on which torchrun stops
  the workers; however it ends after ``sarc train`` died (stopped, or its workers
  failed first), it ends what is left of the run and removes the run's directory
  (``SARC_RUN_DIR``), which ``sarc train`` can no longer do; and it names itself the
  workers' parent (``SARC_PARENT_PID``), so that they die with it;
- torchrun's own files (``torchelastic_*``, its log directories) go in the run's
  directory, and go with it;
- workers that failed are written to ``RUN_DIR/failures.json`` (global rank, pid, exit
  status; a negative status is the signal that killed it) for ``sarc train``'s message,
  instead of torchrun's traceback and table: a worker that stopped with an error has
  said why itself;
- on SIGUSR1 it writes its threads' stacks (``sarc.distributed.stacks``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from .stacks import dump_on_signal
from .supervise import (FAILURES, GONE_WAIT_S, PARENT_ENV, RUN_DIR_ENV, RUN_ENV,
                        die_with_parent, end_run_processes, parent_gone)

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""Those on which torchrun's handler raises."""
_QUIET = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api")


class _Terminated(BaseException):
    """SIGTERM before torchrun has its own handler."""


def _terminated(signum, frame):
    raise _Terminated()


def main(argv: list[str] | None = None) -> int:
    parent = os.environ.get(PARENT_ENV)
    run_dir = os.environ.get(RUN_DIR_ENV)
    signal.signal(signal.SIGTERM, _terminated)
    dump_on_signal("torchrun", run_dir)
    try:
        return _run_torchrun(argv, run_dir)
    finally:
        # however torchrun ended (stopped, its workers failed): once sarc train is gone,
        # nobody else removes the run's directory
        if run_dir and parent and parent.isdigit():
            _remove_if_orphaned(run_dir, int(parent))


def _remove_if_orphaned(run_dir: str, parent: int) -> None:
    """Remove the run's directory if ``sarc train`` (``parent``) is gone, once every other
    process of the run has ended (``end_run_processes``: a worker torchrun did not stop in
    time, or one that is still ending, would write its logs or its error file into the
    directory while it goes, and leave it behind).

    A dying ``sarc train`` signals the agent once per thread it ends (see ``parent_gone``),
    and the handler then installed (torchrun's, or ``_terminated``) raises: a signal that
    comes before this ignores them, or while it checks, starts it again instead of
    skipping the removal (a killed ``sarc train`` left its directory behind)."""
    while True:
        try:
            with _stop_signals_ignored():
                if parent_gone(parent):
                    token = os.environ.get(RUN_ENV)
                    if token:
                        end_run_processes(token, GONE_WAIT_S)
                    shutil.rmtree(run_dir, ignore_errors=True)
            return
        except _raised_by_stop_signals():
            continue


def _raised_by_stop_signals() -> tuple[type[BaseException], ...]:
    """What a stop signal's handler raises in the agent: ``_terminated``'s exception,
    Python's on SIGINT, and torchrun's where torchrun is loaded."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    signalled = getattr(api, "SignalException", None)
    return (_Terminated, KeyboardInterrupt) + ((signalled,) if signalled else ())


@contextlib.contextmanager
def _stop_signals_ignored():
    """While the run's directory is removed, a stop signal must not end the removal
    halfway, as a raising handler would."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_torchrun(argv: list[str] | None, run_dir: str | None) -> int:
    """torchrun's exit status as ``sarc train`` reads it (failed workers in FAILURES)."""
    try:
        if not die_with_parent(signal.SIGTERM):
            raise _Terminated()
        if run_dir:
            tempfile.tempdir = run_dir
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        try:
            torchrun.main(argv)
        except ChildFailedError as e:
            if not run_dir:
                raise
            failures = [{"rank": int(rank), "local_rank": f.local_rank, "pid": f.pid,
                         "exitcode": f.exitcode} for rank, f in sorted(e.failures.items())]
            (Path(run_dir) / FAILURES).write_text(json.dumps(failures))
            return 1
        except SignalException as e:
            raise _Terminated() from e
    except _Terminated:
        return 128 + signal.SIGTERM
    return 0

if __name__ == "__main__":
    sys.exit(main())
