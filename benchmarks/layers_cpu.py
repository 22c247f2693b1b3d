"""Forward + backward time of the model zoo's layers on the CPU: sarc against PyG and DGL.

Each layer of ``benchmarks/triton_kernels.py`` (GCN, GraphSAGE-mean and -pool, GAT 4x32
with and without attention dropout, GIN, RGCN) runs on a synthetic power-law graph,
compiled by sarc for its PyTorch backend, and as the matching PyG and DGL layer where
that library imports here (PyG in ``.venv``; DGL, and PyG, in ``.venv-dgl``, whose
torch is 2.2.1: compare libraries within one run, not across environments). After one warm-up run each,
the libraries run in turn, ``--repeat`` rounds (interleaved, so a load on the machine
falls on all of them alike); the median of the rounds is reported. ``--memory`` adds
each run's peak of bytes allocated through torch's CPU allocator (DGL's tensors are
allocated there too), above what was allocated before the run, from the profiler's
memory events.

    python benchmarks/layers_cpu.py [--nodes 100000] [--edges 1000000] [--feats 128]
        [--repeat 3] [--layers GCN,GAT] [--memory] [--json PATH]
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


def interleaved(runs: dict, repeat: int) -> dict:
    """Median wall time of each ``runs[name]()`` over ``repeat`` rounds that run every one in
    turn, after one warm-up run each; a run that raises gives its error (as text)."""
    times: dict = {}
    for name, run in runs.items():
        try:
            run()
            times[name] = []
        except Exception as err:  # noqa: BLE001 - one failing library should not hide the rest
            times[name] = f"error: {type(err).__name__}: {err}"
    for _ in range(repeat):
        for name, run in runs.items():
            if isinstance(times[name], list):
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) if isinstance(v, list) else v for k, v in times.items()}


def peak_bytes(run) -> int:
    """Peak of the bytes torch's CPU allocator holds during ``run()``, above its start."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns() if hasattr(e, "start_ns") else e.start_us())
    held = peak = 0
    for e in events:
        held += e.nbytes()
        peak = max(peak, held)
    return peak


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
    ap.add_argument("--layers", help="only the layers whose names start with one of these "
                    "(comma-separated, e.g. GCN,GAT)")
    ap.add_argument("--memory", action="store_true",
                    help="also measure each run's peak allocated bytes")
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
    wanted = [w for w in (args.layers or "").split(",") if w]
    for name, layer, relational in layers(args.feats, args.rels):
        if wanted and not any(name.startswith(w) for w in wanted):
            continue
        layer = layer.train().set_backend("torch")
        feats = {"h": x, **(edge if relational else {})}

        def run_sarc(layer=layer, feats=feats):
            m_in = {**feats, "h": x.detach().requires_grad_()}
            layer(g, **m_in).sum().backward()
        runs, row = {"sarc": run_sarc}, {"layer": name}
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
            runs[lib] = run_lib
        row.update(interleaved(runs, args.repeat))
        if args.memory:
            row["peak_bytes"] = {k: peak_bytes(run) for k, run in runs.items()
                                 if isinstance(row[k], float)}
        rows.append(row)
        print(f"  {name}: done", file=sys.stderr, flush=True)
    head = ("layer", "sarc", *libs)
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join([row["layer"], *(_ms(row[k]) for k in head[1:])]) + " |")
    if args.memory:
        print("\npeak allocated bytes during one forward + backward (MiB):\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            peaks = row.get("peak_bytes", {})
            print("| " + " | ".join([row["layer"], *(f"{peaks[k] / 2**20:.1f}" if k in peaks
                                                      else "-" for k in head[1:])]) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "graph": {"nodes": n, "edges": e}, "libraries": ["sarc", *libs],
            "unit": "seconds", "rows": rows}, indent=1))


def _ms(v) -> str:
    """Milliseconds, or the error's kind ("error: TypeError")."""
    return f"{v * 1e3:.1f} ms" if isinstance(v, float) else ": ".join(v.split(": ")[:2])


if __name__ == "__main__":
    main()
