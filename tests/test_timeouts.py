"""The tests' runner of commands (``timeouts.run_or_show_stacks``): a command that runs past
its time fails the test with where it was, and one that left a process holding its output
open names that process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import timeouts
from timeouts import run_or_show_stacks

STUCK = """
import faulthandler, signal, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # as sarc's command line does
def wait_for_a_peer():
    time.sleep(600)
print("waiting", flush=True)
wait_for_a_peer()
"""

LEAVES_A_CHILD = """
import subprocess
subprocess.Popen(["sleep", "600"])  # inherits stdout and stderr
print("done", flush=True)
"""


def test_a_command_past_its_time_shows_its_stacks(monkeypatch):
    monkeypatch.setattr(timeouts, "STACKS_S", 1.0)
    with pytest.raises(AssertionError) as failed:
        run_or_show_stacks([sys.executable, "-c", STUCK], timeout=2)
    text = str(failed.value)
    assert "still ran after 2 s; asked for its stacks" in text, text
    assert 'line 5 in wait_for_a_peer' in text and "waiting" in text, text


def test_a_process_left_holding_the_output_is_named_and_killed():
    with pytest.raises(AssertionError) as failed:
        run_or_show_stacks([sys.executable, "-c", LEAVES_A_CHILD], timeout=2)
    text = str(failed.value)
    assert "exited with status 0; after 2 s processes it left held its output open" in text, text
    assert "'sleep 600'" in text and "done" in text, text


def test_a_command_within_its_time_is_a_completed_process():
    proc = run_or_show_stacks([sys.executable, "-c", "print('hi')"], timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hi\n", "")


SUITE = '''
import faulthandler, multiprocessing, time

def _child(q):
    faulthandler.dump_traceback_later(60)   # hung for good if the parent's watchdog came along
    faulthandler.cancel_dump_traceback_later()
    q.put("ok")

def test_forks_a_process_that_uses_faulthandler():
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(20)
    assert not p.is_alive() and q.get(timeout=1) == "ok"

def test_stuck_for_good():
    time.sleep(600)
'''


def test_the_suite_ends_a_stuck_test_with_its_stacks_and_forks_safely(tmp_path):
    """tests/conftest.py's per-test limit: a test past it ends the run with where it was;
    a process forked under the watch (as the distributed tests do) is not left hung."""
    (tmp_path / "conftest.py").write_text(Path(__file__).with_name("conftest.py").read_text())
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**os.environ, "SARC_TEST_LIMIT_S": "8"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path / "test_suite.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert done.stdout.startswith("."), done.stdout  # the forking test passed
    assert "Timeout" in done.stderr and "in test_stuck_for_good" in done.stderr, done.stderr
