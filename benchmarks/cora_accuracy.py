"""Cora test accuracy of the zoo's GCN and GAT over several seeds, against the papers.

    python benchmarks/cora_accuracy.py [--seeds 5] [--models gcn,gat] [--threads 1]

Each run is ``sarc.train.train`` with the model file's published ``HPARAMS``
(public Planetoid split; test accuracy at the epoch of best validation
accuracy). Prints one row per model: mean +- sample std over the seeds, the
per-seed accuracies, mean epochs and time per run.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from sarc.loader import load_model_file
from sarc.train import train

MODELS = Path(__file__).resolve().parent.parent / "models"
PUBLISHED = {"gcn": "81.5 (Kipf & Welling 2017)", "gat": "83.0 +- 0.7 (Velickovic et al. 2018)"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--models", default="gcn,gat")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: steadiest on a shared 2-core machine)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        spec = load_model_file(MODELS / f"{name}.py")
        runs = []
        for seed in range(args.seeds):
            t = time.perf_counter()
            r = train(spec, "cora", seed=seed, log=None)
            r["wall_s"] = time.perf_counter() - t
            runs.append(r)
            print(f"{name} seed {seed}: test {r['test_acc']:.4f} (val {r['val_acc']:.4f}, "
                  f"epoch {r['best_epoch']} of {r['epochs']}, {r['wall_s']:.1f} s)", flush=True)
        accs = [100 * r["test_acc"] for r in runs]
        std = statistics.stdev(accs) if len(accs) > 1 else 0.0
        rows.append((name, f"{statistics.mean(accs):.1f} +- {std:.1f}",
                     " ".join(f"{a:.1f}" for a in accs), PUBLISHED.get(name, "-"),
                     f"{statistics.mean(r['epochs'] for r in runs):.0f}",
                     f"{statistics.mean(r['wall_s'] for r in runs):.1f}"))
    header = ("model", "test acc % (mean +- std)", "per seed", "published", "epochs", "s / run")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nCora, public split, {args.seeds} seeds (0..{args.seeds - 1}), "
          f"{torch.get_num_threads()} torch thread(s), torch {torch.__version__}")


if __name__ == "__main__":
    main()
