"""A heterogeneous model's training (``models/hetero_sage.py``, a ``sarc.HeteroConv`` of a
GraphSAGE layer per relation) on AIFB, per mode and worker count: the steps' seconds of
an epoch, the final loss, and on P workers the layer bytes a step sends (with the
planner's figure) and the bytes per epoch of the relations' set-up on each block.

    python benchmarks/hetero.py [--epochs 4] [--workers 1,2] [--modes full,mfg,sampling]

Each run is ``sarc train`` in a fresh process, dropout off (so that P workers train as one
process and the losses of a row's runs agree), the mini-batch runs with 40 seeds a step
(fanouts 10,10 when sampling); the time is the median of the epochs after the first
(which compiles), evaluation excluded.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"full": [], "mfg": ["--mode", "mfg", "--batch-size", "40"],
         "sampling": ["--mode", "sampling", "--fanouts", "10,10", "--batch-size", "40"]}


def run(mode: str, workers: int, epochs: int) -> dict:
    """One ``sarc train`` run's report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "sarc.cli", "train", "models/hetero_sage.py", "--dataset",
               "aifb", "--epochs", str(epochs), "--set", "dropout=0", "--json", str(out),
               *MODES[mode]]
        if workers > 1:
            cmd += ["--workers", str(workers), "--method", "random"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd[2:])} failed:\n{proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def row(mode: str, workers: int, report: dict) -> list[str]:
    times = report["epoch_times_s"][1:] or report["epoch_times_s"]
    cells = [mode, str(workers), f"{statistics.median(times) * 1e3:.0f} ms",
             f"{report['final_loss']:.4f}"]
    if workers == 1:
        return cells + ["-", "-"]
    w = report["per_worker"][0]
    planned = w["planned_step_bytes_sent"]
    sent = f"{w['step_bytes_sent'] / 1024:.1f} KiB"
    sent += f" ({planned / 1024:.1f})" if planned is not None else " (-)"
    return cells + [sent, f"{w.get('epoch_setup_bytes_sent', 0) / 1024:.1f} KiB"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--modes", default="full,mfg,sampling")
    args = ap.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; the modes are {', '.join(MODES)}")
    head = ["mode", "workers", "epoch (steps)", "final loss",
            "sent / step, worker 0 (planned)", "set-up / epoch, worker 0"]
    rows = [row(m, int(p), run(m, int(p), args.epochs))
            for m in modes for p in args.workers.split(",")]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
