"""Run the benchmarks that fit this machine and write ``docs/benchmarks.md`` with tables and plots.

    python benchmarks/report.py [--quick] [--out docs/benchmarks.md] [--only KEY,...]
        [--dgl-python .venv-dgl/bin/python] [--timeout SECONDS]

Each step is one benchmark script, run in its own process with sizes for a small machine
(2 cores, 24 GiB: the whole report takes about half an hour; ``--quick``: tiny sizes, a
couple of minutes, for smoke runs; it writes to ``out/bench-quick/`` unless ``--out``
says otherwise). A step's section holds the exact command, the tables the script
printed (markdown tables as printed, or rows from its ``--json`` file), PNG plots
(matplotlib) under ``<out stem>/`` beside the document, and the machine and environment
it ran in. A script that is missing, fails or runs past the timeout is reported as such
and the other steps still run; each step's whole output goes to ``out/bench/logs/``.
Ctrl-C or SIGTERM ends the running step's processes and writes the document with the
steps that ran.

The GPU section is not run here: it shows the tables of the last GPU run, committed as
``docs/benchmarks/gpu.json``: ``{"machine": ..., "date": ..., "command": ...,
"tables": [{"title": ..., "columns": [...], "rows": [[...], ...]}, ...]}`` (or
``"markdown": "..."`` for tables already formatted).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
GPU_JSON = ROOT / "docs" / "benchmarks" / "gpu.json"
LOGS = ROOT / "out" / "bench" / "logs"
JSON_PLACEHOLDER = "{json}"
"""Stands in a step's arguments for the path of the JSON file the script writes."""


# --- steps and their outcomes ----------------------------------------------------------------

@dataclasses.dataclass
class Step:
    """One benchmark run: ``script`` (relative to the repository, or absolute) with ``args``.

    ``quick_args`` are the ``--quick`` sizes (None: the step runs in full reports only).
    ``env`` is ``"main"`` (the interpreter running the report) or ``"dgl"`` (``--dgl-python``).
    ``plot(outcome, directory)`` returns ``[(png path, caption)]``; ``table(outcome)``
    renders markdown tables from the JSON where the script prints none, and the output
    from the line starting with ``notes_end`` on (that table as printed) is left out.
    """

    key: str
    title: str
    script: str
    args: list[str]
    quick_args: list[str] | None
    about: str = ""
    env: str = "main"
    plot: Callable | None = None
    table: Callable | None = None
    notes_end: str | None = None


@dataclasses.dataclass
class Table:
    """A markdown table as printed: its header, its rows (cells as text) and its lines."""

    columns: list[str]
    rows: list[list[str]]
    lines: list[str]

    def column(self, name: str) -> list[str]:
        return [r[self.columns.index(name)] if len(r) > self.columns.index(name) else ""
                for r in self.rows]


@dataclasses.dataclass
class Outcome:
    """What running a step gave: ``status`` is ok, failed, timeout, missing or skipped."""

    step: Step
    status: str
    command: str = ""
    seconds: float = 0.0
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    data: dict | None = None
    note: str = ""

    @property
    def tables(self) -> list[Table]:
        return parse_tables(self.stdout)


def parse_tables(text: str) -> list[Table]:
    """The markdown tables in ``text`` (a header line, a ``|---|`` line, rows)."""
    tables, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip().startswith("|"):
            block.append(line.strip())
            continue
        if len(block) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", block[1].replace(" ", "")):
            cells = [_cells(b) for b in block]
            tables.append(Table(cells[0], cells[2:], block))
        block = []
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float | None:
    """The first number in a table cell ("3.70 s" -> 3.70, "1.2 GiB" -> 1228.8 MiB), or None."""
    m = re.search(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", cell)
    if not m:
        return None
    value = float(m.group())
    if "GiB" in cell:
        value *= 1024
    elif "KiB" in cell:
        value /= 1024
    elif re.search(r"\bms\b", cell):
        value /= 1000
    return value


def run_step(step: Step, *, quick: bool, python: dict[str, str | None], timeout: float,
             workdir: Path) -> Outcome:
    """Run one step; whatever happens, an Outcome (the error in it, never raised)."""
    script = ROOT / step.script
    args = step.quick_args if quick else step.args
    if args is None:
        return Outcome(step, "skipped", note="not run with --quick (no small sizes for it)")
    exe = python.get(step.env)
    if not exe or not Path(exe).exists():
        return Outcome(step, "skipped", note=f"no {step.env} environment "
                       f"({exe or 'none given'}; `make envs` creates .venv-dgl)")
    if not script.exists():
        return Outcome(step, "missing", note=f"{step.script} does not exist in this tree")
    json_path = workdir / f"{step.key}.json"
    argv = [exe, step.script, *(str(json_path) if a == JSON_PLACEHOLDER else a for a in args)]
    shown = [_shown_path(exe), step.script,
             *("PATH.json" if a == JSON_PLACEHOLDER else a for a in args)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MASTER_PORT": str(_free_port()), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    # Its own process group, so that a timeout stops the script's workers with it.
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return Outcome(step, "timeout", shlex.join(shown), time.perf_counter() - t0,
                       stdout=stdout, stderr=stderr, note=f"stopped after {timeout:.0f} s")
    except BaseException:  # Ctrl-C: no benchmark outlives the report
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    out = Outcome(step, "ok" if proc.returncode == 0 else "failed", shlex.join(shown),
                  time.perf_counter() - t0, proc.returncode, stdout, stderr)
    if out.status == "ok" and JSON_PLACEHOLDER in args:
        try:
            out.data = json.loads(json_path.read_text())
        except (OSError, ValueError) as err:
            out.status, out.note = "failed", f"its --json file could not be read: {err}"
    return out


def _shown_path(exe: str) -> str:
    p = Path(exe)
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p) if p.is_absolute() else exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- plots -----------------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bar_chart(path: Path, categories: list[str], series: dict[str, list[float | None]], *,
              ylabel: str, title: str, log: bool = False, errors: dict | None = None) -> Path:
    """Grouped bars: one group per category, one bar per series (None: no bar)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(categories) + 2), 4))
    width = 0.8 / max(1, len(series))
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(categories))]
        ys = [v if v is not None else float("nan") for v in values]
        err = (errors or {}).get(name)
        ax.bar(xs, ys, width, label=name, yerr=err, capsize=3 if err else 0)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def line_chart(path: Path, panels: dict[str, dict[str, tuple[list, list]]], *, xlabel: str,
               ylabel: str, title: str, dashed: tuple[str, ...] = ()) -> Path:
    """One panel per key, one line per series ``(xs, ys)``; series named in ``dashed`` dashed."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items()):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, "--" if label in dashed else "-o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
        ax.get_xaxis().set_major_formatter(_plain_ticks())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plain_ticks():
    from matplotlib.ticker import FuncFormatter
    return FuncFormatter(lambda v, _: f"{v:g}")


def table_bars(label: str, values: list[str], *, ylabel: str, title: str, log: bool = False,
               table: int = 0, scale: float = 1.0, require: str | None = None):
    """A step's ``plot``: bars of columns ``values`` of its printed table ``table``, per
    ``label``; only the rows whose column ``require`` (if given) is not empty."""
    def plot(outcome: Outcome, directory: Path):
        t = outcome.tables[table]
        need = [t.columns.index(c) for c in (label, require) if c]
        rows = [r for r in t.rows if all(k < len(r) and r[k] for k in need)]
        cats = [r[t.columns.index(label)] for r in rows]
        series = {}
        for v in values:
            col = t.columns.index(v)
            series[v] = [None if (x := number(r[col] if col < len(r) else "")) is None
                         else x * scale for r in rows]
        path = bar_chart(directory / f"{outcome.step.key}.png", cats, series, ylabel=ylabel,
                         title=title, log=log)
        return [(path, title)]
    return plot


def plot_layers(outcome: Outcome, directory: Path):
    d = outcome.data
    libs = d["libraries"]
    cats = [r["layer"] for r in d["rows"]]
    series = {lib: [r[lib] * 1e3 if isinstance(r.get(lib), float) else None for r in d["rows"]]
              for lib in libs}
    title = (f"forward + backward, {d['graph']['nodes']} nodes, {d['graph']['edges']} edges, "
             f"torch {d['torch']}")
    path = bar_chart(directory / f"{outcome.step.key}.png", cats, series, ylabel="ms (log)",
                     title=title, log=True)
    return [(path, title)]


def plot_cora(outcome: Outcome, directory: Path):
    t = outcome.tables[0]
    mean_std = [re.findall(r"\d+(?:\.\d+)?", c) for c in t.column("test acc % (mean +- std)")]
    published = [number(c) for c in t.column("published")]
    series = {"sarc": [float(m[0]) for m in mean_std], "published": published}
    errors = {"sarc": [float(m[1]) if len(m) > 1 else 0.0 for m in mean_std]}
    title = "Cora test accuracy (public split)"
    path = bar_chart(directory / "cora.png", t.column("model"), series, ylabel="test accuracy %",
                     title=title, errors=errors)
    return [(path, title)]


def plot_distributed(outcome: Outcome, directory: Path):
    """Data memory and bytes sent per worker against P, per model, with the baseline and
    the lower bound of memory (the single worker's data divided by P)."""
    rows = outcome.data["results"]
    memory, sent = {}, {}
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        one = next((r for r in mine if r["workers"] == 1), None)
        modes = [m for m in dict.fromkeys(r["mode"] for r in mine) if m != "local"]
        memory[model], sent[model] = {}, {}
        for mode in modes:
            pts = sorted((r["workers"], r) for r in mine if r["mode"] == mode)
            if one:
                pts = [(1, one), *pts]
            memory[model][mode] = ([p for p, _ in pts], [r["rss_data"] / 2**20 for _, r in pts])
            sent[model][mode] = ([p for p, _ in pts], [r["sent"] / 2**20 for _, r in pts])
        if one:
            ps = sorted({r["workers"] for r in mine})
            memory[model]["P=1 data / P (lower bound)"] = (ps, [one["rss_data"] / 2**20 / p
                                                                for p in ps])
    a = line_chart(directory / "distributed_memory.png", memory, xlabel="workers P",
                   ylabel="peak data per worker (MiB)", title="memory per worker",
                   dashed=("P=1 data / P (lower bound)",))
    b = line_chart(directory / "distributed_bytes.png", sent, xlabel="workers P",
                   ylabel="MiB sent per worker per epoch", title="bytes sent per worker")
    return [(a, "peak data memory per worker against P: sarc's modes, the SAR-equivalent "
                "baseline and the lower bound (P = 1 / P)"),
            (b, "bytes sent per worker and epoch against P, sarc's modes and the baseline")]


def plot_distributed_step(outcome: Outcome, directory: Path):
    rows = outcome.data["rows"]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    cats = list(dict.fromkeys(r["layer"] for r in rows))
    series = {b: [next((r["ratio"] for r in rows if r["layer"] == c and r["backend"] == b), None)
                  for c in cats] for b in backends}
    title = "one-part distributed step / the layer on a Graph"
    path = bar_chart(directory / "distributed_step.png", cats, series, ylabel="time ratio",
                     title=title)
    return [(path, title)]


def plot_compile(outcome: Outcome, directory: Path):
    """Bars of every mode column the compile table has."""
    t = outcome.tables[0]
    return table_bars("model", t.columns[1:], ylabel="seconds",
                      title="cold sarc compile")(outcome, directory)


def table_distributed_step(outcome: Outcome) -> str:
    lines = ["| layer | backend | Graph (ms) | 1-part distributed (ms) | ratio | fallbacks |",
             "|---|---|---|---|---|---|"]
    for r in outcome.data["rows"]:
        lines.append(f"| {r['layer']} | {r['backend']} | {r['graph_s'] * 1e3:.1f} | "
                     f"{r['dist_s'] * 1e3:.1f} | {r['ratio']:.2f} | {r['fallbacks']} |")
    return "\n".join(lines)


# --- the steps of this machine ---------------------------------------------------------------

J = JSON_PLACEHOLDER
TINY = ["--nodes", "2000", "--edges", "10000"]

STEPS = [
    Step("layers", "Layers on the CPU: sarc and PyG (.venv)", "benchmarks/layers_cpu.py",
         ["--nodes", "100000", "--edges", "1000000", "--repeat", "3", "--json", J],
         [*TINY, "--feats", "16", "--repeat", "1", "--json", J],
         about="Forward + backward of each layer of the zoo, sarc's PyTorch backend against "
               "PyG's layer, on a synthetic power-law graph.", plot=plot_layers),
    Step("layers_dgl", "Layers on the CPU: sarc, PyG and DGL (.venv-dgl)", "benchmarks/layers_cpu.py",
         ["--nodes", "100000", "--edges", "1000000", "--repeat", "3", "--json", J],
         [*TINY, "--feats", "16", "--repeat", "1", "--json", J], env="dgl",
         about="The same layers in the DGL environment (torch 2.2.1), where DGL imports: "
               "compare the libraries within this table, not with the one above.",
         plot=plot_layers),
    Step("dgl_convs", "DGL's convs on the CPU: sarc against DGL (.venv-dgl)",
         "benchmarks/dgl_convs_cpu.py", [], [*TINY, "--repeat", "1"], env="dgl",
         about="Forward + backward of DGL's convs traced by sarc (from_dgl_module) against "
               "the same modules on DGL's kernels, 64 features, a power-law graph."),
    Step("fusion", "What fusion buys (PyTorch backend)", "benchmarks/fusion.py",
         ["--nodes", "100000", "--edges", "1000000", "--repeat", "3"],
         [*TINY, "--feats", "16", "--repeat", "1"],
         about="Each layer compiled without pushdown and fusion and with the full pipeline: "
               "edge tensors autograd keeps for backward, and forward + backward time.",
         plot=table_bars("layer", ["fwd+bwd unfused", "fused"], ylabel="seconds",
                         title="forward + backward, unfused and fused")),
    Step("cora", "Cora accuracy", "benchmarks/cora_accuracy.py", ["--seeds", "5"],
         ["--seeds", "1", "--models", "gcn"],
         about="Test accuracy at the epoch of best validation accuracy, public split, "
               "against the published figures.", plot=plot_cora),
    Step("cora_epoch", "Cora epochs: sarc, DGL and PyG (.venv-dgl)", "benchmarks/cora_epoch.py",
         ["--rounds", "5", "--epochs", "20"], ["--rounds", "1", "--epochs", "2", "--threads", "1"],
         env="dgl",
         about="A full-graph training epoch (forward, loss, backward, Adam) of 2-layer GCN and "
               "GAT on Cora, the same models in each library: the per-call overhead.",
         plot=table_bars("model, threads", ["sarc", "DGL", "PyG"], ylabel="ms per epoch",
                         title="Cora training epoch", require="sarc")),
    Step("compile", "Compile time", "benchmarks/compile_time.py", [], ["--modes", "full"],
         about="Cold `sarc compile` of each model file (a fresh process each), per mode.",
         plot=plot_compile),
    Step("distributed", "Distributed training: memory and bytes against P",
         "benchmarks/distributed.py",
         ["--nodes", "100000", "--edges", "2000000", "--workers", "1,2,4,8",
          "--modes", "sar,oneshot,hybrid", "--baseline", "--epochs", "2", "--json", J],
         [*TINY, "--workers", "1,2", "--modes", "sar", "--baseline", "--models", "sage",
          "--epochs", "1", "--json", J],
         about="3-layer GraphSAGE and GAT, full-batch epochs with P workers on this machine "
               "(all workers share its cores: epoch times measure contention, not scaling; "
               "memory and bytes do not depend on it), against the SAR-equivalent baseline.",
         plot=plot_distributed),
    Step("exchange", "Bytes per layer: sarc's exchange against the baseline",
         "benchmarks/exchange_bytes.py",
         ["--nodes", "100000", "--edges", "2000000", "--workers", "8"],
         [*TINY, "--workers", "2"],
         about="The planner's bytes per layer and training step (which the exchange "
               "counters equal), sar mode, max over workers.",
         plot=table_bars("layer", ["sarc (MiB)", "baseline (MiB)"], ylabel="MiB",
                         title="bytes per layer and step (max over workers)",
                         require="in -> out")),
    Step("distributed_step", "One-part distributed step against the layer on a Graph",
         "benchmarks/distributed_step.py",
         ["--nodes", "100000", "--edges", "1000000", "--repeats", "3", "--json", J],
         [*TINY, "--layers", "gcn,gat", "--repeats", "1", "--json", J],
         about="What the distributed schedule costs over the layer's own kernels when "
               "nothing crosses the network.", plot=plot_distributed_step,
         table=table_distributed_step, notes_end="layer "),
    Step("sampling", "Sampling", "benchmarks/sampling.py", ["--epochs", "2"], None, env="dgl",
         about="Mini-batch neighbour-sampling training (GraphSAGE, fanouts 10,25) against "
               "DGL's NeighborSampler + DataLoader, one process per worker on this machine "
               "(the workers share its cores: time at P > 1 measures contention)."),
    Step("mfg", "MFG against full batch", "benchmarks/mfg_savings.py",
         ["--nodes", "100000", "--edges", "1000000", "--workers", "1,2,4"],
         [*TINY, "--workers", "1,2", "--no-cora"],
         about="Training on the K-hop closure of the labeled nodes against full-batch "
               "training when few nodes are labeled."),
    Step("hetero", "A heterogeneous model: modes and workers", "benchmarks/hetero.py",
         ["--epochs", "4"], ["--epochs", "2", "--workers", "1", "--modes", "full,sampling"],
         about="models/hetero_sage.py (a GraphSAGE layer per relation, 90 relations) on "
               "AIFB, full batch, MFG and sampled batches of 40 seeds, on one process and 2 "
               "workers: the steps of an epoch, and on workers the bytes a step sends."),
    Step("embedding_memory", "A featureless graph's embedding: replicated against sharded",
         "benchmarks/embedding_memory.py", ["--rows", "10000000", "--workers", "1,2,4"],
         ["--rows", "100000", "--workers", "1,2", "--steps", "1"],
         about="A 10M x 128 learned input per worker: nn.Embedding + dense Adam + all-reduce "
               "against sarc.distributed.Embedding + SparseAdam (configurations over this "
               "machine's memory are not run)."),
    Step("triton_traffic", "Triton kernels: bytes moved (cost model)",
         "benchmarks/triton_kernels.py", ["--nodes", "100000", "--edges", "2000000"],
         [*TINY, "--feats", "16"],
         about="Bytes each generated kernel moves against the plan that materializes edge "
               "tensors; the GPU timings are in the GPU section."),
]



# --- the document ----------------------------------------------------------------------------

def machine() -> dict:
    """This machine: CPU model, cores, memory, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram": ram, "os": platform.platform(),
            "python": platform.python_version()}


def torch_version(exe: str) -> str:
    """The torch version ``exe`` imports (or why it imports none)."""
    try:
        proc = subprocess.run([exe, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"
    return proc.stdout.strip() if proc.returncode == 0 else "not importable"


def git_commit() -> str:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "sarc", "benchmarks", "models"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return proc.stdout.strip() + (" (with local changes)" if dirty else "")
    except OSError:
        return "unknown"


def machine_line(m: dict, torches: dict[str, str], when: str) -> str:
    ram = f"{m['ram'] / 2**30:.0f} GiB RAM" if m["ram"] else "RAM unknown"
    envs = ", ".join(f"torch {v} ({k})" for k, v in torches.items())
    return (f"**Machine:** {m['cpu']}, {m['cores']} cores, {ram}; {m['os']}; Python "
            f"{m['python']}; {envs}; sarc {git_commit()}; started {when}")


def section(outcome: Outcome, directory: Path, doc_dir: Path) -> str:
    """A step's markdown: about, status, command, tables, plots, output notes."""
    s = outcome.step
    lines = [f"## {s.title}", ""]
    if s.about:
        lines += [s.about, ""]
    if outcome.command:
        lines += ["```sh", outcome.command, "```", ""]
    status = {"ok": f"ran in {outcome.seconds:.0f} s",
              "failed": f"**failed** (exit status {outcome.returncode}) after "
                        f"{outcome.seconds:.0f} s",
              "timeout": "**timed out**", "missing": "**not run: the script is missing**",
              "skipped": "skipped"}[outcome.status]
    lines += [f"Status: {status}" + (f"; {outcome.note}" if outcome.note else "") + ".", ""]
    if outcome.status in ("failed", "timeout"):
        tail = (outcome.stderr.strip() or outcome.stdout.strip()).splitlines()[-15:]
        if tail:
            lines += ["```text", *tail, "```", ""]
        return "\n".join(lines)
    if outcome.status != "ok":
        return "\n".join(lines)
    tables = outcome.tables
    for t in tables:
        lines += [*t.lines, ""]
    if s.table and outcome.data is not None:
        try:
            lines += [s.table(outcome), ""]
        except Exception as err:  # noqa: BLE001 - JSON of another shape: said, not fatal
            lines += [f"(No table from its JSON: {type(err).__name__}: {err}.)", ""]
    printed = outcome.stdout.splitlines()
    if s.notes_end:
        printed = printed[:next((k for k, ln in enumerate(printed)
                                 if ln.startswith(s.notes_end)), len(printed))]
    notes = [ln for ln in printed if ln.strip() and not ln.strip().startswith("|")]
    if notes:
        lines += ["```text", *notes[:30], *(["..."] if len(notes) > 30 else []), "```", ""]
    if s.plot:
        try:
            for path, caption in s.plot(outcome, directory):
                lines += [f"![{caption}]({path.relative_to(doc_dir).as_posix()})", ""]
        except Exception as err:  # noqa: BLE001 - a plot that cannot be drawn is said, not fatal
            lines += [f"(No plot: {type(err).__name__}: {err}.)", ""]
    return "\n".join(lines)


def gpu_section(path: Path) -> str:
    """The GPU tables of the last GPU run, committed at ``path``; or that there is none."""
    lines = ["## GPU", ""]
    if not path.exists():
        return "\n".join([*lines, "No GPU run yet (its tables would be read from "
                          f"`{_shown_path(str(path))}`).", ""])
    try:
        return "\n".join([*lines, *_gpu_lines(json.loads(path.read_text()), path)])
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        kind = "no " + str(err) if isinstance(err, KeyError) else str(err)
        return "\n".join([*lines, f"`{_shown_path(str(path))}` cannot be read: {kind}.", ""])


def _gpu_lines(d: dict, path: Path) -> list[str]:
    lines = [f"From the last GPU run (`{_shown_path(str(path))}`), not from this machine.", ""]
    for key, label in (("machine", "Machine"), ("date", "Date")):
        if d.get(key):
            value = d[key] if isinstance(d[key], str) else json.dumps(d[key])
            lines += [f"**{label}:** {value}", ""]
    if d.get("command"):
        lines += ["```sh", str(d["command"]), "```", ""]
    for t in (d.get("tables") if isinstance(d.get("tables"), list) else []):
        if t.get("title"):
            lines += [f"### {t['title']}", ""]
        lines += ["| " + " | ".join(map(str, t["columns"])) + " |",
                  "|" + "---|" * len(t["columns"])]
        lines += ["| " + " | ".join(map(str, r)) + " |" for r in t["rows"]]
        lines.append("")
    if d.get("markdown"):
        lines += [d["markdown"].strip(), ""]
    return lines


def write_report(outcomes: list[Outcome], out: Path, *, quick: bool, header: str,
                 gpu_json: Path) -> None:
    directory = out.parent / out.stem
    directory.mkdir(parents=True, exist_ok=True)
    summary = ["| section | status | time |", "|---|---|---|"]
    for o in outcomes:
        summary.append(f"| {o.step.title} | {o.status} | "
                       f"{f'{o.seconds:.0f} s' if o.command else '-'} |")
    body = [section(o, directory, out.parent) for o in outcomes]
    intro = ["# Benchmarks", "",
             "Generated by `make bench` (`python benchmarks/report.py`); do not edit by hand.",
             ""]
    if quick:
        intro += ["**Quick run** (`--quick`): tiny sizes, which show that every benchmark "
                  "runs, not how fast anything is.", ""]
    text = "\n".join([*intro, header, "", *summary, "", *body, gpu_section(gpu_json)])
    out.write_text(text.rstrip() + "\n")


def run_report(steps: list[Step], out: Path, *, quick: bool, python: dict[str, str | None],
               timeout: float, gpu_json: Path = GPU_JSON, logs: Path | None = LOGS) -> list[Outcome]:
    """Run ``steps`` in order (a progress bar on a terminal) and write the document ``out``."""
    from tqdm import tqdm

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    used = {s.env for s in steps if python.get(s.env) and Path(python[s.env]).exists()}
    torches = {_shown_path(python[e]): torch_version(python[e]) for e in sorted(used)}
    header = machine_line(machine(), torches, when)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="sarc-bench-") as tmp:
        bar = tqdm(steps, desc="benchmarks", unit="step", file=sys.stderr, disable=None)
        try:
            for k, step in enumerate(bar):
                bar.set_postfix_str(step.key)
                o = run_step(step, quick=quick, python=python, timeout=timeout,
                             workdir=Path(tmp))
                outcomes.append(o)
                if logs is not None and o.command:
                    logs.mkdir(parents=True, exist_ok=True)
                    (logs / f"{step.key}.log").write_text(
                        f"$ {o.command}\n# {o.status}, {o.seconds:.1f} s\n\n{o.stdout}\n"
                        f"--- stderr\n{o.stderr}")
                tqdm.write(f"[{k + 1}/{len(steps)}] {step.key}: {o.status}"
                           + (f" ({o.seconds:.0f} s)" if o.command else "")
                           + (f"; {o.note}" if o.note else ""), file=sys.stderr)
        except KeyboardInterrupt:  # what ran is written; the rest is said not to have run
            outcomes += [Outcome(s, "skipped", note="the report was interrupted")
                         for s in steps[len(outcomes):]]
            write_report(outcomes, out, quick=quick, header=header, gpu_json=gpu_json)
            raise
        write_report(outcomes, out, quick=quick, header=header, gpu_json=gpu_json)
    return outcomes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every step")
    ap.add_argument("--out", help="the document to write (default docs/benchmarks.md, or "
                                  "out/bench-quick/benchmarks.md with --quick)")
    ap.add_argument("--only", help="comma-separated step keys (default: all): "
                                   + ", ".join(s.key for s in STEPS))
    ap.add_argument("--dgl-python", default=str(ROOT / ".venv-dgl" / "bin" / "python"),
                    help="the DGL environment's interpreter (its steps are skipped without it)")
    ap.add_argument("--timeout", type=float, help="seconds per step (default 1200, 300 quick)")
    args = ap.parse_args(argv)
    steps = STEPS
    if args.only:
        wanted = args.only.split(",")
        unknown = [k for k in wanted if k not in {s.key for s in STEPS}]
        if unknown:
            ap.error(f"--only: unknown step {', '.join(unknown)}; the steps are "
                     f"{', '.join(s.key for s in STEPS)}")
        steps = [s for s in STEPS if s.key in wanted]
    out = Path(args.out or (ROOT / ("out/bench-quick" if args.quick else "docs") / "benchmarks.md"))
    out.parent.mkdir(parents=True, exist_ok=True)
    timeout = args.timeout or (300.0 if args.quick else 1200.0)
    signal.signal(signal.SIGTERM, _stop)  # as Ctrl-C: the running step's processes are ended
    try:
        outcomes = run_report(steps, out, quick=args.quick, timeout=timeout,
                              python={"main": sys.executable, "dgl": args.dgl_python})
    except KeyboardInterrupt:
        print(f"interrupted: wrote {out} with the steps that ran", file=sys.stderr)
        return 130
    bad = [o.step.key for o in outcomes if o.status in ("failed", "timeout")]
    print(f"wrote {out}" + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def _stop(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
