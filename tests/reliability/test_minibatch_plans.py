"""Bad minibatch options of ``sarc compile --mode mfg|sampling``: each refused with one line
naming the option (before the model is compiled; a fanout count that does not fit the
model, once the model is built), nothing written."""
from __future__ import annotations

import pytest

from model_files import MEAN

from .catalogue import case
from .harness import ROOT, assert_error, on_workers, run_sarc

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

SAGE = ROOT / "models" / "sage.py"


def refused(proc, out, *needles: str) -> str:
    err = assert_error(proc, *needles)
    assert not out.exists()
    return err


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    out = tmp_path_factory.mktemp("cora") / "parts"
    proc = run_sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@case("cli", "`sarc compile --mode mfg --fanouts 10,25` (mfg takes every in-edge)", "error")
def test_fanouts_with_mfg(tmp_path):
    refused(run_sarc("compile", SAGE, "--mode", "mfg", "--fanouts", "10,25", "--out",
                     tmp_path / "o"), tmp_path / "o", "--fanouts", "--mode sampling")


RESIDUAL = "import torch\n" + MEAN + """

class Net(nn.Module):
    def __init__(self, i, c):
        super().__init__()
        self.inp, self.a, self.b = nn.Linear(i, 16), Mean(16, 16), Mean(16, c)

    def forward(self, g, x):
        h = self.inp(x)
        h = h + self.a(g, h)   # a residual of every input row: a block has fewer outputs
        return self.b(g, h)


def build_model(in_feats, num_classes, **_):
    return Net(in_feats, num_classes)
"""


@case("cli", "`sarc compile --mode mfg` of a model whose residual is not cut to a block's "
      "destination rows (which sarc train --mode mfg refuses)", "error-at-line")
@pytest.mark.parametrize("mode", ["mfg", "sampling"])
def test_compile_runs_a_step_of_blocks_as_train_does(tmp_path, mode):
    model = tmp_path / "residual.py"
    model.write_text(RESIDUAL)
    extra = ("--fanouts", "3,3") if mode == "sampling" else ()
    err = refused(run_sarc("compile", model, "--mode", mode, *extra, "--out", tmp_path / "o"),
                  tmp_path / "o", "h0[:h.shape[0]]")
    line = next(i for i, text in enumerate(RESIDUAL.splitlines(), 1)
                if text.strip().startswith("h = h + self.a(g, h)"))
    assert f"residual.py:{line}:" in err, err


@case("cli", "`sarc compile --mode full --batch-size 64` (a minibatch option, full batch)", "error")
def test_batch_size_with_full(tmp_path):
    refused(run_sarc("compile", SAGE, "--batch-size", "64", "--out", tmp_path / "o"),
            tmp_path / "o", "--batch-size", "--mode mfg or sampling")


@case("cli", "`sarc compile --mode sampling --fanouts 10,x` or `--fanouts 10,-2`", "error")
@pytest.mark.parametrize("fanouts,needle", [("10,x", "one integer per layer"),
                                            ("10,-2", ">= 0, or -1")])
def test_bad_fanouts(tmp_path, fanouts, needle):
    refused(run_sarc("compile", SAGE, "--mode", "sampling", "--fanouts", fanouts, "--out",
                     tmp_path / "o"), tmp_path / "o", f"--fanouts {fanouts}", needle)


@case("cli", "`sarc compile --mode sampling --batch-size 0` or `--batches 0`", "error")
@pytest.mark.parametrize("option", ["--batch-size", "--batches"])
def test_batch_counts_below_one(tmp_path, option):
    refused(run_sarc("compile", SAGE, "--mode", "sampling", option, "0", "--out",
                     tmp_path / "o"), tmp_path / "o", option, "at least 1")


@case("cli", "`sarc compile --mode sampling --partition DIR` without `--fanouts`", "error")
def test_sampling_partition_without_fanouts(tmp_path, parts):
    refused(run_sarc("compile", SAGE, "--mode", "sampling", "--partition", parts, "--out",
                     tmp_path / "o"), tmp_path / "o", "--fanouts")


@case("cli", "`sarc compile --mode sampling --fanouts 10` for a two-layer model", "error")
def test_fanouts_for_another_number_of_layers(tmp_path, parts):
    refused(run_sarc("compile", SAGE, "--mode", "sampling", "--partition", parts, "--fanouts",
                     "10", "--out", tmp_path / "o"), tmp_path / "o", "1 fanout (10)",
            "2 graph layers")


def test_fanouts_that_start_with_a_minus_sign(tmp_path, parts):
    """``--fanouts -1,-1`` (every in-edge at every layer) is the fanouts, not an option
    argparse does not know; a wrong one is the fanouts' own error."""
    proc = run_sarc("compile", SAGE, "--mode", "sampling", "--fanouts", "-1,-1", "--partition",
                    parts, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    refused(run_sarc("compile", SAGE, "--mode", "sampling", "--fanouts", "-2,-1", "--out",
                     tmp_path / "p"), tmp_path / "p", "--fanouts -2,-1", ">= 0, or -1")


@case("cli", "`sarc compile models/hetero_sage.py --mode mfg --partition P --exec sar` (a "
      "HeteroConv's relations in schedules of their own on their edges of sampled blocks, "
      "which the blocks' statistics do not give)", "error")
@pytest.mark.parametrize("mode,option", [("mfg", ("--exec", "sar")),
                                         ("sampling", ("--baseline",))])
def test_compile_refuses_a_hetero_conv_in_sar_on_sampled_blocks(tmp_path, mode, option):
    out = tmp_path / "aifb"
    proc = run_sarc("partition", "--dataset", "aifb", "--parts", "2", "--method", "random",
                    "--out", out)
    assert proc.returncode == 0, proc.stderr
    fanouts = ["--fanouts", "5,5"] if mode == "sampling" else []
    refused(run_sarc("compile", ROOT / "models" / "hetero_sage.py", "--mode", mode,
                     "--partition", out, *fanouts, *option, "--out", tmp_path / "o"),
            tmp_path / "o", f"{mode} mode with --partition and {' '.join(option)}",
            "sarc.HeteroConv", "without --partition")


@case("cli", "`sarc compile models/hetero_sage.py --mode mfg --workers 2 --mem-budget 64MiB`, "
      "which the workers of `sarc train` refuse (a budget shared over a step's blocks does not "
      "price a HeteroConv's relations)", "error")
@pytest.mark.parametrize("mode", ["mfg", "sampling"])
def test_compile_refuses_a_budget_the_workers_refuse(tmp_path, mode):
    fanouts = ["--fanouts", "5,5"] if mode == "sampling" else []
    refused(run_sarc("compile", ROOT / "models" / "hetero_sage.py", "--mode", mode,
                     "--workers", "2", *fanouts, "--mem-budget", "64MiB", "--out", tmp_path / "o"),
            tmp_path / "o", "--mem-budget in a mini-batch mode", "sarc.HeteroConv")


SOURCE_IN_DEGREE = '''
import sarc
import torch.nn.functional as F
from torch import nn

HPARAMS = {"weight_decay": 0.0}


class Scaled(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h) * src.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class Net(nn.Module):
    def __init__(self, f, c):
        super().__init__()
        self.conv = Scaled(f, c)

    def forward(self, g, x):
        return self.conv(g, x)


class Deep(nn.Module):
    def __init__(self, f, c):
        super().__init__()
        self.conv1, self.conv2 = Scaled(f, 8), Scaled(8, c)

    def forward(self, g, x):
        return self.conv2(g, F.relu(self.conv1(g, x)))


def build_model(in_feats, num_classes, **_):
    return Deep(in_feats, num_classes)
'''


@pytest.mark.parametrize("workers", [1, 2])
def test_a_source_in_degree_trains_in_mfg_mode_as_full_batch(tmp_path, workers):
    """``src.in_degree`` is the whole graph's in every mode: a step's blocks carry their
    sources' in-degrees (the input layer's block has sources that are no destination), so
    MFG training on every training node is full-batch training, on one process and on
    workers."""
    import json

    from sarc.loader import load_model_file
    from sarc.train import train

    model = tmp_path / "scaled.py"
    model.write_text(SOURCE_IN_DEGREE)
    want = train(load_model_file(model), "cora", epochs=3, log=None)
    out = tmp_path / "mfg.json"
    proc = run_sarc("train", model, "--mode", "mfg", "--epochs", "3", *on_workers(workers),
                    "--json", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["mode"] == "mfg" and got["workers"] == workers
    assert abs(got["final_loss"] - want["final_loss"]) <= 1e-5 * want["final_loss"], \
        (got["final_loss"], want["final_loss"])


TWICE = (SOURCE_IN_DEGREE
         .replace(" * src.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)", "")
         .replace("self.conv = Scaled(f, c)", "self.conv, self.out = Scaled(f, f), nn.Linear(f, c)")
         .replace("return self.conv(g, x)", "return self.out(self.conv(g, self.conv(g, x)))")
         .replace("return Deep(in_feats, num_classes)", "return Net(in_feats, num_classes)"))

TWICE_LINE = next(k for k, line in enumerate(TWICE.splitlines(), 1)
                  if "self.conv(g, self.conv(g, x))" in line)
"""The model file's line that calls the layer twice."""


@case("cli", "`sarc compile --mode mfg` of a model calling its one sarc layer twice (a step "
      "has a block per layer)", "error")
def test_compile_refuses_a_layer_called_twice_in_a_minibatch_mode(tmp_path):
    """sarc train refused it at the first step; compile planned two calls."""
    model = tmp_path / "twice.py"
    model.write_text(TWICE)
    assert "src.in_degree" not in TWICE and "self.conv(g, self.conv(g, x))" in TWICE
    err = refused(run_sarc("compile", model, "--mode", "mfg", "--out", tmp_path / "o"),
                  tmp_path / "o", f"twice.py:{TWICE_LINE} (in forward): the forward calls the "
                                  f"sarc layer conv again: in mfg mode a step has a block per "
                                  f"sarc layer")
    assert "self.conv(g, self.conv(g, x))" in err, err


@case("cli", "`sarc train --mode mfg` of a model calling its one sarc layer twice: the call's "
      "line", "error")
@pytest.mark.parametrize("workers", [1, 2])
def test_train_names_the_line_that_calls_a_layer_again_in_a_minibatch_mode(tmp_path, workers):
    """The refusal counted the calls, but named neither the layer nor the line."""
    model = tmp_path / "twice.py"
    model.write_text(TWICE)
    proc = run_sarc("train", model, "--mode", "mfg", "--epochs", "1", *on_workers(workers))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"twice.py:{TWICE_LINE} (in forward): the forward calls the sarc layer conv " \
        f"again: in mfg and sampling modes a step has a block per sarc layer" in \
        proc.stderr, proc.stderr[-2000:]


UNCALLED = (SOURCE_IN_DEGREE
            .replace("self.conv = Scaled(f, c)", "self.conv, self.spare = Scaled(f, c), Scaled(c, c)")
            .replace("return Deep(in_feats, num_classes)", "return Net(in_feats, num_classes)"))


@case("cli", "`sarc train --mode mfg` / `sarc compile --mode mfg` of a model with a sarc layer "
      "its forward never calls", "error")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_sarc_layer_never_called_is_named(tmp_path, workers):
    """The refusal counted the blocks, but did not say which layer the forward left out."""
    model = tmp_path / "uncalled.py"
    model.write_text(UNCALLED)
    assert "self.spare" in UNCALLED and "return Net(" in UNCALLED
    proc = run_sarc("train", model, "--mode", "mfg", "--epochs", "1", *on_workers(workers))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "it never called spare: remove the sarc layers a forward pass does not call" in \
        proc.stderr, proc.stderr[-2000:]
    if workers == 1:
        refused(run_sarc("compile", model, "--mode", "mfg", "--out", tmp_path / "o"),
                tmp_path / "o", "made 1 sarc layer call in one forward pass, but it has 2 sarc "
                                "layers", "it never called spare")
