"""benchmarks/report.py: steps run, their JSON and tables collected, the document written,
and a step that fails or is missing reported as such while the others still run."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


STUB = textwrap.dedent('''
    import argparse, json
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [{"name": "small", "seconds": 0.5 * args.size}, {"name": "large", "seconds": 2.0 * args.size}]
    print(f"stub graph: {args.size} nodes")
    print("| name | seconds |")
    print("|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['seconds']:.2f} s |")
    with open(args.json, "w") as f:
        json.dump({"size": args.size, "rows": rows}, f)
''')

FAILING = textwrap.dedent('''
    import sys
    print("| half | table |")
    print("boom: the stub cannot run here", file=sys.stderr)
    sys.exit(3)
''')


def _steps(report, tmp_path: Path):
    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "failing.py").write_text(FAILING)
    J = report.JSON_PLACEHOLDER
    return [
        report.Step("stub", "Stub section", str(tmp_path / "stub.py"),
                    ["--size", "100", "--json", J], ["--size", "3", "--json", J],
                    about="A stub benchmark.",
                    plot=report.table_bars("name", ["seconds"], ylabel="s", title="stub times")),
        report.Step("failing", "Failing section", str(tmp_path / "failing.py"), [], []),
        report.Step("gone", "Missing section", "benchmarks/no_such_benchmark.py", [], []),
        report.Step("full_only", "Full-only section", str(tmp_path / "stub.py"), [], None),
        report.Step("dgl_stub", "DGL section", str(tmp_path / "stub.py"), [], [], env="dgl"),
    ]


def test_quick_report_with_a_failing_and_a_missing_step(report, tmp_path):
    pytest.importorskip("matplotlib", reason="the report runs in .venv (make bench), which has "
                                             "matplotlib; .venv-dgl has not")
    out = tmp_path / "docs" / "benchmarks.md"
    out.parent.mkdir()
    outcomes = report.run_report(
        _steps(report, tmp_path), out, quick=True, timeout=120,
        python={"main": sys.executable, "dgl": str(tmp_path / "no-venv" / "bin" / "python")},
        gpu_json=tmp_path / "gpu.json", logs=tmp_path / "logs")
    assert [o.status for o in outcomes] == ["ok", "failed", "missing", "skipped", "skipped"]
    assert outcomes[0].data == {"size": 3, "rows": [{"name": "small", "seconds": 1.5},
                                                     {"name": "large", "seconds": 6.0}]}
    doc = out.read_text()
    # The stub's section: its table as printed, its exact command (quick sizes), a plot.
    stub = doc.split("## Stub section")[1].split("\n## ")[0]
    assert "| name | seconds |\n|---|---|\n| small | 1.50 s |\n| large | 6.00 s |" in stub
    assert f"{report._shown_path(sys.executable)} {tmp_path / 'stub.py'} --size 3 --json PATH.json" in stub
    assert "stub graph: 3 nodes" in stub
    png = out.parent / "benchmarks" / "stub.png"
    assert "![stub times](benchmarks/stub.png)" in stub
    assert png.read_bytes()[:8] == PNG_MAGIC
    # The machine it ran on, and the torch it ran with.
    assert f"**Machine:** " in doc and f"{os.cpu_count()} cores" in doc
    assert f"torch {torch.__version__}" in doc
    assert "**Quick run**" in doc
    # What did not run says so; the failure shows its exit status and its error.
    failing = doc.split("## Failing section")[1].split("\n## ")[0]
    assert "**failed** (exit status 3)" in failing and "boom: the stub cannot run here" in failing
    assert "not run: the script is missing" in doc.split("## Missing section")[1]
    assert "not run with --quick" in doc.split("## Full-only section")[1]
    assert "no dgl environment" in doc.split("## DGL section")[1]
    assert "| Failing section | failed |" in doc
    assert "No GPU run yet" in doc
    assert (tmp_path / "logs" / "failing.log").read_text().count("boom") == 1


def test_gpu_section_from_the_last_gpu_run(report, tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({
        "machine": "NVIDIA H100 80GB HBM3, 16 cores", "date": "2026-11-20 10:00 UTC",
        "command": "python benchmarks/gpu.py --nodes 1000000",
        "tables": [{"title": "layers", "columns": ["layer", "sarc triton", "DGL"],
                    "rows": [["GCN", "1.20 ms", "1.50 ms"]]}]}))
    text = report.gpu_section(gpu)
    assert "**Machine:** NVIDIA H100 80GB HBM3, 16 cores" in text
    assert "**Date:** 2026-11-20 10:00 UTC" in text
    assert "python benchmarks/gpu.py --nodes 1000000" in text
    assert "| layer | sarc triton | DGL |\n|---|---|---|\n| GCN | 1.20 ms | 1.50 ms |" in text
    assert "No GPU run yet" in report.gpu_section(tmp_path / "none.json")


def test_tables_and_numbers_parsed_from_output(report):
    tables = report.parse_tables("graph: 5 nodes\n| a | b |\n|---|---|\n| x | 3.70 s |\n"
                                 "| y | 1.5 GiB |\ntext\n| not | a table |\n")
    assert len(tables) == 1
    assert tables[0].columns == ["a", "b"] and tables[0].column("b") == ["3.70 s", "1.5 GiB"]
    assert [report.number(c) for c in ("3.70 s", "1.5 GiB", "250 ms", "82.1 +- 0.7", "-")] == \
        [3.70, 1536.0, 0.25, 82.1, None]


def test_unknown_step_is_refused(report, capsys):
    with pytest.raises(SystemExit):
        report.main(["--only", "fusion,nonesuch"])
    assert "unknown step nonesuch" in capsys.readouterr().err


def test_a_step_past_its_timeout_is_stopped_with_its_children(report, tmp_path):
    pid_file = tmp_path / "child.pid"
    (tmp_path / "slow.py").write_text(textwrap.dedent(f'''
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("started", flush=True)
        time.sleep(600)
    '''))
    step = report.Step("slow", "Slow section", str(tmp_path / "slow.py"), [], [])
    outcome = report.run_step(step, quick=True, python={"main": sys.executable}, timeout=3,
                              workdir=tmp_path)
    assert outcome.status == "timeout" and outcome.stdout == "started\n"
    child = int(pid_file.read_text())
    for _ in range(100):  # the killed child is reaped by init, soon
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the step's child {child} outlived the timeout")
    assert "**timed out**" in report.section(outcome, tmp_path, tmp_path)


def test_a_malformed_gpu_file_is_said_not_fatal(report, tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"machine": "H100", "tables": [{"rows": [[1, 2]]}]}))
    text = report.gpu_section(gpu)
    assert "cannot be read" in text and "columns" in text
    gpu.write_text("{not json")
    assert "cannot be read" in report.gpu_section(gpu)
