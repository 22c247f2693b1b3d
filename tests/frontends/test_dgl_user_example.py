"""README's "For DGL users": the script it shows is examples/dgl_user.py, and the script equals
the plain DGL script (its lines commented ``sarc`` removed) epoch for epoch (.venv-dgl)."""
from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

pytest.importorskip("dgl")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "dgl_user.py"
EPOCHS = 10


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## For DGL users", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_shows_the_tested_script():
    assert _readme_block() == SCRIPT.read_text()


def test_three_lines_make_the_dgl_script_a_sarc_one():
    source = SCRIPT.read_text()
    marked = [line for line in source.splitlines() if line.rstrip().endswith("# sarc")]
    assert len(marked) == 3
    plain = "\n".join(line for line in source.splitlines() if line not in marked)
    assert "sarc." not in plain.replace("from sarc.datasets import load_dataset", "")

    namespace = {"__name__": "dgl_user_plain"}
    exec(compile(plain, "dgl_user_plain.py", "exec"), namespace)
    want_losses, want_acc = namespace["main"](EPOCHS)
    got_losses, got_acc = runpy.run_path(str(SCRIPT), run_name="dgl_user")["main"](EPOCHS)
    assert got_losses == pytest.approx(want_losses, rel=1e-5)
    assert got_acc == pytest.approx(want_acc, abs=1e-3)


def _sarc_train(*argv):
    import os
    import subprocess
    import sys

    from timeouts import run_or_show_stacks
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", "examples/dgl_gcn.py",
                               "--epochs", "3", *argv], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("selected epoch")][0]


def test_sarc_trains_a_model_file_of_dgl_layers_on_one_and_two_workers():
    one = _sarc_train()
    two = _sarc_train("--workers", "2", "--method", "random", "--timeout", "60")
    accuracies = re.compile(r"val [0-9.]+ test [0-9.]+")
    assert accuracies.search(one).group() == accuracies.search(two).group()


def _sarc(command, model, *argv):
    import os
    import subprocess
    import sys

    from timeouts import run_or_show_stacks
    path = model if os.path.isabs(model) else f"examples/{model}"
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", command, path,
                               *argv], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_model_file_of_patched_dgl_convs_compiles_and_trains_as_wrapped_ones(tmp_path):
    """examples/dgl_patched.py calls DGL's GraphConv after patch(): its layers are made at the
    convs' first call, not modules of the model. compile finds them (named after their
    convs) and plans what examples/dgl_gcn.py's from_dgl_module layers plan; a sampling step
    gives each conv a block (two fanouts), on one process and two workers, to the same
    accuracies as the wrapped model."""
    table = re.compile(r"^(layer .*|conv\d .*)$", re.M)
    plans = [table.findall(_sarc("compile", model, "--mode", "mfg", "--out",
                                 str(tmp_path / model)))
             for model in ("dgl_patched.py", "dgl_gcn.py")]
    rows = [p.split()[0] for p in plans[0] if p.startswith("conv")]
    assert plans[0] == plans[1] and rows == ["conv1", "conv2"], plans
    selected = re.compile(r"selected epoch .*val [0-9.]+ test [0-9.]+")
    sampling = ("train", "--epochs", "2", "--mode", "sampling", "--fanouts", "4,4")
    wrapped = selected.search(_sarc(*sampling[:1], "dgl_gcn.py", *sampling[1:])).group()
    for workers in (["--workers", "1"], ["--workers", "2", "--method", "random"]):
        out = _sarc(*sampling[:1], "dgl_patched.py", *sampling[1:], *workers, "--timeout", "60")
        assert selected.search(out).group() == wrapped


def test_a_patched_model_trains_under_a_memory_budget_on_workers_as_a_wrapped_one(tmp_path):
    """--mem-budget on workers: a patched model's layers, made at the convs' first call, are
    not there when the step's budget is shared (its workers crashed on an empty list of
    layers); each keeps what the budget has left when it is planned. It trains as the
    wrapped model does, and sends what the planner said."""
    import json
    runs = []
    for model in ("dgl_patched.py", "dgl_gcn.py"):
        out = tmp_path / f"{model}.json"
        _sarc("train", model, "--epochs", "2", "--workers", "2", "--method", "random",
              "--mem-budget", "20K", "--timeout", "60", "--json", str(out))
        runs.append(json.loads(out.read_text()))
    patched, wrapped = runs
    assert patched["final_loss"] == wrapped["final_loss"]
    for w in patched["per_worker"]:
        assert w["step_bytes_sent"] == w["planned_step_bytes_sent"] > 0, w


WEIGHTED_PATCHED = """\
import torch.nn.functional as F
from dgl.nn.pytorch import GraphConv
from torch import nn

import sarc.frontends.dgl

sarc.frontends.dgl.patch()
HPARAMS = {"self_loops": True}


class GCN(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.conv1, self.conv2 = GraphConv(i, 8), GraphConv(8, c)

    def forward(self, g, x, edge_weight=None):
        return self.conv2(g, F.relu(self.conv1(g, x, edge_weight=edge_weight)),
                          edge_weight=edge_weight)


def build_model(in_feats, num_classes, **_):
    return GCN(in_feats, num_classes)
"""

WEIGHTED_WRAPPED = WEIGHTED_PATCHED.replace(
    "sarc.frontends.dgl.patch()", "from sarc.frontends.dgl import from_dgl_module").replace(
    "self.conv1, self.conv2 = GraphConv(i, 8), GraphConv(8, c)",
    "self.conv1 = from_dgl_module(GraphConv(i, 8), node={'feat': i}, "
    "edge={'edge_weight': ()})\n        self.conv2 = from_dgl_module(GraphConv(8, c), "
    "node={'feat': 8}, edge={'edge_weight': ()})")


def test_patched_convs_are_given_the_datasets_edge_weights(tmp_path):
    """A patch() model whose forward takes edge_weight gets the dataset's (it trained
    unweighted: its convs declare their features only at their first call), as the
    from_dgl_module model does."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["edge_weight"] = np.random.default_rng(0).uniform(
        0.5, 1.5, data["edge_src"].shape[0]).astype(np.float32)
    np.savez(tmp_path / "weighted.npz", **data)
    losses = []
    for name, text in (("patched.py", WEIGHTED_PATCHED), ("wrapped.py", WEIGHTED_WRAPPED)):
        (tmp_path / name).write_text(text)
        out = _sarc("train", str(tmp_path / name), "--dataset",
                    str(tmp_path / "weighted.npz"), "--epochs", "2")
        losses.append(re.findall(r"loss [0-9.]+", out))
    assert losses[0] == losses[1] and len(losses[0]) == 2, losses


def test_a_patched_conv_reading_source_in_degrees_trains_in_mfg_mode_as_full_batch(tmp_path):
    """SGConv scales source features by g.in_degrees(): the whole graph's in every mode (a
    step's blocks carry their sources' in-degrees), so its MFG training on every training
    node is its full-batch training, loss for loss; compile plans it."""
    model = tmp_path / "sg.py"
    model.write_text(WEIGHTED_PATCHED.replace("GraphConv(8, c)", "SGConv(8, c, k=1)")
                     .replace("from dgl.nn.pytorch import GraphConv",
                              "from dgl.nn.pytorch import GraphConv, SGConv")
                     .replace(", edge_weight=edge_weight)\n", ")\n")
                     .replace('HPARAMS = {"self_loops": True}',
                              'HPARAMS = {"self_loops": True, "weight_decay": 0.0}'))
    assert "wrote" in _sarc("compile", str(model), "--mode", "mfg", "--out", str(tmp_path / "out"))
    losses = [re.findall(r"loss ([0-9.]+)", _sarc("train", str(model), "--epochs", "2", *mode))
              for mode in ([], ["--mode", "mfg"])]
    assert len(losses[0]) == 2 and losses[0] == losses[1], losses


def test_a_patched_conv_called_twice_in_a_minibatch_step_is_refused_as_a_layer_is(tmp_path):
    """The second call read a block not its own and said it could not tell node features
    from edge features."""
    import os
    import subprocess
    import sys

    from timeouts import run_or_show_stacks
    model = tmp_path / "twice.py"
    model.write_text(WEIGHTED_PATCHED.replace(
        "self.conv1, self.conv2 = GraphConv(i, 8), GraphConv(8, c)",
        "self.conv1, self.conv2 = GraphConv(i, i), nn.Linear(i, c)").replace(
        "return self.conv2(g, F.relu(self.conv1(g, x, edge_weight=edge_weight)),\n"
        "                          edge_weight=edge_weight)",
        "return self.conv2(self.conv1(g, F.relu(self.conv1(g, x))))"))
    proc = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "train", str(model), "--mode",
                               "mfg", "--epochs", "1"], cwd=ROOT, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "twice.py" in proc.stderr and "the forward calls the sarc layer conv1 again: in " \
        "mfg and sampling modes a step has a block per sarc layer" in proc.stderr, proc.stderr
