"""Test accuracy of neighbour-sampling training on P workers against one process.

    python benchmarks/sampling_accuracy.py [--datasets cora,citeseer] [--models sage,gat]
        [--seeds 3] [--workers 2] [--data-dir DIR]

Per (dataset, model): the mean test accuracy over the seeds of ``sarc train MODEL
--mode sampling`` on one process (``sarc.train.train``) and on ``--workers`` workers
(``sarc train --workers P``, torchrun), dropout on (each worker draws its own masks),
and their difference against the goal of one point. CiteSeer is read from ``--data-dir``
(or ``$SARC_DATA_DIR``); a dataset that is not there gets a row saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# fanouts, batch size and epochs per model: GAT's attention needs more epochs to settle
RUNS = {"sage": ("10,25", 32, 30), "gat": ("10,10", 64, 100)}


def one_process(model: str, dataset: str, seed: int, data_dir: str | None) -> float:
    from sarc.loader import load_model_file
    from sarc.train import train
    from sarc.training.minibatch import MiniBatchConfig
    fanouts, batch, epochs = RUNS[model]
    config = MiniBatchConfig("sampling", tuple(map(int, fanouts.split(","))), batch_size=batch)
    r = train(load_model_file(ROOT / "models" / f"{model}.py"), dataset, epochs=epochs,
              seed=seed, log=None, minibatch=config, data_root=data_dir)
    return r["test_acc"]


def workers(model: str, dataset: str, seed: int, p: int, data_dir: str | None, tmp: Path) -> float:
    fanouts, batch, epochs = RUNS[model]
    out = tmp / f"{dataset}-{model}-{seed}.json"
    cmd = [sys.executable, "-m", "sarc.cli", "train", f"models/{model}.py", "--dataset", dataset,
           "--workers", str(p), "--mode", "sampling", "--fanouts", fanouts, "--batch-size",
           str(batch), "--epochs", str(epochs), "--seed", str(seed), "--json", str(out),
           "--log-every", str(epochs)]
    if data_dir:
        cmd += ["--data-dir", data_dir]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text())["test_acc"]


def available(dataset: str, data_dir: str | None) -> bool:
    from sarc.datasets import load_dataset
    try:
        load_dataset(dataset, root=data_dir)
    except Exception:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="cora,citeseer")
    ap.add_argument("--models", default="sage,gat")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data-dir", default=os.environ.get("SARC_DATA_DIR"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sarc-sampling-acc-") as tmp:
        for dataset in args.datasets.split(","):
            if not available(dataset, args.data_dir):
                rows.append((dataset, "-", "-", "-", "-", "not found (--data-dir)"))
                continue
            for model in args.models.split(","):
                t0 = time.perf_counter()
                one = [one_process(model, dataset, s, args.data_dir) for s in range(args.seeds)]
                many = [workers(model, dataset, s, args.workers, args.data_dir, Path(tmp))
                        for s in range(args.seeds)]
                diff = 100 * (statistics.mean(many) - statistics.mean(one))
                fanouts, batch, epochs = RUNS[model]
                rows.append((dataset, model, f"{100 * statistics.mean(one):.1f}",
                             f"{100 * statistics.mean(many):.1f}", f"{diff:+.1f}",
                             f"{'met' if abs(diff) <= 1.0 else 'not met'} "
                             f"(fanouts {fanouts}, batch {batch}, {epochs} epochs, "
                             f"{time.perf_counter() - t0:.0f} s)"))
                print(f"{dataset} {model}: one process {one}, {args.workers} workers {many}",
                      flush=True)
    header = ("dataset", "model", "1 process %", f"{args.workers} workers %", "difference",
              "within 1 point")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\nmean test accuracy over seeds 0..{args.seeds - 1}, --mode sampling, dropout on")


if __name__ == "__main__":
    main()
