"""Shared test setup: the model zoo and the test helpers on sys.path, a fixed seed."""
from __future__ import annotations

import faulthandler
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "tests"))

# One intra-op thread in the test process: the distributed tests fork workers, and a child
# forked from a process whose OpenMP pool has run threads can hang in it (libgomp is not
# fork-safe). It also makes float results independent of the machine's core count.
torch.set_num_threads(1)

# Without a GPU, Triton kernels run in Triton's interpreter. Set before any test module
# imports one (``@triton.jit`` reads it when a kernel is decorated), whatever the order the
# test files are collected in.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Property tests draw the same examples on every run of the suite (a profile seeded by each
# test's own code): what passed once passes again, and a failure is reproduced by running
# again. SARC_HYPOTHESIS=random draws fresh examples each run, to look for new failures;
# pin each one found with @example. Neither profile times an example or its drawing
# (no deadline, no HealthCheck.too_slow): on a loaded machine they fail a test whose
# examples are the same as on an idle one.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("fixed", derandomize=True, database=None, print_blob=True,
                          **_UNTIMED)
settings.register_profile("random", print_blob=True, **_UNTIMED)
settings.load_profile(os.environ.get("SARC_HYPOTHESIS", "fixed"))

# Generated modules go to a per-run temp dir, not the user's cache.
os.environ.setdefault("SARC_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"sarc-test-{os.getpid()}"))


# A test stuck in a call that never returns (a gloo teardown blocked holding the GIL, where
# no Python-level timeout runs) ends the run after TEST_LIMIT_S with every thread's stack,
# rather than hanging it. faulthandler's watchdog is a thread: a process forked while it
# runs inherits its locks, not the thread, and hangs for good in its own
# dump_traceback_later; so it is stopped around every fork and restarted in the parent
# for the time the test has left (pytest's faulthandler_timeout does not do that).
TEST_LIMIT_S = float(os.environ.get("SARC_TEST_LIMIT_S", "300"))
_watch: dict = {}
"""While a test runs: its deadline and the file descriptor the stacks go to."""
_stderr: list[int] = []


def _watch_again() -> None:
    if _watch:
        faulthandler.dump_traceback_later(max(1.0, _watch["deadline"] - time.monotonic()),
                                          exit=True, file=_watch["fd"])


def _unwatch() -> None:
    if _watch:
        faulthandler.cancel_dump_traceback_later()


os.register_at_fork(before=_unwatch, after_in_parent=_watch_again)


def pytest_configure(config):
    _stderr.append(os.dup(2))  # the terminal's stderr: a test's own is captured


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _watch.update(deadline=time.monotonic() + TEST_LIMIT_S, fd=_stderr[0])
    _watch_again()
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        _watch.clear()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
