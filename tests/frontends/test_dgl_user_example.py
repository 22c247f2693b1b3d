"""README's "For DGL users": the script it shows is examples/dgl_user.py, and the script equals
the plain DGL script (its lines commented ``sarc`` removed) epoch for epoch (.venv-dgl)."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

pytest.importorskip("dgl")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "dgl_user.py"
EPOCHS = 10


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## For DGL users", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_shows_the_tested_script():
    assert _readme_block() == SCRIPT.read_text()


def test_three_lines_make_the_dgl_script_a_sarc_one():
    source = SCRIPT.read_text()
    marked = [line for line in source.splitlines() if line.rstrip().endswith("# sarc")]
    assert len(marked) == 3
    plain = "\n".join(line for line in source.splitlines() if line not in marked)
    assert "sarc." not in plain.replace("from sarc.datasets import load_dataset", "")

    namespace = {"__name__": "dgl_user_plain"}
    exec(compile(plain, "dgl_user_plain.py", "exec"), namespace)
    want_losses, want_acc = namespace["main"](EPOCHS)
    got_losses, got_acc = runpy.run_path(str(SCRIPT), run_name="dgl_user")["main"](EPOCHS)
    assert got_losses == pytest.approx(want_losses, rel=1e-5)
    assert got_acc == pytest.approx(want_acc, abs=1e-3)


def _sarc_train(*argv):
    import os
    import subprocess
    import sys

    from timeouts import run_or_show_stacks
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", "examples/dgl_gcn.py",
                               "--epochs", "3", *argv], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("selected epoch")][0]


def test_sarc_trains_a_model_file_of_dgl_layers_on_one_and_two_workers():
    one = _sarc_train()
    two = _sarc_train("--workers", "2", "--method", "random", "--timeout", "60")
    accuracies = re.compile(r"val [0-9.]+ test [0-9.]+")
    assert accuracies.search(one).group() == accuracies.search(two).group()


def _sarc(command, model, *argv):
    import os
    import subprocess
    import sys

    from timeouts import run_or_show_stacks
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", command, f"examples/{model}",
                               *argv], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_model_file_of_patched_dgl_convs_compiles_and_trains_as_wrapped_ones(tmp_path):
    """examples/dgl_patched.py calls DGL's GraphConv after patch(): its layers are made at the
    convs' first call, not modules of the model. compile finds them (named after their
    convs) and plans what examples/dgl_gcn.py's from_dgl_module layers plan; a sampling step
    gives each conv a block (two fanouts), on one process and two workers, to the same
    accuracies as the wrapped model."""
    table = re.compile(r"^(layer .*|conv\d .*)$", re.M)
    plans = [table.findall(_sarc("compile", model, "--mode", "mfg", "--out",
                                 str(tmp_path / model)))
             for model in ("dgl_patched.py", "dgl_gcn.py")]
    rows = [p.split()[0] for p in plans[0] if p.startswith("conv")]
    assert plans[0] == plans[1] and rows == ["conv1", "conv2"], plans
    selected = re.compile(r"selected epoch .*val [0-9.]+ test [0-9.]+")
    sampling = ("train", "--epochs", "2", "--mode", "sampling", "--fanouts", "4,4")
    wrapped = selected.search(_sarc(*sampling[:1], "dgl_gcn.py", *sampling[1:])).group()
    for workers in ("1", "2"):
        out = _sarc(*sampling[:1], "dgl_patched.py", *sampling[1:], "--workers", workers,
                    "--method", "random", "--timeout", "60")
        assert selected.search(out).group() == wrapped
