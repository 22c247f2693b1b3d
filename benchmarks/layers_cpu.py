"""Forward + backward time of the model zoo's layers on the CPU: sarc against PyG and DGL.

Each layer of ``benchmarks/triton_kernels.py`` (GCN, GraphSAGE-mean, GAT 4x32 with and
without attention dropout, GIN, RGCN) runs on a synthetic power-law graph, compiled by
sarc for its PyTorch backend, and as the matching PyG and DGL layer where that library
imports here (PyG in ``.venv``; DGL, and PyG, in ``.venv-dgl``, whose torch is 2.2.1:
compare libraries within one run, not across environments). Median of ``--repeat``
runs after one warm-up run.

    python benchmarks/layers_cpu.py [--nodes 100000] [--edges 1000000] [--feats 128]
        [--repeat 3] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sarc  # noqa: E402
from sarc.datasets import power_law_graph  # noqa: E402
from triton_kernels import _dgl_layer, _pyg_layer, layers  # noqa: E402


def seconds(run, repeat: int) -> float:
    """Median wall time of ``run()`` over ``repeat`` runs, after one warm-up run."""
    run()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def libraries(data, n: int) -> dict:
    """The graph in each library that imports here, by library name; the others say why not."""
    libs = {}
    try:
        import torch_geometric  # noqa: F401
        libs["PyG"] = torch.stack([data.edge_src, data.edge_dst])
    except Exception as err:  # noqa: BLE001 - a missing library is a missing column
        print(f"PyG: not timed ({type(err).__name__}: {err})")
    try:
        import dgl
        libs["DGL"] = dgl.graph((data.edge_src, data.edge_dst), num_nodes=n)
    except Exception as err:  # noqa: BLE001
        print(f"DGL: not timed ({type(err).__name__}: {err})")
    return libs


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=1_000_000)
    ap.add_argument("--feats", type=int, default=128)
    ap.add_argument("--rels", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the measurements to this file")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    data = power_law_graph(args.nodes, args.edges, seed=0)
    g = sarc.Graph.from_edges(data.edge_src, data.edge_dst, data.num_nodes)
    n, e = g.num_src, g.num_edges
    x = torch.randn(n, args.feats)
    etype = torch.randint(0, args.rels, (e,))
    edge = {"etype": etype, "norm": torch.rand(e)}
    libs = libraries(data, n)
    print(f"graph: {n} nodes, {e} edges, {args.feats} features; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; forward + backward, median of {args.repeat}\n")
    rows = []
    for name, layer, relational in layers(args.feats, args.rels):
        layer = layer.train().set_backend("torch")
        feats = {"h": x, **(edge if relational else {})}

        def run_sarc():
            m_in = {**feats, "h": x.detach().requires_grad_()}
            layer(g, **m_in).sum().backward()
        row = {"layer": name, "sarc": _timed(run_sarc, args.repeat)}
        for lib, graph in libs.items():
            try:
                mod = (_pyg_layer if lib == "PyG" else _dgl_layer)(name, args.feats, args.rels).train()
            except Exception as err:  # noqa: BLE001 - one missing layer should not hide the rest
                row[lib] = f"error: {type(err).__name__}: {err}"
                continue

            def run_lib(mod=mod, graph=graph, lib=lib):
                xx = x.detach().requires_grad_()
                if lib == "PyG":
                    out = mod(xx, graph, etype) if relational else mod(xx, graph)
                else:
                    out = mod(graph, xx, etype) if relational else mod(graph, xx)
                out.sum().backward()
            row[lib] = _timed(run_lib, args.repeat)
        rows.append(row)
        print(f"  {name}: done", file=sys.stderr, flush=True)
    head = ("layer", "sarc", *libs)
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join([row["layer"], *(_ms(row[k]) for k in head[1:])]) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "graph": {"nodes": n, "edges": e}, "libraries": ["sarc", *libs],
            "unit": "seconds", "rows": rows}, indent=1))


def _timed(run, repeat: int):
    """Seconds, or the error that stopped the run (as text)."""
    try:
        return seconds(run, repeat)
    except Exception as err:  # noqa: BLE001
        return f"error: {type(err).__name__}: {err}"


def _ms(v) -> str:
    """Milliseconds, or the error's kind ("error: TypeError")."""
    return f"{v * 1e3:.1f} ms" if isinstance(v, float) else ": ".join(v.split(": ")[:2])


if __name__ == "__main__":
    main()
