"""One worker of distributed full-batch training.

It runs the loop of ``sarc train`` (``sarc.training.loop.fit``: the same
hyperparameters, optimizer, model selection on validation accuracy, early
stopping, checkpoints) on its shard: the model's sarc layers run their
distributed schedules on a ``DistGraph``, the step's loss is divided by the
*global* number of training nodes, and the reduction (``AllReduce``) sums the
parameter gradients (``allreduce_gradients``), the loss, the accuracies' counts
and the validation loss over the workers, so that a P-worker step is the
single-process step. A featureless graph's learned input is a
``sarc.distributed.Embedding`` sharded with the partition (``sharded_table``): a
worker holds its nodes' rows and their optimizer state, a step reads its own rows,
and the sparse optimizer updates the rows read on their owners. Rank 0 prints; at
the end every worker reports its peak memory (RSS high-water mark, split into the
runtime it held before its shard and the rest, and CUDA's peak allocation on a GPU),
its embedding's bytes (rows and optimizer state) and the bytes its exchanges sent
and received. Its dense optimizer is ``sarc.training.optim.EagerAdam``: torch's Adam,
without the compiler torch.optim imports.

Before any training, every worker checks its input (its part of the
partition set, the group's size, that all workers hold parts of the same
set) and the workers agree (``agree``): if any worker found a problem, all
stop with its message, instead of some waiting for the others forever.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import CheckpointConfig, partition_fingerprint, run_record, seed_all
from ..datasets import npz_file
from ..dsl import edge_inputs_for
from ..errors import SarcError, agreed
from ..loader import ModelSpec
from ..partition import open_partition
from ..partition.dgl_in_place import PeerPartError
from ..runtime.sharded import ShardedGraph, build_shard
from ..train import (ModelSelection, TrainError, hyperparameters, minibatch_inputs,
                     output_check)
from ..sampling import Comm
from ..training.device import kernels, placed
from ..training.inputs import EMBEDDING_SCALE, optimizer
from ..training.loop import (Batch, FullBatch, epoch_line, fit, save_selected,
                             timings)
from ..training.progress import plural
from ..training.minibatch import (MiniBatchConfig, MiniBatchSteps, ShardRows,
                                  check_minibatch_budget, graph_layers, sarc_layers)
from .batchnorm import sync_batch_norms
from .embedding import Embedding
from .exchange import ByteCounter, ExchangeError, Exchanger
from .graph import DistError, DistGraph, check_boundaries, comm_device, trim_heap
from .halo import FetchRun
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
    eval_every: int = 1
    json_path: str | None = None
    timeout_s: float = 120.0
    checkpoint: CheckpointConfig | None = None
    save_path: str | None = None   # rank 0 writes the selected model there
    dataset: str | None = None     # the partitioned dataset's name, recorded in checkpoints,
                                   # --save files and --json (default: the graph's fingerprint)
    minibatch: MiniBatchConfig | None = None  # mfg / sampling mode (None: full-batch)
    device: str = "cpu"            # cpu, cuda (cuda:LOCAL_RANK) or cuda:N (sarc.distributed.worker)
    backend: str | None = None     # the kernels of all the model's sarc layers (None: each its own)


def agree(ok: bool, message: str, group=None) -> None:
    """Every worker says whether it can go on; if any cannot, all raise with the first
    failing worker's message (collective)."""
    msgs: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(msgs, None if ok else message, group=group)
    for r, m in enumerate(msgs):
        if m is not None:
            raise agreed(DistError(m if r == dist.get_rank(group) else f"worker {r}: {m}"))


def load_shard(path: str, group=None) -> ShardedGraph:
    """This worker's shard of the partition set at ``path`` (or of the DGL partition whose
    config it is, read in place: ``sarc.partition.dgl_in_place``), checked against the group
    before any exchange: its size is the number of parts, every worker holds a part of the
    same set (graph fingerprint, parts, node ranges, the files' sha256), and the parts fit
    together (``check_parts``)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    trim_heap()  # from here, large buffers are mappings of their own (see trim_heap)
    shard, problem, record = None, None, None
    try:
        pset = open_partition(path, verify=False)  # a sarc set, or a DGL partition in place
        if pset.num_parts != size:
            problem = (f"{path}: the partition set has {pset.num_parts} parts but {size} "
                       f"workers were started; start one worker per part")
    except SarcError as e:
        problem = str(e)
    agree(problem is None, problem or "", group)
    try:  # collective for a DGL partition: its parts' boundaries come from the peers
        part = pset.load_part(rank, gather=lambda obj: _all_gather(obj, group))
        shard = build_shard(part, pset.node_offsets, rank)
        record = PartRecord.of(pset, shard)
    except PeerPartError:
        pass  # a peer could not read its part: the agreement stops all with its message
    except SarcError as e:
        problem = str(e)
    agree(problem is None, problem or "", group)
    records: list = [None] * size
    dist.all_gather_object(records, record, group=group)
    try:
        check_parts(records)
    except DistError as e:  # every worker judges the same records alike
        raise agreed(e) from None
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
    """Sum every parameter's gradient over the workers (one flat all-reduce). A parameter
    no worker's step reached (read only by a comparison, or detached) keeps no gradient, as
    on one process: with a zero one an optimizer's weight decay would move it on P workers
    only."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    had = [p.grad is not None for p in params]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    dev = comm_device(group)
    reached = torch.tensor(had, dtype=params[0].grad.dtype, device=params[0].grad.device)
    flat = torch.cat([p.grad.reshape(-1) for p in params] + [reached]).to(dev)
    dist.all_reduce(flat, group=group)
    off = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n
    for p, anywhere in zip(params, flat[off:].tolist()):
        if anywhere == 0:
            p.grad = None


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Every worker starts from worker 0's parameters (a sharded embedding's rows are each
    worker's own)."""
    src = dist.get_global_rank(group, 0) if group is not None else 0
    dev = comm_device(group)
    sharded = {id(m.weight) for m in model.modules() if isinstance(m, Embedding)}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in sharded:
            continue
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
    (``step_bytes``; the counter starts at zero every epoch) and the programs its calls
    ran (``DistGraph.step_calls``)."""

    def __init__(self, batch: Batch, counts: dict[str, int], dg: DistGraph):
        super().__init__(batch, counts)
        self.counter, self.calls, self.step_bytes = dg.counter, dg.step_calls, []

    def steps(self, epoch: int) -> Iterable[Batch]:
        self.counter.reset()
        self.calls.begin()
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
    """``graphs_of`` of a mini-batch step source on P workers: a step's blocks as
    ``DistGraph``s, layer k's on block k. The first step builds them (collective: the
    blocks' statistics are gathered, and the layers' programs are compiled on first use,
    planned for ``mode`` on them); every later step runs the same programs
    (``DistGraph.on_shard``), so a step compiles nothing.

    Every step gathers its blocks' statistics (one all-gather of a few integers per
    layer), for two things:

    - a memory budget (``mem_budget``) is the whole step's: the first step's blocks share
      it over ``layers`` (the model's sarc layers in declaration order, taken for the call
      order; ``share_budget``); a block that runs another layer than its share's runs in
      sar (``schedule._runs_another_layers_share``), and the next step's blocks share it
      again over the layers in the order the first step called them. A
      later step's blocks may be larger than the first's; where the planned programs
      would keep more than the budget of them on any worker (``step_kept_bytes``), the
      step runs in sar, keeping no remote row (those programs compiled once, on first
      need); ``over_budget_steps`` counts such steps;
    - the planner's prediction of the bytes each step sends (``planned_bytes_sent``: the
      programs that ran, on that step's blocks), which the exchanges' counters meet."""

    def __init__(self, group, mode: str, device: torch.device, layers=(), **options):
        self.group, self.mode, self.device, self.options = group, mode, device, options
        self.layers = list(layers)
        self.graphs: list[DistGraph] | None = None
        self.fallback: list[DistGraph] | None = None
        self.layer_names: dict = {}  # shared: the layers are named in call order
        self.shared: tuple | None = None  # (optimized layers, per layer the kept peers)
        self.over_budget_steps = 0
        self.predicted: list[int | None] = []  # per step before the last: bytes planned
        self._last: tuple[list, bool] | None = None  # the last step: its blocks' stats, in sar

    def __call__(self, blocks) -> list[DistGraph]:
        shards = [b.shard.to(self.device) for b in blocks]
        if self.graphs is not None and self._called_out_of_order():
            # the first step showed the call order: its blocks ran another layer's share in
            # sar; the step's programs are planned again, the budget shared in call order
            self.predicted.append(self._predict(*self._last))
            self.graphs = None
        if self.graphs is None:  # collective: every worker builds the first step's together
            self.graphs = self._build(shards, **self.options)
            self._share_budget()
            self._last = ([g.stats for g in self.graphs], False)
            return self.graphs
        stats, over = self._gather(shards)
        self.predicted.append(self._predict(*self._last))  # its programs have run by now
        for g in [*self.graphs, *(self.fallback or ())]:
            g.subgraph_runs.clear()   # the last step's relations, priced
        self._last = (stats, over)
        if not over:
            return [g.on_shard(s) for g, s in zip(self.graphs, shards)]
        self.over_budget_steps += 1
        if self.fallback is None:
            self.fallback = self._build(shards, **{**self.options, "exec_mode": "sar",
                                                   "mem_budget": None})
            return self.fallback
        return [g.on_shard(s) for g, s in zip(self.fallback, shards)]

    def _build(self, shards, **options) -> list[DistGraph]:
        graphs = [DistGraph(s, self.group, mode=self.mode, **options) for s in shards]
        for g in graphs:
            g.layer_names = self.layer_names
        return graphs

    def _share_budget(self) -> None:
        from ..planner.plan import share_budget
        from .schedule import shares_budget, step_layers
        first = self.graphs[0]
        if not shares_budget(first) or not self.layers:
            return
        if len(self.layers) != len(self.graphs):
            raise TrainError(f"the model has {len(self.layers)} sarc layers but the step has "
                             f"{len(self.graphs)} blocks")
        fns = step_layers(self.layers)
        kept = share_budget(fns, [g.stats for g in self.graphs], first.mem_budget, first.baseline)
        for i, (layer, g, k) in enumerate(zip(self.layers, self.graphs, kept)):
            g.kept_share[id(layer)] = k
            g.share_of = (i, tuple(self.layers))
        self.shared = (fns, kept)

    def _called_out_of_order(self) -> bool:
        """Whether the last step's blocks ran the model's sarc layers in another order than
        ``layers`` (their declaration order); if so ``layers`` becomes the call order. Every
        worker runs the same model, so every worker finds the same."""
        ran = [g.ran_by for g in self.graphs]
        if self.shared is None or any(r is None for r in ran) or \
                all(r is m for r, m in zip(ran, self.layers)) or \
                sorted(map(id, ran)) != sorted(map(id, self.layers)):
            return False
        self.layers = ran
        return True

    def _gather(self, shards) -> tuple[list, bool]:
        """This step's blocks' statistics on every worker, and whether the planned programs
        would keep more than the budget of them on some worker (collective)."""
        from ..planner.plan import step_kept_bytes
        from ..planner.stats import ShardStats
        first = self.graphs[0]
        p, r = first.size, first.rank
        over = 0
        if self.shared is not None:
            fns, kept = self.shared
            budget = self.options["mem_budget"]
            need = step_kept_bytes(fns, [ShardStats.of_worker(s) for s in shards], kept, r,
                                   first.baseline)
            over = int(need > (budget if isinstance(budget, int) else budget[r]))
        mine = [over, *(f for s in shards for f in ShardStats.worker_figures(s))]
        t = torch.tensor(mine, dtype=torch.int64, device=comm_device(self.group))
        rows = [torch.zeros_like(t) for _ in range(p)]
        try:
            dist.all_gather(rows, t, group=self.group)
        except RuntimeError as e:
            raise ExchangeError(f"gathering the step's block sizes from the workers failed (a "
                                f"worker died or did not answer in time): "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        rows = [row.cpu().tolist() for row in rows]
        width = p + 3  # a layer's worker_figures
        stats = [ShardStats.from_figures([row[1 + k * width:1 + (k + 1) * width] for row in rows])
                 for k in range(len(shards))]
        return stats, any(row[0] for row in rows)

    def planned_bytes_sent(self, last: int) -> int | None:
        """The planner's bytes this worker sent in the last ``last`` steps (forward +
        backward of every layer), each step priced on its own blocks with the programs it
        ran (None before a step ran under autograd)."""
        if self._last is None or last < 1:
            return None
        steps = self.predicted[max(0, len(self.predicted) - (last - 1)):] if last > 1 else []
        steps = [*steps, self._predict(*self._last)]
        return None if None in steps else sum(steps)

    def _predict(self, stats: list, in_sar: bool) -> int | None:
        """The planner's bytes of the step that ran on ``stats``: the program each block's
        layer ran (whichever layer the model called on it, in whatever order it declares
        them; a patched conv's, made at its call)."""
        from ..planner.plan import step_bytes_sent
        plans, priced = [], []
        for g, st in zip(self.fallback if in_sar else self.graphs, stats):
            fetched = False
            if g.subgraph_runs:   # a HeteroConv's block: each relation's, on its own edges
                ran = [sub.ran_program for sub in g.subgraph_runs]
                priced += [sub.stats for sub in g.subgraph_runs]
            else:   # a layer's program, or a HeteroConv's fetches of its inputs (halo)
                ran = list(g.training_programs.values())
                priced += [st] * len(ran)
                fetched = bool(ran) and all(isinstance(r, FetchRun) for r in ran)
            if any(r is None for r in ran) or (len(ran) != 1 and not g.subgraph_runs
                                               and not fetched):
                return None   # the step ran without autograd
            plans += [r.plan for r in ran]
        return step_bytes_sent(plans, priced)[self.graphs[0].rank]


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
    shard = load_shard(cfg.partition, group)
    pset = open_partition(cfg.partition, verify=False)  # its metadata: checked by load_shard
    hp["dataset"] = recorded_dataset(cfg, pset)  # what it trains on, not the model file's
    counter = ByteCounter()
    # the dataset's declared classes and types; prepared on the CPU, moved once
    data = prepare_worker(shard, hp, group, pset.sizes).to(device)
    shard = shard.to(device)
    torch.manual_seed(cfg.seed)
    model = placed(_build(spec, data, hp, shard.num_nodes,
                          sharded_table(shard, group, timeout, cfg.seed), name=dataset_name(cfg),
                          group=group, say=say),
                   device, cfg.backend)
    # the edge data the model reads, by its layers' declared names (not all the partition has)
    reads = tuple(edge_inputs_for(model, {k: None for e in shard.edata for k in e}))
    if hp["self_loops"]:  # the loops' shard keeps what the model reads and the draws' weights
        kept = reads
        if cfg.minibatch is not None:
            shard = dataclasses.replace(shard, edata=tuple(cfg.minibatch.carried(e, reads)
                                                           for e in shard.edata))
            kept = tuple(shard.edata[rank])
        shard = with_self_loops(shard, Exchanger(rank, size, group, counter, timeout), kept)
    dg = DistGraph(shard, group, exec_mode=cfg.exec_mode, mem_budget=cfg.mem_budget,
                   baseline=cfg.baseline, timeout=timeout, counter=counter)
    edge_inputs = {k: dg.edge_data(k) for k in reads}
    if "ntype" in shard.ndata:  # node types, to a model that reads them (its local rows)
        edge_inputs.update(edge_inputs_for(model, {"ntype": shard.ndata["ntype"]}))

    broadcast_parameters(model, group)
    dg.share_memory(model)  # the memory budget is the whole step's, shared by its layers
    seed_all(cfg.seed * 1000003 + rank)  # each worker its own dropout stream
    opt = optimizer(model, hp)
    if not data.counts["train"]:
        raise TrainError("the partitioned dataset has no labeled training nodes")
    say(f"sarc train: {spec.name} on {shard.num_nodes} nodes, {size} workers "
        f"({dist.get_backend(group)}, {device}, {kernels(model)} kernels), exec mode "
        f"{cfg.exec_mode or 'planner'}"
        f"{', baseline' if cfg.baseline else ''}, seed {cfg.seed}, "
        f"{count_parameters(model)} parameters")

    selection = ModelSelection(data.counts["val"] > 0, hp["patience"])
    best = selection.best
    run = _run_record(spec, cfg, hp, size, pset) if cfg.checkpoint or cfg.save_path else None
    full = Batch(dg, data.x, edge_inputs, data.label, data.masks,
                 train_total=data.counts["train"], node_ids=global_ids(shard))
    last = int(hp["epochs"])
    if cfg.minibatch is None:
        source = ShardSteps(full, data.counts, dg)

        def line(*progress) -> str:
            return (epoch_line(*progress, of=last) +
                    f" | sent {dg.counter.total_sent / 2**20:.2f} MiB (worker 0)")
    else:
        edge_names, node_names = minibatch_inputs(edge_inputs)
        check_minibatch_budget(model, cfg.mem_budget)
        blocks = BlockGraphs(group, cfg.minibatch.mode, device, layers=sarc_layers(model),
                             exec_mode=cfg.exec_mode,
                             mem_budget=cfg.mem_budget, baseline=cfg.baseline, timeout=timeout,
                             counter=counter)
        # sampled on the CPU; each block's DistGraph moves it to the device (BlockGraphs)
        source = MiniBatchSteps(shard.to("cpu"), cfg.minibatch, layers=graph_layers(model),
                                seed=cfg.seed,
                                comm=Comm(sampling_group(group, timeout), timeout=timeout),
                                prefetch=True,
                                rows=ShardRows(data.x, data.label, data.masks["train"]),
                                evaluation=full, counts=data.counts, graphs_of=blocks,
                                edge_names=edge_names, node_names=node_names,
                                counter=counter)
        say(f"{cfg.minibatch.mode} mode: {plural(source.seeds.steps, 'step')} per epoch, fanouts "
            f"{', '.join(map(str, source.spec.fanouts))}")

        def line(*progress) -> str:
            return f"{epoch_line(*progress, of=last)} | {source.progress()} (worker 0)"

    out = fit(model, opt, source, selection, epochs=last, reduction=AllReduce(group),
              checkpoint=cfg.checkpoint, run=run, log=log, log_every=cfg.log_every,
              eval_every=cfg.eval_every, line=line,
              check_output=output_check(spec, model, data.num_classes, dataset_name(cfg)))
    if cfg.minibatch is None:
        step_bytes, planned = (source.step_bytes[-1] if source.step_bytes else 0,
                               dg.planned_bytes_sent())
        kept = dg.planned_bytes_kept()
        programs = dg.step_calls.programs or list(dg.training_programs.values())
        sampled = {"planned_step_bytes_kept": kept,
                   "over_budget": kept is not None and cfg.mem_budget is not None
                   and kept > cfg.mem_budget,
                   "fetched_once": any(isinstance(p, FetchRun) for p in programs)}
    else:  # the mean step of the last epoch, each step planned on its own blocks
        h = source.history[-1] if source.history else {"bytes_sent": 0, "steps": 1,
                                                        "sampling_bytes_sent": 0}
        steps = max(1, h["steps"])
        planned = blocks.planned_bytes_sent(h["steps"]) if source.history else None
        step_bytes, planned = h["bytes_sent"] // steps, None if planned is None else planned // steps
        sampled = {"epoch_sampling_bytes_sent": h["sampling_bytes_sent"],
                   "epoch_setup_bytes_sent": h.get("setup_bytes_sent", 0),
                   "over_budget_steps": blocks.over_budget_steps}
        programs = [p for g in blocks.graphs or () for p in g.training_programs.values()]
    mine = {"rank": rank, **peak_memory(fixed_rss), **embedding_bytes(model, opt), **sampled,
            "step_bytes_sent": step_bytes,
            "planned_step_bytes_sent": planned,
            "epoch_bytes_sent": dg.counter.total_sent, "epoch_bytes_received": dg.counter.total_received}
    workers: list = [None] * size
    dist.all_gather_object(workers, mine, group=group)
    result = {
        "model": spec.name, "dataset": hp["dataset"], "workers": size, "exec_mode": cfg.exec_mode,
        "baseline": cfg.baseline,
        **MiniBatchConfig.report(cfg.minibatch),
        "device": str(device), "backend": kernels(model),
        "seed": cfg.seed, "epochs": out.epochs, "best_epoch": best["epoch"],
        "train_acc": best["train_acc"], "val_acc": best["val_acc"], "test_acc": best["test_acc"],
        "final_test_acc": out.acc.get("test"), "final_loss": out.loss, "time_s": out.elapsed_s,
        "epoch_ms": out.elapsed_s / max(1, out.epochs) * 1e3, **timings(out),
        "hparams": dict(hp),
        "per_worker": workers,
        "plans": [{"layer": p.name, "exec_mode": p.plan.exec_mode, "bytes_sent": p.plan.bytes_sent}
                  for p in programs],
    }
    say(format_report(workers, cfg.mem_budget))
    selected = whole_embedding(best["state"], model, shard, group, timeout) if cfg.save_path else None
    if rank == 0 and cfg.save_path:
        best["state"] = selected  # the selected state, its sharded embedding whole
        sizes = {"in_feats": data.num_features, "num_classes": data.num_classes,
                 "num_nodes": shard.num_nodes, "num_etypes": data.num_etypes,
                 "num_ntypes": data.num_ntypes}
        save_selected(cfg.save_path, selection, run=run, hparams=hp, sizes=sizes)
    if rank == 0 and cfg.json_path:
        from ..training.loop import write_result
        write_result(cfg.json_path, result)
    return {**result, "module": model}


def _run_record(spec: ModelSpec, cfg: WorkerConfig, hp: dict, size: int, pset) -> dict:
    hp = cfg.minibatch.recorded(hp) if cfg.minibatch else hp
    return run_record(spec, hp, seed=cfg.seed, dataset=recorded_dataset(cfg, pset),
                      graph=pset.fingerprint, world_size=size,
                      partition=partition_fingerprint(pset), node_data=pset.node_digests,
                      eval_every=cfg.eval_every, baseline=cfg.baseline)


def recorded_dataset(cfg: WorkerConfig, pset=None) -> str:
    """The dataset a worker's run records (checkpoints, ``--save``, ``--json``): the name
    ``sarc train`` checked against the partition, else the one the set records, else the
    partitioned graph's fingerprint."""
    if cfg.dataset:   # an .npz file by its absolute path, as one process records it
        return npz_file(cfg.dataset) or cfg.dataset
    pset = pset or open_partition(cfg.partition, verify=False)
    return pset.dataset or f"graph {pset.fingerprint}"


def dataset_name(cfg: WorkerConfig) -> str:
    """The dataset as errors name it: its name, else where its partition set is."""
    return cfg.dataset or f"partitioned at {cfg.partition}"


def count_parameters(model: nn.Module) -> int:
    """The whole model's parameters, as one process counts them: a sharded embedding
    (not an ``nn.Parameter``, and only its rows here) at its full size."""
    return (sum(p.numel() for p in model.parameters())
            + sum(m.num_rows * m.dim for m in model.modules() if isinstance(m, Embedding)))


def _all_gather(obj, group) -> list:
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def global_ids(shard: ShardedGraph) -> torch.Tensor:
    """The global ids (the partition's numbering) of the shard's local nodes."""
    lo, hi = shard.local_range
    return torch.arange(lo, hi, device=shard.orig_node_ids.device)


def sharded_table(shard: ShardedGraph, group, timeout: datetime.timedelta, seed: int):
    """``table(num_nodes, dim)`` for ``sarc.train.build``: a featureless graph's learned input
    as this worker's shard of a ``sarc.distributed.Embedding``, each row drawn by its node's
    original id (as one process draws the whole table)."""
    def table(num_nodes: int, dim: int) -> Embedding:
        return Embedding(num_nodes, dim, offsets=shard.node_offsets.cpu(), rank=shard.rank,
                         comm=Comm(group, timeout=timeout), seed=seed, scale=EMBEDDING_SCALE,
                         keys=shard.orig_node_ids.cpu())
    return table


def embedding_bytes(model: nn.Module, opt) -> dict[str, int]:
    """This worker's bytes of sharded embedding rows and of their optimizer state (none
    without a sharded embedding)."""
    tables = [m for m in model.modules() if isinstance(m, Embedding)]
    if not tables:
        return {}
    state = getattr(opt, "embedding", None)
    return {"embedding_bytes": sum(t.nbytes for t in tables),
            "embedding_state_bytes": int(getattr(state, "nbytes", 0))}


def whole_embedding(state: dict, model: nn.Module, shard: ShardedGraph, group,
                    timeout: datetime.timedelta) -> dict | None:
    """``state`` (a worker's model state) with each sharded embedding's rows gathered on
    rank 0 in original node order, the whole table ``sarc.load_trained`` loads; None on
    the other ranks (collective)."""
    comm = Comm(group, timeout=timeout)
    names = [n for n, m in model.named_modules() if isinstance(m, Embedding)]
    offsets = shard.node_offsets.cpu()
    sizes = [int(offsets[j + 1] - offsets[j]) if comm.rank == 0 else 0 for j in range(comm.size)]
    out = dict(state) if comm.rank == 0 else None
    for name in names:
        rows = state[f"{name}.weight"]
        ids = comm.exchange([shard.orig_node_ids.cpu()] + [shard.orig_node_ids[:0].cpu()]
                            * (comm.size - 1), sizes, kind="save ids")
        got = comm.exchange([rows.cpu()] + [rows[:0].cpu()] * (comm.size - 1), sizes,
                            kind="save rows")
        if comm.rank == 0:
            whole = rows.new_empty((int(offsets[-1]), rows.shape[1]), device="cpu")
            for i, r in zip(ids, got):
                whole[i] = r
            out[f"{name}.weight"] = whole
    return out


def _build(spec: ModelSpec, data: WorkerData, hp: dict, num_nodes: int,
           table=None, *, name: str, group=None,
           say: Callable[[str], None] = lambda s: None) -> nn.Module:
    """The model of ``spec`` for this worker, its plain batch norms normalizing over every
    worker's rows (``sync_batch_norms``), as on one process."""
    from ..datasets import Dataset
    # sarc.train.build reads the sizes off a Dataset; give it one with this graph's sizes and
    # the dataset's name (``dataset_name``), which its errors say
    empty = torch.zeros(0, dtype=torch.int64)
    stub = Dataset(name, num_nodes, empty, empty, torch.zeros(0, data.num_features),
                   empty, empty.bool(), empty.bool(), empty.bool(), data.num_classes,
                   etype=empty if data.num_etypes else None, num_etypes=data.num_etypes,
                   ntype=empty if data.num_ntypes else None, num_ntypes=data.num_ntypes)
    from ..train import build
    model = build(spec, stub, hp, table=table)
    synced = sync_batch_norms(model, group)
    if synced:
        say(f"batch norm {', '.join(synced)}: normalized over every worker's rows "
            f"(sarc.distributed.SyncBatchNorm), as on one process")
    return model


def _mib(n: float) -> str:
    from ..planner.plan import _fmt_bytes
    return _fmt_bytes(n)


def format_report(workers: list[dict], mem_budget: int | None = None) -> str:
    """Per worker: peak memory (and its fixed and data parts, ``peak_memory``), the sharded
    embedding's rows + optimizer state (if any), bytes sent / received in the last epoch;
    and the workers whose full-batch step keeps more than ``mem_budget`` for backward, and
    why (``sarc.planner.plan.over_budget_why``)."""
    emb = any("embedding_bytes" in w for w in workers)
    lines = ["worker    peak RSS = (    fixed +       data)   cuda peak"
             + ("  embedding (rows + optimizer)" if emb else "")
             + "  sent/epoch  recv/epoch  sent/step (planner)"]
    for w in workers:
        planned = "-" if w["planned_step_bytes_sent"] is None else _mib(w["planned_step_bytes_sent"])
        table = (f"  {_mib(w['embedding_bytes']) + ' + ' + _mib(w['embedding_state_bytes']):>28}"
                 if emb else "")
        lines.append(f"{w['rank']:>6}  {_mib(w['rss_peak']):>10} = "
                     f"({_mib(w['fixed_rss']):>9} + {_mib(w['data_rss']):>10})  "
                     f"{_mib(w['cuda_peak']) if 'cuda_peak' in w else '-':>10}{table}  "
                     f"{_mib(w['epoch_bytes_sent']):>10}  {_mib(w['epoch_bytes_received']):>10}  "
                     f"{_mib(w['step_bytes_sent'])} ({planned})")
    from ..planner.plan import over_budget_why
    over = [w["rank"] for w in workers if w.get("over_budget")]
    if over:
        lines.append(f"over the budget {_mib(mem_budget)} on workers {over}: a step keeps "
                     f"{', '.join(_mib(workers[r]['planned_step_bytes_kept']) for r in over)} "
                     f"for backward: "
                     f"{over_budget_why(any(workers[r].get('fetched_once') for r in over))}")
    return "\n".join(lines)
