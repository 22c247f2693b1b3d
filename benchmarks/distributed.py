"""Distributed full-batch training: peak memory, bytes sent and epoch time per worker.

On a synthetic power-law graph (``sarc.datasets.power_law_graph``; the issue's size
is >= 500k nodes, >= 10M edges, 128 features: ``--nodes 500000 --edges 10000000``),
3-layer GraphSAGE-mean (128 -> 128 -> 128 -> classes) and GAT (128 -> 4x16 -> 4x16 ->
classes), it trains ``--epochs`` full-batch epochs (forward, backward, gradient
all-reduce, Adam step) with P workers (real processes through torchrun, gloo on
127.0.0.1) for every P in ``--workers`` and every execution mode in ``--modes``
(sar, oneshot, hybrid: a memory budget that keeps about half of the remote rows),
plus the SAR-equivalent baseline (``--baseline``: the raw layer input crosses the
network, no online softmax; sar mode) and prints a table per model:

- peak RSS of the worker with the largest (the whole), in two parts as ``sarc train``
  reports them (``sarc.distributed.train.peak_memory``): fixed, the worker's RSS before
  it loads its shard, with torch, sarc, the process group, the model and its optimizer
  in place (a runtime that does not shrink with P: ~0.25 GB, torch alone ~0.2 GB; the
  optimizer is ``EagerAdam``, as torch.optim's would import torch's compiler, ~0.1 GB
  more), and data, the rest: what a GPU's memory would hold; the whole and the data
  with their ratio to P = 1, the whole against the goal (``GOAL``: at P = 8, each
  worker's whole peak at most 0.2x the single worker's);
- bytes sent per worker per epoch (max over workers; the exchange layer's counter,
  which equals the planner's prediction), the parameter all-reduce not included;
- epoch time (median over the epochs after the first; the slowest worker).

    python benchmarks/distributed.py [--nodes N] [--edges E] [--features 128]
        [--workers 1,2,4,8] [--modes sar,oneshot,hybrid] [--baseline] [--models sage,gat]
        [--epochs 3] [--method metis|random] [--json results.json]

All workers share this machine's cores: with 2 cores and P = 8, epoch times measure
contention, not scaling; memory and bytes do not depend on it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))

GOAL = (8, 0.2)
"""At P workers, each worker's whole peak RSS at most this fraction of the single worker's."""


# --- the worker (one process under torchrun) -----------------------------------------------

def build(model: str, in_feats: int, classes: int):
    import torch.nn.functional as F
    from gat import GATLayer
    from sage import SAGELayer
    from torch import nn

    class Net(nn.Module):
        def __init__(self, convs):
            super().__init__()
            self.convs = nn.ModuleList(convs)

        def forward(self, g, x):
            for k, conv in enumerate(self.convs):
                x = conv(g, x)
                if k < len(self.convs) - 1:
                    x = F.elu(x)
            return x

    if model == "sage":
        return Net([SAGELayer(in_feats, 128), SAGELayer(128, 128), SAGELayer(128, classes)])
    return Net([GATLayer(in_feats, 16, heads=4), GATLayer(64, 16, heads=4),
                GATLayer(64, classes, heads=1, concat=False)])


def hybrid_budget(model, dg) -> int:
    """Local saved bytes of the first layer plus half of the remote rows it reads."""
    from sarc.compiler import optimize
    from sarc.dsl import Layer
    from sarc.planner.plan import plan_layer
    layer = next(m for m in model.modules() if isinstance(m, Layer))
    lp = plan_layer("probe", optimize(layer.trace()), workers=dg.size, stats=dg.stats,
                    exec_mode="sar")
    remote = max(sum(row) for row in dg.stats.boundary)
    return max(lp.bytes_kept) + remote * lp.exchange.row_bytes // 2


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from sarc.distributed import DistGraph, allreduce_gradients
    from sarc.distributed.train import load_shard, peak_memory, resident_bytes
    from sarc.training.optim import EagerAdam

    torch.set_num_threads(args.threads)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build(args.model, args.features, args.classes)
    opt = EagerAdam(model.parameters(), lr=0.01)
    fixed_rss = resident_bytes()
    shard = load_shard(args.partition)
    dg = DistGraph(shard, exec_mode=None if args.mode == "local" else args.mode,
                   baseline=args.baseline, timeout=timeout)
    x, label = shard.ndata["feat"], shard.ndata["label"]
    mask = shard.ndata["train_mask"]
    total = torch.tensor([int(mask.sum())])
    dist.all_reduce(total)
    if x.shape[1] != args.features:
        raise SystemExit(f"the partition has {x.shape[1]} features, not {args.features}")
    if args.mode == "hybrid":
        dg.mem_budget = hybrid_budget(model, dg)
    times, sent = [], []
    for epoch in range(args.epochs):
        dist.barrier()
        t0 = time.perf_counter()
        dg.counter.reset()
        opt.zero_grad()
        logits = model(dg, x)
        loss = F.cross_entropy(logits[mask], label[mask], reduction="sum") / int(total)
        loss.backward()
        allreduce_gradients(model)
        opt.step()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(float(t))
        sent.append(dg.counter.total_sent)
    mine = {"rank": rank, **peak_memory(fixed_rss), "sent": sent[-1],
            "planned": dg.planned_bytes_sent(),
            "kept": [p.plan.kept_peers[rank] for p in dg.training_programs.values()]}
    everyone = [None] * size
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        print("RESULT " + json.dumps({"times": times, "workers": everyone}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# --- the driver ----------------------------------------------------------------------------

def run_one(args, partition: str, p: int, model: str, mode: str, baseline: bool) -> dict:
    cores = os.cpu_count() or 1
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(p), "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
           __file__, "--worker", "--partition", partition, "--model", model, "--mode", mode,
           "--epochs", str(args.epochs), "--classes", str(args.classes),
           "--features", str(args.features),
           "--threads", str(max(1, cores // p)), "--timeout", str(args.timeout)]
    if baseline:
        cmd.append("--baseline")
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // p))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"P={p} {model} {mode}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--partition", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="sage", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="sar", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, default=500_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--modes", default="sar,oneshot,hybrid")
    ap.add_argument("--models", default="sage,gat")
    ap.add_argument("--baseline", action="store_true", help="also run the SAR-equivalent baseline")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--method", choices=("metis", "random"), default="metis")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="write every measurement to this file")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    from sarc.datasets import power_law_graph
    from sarc.partition import partition_graph

    t0 = time.perf_counter()
    data = power_law_graph(args.nodes, args.edges, num_features=args.features,
                           num_classes=args.classes)
    print(f"graph: {data.num_nodes} nodes, {data.num_edges} edges, {args.features} features "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    node_data = {"feat": data.feat, "label": data.label, "train_mask": data.train_mask}
    results = []
    with tempfile.TemporaryDirectory(prefix="sarc-bench-") as tmp:
        for p in [int(s) for s in args.workers.split(",")]:
            t0 = time.perf_counter()
            pset = partition_graph(data.edge_src, data.edge_dst, data.num_nodes, p,
                                   Path(tmp) / f"p{p}", method=args.method, node_data=node_data)
            print(f"P={p}: partitioned ({args.method}) in {time.perf_counter() - t0:.0f} s, "
                  f"edge cut {pset.stats.edge_cut}", flush=True)
            runs = [(m, False) for m in args.modes.split(",")] if p > 1 else [("local", False)]
            if args.baseline and p > 1:
                runs.append(("sar", True))
            for model in args.models.split(","):
                for mode, baseline in runs:
                    r = run_one(args, str(pset.path), p, model, mode, baseline)
                    w = r["workers"]
                    top = max(w, key=lambda x: x["rss_peak"])
                    row = {"model": model, "workers": p, "mode": mode + (" baseline" if baseline else ""),
                           "rss_peak": top["rss_peak"], "rss_fixed": top["fixed_rss"],
                           "rss_data": top["data_rss"],
                           "per_worker_rss": [(x["fixed_rss"], x["data_rss"]) for x in w],
                           "sent": max(x["sent"] for x in w),
                           "planned_ok": all(x["sent"] == x["planned"] for x in w),
                           "epoch_s": statistics.median(r["times"][1:] or r["times"]),
                           "kept": [x["kept"] for x in w]}
                    results.append(row)
                    print(f"  {model:4s} P={p} {row['mode']:13s} peak {_gib(row['rss_peak'])} "
                          f"(fixed {_gib(row['rss_fixed'])} + data {_gib(row['rss_data'])}), "
                          f"sent {_mib(row['sent'])} MiB, "
                          f"epoch {row['epoch_s']:.2f} s", flush=True)
    print()
    print(f"{args.nodes} nodes, {args.edges} edges, {args.features} features, {args.epochs} "
          f"epochs, {args.method} partitions, {os.cpu_count()} cores")
    print(f"peak RSS of the largest worker = fixed (before its shard) + data; goal: at P = "
          f"{GOAL[0]}, whole <= {GOAL[1]}x P = 1's")
    print("| model | P | mode | fixed | data | whole | whole ÷ P=1 | goal | data ÷ P=1 "
          "| sent / worker / epoch (MiB) | = planner | epoch (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    one = {r["model"]: r for r in results if r["workers"] == 1}
    for r in results:
        base = one.get(r["model"])
        whole_x = r["rss_peak"] / base["rss_peak"] if base else None
        data_x = f"{r['rss_data'] / base['rss_data']:.2f}" if base else "-"
        goal = ("-" if whole_x is None or r["workers"] != GOAL[0]
                else f"{'met' if whole_x <= GOAL[1] else 'missed'} (<= {GOAL[1]})")
        print(f"| {r['model']} | {r['workers']} | {r['mode']} | {_gib(r['rss_fixed'])} | "
              f"{_gib(r['rss_data'])} | {_gib(r['rss_peak'])} | "
              f"{'-' if whole_x is None else f'{whole_x:.3f}'} | {goal} | {data_x} | "
              f"{_mib(r['sent'])} | {'yes' if r['planned_ok'] else 'NO'} | {r['epoch_s']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
