"""``sarc train --workers P`` equals one process on graphs whose shape the exactness
cases do not have: parts that share no edge or read from each other one way only (a
worker with nothing to receive from a peer), and datasets that declare more classes or
relations than their data uses (the model's sizes are the dataset's, not the data's)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sarc.loader import load_model_file
from sarc.train import train
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[2]


def _dataset(path: Path, src, dst, n: int, **extra) -> Path:
    rng = np.random.default_rng(0)
    # node i in split i % 3: every clique balanced, so METIS (which balances the splits)
    # parts along the cliques
    masks = {k: np.arange(n) % 3 == i for i, k in enumerate(("train_mask", "val_mask",
                                                             "test_mask"))}
    np.savez(path, edge_src=np.asarray(src, np.int64), edge_dst=np.asarray(dst, np.int64),
             feat=rng.random((n, 6)).astype(np.float32), label=rng.integers(0, 3, n),
             num_nodes=np.int64(n), **masks, **extra)
    return path


def _cliques(k: int, size: int):
    """``k`` disjoint cliques of ``size`` nodes (no self loops)."""
    src, dst = [], []
    for c in range(k):
        for i in range(size):
            for j in range(size):
                if i != j:
                    src.append(c * size + i)
                    dst.append(c * size + j)
    return src, dst


def _one_way(tmp_path):
    src, dst = _cliques(2, 10)
    return _dataset(tmp_path / "one_way.npz", src + [0], dst + [10], 20), "metis"


def _no_edges(tmp_path):
    return _dataset(tmp_path / "no_edges.npz", [], [], 30), "random"


def _five_cliques(tmp_path):
    return _dataset(tmp_path / "cliques.npz", *_cliques(5, 6), 30), "metis"


def _sarc(*argv, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *map(str, argv)], cwd=ROOT,
                              timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _equal_runs(tmp_path, model: str, data: Path, workers: int, method: str, *sets: str):
    """P workers (through ``sarc partition`` + ``sarc train --partition``) and one process
    train the same: every epoch's loss and the final parameters."""
    parts = tmp_path / "parts"
    _sarc("partition", "--dataset", data, "--parts", workers, "--method", method, "--out", parts)
    out, saved = tmp_path / "p.json", tmp_path / "p.pt"
    argv = ["--epochs", "3", "--set", "dropout=0", *(a for s in sets for a in ("--set", s))]
    _sarc("train", ROOT / "models" / model, "--partition", parts, "--workers", workers,
          "--timeout", "30", "--json", out, "--save", saved, *argv)
    many = json.loads(out.read_text())
    hp = {"dropout": 0.0, **{k: json.loads(v) for k, v in (s.split("=") for s in sets)}}
    one = train(load_model_file(ROOT / "models" / model), str(data), epochs=3, hparams=hp,
                log=None)
    import torch
    state = torch.load(saved, weights_only=True)["state_dict"]
    mine = one["module"].state_dict()
    assert set(state) == set(mine)
    for k, v in mine.items():
        assert state[k].shape == v.shape, (k, state[k].shape, v.shape)
        assert torch.allclose(state[k], v, rtol=1e-4, atol=1e-6), k
    assert abs(many["final_loss"] - one["final_loss"]) <= 1e-4 * max(1.0, one["final_loss"])
    return many, one


@pytest.mark.parametrize("make,workers", [(_one_way, 2), (_no_edges, 2), (_five_cliques, 4)],
                         ids=["one-way", "no-edges", "five-cliques-P4"])
def test_parts_that_read_nothing_from_a_peer(tmp_path, make, workers):
    """GCN adds self loops on the workers, which exchange the new out-degrees: a worker
    that reads no row of a peer waited for a message the peer never sends (a hang until
    --timeout)."""
    data, method = make(tmp_path)
    _equal_runs(tmp_path, "gcn.py", data, workers, method)


def test_classes_the_labels_do_not_use(tmp_path):
    """A dataset declaring 5 classes whose labels use 0..2: P workers build the 5-class
    model one process builds (they counted the largest label + 1)."""
    src, dst = _cliques(3, 6)
    data = _dataset(tmp_path / "classes.npz", src, dst, 18, num_classes=np.int64(5))
    many, one = _equal_runs(tmp_path, "sage.py", data, 2, "random")
    assert one["module"].state_dict()["conv2.lin_neigh.weight"].shape[0] == 5


def test_relations_no_edge_has(tmp_path):
    """A relational dataset declaring 4 edge types whose edges use 0..2 (R-GCN): the
    workers build 4 relations' weights, as one process does."""
    src, dst = _cliques(3, 6)
    etype = np.arange(len(src)) % 3
    data = _dataset(tmp_path / "rel.npz", src, dst, 18, etype=etype, num_etypes=np.int64(4))
    _equal_runs(tmp_path, "rgcn.py", data, 3, "random")


def test_recorded_classes_fewer_than_the_labels_are_refused(tmp_path):
    """A set whose metadata records fewer classes than its labels use (an edited or foreign
    metadata.json) is refused on every worker, as such a dataset file is; the workers built
    a model for the labels' count instead."""
    src, dst = _cliques(3, 6)
    data = _dataset(tmp_path / "classes.npz", src, dst, 18)
    parts = tmp_path / "parts"
    _sarc("partition", "--dataset", data, "--parts", 2, "--method", "random", "--out", parts)
    meta_path = parts / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["sizes"]["num_classes"] = 2
    meta_path.write_text(json.dumps(meta))
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", ROOT / "models" /
                               "sage.py", "--partition", parts, "--workers", "2", "--epochs", "1",
                               "--timeout", "30"], cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and "num_classes" in proc.stderr and "2" in proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "epoch" not in proc.stdout, proc.stdout


MASKED_MODEL = '''
import torch
from torch import nn
import sarc


class MaskedAttention(sarc.Layer):
    """Attention that masks every edge into a node whose first feature exceeds 5."""

    def __init__(self, in_feats, out_feats):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)
        self.att = nn.Parameter(torch.ones(out_feats))

    def message(self, src, dst, edge):
        z = self.lin(src.h)
        return {"z": z, "s": (z * self.att).sum(-1).masked_fill(dst.h[:, 0] > 5, float("-inf"))}

    def reduce(self, msg):
        return sarc.sum(msg.z * sarc.edge_softmax(msg.s).unsqueeze(-1))


def build_model(in_feats, num_classes, **_):
    return MaskedAttention(in_feats, num_classes)
'''


def test_a_node_whose_every_edge_is_masked_is_nan_on_workers_as_on_one_process(tmp_path):
    """Node 10's edges come from both parts (its clique's and node 0's), every one scored
    -inf: one process's softmax is NaN there (exp(-inf - -inf), as torch's), and so are the
    gradients of the first step, so training stops at the second epoch; the workers stop
    there too (they merged the row to 0 and trained on)."""
    data = _one_way(tmp_path)[0]
    with np.load(data) as z:
        arrays = dict(z)
    arrays["feat"][10, 0] = 10.0
    np.savez(data, **arrays)
    model = tmp_path / "masked.py"
    model.write_text(MASKED_MODEL)
    argv = ["train", model, "--dataset", data, "--epochs", "2"]
    stops = []
    for extra in ([], ["--workers", "2", "--method", "metis", "--timeout", "30"]):
        proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", *map(str, argv + extra)],
                                  cwd=ROOT, timeout=300)
        assert proc.returncode != 0, proc.stdout[-2000:]
        stop = re.search(r"epoch (\d+): the training loss is nan", proc.stderr)
        assert stop and "scores are all -inf" in proc.stderr, proc.stderr[-3000:]
        stops.append(stop.group(1))
    # node 10 is not a training node: its NaN reaches the loss through the gradients of
    # the first step (0 x NaN), on the workers as on one process
    assert stops == ["2", "2"], stops
