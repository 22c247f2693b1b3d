"""Cold wall time of ``sarc compile`` for every model file, each mode.

Each run is a fresh process (imports, model building, tracing, passes, code
generation, planning, writing every artifact), as a user would start it:

    python benchmarks/compile_time.py [--workers 4] [--modes full,mfg,sampling]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--modes", default="full,mfg,sampling")
    args = ap.parse_args()
    sarc = Path(sys.executable).with_name("sarc")
    modes = args.modes.split(",")
    rows, refused = [], []
    for model in sorted((ROOT / "models").glob("*.py")):
        cells = []
        for mode in modes:
            with tempfile.TemporaryDirectory() as out:
                t0 = time.perf_counter()
                proc = subprocess.run([str(sarc), "compile", str(model), "--mode", mode,
                                       "--workers", str(args.workers), "--out", out],
                                      capture_output=True, text=True)
                seconds = time.perf_counter() - t0
            if proc.returncode == 2:   # a usage error: a mode the model does not train in
                cells.append("refused")
                refused.append(f"{model.name}, {mode}: {proc.stderr.strip().splitlines()[-1]}")
            elif proc.returncode != 0:
                sys.exit(f"sarc compile {model.name} --mode {mode} failed "
                         f"(exit status {proc.returncode}):\n{proc.stderr}")
            else:
                cells.append(f"{seconds:.2f} s")
        rows.append((model.name, *cells))
    head = ("model", *modes)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    for line in refused:
        print(f"\nrefused: {line}")


if __name__ == "__main__":
    main()
