"""``sarc train`` and the model-file loader: running, refusing, reporting user errors."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sarc.cli import main, parse_overrides
from sarc.loader import ModelFileError, load_model_file
from model_files import MEAN
from timeouts import run_or_show_stacks

ROOT = Path(__file__).resolve().parents[2]
GCN = ROOT / "models" / "gcn.py"

BAD_LAYER = '''\
import sarc
from torch import nn

class Broken(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)
    def message(self, src, dst, edge):
        return src.x

    def reduce(self, msg):
        return sarc.sum(msg.m)


def build_model(in_feats, num_classes, **_):
    return Broken(in_feats, num_classes)
'''


def sarc_command() -> list[str]:
    script = Path(sys.executable).with_name("sarc")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sarc.cli"]


def run_sarc(*args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_or_show_stacks([*sarc_command(), *map(str, args)], timeout=timeout, env=env,
                              cwd=ROOT)


def test_sarc_train_subprocess(tmp_path):
    out = tmp_path / "result.json"
    proc = run_sarc("train", GCN, "--dataset", "cora", "--epochs", "3", "--seed", "1",
                    "--json", out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("sarc train: gcn on cora")
    assert [line.split("|")[0].split() for line in lines if line.startswith("epoch")] == [
        ["epoch", "1"], ["epoch", "2"], ["epoch", "3"]]
    assert lines[-1].startswith("selected epoch")
    result = json.loads(out.read_text())
    assert (result["model"], result["dataset"], result["epochs"], result["seed"]) == (
        "gcn", "cora", 3, 1)


def test_json_and_saved_model_record_the_dataset_trained_on(tmp_path):
    """gcn.py's HPARAMS name Cora; trained on AIFB, the report and the saved model say AIFB."""
    from sarc.checkpoint import read_saved
    out, saved = tmp_path / "r.json", tmp_path / "m.pt"
    assert main(["train", str(GCN), "--dataset", "aifb", "--set", "embedding_dim=4",
                 "--epochs", "1", "--quiet", "--json", str(out), "--save", str(saved)]) == 0
    result = json.loads(out.read_text())
    assert result["dataset"] == result["hparams"]["dataset"] == "aifb"
    s = read_saved(saved)
    assert s["dataset"] == s["hparams"]["dataset"] == "aifb"


def test_dsl_error_prints_file_and_line_without_traceback(tmp_path):
    model = tmp_path / "broken.py"
    model.write_text(BAD_LAYER)
    proc = run_sarc("train", model, "--epochs", "1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{model}:9" in proc.stderr and "no node feature 'x'" in proc.stderr
    assert "return src.x" in proc.stderr


def test_distributed_options_need_workers(capsys):
    # --workers P > 1 runs distributed training (tests/distributed/test_cli.py); its options
    # are refused on one process rather than ignored
    assert main(["train", str(GCN), "--exec", "oneshot"]) == 2
    assert "--exec: distributed options; they need --workers > 1" in capsys.readouterr().err
    assert main(["train", str(GCN), "--workers", "2", "--quiet"]) == 2
    assert "--quiet is not supported with --workers > 1" in capsys.readouterr().err


def test_options_a_run_would_not_use_are_refused(tmp_path, capsys):
    """--checkpoint-every without --checkpoint, and --method where nothing is partitioned
    (one process) or the --partition set is partitioned already: refused, not ignored."""
    assert main(["train", str(GCN), "--checkpoint-every", "3"]) == 2
    assert "--checkpoint-every needs --checkpoint DIR" in capsys.readouterr().err
    assert main(["train", str(GCN), "--method", "random"]) == 2
    assert "--method: distributed options; they need --workers > 1" in capsys.readouterr().err
    assert main(["train", str(GCN), "--workers", "2", "--partition", str(tmp_path),
                 "--method", "random"]) == 2
    assert "--method random: the --partition set is partitioned already" in \
        capsys.readouterr().err


def test_file_without_build_model(tmp_path, capsys):
    model = tmp_path / "layers_only.py"
    model.write_text("import sarc\n\n\nclass L(sarc.Layer):\n    def message(self, s, d, e):\n"
                     "        return s.h\n")
    with pytest.raises(ModelFileError, match=r"layers_only.py: no build_model function "
                                             r"\(it defines layer L\)"):
        load_model_file(model)
    assert main(["train", str(model)]) == 2
    err = capsys.readouterr().err
    assert "no build_model" in err and "build_model(in_feats, num_classes, **hparams)" in err


def test_import_errors_in_model_files_name_the_line(tmp_path, capsys):
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def build_model(:\n")
    with pytest.raises(ModelFileError, match=r"syntax.py:1: syntax error"):
        load_model_file(syntax)
    failing = tmp_path / "failing.py"
    failing.write_text("import math\n\nx = 1 / 0\n")
    with pytest.raises(ModelFileError, match=r"failing.py:3: importing .* ZeroDivisionError"):
        load_model_file(failing)
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(tmp_path / "missing.py")


def test_model_file_spec():
    spec = load_model_file(GCN)
    assert spec.name == "gcn" and spec.hparams["hidden"] == 16 and callable(spec.build_model)
    assert spec.hparams["self_loops"] is True


def test_set_overrides():
    assert parse_overrides(["hidden=32", "lr=5e-3", "num_bases=None", "name=abc"]) == {
        "hidden": 32, "lr": 0.005, "num_bases": None, "name": "abc"}
    assert main(["train", str(GCN), "--set", "oops"]) == 2


def test_model_file_runs_as_a_script():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_or_show_stacks([sys.executable, str(GCN), "--dataset", "cora", "--epochs", "2"],
                              timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "selected epoch" in proc.stdout


NO_KEYWORDS = MEAN + '''

class Net(nn.Module):
    def __init__(self, i, c, hidden):
        super().__init__()
        self.a, self.b = Mean(i, hidden), Mean(hidden, c)

    def forward(self, g, x):
        return self.b(g, self.a(g, x).relu())


HPARAMS = {"hidden": 16, "epochs": 2}


def build_model(in_feats, num_classes, hidden=32):
    return Net(in_feats, num_classes, hidden)
'''


def test_a_build_model_without_keyword_options_gets_the_keywords_it_names(tmp_path):
    """``build_model(in_feats, num_classes, hidden=32)``, no ``**options``: it is given the
    hyperparameters it names (HPARAMS', --set's), not every one the trainer reads (lr,
    epochs, the dataset's sizes), which it would not take; on one process and on workers."""
    from sarc.datasets import load_dataset
    from sarc.train import build
    model = tmp_path / "no_keywords.py"
    model.write_text(NO_KEYWORDS)
    spec = load_model_file(str(model))
    built = build(spec, load_dataset("cora"), {"hidden": 8, "lr": 0.01, "epochs": 2,
                                               "dataset": "cora"})
    assert built.a.lin.out_features == 8
    for extra in ((), ("--workers", "2", "--method", "random")):
        out = tmp_path / f"run{len(extra)}.json"
        proc = run_sarc("train", model, "--set", "hidden=4", "--json", out, *extra)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(out.read_text())["hparams"]["hidden"] == 4
