"""What a layer's first call costs in a new process on a CUDA GPU, with and without the caches
of an earlier process.

The first forward + backward of a Triton layer compiles its generated kernels and autotunes
them; sarc keeps the generated modules (``SARC_CACHE_DIR``), Triton its binaries and the
autotuner's choices (``TRITON_CACHE_DIR``; ``triton_runtime.persisted``). For each layer of
``benchmarks/gpu.py`` this starts a fresh process twice over the same, initially empty,
cache folders: the first is a cold start, the second a user's next run. Each process times
its first step and the median of ``--repeat`` steps after it; the start cost is the first
step less a steady one (the graph, built before the clock starts, is not counted).

    python benchmarks/gpu_startup.py [--size 100k/2M] [--layers GCN,SAGE,GAT,GAT1x7,RGCN]

Without a CUDA GPU it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu  # noqa: E402  (benchmarks/gpu.py: layers, graphs, the GPU check)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, size: str, repeat: int, device: str = "cuda", feats: int = 128,
            backend: str = "triton") -> dict:
    """In this process: the first step and the steady steps of layer ``name`` (seconds)."""
    device = torch.device(device)
    _, _, step = gpu.one_layer(name, size, feats, backend, device)

    def timed() -> float:
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        return time.perf_counter() - t
    first = timed()
    steady = statistics.median(timed() for _ in range(repeat))
    return {"first_s": first, "steady_s": steady}


def child(name: str, size: str, repeat: int, caches: Path) -> dict:
    env = {**os.environ, "SARC_CACHE_DIR": str(caches / "sarc"),
           "TRITON_CACHE_DIR": str(caches / "triton")}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--size", size,
                           "--repeat", str(repeat)], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: the process failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=gpu.parse_size, default="100k/2M", help="NODES/EDGES")
    ap.add_argument("--layers", default=",".join(gpu.LAYERS), type=gpu.parse_layers)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    size = gpu.size_label(*args.size)   # "100k/2M", as the measuring functions take it
    if args.child:
        print(json.dumps(measure(args.child, size, args.repeat)))
        return 0
    why = gpu.gpu_unavailable()
    if why:
        print(why)
        return 0
    rows = []
    for name in args.layers:
        with tempfile.TemporaryDirectory() as d:
            cold = child(name, size, args.repeat, Path(d))
            warm = child(name, size, args.repeat, Path(d))
        rows.append({"layer": name, "cold": cold, "warm": warm})
        print(f"  {name}: cold {cold['first_s']:.2f} s, warm {warm['first_s']:.2f} s", file=sys.stderr)
    head = ["layer", "first step, empty caches", "first step, caches of a run before",
            "steady step", "start cost (warm)"]
    body = [[r["layer"], f"{r['cold']['first_s']:.2f} s", f"{r['warm']['first_s']:.2f} s",
             f"{1e3 * r['warm']['steady_s']:.2f} ms",
             f"{r['warm']['first_s'] - r['warm']['steady_s']:.2f} s"] for r in rows]
    gpu.print_report(size, "one process per run", head, body, args.json, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
