"""Where a layer's forward + backward spends its time on a CUDA GPU: torch.profiler's kernel
table for the layers of ``benchmarks/gpu.py``, and the GPU's busy time against the step's
wall time (a step whose kernels keep the GPU busy a small part of its wall time is bound by
the host: launches, Python, synchronizations).

    python benchmarks/gpu_profile.py [--size 100k/2M] [--layers GCN,GAT] [--backend triton]
        [--steps 5] [--rows 15]

Without a CUDA GPU it says so and exits 0.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu  # noqa: E402  (benchmarks/gpu.py: layers, graphs, the GPU check)


def profile(name: str, size: str, backend: str, steps: int, rows: int, feats: int,
            device: str = "cuda") -> str:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    device = torch.device(device)
    cuda = device.type == "cuda"
    _, _, step = gpu.one_layer(name, size, feats, backend, device)
    for _ in range(3):  # compilation, autotuning
        step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        wall = (time.perf_counter() - t) / steps
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / steps / 1e3   # ms per step
    launches = sum(e.count for e in kernels) / steps
    table = events.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                         row_limit=rows, max_name_column_width=60)
    gpu_line = (f", GPU busy {busy:.2f} ms ({100 * busy / (1e3 * wall):.0f}%), {launches:.0f} "
                f"kernels per step" if cuda else " (no GPU: host time only)")
    return f"## {name} on {backend}, {size}, {feats} features: {1e3 * wall:.2f} ms per step (wall){gpu_line}\n\n{table}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=gpu.parse_size, default="100k/2M", help="NODES/EDGES")
    ap.add_argument("--layers", default="GCN,GAT", type=gpu.parse_layers)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", type=int, default=15)
    args = ap.parse_args(argv)
    size = gpu.size_label(*args.size)   # "100k/2M", as the measuring functions take it
    why = gpu.gpu_unavailable()
    if why:
        print(why)
        return 0
    for name in args.layers:
        print(profile(name, size, args.backend, args.steps, args.rows, args.feats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
