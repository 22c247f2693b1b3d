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
    rows = []
    for model in sorted((ROOT / "models").glob("*.py")):
        times = []
        for mode in modes:
            with tempfile.TemporaryDirectory() as out:
                t0 = time.perf_counter()
                subprocess.run([str(sarc), "compile", str(model), "--mode", mode, "--workers",
                                str(args.workers), "--out", out], check=True, capture_output=True)
                times.append(time.perf_counter() - t0)
        rows.append((model.name, *(f"{t:.2f} s" for t in times)))
    head = ("model", *modes)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
