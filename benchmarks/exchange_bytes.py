"""Bytes each layer sends per worker and training step: sarc's exchange vs the SAR-equivalent baseline.

For the 3-layer GraphSAGE and GAT of ``benchmarks/distributed.py`` on a partitioned
graph, the planner's bytes per layer (forward rows, backward re-fetch in sar mode,
row gradients back to their owners), in sarc's plan (the narrowest exchanged values
after pushdown, online softmax) and in the baseline's (the layer's raw input crosses,
a normalizer pass before the softmax), with their ratio; the issue's goal (<= 0.5)
concerns the layers whose input is wider than their output. The distributed tests
check that the exchange layer's counters equal these predictions, and
``benchmarks/distributed.py`` that they do at this size (its "= planner" column).

    python benchmarks/exchange_bytes.py [--partition DIR] [--nodes N --edges E --workers P]
        [--exec sar|oneshot|hybrid]

Without ``--partition`` it builds the power-law graph of ``benchmarks/distributed.py``
(default 500k nodes, 10M edges) and partitions it with METIS.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "models"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def layer_bytes(model: str, stats, features: int, classes: int, exec_mode: str) -> list[dict]:
    from distributed import build

    from sarc.compiler import optimize
    from sarc.planner.plan import plan_layer

    net = build(model, features, classes)
    rows = []
    for k, conv in enumerate(net.convs):
        fn = optimize(conv.trace())
        plans = {b: plan_layer(f"{model}{k + 1}", fn, workers=stats.num_parts, stats=stats,
                               baseline=b, exec_mode=exec_mode, inputs_need_grad=k > 0)
                 for b in (False, True)}
        (_, inp), = [(n, v) for n, v in fn.inputs().items() if n not in ("in_degree", "out_degree")]
        out = fn.values[fn.outputs[0][1]].type
        width_in = _numel(inp.feat)
        width_out = _numel(out.feat)
        rows.append({"layer": f"{model} {k + 1}", "in": width_in, "out": width_out,
                     "exchanged": " + ".join(plans[False].exchange.names),
                     "baseline_exchanged": " + ".join(plans[True].exchange.names),
                     "sarc": max(plans[False].bytes_sent), "baseline": max(plans[True].bytes_sent),
                     "sarc_total": sum(plans[False].bytes_sent),
                     "baseline_total": sum(plans[True].bytes_sent)})
    return rows


def _numel(feat) -> int:
    n = 1
    for d in feat:
        n *= d
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partition", help="a partition set of the graph (sarc partition)")
    ap.add_argument("--nodes", type=int, default=500_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--exec", dest="exec_mode", choices=("sar", "oneshot", "hybrid"), default="sar")
    args = ap.parse_args()

    from sarc.partition import load_partitions, partition_graph
    from sarc.planner.stats import ShardStats

    if args.partition:
        stats = ShardStats.from_partition_set(load_partitions(args.partition, verify=False))
    else:
        from sarc.datasets import power_law_graph
        data = power_law_graph(args.nodes, args.edges, num_features=args.features,
                               num_classes=args.classes)
        with tempfile.TemporaryDirectory(prefix="sarc-bytes-") as tmp:
            pset = partition_graph(data.edge_src, data.edge_dst, data.num_nodes, args.workers,
                                   Path(tmp) / "parts", method="metis")
            stats = ShardStats.from_partition_set(pset)
    print(f"{stats.num_parts} workers, {sum(stats.nodes)} nodes, {sum(stats.edges)} edges, "
          f"{sum(map(sum, stats.boundary))} boundary rows; {args.exec_mode} exchange; bytes per "
          f"training step (forward + backward), max over workers")
    print("| layer | in -> out | sarc exchanges | baseline exchanges | sarc (MiB) "
          "| baseline (MiB) | ratio | input wider |")
    print("|---|---|---|---|---|---|---|---|")
    for model in ("sage", "gat"):
        rows = layer_bytes(model, stats, args.features, args.classes, args.exec_mode)
        for r in rows:
            print(f"| {r['layer']} | {r['in']} -> {r['out']} | {r['exchanged']} | "
                  f"{r['baseline_exchanged']} | {r['sarc'] / 2**20:.1f} | {r['baseline'] / 2**20:.1f} "
                  f"| {r['sarc'] / r['baseline']:.2f} | {'yes' if r['in'] > r['out'] else 'no'} |")
        s, b = sum(r["sarc_total"] for r in rows), sum(r["baseline_total"] for r in rows)
        print(f"| {model}, whole model (all workers) | | | | {s / 2**20:.1f} | {b / 2**20:.1f} "
              f"| {s / b:.2f} | |")


if __name__ == "__main__":
    main()
