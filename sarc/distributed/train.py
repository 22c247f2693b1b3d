"""One worker of distributed full-batch training.

It runs the loop of ``sarc train`` (``sarc.training.loop.fit``: the same
hyperparameters, optimizer, model selection on validation accuracy, early
stopping, checkpoints) on its shard: the model's sarc layers run their
distributed schedules on a ``DistGraph``, the step's loss is divided by the
*global* number of training nodes, and the reduction (``AllReduce``) sums the
parameter gradients (``allreduce_gradients``), the loss, the accuracies' counts
and the validation loss over the workers, so that a P-worker step is the
single-process step. Rank 0 prints; at the end every worker reports its peak
memory (RSS high-water mark, split into the runtime it held before its shard and
the rest, and CUDA's peak allocation on a GPU) and the bytes its exchanges sent
and received. Its optimizer is ``sarc.training.optim.EagerAdam``: torch's Adam,
without the compiler torch.optim imports.

Before any training, every worker checks its input (its part of the
partition set, the group's size, that all workers hold parts of the same
set) and the workers agree (``agree``): if any worker found a problem, all
stop with its message, instead of some waiting for the others forever.
"""
from __future__ import annotations

import datetime
import json
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import CheckpointConfig, partition_fingerprint, run_record, seed_all
from ..dsl import edge_inputs_for
from ..errors import SarcError
from ..loader import ModelSpec
from ..partition import load_partitions
from ..runtime.sharded import ShardedGraph
from ..train import ModelSelection, TrainError, hyperparameters
from ..sampling import Comm
from ..training.loop import Batch, FullBatch, epoch_line, fit, save_selected
from ..training.minibatch import MiniBatchConfig, MiniBatchSteps, ShardRows, graph_layers
from ..training.optim import EagerAdam
from .exchange import ByteCounter, Exchanger
from .graph import DistError, DistGraph, check_boundaries, comm_device, trim_heap
from .prepare import WorkerData, prepare_worker, with_self_loops


@dataclass(frozen=True)
class WorkerConfig:
    partition: str
    exec_mode: str | None = None
    mem_budget: int | None = None
    baseline: bool = False
    epochs: int | None = None
    seed: int = 0
    hparams: dict | None = None
    log_every: int = 1
    json_path: str | None = None
    timeout_s: float = 120.0
    checkpoint: CheckpointConfig | None = None
    save_path: str | None = None   # rank 0 writes the selected model there
    dataset: str | None = None     # its name in checkpoints (default: the graph's fingerprint)
    minibatch: MiniBatchConfig | None = None  # mfg / sampling mode (None: full-batch)


def agree(ok: bool, message: str, group=None) -> None:
    """Every worker says whether it can go on; if any cannot, all raise with the first
    failing worker's message (collective)."""
    msgs: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(msgs, None if ok else message, group=group)
    for r, m in enumerate(msgs):
        if m is not None:
            raise DistError(m if r == dist.get_rank(group) else f"worker {r}: {m}")


def load_shard(path: str, group=None) -> ShardedGraph:
    """This worker's shard of the partition set at ``path``, checked against the group
    before any exchange: its size is the number of parts, every worker holds a part of the
    same set (graph fingerprint, parts, node ranges, the files' sha256), and the parts fit
    together (``check_parts``)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    trim_heap()  # from here, large buffers are mappings of their own (see trim_heap)
    shard, problem, record = None, None, None
    try:
        pset = load_partitions(path, verify=False)
        if pset.num_parts != size:
            problem = (f"{path}: the partition set has {pset.num_parts} parts but {size} "
                       f"workers were started; start one worker per part")
        else:
            shard = ShardedGraph.from_partitions(pset, rank)
            record = PartRecord.of(pset, shard)
    except SarcError as e:
        problem = str(e)
    agree(problem is None, problem or "", group)
    records: list = [None] * size
    dist.all_gather_object(records, record, group=group)
    check_parts(records)
    return shard


@dataclass(frozen=True)
class PartRecord:
    """What a worker loaded, as the others check it: the set (its graph's fingerprint, its
    parts' sha256 and node ranges), the part (its file, number and sha256, its data's
    schema) and its boundary rows with every peer (``ShardedGraph.boundary_digests``)."""

    fingerprint: str
    num_parts: int
    node_offsets: tuple
    parts_sha256: tuple
    file: str
    part: int
    sha256: str
    schema: tuple
    boundary: tuple

    @staticmethod
    def of(pset, shard: ShardedGraph) -> "PartRecord":
        def schema(data):
            return tuple(sorted((k, str(t.dtype), tuple(t.shape[1:])) for k, t in data.items()))
        return PartRecord(pset.fingerprint, pset.num_parts, tuple(pset.meta["node_offsets"]),
                          tuple(e["sha256"] for e in pset.meta["parts"]), str(pset.part_path(shard.rank)),
                          shard.rank, pset.meta["parts"][shard.rank]["sha256"],
                          (schema(shard.ndata), schema(shard.edata[shard.rank])),
                          shard.boundary_digests())


def check_parts(records: list[PartRecord]) -> None:
    """Raise, on every worker alike, unless the workers' parts are the parts of one set."""
    first = records[0]
    for r, rec in enumerate(records):
        if (rec.fingerprint, rec.num_parts, rec.node_offsets) != (
                first.fingerprint, first.num_parts, first.node_offsets):
            raise DistError(f"the workers hold parts of different partition sets (worker 0: graph "
                            f"{first.fingerprint}, {first.num_parts} parts; worker {r}: graph "
                            f"{rec.fingerprint}, {rec.num_parts} parts)")
    for r, rec in enumerate(records):
        for other in records:
            if other.parts_sha256[r] != rec.sha256:
                raise DistError(f"{rec.file} (sha256 {rec.sha256}) is not part {r} of the set "
                                f"{Path(other.file).parent} read by worker {other.part} (sha256 "
                                f"{other.parts_sha256[r]}): the workers read different copies of "
                                f"the set")
        if rec.schema != first.schema:
            raise DistError(f"{rec.file} holds other node or edge data than {first.file}: "
                            f"{_schema_text(rec.schema)} against {_schema_text(first.schema)}")
    check_boundaries([rec.boundary for rec in records], [rec.file for rec in records])


def _schema_text(schema) -> str:
    return "; ".join(", ".join(f"{k} {dtype} {list(shape)}" for k, dtype, shape in group) or "none"
                     for group in schema)


def allreduce_gradients(model: nn.Module, group=None) -> None:
    """Sum every parameter's gradient over the workers (one flat all-reduce)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    dev = comm_device(group)
    flat = torch.cat([p.grad.reshape(-1) for p in params]).to(dev)
    dist.all_reduce(flat, group=group)
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Every worker starts from worker 0's parameters."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dev = comm_device(group)
    for t in [*model.parameters(), *model.buffers()]:
        buf = t.data.to(dev)
        dist.broadcast(buf, src, group=group)
        t.data.copy_(buf)


class AllReduce:
    """The loop's reduction (``sarc.training.loop.Reduction``) over the workers of
    ``group``: gradients, the loss and evaluation's counts summed by all-reduces, the
    counts in float64."""

    dtype = torch.float64

    def __init__(self, group=None):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.device = comm_device(group)

    def gradients(self, model: nn.Module) -> None:
        allreduce_gradients(model, self.group)

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(self.device)
        dist.all_reduce(t, group=self.group)
        return t

    def gather(self, obj) -> list:
        return _all_gather(obj, self.group)


class ShardSteps(FullBatch):
    """Full-batch steps on the worker's shard, with the bytes each step's exchanges sent
    (``step_bytes``; the counter starts at zero every epoch)."""

    def __init__(self, batch: Batch, counts: dict[str, int], counter: ByteCounter):
        super().__init__(batch, counts)
        self.counter, self.step_bytes = counter, []

    def steps(self, epoch: int) -> Iterable[Batch]:
        self.counter.reset()
        yield self.batch
        self.step_bytes.append(self.counter.total_sent)  # the step is done: see StepSource


def sampling_group(group=None, timeout: datetime.timedelta | None = None):
    """A gloo process group of ``group``'s workers for the sampler alone (collective over
    the whole world): its exchanges of ids run in a thread beside the training group's
    collectives."""
    ranks = (list(range(dist.get_world_size())) if group is None
             else [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))])
    kw = {} if timeout is None else {"timeout": timeout}
    return dist.new_group(ranks, backend="gloo", **kw)


class BlockGraphs:
    """``graph_of`` of a mini-batch step source on P workers: layer k's block as a
    ``DistGraph``. Layer k's first block (the first step's) builds it: the shards'
    statistics are gathered and the layer's programs compiled, planned for ``mode`` on
    that block's statistics; every later block runs the same programs
    (``DistGraph.on_shard``), so a step gathers and compiles nothing."""

    def __init__(self, group, mode: str, device: torch.device, **options):
        self.group, self.mode, self.device, self.options = group, mode, device, options
        self.graphs: dict[int, DistGraph] = {}
        self.layer_names: dict = {}  # shared: the layers are named in call order

    def __call__(self, k: int, block) -> DistGraph:
        shard = block.shard.to(self.device)
        if k not in self.graphs:  # collective: every worker builds block k's first together
            self.graphs[k] = DistGraph(shard, self.group, mode=self.mode, **self.options)
            self.graphs[k].layer_names = self.layer_names
            return self.graphs[k]
        return self.graphs[k].on_shard(shard)


def resident_bytes() -> int:
    """This process's RSS now (Linux's ``/proc``; elsewhere its high-water mark so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_memory(fixed_rss: int) -> dict[str, int]:
    """This process's RSS high-water mark (``rss_peak``) in two parts: ``fixed_rss``, the
    worker's runtime before its shard (torch, sarc, the process group: what every worker
    holds, whatever P), measured by the caller, and ``data_rss``, the rest (the shard and
    what the run computes on it); on a GPU, torch's peak allocation (bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"rss_peak": peak, "fixed_rss": fixed_rss, "data_rss": peak - fixed_rss}
    if torch.cuda.is_available():
        out["cuda_peak"] = int(torch.cuda.max_memory_allocated())
    return out


def train_worker(spec: ModelSpec, cfg: WorkerConfig, group=None,
                 log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train ``spec``'s model on this worker's shard of ``cfg.partition`` (collective)."""
    from .link import has_link_split, train_link_worker
    if has_link_split(cfg.partition):  # a link-prediction set: sarc.distributed.link
        return train_link_worker(spec, cfg, group, log)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    say = (log if rank == 0 and log else (lambda s: None))
    hp = hyperparameters(spec, cfg.hparams, epochs=cfg.epochs)
    device = comm_device(group) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    timeout = datetime.timedelta(seconds=cfg.timeout_s)

    fixed_rss = resident_bytes()  # the runtime: imports, the process group
    shard = load_shard(cfg.partition, group).to(device)
    counter = ByteCounter()
    data = prepare_worker(shard, hp, group)
    torch.manual_seed(cfg.seed)
    model = _build(spec, data, hp, shard.num_nodes).to(device)
    # the edge data the model reads, by its layers' declared names (not all the partition has)
    reads = tuple(edge_inputs_for(model, {k: None for e in shard.edata for k in e}))
    if hp["self_loops"]:
        shard = with_self_loops(shard, Exchanger(rank, size, group, counter, timeout), reads)
    dg = DistGraph(shard, group, exec_mode=cfg.exec_mode, mem_budget=cfg.mem_budget,
                   baseline=cfg.baseline, timeout=timeout, counter=counter)
    edge_inputs = {k: dg.edge_data(k) for k in reads}

    broadcast_parameters(model, group)
    dg.share_memory(model)  # the memory budget is the whole step's, shared by its layers
    seed_all(cfg.seed * 1000003 + rank)  # each worker its own dropout stream
    opt = EagerAdam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    if not data.counts["train"]:
        raise TrainError("the partitioned dataset has no labeled training nodes")
    say(f"sarc train: {spec.name} on {shard.num_nodes} nodes, {size} workers "
        f"({dist.get_backend(group)}), exec mode {cfg.exec_mode or 'planner'}"
        f"{', baseline' if cfg.baseline else ''}, seed {cfg.seed}, "
        f"{sum(p.numel() for p in model.parameters())} parameters")

    selection = ModelSelection(data.counts["val"] > 0, hp["patience"])
    best = selection.best
    run = _run_record(spec, cfg, hp, size) if cfg.checkpoint or cfg.save_path else None
    full = Batch(dg, data.x, edge_inputs, data.label, data.masks,
                 train_total=data.counts["train"], node_ids=shard.orig_node_ids)
    last = int(hp["epochs"])
    if cfg.minibatch is None:
        source = ShardSteps(full, data.counts, dg.counter)

        def line(*progress) -> str:
            return (epoch_line(*progress, of=last) +
                    f" | sent {dg.counter.total_sent / 2**20:.2f} MiB (worker 0)")
    else:
        blocks = BlockGraphs(group, cfg.minibatch.mode, device, exec_mode=cfg.exec_mode,
                             mem_budget=cfg.mem_budget, baseline=cfg.baseline, timeout=timeout,
                             counter=counter)
        source = MiniBatchSteps(shard, cfg.minibatch, layers=graph_layers(model), seed=cfg.seed,
                                comm=Comm(sampling_group(group, timeout), timeout=timeout),
                                prefetch=True,
                                rows=ShardRows(data.x, data.label, data.masks["train"]),
                                evaluation=full, counts=data.counts, graph_of=blocks,
                                edge_names=tuple(edge_inputs), counter=counter)
        say(f"{cfg.minibatch.mode} mode: {source.seeds.steps} steps per epoch, fanouts "
            f"{', '.join(map(str, source.spec.fanouts))}")

        def line(*progress) -> str:
            return f"{epoch_line(*progress, of=last)} | {source.progress()} (worker 0)"

    out = fit(model, opt, source, selection, epochs=last, reduction=AllReduce(group),
              checkpoint=cfg.checkpoint, run=run, log=log, log_every=cfg.log_every, line=line)
    if cfg.minibatch is None:
        step_bytes, planned = (source.step_bytes[-1] if source.step_bytes else 0,
                               dg.planned_bytes_sent())
        programs, sampled = list(dg.training_programs.values()), {}
    else:  # the mean step of the last epoch; no plan predicts a sampled step's bytes
        h = source.history[-1] if source.history else {"bytes_sent": 0, "steps": 1,
                                                        "sampling_bytes_sent": 0}
        step_bytes, planned = h["bytes_sent"] // max(1, h["steps"]), None
        sampled = {"epoch_sampling_bytes_sent": h["sampling_bytes_sent"]}
        programs = [p for g in blocks.graphs.values() for p in g.training_programs.values()]
    mine = {"rank": rank, **peak_memory(fixed_rss), **sampled, "step_bytes_sent": step_bytes,
            "planned_step_bytes_sent": planned,
            "epoch_bytes_sent": dg.counter.total_sent, "epoch_bytes_received": dg.counter.total_received}
    workers: list = [None] * size
    dist.all_gather_object(workers, mine, group=group)
    result = {
        "model": spec.name, "workers": size, "exec_mode": cfg.exec_mode, "baseline": cfg.baseline,
        "mode": cfg.minibatch.mode if cfg.minibatch else "full",
        "seed": cfg.seed, "epochs": out.epochs, "best_epoch": best["epoch"],
        "train_acc": best["train_acc"], "val_acc": best["val_acc"], "test_acc": best["test_acc"],
        "final_test_acc": out.acc.get("test"), "final_loss": out.loss, "time_s": out.elapsed_s,
        "epoch_ms": out.elapsed_s / max(1, out.epochs) * 1e3, "per_worker": workers,
        "plans": [{"layer": p.name, "exec_mode": p.plan.exec_mode, "bytes_sent": p.plan.bytes_sent}
                  for p in programs],
    }
    say(format_report(workers))
    if rank == 0 and cfg.save_path:
        sizes = {"in_feats": data.num_features, "num_classes": data.num_classes,
                 "num_nodes": shard.num_nodes, "num_etypes": data.num_etypes}
        save_selected(cfg.save_path, selection, run=run, hparams=hp, sizes=sizes)
    if rank == 0 and cfg.json_path:
        from ..backends.codegen import write_atomic
        write_atomic(Path(cfg.json_path), json.dumps(result, indent=2) + "\n")
    return {**result, "module": model}


def _run_record(spec: ModelSpec, cfg: WorkerConfig, hp: dict, size: int) -> dict:
    pset = load_partitions(cfg.partition, verify=False)
    hp = cfg.minibatch.recorded(hp) if cfg.minibatch else hp
    return run_record(spec, hp, seed=cfg.seed, dataset=cfg.dataset or f"graph {pset.fingerprint}",
                      graph=pset.fingerprint, world_size=size,
                      partition=partition_fingerprint(pset))


def _all_gather(obj, group) -> list:
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _build(spec: ModelSpec, data: WorkerData, hp: dict, num_nodes: int) -> nn.Module:
    from ..datasets import Dataset
    # sarc.train.build reads the sizes off a Dataset; give it one with this graph's sizes
    empty = torch.zeros(0, dtype=torch.int64)
    stub = Dataset("partitioned", num_nodes, empty, empty, torch.zeros(0, data.num_features),
                   empty, empty.bool(), empty.bool(), empty.bool(), data.num_classes,
                   etype=empty if data.num_etypes else None, num_etypes=data.num_etypes)
    from ..train import build
    return build(spec, stub, hp)


def _mib(n: float) -> str:
    from ..planner.plan import _fmt_bytes
    return _fmt_bytes(n)


def format_report(workers: list[dict]) -> str:
    """Per worker: peak memory (and its fixed and data parts, ``peak_memory``), bytes sent /
    received in the last epoch."""
    lines = ["worker    peak RSS = (    fixed +       data)   cuda peak  sent/epoch  recv/epoch  "
             "sent/step (planner)"]
    for w in workers:
        planned = "-" if w["planned_step_bytes_sent"] is None else _mib(w["planned_step_bytes_sent"])
        lines.append(f"{w['rank']:>6}  {_mib(w['rss_peak']):>10} = "
                     f"({_mib(w['fixed_rss']):>9} + {_mib(w['data_rss']):>10})  "
                     f"{_mib(w['cuda_peak']) if 'cuda_peak' in w else '-':>10}  "
                     f"{_mib(w['epoch_bytes_sent']):>10}  {_mib(w['epoch_bytes_received']):>10}  "
                     f"{_mib(w['step_bytes_sent'])} ({planned})")
    return "\n".join(lines)
