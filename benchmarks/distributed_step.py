"""A layer's one-part distributed step against the same layer on a ``Graph``, per backend.

One process (a process group of one: nccl on a GPU, gloo on CPU) holds the whole graph
as the single part of a partition set; each layer runs a forward + backward step
(``sum(out * r)``, r fixed) on the ``Graph`` and on the ``DistGraph``. With one part
nothing crosses the network, so the ratio is what the distributed schedule costs over
the layer's own kernels: its split into parts, merges and surrogates, and which of
its edge blocks run on the layer's backend (the ``fallbacks`` column counts the block
ops that run on the torch backend's kernels instead). Median of ``--repeats`` after
one warm-up step. Each row is printed as it is measured, and ``--json`` is rewritten after
every row (a run stopped by a timeout keeps what it measured).

    python benchmarks/distributed_step.py [--nodes 100000] [--edges 2000000]
        [--features 64] [--layers gcn,sage,gat,max,edgeconv,dot] [--backends torch,triton] [--repeats 5]
        [--json PATH]

The Triton rows need a GPU: without CUDA they are left out and the output says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "models"), str(ROOT / "tests")]


def make_layer(name: str, d: int):
    from edgeconv import EdgeConvLayer
    from gat import GATLayer
    from gcn import GCNLayer
    from sage import SAGELayer

    from distributed.layers import DotAttentionLayer, MaxLayer
    return {"gcn": lambda: GCNLayer(d, d), "sage": lambda: SAGELayer(d, d),
            "gat": lambda: GATLayer(d, d // 4, heads=4), "max": lambda: MaxLayer(d, d),
            "edgeconv": lambda: EdgeConvLayer(d, d),
            "dot": lambda: DotAttentionLayer(d, d // 4, heads=4)}[name]()


def timed(fn, device, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, after one warm-up run."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--edges", type=int, default=2_000_000)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--layers", default="gcn,sage,gat,max,edgeconv,dot")
    p.add_argument("--backends", default="torch,triton")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the measurements (seconds) to this file")
    args = p.parse_args(argv)

    import torch.distributed as dist

    import sarc
    from sarc.datasets import power_law_graph
    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions, partition_graph
    from sarc.runtime.sharded import ShardedGraph

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    backends = args.backends.split(",")
    if "triton" in backends and not cuda:
        backends.remove("triton")
        print("no CUDA device: the Triton rows are left out (the Triton backend runs on GPUs)")
    data = power_law_graph(args.nodes, args.edges, num_features=args.features)
    n = data.num_nodes
    print(f"graph: {n} nodes, {data.edge_src.numel()} edges, {args.features} features; "
          f"device {device}; median of {args.repeats}")

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(minutes=10))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            pset = partition_graph(data.edge_src, data.edge_dst, n, 1, Path(tmp) / "parts",
                                   method="random", node_data={"feat": data.feat})
            shard = ShardedGraph.from_partitions(load_partitions(pset.path, verify=False), 0)
            dg = DistGraph(shard.to(device))
            g = sarc.Graph.from_edges(data.edge_src, data.edge_dst, n).to(device)
            x_graph = data.feat.to(device)
            x_dist = shard.ndata["feat"].to(device)
            rows = []
            for name in args.layers.split(","):
                for backend in backends:
                    torch.manual_seed(0)
                    layer = make_layer(name, args.features).to(device)
                    layer.set_backend(backend)
                    r = torch.randn(n, 1, device=device)

                    def step(graph, x):
                        out = layer(graph, x.requires_grad_())
                        (out * r[: out.shape[0]]).sum().backward()

                    t_graph = timed(lambda: step(g, x_graph.detach().clone()), device, args.repeats)
                    t_dist = timed(lambda: step(dg, x_dist.detach().clone()), device, args.repeats)
                    fallbacks = sum(len(p.generated.fallbacks) for k, p in dg.programs.items()
                                    if k[0] == id(layer))
                    rows.append((name, backend, t_graph, t_dist, fallbacks))
                    print("measured: " + _row(*rows[-1]), flush=True)
                    _write_json(args, device, rows)
    finally:
        dist.destroy_process_group()

    print(f"\n{'layer':<8} {'backend':<8} {'Graph ms':>10} {'1-part dist ms':>15} "
          f"{'ratio':>7} {'fallbacks':>10}")
    for row in rows:
        print(_row(*row))


def _row(name, backend, tg, td, fb) -> str:
    return (f"{name:<8} {backend:<8} {tg * 1e3:>10.1f} {td * 1e3:>15.1f} {td / tg:>7.2f} "
            f"{fb:>10}")


def _write_json(args, device, rows) -> None:
    if not args.json:
        return
    path = Path(args.json)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({
        "args": vars(args), "device": str(device),
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "torch": torch.__version__,
        "rows": [{"layer": name, "backend": backend, "graph_s": tg, "dist_s": td,
                  "ratio": td / tg, "fallbacks": fb} for name, backend, tg, td, fb in rows]},
        indent=1))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
