"""A Triton layer's step under other row schedules: how many launches its row-aggregating
kernels make and what the step costs, to choose the degree buckets and the split length.

Each row-aggregating kernel runs one launch per degree bucket (``triton_runtime.BUCKETS``)
and, for the rows longer than ``SPLIT_EDGES``, a launch over their segments and one that
merges them. On a small graph a step is bound by the host (``benchmarks/gpu_profile.py``):
fewer launches may win there and lose on a large graph, where buckets balance the work.
For each layer of ``benchmarks/gpu.py`` and each schedule this times the forward +
backward step (median of ``--repeat`` after a warm-up that compiles and autotunes), counts
sarc's kernel launches per step, and checks the output against the first schedule's (every
schedule computes the same values; the column says how close they are).

    python benchmarks/gpu_schedule.py [--size 100k/2M] [--layers GCN,GAT1x7]
        [--schedules "16,64,256:1024 :1024 :none"] [--repeat 20] [--json PATH]

A schedule is ``BOUNDS:SPLIT``: the bucket bounds (none: one bucket for every row up to
the split) and the split length (``none``: no row is cut). Without a CUDA GPU it says so
and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu  # noqa: E402  (benchmarks/gpu.py: layers, graphs, timing, the GPU check)


@dataclass(frozen=True)
class Schedule:
    buckets: tuple[int, ...]
    split: int | None

    def __str__(self) -> str:
        split = "none" if self.split is None else str(self.split)
        return f"{','.join(map(str, self.buckets))}:{split}"


def parse_schedule(text: str) -> Schedule:
    bounds, sep, split = text.strip().partition(":")
    try:
        if not sep:
            raise ValueError
        buckets = tuple(int(b) for b in bounds.split(",") if b.strip())
        cut = None if split.strip().lower() == "none" else int(split)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--schedules: {text!r} is not BOUNDS:SPLIT (e.g. 16,64,256:1024, :1024 or "
            f":none)") from None
    if any(b < 1 for b in buckets) or (cut is not None and cut < 1):
        raise argparse.ArgumentTypeError(f"--schedules: {text!r}: bounds and the split length "
                                         f"are at least 1")
    return Schedule(buckets, cut)


def parse_schedules(text: str) -> list[Schedule]:
    schedules = [parse_schedule(t) for t in text.replace(";", " ").split()]
    if not schedules:
        raise argparse.ArgumentTypeError("--schedules: give at least one BOUNDS:SPLIT")
    return schedules


def measure(name: str, size: str, schedules: list[Schedule], repeat: int,
            device: str = "cuda", feats: int = 128, backend: str = "triton",
            warmup: int = 2) -> list[dict]:
    """Per schedule: seconds per step, sarc's kernel launches per step, and the largest
    difference of the output from the first schedule's."""
    from sarc.backends import triton_runtime
    device = torch.device(device)
    b, layer, step = gpu.one_layer(name, size, feats, backend, device)
    edge = gpu.sarc_edge_inputs(b, name)
    launches = [0]
    real_run = triton_runtime.run

    def counted(*a, **kw):
        launches[0] += 1
        return real_run(*a, **kw)

    rows, first = [], None
    for schedule in schedules:
        with triton_runtime.row_schedule(schedule.buckets, schedule.split):
            with torch.no_grad():
                out = layer(b.g, h=b.x, **edge).float()
            first = out if first is None else first
            diff = float((out - first).abs().max()) if out.numel() else 0.0
            seconds, _ = gpu.measure(step, device, warmup=warmup, repeat=repeat)
            triton_runtime.run = counted
            try:
                launches[0] = 0
                step()
            finally:
                triton_runtime.run = real_run
        rows.append({"schedule": str(schedule), "step_s": seconds, "launches": launches[0],
                     "max_diff": diff})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=gpu.parse_size, default="100k/2M", help="NODES/EDGES")
    ap.add_argument("--layers", default="GCN,GAT1x7", type=gpu.parse_layers)
    ap.add_argument("--schedules", type=parse_schedules, default="16,64,256:1024 :1024 :none",
                    help="space-separated BOUNDS:SPLIT, the first the reference")
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    size = gpu.size_label(*args.size)
    why = gpu.gpu_unavailable()
    if why:
        print(why)
        return 0
    results = {name: measure(name, size, args.schedules, args.repeat, feats=args.feats)
               for name in args.layers}
    head = ["layer", "schedule", "step", "launches", "vs first", "max |diff|"]
    body = []
    for name, rows in results.items():
        for r in rows:
            body.append([name, r["schedule"], f"{1e3 * r['step_s']:.3f} ms", str(r["launches"]),
                         f"{r['step_s'] / rows[0]['step_s']:.2f}x", f"{r['max_diff']:.1e}"])
    gpu.print_report(size, f"{args.feats} features", head, body, args.json, layers=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
