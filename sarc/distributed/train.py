"""One worker of distributed full-batch training: the loop each process runs.

It mirrors ``sarc.train.train`` (same hyperparameters, optimizer, model
selection on validation accuracy, early stopping) on a shard: the model's
sarc layers run their distributed schedules on a ``DistGraph``, the loss is
normalized so that a P-worker step is the single-process step (each worker's
summed loss over its training nodes, divided by the *global* number of
training nodes; parameter gradients summed over the workers by
``allreduce_gradients``), and accuracies and the validation loss are summed
over the workers. Rank 0 prints; at the end every worker reports its peak
memory (RSS high-water mark, and CUDA's peak allocation on a GPU) and the
bytes its exchanges sent and received.

Before any training, every worker checks its input (its part of the
partition set, the group's size, that all workers hold parts of the same
set) and the workers agree (``agree``): if any worker found a problem, all
stop with its message, instead of some waiting for the others forever.
"""
from __future__ import annotations

import datetime
import json
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..checkpoint import (CheckpointConfig, Checkpointer, Progress, injected_kill,
                          partition_fingerprint, run_record, save_model, seed_all,
                          training_state)
from ..errors import SarcError
from ..loader import ModelSpec
from ..partition import load_partitions
from ..runtime.sharded import ShardedGraph
from ..train import EmbeddingInput, ModelSelection, TrainError, hyperparameters
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


def global_cross_entropy(logits: torch.Tensor, label: torch.Tensor, mask: torch.Tensor,
                         total: int) -> torch.Tensor:
    """This worker's share of the mean cross-entropy over ``total`` nodes of all workers."""
    return F.cross_entropy(logits[mask], label[mask], reduction="sum") / max(1, total)


def peak_memory() -> dict[str, int]:
    """This process's RSS high-water mark and, on a GPU, torch's peak allocation (bytes)."""
    out = {"rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if torch.cuda.is_available():
        out["cuda_peak"] = int(torch.cuda.max_memory_allocated())
    return out


def _forward(model: nn.Module, dg: DistGraph, data: WorkerData, ids: torch.Tensor, edge_inputs):
    if isinstance(model, EmbeddingInput):  # featureless graph: the local rows of the embedding
        return model.model(dg, model.embedding.weight.index_select(0, ids), **edge_inputs)
    return model(dg, data.x, **edge_inputs)


def _metrics(logits, data: WorkerData, group):
    pred = logits.argmax(1)
    dev = comm_device(group)
    correct = torch.tensor([float((pred[m] == data.label[m]).sum()) for m in data.masks.values()]
                           + [float(F.cross_entropy(logits[data.masks["val"]], data.label[data.masks["val"]],
                                                    reduction="sum")) if bool(data.masks["val"].any()) else 0.0],
                           dtype=torch.float64, device=dev)
    dist.all_reduce(correct, group=group)
    c = correct.cpu().tolist()
    acc = {k: c[i] / data.counts[k] if data.counts[k] else float("nan")
           for i, k in enumerate(("train", "val", "test"))}
    val_loss = c[3] / data.counts["val"] if data.counts["val"] else float("nan")
    return acc, val_loss


def train_worker(spec: ModelSpec, cfg: WorkerConfig, group=None,
                 log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train ``spec``'s model on this worker's shard of ``cfg.partition`` (collective)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    say = (log if rank == 0 and log else (lambda s: None))
    hp = hyperparameters(spec, cfg.hparams, epochs=cfg.epochs)
    device = comm_device(group) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    timeout = datetime.timedelta(seconds=cfg.timeout_s)

    shard = load_shard(cfg.partition, group).to(device)
    counter = ByteCounter()
    if hp["self_loops"]:
        shard = with_self_loops(shard, Exchanger(rank, size, group, counter, timeout))
    dg = DistGraph(shard, group, exec_mode=cfg.exec_mode, mem_budget=cfg.mem_budget,
                   baseline=cfg.baseline, timeout=timeout, counter=counter)
    data = prepare_worker(shard, hp, group)
    edge_inputs = {"etype": dg.edge_data("etype")} if data.num_etypes else {}

    torch.manual_seed(cfg.seed)
    model = _build(spec, data, hp, shard.num_nodes).to(device)
    broadcast_parameters(model, group)
    seed_all(cfg.seed * 1000003 + rank)  # each worker its own dropout stream
    opt = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    if not data.counts["train"]:
        raise TrainError("the partitioned dataset has no labeled training nodes")
    ids = shard.orig_node_ids
    has_val = data.counts["val"] > 0
    say(f"sarc train: {spec.name} on {shard.num_nodes} nodes, {size} workers "
        f"({dist.get_backend(group)}), exec mode {cfg.exec_mode or 'planner'}"
        f"{', baseline' if cfg.baseline else ''}, seed {cfg.seed}, "
        f"{sum(p.numel() for p in model.parameters())} parameters")

    selection = ModelSelection(has_val, hp["patience"])
    best = selection.best
    run = _run_record(spec, cfg, hp, size) if cfg.checkpoint or cfg.save_path else None
    ckpt = None
    if cfg.checkpoint is not None:
        ckpt = Checkpointer(cfg.checkpoint, run, rank=rank, world_size=size, log=log,
                            gather=lambda obj: _all_gather(obj, group))
    at = ckpt.resume(model, opt, selection) if ckpt is not None else Progress()
    epoch, loss_value, acc, stop, before = at.epoch, at.loss, at.acc, at.stopped_early, at.elapsed_s
    last = int(hp["epochs"])
    step_bytes: list[int] = []
    t_start = time.perf_counter()
    for epoch in range(epoch + 1, 0 if stop else last + 1):
        injected_kill(rank, epoch)
        t0 = time.perf_counter()
        dg.counter.reset()
        model.train()
        opt.zero_grad()
        logits = _forward(model, dg, data, ids, edge_inputs)
        loss = global_cross_entropy(logits, data.label, data.masks["train"], data.counts["train"])
        loss.backward()
        allreduce_gradients(model, group)
        opt.step()
        step_bytes.append(dg.counter.total_sent)
        total = loss.detach().reshape(1).to(comm_device(group))
        dist.all_reduce(total, group=group)
        loss_value = float(total)
        model.eval()
        with torch.no_grad():
            acc, val_loss = _metrics(_forward(model, dg, data, ids, edge_inputs), data, group)
        dt = time.perf_counter() - t0
        if epoch % max(1, cfg.log_every) == 0 or epoch == 1 or epoch == hp["epochs"]:
            say(f"epoch {epoch:4d}/{hp['epochs']} | loss {loss_value:.4f} | train {acc['train']:.4f} "
                f"val {acc['val']:.4f} test {acc['test']:.4f} | {dt * 1e3:.0f} ms | "
                f"sent {dg.counter.total_sent / 2**20:.2f} MiB (worker 0)")
        stop = selection.update(epoch, acc, val_loss, model)
        if stop:
            say(selection.stop_message(epoch))
        if ckpt is not None and ckpt.due(epoch, stop, last):
            ckpt.save(epoch, training_state(model, opt, selection, loss=loss_value, acc=acc,
                                            stopped_early=stop,
                                            elapsed_s=before + time.perf_counter() - t_start))
        if stop:
            break
    elapsed = before + time.perf_counter() - t_start
    say(selection.restore(model, epoch, elapsed))

    mine = {"rank": rank, **peak_memory(), "step_bytes_sent": step_bytes[-1] if step_bytes else 0,
            "planned_step_bytes_sent": dg.planned_bytes_sent(),
            "epoch_bytes_sent": dg.counter.total_sent, "epoch_bytes_received": dg.counter.total_received}
    workers: list = [None] * size
    dist.all_gather_object(workers, mine, group=group)
    result = {
        "model": spec.name, "workers": size, "exec_mode": cfg.exec_mode, "baseline": cfg.baseline,
        "seed": cfg.seed, "epochs": epoch, "best_epoch": best["epoch"],
        "train_acc": best["train_acc"], "val_acc": best["val_acc"], "test_acc": best["test_acc"],
        "final_test_acc": acc.get("test"), "final_loss": loss_value, "time_s": elapsed,
        "epoch_ms": elapsed / max(1, epoch) * 1e3, "per_worker": workers,
        "plans": [{"layer": p.name, "exec_mode": p.plan.exec_mode, "bytes_sent": p.plan.bytes_sent}
                  for p in dg.training_programs.values()],
    }
    say(format_report(workers))
    if rank == 0 and cfg.save_path:
        sizes = {"in_feats": data.num_features, "num_classes": data.num_classes,
                 "num_nodes": shard.num_nodes, "num_etypes": data.num_etypes}
        save_model(cfg.save_path, best["state"], run=run, hparams=hp, sizes=sizes,
                   metrics={k: best[k] for k in ("epoch", "train_acc", "val_acc", "test_acc")})
    if rank == 0 and cfg.json_path:
        from ..backends.codegen import write_atomic
        write_atomic(Path(cfg.json_path), json.dumps(result, indent=2) + "\n")
    return {**result, "module": model}


def _run_record(spec: ModelSpec, cfg: WorkerConfig, hp: dict, size: int) -> dict:
    pset = load_partitions(cfg.partition, verify=False)
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
    """Per worker: peak memory, bytes sent / received in the last epoch."""
    lines = ["worker    peak RSS   cuda peak  sent/epoch  recv/epoch  sent/step (planner)"]
    for w in workers:
        planned = "-" if w["planned_step_bytes_sent"] is None else _mib(w["planned_step_bytes_sent"])
        lines.append(f"{w['rank']:>6}  {_mib(w['rss_peak']):>10}  "
                     f"{_mib(w['cuda_peak']) if 'cuda_peak' in w else '-':>10}  "
                     f"{_mib(w['epoch_bytes_sent']):>10}  {_mib(w['epoch_bytes_received']):>10}  "
                     f"{_mib(w['step_bytes_sent'])} ({planned})")
    return "\n".join(lines)
