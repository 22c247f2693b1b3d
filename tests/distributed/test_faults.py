"""Bad input and faults: every worker stops with a clear error, nothing hangs, nothing is
left half-written.

World size different from the number of parts, parts of different graphs, missing or
corrupt part files, a worker that dies mid-training: checked on real worker processes
(forked, gloo on 127.0.0.1, short timeouts), and through ``sarc train`` (torchrun).
"""
from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sarc.cli import main as sarc_main
from sarc.partition import partition_graph

from .harness import spawn

pytestmark = pytest.mark.once   # end to end, DGL-free: the main environment's run (Makefile)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = datetime.timedelta(seconds=15)


def _graph_parts(path: Path, parts: int, seed: int = 0, n: int = 60):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (300,), generator=gen), torch.randint(0, n, (300,), generator=gen)
    node_data = {"feat": torch.randn(n, 5, generator=gen), "label": torch.randint(0, 3, (n,), generator=gen),
                 "train_mask": torch.ones(n, dtype=torch.bool), "val_mask": torch.zeros(n, dtype=torch.bool),
                 "test_mask": torch.zeros(n, dtype=torch.bool)}
    return partition_graph(src, dst, n, parts, path, method="random", node_data=node_data, seed=seed)


def _load(rank, port, q, world, paths):
    """Join a group of ``world`` and load this rank's shard of ``paths[rank]``."""
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=TIMEOUT)
        from sarc.distributed.train import load_shard
        load_shard(paths[rank])
        q.put((rank, "ok"))
    except Exception as e:
        q.put((rank, f"{type(e).__name__}: {e}"))


def test_world_size_must_be_the_number_of_parts(tmp_path):
    pset = _graph_parts(tmp_path / "p3", 3)
    codes, reports = spawn(_load, 2, (2, [str(pset.path)] * 2))
    for r in reports:
        assert r.startswith("DistError") and "has 3 parts but 2 workers" in r


def test_parts_of_different_graphs_are_refused(tmp_path):
    a, b = _graph_parts(tmp_path / "a", 2, seed=0), _graph_parts(tmp_path / "b", 2, seed=1)
    codes, reports = spawn(_load, 2, (2, [str(a.path), str(b.path)]))
    for r in reports:
        assert r.startswith("DistError") and "different partition sets" in r


def test_a_corrupt_part_stops_every_worker(tmp_path):
    pset = _graph_parts(tmp_path / "p", 2)
    part1 = pset.part_path(1)
    data = bytearray(part1.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part1.write_bytes(bytes(data))
    codes, reports = spawn(_load, 2, (2, [str(pset.path)] * 2))
    assert reports[1].startswith("DistError") and "corrupt" in reports[1]
    assert reports[0].startswith("DistError") and reports[0].startswith("DistError: worker 1:")


def test_a_missing_part_stops_every_worker(tmp_path):
    pset = _graph_parts(tmp_path / "p", 2)
    pset.part_path(0).unlink()
    codes, reports = spawn(_load, 2, (2, [str(pset.path)] * 2))
    for r in reports:
        assert r.startswith("DistError") and "part-0.pt is missing" in r


def _train_and_die(rank, port, q, path, die_at):
    """Train a GCN; worker 1 dies (os._exit) at step ``die_at`` after its backward pass, so
    the others meet the loss in an exchange or in the gradient all-reduce."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=3, timeout=TIMEOUT)
        sys.path.insert(0, str(ROOT / "models"))
        from gcn import build_model
        from sarc.distributed import DistGraph, allreduce_gradients
        from sarc.distributed.train import load_shard
        shard = load_shard(path)
        dg = DistGraph(shard, timeout=TIMEOUT)
        torch.manual_seed(0)
        model = build_model(5, 3, dropout=0.0)
        for step in range(100):
            model(dg, shard.ndata["feat"]).sum().backward()
            if rank == 1 and step == die_at:
                os._exit(3)
            allreduce_gradients(model)
        q.put((rank, "finished"))
    except Exception as e:
        q.put((rank, f"{type(e).__name__}: {e}"))


@pytest.mark.parametrize("die_at", [0, 3])
def test_a_dying_worker_stops_the_others(tmp_path, die_at):
    pset = _graph_parts(tmp_path / "p", 3)
    t0 = time.monotonic()
    codes, reports = spawn(_train_and_die, 3, (str(pset.path), die_at), timeout_s=40)
    assert codes[1] == 3
    for r in (0, 2):
        assert reports[r] is not None and reports[r] != "finished", reports
        assert "Connection" in reports[r] or "worker" in reports[r], reports[r]
    assert time.monotonic() - t0 < 30


# --- through the command line --------------------------------------------------------------

def _cli(argv, capsys):
    code = sarc_main(argv)
    return code, capsys.readouterr()


def test_sarc_train_checks_the_partition_before_launching(tmp_path, capsys):
    pset = _graph_parts(tmp_path / "p3", 3)
    code, out = _cli(["train", str(ROOT / "models/gcn.py"), "--workers", "2", "--partition",
                      str(pset.path)], capsys)
    assert code == 2 and "has 3 parts but --workers is 2" in out.err
    data = bytearray(pset.part_path(2).read_bytes())
    data[-10] ^= 0xFF
    pset.part_path(2).write_bytes(bytes(data))
    code, out = _cli(["train", str(ROOT / "models/gcn.py"), "--workers", "3", "--partition",
                      str(pset.path)], capsys)
    assert code == 2 and "corrupt" in out.err


def test_sarc_worker_outside_torchrun_says_so(tmp_path, capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    from sarc.cli import build_parser
    from sarc.cli.worker import run
    from sarc.distributed.worker import run_guarded
    args = build_parser().parse_args(["worker", str(ROOT / "models/gcn.py"), "--partition", str(tmp_path)])
    assert run_guarded(lambda: run(args)) == 2
    assert "runs under torchrun" in capsys.readouterr().err


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_sarc_train_stops_when_a_worker_is_killed(tmp_path, sig):
    """Kill one of the workers torchrun started: sarc train exits with an error within the
    timeout, no process is left, the temporary partition and the result file are not left
    half-written. SIGINT is said in a line (it was a KeyboardInterrupt traceback, and
    reported as SIGTERM)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    result = tmp_path / "result.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sarc.cli", "train", str(ROOT / "models/gcn.py"), "--dataset", "cora",
         "--workers", "3", "--method", "random", "--epochs", "100000", "--timeout", "20",
         "--json", str(result)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("epoch    3/"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        cmdlines = {p: Path(f"/proc/{p}/cmdline").read_bytes() for p in _descendants(proc.pid)}
        workers = [p for p, c in cmdlines.items()
                   if b"sarc.cli.worker" in c and b"sarc.distributed.agent" not in c]
        assert len(workers) == 3, workers
        t0 = time.monotonic()
        os.kill(workers[1], sig)
        rest = proc.communicate(timeout=60)[0]
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(lines) + rest
    assert proc.returncode == 2, output[-3000:]
    assert "distributed training failed" in output
    if sig == signal.SIGINT:
        assert "was interrupted (SIGINT)" in output and "Traceback" not in output, output[-3000:]
    assert elapsed < 45
    assert not any(Path(f"/proc/{p}").exists() for p in workers if p != workers[1])
    assert not result.exists()
    assert not list(tmp_path.glob("sarc-train-*"))


def _bad_rows(rank, port, q, path):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=1, timeout=TIMEOUT)
        sys.path.insert(0, str(ROOT / "models"))
        from gcn import GCNLayer
        from sarc.distributed import DistGraph
        from sarc.distributed.train import load_shard
        dg = DistGraph(load_shard(path), timeout=TIMEOUT)
        GCNLayer(5, 3)(dg, torch.randn(dg.num_local + 1, 5))
        q.put((rank, "no error"))
    except Exception as e:
        q.put((rank, f"{type(e).__name__}: {e}"))


def test_a_layer_on_a_dist_graph_checks_its_features(tmp_path):
    pset = _graph_parts(tmp_path / "p1", 1)
    codes, reports = spawn(_bad_rows, 1, (str(pset.path),))
    assert reports[0].startswith("GraphError") and "61 rows but the graph has 60 local nodes" in reports[0]


def _graph_attributes(rank, port, q, path):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=1, timeout=TIMEOUT)
        from sarc.distributed import DistGraph
        from sarc.distributed.train import load_shard
        dg = DistGraph(load_shard(path), timeout=TIMEOUT)
        try:
            dg.src
            src = "no error"
        except Exception as e:
            src = f"{type(e).__name__}: {e}"
        q.put((rank, (dg.num_src, dg.num_local, src, hasattr(dg, "src"))))
    except Exception as e:
        q.put((rank, f"{type(e).__name__}: {e}"))


def test_a_dist_graph_has_num_src_and_says_why_it_has_no_src(tmp_path):
    pset = _graph_parts(tmp_path / "p1", 1)
    codes, reports = spawn(_graph_attributes, 1, (str(pset.path),))
    assert isinstance(reports[0], tuple), reports[0]
    num_src, num_local, src, has_src = reports[0]
    assert not has_src
    assert num_src == num_local == 60
    assert src.startswith("GraphAttributeError: a DistGraph's edges read other workers' rows"), src
