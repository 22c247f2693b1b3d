"""What a worker holds besides its shard: a CPU worker on the torch backend imports no
compiler it does not run, its optimizer is torch's Adam step for step, and its report
splits its peak memory into the fixed part (the runtime) and its data's.

The worker runs for real: two processes, each ``sarc.cli.worker``'s ``run`` as torchrun
starts it (its environment, gloo on 127.0.0.1), on a small partitioned graph with GAT
(an edge softmax: the most code a schedule runs). What each imported is compared with
what ``import torch`` alone imports in the same process, as sarc answers only for the
rest. A worker does use sympy (the planner's cost formulas) and jinja2 (the schedules it
generates), so those two are not on the list.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sarc.partition import partition_graph
from sarc.training.optim import EagerAdam

from .harness import free_port

ROOT = Path(__file__).resolve().parents[2]

UNUSED = ("torch._dynamo", "torch._inductor", "triton", "sarc.backends.triton_backend")
"""Torch's compiler (torch.optim's optimizers import torch._dynamo on first use, and it
imports the rest: ~110 MiB per process with torch 2.13) and the Triton backend, which a
torch-backend run does not build."""

WORKER = r"""
import argparse, json, os, sys
import torch
at_import_torch = set(sys.modules)
from sarc.cli.worker import add_worker_arguments, run
parser = argparse.ArgumentParser()
add_worker_arguments(parser)
code = run(parser.parse_args(sys.argv[2:]))
unused = json.loads(sys.argv[1])
print("MODULES " + json.dumps({
    "code": code,
    "by_torch": sorted(m for m in unused if m in at_import_torch),
    "by_sarc": sorted(m for m in unused if m in sys.modules and m not in at_import_torch)}),
    flush=True)
os._exit(0)
"""


def _parts(path: Path, parts: int, n: int = 80):
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (400,), generator=gen), torch.randint(0, n, (400,), generator=gen)
    node_data = {"feat": torch.rand(n, 6, generator=gen),
                 "label": torch.randint(0, 3, (n,), generator=gen),
                 "train_mask": torch.rand(n, generator=gen) < 0.6,
                 "val_mask": torch.zeros(n, dtype=torch.bool),
                 "test_mask": torch.zeros(n, dtype=torch.bool)}
    return partition_graph(src, dst, n, parts, path, method="random", node_data=node_data, seed=0)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Two CPU workers' runs of GAT: (what each printed, the run's --json report, TMPDIR)."""
    tmp = tmp_path_factory.mktemp("footprint")
    pset = _parts(tmp / "parts", 2)
    report = tmp / "report.json"
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", WORKER, json.dumps(UNUSED), str(ROOT / "models" / "gat.py"),
            "--partition", str(pset.path), "--epochs", "2", "--threads", "1",
            "--timeout", "60", "--json", str(report)]
    procs = [subprocess.Popen(argv, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        lines = [l for l in out.splitlines() if l.startswith("MODULES ")]
        assert p.returncode == 0 and lines, out[-2000:] + err[-4000:]
        outs.append(json.loads(lines[-1][len("MODULES "):]))
    return outs, json.loads(report.read_text()), tmp


def test_a_cpu_worker_imports_no_compiler(two_workers):
    outs, _, tmp = two_workers
    for rank, out in enumerate(outs):
        assert out["code"] == 0
        assert out["by_sarc"] == [], f"worker {rank} imported {out['by_sarc']}"
    # torch._inductor makes its cache directory as it is imported
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("torchinductor_")]


def test_the_report_splits_each_workers_peak_into_fixed_and_data(two_workers):
    _, report, _ = two_workers
    workers = report["per_worker"]
    assert [w["rank"] for w in workers] == [0, 1]
    for w in workers:
        # the runtime alone is tens of MiB (torch); the shard and its run add to it
        assert w["fixed_rss"] > 2**25 and w["data_rss"] > 0
        assert w["fixed_rss"] + w["data_rss"] == w["rss_peak"]


def _torch_and_eager(weight_decay: float):
    gen = torch.Generator().manual_seed(1)
    start = [torch.randn(7, 5, generator=gen), torch.randn(5, generator=gen),
             torch.randn(3, 2, generator=gen)]
    grads = [[torch.randn(t.shape, generator=gen) for t in start] for _ in range(6)]
    runs = []
    for make in (torch.optim.Adam, EagerAdam):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = make(params, lr=0.01, weight_decay=weight_decay)
        for k, step in enumerate(grads):
            opt.zero_grad()
            for p, g in zip(params, step):
                if not (k == 2 and p is params[2]):  # a parameter without a gradient
                    p.grad = g.clone()
            opt.step()
        runs.append((params, opt))
    return runs


@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
def test_eager_adam_is_torchs_adam_bit_for_bit(weight_decay):
    (p_torch, o_torch), (p_eager, o_eager) = _torch_and_eager(weight_decay)
    for a, b in zip(p_torch, p_eager):
        assert torch.equal(a, b)
    s_torch, s_eager = o_torch.state_dict(), o_eager.state_dict()
    assert s_torch["param_groups"] == s_eager["param_groups"]
    for i, state in s_torch["state"].items():
        assert state.keys() == s_eager["state"][i].keys()
        for k, t in state.items():
            assert torch.equal(t, s_eager["state"][i][k]), (i, k)


def test_eager_adam_and_torchs_adam_resume_from_each_others_state():
    """A checkpoint of ``sarc train`` (torch's Adam) resumes on workers (``EagerAdam``), and
    back: the next step is the one the saved optimizer takes."""
    runs = _torch_and_eager(5e-4)
    for (params, opt), other in zip(runs, (EagerAdam, torch.optim.Adam)):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        resumed = other(copies, lr=0.01, weight_decay=5e-4)
        resumed.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from a file
        for o, ps in ((opt, params), (resumed, copies)):
            for p in ps:
                p.grad = torch.full_like(p, 0.5)
            o.step()
        for a, b in zip(params, copies):
            assert torch.equal(a, b)


@pytest.mark.parametrize("option", [{"amsgrad": True}, {"maximize": True},
                                    {"foreach": True}])
def test_eager_adam_refuses_what_it_does_not_implement(option):
    p = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=next(iter(option))):
        EagerAdam([p], lr=0.1, **option)
