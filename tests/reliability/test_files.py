"""What ``--out`` may replace, and what a kill leaves behind.

``sarc compile --out`` and ``sarc partition --out`` write a directory through one
implementation (``sarc.atomic``): a non-empty ``--out`` is refused unless it is a set
sarc wrote (its ``sarc-set.json`` lists every file in it) and ``--overwrite`` is given;
the set is written beside it and swapped in. A process killed at any step leaves the old
set or the new one at ``--out``; the next run removes what a dead writer left (``.NAME.tmp-PID-*``,
``.NAME.old-PID-*``) and puts a complete old set back where ``--out`` went missing.

The kill tests fork a child that runs the real write and ``os._exit``s at one named step
(``sarc.atomic._step``), as SIGKILL would: no ``finally`` runs.
"""
from __future__ import annotations

import json
import os
import stat
import traceback
from pathlib import Path

import pytest
import torch

from sarc import atomic
from sarc.artifacts import compile_model, write_artifacts
from sarc.partition import load_partitions
from sarc.partition.pipeline import partition_graph

from .catalogue import case
from .harness import ROOT, assert_error, on_workers, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

GCN = ROOT / "models" / "gcn.py"
KILLED = 137


# --- helpers ------------------------------------------------------------------------------

def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` by relative name, with its bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def killed_at(step: str, write, *, exchange: bool = True) -> int:
    """Run ``write()`` in a forked child that dies (``os._exit``) when the replace reaches
    ``step``; the child's exit status (``KILLED`` if it got there)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            atomic._step = lambda s: os._exit(KILLED) if s == step else None
            if not exchange:
                atomic._exchange = lambda a, b: False
            write()
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture(scope="module")
def gcn_artifacts():
    """Two compiled GCN artifact sets: ``old`` (IR) and ``new`` (plan), as compile writes them."""
    from sarc.datasets import load_dataset
    from sarc.loader import load_model_file
    from sarc.train import DEFAULTS, build
    spec = load_model_file(str(GCN))
    hparams = {**DEFAULTS, **spec.hparams}
    model = build(spec, load_dataset(hparams["dataset"]), hparams)
    return compile_model(model, spec.name)


def small_graph():
    g = torch.Generator().manual_seed(0)
    n = 40
    src, dst = torch.randint(0, n, (200,), generator=g), torch.randint(0, n, (200,), generator=g)
    return src, dst, n, {"feat": torch.randn(n, 3, generator=g)}


# --- refusals: nothing is written, nothing is lost ------------------------------------------

@case("files", "`sarc compile --out .` in a project folder with the user's files", "nothing-lost")
def test_compile_out_dot_keeps_the_users_files(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine")
    (project / "model.py").write_text(GCN.read_text())
    before = snapshot(project)
    for extra in ([], ["--overwrite"]):
        proc = run_sarc("compile", "model.py", "--emit", "ir", "--out", ".", *extra, cwd=project)
        assert_error(proc, str(project), "not a set sarc wrote")
        assert snapshot(project) == before
    assert siblings(project) == ["project"]


@case("files", "`sarc compile --out` naming an existing file", "nothing-lost")
def test_compile_out_an_existing_file(tmp_path):
    target = tmp_path / "results"
    target.write_text("a file of the user's")
    proc = run_sarc("compile", GCN, "--emit", "ir", "--out", target, "--overwrite")
    assert_error(proc, str(target), "not a directory")
    assert target.read_text() == "a file of the user's"
    assert siblings(target) == ["results"]


@case("files", "`--out` a non-empty folder sarc did not write, with `--overwrite`", "nothing-lost")
def test_partition_overwrite_refuses_a_foreign_folder(tmp_path):
    out = tmp_path / "parts"
    out.mkdir()
    (out / "data.csv").write_text("1,2,3")
    proc = run_sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                    "--out", out, "--overwrite")
    assert_error(proc, str(out), "not a set sarc wrote", "sarc-set.json")
    assert snapshot(out) == {"data.csv": b"1,2,3"}
    assert siblings(out) == ["parts"]


@case("files", "`--out` a set sarc wrote into which the user put a file, with `--overwrite`",
      "nothing-lost")
def test_overwrite_refuses_a_set_holding_a_users_file(tmp_path, gcn_artifacts):
    out = tmp_path / "out"
    write_artifacts(gcn_artifacts, out, ("ir",))
    (out / "my-notes.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(atomic.DirectoryExistsError, match="my-notes.txt"):
        write_artifacts(gcn_artifacts, out, ("plan",), overwrite=True)
    assert snapshot(out) == before


@case("files", "`--out` a set sarc wrote with a file of the user's in a `__pycache__` folder, "
               "with `--overwrite`", "nothing-lost")
@pytest.mark.parametrize("inside", ["__pycache__/mydata/results.csv", "__pycache__/notes.txt",
                                    "kernels/__pycache__/x.py"])
def test_overwrite_refuses_a_users_file_in_a_pycache_folder(tmp_path, gcn_artifacts, inside):
    """Only the bytecode importing a generated module adds (``__pycache__/*.pyc``) is
    not the user's: the rest of such a folder was deleted with the set."""
    out = tmp_path / "out"
    write_artifacts(gcn_artifacts, out, ("ir",))
    (out / inside).parent.mkdir(parents=True, exist_ok=True)
    (out / inside).write_text("mine")
    (out / "__pycache__").mkdir(exist_ok=True)
    (out / "__pycache__" / "gcn.cpython-311.pyc").write_bytes(b"bytecode")
    before = snapshot(out)
    with pytest.raises(atomic.DirectoryExistsError, match=Path(inside).name):
        write_artifacts(gcn_artifacts, out, ("plan",), overwrite=True)
    assert snapshot(out) == before


def test_overwrite_replaces_a_set_with_bytecode_beside_its_modules(tmp_path, gcn_artifacts):
    out = tmp_path / "out"
    write_artifacts(gcn_artifacts, out, ("ir",))
    (out / "__pycache__").mkdir()
    (out / "__pycache__" / "gcn.cpython-311.pyc").write_bytes(b"bytecode")
    write_artifacts(gcn_artifacts, out, ("plan",), overwrite=True)
    assert not (out / "__pycache__").exists()


@case("files", "`sarc compile --out` a previous compile's set: refused without `--overwrite`, "
      "replaced with it", "old-or-new")
def test_compile_replaces_its_own_set_with_overwrite(tmp_path):
    out = tmp_path / "out"
    assert run_sarc("compile", GCN, "--emit", "ir", "--out", out).returncode == 0
    old = snapshot(out)
    assert "conv1.ir" in old and atomic.MANIFEST in old
    proc = run_sarc("compile", GCN, "--emit", "plan", "--out", out)
    assert_error(proc, str(out), "--overwrite")
    assert snapshot(out) == old
    proc = run_sarc("compile", GCN, "--emit", "plan", "--out", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert sorted(snapshot(out)) == sorted(["plan.txt", "plan.json", atomic.MANIFEST])
    assert json.loads((out / atomic.MANIFEST).read_text())["kind"] == "compile"
    assert siblings(out) == ["out"]


@case("files", "`sarc compile --out . --overwrite` run inside a set sarc wrote", "nothing-lost")
def test_compile_refuses_to_replace_the_current_directory(tmp_path):
    out = tmp_path / "out"
    assert run_sarc("compile", GCN, "--emit", "ir", "--out", out).returncode == 0
    before = snapshot(out)
    proc = run_sarc("compile", GCN, "--emit", "plan", "--out", ".", "--overwrite", cwd=out)
    assert_error(proc, str(out), "current directory")
    assert snapshot(out) == before


# --- kills: the old set or the new one, and the next run cleans up ---------------------------

STEPS = ["created", "written", "sealed", "swapped", "done"]
FALLBACK_STEPS = ["created", "written", "sealed", "aside", "swapped", "done"]


@case("files", "compile killed (SIGKILL) at each step of replacing `--out`", "old-or-new")
@pytest.mark.parametrize("exchange,step", [(True, s) for s in STEPS]
                         + [(False, s) for s in FALLBACK_STEPS])
def test_compile_killed_at_each_step(tmp_path, gcn_artifacts, exchange, step):
    out = tmp_path / "out"
    write_artifacts(gcn_artifacts, out, ("ir",))
    old, new = snapshot(out), snapshot_new(gcn_artifacts, tmp_path)
    assert killed_at(step, lambda: write_artifacts(gcn_artifacts, out, ("plan",), overwrite=True),
                     exchange=exchange) == KILLED
    expected = new if step in ("swapped", "done") else old
    if step != "aside":  # a reader sees a whole set right away
        assert snapshot(out) == expected
    else:  # the fallback's one window: --out missing, the old set whole beside it
        assert not out.exists()
    # the next run: leftovers of the dead writer go (the old set comes back where it went
    # missing), then this run's own rules apply
    with pytest.raises(atomic.DirectoryExistsError, match="--overwrite"):
        write_artifacts(gcn_artifacts, out, ("schedule",))
    assert snapshot(out) == expected
    assert siblings(out) == ["new-reference", "out"]
    write_artifacts(gcn_artifacts, out, ("schedule",), overwrite=True)
    assert "schedule.txt" in snapshot(out)
    assert siblings(out) == ["new-reference", "out"]


@case("files", "compile interrupted (Ctrl-C, an exception) at each step before the swap",
      "nothing-lost")
@pytest.mark.parametrize("step", ["created", "written", "sealed"])
def test_compile_interrupted_before_the_swap_leaves_the_old_set_alone(tmp_path, gcn_artifacts,
                                                                      monkeypatch, step):
    """A KeyboardInterrupt at a step before the new set replaces the old one: the old set
    stays as it was, and no temporary directory is left beside it."""
    out = tmp_path / "out"
    write_artifacts(gcn_artifacts, out, ("ir",))
    old = snapshot(out)

    def interrupted(name):
        if name == step:
            raise KeyboardInterrupt
    monkeypatch.setattr(atomic, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_artifacts(gcn_artifacts, out, ("plan",), overwrite=True)
    assert snapshot(out) == old
    assert siblings(out) == ["out"]


def snapshot_new(art, tmp_path: Path) -> dict[str, bytes]:
    ref = tmp_path / "new-reference"
    if not ref.exists():
        write_artifacts(art, ref, ("plan",))
    return snapshot(ref)


_SIGNALLED = """
import os, signal, sys
import torch
from sarc import atomic
from sarc.cli import main
command, sig, out = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3]
if command == "partition":    # the signal once the first part is written
    real = torch.save
    def save(*a, **k):
        real(*a, **k)
        os.kill(os.getpid(), sig)
    torch.save = save
    argv = ["partition", "--dataset", "cora", "--parts", "2", "--method", "random", "--out", out]
else:                         # the signal once the set is written, before it is sealed
    def step(name):
        if name == "written":
            os.kill(os.getpid(), sig)
    atomic._step = step
    argv = ["compile", sys.argv[4], "--emit", "plan", "--out", out]
sys.exit(main(argv))
"""


@case("files", "`sarc partition` / `sarc compile` stopped by SIGTERM or SIGHUP while writing",
      "nothing-lost")
@pytest.mark.parametrize("command", ["partition", "compile"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_partition_and_compile_stopped_by_a_signal_leave_nothing(tmp_path, command, sig):
    """Ctrl-C removed the set being written; SIGTERM killed the command and left it
    (.OUT.tmp-PID-*, parts of hundreds of MiB), silently."""
    import signal
    import subprocess
    import sys
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _SIGNALLED, command, sig, str(out), str(GCN)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr[-3000:]
    assert f"sarc {command}: stopped by {sig}" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@case("files", "`sarc partition --overwrite` killed while writing its parts", "old-or-new")
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_partition_killed_while_writing_parts(tmp_path, exchange):
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    partition_graph(src, dst, n, 2, out, method="random", node_data=nd)
    old = snapshot(out)
    saves = []
    real_save = torch.save

    def dying_save(obj, f, *a, **kw):  # the child dies inside its second part file
        saves.append(1)
        if len(saves) == 2:
            os._exit(KILLED)
        return real_save(obj, f, *a, **kw)

    def write():
        torch.save = dying_save
        partition_graph(src, dst, n, 3, out, method="random", node_data=nd, overwrite=True)
    assert killed_at("never", write, exchange=exchange) == KILLED
    assert snapshot(out) == old
    assert [p for p in siblings(out) if p.startswith(".parts.tmp-")]  # the dead writer's
    pset = partition_graph(src, dst, n, 3, out, method="random", node_data=nd, overwrite=True)
    assert pset.num_parts == 3 and load_partitions(out).num_parts == 3
    assert siblings(out) == ["parts"]


@case("files", "leftovers of a dead writer (`.NAME.tmp-PID-*`, `.NAME.old-PID-*`, `--out` "
      "missing)", "old-or-new")
def test_leftovers_are_cleaned_and_a_missing_set_restored(tmp_path):
    src, dst, n, nd = small_graph()
    out = tmp_path / "parts"
    partition_graph(src, dst, n, 2, out, method="random", node_data=nd)
    old = snapshot(out)
    dead = _dead_pid()
    # a writer killed between its renames (no renameat2): the set aside, --out missing
    os.rename(out, tmp_path / f".parts.old-{dead}-0badf00d")
    (tmp_path / f".parts.tmp-{dead}-12345678").mkdir()
    (tmp_path / f".parts.tmp-{dead}-12345678" / "part-0.pt").write_bytes(b"half")
    live = tmp_path / f".parts.tmp-{os.getpid()}-abcdef01"  # a live writer's: left alone
    live.mkdir()
    proc = run_sarc("partition", "--dataset", "cora", "--parts", "2", "--out", out)
    assert_error(proc, str(out), "--overwrite")
    assert snapshot(out) == old
    assert siblings(out) == [live.name, "parts"]


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@case("files", "`--out` a name of 255 bytes (the longest a file system allows), replaced and "
      "killed mid-replace", "old-or-new")
@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
@pytest.mark.parametrize("name", ["b" * 255, "é" * 127 + "b"], ids=["ascii", "two-byte"])
def test_the_longest_out_name(tmp_path, gcn_artifacts, name, exchange):
    out = tmp_path / name
    write_artifacts(gcn_artifacts, out, ("ir",))
    old = snapshot(out)
    assert killed_at("sealed", lambda: write_artifacts(gcn_artifacts, out, ("plan",),
                                                        overwrite=True), exchange=exchange) == KILLED
    assert snapshot(out) == old and len(siblings(out)) == 2  # the dead writer's sibling
    assert killed_at("never", lambda: write_artifacts(gcn_artifacts, out, ("plan",),
                                                       overwrite=True), exchange=exchange) == 0
    assert "plan.txt" in snapshot(out) and siblings(out) == [name]  # and the leftover went


@case("files", "`--json` or `--save` naming a file inside a set sarc wrote (a partition the run "
      "does not read)", "nothing-lost")
@pytest.mark.parametrize("option", ["--json", "--save"])
def test_a_result_inside_a_set_sarc_wrote_is_refused(tmp_path, option):
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
    pset = partition_graph(src, dst, 4, 2, tmp_path / "parts", method="random")
    target = pset.part_path(0)
    before = snapshot(tmp_path / "parts")
    proc = run_sarc("train", GCN, "--epochs", "1", option, target)
    assert_error(proc, f"{option} {target}", "inside a set sarc wrote")
    assert snapshot(tmp_path / "parts") == before


@case("files", "`--json` over an existing report of mode 0600", "nothing-lost")
def test_a_report_written_over_keeps_its_mode(tmp_path):
    from sarc.training.loop import write_result
    report = tmp_path / "r.json"
    report.write_text("{}")
    report.chmod(0o600)
    write_result(str(report), {"loss": 1.0})
    assert json.loads(report.read_text())["loss"] == 1.0
    assert report.stat().st_mode & 0o777 == 0o600
    fresh = tmp_path / "new.json"
    write_result(str(fresh), {"loss": 1.0})
    umask = os.umask(0)
    os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o666 & ~umask


@case("files", "`--json` and `--save` onto a link, over a 0644 file, with 1 process and 2 "
      "workers", "nothing-lost")
@pytest.mark.parametrize("workers", [1, 2])
def test_results_are_written_through_links_with_the_mode_open_would_give(tmp_path, workers):
    """Workers' rank 0 replaced a link with a file of mode 0600 (its ``--json`` on a link to
    /proc/self/fd/1 replaced the link, and ``/dev/stdout`` as root); ``--save`` did on one
    process too, and left every file it wrote 0600."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "report.json").symlink_to(real / "report.json")
    (tmp_path / "model.pt").symlink_to(real / "model.pt")
    (real / "model.pt").write_bytes(b"old")
    (real / "model.pt").chmod(0o644)
    proc = run_sarc("train", GCN, "--epochs", "1", "--json", tmp_path / "report.json",
                    "--save", tmp_path / "model.pt", *on_workers(workers))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("report.json", "model.pt"):
        assert (tmp_path / name).is_symlink(), name
        assert (real / name).stat().st_size > 3, name
    assert json.loads((real / "report.json").read_text())["epochs"] == 1
    assert (real / "model.pt").stat().st_mode & 0o777 == 0o644
    umask = os.umask(0)
    os.umask(umask)
    assert (real / "report.json").stat().st_mode & 0o777 == 0o666 & ~umask


@case("files", "`--save` onto a pipe, or `/dev/stdout`", "error")
def test_save_onto_a_pipe_is_refused_before_training_and_the_pipe_stays(tmp_path):
    """A saved model is written beside its path and replaces it: a pipe (a device, as root
    /dev/null) was replaced by a regular file, and /dev/stdout failed after training."""
    from sarc.checkpoint import write_atomic
    from sarc.errors import OutputError
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, "/dev/stdout"):
        proc = run_sarc("train", GCN, "--epochs", "1", "--save", target)
        assert_error(proc, f"--save {target} is not a regular file")
        assert "epoch" not in proc.stdout
    with pytest.raises(OutputError, match="fifo: cannot be written: not a regular file"):
        write_atomic(fifo, b"weights")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


@case("files", "`--json` / `--save` a link loop, or a link into a directory sarc cannot write "
      "in", "error")
def test_a_link_loop_or_a_link_into_an_unwritable_directory_is_refused_before_training(tmp_path):
    """A loop ended the run, after training, with a bare RuntimeError; a link to a file in a
    directory where no file can be made passed the check and failed after training (the
    report is written beside the file the link names: that directory is checked)."""
    from sarc.checkpoint import write_atomic
    from sarc.cli.options import UsageError, check_output_file
    from sarc.errors import OutputError
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop.json")
    with pytest.raises(UsageError, match="loop.json.*link"):
        check_output_file("--json", str(loop))
    with pytest.raises(OutputError, match="loop.json: cannot be written"):
        write_atomic(loop, b"{}")
    gone = tmp_path / "gone"   # a link to a file in a directory that is not there
    (tmp_path / "r.json").symlink_to(gone / "r.json")
    with pytest.raises(UsageError, match=f"the directory {gone} does not exist"):
        check_output_file("--json", str(tmp_path / "r.json"))


@case("files", "`sarc train --workers 2` run in a folder holding a `sarc` package of its own "
      "(another checkout's)", "exact")
def test_workers_import_the_sarc_that_launched_them(tmp_path):
    """``python -m`` puts the current directory first on the path: torchrun and the workers
    imported the folder's sarc (silently, where it is another version) instead of the one
    ``sarc train`` runs."""
    (tmp_path / "sarc").mkdir()
    (tmp_path / "sarc" / "__init__.py").write_text(
        'raise ImportError("the sarc of the current directory")\n')
    proc = run_sarc("train", ROOT / "models" / "gcn.py", "--epochs", "1", "--workers", "2",
                    "--method", "random", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the sarc of the current directory" not in proc.stdout + proc.stderr
    assert any(line.startswith("epoch") for line in proc.stdout.splitlines()), proc.stdout


def _linked_folder(tmp_path: Path) -> Path:
    """``tmp_path/lnk``, a link to ``real/sub``: ``lnk/../x`` is ``real/x`` to the system,
    ``./x`` to a path collapsed as text."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to("real/sub")
    return tmp_path / "real"


@case("files", "`--out lnk/../x`, `lnk` a link to a folder elsewhere", "exact")
def test_out_through_a_link_and_dotdot_is_where_the_system_puts_it(tmp_path):
    """The set was written to ./x (``..`` collapsed as text), and the path printed named
    nothing."""
    real = _linked_folder(tmp_path)
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--emit", "plan", "--out",
                    "lnk/../x", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (real / "x" / "plan.txt").is_file() and not (tmp_path / "x").exists()


@case("checkpoint", "`--checkpoint lnk/../ck`, `lnk` a link to a folder elsewhere", "exact")
def test_checkpoint_through_a_link_and_dotdot(tmp_path):
    """The run trained every epoch, then failed at its first checkpoint: the temporary
    file's name had ``..`` collapsed as text."""
    real = _linked_folder(tmp_path)
    proc = run_sarc("train", ROOT / "models" / "gcn.py", "--epochs", "2", "--threads", "1",
                    "--checkpoint", "lnk/../ck", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (real / "ck" / "checkpoint.json").is_file() and not (tmp_path / "ck").exists()


@case("files", "`SARC_CACHE_DIR=lnk/../cache`, where `./cache` is writable by all",
      "nothing-lost")
def test_the_module_cache_checked_is_the_one_imported_from(tmp_path):
    """The folder the system resolves was checked (private), but the modules were written to
    and imported from ./cache, collapsed as text: a folder anyone could write, which sarc
    refuses when named."""
    real = _linked_folder(tmp_path)
    (tmp_path / "cache").mkdir()
    os.chmod(tmp_path / "cache", 0o777)
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--emit", "plan", "--out",
                    tmp_path / "out", cwd=tmp_path,
                    env={"SARC_CACHE_DIR": str(tmp_path / "lnk" / ".." / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list((tmp_path / "cache").iterdir())
    assert any(f.suffix == ".py" for f in (real / "cache").iterdir())


def test_a_worker_refuses_a_sarc_other_than_its_launchers(monkeypatch, tmp_path):
    """Where PYTHONSAFEPATH does nothing (Python 3.10), a worker that imported another sarc
    says so instead of running it."""
    from sarc.distributed.launch import LAUNCHER_SARC, DistError, check_launchers_sarc
    monkeypatch.setenv(LAUNCHER_SARC, str(ROOT / "sarc"))
    check_launchers_sarc()
    monkeypatch.setenv(LAUNCHER_SARC, str(tmp_path / "sarc"))
    with pytest.raises(DistError, match=r"this worker imported sarc from .*, but sarc train "
                                         r"runs the one in .*tmp.*sarc"):
        check_launchers_sarc()
