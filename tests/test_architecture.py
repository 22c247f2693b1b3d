"""The import direction of docs/architecture.md holds: each package imports only the
packages its row allows (function-local imports included), and no two import each other."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

GROUPS = {"sarc.train": "sarc.training", "sarc.checkpoint": "sarc.training",
          "sarc.trace_torch": "sarc.trace", "sarc.trace_guards": "sarc.trace",
          "sarc.layer_state": "sarc.dsl"}
"""Modules that the table names as one package (docs/architecture.md says which)."""


def allowed() -> dict[str, set[str]]:
    """package -> the packages it may import, from the table."""
    text = DOC.read_text()
    table = text[text.index("<!-- packages: begin -->"):text.index("<!-- packages: end -->")]
    rows: dict[str, set[str]] = {}
    for line in table.splitlines():
        m = re.match(r"\| `([\w.]+)` \|[^|]*\|([^|]*)\|", line)
        if not m:
            continue
        pkg, may = m[1], m[2].strip()
        if may == "every package above":
            rows[pkg] = set(rows)
        else:
            rows[pkg] = {f"sarc.{p.strip()}" for p in may.split(",") if p.strip()}
    return rows


def package_of(module: str, packages) -> str:
    """The table's package of ``module`` (``sarc.ir.passes.fuse`` -> ``sarc.ir``)."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        name = GROUPS.get(name, name)
        if name in packages and (k > 1 or module == "sarc" or module.startswith("sarc.__")):
            return name
    raise AssertionError(f"{module} is in no package of {DOC.name}: add it to the table")


def imports() -> dict[str, set[str]]:
    """module -> the sarc modules it imports (``from . import x`` imports module x)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "sarc").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        module = ".".join(parts)
        here = parts if is_pkg else parts[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1])
                    if node.module:
                        targets.add(f"{base}.{node.module}")
                    else:
                        targets.update(f"{base}.{a.name}" for a in node.names)
                elif (node.module or "").startswith("sarc"):
                    targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == "sarc")
        out[module] = targets
    return out


def test_every_import_goes_down_the_table():
    rows = allowed()
    bad = []
    for module, targets in imports().items():
        pkg = package_of(module, rows)
        for t in targets:
            tpkg = package_of(t, rows)
            if tpkg != pkg and tpkg not in rows[pkg]:
                bad.append(f"{module} imports {t} ({pkg} may not import {tpkg})")
    assert not bad, "\n".join(sorted(bad))


def test_no_two_packages_import_each_other():
    rows = allowed()
    edges = {(package_of(m, rows), package_of(t, rows))
             for m, ts in imports().items() for t in ts}
    cycles = sorted(f"{a} <-> {b}" for a, b in edges if a < b and (b, a) in edges)
    assert not cycles, cycles


def test_the_table_is_in_pipeline_order():
    """A package may import only packages listed above it."""
    rows = allowed()
    order = list(rows)
    for pkg, may in rows.items():
        later = [p for p in may if p not in order[: order.index(pkg)]]
        assert not later, f"{pkg} may import {later}, listed below it"


def test_the_modules_the_readme_writes_as_attributes_of_sarc_are_there():
    """``sarc.interop.from_pyg`` after ``import sarc`` was an AttributeError (the README's
    snippet); nothing heavy is imported until it is used."""
    import subprocess
    import sys
    code = ("import sys, sarc\n"
            "assert 'sarc.interop' not in sys.modules and 'dgl' not in sys.modules\n"
            "print(sarc.interop.from_pyg.__name__, sarc.datasets.load_dataset.__name__,\n"
            "      sarc.distributed.ShardedTensor.__name__, sarc.frontends.__name__)\n"
            "try:\n    sarc.nothing\nexcept AttributeError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == [
        "from_pyg load_dataset ShardedTensor sarc.frontends",
        "module 'sarc' has no attribute 'nothing'"], proc.stdout
