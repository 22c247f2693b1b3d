"""The Triton backend's generated kernels: bytes moved (cost model) and GPU time vs DGL and PyG.

Part 1, on any machine: for every layer of the model zoo, the cost model's bytes
moved by each kernel the Triton backend generates for a fused op
(``sarc.planner.cost.fused_traffic``) against the naive plan that materializes
every edge tensor (gathers, edge intermediates, the edge softmax's weights),
evaluated at the benchmark's graph sizes.

Part 2, on a CUDA GPU only: forward + backward time of each layer compiled with
the Triton backend, the PyTorch backend, and the matching DGL and PyG layers
(those that import here), on a synthetic power-law graph; median of --repeat
runs after a warm-up that includes Triton's compilation and autotuning. On a
machine without a CUDA GPU it says so and exits 0 (the kernels are tested
there in Triton's interpreter: tests/backends/triton).

    python benchmarks/triton_kernels.py [--nodes 100000] [--edges 2000000] [--feats 128]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))

import sarc  # noqa: E402
from sarc.compiler import compile_layer  # noqa: E402
from sarc.datasets import power_law_graph  # noqa: E402
from sarc.ir.types import E, N_DST, N_SRC  # noqa: E402
from sarc.planner.cost import fused_traffic  # noqa: E402


def layers(f: int, rels: int):
    """(name, sarc layer, relational) for every model of the zoo."""
    from edgeconv import EdgeConvLayer
    from gat import GATLayer
    from gcn import GCNLayer
    from gin import GINLayer
    from rgcn import RGCNLayer
    from sage import SAGELayer
    return [
        ("GCN", GCNLayer(f, f), False),
        ("SAGE-mean", SAGELayer(f, f), False),
        ("SAGE-pool", SAGELayer(f, f, aggregator="pool"), False),
        ("GAT 4x32", GATLayer(f, 32, heads=4), False),
        ("GAT 4x32 attn-drop", GATLayer(f, 32, heads=4, attn_drop=0.5), False),
        ("GIN", GINLayer(f, f, f), False),
        ("EdgeConv", EdgeConvLayer(f, f), False),
        ("RGCN", RGCNLayer(f, f, rels), True),
    ]


def _table(head, rows) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
             for r in [head, tuple("-" * w for w in widths), *rows]]
    return "\n".join(lines)


def traffic_table(args) -> str:
    sizes = {N_SRC: args.nodes, N_DST: args.nodes, E: args.edges}
    rows = []
    for name, layer, _ in layers(args.feats, args.rels):
        fn = compile_layer(layer, "triton", through="optimize").optimized  # its passes too
        for t in fused_traffic(fn):
            fused, naive = int(t.fused.subs(sizes)), int(t.naive.subs(sizes))
            rows.append((name, f"%{t.value} {t.op}", f"{fused / 2**20:.1f} MiB",
                         f"{naive / 2**20:.1f} MiB", f"{naive / fused:.2f}x", str(t.fused)))
    head = ("layer", "kernel (forward)", "fused", "naive", "naive / fused", "fused bytes (formula)")
    return _table(head, rows)


# --- GPU timings -----------------------------------------------------------------------

def _time(run, repeat: int) -> float:
    run()
    run()  # warm-up: compilation, autotuning, caches
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pyg_layer(name: str, f: int, rels: int):
    import torch_geometric.nn as pyg
    if name == "GCN":
        return pyg.GCNConv(f, f, add_self_loops=False)
    if name == "SAGE-mean":
        return pyg.SAGEConv(f, f, aggr="mean")
    if name == "SAGE-pool":
        return pyg.SAGEConv(f, f, aggr="max", project=True)
    if name.startswith("GAT"):
        return pyg.GATConv(f, 32, heads=4, add_self_loops=False,
                           dropout=0.5 if "drop" in name else 0.0)
    if name == "GIN":
        return pyg.GINConv(torch.nn.Sequential(torch.nn.Linear(f, f), torch.nn.ReLU(),
                                               torch.nn.Linear(f, f)))
    if name == "EdgeConv":   # theta(x_j - x_i) + phi(x_i): one linear of [x_i, x_j - x_i]
        return pyg.EdgeConv(torch.nn.Linear(2 * f, f), aggr="max")
    return pyg.RGCNConv(f, f, rels)


def _dgl_layer(name: str, f: int, rels: int):
    import dgl.nn as dglnn
    if name == "GCN":
        return dglnn.GraphConv(f, f, norm="both", allow_zero_in_degree=True)
    if name == "SAGE-mean":
        return dglnn.SAGEConv(f, f, "mean")
    if name == "SAGE-pool":
        return dglnn.SAGEConv(f, f, "pool")
    if name.startswith("GAT"):
        return dglnn.GATConv(f, 32, 4, attn_drop=0.5 if "drop" in name else 0.0,
                             allow_zero_in_degree=True)
    if name == "GIN":
        return dglnn.GINConv(torch.nn.Sequential(torch.nn.Linear(f, f), torch.nn.ReLU(),
                                                 torch.nn.Linear(f, f)), "sum")
    if name == "EdgeConv":
        return dglnn.EdgeConv(f, f, allow_zero_in_degree=True)
    return dglnn.RelGraphConv(f, f, rels)


def gpu_table(args) -> str:
    dev = torch.device("cuda")
    data = power_law_graph(args.nodes, args.edges, seed=0)
    g = sarc.Graph.from_edges(data.edge_src, data.edge_dst, data.num_nodes).to(dev)
    n, e = g.num_src, g.num_edges
    x = torch.randn(n, args.feats, device=dev)
    etype = torch.randint(0, args.rels, (e,), device=dev)
    edge = {"etype": etype, "norm": torch.rand(e, device=dev)}
    libs = {}
    try:
        import torch_geometric  # noqa: F401
        libs["PyG"] = torch.stack([data.edge_src, data.edge_dst]).to(dev)
    except Exception as err:  # noqa: BLE001 - report and go on
        print(f"PyG: not timed ({type(err).__name__}: {err})")
    try:
        import dgl
        libs["DGL"] = dgl.graph((data.edge_src, data.edge_dst), num_nodes=n).to(dev)
    except Exception as err:  # noqa: BLE001
        print(f"DGL: not timed ({type(err).__name__}: {err})")
    head = ("layer", "sarc triton", "sarc torch", *libs)
    rows = []
    for name, layer, relational in layers(args.feats, args.rels):
        layer = layer.to(dev).train()
        row = [name]
        for backend in ("triton", "torch"):
            m = copy.deepcopy(layer).set_backend(backend)
            feats = {"h": x, **(edge if relational else {})}

            def run(m=m, feats=feats):
                xx = feats["h"].detach().requires_grad_()
                m(g, **{**feats, "h": xx}).sum().backward()
            try:
                row.append(f"{_time(run, args.repeat) * 1e3:.2f} ms")
            except Exception as err:  # noqa: BLE001 - one failing layer should not hide the rest
                row.append(f"error: {type(err).__name__}")
        for lib, graph in libs.items():
            try:
                mod = (_pyg_layer if lib == "PyG" else _dgl_layer)(name, args.feats, args.rels).to(dev)

                def run(mod=mod, graph=graph, lib=lib):
                    xx = x.detach().requires_grad_()
                    if lib == "PyG":
                        out = mod(xx, graph, etype) if relational else mod(xx, graph)
                    else:
                        out = mod(graph, xx, etype) if relational else mod(graph, xx)
                    out.sum().backward()
                row.append(f"{_time(run, args.repeat) * 1e3:.2f} ms")
            except Exception as err:  # noqa: BLE001
                row.append(f"error: {type(err).__name__}")
        rows.append(tuple(row))
        print(f"  {name}: done", file=sys.stderr)
    return (f"{torch.cuda.get_device_name()}: {n} nodes, {e} edges, {args.feats} features, "
            f"forward + backward, median of {args.repeat}\n\n" + _table(head, rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--rels", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"Bytes moved per forward kernel (cost model), N = {args.nodes}, E = {args.edges}, "
          f"{args.feats} features, float32:\n")
    print(traffic_table(args))
    print()
    if not torch.cuda.is_available():
        print("No CUDA GPU on this machine: the GPU comparison of the generated Triton kernels "
              "with DGL's and PyG's was skipped (the kernels are verified in Triton's "
              "interpreter by tests/backends/triton).")
        return 0
    try:
        from sarc.backends.triton_backend import check_triton
        check_triton()
    except Exception as err:  # noqa: BLE001
        print(f"The Triton backend cannot run here: {err}; GPU comparison skipped.")
        return 0
    print(gpu_table(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
