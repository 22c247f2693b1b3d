"""``sarc train --mode mfg|sampling`` end to end on Cora: one process, ``--workers 2``
(torchrun started by ``sarc train``) and an external torchrun running ``sarc.cli.worker``.

With dropout off, a run's steps are the same arithmetic whatever the number of workers
(the steps' seeds and samples do not depend on it), so P workers are held to the single
process's losses; an MFG step on every training node is the full-batch step, so MFG
training is held to full-batch training."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sarc.loader import load_model_file
from sarc.train import train
from sarc.training.minibatch import MiniBatchConfig
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[2]
NO_DROPOUT = {"sage": ["--set", "dropout=0"], "gat": ["--set", "dropout=0", "--set", "attn_drop=0"],
              "gcn": ["--set", "dropout=0"]}


def _run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = run_or_show_stacks([sys.executable, *argv], cwd=ROOT, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _sarc_train(model: str, *argv: str, json_path: Path) -> tuple[dict, str]:
    proc = _run(["-m", "sarc.cli", "train", f"models/{model}.py", "--dataset", "cora",
                 *NO_DROPOUT[model], *argv, "--json", str(json_path)])
    return json.loads(json_path.read_text()), proc.stdout


def _one_process(model: str, epochs: int, config: MiniBatchConfig | None,
                 eval_every: int = 1) -> dict:
    hp = {k: float(v) for k, v in (a.split("=") for a in NO_DROPOUT[model][1::2])}
    return train(load_model_file(ROOT / f"models/{model}.py"), "cora", epochs=epochs,
                 hparams=hp, log=None, minibatch=config, eval_every=eval_every)


EPOCH_LINE = re.compile(r"epoch +\d+/\d+ \| loss [\d.]+ \| .* \| (\d+) steps?, \d+ samples/s, "
                        r"sent [\d.]+ MiB \+ [\d.]+ MiB sampling \(worker 0\)")


def test_sampling_on_2_workers_is_the_single_process_run(tmp_path):
    """GAT: self loops added on the workers' shards and on the single process's graph
    sample alike; GraphSAGE runs under an external torchrun below."""
    got, out = _sarc_train("gat", "--workers", "2", "--mode", "sampling", "--fanouts", "10,25",
                           "--batch-size", "64", "--epochs", "3", "--log-every", "1",
                           "--eval-every", "2", json_path=tmp_path / "two.json")
    lines = [m for m in map(EPOCH_LINE.search, out.splitlines()) if m]
    assert len(lines) == 3 and {m.group(1) for m in lines} == {"3"}, out  # 140 seeds / 64
    assert got["mode"] == "sampling" and got["epochs"] == 3
    # evaluated: epochs 2 and 3 (the last); the epoch times count the steps only
    assert [t > 0 for t in got["eval_times_s"]] == [False, True, True]
    assert len(got["epoch_times_s"]) == 3 and got["best_epoch"] in (2, 3)
    want = _one_process("gat", 3, MiniBatchConfig("sampling", (10, 25), batch_size=64),
                        eval_every=2)
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-4 * want["final_loss"]
    assert abs(got["test_acc"] - want["test_acc"]) <= 0.002
    # each report says what ran: the mode and what it sampled with, and on how many workers
    sampled = {"fanouts": [10, 25], "batch_size": 64, "replace": False, "prob": None,
               "shuffle": True, "drop_last": False}
    assert (got["workers"], got["minibatch"]) == (2, sampled)
    assert (want["workers"], want["mode"], want["minibatch"]) == (1, "sampling", sampled)
    for w in got["per_worker"]:  # the last epoch's steps, each planned on its own blocks
        assert w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0, w


def test_mfg_on_2_workers_trains_as_full_batch(tmp_path):
    """One MFG step on every training node per epoch: full-batch training, step for step."""
    got, _ = _sarc_train("gcn", "--workers", "2", "--mode", "mfg", "--epochs", "3",
                         json_path=tmp_path / "mfg.json")
    want = _one_process("gcn", 3, None)
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-4 * want["final_loss"]
    assert abs(got["test_acc"] - want["test_acc"]) <= 0.002
    assert {p["exec_mode"] for p in got["plans"]} == {"oneshot"}  # a mini-batch plan


OUT_OF_ORDER = """
import torch.nn.functional as F
from torch import nn
import sarc

class Mean(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h)

    def reduce(self, msg):
        return sarc.mean(msg.m)

class Net(nn.Module):
    def __init__(self, i, h, c):
        super().__init__()
        self.out = Mean(h, c)  # declared first, called second
        self.inp = Mean(i, h)

    def forward(self, g, x):
        return self.out(g, F.relu(self.inp(g, x)))

def build_model(in_feats, num_classes, hidden=16, **_):
    return Net(in_feats, hidden, num_classes)
"""


def test_a_steps_bytes_are_predicted_from_the_programs_that_ran_on_its_blocks(tmp_path):
    """Layers declared in another order than ``forward`` calls them: the prediction of a
    step's bytes prices the program each block ran (the k-th call's on block k), not the
    k-th layer declared (the report said "-")."""
    model = tmp_path / "out_of_order.py"
    model.write_text(OUT_OF_ORDER)
    out = tmp_path / "run.json"
    _run(["-m", "sarc.cli", "train", str(model), "--dataset", "cora", "--workers", "2",
          "--mode", "mfg", "--batch-size", "64", "--epochs", "1", "--mem-budget", "1M",
          "--json", str(out)])
    for w in json.loads(out.read_text())["per_worker"]:
        assert w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0, w


def test_a_budget_is_shared_in_call_order_whatever_the_declaration_order(tmp_path):
    """The share paired the layers in declaration order with the blocks in call order:
    each block was planned with the other layer's share (or the whole budget), so most
    steps were priced over the budget and ran in sar. The first step's blocks now run
    such a layer in sar, and the next step shares the budget in call order: as many steps
    over the budget as for the model declared in call order, and each step's bytes
    predicted."""
    runs = {}
    for name, text in (("out_of_order", OUT_OF_ORDER), ("in_order", OUT_OF_ORDER.replace(
            "self.out = Mean(h, c)  # declared first, called second\n        self.inp = Mean(i, h)",
            "self.inp = Mean(i, h)\n        self.out = Mean(h, c)"))):
        model = tmp_path / f"{name}.py"
        model.write_text(text)
        out = tmp_path / f"{name}.json"
        _run(["-m", "sarc.cli", "train", str(model), "--dataset", "cora", "--workers", "2",
              "--mode", "mfg", "--batch-size", "20", "--epochs", "2", "--method", "random",
              "--mem-budget", "1500K", "--json", str(out)])
        runs[name] = json.loads(out.read_text())["per_worker"]
    assert "self.inp = Mean(i, h)\n        self.out" in (tmp_path / "in_order.py").read_text()
    for got, want in zip(runs["out_of_order"], runs["in_order"]):
        # the seeded blocks of this run: 8 of 14 steps larger than the first's plan allows
        # (before, every block of the out-of-order model was priced with the whole budget,
        # and no step was found over it)
        assert got["over_budget_steps"] == want["over_budget_steps"] == 8, (got, want)
        assert got["step_bytes_sent"] == got["planned_step_bytes_sent"] > 0, got


def test_an_external_torchrun_runs_sampling_workers(tmp_path):
    parts = tmp_path / "parts"
    _run(["-m", "sarc.cli", "partition", "--dataset", "cora", "--parts", "2", "--out", str(parts)])
    out = tmp_path / "run.json"
    proc = _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "-m", "sarc.cli.worker", "models/sage.py", "--partition", str(parts),
                 "--mode", "sampling", "--fanouts", "10,25", "--batch-size", "64",
                 "--epochs", "2", "--set", "dropout=0", "--json", str(out)])
    got = json.loads(out.read_text())
    assert got["mode"] == "sampling" and got["workers"] == 2 and got["epochs"] == 2
    assert "samples/s" in proc.stdout
    want = _one_process("sage", 2, MiniBatchConfig("sampling", (10, 25), batch_size=64))
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-4 * want["final_loss"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SARC_SLOW_TESTS"),
                    reason="trains 12 Cora runs (minutes); set SARC_SLOW_TESTS=1")
@pytest.mark.parametrize("model,fanouts,batch,epochs", (("sage", "10,25", "32", 30),
                                                        ("gat", "10,10", "64", 100)))
def test_sampling_on_2_workers_reaches_the_single_process_accuracy(tmp_path, model, fanouts,
                                                                   batch, epochs):
    """With dropout on (each worker draws its own masks), the mean test accuracy of 3 seeds
    on 2 workers is within a point of one process's."""
    def mean(accs):
        return sum(accs) / len(accs)
    spec = load_model_file(ROOT / f"models/{model}.py")
    config = MiniBatchConfig("sampling", tuple(map(int, fanouts.split(","))), batch_size=int(batch))
    one = mean([train(spec, "cora", epochs=epochs, seed=s, log=None, minibatch=config)["test_acc"]
                for s in range(3)])
    two = []
    for s in range(3):
        path = tmp_path / f"{s}.json"
        _run(["-m", "sarc.cli", "train", f"models/{model}.py", "--dataset", "cora", "--workers",
              "2", "--mode", "sampling", "--fanouts", fanouts, "--batch-size", batch, "--epochs",
              str(epochs), "--seed", str(s), "--json", str(path)])
        two.append(json.loads(path.read_text())["test_acc"])
    assert abs(mean(two) - one) <= 0.01, (two, one)


def test_sampling_by_the_datasets_edge_data_on_one_process_and_2_workers(tmp_path):
    """``--prob etype`` weighs the draws by edge data the model does not read (GraphSAGE on
    AIFB's relation ids): one process samples from the dataset's edge data as the workers'
    shards do (it refused: the graph had no edge data), and the two runs are equal."""
    hp = {"embedding_dim": 8, "dropout": 0.0}
    config = MiniBatchConfig("sampling", (3, 3), batch_size=40, prob="etype")
    want = train(load_model_file(ROOT / "models/sage.py"), "aifb", epochs=2, hparams=hp,
                 log=None, minibatch=config)
    path = tmp_path / "two.json"
    _run(["-m", "sarc.cli", "train", "models/sage.py", "--dataset", "aifb", "--set",
          "embedding_dim=8", "--set", "dropout=0", "--mode", "sampling", "--fanouts", "3,3",
          "--batch-size", "40", "--prob", "etype", "--epochs", "2", "--workers", "2",
          "--json", str(path)])
    got = json.loads(path.read_text())
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-5 * want["final_loss"]
    assert got["test_acc"] == pytest.approx(want["test_acc"], abs=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_sampling_weighed_by_edge_data_a_self_loop_model_does_not_read(tmp_path, dtype):
    """GCN adds self loops and reads no edge data: ``--prob edge_weight`` on 2 workers failed
    ("no edge data 'edge_weight' ... the graph has: none": the workers' self loops kept only the
    edge data the model reads), and an integer weight was refused as "read by the model".
    The loops weigh ``SELF_LOOP_FILL`` on workers and on one process alike: equal runs."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["edge_weight"] = np.random.default_rng(0).integers(
        1, 5, data["edge_src"].shape[0]).astype(dtype)
    np.savez(tmp_path / "weighted.npz", **data)
    config = MiniBatchConfig("sampling", (3, 3), batch_size=70, prob="edge_weight")
    want = train(load_model_file(ROOT / "models/gcn.py"), str(tmp_path / "weighted.npz"),
                 epochs=2, hparams={"dropout": 0.0}, log=None, minibatch=config)
    path = tmp_path / "two.json"
    _run(["-m", "sarc.cli", "train", "models/gcn.py", "--dataset", str(tmp_path / "weighted.npz"),
          *NO_DROPOUT["gcn"], "--mode", "sampling", "--fanouts", "3,3", "--batch-size", "70",
          "--prob", "edge_weight", "--epochs", "2", "--workers", "2", "--json", str(path)])
    got = json.loads(path.read_text())
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-5 * want["final_loss"]
    assert got["test_acc"] == pytest.approx(want["test_acc"], abs=1e-6)


def test_sampling_by_edge_data_the_dataset_lacks_names_the_datasets_edge_data(tmp_path):
    """The one-process error listed the sampled graph's edge data ("none": it keeps only
    what the model reads), not the dataset's."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["edge_weight"] = np.ones(data["edge_src"].shape[0], np.float32)
    np.savez(tmp_path / "weighted.npz", **data)
    config = MiniBatchConfig("sampling", (3, 3), batch_size=70, prob="edge_wieght")
    with pytest.raises(ValueError,
                       match=r"no edge data 'edge_wieght'.*the dataset has: edge_weight;"):
        train(load_model_file(ROOT / "models/gcn.py"), str(tmp_path / "weighted.npz"),
              epochs=1, log=None, minibatch=config)


def test_sampling_by_an_array_not_named_as_edge_data_says_how_edge_data_are_named(tmp_path):
    """A file's array ``weight`` is not edge data (``edge_*`` arrays are): the error said
    only that the dataset had none."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["weight"] = np.ones(data["edge_src"].shape[0], np.float32)
    np.savez(tmp_path / "weighted.npz", **data)
    config = MiniBatchConfig("sampling", (3, 3), batch_size=70, prob="weight")
    with pytest.raises(ValueError, match=r"no edge data 'weight'.*the dataset has: none; a "
                                         r"dataset file's edge data are its numeric arrays "
                                         r"named edge_\*, such as edge_weight"):
        train(load_model_file(ROOT / "models/gcn.py"), str(tmp_path / "weighted.npz"),
              epochs=1, log=None, minibatch=config)


SOURCE_ONLY = """\
import torch
from torch import nn
import sarc


class L(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin, self.gate, self.root = nn.Linear(i, o), nn.Linear(i, 1), nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h) * torch.sigmoid(self.gate(src.h + dst.h))

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + self.root(dst.h)


class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.a, self.b = L(i, 8), L(8, c)

    def forward(self, g, x):
        return self.b(g, torch.relu(self.a(g, x)))


HPARAMS = {"self_loops": False, "norm_features": False, "lr": 0.05, "weight_decay": 0.0}


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
"""


def test_a_step_whose_seeds_have_no_in_edges_is_the_single_process_step(tmp_path):
    """Batches of one seed, the first a node without in-edges: its step's blocks have no
    edges, and the other worker has no seed. The edge part's parameters had no gradient
    on the workers (no piece ran) where one process gives them zeros, so Adam's moments
    moved them on one process only."""
    import numpy as np
    rng = np.random.default_rng(0)
    n = 40
    src, dst = rng.integers(0, n, 160), rng.integers(1, n, 160)   # node 0: no in-edges
    train_mask = np.zeros(n, bool)
    train_mask[[0, 5]] = True   # node 5: seven in-edges
    np.savez(tmp_path / "g.npz", edge_src=src, edge_dst=dst, num_nodes=np.int64(n),
             feat=rng.random((n, 5), np.float32), label=rng.integers(0, 3, n),
             train_mask=train_mask, val_mask=~train_mask, test_mask=~train_mask,
             num_classes=np.int64(3))
    (tmp_path / "m.py").write_text(SOURCE_ONLY)
    losses = []
    for workers in ((), ("--workers", "2", "--method", "random")):
        out = tmp_path / f"p{len(losses)}.json"
        _run(["-m", "sarc.cli", "train", str(tmp_path / "m.py"), "--dataset",
              str(tmp_path / "g.npz"), "--mode", "mfg", "--batch-size", "1", "--no-shuffle",
              "--epochs", "3", *workers, "--json", str(out)])
        losses.append(json.loads(out.read_text())["final_loss"])
    assert abs(losses[0] - losses[1]) <= 1e-6 * abs(losses[0]), losses
