"""Bad command-line values: each refused with one line naming the option, before any work
(no dataset loaded, no partition written, no worker launched, no epoch trained)."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from .catalogue import case
from .harness import ROOT, assert_error, on_workers, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

GCN = ROOT / "models" / "gcn.py"


def refused_before_work(proc, *needles: str) -> str:
    """One error line naming ``needles``; nothing was partitioned or trained."""
    err = assert_error(proc, *needles)
    assert proc.stdout == "", proc.stdout
    return err


EVEN_WIDTH = """\
from torch import nn

HPARAMS = {"width": 16}


def build_model(in_feats, num_classes, width=16, **_):
    if width % 2:
        raise ValueError(f"width must be even, got {width}")
    return nn.Sequential(nn.Linear(in_feats, width), nn.Linear(width, num_classes))
"""


@case("cli", "`--set width=3` (the model cannot be built)", "error")
def test_set_value_the_model_rejects(tmp_path):
    model = tmp_path / "even.py"
    model.write_text(EVEN_WIDTH)
    proc = run_sarc("train", model, "--set", "width=3", "--epochs", "2")
    err = assert_error(proc, "building the model with width=3 failed", "even.py",
                       "width must be even")
    assert "epoch" not in proc.stdout, proc.stdout


@case("cli", "a model whose forward does not take (graph, x) (an `nn.Sequential`)", "error")
def test_model_whose_forward_takes_other_arguments(tmp_path):
    model = tmp_path / "even.py"
    model.write_text(EVEN_WIDTH)
    proc = run_sarc("train", model, "--epochs", "2")
    assert_error(proc, "the model (Sequential) cannot be called as model(graph, x)",
                 "too many positional arguments")
    assert "Traceback" not in proc.stderr


EDGE_WEIGHT_UNDECLARED = """\
import sarc


class Weighted(sarc.Layer):
    def __init__(self, d, c):
        super().__init__(node={"h": d}, edge={"w": ()})

    def message(self, src, dst, edge):
        return src.h * edge.w.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


HPARAMS = {"self_loops": False}


def build_model(in_feats, num_classes, **_):
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = Weighted(in_feats, num_classes)
            self.out = torch.nn.Linear(in_feats, num_classes)

        def forward(self, g, x, edge_weight):
            return self.out(self.conv(g, x, w=edge_weight))
    return M()
"""


@case("cli", "a model whose forward needs edge data no sarc layer of it declares, on a "
             "graph with node features and on a featureless one (a learned input)", "error")
def test_model_forward_needing_edge_data_no_layer_declares(tmp_path):
    model = tmp_path / "weighted.py"
    model.write_text(EDGE_WEIGHT_UNDECLARED)
    proc = run_sarc("train", model, "--epochs", "1")
    assert_error(proc, "missing a required argument: 'edge_weight'",
                 "no sarc layer of the model declares an edge feature 'edge_weight' "
                 "(declared: w)", "sarc_inputs")
    # on a featureless graph the model is wrapped in its learned input, and the hint is
    # still the model's forward's (not the wrapper's)
    import numpy as np
    gen, n = np.random.default_rng(0), 30
    np.savez(tmp_path / "nofeat.npz", edge_src=gen.integers(0, n, 90),
             edge_dst=gen.integers(0, n, 90), label=gen.integers(0, 3, n),
             train_mask=np.arange(n) < 20, val_mask=np.arange(n) >= 25,
             test_mask=(np.arange(n) >= 20) & (np.arange(n) < 25))
    proc = run_sarc("train", model, "--dataset", tmp_path / "nofeat.npz", "--set",
                    "embedding_dim=4", "--epochs", "1")
    assert_error(proc, "missing a required argument: 'edge_weight'",
                 "no sarc layer of the model declares an edge feature 'edge_weight' "
                 "(declared: w)", "sarc_inputs")
    # sarc compile runs the model once the same way, and says the same
    for extra in ((), ("--dataset", tmp_path / "nofeat.npz", "--set", "embedding_dim=4")):
        proc = run_sarc("compile", model, *extra, "--out", tmp_path / "out")
        assert_error(proc, "missing a required argument: 'edge_weight'",
                     "no sarc layer of the model declares an edge feature 'edge_weight' "
                     "(declared: w)", "sarc_inputs")
        assert "EmbeddingInput" not in proc.stderr


@case("cli", "a model whose forward needs edge data its sarc layer declares, on a dataset "
             "without it", "error")
def test_model_forward_needing_declared_edge_data_the_dataset_lacks(tmp_path):
    """It was told to take the edge data its layers read by name, which it does."""
    model = tmp_path / "weighted.py"
    model.write_text(EDGE_WEIGHT_UNDECLARED.replace('edge={"w": ()}', 'edge={"edge_weight": ()}')
                     .replace("w=edge_weight", "edge_weight=edge_weight")
                     .replace("edge.w", "edge.edge_weight"))
    for command in (("train", model, "--epochs", "1"), ("compile", model)):
        err = assert_error(run_sarc(*command), "forward needs the edge data 'edge_weight'",
                           "the dataset has no edge data of that name", "edge_weight=None")
        assert "build_model must return" not in err


@case("cli", "`--set dropout=1.5`, `attn_drop=-0.1`, `hidden=0` or `heads=0` (a model "
             "hyperparameter out of its range)", "error")
@pytest.mark.parametrize("model,item,needles", [
    (GCN, "dropout=1.5", ("dropout=1.5", "probability in [0, 1)")),
    (GCN, "dropout=1.0", ("dropout=1.0", "probability in [0, 1)")),
    (GCN, "dropout=" + "9" * 400, ("dropout=999", "400 digits", "too large for a float")),
    (ROOT / "models" / "gat.py", "attn_drop=-0.1", ("attn_drop=-0.1", "probability")),
    (GCN, "hidden=0", ("hidden=0", "integer >= 1")),
    (ROOT / "models" / "gat.py", "heads=0", ("heads=0", "integer >= 1"))])
def test_set_model_value_out_of_range(model, item, needles):
    refused_before_work(run_sarc("train", model, "--set", item, "--epochs", "1"), *needles)


@case("cli", "a model file's `HPARAMS = {\"dropout\": True}` (a bool for a dropout rate)",
      "error")
def test_a_bool_dropout_in_the_model_file(tmp_path):
    """torch reads True as 1.0: the run trained with every feature dropped."""
    model = tmp_path / "gcn_true.py"
    model.write_text(GCN.read_text() + '\nHPARAMS = {**HPARAMS, "dropout": True}\n')
    refused_before_work(run_sarc("train", model, "--epochs", "1"),
                        "dropout=True", "a bool", "a dropout rate")


@case("cli", "a mistake in the model's own forward (plain torch between its layers), in "
             "`sarc train` and `sarc compile`", "error")
@pytest.mark.parametrize("command", [("train", "--epochs", "1"), ("train", "--epochs", "1",
                                     "--mode", "mfg"), ("compile",)])
def test_a_mistake_in_the_models_forward_names_its_line(tmp_path, command):
    """It was a traceback through the training loop (compile named no line); compile, which
    runs the forward once to find its layer calls, says it as training does."""
    model = tmp_path / "misspelt.py"
    model.write_text(GCN.read_text().replace("x = F.relu(self.conv1(g, x))",
                                             "x = F.relu(self.conv1(g, xx))"))
    assert_error(run_sarc(command[0], model, *command[1:]), f"{model}:46",
                 "NameError: name 'xx' is not defined (in the model's forward")


@case("cli", "a model's forward reading `g.src` where the graph has none: a step's blocks "
             "(mfg mode) on one process, a worker's graph", "error")
@pytest.mark.parametrize("how,said_by", [
    (("--mode", "mfg"), ["sarc train"]),
    (("--workers", "2", "--method", "random"), ["sarc worker 0", "sarc worker 1"])],
    ids=["mfg", "workers"])
def test_a_forward_reading_the_sources_of_a_graph_without_them_names_its_line(tmp_path, how,
                                                                               said_by):
    """On one process in mfg mode ``g.src`` was the next layer's block's alone (where
    ``dst`` and ``perm`` are every block's: a per-edge value made of it failed in torch with
    an index error); on workers it was a traceback on each."""
    model = tmp_path / "reads_src.py"
    model.write_text(GCN.read_text().replace(
        "x = F.relu(self.conv1(g, x))",
        "x = F.relu(self.conv1(g, x)) + 0 * g.src.sum()"))
    proc = run_sarc("train", model, "--epochs", "1", *how)
    err = proc.stderr
    assert proc.returncode == 2 and "Traceback" not in err, (proc.returncode, err)
    if said_by == ["sarc train"]:
        assert_error(proc)   # that line alone
    for who in said_by:
        said = [l for l in err.splitlines() if l.startswith(f"{who}: error:")]
        assert len(said) == 1, err
        assert f"{model}:46: GraphAttributeError:" in said[0], err
        assert "so it has no `src`" in said[0] and "(in the model's forward)" in said[0], err


@case("cli", "`--set lr=abc` (a string for a float)", "error")
def test_set_wrong_type():
    refused_before_work(run_sarc("train", GCN, "--set", "lr=abc"), "lr", "'abc'", "float")


@case("cli", "`--set lr=nan` or `lr=inf` (a float that is no number)", "error")
@pytest.mark.parametrize("item,needles", [
    ("lr=nan", ("lr=nan", "finite number > 0")), ("lr=-inf", ("lr=-inf", "finite number > 0")),
    ("weight_decay=Infinity", ("weight_decay=inf", "finite number >= 0")),
    ("dropout=nan", ("dropout=nan", "probability in [0, 1)")),
    ("lr=--inf", ("lr='--inf' is a string", "takes a float"))])   # float() refuses it too
def test_set_a_float_that_is_no_number(item, needles):
    """They were refused as strings ("lr='nan' is a string, but lr takes a float")."""
    refused_before_work(run_sarc("train", GCN, "--set", item), *needles)


@case("cli", "`--set self_loops=1` (an int for a bool)", "error")
def test_set_int_for_bool():
    refused_before_work(run_sarc("train", GCN, "--set", "self_loops=1"),
                        "self_loops", "bool", "True")


@case("cli", "`--set hiden=32` (an unknown hyperparameter)", "error")
def test_set_unknown_key():
    refused_before_work(run_sarc("train", GCN, "--set", "hiden=32"),
                        "hiden", "known", "hidden", "dropout", "lr")


MISSPELT = """\
from torch import nn

HPARAMS = {
    "hidden": 16,
    "dropuot": 0.5,
}


class MLP(nn.Module):
    def __init__(self, in_feats, hidden, num_classes, dropout):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_feats, hidden), nn.Dropout(dropout),
                                 nn.Linear(hidden, num_classes))

    def forward(self, g, x):
        return self.net(x)


def build_model(in_feats, num_classes, hidden=16, dropout=0.0, **_):
    return MLP(in_feats, hidden, num_classes, dropout)
"""


@case("cli", "a misspelt key in a model file's HPARAMS (`dropuot`), which `build_model(**_)` "
             "would ignore", "error")
def test_misspelt_hparams_key(tmp_path):
    model = tmp_path / "typo.py"
    model.write_text(MISSPELT)
    err = refused_before_work(run_sarc("train", model, "--epochs", "1"),
                              "typo.py:5", "dropuot", "dropout")
    assert "did you mean 'dropout'" in err, err


OPEN_KEYWORDS = MISSPELT.replace("**_", "**options").replace(
    "return MLP(in_feats, hidden, num_classes, dropout)",
    "return MLP(in_feats, hidden, num_classes, options.get('dropuot', dropout))")


FORWARDING = MISSPELT.replace('"dropuot": 0.5', '"dropout": 0.5').replace(
    "def build_model(in_feats, num_classes, hidden=16, dropout=0.0, **_):\n"
    "    return MLP(in_feats, hidden, num_classes, dropout)",
    "def build(in_feats, num_classes, hidden=16, dropout=0.0):\n"
    "    return MLP(in_feats, hidden, num_classes, dropout)\n\n\n"
    "def build_model(*args, **kwargs):\n"
    "    return build(*args, **{k: v for k, v in kwargs.items() if k in ('hidden', 'dropout')})")


@pytest.mark.parametrize("text", [OPEN_KEYWORDS, FORWARDING], ids=["**options", "*args"])
def test_hparams_read_through_named_kwargs(tmp_path, text):
    """A builder that names its ``**options`` (``build_model(*args, **kwargs)`` too) reads
    what it likes from them: no key is refused."""
    model = tmp_path / "open.py"
    model.write_text(text)
    proc = run_sarc("train", model, "--epochs", "1")
    assert proc.returncode == 0, proc.stderr


@case("cli", "a model file that calls `sys.exit(0)` or `os._exit(0)` at import or in "
             "`build_model`", "error")
@pytest.mark.parametrize("exit_", ["sys.exit", "os._exit"])
@pytest.mark.parametrize("text,line", [
    ("import os, sys\nEXIT(0)\n", 2),
    ("def build_model(in_feats, num_classes, **_):\n    import os, sys\n    EXIT(0)\n", 3)],
    ids=["import", "build_model"])
@pytest.mark.parametrize("command", ["train", "compile"])
def test_model_file_exiting_is_an_error(tmp_path, text, line, exit_, command):
    """An exit in the user's code is not the run's success: it was exiting 0 with nothing
    done (``os._exit`` ends a process where no ``except`` sees it: sarc raises instead while
    the model file's code runs)."""
    model = tmp_path / "leaves.py"
    model.write_text(text.replace("EXIT", exit_))
    out = tmp_path / ("r.json" if command == "train" else "out")
    proc = run_sarc(command, model, *(("--epochs", "1") if command == "train" else ()),
                    "--json" if command == "train" else "--out", out)
    assert_error(proc, f"leaves.py:{line}", f"{exit_}(0)")
    assert not out.exists()


@case("cli", "a model file whose HPARAMS has a key that is not a string (`{1: 2}`)", "error")
def test_hparams_key_not_a_string(tmp_path):
    model = tmp_path / "intkey.py"
    model.write_text(OPEN_KEYWORDS.replace('"hidden": 16,', '"hidden": 16,\n    1: 2,'))
    refused_before_work(run_sarc("train", model, "--epochs", "1"), "intkey.py",
                        "HPARAMS", "1", "string")


@case("cli", "`--json` or `--save` naming the model file, each other, the dataset or a file "
             "inside `--checkpoint DIR`", "error")
@pytest.mark.parametrize("case_", ["json=model", "json=save", "json in checkpoint",
                                   "save=dataset"])
def test_outputs_never_overwrite_the_runs_own_files(tmp_path, case_):
    model = tmp_path / "gcn.py"
    model.write_bytes(GCN.read_bytes())
    dataset = tmp_path / "cora.npz"
    dataset.write_bytes((ROOT / "sarc" / "data" / "cora.npz").read_bytes())
    ckpt = tmp_path / "ckpt"
    args = {"json=model": ["--json", model],
            "json=save": ["--json", tmp_path / "m.pt", "--save", tmp_path / "m.pt"],
            "json in checkpoint": ["--checkpoint", ckpt, "--json", ckpt / "checkpoint.json"],
            "save=dataset": ["--save", dataset]}[case_]
    before = {p: p.read_bytes() for p in (model, dataset)}
    refused_before_work(run_sarc("train", model, "--dataset", dataset, "--epochs", "1", *args),
                        str(args[-1]))
    assert {p: p.read_bytes() for p in (model, dataset)} == before
    assert not ckpt.exists() and not (tmp_path / "m.pt").exists()


@case("cli", "a model path that is a directory", "error")
def test_model_path_that_is_a_directory(tmp_path):
    refused_before_work(run_sarc("train", tmp_path, "--epochs", "1"), str(tmp_path),
                        "is a directory")


def test_outputs_given_as_one_string_object_are_still_apart(tmp_path):
    """``main([... "--json", p, "--save", p])`` from Python passes one string object twice:
    still refused, and nothing is written."""
    from sarc.cli import main
    out = str(tmp_path / "m.out")
    model = str(tmp_path / "gcn.py")
    Path(model).write_bytes(GCN.read_bytes())
    assert main(["train", model, "--epochs", "1", "--json", out, "--save", out]) == 2
    assert main(["train", model, "--epochs", "1", "--json", model]) == 2
    assert not Path(out).exists() and Path(model).read_bytes() == GCN.read_bytes()


@case("cli", "`--json` through a symbolic link (to a file, as to /dev/stdout)", "exact")
def test_json_through_a_link_writes_what_it_names(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    proc = run_sarc("train", GCN, "--epochs", "1", "--json", link)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and json.loads(target.read_text())["epochs"] == 1


@case("cli", "`--json /dev/stdout` where stdout is a pipe", "exact")
def test_json_to_stdout_through_a_pipe():
    """/dev/stdout resolves to /proc/<pid>/fd/pipe:[N], which no directory entry names: the
    report is written into the pipe, not beside it (a temp file in /proc/<pid>/fd)."""
    proc = run_sarc("train", GCN, "--epochs", "1", "--quiet", "--json", "/dev/stdout")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["epochs"] == 1  # after the summary


def test_a_pipe_is_an_output_file_where_its_directory_is_not_writable(tmp_path, monkeypatch):
    """/dev/stdout (a pipe, a tty) is written in place: that /dev is not writable (for any
    user but root) does not matter."""
    from sarc.cli import options
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    real = os.access
    monkeypatch.setattr(options.os, "access",
                        lambda p, mode: real(p, mode) and not Path(p).is_dir())
    options.check_output_file("--json", str(pipe))
    with pytest.raises(options.UsageError, match="is not writable"):
        options.check_output_file("--json", str(tmp_path / "report.json"))


@case("cli", "`--checkpoint DIR` where DIR is a directory that cannot be written", "error")
def test_an_unwritable_checkpoint_directory_is_refused_before_training(tmp_path):
    """Training ran to the first save (10 epochs), then failed writing it: a run shorter
    than that lost its result and its --save."""
    import subprocess
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if os.geteuid() != 0:
        ckpt.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(ckpt)], capture_output=True).returncode != 0:
        pytest.skip("root, and no chattr to make a directory unwritable")
    try:
        proc = run_sarc("train", GCN, "--epochs", "2", "--checkpoint", ckpt, "--save",
                        tmp_path / "m.pt")
        refused_before_work(proc, f"--checkpoint {ckpt}: the directory is not writable")
        assert not (tmp_path / "m.pt").exists()
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(ckpt)], capture_output=True)
        ckpt.chmod(0o755)
    assert list(ckpt.iterdir()) == []


@case("cli", "an empty output path (`--out \"$UNSET\"`, `--json \"\"`)", "error")
@pytest.mark.parametrize("argv", [("compile", GCN, "--out", ""),
                                  ("partition", "--dataset", "cora", "--parts", "2", "--out", ""),
                                  ("train", GCN, "--epochs", "1", "--json", ""),
                                  ("train", GCN, "--epochs", "1", "--save", "")],
                         ids=["compile-out", "partition-out", "train-json", "train-save"])
def test_an_empty_output_path_is_refused(argv):
    """``if args.out:`` read an empty --out as not given: compile wrote nothing, said so
    nowhere, and exited 0."""
    option = argv[-2]
    refused_before_work(run_sarc(*argv), option, "an empty path")


@case("cli", "an output place the checks pass but that cannot be written (/proc)", "error")
@pytest.mark.parametrize("argv", [("compile", GCN, "--out", "/proc/sarc_out"),
                                  ("train", GCN, "--epochs", "1", "--json", "/proc/sarc.json")],
                         ids=["compile-out", "train-json"])
def test_an_output_that_cannot_be_written_is_one_error_line(argv):
    """As root, os.access calls /proc writable: a file made and removed there first says it
    is not, before any work (the report was refused after the training, its result lost)."""
    err = refused_before_work(run_sarc(*argv), "/proc")
    assert Path(argv[-1]).name.split(".")[0] in err


@case("cli", "`--epochs 1 --set epochs=5` (two values of one setting)", "error")
@pytest.mark.parametrize("value", ["5", "True"])
def test_epochs_given_twice_with_two_values_is_refused(value):
    """--epochs won silently (True == 1 too)."""
    refused_before_work(run_sarc("train", GCN, "--epochs", "1", "--set", f"epochs={value}"),
                        f"--epochs 1 and --set epochs={value} disagree")


@case("cli", "`--set hidden=16 --set hidden=32`, or `--dataset X --set dataset=Y` (two values "
             "of one setting)", "error")
@pytest.mark.parametrize("argv, needle", [
    (("--set", "hidden=16", "--set", "hidden=32"), "--set hidden given twice (16, then 32)"),
    (("--dataset", "cora", "--set", "dataset=aifb"),
     "--dataset cora and --set dataset='aifb' disagree")], ids=["set-twice", "dataset"])
def test_a_setting_given_two_values_is_refused(argv, needle):
    """The last --set, or --dataset, won silently."""
    refused_before_work(run_sarc("train", GCN, "--epochs", "1", *argv), needle)


@case("cli", "`--set hidden=` and 20,000 minus signs (a literal nested past the parser's "
             "limits)", "error")
def test_a_setting_nested_past_the_parsers_limits_is_refused():
    """The parser's MemoryError ended the command in a traceback."""
    refused_before_work(run_sarc("train", GCN, "--epochs", "1", "--set",
                                 "hidden=" + "-" * 20000 + "1"),
                        "--set hidden=...: the value (20001 characters) nests too deeply")


def test_a_setting_given_twice_with_one_value_is_taken():
    from sarc.loader import parse_overrides
    assert parse_overrides(["hidden=16", "lr=0.1", "hidden=16"]) == {"hidden": 16, "lr": 0.1}


@case("cli", "`--set epochs=0` or `--set lr=-0.1` (a trainer value out of range)", "error")
@pytest.mark.parametrize("item,needle", [("epochs=0", "epochs"), ("lr=-0.1", "lr"),
                                         ("patience=0", "patience")])
def test_set_trainer_value_out_of_range(item, needle):
    refused_before_work(run_sarc("train", GCN, "--set", item), needle)


@case("cli", "`--json` into a directory that does not exist", "error")
def test_json_into_missing_directory(tmp_path):
    out = tmp_path / "no" / "such" / "r.json"
    refused_before_work(run_sarc("train", GCN, "--epochs", "2", "--json", out),
                        "--json", str(out.parent), "does not exist")
    assert not out.parent.exists()


@case("cli", "`--save` into a directory that does not exist", "error")
def test_save_into_missing_directory(tmp_path):
    out = tmp_path / "no" / "such" / "model.pt"
    refused_before_work(run_sarc("train", GCN, "--epochs", "2", "--save", out),
                        "--save", str(out.parent), "does not exist")
    assert not out.parent.exists()


@case("cli", "`--json` naming a directory, in a distributed run", "error")
def test_json_is_a_directory(tmp_path):
    refused_before_work(run_sarc("train", GCN, "--workers", "2", "--epochs", "2",
                                 "--json", tmp_path), "--json", "is a directory")


@case("cli", "`--json results/` (a directory that does not exist yet, by its slash)", "error")
def test_json_with_a_trailing_slash(tmp_path):
    """The slash was dropped: the report was written to a file named ``results``."""
    out = f"{tmp_path / 'results'}/"
    refused_before_work(run_sarc("train", GCN, "--epochs", "1", "--json", out),
                        "--json", "is a directory")
    assert not (tmp_path / "results").exists()


@case("cli", "`--timeout` of 0, a negative number, nan or inf", "error")
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_timeout_not_positive_finite(value):
    refused_before_work(run_sarc("train", GCN, "--workers", "2", "--timeout", value),
                        "--timeout", value)


@case("cli", "`--mem-budget` of inf, a negative size or garbage", "error")
@pytest.mark.parametrize("value", ["inf", "-1M", "lots", "nanG"])
def test_mem_budget_unreadable(value):
    refused_before_work(run_sarc("train", GCN, "--workers", "2", f"--mem-budget={value}"),
                        "--mem-budget", repr(value))


@case("cli", "`sarc compile --mem-budget inf`", "error")
def test_compile_mem_budget_inf():
    refused_before_work(run_sarc("compile", GCN, "--workers", "2", "--mem-budget", "inf"),
                        "--mem-budget", "'inf'")


@case("cli", "`sarc compile --out` below a regular file", "error")
def test_compile_out_below_a_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine\n")
    refused_before_work(run_sarc("compile", GCN, "--out", f / "art"), "--out", str(f),
                        "not a directory")
    assert f.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [f]


@case("cli", "`sarc partition --out` below a regular file", "error")
def test_partition_out_below_a_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("mine\n")
    refused_before_work(run_sarc("partition", "--dataset", "cora", "--parts", "2",
                                 "--out", f / "parts"), "--out", str(f), "not a directory")
    assert f.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [f]


@case("cli", "`sarc partition --parts 0` or `--seed -1`", "error")
@pytest.mark.parametrize("argv,needle", [(["--parts", "0"], "--parts"),
                                         (["--parts", "2", "--seed", "-1"], "--seed")])
def test_partition_bad_numbers(tmp_path, argv, needle):
    out = tmp_path / "parts"
    refused_before_work(run_sarc("partition", "--dataset", "cora", "--out", out, *argv), needle)
    assert not out.exists()


@case("cli", "`--epochs 0` or `--epochs -1`", "error")
@pytest.mark.parametrize("value", ["0", "-1"])
def test_epochs_not_positive(value):
    refused_before_work(run_sarc("train", GCN, "--epochs", value), "--epochs", value)


@case("cli", "`--log-every 0`", "error")
def test_log_every_zero():
    refused_before_work(run_sarc("train", GCN, "--log-every", "0"), "--log-every", "0")


@case("cli", "`--threads 0` in a distributed run", "error")
def test_threads_zero_distributed():
    refused_before_work(run_sarc("train", GCN, "--workers", "2", "--threads", "0"),
                        "--threads", "0")


@case("cli", "`--workers 0`", "error")
def test_workers_zero():
    refused_before_work(run_sarc("train", GCN, "--workers", "0"), "--workers", "0")


@case("cli", "`--seed -1` (seeds are 0 .. 2**31 - 1)", "error")
def test_negative_seed():
    refused_before_work(run_sarc("train", GCN, "--seed", "-1"), "--seed", "-1")


@case("cli", "`--data-dir` that does not exist", "error")
def test_data_dir_missing(tmp_path):
    refused_before_work(run_sarc("train", GCN, "--data-dir", tmp_path / "nope"),
                        "--data-dir", "does not exist")


@case("cli", "`sarc worker --timeout nan` (the torchrun entry point)", "error")
def test_worker_timeout_nan(tmp_path):
    proc = run_sarc("worker", GCN, "--partition", tmp_path, "--timeout", "nan")
    assert_error(proc, "--timeout", "nan")


@case("cli", "the old spellings `--mode sar` and `--exec-mode oneshot`", "error")
@pytest.mark.parametrize("argv, new", [(("--mode", "sar"), "--exec sar"),
                                       (("--exec-mode", "oneshot"), "--exec oneshot")])
def test_old_mode_spellings_name_the_new_one(argv, new):
    refused_before_work(run_sarc("train", GCN, "--workers", "2", *argv), new)


@case("cli", "`sarc train --mode minibatch`, a mode that does not exist", "error")
def test_train_mode_that_does_not_exist(tmp_path):
    refused_before_work(run_sarc("train", GCN, "--mode", "minibatch"),
                        "--mode must be one of full, mfg, sampling", "'minibatch'")


NARROW = """\
from torch import nn

HPARAMS = {"dataset": "cora"}


class Narrow(nn.Module):
    def __init__(self, in_feats, out):
        super().__init__()
        self.lin = nn.Linear(in_feats, out)

    def forward(self, g, x):
        return self.lin(x)


def build_model(in_feats, num_classes, **_):
    return Narrow(in_feats, num_classes - 3)  # fewer outputs than classes
"""


@case("cli", "a model whose output width is not the dataset's number of classes (a link "
             "model without `--task link`, a model of 4 outputs for Cora's 7 classes), on "
             "one process and on workers", "error")
@pytest.mark.parametrize("model,workers,needles", [
    ("sage_lp", 1, ("sage_lp.py", "64 columns per node", "cora has 7 classes", "--task link")),
    ("narrow", 1, ("narrow.py", "4 columns per node", "cora has 7 classes", "num_classes")),
    ("narrow", 2, ("narrow.py", "4 columns per node", "cora has 7 classes"))])
def test_model_output_width_other_than_the_classes(tmp_path, model, workers, needles):
    path = ROOT / "models" / "sage_lp.py"
    if model == "narrow":
        path = tmp_path / "narrow.py"
        path.write_text(NARROW)
    proc = run_sarc("train", path, "--dataset", "cora", "--epochs", "2", *on_workers(workers))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in proc.stderr, (n, proc.stderr)
    assert "epoch" not in proc.stdout, proc.stdout  # refused on the first step, before it ends


OUTPUTS = {
    "a tuple": ("return self.lin(x), x", "the model's output is a tuple of 2, not a tensor"),
    "a row short": ("return self.lin(x)[1:]", "rows, but the step's graph has"),   # a shard
    "integer logits": ("return self.lin(x).long()", "the model's output is of dtype torch.int64"),
    "detached logits": ("return self.lin(x).detach()", "the model's output has no gradient"),
}


@case("cli", "a model whose forward returns a tuple, a row fewer than the nodes, integer "
             "logits or detached ones, on one process and on workers", "error")
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_model_outputs_that_are_not_logits_per_node(tmp_path, kind, workers):
    """Each was a traceback in the loss (or an autograd error) instead of a message."""
    body, needle = OUTPUTS[kind]
    path = tmp_path / "bad_output.py"
    path.write_text(NARROW.replace("return self.lin(x)", body).replace("num_classes - 3",
                                                                        "num_classes"))
    proc = run_sarc("train", path, "--dataset", "cora", "--epochs", "1", *on_workers(workers))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr and "bad_output.py" in proc.stderr, proc.stderr


@case("cli", "`--workers 2 --partition DIR --dataset cora` where DIR holds another graph "
             "(AIFB)", "error")
def test_dataset_other_than_the_partitioned_graph(tmp_path):
    parts = tmp_path / "aifb_parts"
    assert run_sarc("partition", "--dataset", "aifb", "--parts", "2", "--method", "random",
                    "--out", parts).returncode == 0
    refused_before_work(run_sarc("train", GCN, "--partition", parts, "--dataset", "cora",
                                 "--workers", "2", "--epochs", "1", "--save",
                                 tmp_path / "m.pt"),
                        "--dataset cora is not the graph partitioned in --partition",
                        str(parts), "2708 nodes", "8285 nodes")
    assert not (tmp_path / "m.pt").exists()


@case("cli", "`sarc worker --dataset citeseer` (under the user's own torchrun) on a set "
             "`sarc partition --dataset cora` wrote", "error")
def test_worker_dataset_other_than_the_one_partitioned(tmp_path):
    from sarc.partition import load_partitions
    from sarc.distributed.train import WorkerConfig, recorded_dataset

    parts = tmp_path / "cora_parts"
    assert run_sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                    "--out", parts).returncode == 0
    assert load_partitions(parts).dataset == "cora"
    proc = run_sarc("worker", GCN, "--partition", parts, "--dataset", "citeseer")
    assert_error(proc, "--dataset citeseer", "partitioned from the dataset cora")
    proc = run_sarc("worker", GCN, "--partition", parts, "--dataset", "other/citeseer.npz")
    assert_error(proc, "--dataset other/citeseer.npz", "partitioned from the dataset cora")
    from sarc.cli.worker import check_recorded_dataset
    args = argparse.Namespace(partition=str(parts), dataset="data/cora.npz")
    check_recorded_dataset(args)  # a file of cora's name that is not here: the name
    assert args.dataset == "cora"
    # without --dataset, a worker records the set's dataset, not the graph's fingerprint
    assert recorded_dataset(WorkerConfig(partition=str(parts))) == "cora"


@case("cli", "`--workers 2` on a featureless dataset (AIFB) without `embedding_dim`, "
             "partitioned by the run or given as `--partition`", "error")
def test_featureless_dataset_refused_before_partitioning(tmp_path):
    refused_before_work(run_sarc("train", GCN, "--dataset", "aifb", "--workers", "2",
                                 "--epochs", "1"),
                        "dataset aifb has no node features", "embedding_dim")
    parts = tmp_path / "aifb_parts"
    assert run_sarc("partition", "--dataset", "aifb", "--parts", "2", "--method", "random",
                    "--out", parts).returncode == 0
    err = refused_before_work(run_sarc("train", GCN, "--partition", parts, "--workers", "2",
                                       "--epochs", "1"),
                              f"dataset partitioned at {parts} has no node features",
                              "embedding_dim")
    assert "dataset partitioned has" not in err


@case("cli", "`sarc partition --parts 5000` for Cora's 2708 nodes (more parts than nodes)",
      "error")
def test_partition_more_parts_than_nodes(tmp_path):
    out = tmp_path / "parts"
    refused_before_work(run_sarc("partition", "--dataset", "cora", "--parts", "5000",
                                 "--out", out), "5000 parts", "2708 nodes")
    assert not out.exists()


@case("cli", "`--workers 2 --partition DIR --dataset B.npz` where B has the edges DIR was "
             "partitioned with but other features, labels or splits", "error")
def test_dataset_with_the_partitioned_graph_but_other_node_data(tmp_path):
    import numpy as np

    def ring(feat_scale: float, val: bool):
        n = 40
        ids = np.arange(n)
        return {"edge_src": ids, "edge_dst": (ids + 1) % n,
                "feat": np.random.default_rng(0).random((n, 4), dtype=np.float32) * feat_scale,
                "label": ids % 3, "train_mask": ids % 3 == 0, "val_mask": (ids % 3 == 1) & val,
                "test_mask": ids % 3 == 2, "num_nodes": np.int64(n)}

    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(a, **ring(1.0, True))
    np.savez(b, **ring(2.0, False))  # the same edges, other features and no validation nodes
    parts = tmp_path / "a_parts"
    assert run_sarc("partition", "--dataset", a, "--parts", "2", "--method", "random",
                    "--out", parts).returncode == 0
    err = refused_before_work(run_sarc("train", ROOT / "models" / "sage.py", "--partition",
                                       parts, "--dataset", b, "--workers", "2", "--epochs",
                                       "1", "--save", tmp_path / "m.pt"),
                              f"--dataset {b} has the graph partitioned in --partition "
                              f"{parts} but other data",
                              "its features, splits (val) differ", f"(from {a.resolve()})",
                              "leave --dataset out, or partition b")
    assert "labels" not in err
    assert not (tmp_path / "m.pt").exists()


@case("cli", "a model whose training loss is NaN (non-finite outputs), on one process and "
             "on workers", "nothing-lost")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_nan_loss_stops_the_run_without_saving(tmp_path, workers):
    """Every epoch printed `loss nan`, an epoch was selected and --save wrote the model."""
    path = tmp_path / "nan_model.py"
    path.write_text(NARROW.replace("return self.lin(x)", "return self.lin(x) * float('nan')")
                    .replace("num_classes - 3", "num_classes"))
    proc = run_sarc("train", path, "--dataset", "cora", "--epochs", "3", *on_workers(workers),
                    "--save", tmp_path / "m.pt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "epoch 1: the training loss is nan" in proc.stderr, proc.stderr
    assert not (tmp_path / "m.pt").exists()


@case("cli", "a model file importing a helper module from its own folder", "exact")
def test_a_model_file_imports_a_module_beside_it(tmp_path):
    """It was "No module named ...", where `python MODEL.py` imports it."""
    (tmp_path / "my_helpers.py").write_text("from torch import nn\n\n\ndef head(i, o):\n"
                                            "    return nn.Linear(i, o)\n")
    (tmp_path / "uses_helper.py").write_text(
        NARROW.replace("from torch import nn", "from torch import nn\nfrom my_helpers import head")
        .replace("nn.Linear(in_feats, out)", "head(in_feats, out)")
        .replace("num_classes - 3", "num_classes"))
    proc = run_sarc("train", tmp_path / "uses_helper.py", "--dataset", "cora", "--epochs", "1")
    assert proc.returncode == 0 and "selected epoch" in proc.stdout, proc.stderr


WEIGHTED = """\
from torch import nn

import sarc

HPARAMS = {"self_loops": True}


class Weighted(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i}, edge={"edge_weight": ()})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h) * edge.edge_weight.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.a, self.b = Weighted(i, 8), Weighted(8, c)

    def forward(self, g, x, edge_weight):
        return self.b(g, self.a(g, x, edge_weight).relu(), edge_weight)


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
"""


@case("cli", "a model reading a dataset's edge weights, with self loops, in mfg and "
             "sampling modes on one process", "exact")
@pytest.mark.parametrize("mode", [("--mode", "mfg"), ("--mode", "sampling", "--fanouts", "4,4")])
def test_edge_weights_with_self_loops_train_in_minibatch_modes_as_on_workers(tmp_path, mode):
    """One process lost the edge data when it added the self loops (a KeyError at the first
    step); it now gives the loops weight 1, as the workers do, and equals two of them."""
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    rng = np.random.default_rng(0)
    data["edge_weight"] = rng.uniform(0.5, 1.5, data["edge_src"].shape[0]).astype(np.float32)
    np.savez(tmp_path / "weighted.npz", **data)
    (tmp_path / "weighted.py").write_text(WEIGHTED)
    lines = []
    for workers in ("1", "2"):
        proc = run_sarc("train", tmp_path / "weighted.py", "--dataset", tmp_path / "weighted.npz",
                        "--epochs", "2", *on_workers(workers), *mode)
        assert proc.returncode == 0, proc.stderr
        lines.append([x for x in proc.stdout.splitlines() if x.startswith("selected")][0]
                     .split("|")[0])
    assert lines[0] == lines[1], lines


@case("cli", "a parameter read only by a comparison (no gradient), with weight decay, on one "
             "process and on two workers", "exact")
def test_a_parameter_without_a_gradient_is_left_alone_on_workers(tmp_path):
    """Workers gave it a zero gradient, which Adam's weight decay turned into steps: it moved
    on P workers only, and the run differed from one process from the first epoch."""
    import torch
    model = Path(__file__).parent / "threshold_model.py"
    saved = []
    for workers in ("1", "2"):
        out = tmp_path / f"m{workers}.pt"
        proc = run_sarc("train", model, "--epochs", "3", *on_workers(workers), "--save", out)
        assert proc.returncode == 0, proc.stderr
        saved.append(torch.load(out, weights_only=True)["state_dict"])
    assert torch.equal(saved[0]["c.thr"], torch.full_like(saved[0]["c.thr"], 0.5))
    assert torch.equal(saved[1]["c.thr"], saved[0]["c.thr"])
    # the other parameters: two workers sum each gradient in another order, and Adam makes
    # a step of a near-zero difference (1e-6 was missed once, at 3.2e-6 on a weight's
    # near-zero entries, on this machine's CPU)
    for k in saved[0]:
        torch.testing.assert_close(saved[1][k], saved[0][k], rtol=1e-5, atol=1e-5)


@case("cli", "`sarc compile --workers P` with more workers than the dataset has nodes", "error")
def test_compile_for_more_workers_than_nodes_is_refused():
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--workers", "20000", "--emit", "plan")
    assert_error(proc, "20000", "2708 nodes")


def test_a_plan_for_many_workers_says_its_rounds_without_listing_them():
    from sarc.planner.plan import Plan, format_plan
    plan = Plan(mode="full", workers=2000, mem_budget=None, baseline=False, layers=(),
                stats=None)
    assert "exchange rounds: 1999 " in format_plan(plan)


INITIAL_RESIDUAL = '''
import sarc
import torch
from torch import nn


class Prop(sarc.Layer):
    def __init__(self, i):
        super().__init__(node={"h": i})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)


class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.lin, self.p1, self.p2 = nn.Linear(i, c), Prop(c), Prop(c)

    def forward(self, g, x):
        h0 = self.lin(x)
        h2 = self.p2(g, self.p1(g, h0))
        return h0 + h2  # the residual


HPARAMS = {"dataset": "cora", "epochs": 1, "self_loops": True}


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
'''


@case("cli", "`--mode mfg` of a model adding a value made before its first layer (an "
             "initial residual) to a later layer's output, uncut", "error")
@pytest.mark.parametrize("workers", [1, 2])
def test_an_uncut_initial_residual_in_mfg_mode_says_how_to_cut_it(tmp_path, workers):
    """torch's "The size of tensor a (1664) must match the size of tensor b (644)" came as
    a traceback through sarc's training loop, with no word of the block's rows."""
    model = tmp_path / "residual.py"
    model.write_text(INITIAL_RESIDUAL)
    line = INITIAL_RESIDUAL.splitlines().index("        return h0 + h2  # the residual") + 1
    proc = run_sarc("train", model, "--mode", "mfg", "--batch-size", "64", "--epochs", "1",
                    *on_workers(str(workers)))
    if workers == 1:
        assert_error(proc, f"{model}:{line}", "must match the size of tensor",
                     "in mfg and sampling modes", "h0[:h.shape[0]]")
    else:
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{model}:{line}" in proc.stderr and "h0[:h.shape[0]]" in proc.stderr


BRANCHES = INITIAL_RESIDUAL.replace(
    "        h2 = self.p2(g, self.p1(g, h0))\n        return h0 + h2  # the residual",
    "        return self.p1(g, h0) + self.p2(g, h0)  # two branches")


@case("cli", "`--mode mfg` of a model whose two sarc layers read one value (branches)", "error")
def test_branches_in_mfg_mode_are_named_as_well_as_the_cut(tmp_path):
    """The refusal spoke only of cutting a value made before the first layer: of two layers
    reading one value, the second takes the next block (a step's layers are a chain)."""
    model = tmp_path / "branches.py"
    model.write_text(BRANCHES)
    line = BRANCHES.splitlines().index("        return self.p1(g, h0) + self.p2(g, h0)  "
                                       "# two branches") + 1
    proc = run_sarc("train", model, "--mode", "mfg", "--batch-size", "64", "--epochs", "1")
    assert_error(proc, f"{model}:{line}", "two sarc layers read one value (branches)",
                 "a step's layers are a chain", "--mode full runs branches")


def _negative_features(path: Path) -> Path:
    import numpy as np
    data = dict(np.load(ROOT / "sarc" / "data" / "cora.npz", allow_pickle=False))
    data["feat"] = data["feat"].astype(np.float32) - 0.5
    np.savez(path, **data)
    return path


@case("cli", "`--workers 2` runs a worker would refuse of the dataset (negative features "
             "under norm_features, `--drop-last` with no full batch, more `eval_negatives` "
             "than nodes)", "error")
@pytest.mark.parametrize("problem", ["norm_features", "drop_last", "eval_negatives"])
def test_what_workers_would_refuse_is_refused_before_partitioning(tmp_path, problem):
    """Each was said by every worker, after the dataset was partitioned."""
    argv = {"norm_features": [GCN, "--dataset", _negative_features(tmp_path / "neg.npz")],
            "drop_last": [GCN, "--mode", "mfg", "--batch-size", "1000", "--drop-last"],
            "eval_negatives": [ROOT / "models" / "sage_lp.py", "--task", "link", "--set",
                               "eval_negatives=5000"]}[problem]
    needles = {"norm_features": ["norm_features divides", "negative values"],
               "drop_last": ["--drop-last with a batch size of 1000", "140 training nodes"],
               "eval_negatives": ["eval_negatives=5000", "2708 nodes"]}[problem]
    refused_before_work(run_sarc("train", *argv, "--epochs", "1", "--workers", "2"), *needles)


@case("cli", "an empty input path (an unset shell variable): `--dataset \"\"`, `--partition "
             "\"\"`, `--data-dir \"\"`, an empty MODEL.py", "error")
@pytest.mark.parametrize("argv,option", [
    (("train", GCN, "--dataset", ""), "--dataset"),
    (("train", GCN, "--partition", ""), "--partition"),
    (("train", GCN, "--data-dir", ""), "--data-dir"),
    (("compile", GCN, "--dataset", ""), "--dataset"),
    (("train", ""), "MODEL.py"),
    (("partition", "--graph", "", "--parts", "2", "--out", "parts"), "--graph")])
def test_an_empty_input_path_is_refused(tmp_path, argv, option):
    """It read as the option not given: the model's dataset (cora), one process instead of
    the partition's workers."""
    proc = run_sarc(*argv, cwd=tmp_path)
    refused_before_work(proc, f"{option} names nothing (an empty path)")
    assert list(tmp_path.iterdir()) == []


@case("cli", "`sarc compile --mode mfg --batches 4` without `--partition`", "error")
def test_compile_batches_without_a_partition_is_refused(tmp_path):
    """It was ignored: the plan without a partition is symbolic and samples no batch."""
    proc = run_sarc("compile", GCN, "--mode", "mfg", "--batches", "4", cwd=tmp_path)
    refused_before_work(proc, "--batches", "without --partition")


@case("cli", "`sarc compile --dataset NAME` of a dataset not embedded, the error naming "
      "`--data-dir`", "error")
def test_compile_takes_the_data_dir_its_error_names(tmp_path):
    """The error said to pass --data-dir, which `sarc compile` did not take."""
    import shutil
    shutil.copy(ROOT / "sarc" / "data" / "cora.npz", tmp_path / "mine.npz")
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--dataset", "mine",
                    "--out", tmp_path / "out")
    assert_error(proc, "dataset 'mine' not found", "--data-dir")
    proc = run_sarc("compile", ROOT / "models" / "gcn.py", "--dataset", "mine", "--data-dir",
                    tmp_path, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote" in proc.stdout and (tmp_path / "out").is_dir()
