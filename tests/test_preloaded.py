"""The tests' preloaded interpreter (``preloaded``): a ``sarc`` command forked from it is a
process of its own, with the working directory, environment, ``sys.path``, output and exit
status a fresh ``python -m sarc.cli`` would have; what it cannot give runs fresh."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import preloaded
from timeouts import run_or_show_stacks

PROBE = """
import json, os, sys
print(json.dumps({"pid": os.getpid(), "sid": os.getsid(0), "cwd": os.getcwd(),
                  "probe": os.environ.get("SARC_PROBE"), "path0": sys.path[0],
                  "argv0": sys.argv[0], "stdin": sys.stdin.read(), "hash": hash("sarc")}),
      flush=True)
print("said on stderr", file=sys.stderr, flush=True)
"""


def _forked(cmd, **kwargs):
    proc = preloaded.popen(cmd, **kwargs)
    assert isinstance(proc, preloaded.ForkedProcess), "the command was not forked"
    out, err = proc.communicate(timeout=120)
    return proc, out, err


def test_a_forked_command_is_a_process_of_its_own_where_and_as_it_was_asked(tmp_path):
    (tmp_path / "model.py").write_text(PROBE)
    env = {**os.environ, "SARC_PROBE": "here"}
    cmd = [sys.executable, "-m", "sarc.cli", "compile", "model.py", "--out", "o"]
    proc, out, err = _forked(cmd, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    seen = json.loads(out.splitlines()[0])
    assert seen["pid"] == proc.pid and seen["sid"] == proc.pid != os.getsid(0)
    assert seen["cwd"] == seen["path0"] == str(tmp_path)
    assert seen["probe"] == "here" and seen["stdin"] == ""
    assert seen["argv0"].endswith(os.path.join("sarc", "cli", "__main__.py"))
    # the model file has no build_model: sarc's own error, as a fresh interpreter says it
    fresh = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == fresh.returncode == 2
    assert err == fresh.stderr and "said on stderr" in err and "Traceback" not in err
    # the next command has another hash seed, as a fresh interpreter would
    again = json.loads(_forked(cmd, cwd=tmp_path, env=env)[1].splitlines()[0])
    assert again["pid"] != seen["pid"] and again["hash"] != seen["hash"]


def test_the_exit_status_of_a_forked_command_is_its_own_a_signal_negative(tmp_path):
    (tmp_path / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "empty.py").write_text("")
    for model, status in (("killed.py", -9), ("empty.py", 2)):
        proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "compile", model],
                                  cwd=tmp_path, timeout=120)
        assert proc.returncode == status, (model, proc.stderr)
    # the preloaded interpreter runs the next command as before
    proc = run_or_show_stacks([sys.executable, "-m", "sarc", "--version"], timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("sarc ")


def test_what_an_interpreter_reads_as_it_starts_runs_fresh():
    cmd = [sys.executable, "-m", "sarc.cli", "--version"]
    assert preloaded.popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}) is None
    assert preloaded.popen(cmd, env={**os.environ, "MALLOC_ARENA_MAX": "2"}) is None
    assert preloaded.popen([sys.executable, "-c", "print(1)"]) is None
    assert preloaded.popen(cmd, stdin=subprocess.PIPE) is None
    proc = preloaded.popen(cmd, env={**os.environ, "SARC_DEBUG": "1"})
    assert isinstance(proc, preloaded.ForkedProcess)
    assert proc.communicate(timeout=120)[0].startswith("sarc ")


def test_the_sarc_script_has_its_folder_first_on_the_path_as_when_run_fresh(tmp_path):
    if not preloaded._SCRIPT.exists():
        pytest.skip("no sarc script beside this interpreter (sarc not installed)")
    (tmp_path / "model.py").write_text(PROBE)
    _, out, _ = _forked([str(preloaded._SCRIPT), "compile", "model.py"], cwd=tmp_path)
    assert json.loads(out.splitlines()[0])["path0"] == str(preloaded._SCRIPT.parent)
