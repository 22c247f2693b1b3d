"""What training on the K-hop closure of the labeled nodes (MFG) saves over full-batch
training when few nodes are labeled.

One step of each computes the same gradient: full batch runs every layer on the whole
graph; MFG runs layer k on the nodes within K - k hops of the labeled nodes (all the
labeled nodes are one batch, split over the workers). Per layer and for the whole step,
on P workers:

- compute: edges the layer touches (all workers), from the blocks themselves;
- bytes exchanged per step: the planner's prediction (forward + backward, the largest
  worker), which ``tests/planner/test_sampling_plans.py`` checks against the runtime's
  counters on sampled blocks;
- memory kept for backward (the largest worker), the planner's.

The MFG's blocks are drawn with the real sampler over the partition (every in-edge;
``sarc.cli.block_sample``, P workers as threads); the full batch's statistics are the
partition's. Labeled nodes are a random 5 % and 1 % of the nodes.

    python benchmarks/mfg_savings.py [--nodes 200000 --edges 2000000] [--workers 1,2,4]
        [--model sage|gat] [--labeled 0.05,0.01] [--method metis|random] [--no-cora]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def _labeled_masks(n: int, fractions, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random ``fraction`` of the nodes per mask (the smaller a subset of the larger)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    masks = {}
    for f in fractions:
        m = torch.zeros(n, dtype=torch.bool)
        m[order[:max(1, int(round(f * n)))]] = True
        masks[_mask_name(f)] = m
    return masks


def _mask_name(f: float) -> str:
    return f"labeled_{f:g}".replace(".", "_")


def _layers(model: str, features: int, classes: int):
    from distributed import build

    from sarc.compiler import compile_layer
    net = build(model, features, classes)
    return [(f"{model}{k + 1}", compile_layer(conv, through="optimize").optimized)
            for k, conv in enumerate(net.convs)]


def compare(layers, shards, stats_full, mask: str, labeled: int, exec_mode: str | None) -> list[dict]:
    """Per layer (and a total row), full batch vs MFG on one step of the ``labeled`` nodes."""
    from sarc.cli.block_sample import sample_blocks
    from sarc.planner.plan import plan_model
    from sarc.sampling import SamplingSpec

    p = len(shards)
    full = plan_model(layers, mode="full", workers=p, stats=stats_full, exec_mode=exec_mode)
    sample = sample_blocks(shards, SamplingSpec.mfg(len(layers)), mask=mask,
                           batch_size=-(-labeled // p), batches=1)
    mfg = plan_model(layers, mode="mfg", workers=p, sample=sample, exec_mode=exec_mode)
    rows = []
    for k, (f, m) in enumerate(zip(full.layers, mfg.layers)):
        blocks = sample.batches[0][k]
        rows.append({"layer": f.name, "edges_full": sum(stats_full.edges),
                     "edges_mfg": sum(blocks.edges),
                     "dst_full": sum(stats_full.nodes), "dst_mfg": sum(blocks.dst_nodes),
                     "sent_full": max(f.bytes_sent), "sent_mfg": max(m.bytes_sent),
                     "kept_full": max(f.bytes_kept), "kept_mfg": max(m.bytes_kept),
                     "exec": f"{f.exec_mode}/{m.exec_mode}"})
    total = {"layer": "step"}
    for key in ("edges_full", "edges_mfg", "dst_full", "dst_mfg"):
        total[key] = sum(r[key] for r in rows)
    total["sent_full"] = max(full.total_bytes_sent())
    total["sent_mfg"] = max(mfg.total_bytes_sent())
    total["kept_full"] = max(full.step_bytes_kept())
    total["kept_mfg"] = max(mfg.step_bytes_kept())
    total["exec"] = ""
    return rows + [total]


def _ratio(a: int, b: int) -> str:
    return "-" if b == 0 else f"{a / b:.3f}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def print_table(results) -> None:
    print("| graph | P | labeled | layer | exec full/mfg | edges full | edges mfg | ratio "
          "| bytes/step full (MiB) | mfg | ratio | kept full (MiB) | mfg | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (graph, p, frac), rows in results:
        for r in rows:
            print(f"| {graph} | {p} | {frac:.0%} | {r['layer']} | {r['exec']} | {r['edges_full']} "
                  f"| {r['edges_mfg']} | {_ratio(r['edges_mfg'], r['edges_full'])} "
                  f"| {_mib(r['sent_full'])} | {_mib(r['sent_mfg'])} "
                  f"| {_ratio(r['sent_mfg'], r['sent_full'])} | {_mib(r['kept_full'])} "
                  f"| {_mib(r['kept_mfg'])} | {_ratio(r['kept_mfg'], r['kept_full'])} |")


def run_graph(name: str, src, dst, n: int, features: int, classes: int, args, results) -> None:
    from sarc.partition import partition_graph
    from sarc.planner.stats import ShardStats
    from sarc.runtime.sharded import ShardedGraph

    layers = _layers(args.model, features, classes)
    masks = _labeled_masks(n, args.labeled)
    for p in args.workers:
        with tempfile.TemporaryDirectory(prefix="sarc-mfg-") as tmp:
            pset = partition_graph(src, dst, n, p, Path(tmp) / "parts", method=args.method,
                                   node_data=masks, balance=tuple(masks))
            stats_full = ShardStats.from_partition_set(pset)
            shards = [ShardedGraph.from_partitions(pset, r) for r in range(p)]
        for f in args.labeled:
            mask = _mask_name(f)
            rows = compare(layers, shards, stats_full, mask, int(masks[mask].sum()), args.exec_mode)
            results.append(((name, p, f), rows))
            print(f"{name}: P={p}, {f:.0%} labeled done", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--features", type=int, default=128, help="the synthetic graph's features")
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    ap.add_argument("--labeled", default="0.05,0.01", help="labeled fractions, comma-separated")
    ap.add_argument("--model", choices=("sage", "gat"), default="sage")
    ap.add_argument("--method", choices=("metis", "random"), default="metis")
    ap.add_argument("--exec", dest="exec_mode", choices=("sar", "oneshot"),
                    help="both plans' execution mode (default: each mode's planner choice)")
    ap.add_argument("--no-cora", dest="cora", action="store_false")
    args = ap.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    args.labeled = [float(f) for f in args.labeled.split(",")]

    from sarc.datasets import load_dataset, power_law_graph
    torch.set_num_threads(1)
    results = []
    data = power_law_graph(args.nodes, args.edges, num_classes=args.classes)
    run_graph(f"power-law {args.nodes}/{args.edges}", data.edge_src, data.edge_dst,
              data.num_nodes, args.features, args.classes, args, results)
    if args.cora:
        cora = load_dataset("cora")
        run_graph("cora", cora.edge_src, cora.edge_dst, cora.num_nodes, cora.num_features,
                  cora.num_classes, args, results)
    print(f"{args.model}, {len(_layers(args.model, 8, 2))} layers; one step on every labeled node; "
          f"bytes and kept memory: the largest worker; edges: all workers")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
