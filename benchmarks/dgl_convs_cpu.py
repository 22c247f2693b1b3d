"""DGL's convs traced by sarc (``from_dgl_module``) against the same modules on DGL's own
kernels: one forward + backward on the CPU, in ``.venv-dgl``.

Each conv of ``CONVS`` (a typical setting, 64 features) runs on a synthetic power-law
graph with a self loop at every node, once through sarc's PyTorch backend on a
``sarc.Graph`` and once on the DGL graph; after a warm-up run each (sarc's includes its
compilation), ``--repeat`` rounds alternate the two and the median of each is reported.
A conv sarc refuses, or one that fails, is reported as such and the others still run.

    DGLBACKEND=pytorch python benchmarks/dgl_convs_cpu.py [--nodes 30000] [--edges 300000]
        [--repeat 3] [--convs GMMConv,CFConv]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import sarc
from sarc.datasets import power_law_graph

F = 64


def convs():
    """name -> (module factory, node features declared, edge features declared)."""
    from dgl.nn.pytorch import conv as C
    lin = torch.nn.Linear
    return {
        "GraphConv": (lambda: C.GraphConv(F, F), {"feat": F}, {}),
        "SAGEConv-gcn": (lambda: C.SAGEConv(F, F, "gcn"), {"feat": F}, {}),
        "GATv2Conv 4x16": (lambda: C.GATv2Conv(F, 16, 4), {"feat": F}, {}),
        "DotGatConv 4x16": (lambda: C.DotGatConv(F, 16, 4), {"feat": F}, {}),
        "AGNNConv": (lambda: C.AGNNConv(), {"feat": F}, {}),
        "TAGConv k=2": (lambda: C.TAGConv(F, F, 2), {"feat": F}, {}),
        "SGConv k=2": (lambda: C.SGConv(F, F, 2), {"feat": F}, {}),
        "APPNPConv k=3": (lambda: C.APPNPConv(3, 0.1), {"feat": F}, {}),
        "GINEConv": (lambda: C.GINEConv(lin(F, F)), {"node_feat": F}, {"edge_feat": F}),
        "NNConv": (lambda: C.NNConv(F, 8, lin(4, F * 8), "mean"), {"feat": F}, {"efeat": 4}),
        "GMMConv": (lambda: C.GMMConv(F, F, 2, 3, "mean"), {"feat": F}, {"pseudo": 2}),
        "CFConv": (lambda: C.CFConv(F, 4, F, F), {"node_feats": F}, {"edge_feats": 4}),
        "EdgeConv": (lambda: C.EdgeConv(F, F), {"feat": F}, {}),
        "GCN2Conv": (lambda: C.GCN2Conv(F, 1, alpha=0.1, lambda_=1), {"feat": F, "feat_0": F}, {}),
    }


def median_times(runs: dict, repeat: int) -> dict:
    for run in runs.values():
        run()
    times = {k: [] for k in runs}
    for _ in range(repeat):
        for k, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=30_000)
    ap.add_argument("--edges", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--convs", default="", help="comma-separated names (default: all)")
    args = ap.parse_args(argv)
    import dgl
    from sarc.frontends.dgl import from_dgl_module
    data = power_law_graph(args.nodes, args.edges)
    n = data.num_nodes
    src = torch.cat([data.edge_src, torch.arange(n)])
    dst = torch.cat([data.edge_dst, torch.arange(n)])
    g, dg = sarc.Graph.from_edges(src, dst, n), dgl.graph((src, dst), num_nodes=n)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, F, generator=gen)
    print(f"graph: {n} nodes, {src.numel()} edges (a self loop each), {F} features; torch "
          f"{torch.__version__}, DGL {dgl.__version__}, {torch.get_num_threads()} threads; "
          f"forward + backward, median of {args.repeat}\n")
    print("| conv | sarc | DGL | sarc / DGL |\n|---|---|---|---|")
    wanted = [w for w in args.convs.split(",") if w]
    for name, (make, node, edge) in convs().items():
        if wanted and name not in wanted:
            continue
        torch.manual_seed(0)
        module = make()
        ref = copy.deepcopy(module)
        efeats = {k: torch.rand(src.numel(), d, generator=gen) + 0.1 for k, d in edge.items()}

        def run_sarc(layer=None):
            xx = x.detach().requires_grad_()
            out = layer(g, **{k: xx for k in node}, **efeats)
            (out[0] if isinstance(out, tuple) else out).sum().backward()

        def run_dgl(ref=ref, node=node, efeats=efeats):
            xx = x.detach().requires_grad_()
            out = ref(dg, *[xx for _ in node], *efeats.values())
            (out[0] if isinstance(out, tuple) else out).sum().backward()
        try:
            layer = from_dgl_module(module, node=node, edge=edge)
            t = median_times({"sarc": lambda layer=layer: run_sarc(layer), "dgl": run_dgl},
                             args.repeat)
        except Exception as err:  # noqa: BLE001 - one conv should not hide the rest
            print(f"| {name} | {type(err).__name__}: {str(err).splitlines()[0][:120]} | | |")
            continue
        print(f"| {name} | {t['sarc'] * 1e3:.0f} ms | {t['dgl'] * 1e3:.0f} ms | "
              f"{t['sarc'] / t['dgl']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
