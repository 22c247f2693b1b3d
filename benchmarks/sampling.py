"""Sampled minibatch training: sarc on P workers against DGL's own sampling training.

The workload of DGL's multi-GPU sampling tutorial: GraphSAGE-mean (one layer per
fanout, ReLU between, the given hidden size), neighbour sampling with the given fanouts
(default 10,25, input layer first), minibatches of the training nodes, Adam, a few
epochs. Per run: epoch time (mean over the epochs after the first when there are
several; the seconds of the steps, as DGL's loop counts them: sarc evaluates once, after
the last epoch, outside them), samples per second (training seeds per second), peak
memory per worker (RSS,
and torch's CUDA peak where there is a GPU) and bytes sent per step per worker.

- sarc rows: ``sarc train models/sage.py --mode sampling --fanouts F --batch-size B
  --workers P --json out.json`` on the graph written as a dataset file (its JSON
  report read back). A sarc whose ``sarc train`` has no ``--mode sampling`` yet gets a
  row saying so instead.
- DGL rows (when ``dgl`` imports, e.g. in .venv-dgl): ``dgl.dataloading.NeighborSampler``
  + ``dgl.dataloading.DataLoader`` and ``dgl.nn.SAGEConv('mean')``, one process per
  worker, DDP over gloo (NCCL on GPUs) with the loader's ``use_ddp`` split of the
  seeds; each process holds the whole graph, so no rows cross: its bytes per step are
  the gradient all-reduce's (ring: 2 (P-1)/P of the parameters' bytes).

    python benchmarks/sampling.py [--nodes 1000000 --edges 20000000] [--workers 1,2,4]
        [--fanouts 10,25] [--batch-size 1024] [--hidden 256] [--epochs 3] [--no-cora]
        [--only sarc|dgl]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# --- the graphs ---------------------------------------------------------------------------

def write_graph(path: Path, name: str, args) -> dict:
    """The benchmark graph as a sarc dataset file at ``path``; its sizes."""
    from sarc.datasets import load_dataset, power_law_graph
    if name == "cora":
        data = load_dataset("cora")
    else:
        data = power_law_graph(args.nodes, args.edges, num_features=args.features,
                               num_classes=args.classes)
    arrays = {"edge_src": data.edge_src.numpy(), "edge_dst": data.edge_dst.numpy(),
              "feat": data.feat.numpy(), "label": data.label.numpy(),
              "train_mask": data.train_mask.numpy(), "val_mask": data.val_mask.numpy(),
              "test_mask": data.test_mask.numpy(), "num_nodes": np.int64(data.num_nodes),
              "num_classes": np.int64(data.num_classes)}
    np.savez(path, **arrays)
    return {"nodes": data.num_nodes, "edges": int(data.edge_src.numel()),
            "train": int(data.train_mask.sum()), "features": data.num_features}


# --- sarc ----------------------------------------------------------------------------------

def sarc_supports_sampling() -> str | None:
    """None if ``sarc train`` takes ``--mode sampling --fanouts --batch-size``; else why not."""
    proc = subprocess.run([sys.executable, "-m", "sarc.cli", "train", "--help"], text=True,
                          capture_output=True, env=_env(), cwd=ROOT)
    missing = [o for o in ("--fanouts", "--batch-size") if o not in proc.stdout]
    if proc.returncode != 0 or missing:
        return (f"sarc train has no {' / '.join(missing) or 'help'}: --mode sampling is not "
                f"supported by this sarc yet")
    return None


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def run_sarc(graph: Path, info: dict, p: int, args, tmp: Path) -> dict:
    out = tmp / f"sarc-{graph.stem}-{p}.json"
    # --batch-size is sarc's step over all workers: DGL's per-process batch times P
    cmd = [sys.executable, "-m", "sarc.cli", "train", str(ROOT / "models" / "sage.py"),
           "--dataset", str(graph), "--mode", "sampling", "--fanouts", args.fanouts,
           "--batch-size", str(args.batch_size * p), "--workers", str(p),
           "--epochs", str(args.epochs), "--eval-every", str(args.epochs),
           "--set", f"hidden={args.hidden}", "--set", "dropout=0", "--set", "norm_features=False",
           *(["--quiet"] if p == 1 else ["--log-every", str(args.epochs)]), "--json", str(out)]
    if len(args.fanout_list) != 2:
        return {"error": "models/sage.py has two layers: give two fanouts"}
    # one process reports no per-worker memory: its peak RSS is measured from outside
    wrapper = ("import resource, subprocess, sys; c = subprocess.run(sys.argv[1:]).returncode; "
               "print('RSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
               "sys.exit(c)")
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], text=True, capture_output=True,
                          env=_env(), cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return {"error": f"sarc train exited {proc.returncode}: {last}"}
    row = sarc_row(json.loads(out.read_text()), info)
    if row["rss"] is None:
        row["rss"] = int(proc.stdout.rsplit("RSS ", 1)[1].split()[0])
    return row


def sarc_row(report: dict, info: dict) -> dict:
    """The benchmark's figures from ``sarc train --json``'s report."""
    epochs = report.get("epoch_times_s")
    epoch_s = (_steady(epochs) if epochs else
               report["epoch_ms"] / 1e3 if "epoch_ms" in report else
               report["time_s"] / max(1, report.get("epochs", 1)))
    workers = report.get("per_worker") or []
    step = [w.get("step_bytes_sent") for w in workers if w.get("step_bytes_sent") is not None]
    planned = [w.get("planned_step_bytes_sent") for w in workers]
    return {"planned_step_bytes": (max(planned) if planned and None not in planned else None),
            "epoch_s": epoch_s,
            "samples_s": report.get("samples_per_s", info["train"] / epoch_s),
            "rss": max((w.get("rss_peak", 0) for w in workers), default=None),
            "cuda": max((w["cuda_peak"] for w in workers if "cuda_peak" in w), default=None),
            "step_bytes": max(step) if step else None}


def _steady(times: list[float]) -> float:
    """Mean epoch time after the first (warm-up) epoch, when there are several."""
    rest = times[1:] or times
    return sum(rest) / len(rest)


# --- DGL -----------------------------------------------------------------------------------

def dgl_available() -> str | None:
    try:
        import dgl  # noqa: F401
    except Exception as e:  # noqa: BLE001 (any import failure: no DGL rows)
        return f"dgl does not import here ({type(e).__name__}: {e})"
    return None


def run_dgl(graph: Path, info: dict, p: int, args, tmp: Path) -> dict:
    import torch.multiprocessing as mp
    port = _free_port()
    out = tmp / f"dgl-{graph.stem}-{p}"
    out.mkdir(exist_ok=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dgl_worker, args=(r, p, port, str(graph), vars(args), str(out)))
             for r in range(p)]
    for q in procs:
        q.start()
    for q in procs:
        q.join()
    if any(q.exitcode != 0 for q in procs):
        errors = [f.read_text() for f in sorted(out.glob("error-*.txt"))]
        return {"error": f"DGL worker failed: {(errors or ['exit codes ' + str([q.exitcode for q in procs])])[0].strip().splitlines()[-1]}"}
    workers = [json.loads((out / f"r{r}.json").read_text()) for r in range(p)]
    epoch_s = _steady([max(w["epochs"][e] for w in workers) for e in range(args.epochs)])
    return {"epoch_s": epoch_s, "samples_s": info["train"] / epoch_s,
            "rss": max(w["rss_peak"] for w in workers),
            "cuda": max((w["cuda_peak"] for w in workers if "cuda_peak" in w), default=None),
            "step_bytes": workers[0]["step_bytes"]}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dgl_worker(rank: int, p: int, port: int, graph: str, args: dict, out: str) -> None:
    try:
        result = _dgl_train(rank, p, port, graph, args)
        Path(out, f"r{rank}.json").write_text(json.dumps(result))
    except BaseException:
        import traceback
        Path(out, f"error-{rank}.txt").write_text(traceback.format_exc())
        raise


def _dgl_train(rank: int, p: int, port: int, graph: str, args: dict) -> dict:
    import dgl
    import dgl.nn as dglnn
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // p))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if p > 1:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=p)
    a = np.load(graph)
    g = dgl.graph((torch.from_numpy(a["edge_src"]), torch.from_numpy(a["edge_dst"])),
                  num_nodes=int(a["num_nodes"]))
    feat = torch.from_numpy(a["feat"]).to(device)
    label = torch.from_numpy(a["label"]).to(device)
    train_idx = torch.from_numpy(a["train_mask"]).nonzero().squeeze(1).to(device)
    fanouts = [int(f) for f in args["fanouts"].split(",")]

    class SAGE(nn.Module):
        def __init__(self, sizes):
            super().__init__()
            self.layers = nn.ModuleList(dglnn.SAGEConv(i, o, "mean")
                                        for i, o in zip(sizes[:-1], sizes[1:]))

        def forward(self, blocks, x):
            for k, (layer, block) in enumerate(zip(self.layers, blocks)):
                x = layer(block, x)
                if k < len(self.layers) - 1:
                    x = F.relu(x)
            return x

    sizes = [feat.shape[1]] + [args["hidden"]] * (len(fanouts) - 1) + [int(a["num_classes"])]
    torch.manual_seed(0)
    model = SAGE(sizes).to(device)
    params = sum(q.numel() * q.element_size() for q in model.parameters())
    if p > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    loader = dgl.dataloading.DataLoader(g.to(device) if cuda else g, train_idx, sampler,
                                        device=device, batch_size=args["batch_size"],
                                        shuffle=True, drop_last=False, num_workers=0,
                                        use_ddp=p > 1)
    epochs = []
    for _ in range(args["epochs"]):  # the loader reshuffles (and re-splits) every epoch
        t0 = time.perf_counter()
        for _, seeds, blocks in loader:
            x = feat[blocks[0].srcdata[dgl.NID]]
            loss = F.cross_entropy(model(blocks, x), label[seeds])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()
        epochs.append(time.perf_counter() - t0)
    out = {"epochs": epochs, "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_bytes": int(2 * (p - 1) / p * params)}
    if cuda:
        out["cuda_peak"] = int(torch.cuda.max_memory_allocated(device))
    if p > 1:
        dist.destroy_process_group()
    return out


# --- the table -----------------------------------------------------------------------------

def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def print_table(rows) -> None:
    print("| graph | system | P | epoch (s) | samples/s | peak RSS / worker (MiB) "
          "| CUDA peak (MiB) | bytes / step / worker (MiB) | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for graph, system, p, r in rows:
        if "error" in r:
            print(f"| {graph} | {system} | {p} | - | - | - | - | - | {r['error']} |")
            continue
        note = "gradient all-reduce only (whole graph per process)" if system == "dgl" else ""
        if r.get("planned_step_bytes") is not None and p > 1:
            note = f"planner: {_mib(r['planned_step_bytes'])} MiB / step (layers' exchanges)"
        print(f"| {graph} | {system} | {p} | {r['epoch_s']:.2f} | {r['samples_s']:.0f} "
              f"| {_mib(r['rss'])} | {_mib(r['cuda'])} | {_mib(r['step_bytes'])} | {note} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--fanouts", default="10,25", help="per layer, input layer first")
    ap.add_argument("--batch-size", type=int, default=1024, help="seeds per worker and step")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--no-cora", dest="cora", action="store_false")
    ap.add_argument("--only", choices=("sarc", "dgl"), help="run one system's rows")
    args = ap.parse_args()
    args.fanout_list = [int(f) for f in args.fanouts.split(",")]
    workers = [int(w) for w in args.workers.split(",")]

    rows = []
    no_sarc = None if args.only == "dgl" else sarc_supports_sampling()
    no_dgl = None if args.only == "sarc" else dgl_available()
    graphs = ["power-law"] + (["cora"] if args.cora else [])
    with tempfile.TemporaryDirectory(prefix="sarc-sampling-") as tmp:
        tmp = Path(tmp)
        for name in graphs:
            path = tmp / f"{name}.npz"
            info = write_graph(path, name, args)
            label = (f"power-law {info['nodes']}/{info['edges']}" if name == "power-law"
                     else "cora")
            print(f"{label}: {info['train']} training nodes, {info['features']} features",
                  file=sys.stderr)
            for p in workers:
                if args.only != "dgl":
                    r = {"error": no_sarc} if no_sarc else run_sarc(path, info, p, args, tmp)
                    rows.append((label, "sarc", p, r))
                if args.only != "sarc":
                    r = {"error": no_dgl} if no_dgl else run_dgl(path, info, p, args, tmp)
                    rows.append((label, "dgl", p, r))
    print(f"GraphSAGE-mean, fanouts {args.fanouts}, batch {args.batch_size} seeds per worker, "
          f"hidden {args.hidden}, {args.epochs} epochs")
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
