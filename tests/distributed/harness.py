"""Run many distributed cases in ONE group of real worker processes (gloo on 127.0.0.1).

The parent writes a plan of cases (model, state dict, partition directory, P, exec
mode, ...) and the single-process reference of each; ``run_cases`` forks
``WORLD`` workers once, which join one process group and run every case: a case
with P workers runs on a subgroup of ranks 0..P-1 (``new_group``), the others
wait for the next case. Each worker writes what it computed (its rows of the
output, of the input gradient, the summed parameter gradients, the loss, the
bytes its exchanges counted and the planner's prediction, and its point-to-point ops
in the order it posted them) to a file per case and rank; the tests compare them with the
reference.

A training step here: ``loss = sum of cross-entropies over the worker's training
nodes / the global number of training nodes``, backward, gradients all-reduced,
which must equal the single-process step (mean cross-entropy over the training
nodes). Dropout is off (p = 0, or eval mode for GAT's attention dropout) so the
two can be compared exactly.
"""
from __future__ import annotations

import datetime
import gc
import os
import socket
import time
import traceback
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

WORLD = 4
TIMEOUT_S = 60.0


@dataclass
class Case:
    name: str
    model: str                 # a key of MODELS
    parts: int
    method: str = "metis"
    exec_mode: str | None = None
    baseline: bool = False
    hybrid_budget: bool = False  # pick a memory budget that keeps some peers' rows, not all
    eval_mode: bool = False      # run the step in eval mode (dropout layers inactive)
    x_grad: bool = True          # the input features need a gradient (else only the params)
    chunk_rows: int | None = None  # rows per message (None: the default, whole blocks here)
    extra: dict = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step(model, g, x, label, mask, total, edge_inputs):
    """One training step's forward and backward: returns (logits, loss)."""
    logits = model(g, x, **edge_inputs)
    loss = F.cross_entropy(logits[mask], label[mask], reduction="sum") / total
    loss.backward()
    return logits, loss


def _budget(model, dg):
    """A memory budget under which the first layer keeps some remote rows but not all."""
    from sarc.compiler import optimize
    from sarc.planner.plan import plan_layer
    from sarc.dsl import Layer
    layer = next(m for m in model.modules() if isinstance(m, Layer))
    lp = plan_layer("probe", optimize(layer.trace()), workers=dg.size, stats=dg.stats,
                    exec_mode="sar")
    if lp.exchange is None:  # the layer reads no source rows: nothing to keep
        return max(lp.bytes_kept)
    bnd = dg.stats.boundary
    smallest = min(bnd[r][j] for r in range(dg.size) for j in range(dg.size)
                   if r != j and bnd[r][j] > 0)
    return max(lp.bytes_kept) + smallest * lp.exchange.row_bytes


CALLS: weakref.WeakSet = weakref.WeakSet()
"""This worker's layer calls (``schedule.Call``) still alive: with the collector off, what
reference counting alone has not freed (``_counting_calls``)."""


def _counting_calls() -> None:
    """Add every ``schedule.Call`` made in this worker to ``CALLS`` (a census of the heap
    per case, ``gc.get_objects``, took a fifth of the matrix's time)."""
    from sarc.distributed.schedule import Call
    made = Call.__init__

    def init(self, *args, **kw):
        made(self, *args, **kw)
        CALLS.add(self)
    Call.__init__ = init


P2P: list = []
"""This worker's point-to-point ops of the running case, in the order posted: (process
group, global peer, "send" / "recv", shape) (``_recording``)."""


def _recording(post, what: str):
    """``dist.isend`` / ``dist.irecv``, logging each op into ``P2P``."""
    def logged(tensor, peer, group=None, *args, **kw):
        from torch.distributed.distributed_c10d import _world
        name = "world" if group is None else _world.pg_names[group]
        P2P.append((name, int(peer), what, tuple(tensor.shape)))
        return post(tensor, peer, group, *args, **kw)
    return logged


def _run_case(case: Case, spec: dict, rank: int, group, out: Path) -> None:
    from sarc.distributed import DistGraph
    from sarc.distributed.train import allreduce_gradients
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph

    from .models import MODELS

    pset = load_partitions(spec["partition"], verify=False)
    shard = ShardedGraph.from_partitions(pset, rank)
    model = MODELS[case.model](*spec["model_args"])
    model.load_state_dict(spec["state"])
    if case.eval_mode:
        model.eval()
    chunking = {"chunk_rows": case.chunk_rows} if case.chunk_rows is not None else {}
    dg = DistGraph(shard, group, exec_mode=case.exec_mode, baseline=case.baseline,
                   timeout=datetime.timedelta(seconds=TIMEOUT_S), **chunking)
    if case.hybrid_budget:
        dg.mem_budget = _budget(model, dg)
    x = shard.ndata["feat"].clone().requires_grad_(case.x_grad)
    label, mask = shard.ndata["label"], shard.ndata["train_mask"]
    edge_inputs = {"etype": dg.edge_data("etype")} if spec["relational"] else {}
    P2P.clear()
    gc.disable()  # what reference counting alone frees (a cycle would wait for the collector)
    try:
        logits, loss = step(model, dg, x, label, mask, spec["num_train"], edge_inputs)
        counted = dg.counter.snapshot()
        allreduce_gradients(model, group)
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total, group=group)
        logits = logits.detach()  # the autograd graph goes: no layer call should outlive it
        del loss
        calls_alive = len(CALLS)
    finally:
        gc.enable()
    torch.save({
        "ids": shard.orig_node_ids, "logits": logits.detach(), "x_grad": x.grad,
        "param_grads": {k: p.grad for k, p in model.named_parameters()} if rank == 0 else None,
        "loss": float(total), "counted": counted, "calls_alive": calls_alive,
        "pieces": [len(p) for p in dg.pieces], "planned": dg.planned_bytes_sent(),
        "plans": [(p.name, p.plan.exec_mode, p.plan.kept_peers) for p in dg.training_programs.values()],
        "sources": [p.source for p in dg.training_programs.values()] if rank == 0 else None,
        "p2p": list(P2P), "global_rank": dist.get_rank(),
    }, out / f"{case.name}.r{rank}.pt")


def _worker(rank: int, world: int, port: int, plan_file: str, out_dir: str,
            run_timeout_s: float) -> None:
    torch.set_num_threads(1)
    out = Path(out_dir)
    # the world's collectives wait for whole runs of cases (a rank beyond a case's P waits
    # in the last barrier for every such case): the run's time limit, not a step's
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=run_timeout_s))
    from sarc.distributed.exchange import grads_group
    cases, specs = torch.load(plan_file, weights_only=False)
    dist.isend, dist.irecv = _recording(dist.isend, "send"), _recording(dist.irecv, "recv")
    _counting_calls()
    try:
        groups = {}
        for case in cases:
            if case.parts not in groups:  # collective over the world: every rank creates it
                groups[case.parts] = dist.new_group(list(range(case.parts)))
                grads_group(groups[case.parts], list(range(case.parts)))  # and its gradients
            if rank < case.parts:
                torch.manual_seed(0)
                _run_case(case, specs[case.name], rank, groups[case.parts], out)
        dist.barrier()
    except BaseException:
        (out / f"error.r{rank}.txt").write_text(traceback.format_exc())
        raise
    # The group is left by the forked process's exit, never destroyed (see _forked).


def run_cases(cases: list[Case], specs: dict, workdir: Path, timeout_s: float = 240.0) -> Path:
    """Run every case in one group of ``WORLD`` forked workers; returns the results folder."""
    out = workdir / "results"
    out.mkdir(parents=True, exist_ok=True)
    plan_file = workdir / "cases.pt"
    torch.save((cases, specs), plan_file)
    ctx = mp.start_processes(_worker, nprocs=WORLD, join=False, start_method="fork",
                             args=(WORLD, free_port(), str(plan_file), str(out), timeout_s))
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the distributed cases did not finish in {timeout_s:.0f} s")
    except Exception as e:
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error.r*.txt")))
        raise RuntimeError(f"distributed workers failed: {e}\n{errors}") from e
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, 9)
    return out


def unpaired_ops(logs: dict[int, list]) -> list[str]:
    """Where the point-to-point ops of one run (``logs[global rank]``: its ``P2P``) would
    not pair up under NCCL: it ignores tags, and runs the ops two workers post to each other,
    both ways, in order on one stream per process group and pair, where a receive waits
    for its send. So the i-th op worker a posts with worker b on a group must be the
    send or receive that is b's i-th with a on it, of the same shape."""
    problems = []
    for a in sorted(logs):
        for b in sorted(logs):
            if b <= a:
                continue
            groups = {op[0] for op in logs[a] + logs[b]}
            for grp in sorted(groups):
                mine = [(what, shape) for g, peer, what, shape in logs[a] if g == grp and peer == b]
                theirs = [(what, shape) for g, peer, what, shape in logs[b] if g == grp and peer == a]
                if len(mine) != len(theirs):
                    problems.append(f"group {grp}: worker {a} posts {len(mine)} ops with {b}, "
                                    f"which posts {len(theirs)} with {a}")
                for i, ((wa, sa), (wb, sb)) in enumerate(zip(mine, theirs)):
                    if {wa, wb} != {"send", "recv"} or sa != sb:
                        problems.append(f"group {grp}, op {i} of the pair: worker {a} posts a "
                                        f"{wa} of {sa}, worker {b} a {wb} of {sb}")
                        break
    return problems


def gather(out: Path, case: Case) -> dict:
    """One case's per-rank files -> whole tensors in original node order."""
    ranks = [torch.load(out / f"{case.name}.r{r}.pt", weights_only=False) for r in range(case.parts)]
    n = sum(int(r["ids"].numel()) for r in ranks)
    logits = torch.zeros(n, ranks[0]["logits"].shape[1])
    x_grad = None
    for r in ranks:
        logits[r["ids"]] = r["logits"]
        if r["x_grad"] is not None:
            if x_grad is None:
                x_grad = torch.zeros(n, r["x_grad"].shape[1])
            x_grad[r["ids"]] = r["x_grad"]
    return {"logits": logits, "x_grad": x_grad, "param_grads": ranks[0]["param_grads"],
            "loss": ranks[0]["loss"], "ranks": ranks}


def _forked(fn, *args) -> None:
    # One intra-op thread: a forked child must not enter the OpenMP pool of a parent
    # that already used it (libgomp is not fork-safe; the child can hang).
    torch.set_num_threads(1)
    # The workers' process groups are left by the child's exit (multiprocessing ends it
    # with os._exit), never destroyed: torch 2.2's ProcessGroupGloo destructor can block
    # for good holding the GIL (sarc.distributed.worker.run_worker), a hung test.
    dist.destroy_process_group = lambda group=None: None
    fn(*args)


def spawn(fn, nprocs: int, args: tuple = (), timeout_s: float = 60.0) -> tuple[list, list]:
    """Fork ``nprocs`` processes running ``fn(rank, port, queue, *args)``; returns (exit codes,
    what each put on the queue, by rank). Unlike ``torch.multiprocessing``, one failing
    process does not get the others killed: the tests watch what the survivors do."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_forked, args=(fn, r, port, q, *args)) for r in range(nprocs)]
    for p in procs:
        p.start()
    # The queue is read while the workers run: a child whose report is larger than the
    # pipe holds cannot exit until it is read, so joining first would call it hung.
    import queue as queues
    reports: list = [None] * nprocs
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        try:
            rank, what = q.get(timeout=0.1)
            reports[rank] = what
        except queues.Empty:
            pass
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        os.kill(procs[r].pid, 9)
    for p in procs:
        p.join()
    if not hung:  # a killed child can leave a half-written report: read only after clean exits
        while True:
            try:
                rank, what = q.get(timeout=0.1)
                reports[rank] = what
            except queues.Empty:
                break
    assert not hung, f"workers {hung} still running after {timeout_s} s (a hang)"
    return [p.exitcode for p in procs], reports
