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
