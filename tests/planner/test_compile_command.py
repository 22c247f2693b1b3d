"""``sarc compile``: every model file, every mode; artifacts written whole; clear errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from sarc.cli import main
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parent.parent.parent
MODEL_FILES = sorted((ROOT / "models").glob("*.py"))


@pytest.mark.parametrize("model", MODEL_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("mode", ["full", "mfg", "sampling"])
def test_compile_every_model_every_mode(model, mode, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["compile", str(model), "--mode", mode, "--workers", "4", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "ops traced" in text and f"mode={mode}" in text
    names = {p.name for p in out.iterdir()}
    assert {"plan.txt", "plan.json", "schedule.txt"} <= names
    irs = [n for n in names if n.endswith(".ir") and not n.endswith(".traced.ir")]
    kernels = [n for n in names if n.endswith(".torch.py")]
    assert irs and len(irs) == len(kernels)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mode"] == mode and plan["workers"] == 4 and len(plan["layers"]) == len(irs)
    for k in kernels:  # the emitted kernel is importable Python
        compile((out / k).read_text(), k, "exec")


def test_compile_with_a_real_partition(tmp_path, capsys):
    parts = tmp_path / "parts"
    assert main(["partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                 "--out", str(parts)]) == 0
    out = tmp_path / "out"
    assert main(["compile", str(ROOT / "models" / "gcn.py"), "--partition", str(parts),
                 "--emit", "plan", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["workers"] == 2 and plan["stats"]["num_parts"] == 2
    sent = plan["layers"][0]["bytes_sent_per_worker"]
    assert len(sent) == 2 and all(s > 0 for s in sent)
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "plan.txt", "sarc-set.json"]


def test_compile_with_a_partition_of_a_dataset_file(tmp_path, capsys):
    """A set partitioned from an .npz file records the dataset's name; ``sarc compile
    --partition`` loads the model's dataset file of that name (checked to be the graph
    partitioned there), without ``--dataset``."""
    import numpy as np

    from sarc.datasets import load_dataset
    ds = load_dataset("cora")
    data = tmp_path / "mygraph.npz"
    np.savez(data, edge_src=ds.edge_src.numpy(), edge_dst=ds.edge_dst.numpy(),
             feat=ds.feat.numpy(), label=ds.label.numpy(), train_mask=ds.train_mask.numpy(),
             val_mask=ds.val_mask.numpy(), test_mask=ds.test_mask.numpy())
    parts = tmp_path / "parts"
    assert main(["partition", "--dataset", str(data), "--parts", "2", "--method", "random",
                 "--out", str(parts)]) == 0
    out = tmp_path / "out"
    assert main(["compile", str(ROOT / "models" / "gcn.py"), "--partition", str(parts),
                 "--set", f"dataset={data}", "--emit", "plan", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "plan.json").read_text())["workers"] == 2


def test_compile_replaces_the_output_directory_whole(tmp_path):
    gcn = str(ROOT / "models" / "gcn.py")
    out = tmp_path / "out"
    assert main(["compile", gcn, "--emit", "ir", "--out", str(out)]) == 0
    assert (out / "conv1.ir").exists()
    assert main(["compile", gcn, "--emit", "plan", "--out", str(out), "--overwrite"]) == 0
    assert not (out / "conv1.ir").exists()  # the earlier set went as a whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    mine = tmp_path / "mine"  # a folder sarc did not write is never replaced
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["compile", gcn, "--emit", "ir", "--out", str(mine), "--overwrite"]) == 2
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_compile_errors_are_clear(tmp_path, capsys):
    gcn = str(ROOT / "models" / "gcn.py")
    assert main(["compile", gcn, "--emit", "ir,bogus", "--out", str(tmp_path / "o")]) == 2
    assert "unknown artifact bogus" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main(["compile", gcn, "--mem-budget", "lots"]) == 2
    assert "--mem-budget" in capsys.readouterr().err
    assert main(["compile", gcn, "--emit", "ir"]) == 0   # it wrote nothing and said nothing
    assert "--emit ir: nothing is written without --out" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("import sarc\nimport torch\n\nclass L(sarc.Layer):\n"
                   "    def __init__(self):\n        super().__init__(node={'h': 4}); self.w = torch.nn.Linear(4, 4)\n\n"
                   "    def message(self, src, dst, edge):\n        return src.hh\n\n"
                   "    def reduce(self, msg):\n        return sarc.sum(msg.m)\n\n\n"
                   "def build_model(in_feats, num_classes, **_):\n    return L()\n")
    assert main(["compile", str(bad), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:9" in err and "no node feature 'hh'" in err
    assert not (tmp_path / "o2").exists()


def test_compile_builds_the_model_with_set_hyperparameters(tmp_path, capsys):
    """``--set`` as sarc train takes it: the hidden width reaches the plan, a featureless
    graph compiles with an embedding, and a wrong value is the trainer's error."""
    gcn = str(ROOT / "models" / "gcn.py")
    assert main(["compile", gcn, "--set", "hidden=40", "--emit", "plan"]) == 0
    assert "40 x 4 B/row" in capsys.readouterr().out
    pubmed = str(ROOT.parent / "shared" / "datasets" / "pubmed_nofeat.npz")
    if Path(pubmed).exists():
        assert main(["compile", gcn, "--dataset", pubmed]) == 2
        assert "--set embedding_dim=64" in capsys.readouterr().err
        assert main(["compile", gcn, "--dataset", pubmed, "--set", "embedding_dim=8"]) == 0
        capsys.readouterr()
    assert main(["compile", gcn, "--set", "hidden=abc"]) == 2
    assert "hidden takes an int" in capsys.readouterr().err


def test_a_one_worker_plan_sends_nothing(tmp_path, capsys):
    """One worker exchanges nothing: its plan names what P workers would send, without
    the gradients sent back or a second fetch it would claim."""
    gcn = str(ROOT / "models" / "gcn.py")
    assert main(["compile", gcn, "--emit", "plan", "--out", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert "exchanged on P > 1 workers: %8:mul[16] = 16 x 4 B/row (one worker: nothing sent)" \
        in out, out
    assert "gradients sent back" not in out and "fetched twice" not in out
    assert main(["compile", gcn, "--emit", "plan", "--workers", "2",
                 "--out", str(tmp_path / "two")]) == 0
    assert "exchanged: %8:mul[16] = 16 x 4 B/row, gradients sent back" in capsys.readouterr().out


def test_compile_cli_subprocess(tmp_path):
    r = run_or_show_stacks([sys.executable, "-m", "sarc.cli", "compile",
                            str(ROOT / "models" / "gat.py"), "--mode", "mfg", "--emit", "plan"],
                           timeout=120)
    assert r.returncode == 0, r.stderr
    assert "softmax_aggregate" in r.stdout or "aggregate" in r.stdout


def _triton_missing() -> str | None:
    from sarc.backends.triton_backend import TritonUnavailable, check_triton
    try:
        check_triton()
    except TritonUnavailable as e:
        return str(e)
    return None


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    _triton_missing() is not None, reason=_triton_missing() or ""))])
@pytest.mark.parametrize("model", MODEL_FILES, ids=lambda p: p.stem)
def test_printed_ir_and_plan_are_what_runs(model, backend):
    """The IR ``sarc compile`` prints and plans is the kernel's own (the pipeline and the
    backend's passes), not a second optimization of the traced layer."""
    from sarc.artifacts import compile_model, find_layers
    from sarc.compiler import compile_function
    from sarc.datasets import load_dataset
    from sarc.ir.printer import format_function
    from sarc.loader import load_model_file
    from sarc.train import DEFAULTS, build

    spec = load_model_file(str(model))
    hp = {**DEFAULTS, **spec.hparams}
    net = build(spec, load_dataset(hp["dataset"]), hp)
    art = compile_model(net, spec.name, backend=backend)
    seen = set()   # a layer traced as one already checked (hetero_sage's 180 relations)
    for compiled, (name, layer) in zip(art.layers, find_layers(net), strict=True):
        traced = layer.trace()
        text = format_function(traced)
        if text in seen:
            continue
        seen.add(text)
        runs = compile_function(traced, backend=backend).function
        assert format_function(compiled.optimized) == format_function(runs), name


def test_rgcn_plan_keeps_what_the_torch_kernel_keeps():
    """RGCN's typed product is fused into the aggregate by the torch backend's pass; the
    plan of that IR keeps 12 bytes per edge (the edge weight and the product's int64
    column), not the per-edge messages."""
    from sarc.artifacts import compile_model
    from sarc.loader import load_model_file
    from sarc.train import DEFAULTS, build
    from sarc.datasets import load_dataset

    spec = load_model_file(str(ROOT / "models" / "rgcn.py"))
    hp = {**DEFAULTS, **spec.hparams}
    net = build(spec, load_dataset(hp["dataset"]), hp)
    plan = compile_model(net, spec.name, backend="torch").plan
    assert [str(lp.saved["edge"]) for lp in plan.layers] == ["12*E", "12*E"]


def test_compile_layer_returns_every_stage():
    """``compile_layer`` runs ``STAGES`` in order and keeps each stage's result; the kernel
    runs the IR it reports, and the backward IR exists only with autodiff="ir"."""
    from sarc.compiler import STAGES, compile_layer
    from sarc.ir.printer import format_function
    from gat import GATLayer

    layer = GATLayer(6, 3, heads=2)
    assert [name for name, _ in STAGES] == ["trace", "verify", "grad", "optimize", "plan",
                                          "distribute", "lower"]
    c = compile_layer(layer.trace())
    assert c.backward is None and c.kernel.function is c.optimized
    assert len(c.optimized.values) < len(c.traced.values)  # the passes ran
    d = compile_layer(layer.trace(), autodiff="ir")
    assert d.backward is not None and d.kernel.backward.function is d.backward
    assert format_function(d.optimized) == format_function(c.optimized)
