"""benchmarks/gpu.py on the CPU: its options, its tables, its exit without a GPU, and one
dry run of every cell on a tiny graph (Triton's interpreter for the Triton column, wall
time for CUDA events) that checks the bytes it divides by are the cost model's."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load_gpu_benchmark():
    """benchmarks/gpu.py as a module, without benchmarks/ on sys.path: its scripts'
    names (distributed.py, sampling.py) would hide the test packages of the same names
    from every later test of this process."""
    spec = importlib.util.spec_from_file_location("benchmark_gpu", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu = _load_gpu_benchmark()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: it would run")
@pytest.mark.parametrize("script", ["gpu.py", "gpu_startup.py", "gpu_profile.py",
                                    "gpu_schedule.py"])
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path, script):
    out = tmp_path / "gpu.json"
    argv = ["--json", str(out)] if script != "gpu_profile.py" else []
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "No CUDA GPU on this machine" in proc.stdout
    assert not out.exists()


@pytest.mark.parametrize("text,want", [("100k/2M", (100_000, 2_000_000)),
                                       ("233k/114M", (233_000, 114_000_000)),
                                       ("1.5k/20000", (1_500, 20_000)),
                                       ("1G/3g", (10**9, 3 * 10**9))])
def test_sizes_parse(text, want):
    assert gpu.parse_size(text) == want
    assert gpu.parse_size(gpu.size_label(*want)) == want


def test_size_list_and_labels():
    args = gpu.parse_args(["--sizes", "100k/2M, 1M/40M", "--layers", "GAT,RGCN"])
    assert args.sizes == [(100_000, 2_000_000), (1_000_000, 40_000_000)]
    assert [gpu.size_label(*s) for s in args.sizes] == ["100k/2M", "1M/40M"]
    assert args.layers == ["GAT", "RGCN"]
    assert gpu.parse_args([]).epoch_size == (233_000, 114_000_000)


@pytest.mark.parametrize("argv,message", [
    (["--sizes", "100k"], "is not NODES/EDGES"),
    (["--sizes", "100q/2M"], "is not a count"),
    (["--layers", "GCN,GIN"], "unknown GIN"),
    (["--repeat", "0"], "--repeat must be >= 1"),
])
def test_bad_options_are_errors_that_name_them(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gpu.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_markdown_table():
    assert gpu.md_table(["a", "long b"], [[1, "x"], ["wide cell", ""]]) == (
        "| a         | long b |\n"
        "| --------- | ------ |\n"
        "| 1         | x      |\n"
        "| wide cell |        |")


def test_peak_bandwidth_by_device_name():
    assert gpu.peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert gpu.peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert gpu.peak_bandwidth("NVIDIA H200") == 4.8e12
    assert gpu.peak_bandwidth("Some Future GPU") is None


def test_layer_table_goals():
    """Triton's time over the best peer that ran (an OOM peer is no peer); each fused
    kernel's bandwidth and share of the peak, blank without a known peak."""
    cells = [gpu.Cell("1M/40M", "GCN", "sarc triton", "ok", 10.0, 512.0),
             gpu.Cell("1M/40M", "GCN", "sarc torch", "ok", 30.0, 2048.0),
             gpu.Cell("1M/40M", "GCN", "PyG", "ok", 20.0, 1024.0, path="CSR"),
             gpu.Cell("1M/40M", "GCN", "DGL", "OOM"),
             gpu.Cell("1M/40M", "GAT", "sarc triton", "error", note="boom"),
             gpu.Cell("1M/40M", "GAT", "PyG", "ok", 5.0, 1.0),
             gpu.Cell("1M/40M", "GAT", "DGL", "n/a")]
    kernels = [gpu.KernelBandwidth("1M/40M", "GCN", "%9 aggregate", 1_000_000_000, 1.0, "op")]
    head, rows = gpu.layer_rows(cells, kernels, 3.35e12)
    assert head == ["size", "layer", "sarc triton", "sarc torch", "PyG", "DGL",
                    "triton / best peer", "fused kernels: bandwidth (of peak)"]
    assert rows[0] == ["1M/40M", "GCN", "10.00 ms, 512 MiB", "30.00 ms, 2048 MiB",
                       "20.00 ms, 1024 MiB (CSR)", "OOM", "0.50x", "%9 aggregate 1000 GB/s (30%)"]
    assert rows[1] == ["1M/40M", "GAT", "error", "", "5.00 ms, 1 MiB", "n/a", "", ""]
    _, rows = gpu.layer_rows(cells, kernels, None)
    assert rows[0][-1] == "%9 aggregate 1000 GB/s"
    _, krows = gpu.kernel_rows(kernels, None)
    assert krows == [["1M/40M", "GCN", "%9 aggregate", "953.7 MiB", "1.000 ms", "1000 GB/s", "",
                      "events around the op"]]


DRY_RUN = """
import sys, torch
sys.path.insert(0, "benchmarks")
import gpu
args = gpu.parse_args(sys.argv[1:])
gpu.run(args, torch.device("cpu"), "cpu")
"""


def test_dry_run_of_every_cell_on_the_cpu(tmp_path):
    """Each layer in every implementation that imports, the per-op bandwidth rows, the
    epoch and the JSON, on a 40-node graph; the bytes are ``fused_traffic`` at its size.
    A process of its own: Triton's interpreter must be on before Triton is imported."""
    from sarc.backends import triton_backend
    try:
        triton_backend.check_triton()
        has_triton = True
    except triton_backend.TritonUnavailable:
        has_triton = False
    out = tmp_path / "gpu.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", DRY_RUN, "--sizes", "40/160", "--layers", "GCN,GAT1x7,RGCN",
         "--feats", "8", "--rels", "3", "--repeat", "1", "--warmup", "0",
         "--epoch-size", "40/160", "--epoch-feats", "6", "--epoch-classes", "3",
         "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads(out.read_text())
    cells = {(c["layer"], c["impl"]): c for c in saved["cells"]}
    assert sorted({c["layer"] for c in saved["cells"]}) == ["GAT1x7", "GCN", "RGCN"]
    pyg_ok = gpu.importable("torch_geometric") is None
    for layer in ("GCN", "GAT1x7", "RGCN"):
        assert cells[layer, "sarc torch"]["status"] == "ok" and cells[layer, "sarc torch"]["time_ms"] > 0
        assert cells[layer, "sarc triton"]["status"] == ("ok" if has_triton else "error")
        assert cells[layer, "PyG"]["status"] == ("ok" if pyg_ok else "n/a")
        assert cells[layer, "DGL"]["status"] == ("ok" if gpu.importable("dgl") is None else "n/a")
    if pyg_ok:
        assert cells["GCN", "PyG"]["path"] in ("SparseTensor", "CSR")
    assert [(c["impl"], c["status"]) for c in saved["epoch"]] == [
        ("sarc triton", "ok" if has_triton else "error"), ("sarc torch", "ok")]

    if has_triton:
        from gat import GATLayer
        from gcn import GCNLayer
        from rgcn import RGCNLayer

        from sarc.compiler import compile_layer
        from sarc.ir.types import E, N_DST, N_SRC
        from sarc.planner.cost import fused_traffic
        want = set()
        for name, layer in (("GCN", GCNLayer(8, 8)), ("GAT1x7", GATLayer(8, 7, heads=1)),
                            ("RGCN", RGCNLayer(8, 8, 3))):
            fn = compile_layer(layer, "triton", through="optimize").optimized  # the kernel's IR
            for t in fused_traffic(fn):
                want.add((name, int(t.fused.subs({N_SRC: 40, N_DST: 40, E: 160}))))
        got = {(k["layer"], k["predicted_bytes"]) for k in saved["kernels"]}
        assert got == want
        assert all(k["scope"] == "op" and k["time_ms"] > 0 for k in saved["kernels"])
    else:
        assert saved["kernels"] == []
    assert saved["device"] == "cpu" and saved["peak_bandwidth_bytes_per_s"] is None
    assert [c.strip() for c in saved["tables"]["layers"].splitlines()[0].split("|")[1:3]] == ["size", "layer"]
    assert "epoch" in saved["tables"]


STARTUP_AND_PROFILE = """
import sys
sys.path.insert(0, "benchmarks")
import json, gpu_profile, gpu_startup
backend = sys.argv[1]
print(json.dumps(gpu_startup.measure("GCN", "60/240", 1, device="cpu", feats=4, backend=backend)))
print(gpu_profile.profile("GCN", "60/240", backend, 1, 5, 4, device="cpu"))
"""


def test_startup_and_profile_measure_a_layer_on_the_cpu():
    """benchmarks/gpu_startup.py's and gpu_profile.py's measurements, on the CPU (Triton's
    interpreter where this Triton runs sarc's kernels, else the PyTorch backend): the first
    step and a steady one timed, the profiler's table printed."""
    from sarc.backends import triton_backend
    try:
        triton_backend.check_triton()
        backend = "triton"
    except triton_backend.TritonUnavailable:
        backend = "torch"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", STARTUP_AND_PROFILE, backend], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, rest = proc.stdout.split("\n", 1)
    times = json.loads(first)
    assert times["first_s"] > 0 and times["steady_s"] > 0
    assert f"## GCN on {backend}, 60/240, 4 features:" in rest
    assert "(no GPU: host time only)" in rest
    if backend == "triton":
        assert "_FusedFunction" in rest  # the fused op's autograd Function, by the profiler
    else:
        assert "aten::" in rest


SCHEDULES = """
import sys
sys.path.insert(0, "benchmarks")
import json, gpu_schedule
schedules = gpu_schedule.parse_schedules(sys.argv[2])
rows = {name: gpu_schedule.measure(name, "40/300", schedules, 1, device="cpu", feats=4,
                                   backend=sys.argv[1], warmup=0) for name in ("GCN", "GAT1x7")}
print(json.dumps(rows))
"""


def test_every_row_schedule_computes_the_same_layer_with_its_own_launches():
    """benchmarks/gpu_schedule.py under Triton's interpreter: the default schedule, one
    launch per kernel (one bucket, no split), and small buckets with short segments give
    the same output; the launch counts follow the schedule."""
    from sarc.backends import triton_backend
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as err:
        pytest.skip(f"the Triton backend is unavailable here: {err}")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCHEDULES, "triton",
                           "16,64,256:1024 :none 1,2,4:8"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, by in rows.items():
        assert [r["schedule"] for r in by] == ["16,64,256:1024", ":none", "1,2,4:8"]
        for r in by:
            assert r["max_diff"] < 1e-4, (name, r)
            assert r["step_s"] > 0
        one, many = by[1]["launches"], by[2]["launches"]
        assert 0 < one < many, (name, by)


BAD_SCHEDULES = """
import argparse, sys
sys.path.insert(0, "benchmarks")
import gpu_schedule
for text in ("16,64", "a:1", "16:0", ":-1", ""):
    try:
        gpu_schedule.parse_schedules(text)
    except argparse.ArgumentTypeError as err:
        print(err)
    else:
        print("accepted", repr(text))
"""


def test_a_bad_schedule_is_an_error_naming_the_option():
    """(In a process of its own: benchmarks/gpu.py, which gpu_schedule imports as ``gpu``,
    would shadow the tests/gpu package here.)"""
    proc = subprocess.run([sys.executable, "-c", BAD_SCHEDULES], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 5 and all(line.startswith("--schedules: ") for line in lines), lines


def test_loading_the_benchmark_leaves_the_test_packages_importable():
    """A test file's imports are every later test's in the same process (pytest-xdist runs
    many files per worker): benchmarks/distributed.py must not stand for tests/distributed."""
    import distributed
    import sampling
    assert str(ROOT / "benchmarks") not in sys.path
    assert Path(distributed.__file__) == ROOT / "tests" / "distributed" / "__init__.py"
    assert Path(sampling.__file__).parent == ROOT / "tests" / "sampling"


@pytest.mark.parametrize("script", ["gpu_startup.py", "gpu_profile.py"])
@pytest.mark.parametrize("argv,message", [(["--layers", "GCN,GIN"], "unknown GIN"),
                                          (["--size", "100k"], "is not NODES/EDGES")])
def test_bad_options_of_the_startup_and_profile_scripts_name_them(script, argv, message):
    """Refused before anything runs (with or without a GPU), with the option named."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and ("--layers" if "--layers" in argv else "--size") in proc.stderr
