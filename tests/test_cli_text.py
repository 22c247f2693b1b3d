"""What the ``sarc`` command prints and accepts, as a user reads it: ``python -m sarc``, one
line for a value not among an option's choices, the help's defaults, the batches ``sarc
compile`` plans for, counts in the singular, one final line of ``--task link``, the
resume refusal naming the mode, and README's GAT example as sarc compiles it."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sarc.checkpoint import run_differences
from sarc.training.minibatch import MiniBatchConfig
from sarc.training.progress import plural
from timeouts import run_or_show_stacks

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[1]


def sarc(*argv, module: str = "sarc.cli", ok: bool = True) -> subprocess.CompletedProcess:
    proc = run_or_show_stacks([sys.executable, "-m", module, *map(str, argv)], cwd=ROOT,
                              timeout=300, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    if ok:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def flat(text: str) -> str:
    """``text`` with argparse's line wrapping undone."""
    return " ".join(text.split())


def test_python_m_sarc_is_the_sarc_command():
    assert sarc("--version", module="sarc").stdout == sarc("--version").stdout
    assert "usage: sarc compile" in sarc("compile", "--help", module="sarc").stdout


@pytest.mark.parametrize("argv, option, value, choices", [
    (("compile", "models/gcn.py", "--exec", "sarr"), "--exec", "sarr", "sar, oneshot, hybrid"),
    (("compile", "models/gcn.py", "--backend", "cuda"), "--backend", "cuda", "torch, triton"),
    (("train", "models/gcn.py", "--task", "edge"), "--task", "edge", "node, link"),
    (("train", "models/gcn.py", "--method", "kway"), "--method", "kway", "metis, random"),
    (("train", "models/gcn.py", "--embedding-optimizer", "adam"), "--embedding-optimizer",
     "adam", "sparse_adam, sparse_adagrad"),
    (("partition", "--dataset", "cora", "--parts", "2", "--out", "x", "--method", "kway"),
     "--method", "kway", "metis, random"),
    (("worker", "models/gcn.py", "--partition", "x", "--exec", "all"), "--exec", "all",
     "sar, oneshot, hybrid"),
    (("frob",), "COMMAND", "frob", "train, compile, partition, worker"),
])
def test_a_value_not_among_the_choices_is_one_line(argv, option, value, choices):
    proc = sarc(*argv, ok=False)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and "usage:" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("sarc"), proc.stderr
    assert f"{option} must be one of {choices}, got '{value}'" in proc.stderr, proc.stderr


def test_the_worker_module_refuses_a_choice_in_one_line():
    proc = sarc("models/gcn.py", "--partition", "x", "--backend", "jax", ok=False,
                module="sarc.cli.worker")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--backend must be one of torch, triton, got 'jax'" in proc.stderr


def test_help_gives_the_defaults_and_the_budget_it_bounds():
    compile_help = flat(sarc("compile", "--help").stdout)
    assert "(default: all four, ir,plan,kernels,schedule)" in compile_help
    assert "--workers P the workers to plan for (default 1" in compile_help
    assert "--backend {torch,triton} the kernels every sarc layer is compiled to" in compile_help
    assert "1024" not in compile_help
    assert "default, as sarc train's: all of them, one step per epoch" in compile_help
    worker_help = flat(sarc("worker", "--help").stdout)
    assert "(one process)" not in worker_help
    assert "the GPU of its LOCAL_RANK" in worker_help
    for text in (compile_help, worker_help, flat(sarc("train", "--help").stdout)):
        assert "memory per worker for kept remote rows" not in text
        assert ("--mem-budget SIZE per worker, the most one training step keeps for its "
                "backward pass, all layers together") in text
    readme = flat((ROOT / "README.md").read_text())
    assert "it bounds what one step keeps for its backward pass, all layers together" in readme


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory):
    out = tmp_path_factory.mktemp("parts") / "cora2"
    sarc("partition", "--dataset", "cora", "--parts", "2", "--method", "random", "--out", out)
    return out


def _minibatch_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("  minibatch:"))


def test_compile_plans_the_batch_sarc_train_takes_by_default(cora_parts):
    """sarc train's default batch: every labeled training seed (Cora: 140), one step."""
    symbolic = sarc("compile", "models/sage.py", "--mode", "mfg", "--emit", "plan").stdout
    assert _minibatch_line(symbolic).startswith("  minibatch: 140 seeds / step"), symbolic
    measured = sarc("compile", "models/sage.py", "--mode", "sampling", "--fanouts", "10,25",
                    "--partition", cora_parts, "--emit", "plan").stdout
    line = _minibatch_line(measured)
    assert line.startswith("  minibatch: 140 seeds / step"), line
    assert "block sizes from 1 sampled batch (" in line, line
    assert "asked for more" not in measured  # --batches not given


def test_compile_says_when_an_epoch_has_fewer_batches_than_asked(cora_parts):
    out = sarc("compile", "models/sage.py", "--mode", "sampling", "--fanouts", "10,25",
               "--batch-size", "256", "--batches", "8", "--partition", cora_parts,
               "--emit", "plan").stdout
    assert "minibatch: 1 sampled batch (an epoch has 1; --batches 8 asked for more)" in out
    assert "from 1 sampled batch (" in _minibatch_line(out)
    five = sarc("compile", "models/sage.py", "--mode", "mfg", "--batch-size", "32",
                "--batches", "8", "--partition", cora_parts, "--emit", "plan").stdout
    assert "minibatch: 5 sampled batches (an epoch has 5; --batches 8 asked for more)" in five
    three = sarc("compile", "models/sage.py", "--mode", "mfg", "--batch-size", "32",
                 "--batches", "3", "--partition", cora_parts, "--emit", "plan").stdout
    assert "asked for more" not in three
    assert "from 3 sampled batches (" in _minibatch_line(three)


def test_plural():
    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
    assert plural(1, "sampled batch", "sampled batches") == "1 sampled batch"
    assert plural(3, "sampled batch", "sampled batches") == "3 sampled batches"


def test_train_counts_one_step_and_one_epoch_in_the_singular():
    out = sarc("train", "models/sage.py", "--mode", "mfg", "--epochs", "1").stdout
    assert "mfg mode: 1 step per epoch" in out, out
    assert re.search(r"\| 1 epoch in [\d.]+ s", out), out
    assert "1 steps" not in out and "1 epochs" not in out, out


def test_link_prediction_prints_its_result_once(tmp_path):
    out = sarc("train", "models/sage_lp.py", "--task", "link", "--epochs", "1",
               "--json", tmp_path / "r.json").stdout
    final = [line for line in out.splitlines() if "test mrr" in line and "epoch" in line
             and not line.startswith("epoch")]
    assert len(final) == 1 and final[0].startswith("selected epoch 1"), out
    assert json.loads((tmp_path / "r.json").read_text())["best_epoch"] == 1
    quiet = sarc("train", "models/sage_lp.py", "--task", "link", "--epochs", "1",
                 "--quiet").stdout
    assert quiet.splitlines() == [l for l in quiet.splitlines() if "link prediction)" in l]
    assert len(quiet.splitlines()) == 1, quiet


def _run(training: MiniBatchConfig | None, lr: float = 0.01) -> dict:
    hp = {"lr": lr}
    if training is not None:
        hp = training.recorded(hp)
    return {"model_sha256": "x", "model": "m.py", "hparams": json.dumps(hp, sort_keys=True),
            "seed": 0, "graph": "g", "dataset": "cora", "world_size": 1, "partition": ""}


def test_resume_names_the_mode_that_differs():
    diff = run_differences(_run(None), _run(MiniBatchConfig("mfg")))
    assert diff == ["the mode differs (--mode full in the checkpoint, --mode mfg now)"], diff
    diff = run_differences(_run(MiniBatchConfig("sampling", (5, 5))), _run(None))
    assert diff == ["the mode differs (--mode sampling in the checkpoint, --mode full now)"]
    diff = run_differences(_run(MiniBatchConfig("sampling", (10, 25), batch_size=64)),
                           _run(MiniBatchConfig("sampling", (5, 5), batch_size=64), lr=0.1))
    assert diff == ["the --mode sampling options differ (fanouts: (10, 25) in the checkpoint, "
                    "(5, 5) now)", "hyperparameters differ (lr: 0.01 in the checkpoint, 0.1 "
                    "now)"], diff
    assert run_differences(_run(MiniBatchConfig("mfg")), _run(MiniBatchConfig("mfg"))) == []


def test_readme_gat_example_is_what_sarc_compile_writes(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## What the compiler sees"):]
    command = re.search(r"`(sarc compile models/gat\.py [^`]*)`", section, re.S)[1].split()
    out = Path(command[command.index("--out") + 1])
    argv = [tmp_path / out if a == str(out) else a for a in command[2:]]
    printed = sarc("compile", *argv).stdout
    ir = (tmp_path / out / "conv2.ir").read_text().splitlines()
    shown = section[section.index("```\n") + 4:section.index("\n```", section.index("```\n"))]
    at = 0
    for line in shown.splitlines():
        if line.strip() == "...":
            continue
        assert line in ir[at:], (line, ir)
        at = ir.index(line, at) + 1
    fused = "softmax_aggregate" if "softmax_aggregate" in shown else "sddmm, aggregate"
    assert re.search(rf"conv2 +GATLayer +\d+ +\d+ +{fused} ", printed), printed


def test_a_closed_pipe_ends_the_command_quietly():
    """``sarc compile ... | head -1``: no BrokenPipeError traceback when the reader goes."""
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "sarc.cli", "compile", "models/gcn.py",
                             "--emit", "plan"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes after one line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) in (0, 141), err  # 0: it had written everything already
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_an_interrupt_while_the_parser_imports_the_subcommands_says_so(monkeypatch, capsys):
    """Ctrl-C in the first seconds (the subcommands' imports) printed a KeyboardInterrupt
    traceback; it is "interrupted", exit 130, as later."""
    import sarc.cli as cli

    def interrupted():
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["compile", "models/gcn.py"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_split_without_nodes_prints_a_dash_not_nan():
    """AIFB has no validation nodes: its accuracy there is NaN, which the progress lines
    printed as ``val nan``."""
    from sarc.training.loop import epoch_line, score
    line = epoch_line(3, 0.5, {"train": 0.5, "val": math.nan, "test": 0.25}, 0.012, of=4)
    assert line == "epoch    3/4 | loss 0.5000 | train 0.5000 val - test 0.2500 | 12 ms"
    assert score(0.125) == "0.1250" and score(math.nan) == "-"
