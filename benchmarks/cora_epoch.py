"""A full-graph training epoch on Cora: sarc against DGL and PyG, the same models.

Kipf & Welling's GCN (dropout, GCN 1433->16, ReLU, dropout, GCN 16->7) and Velickovic
et al.'s GAT (8 heads of 8, ELU, one output head; dropout and attention dropout 0.6),
as ``models/gcn.py`` / ``models/gat.py`` define them, and as DGL's ``GraphConv`` /
``GATConv`` and PyG's ``GCNConv`` / ``GATConv`` stack them (PyG's GCNConv with
``cached=True``, as its Cora example trains). An epoch is one forward on the whole
graph (self loops added, as each library's Cora example does), the training nodes'
cross-entropy, backward and an Adam step: on a graph this small, the per-call overhead
of each library. After warm-up epochs the systems run in turn (interleaved, so a load
on the machine falls on all alike), ``--rounds`` rounds of ``--epochs`` epochs; the
median epoch over the rounds is reported, with the torch threads given.

    python benchmarks/cora_epoch.py [--rounds 5] [--epochs 20] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "models"))

import sarc  # noqa: E402
from sarc.datasets import add_self_loops, load_dataset  # noqa: E402


def sarc_models(data, f: int, c: int) -> dict:
    from gat import GAT
    from gcn import GCN
    src, dst = add_self_loops(data.edge_src, data.edge_dst, data.num_nodes)
    g = sarc.Graph.from_edges(src, dst, data.num_nodes)
    gcn, gat = GCN(f, 16, c, dropout=0.5), GAT(f, 8, c, heads=8, dropout=0.6, attn_drop=0.6)
    return {"GCN": (gcn, lambda x: gcn(g, x)), "GAT": (gat, lambda x: gat(g, x))}


def dgl_models(data, f: int, c: int) -> dict:
    import dgl
    import dgl.nn as dglnn
    g = dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((data.edge_src, data.edge_dst),
                                                         num_nodes=data.num_nodes)))

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = dglnn.GraphConv(f, 16), dglnn.GraphConv(16, c)

        def forward(self, x):
            x = F.relu(self.c1(g, F.dropout(x, 0.5, self.training)))
            return self.c2(g, F.dropout(x, 0.5, self.training))

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = dglnn.GATConv(f, 8, 8, feat_drop=0.6, attn_drop=0.6, activation=F.elu)
            self.c2 = dglnn.GATConv(64, c, 1, feat_drop=0.6, attn_drop=0.6)

        def forward(self, x):
            return self.c2(g, self.c1(g, x).flatten(1)).mean(1)
    gcn, gat = GCN(), GAT()
    return {"GCN": (gcn, gcn), "GAT": (gat, gat)}


def pyg_models(data, f: int, c: int) -> dict:
    import torch_geometric.nn as pyg
    ei = torch.stack([data.edge_src, data.edge_dst])

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = pyg.GCNConv(f, 16, cached=True), pyg.GCNConv(16, c, cached=True)

        def forward(self, x):
            x = F.relu(self.c1(F.dropout(x, 0.5, self.training), ei))
            return self.c2(F.dropout(x, 0.5, self.training), ei)

    class GAT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = pyg.GATConv(f, 8, heads=8, dropout=0.6)
            self.c2 = pyg.GATConv(64, c, heads=1, concat=False, dropout=0.6)

        def forward(self, x):
            x = F.elu(self.c1(F.dropout(x, 0.6, self.training), ei))
            return self.c2(F.dropout(x, 0.6, self.training), ei)
    gcn, gat = GCN(), GAT()
    return {"GCN": (gcn, gcn), "GAT": (gat, gat)}


def epoch_runner(module, forward, x, label, train):
    """One training epoch of ``module`` (forward, loss, backward, Adam step)."""
    opt = torch.optim.Adam(module.parameters(), lr=0.005, weight_decay=5e-4)
    module.train()

    def run():
        opt.zero_grad()
        F.cross_entropy(forward(x)[train], label[train]).backward()
        opt.step()
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=20, help="epochs per round and system")
    ap.add_argument("--threads", default="1,2", help="torch threads, one table row each")
    args = ap.parse_args(argv)
    data = load_dataset("cora")
    x, label, train = data.feat, data.label, data.train_mask
    f, c = x.shape[1], int(data.num_classes)
    systems = {"sarc": sarc_models}
    for name, make in (("DGL", dgl_models), ("PyG", pyg_models)):
        try:
            make(data, f, c)
            systems[name] = make
        except Exception as err:  # noqa: BLE001 - a library that does not import is a column less
            print(f"{name}: not timed ({type(err).__name__}: {err})", file=sys.stderr)
    print(f"Cora ({data.num_nodes} nodes, {int(data.edge_src.numel())} edges), torch "
          f"{torch.__version__}; ms per training epoch, median of {args.rounds} rounds of "
          f"{args.epochs} epochs\n")
    print("| model, threads | " + " | ".join(systems) + " | sarc / best other |")
    print("|---|" + "---|" * (len(systems) + 1))
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for model in ("GCN", "GAT"):
            torch.manual_seed(0)
            runs = {}
            for name, make in systems.items():
                module, forward = make(data, f, c)[model]
                runs[name] = epoch_runner(module, forward, x, label, train)
            times = {name: [] for name in runs}
            for run in runs.values():          # warm-up: compile, caches, allocator
                for _ in range(3):
                    run()
            for _ in range(args.rounds):
                for name, run in runs.items():
                    t0 = time.perf_counter()
                    for _ in range(args.epochs):
                        run()
                    times[name].append((time.perf_counter() - t0) / args.epochs)
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            others = [v for k, v in ms.items() if k != "sarc"]
            ratio = f"{ms['sarc'] / min(others):.2f}" if others else "-"
            print(f"| {model}, {threads} | " + " | ".join(f"{ms[k]:.1f}" for k in runs)
                  + f" | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
