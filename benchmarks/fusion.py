"""What the middle-end's passes buy on the PyTorch backend: edge tensors kept, time.

For every model layer, on a synthetic power-law graph (default 100k nodes,
2M edges, 128 features), it compiles the layer twice: without pushdown and
fusion (``sarc.compiler.UNFUSED``) and with the full pipeline. It then runs
one forward + backward of each and prints:

- the bytes of edge tensors (rows = E) autograd keeps for the backward pass,
  measured with ``torch.autograd.graph.saved_tensors_hooks``, and the cost
  model's prediction of the same after fusion;
- the forward + backward wall time (median of --repeat runs).

    python benchmarks/fusion.py [--nodes 100000] [--edges 2000000] [--feats 128]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))

import sarc  # noqa: E402
from sarc.compiler import PIPELINE, UNFUSED, compile_function  # noqa: E402
from sarc.datasets import power_law_graph  # noqa: E402
from sarc.ir.types import E, N_DST, N_SRC  # noqa: E402
from sarc.planner.cost import saved_for_backward  # noqa: E402
from sarc.runtime.bind import bind_inputs  # noqa: E402


def layers(f: int, num_rels: int):
    from gat import GATLayer
    from gcn import GCNLayer
    from gin import GINLayer
    from rgcn import RGCNLayer
    from sage import SAGELayer
    return [
        ("GCN", GCNLayer(f, f), False),
        ("SAGE-mean", SAGELayer(f, f), False),
        ("GAT 4x32", GATLayer(f, 32, heads=4), False),
        ("GIN", GINLayer(f, f, f), False),
        ("RGCN b=4", RGCNLayer(f, f, num_rels, num_bases=4), True),
    ]


def edge_bytes_saved(run, num_edges: int) -> int:
    """Bytes of the tensors with E rows that autograd saves during ``run()``."""
    seen: dict[int, int] = {}

    def pack(t):
        if t.dim() > 0 and t.shape[0] == num_edges and t.dtype.is_floating_point:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--rels", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="comma-separated layer names to run (default: all)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    data = power_law_graph(args.nodes, args.edges, seed=0)
    g = sarc.Graph.from_edges(data.edge_src, data.edge_dst, data.num_nodes)
    n, e = g.num_src, g.num_edges
    x = torch.randn(n, args.feats)
    edge = {"etype": torch.randint(0, args.rels, (e,)), "norm": torch.rand(e)}
    print(f"graph: {n} nodes, {e} edges, {args.feats} features, {torch.get_num_threads()} threads\n")
    head = ("layer", "edge bytes kept (unfused)", "(fused)", "(fused, predicted)",
            "fwd+bwd unfused", "fused", "speedup")
    rows = []
    wanted = set(args.only.split(",")) if args.only else None
    for name, layer, relational in layers(args.feats, args.rels):
        if wanted is not None and name not in wanted:
            continue
        fn = layer.trace()
        params = layer.leaf_tensors()
        ein = edge if relational else {}
        result = []
        for passes in (UNFUSED, PIPELINE):
            kernel = compile_function(fn, passes=passes)

            def run():
                xx = x.clone().requires_grad_()
                inputs = bind_inputs(layer, kernel.function, g, (xx,), ein)
                out = kernel(g, inputs, params, False)
                out["h"].sum().backward()

            kept = edge_bytes_saved(run, e)
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            result.append((kept, statistics.median(times)))
        predicted = saved_for_backward(kernel.function)["edge"].subs({N_SRC: n, N_DST: n, E: e})
        (k0, t0), (k1, t1) = result
        rows.append((name, f"{k0 / 2**20:.1f} MiB", f"{k1 / 2**20:.1f} MiB",
                     f"{int(predicted) / 2**20:.1f} MiB", f"{t0:.2f} s", f"{t1:.2f} s",
                     f"{t0 / t1:.2f}x"))
        print(f"  {name}: done", file=sys.stderr)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")


if __name__ == "__main__":
    main()
