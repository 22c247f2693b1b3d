"""A learned node embedding per worker: replicated with dense Adam against sharded with SparseAdam.

A featureless graph's input is a [rows, dim] table. Replicated (what a plain
``nn.Embedding`` + ``torch.optim.Adam`` + a gradient all-reduce does), every worker
holds the table, its dense gradient and Adam's two moments: 16 bytes per entry,
whatever P (10M x 128 float32: ~19 GiB per worker, and Adam's step adds temporaries of
the table's size). Sharded
(``sarc.distributed.Embedding`` + ``SparseAdam``, what ``sarc train`` runs on a
featureless graph), worker r holds its partition's rows and their moments only
(12 bytes per entry, / P), and a step moves only the rows it reads.

Each configuration runs ``--steps`` steps in P fresh processes (gloo on this machine):
a step looks up ``--touched`` random node ids per worker (a sampled batch's input
nodes, anywhere in the graph; the nodes are sharded in P contiguous ranges, as a
partition numbers them), backward, optimizer step. Per worker it reports the tensor
bytes (table, gradient, optimizer state), the peak RSS, the distinct rows a step reads
and the bytes a step sends: measured by the store's exchanges (sharded), or the dense
gradient's all-reduce, ~2 (P - 1) / P of it per worker (a ring; replicated). The
workers share this machine's memory: a configuration whose P workers would need more
than ``--memory`` (default: what /proc/meminfo says is available) is not started, and
the table says so.

    python benchmarks/embedding_memory.py [--rows 10000000] [--dim 128] [--workers 1,2,4]
        [--touched 10000] [--steps 3] [--memory 24G]
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import resource
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE_BYTES = 600 * 2**20
"""What a worker process holds besides the table (python, torch, gloo), for the estimate."""


REPLICATED_PEAK, SHARDED_PEAK = 7, 3
"""A worker's peak over its table's bytes (measured at 100k x 128): replicated, the table,
its dense gradient, Adam's two moments and the temporaries of Adam's step; sharded, its
rows and their two moments."""


def needed_bytes(kind: str, rows: int, dim: int, workers: int) -> int:
    """The memory P workers of ``kind`` need on this machine (``*_PEAK`` times the table,
    or times the worker's 1/P of it)."""
    entry = rows * dim * 4
    per_worker = (REPLICATED_PEAK * entry if kind == "replicated"
                  else SHARDED_PEAK * -(-entry // workers))
    return workers * (per_worker + BASE_BYTES)


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, workers: int, port: int, kind: str, args, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=workers, timeout=datetime.timedelta(seconds=600))
    rows, dim = args.rows, args.dim
    weights = torch.linspace(-1, 1, dim)
    sent, touched, step_s = [], [], []
    if kind == "replicated":
        table = nn.Embedding(rows, dim)
        opt = torch.optim.Adam(table.parameters(), lr=0.01)
    else:
        from sarc.distributed.embedding import Embedding
        from sarc.sampling import Comm
        offsets = torch.tensor([rows * j // workers for j in range(workers + 1)])
        comm = Comm(timeout=datetime.timedelta(seconds=600))
        table = Embedding(rows, dim, offsets=offsets, rank=rank, comm=comm)
        opt = table.sparse_optimizer("sparse_adam", 0.01)
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, rows, (args.touched,), generator=gen)
        t0 = time.perf_counter()
        before = 0 if kind == "replicated" else comm.bytes_sent
        opt.zero_grad()
        (table(ids) * weights).sin().sum().backward()
        if kind == "replicated":
            if workers > 1:
                dist.all_reduce(table.weight.grad)
            sent.append(2 * (workers - 1) * table.weight.grad.numel() * 4 // workers)
        opt.step()
        if kind != "replicated":
            sent.append(comm.bytes_sent - before)
        step_s.append(time.perf_counter() - t0)
        touched.append(int(ids.unique().numel()))
    if kind == "replicated":
        state = [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
        tensors = table.weight.numel() * 4 * 2 + sum(t.numel() * t.element_size() for t in state)
    else:
        tensors = table.nbytes + opt.nbytes
    queue.put({"rank": rank, "tensors": tensors,
               "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "touched": max(touched), "sent": max(sent), "step_s": min(step_s)})
    dist.barrier()
    dist.destroy_process_group()


def run(kind: str, workers: int, args) -> list[dict]:
    """``kind`` on ``workers`` fresh processes; each worker's figures."""
    ctx = multiprocessing.get_context("spawn")  # fresh processes: their RSS is their own
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_worker, args=(r, workers, port, kind, args, queue))
             for r in range(workers)]
    for p in procs:
        p.start()
    out = [queue.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join(args.timeout)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"{kind} on {workers} workers: a worker exited with {bad[0]}")
    return sorted(out, key=lambda w: w["rank"])


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def parse_size(text: str) -> int:
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in units else ""
    return int(float(t[:len(t) - len(unit)]) * units[unit])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="embedding rows (graph nodes)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--workers", default="1,2,4", help="P values, comma-separated")
    ap.add_argument("--touched", type=int, default=10_000,
                    help="node ids each worker looks up per step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--memory", help="the memory the workers may use together, e.g. 24G "
                                     "(default: MemAvailable)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per configuration")
    args = ap.parse_args(argv)
    limit = parse_size(args.memory) if args.memory else available_bytes()
    print(f"embedding {args.rows} x {args.dim} float32 ({_gib(args.rows * args.dim * 4)} GiB), "
          f"{args.touched} ids looked up per worker and step, {args.steps} steps; the workers "
          f"may use {_gib(limit)} GiB of this machine together")
    print()
    print("| table | P | tensors / worker (GiB) | peak RSS / worker (GiB) | rows read / step "
          "/ worker | sent / step / worker (MiB) | step (s) | |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ("replicated", "sharded"):
        for p in (int(w) for w in args.workers.split(",")):
            need = needed_bytes(kind, args.rows, args.dim, p)
            if need > limit:
                print(f"| {kind} | {p} | - | - | - | - | - | not run: {p} worker"
                      f"{'s' * (p > 1)} need ~{_gib(need)} GiB, {_gib(limit)} GiB available |",
                      flush=True)
                continue
            ws = run(kind, p, args)
            note = ("all-reduce of the dense gradient (ring estimate)" if kind == "replicated"
                    else "measured: ids and rows pulled, gradients pushed")
            print(f"| {kind} | {p} | {_gib(max(w['tensors'] for w in ws))} | "
                  f"{_gib(max(w['rss_peak'] for w in ws))} | {max(w['touched'] for w in ws)} | "
                  f"{_mib(max(w['sent'] for w in ws))} | {max(w['step_s'] for w in ws):.3f} "
                  f"| {note} |", flush=True)


if __name__ == "__main__":
    main()
