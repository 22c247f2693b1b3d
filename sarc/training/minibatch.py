"""Mini-batch training modes: MFG and neighbour sampling as step sources of the loop.

    steps = MiniBatchSteps(shard, MiniBatchConfig("sampling", (10, 25), batch_size=256),
                           layers=2, seed=0, comm=comm, rows=rows, evaluation=full,
                           counts=counts, graphs_of=graphs_of)
    fit(model, opt, steps, selection, epochs=..., reduction=...)

Per epoch, the labeled training nodes of the graph, reshuffled from (seed, epoch), come
in batches of ``batch_size`` seeds over all workers (``SeedBatches``): a step's seeds are
the same whatever the number of workers, and every worker takes every step. A step's
blocks are the K-hop closure of the seeds of all workers (``NeighbourSampler``): every
in-edge (``mfg``) or a sample of ``fanouts[k-1]`` in-edges per destination at layer k
(``sampling``).

The model runs on the step's blocks as on one graph (``MiniBatchGraph``): its k-th sarc
layer call runs on block k, a ``Graph`` on one process or a ``DistGraph`` on P workers
(``graphs_of``), so the model files do not change. The step's loss is the sum of the
seeds' cross-entropies divided by the step's seeds over all workers.

Nothing is fetched for a step: the sampler hands each worker the seeds it owns and
makes its local rows of every block its own nodes, so the input rows (features, the
global ids of an embedding input's rows) and the seeds' labels are rows of the worker's
shard; remote
input rows cross in the first layer's exchange, as in full-batch training. The next
step is sampled in a thread while a step computes (``prefetch``): on P workers the
sampler has a process group of its own (gloo, ids only), so its exchanges never
interleave with the layers' collectives on the training group.

Evaluation is full-graph inference (``evaluation``: the full-batch batch of the whole
graph or the worker's shard), so accuracies and the model selection are those of the
full-batch trainer on the same weights.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from ..checkpoint import injected_fault
from ..graph import missing_attribute
from ..names import one_line
from ..native.allocator import kept_between_steps
from ..runtime.bind import resolve_features
from ..runtime.sharded import ShardedGraph
from ..sampling import Comm, LayerBlock, NeighbourSampler, SamplingSpec
from ..sampling.draws import SHUFFLE_KEY, uniform
from ..sampling.neighbours import edge_weights
from ..sampling.spec import check_prob
from ..trace import user_loc
from ..trace_guards import raised_at
from .inputs import TrainError
from .loop import Batch, epoch_line

MINIBATCH_MODES = ("mfg", "sampling")


@dataclass(frozen=True)
class MiniBatchConfig:
    """What a mini-batch mode samples per step. ``fanouts``: per layer, input layer first
    (sampling only); ``batch_size``: the step's seeds over all workers (None: every
    training node, one step per epoch)."""

    mode: str
    fanouts: tuple[int, ...] | None = None
    batch_size: int | None = None
    replace: bool = False
    prob: str | None = None
    shuffle: bool = True
    drop_last: bool = False

    def __post_init__(self):
        if self.mode not in MINIBATCH_MODES:
            raise TrainError(f"unknown mini-batch mode {self.mode!r}; expected one of "
                             f"{', '.join(MINIBATCH_MODES)}")
        b = self.batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise TrainError(f"the batch size must be a positive number of seed nodes, got {b!r}")
        if self.mode == "mfg" and (self.fanouts is not None or self.replace or self.prob):
            raise TrainError("--mode mfg takes every in-edge of every layer; --fanouts, "
                             "--replace and --prob are for --mode sampling")
        if self.mode == "sampling" and self.fanouts is None:
            raise TrainError("--mode sampling needs --fanouts, one per graph layer "
                             "(e.g. --fanouts 10,25; -1 takes every in-edge)")

    def recorded(self, hparams: dict) -> dict:
        """``hparams`` with this mode, as a checkpoint records a run (so that a run of
        another mode does not resume it)."""
        fields = dataclasses.asdict(self)
        return {**hparams, "training": ", ".join(f"{k}={v}" for k, v in fields.items())}

    @staticmethod
    def report(config: "MiniBatchConfig | None") -> dict:
        """What a run's result says of its mode: ``mode`` and, in mini-batches, the
        options it sampled with (``minibatch``; None full-batch)."""
        if config is None:
            return {"mode": "full", "minibatch": None}
        fields = dataclasses.asdict(config)
        fields["fanouts"] = None if config.fanouts is None else list(config.fanouts)
        return {"mode": fields.pop("mode"), "minibatch": fields}

    def carried(self, edge_data: Mapping[str, torch.Tensor],
                reads: Iterable[str]) -> dict[str, torch.Tensor]:
        """The edge data a mini-batch graph keeps of ``edge_data`` (the dataset's, or one
        block's of a shard): what the model reads (``reads``), and the ``prob`` weights,
        which must be there. Weights the model does not read are float64, the sampler's
        type, so that a self loop takes ``SELF_LOOP_FILL`` whatever the file's type."""
        kept = {k: edge_data[k] for k in reads}
        if self.prob is None or self.prob in kept:
            return kept
        check_prob(self.prob, edge_data, "the dataset")
        w = edge_data[self.prob]
        return {**kept, self.prob: edge_weights(w, self.prob).to(w.device)}

    def check_steps(self, seeds: int) -> None:
        """Refuse an epoch of no step: ``--drop-last`` with fewer ``seeds`` (the graph's
        training nodes) than a batch."""
        if self.drop_last and self.batch_size is not None and seeds < self.batch_size:
            raise TrainError(f"--drop-last with a batch size of {self.batch_size}: the graph "
                             f"has {seeds} training nodes, no full batch")

    def spec(self, layers: int, seed: int) -> SamplingSpec:
        """The sampling spec for a model of ``layers`` graph layers (checked against them)."""
        if layers == 0:
            raise TrainError(f"--mode {self.mode}: the model has no sarc layer to run on the "
                             f"sampled blocks (its forward calls none)")
        if self.mode == "mfg":
            return SamplingSpec.mfg(layers, seed=seed)
        fanouts = self.fanouts
        try:
            return SamplingSpec.of(fanouts if isinstance(fanouts, (str, bytes)) else
                                   list(fanouts), layers=layers, replace=self.replace,
                                   prob=self.prob, seed=seed)
        except ValueError as e:
            raise TrainError(str(e)) from None


def sarc_layers(model: nn.Module) -> list:
    """The sarc layers of ``model`` in module order, the order a forward pass calls them
    in (each once, as the model files do): layer k runs on a step's block k."""
    from ..dsl import Layer
    return [m for m in model.modules() if isinstance(m, Layer)]


def graph_layers(model: nn.Module) -> int:
    """The blocks a step of ``model`` needs: one per sarc layer, per ``sarc.HeteroConv``
    (its relations' layers run on one block: ``MiniBatchGraph.take_block``), and per round
    of a library conv that runs through sarc by itself (DGL's convs after ``patch()``, whose
    layers are made at their first call: ``forward._sarc_round_count``)."""
    from ..dsl import Layer
    from ..hetero import HeteroConv
    convs = [m for m in model.modules() if isinstance(m, HeteroConv)]
    # a module a conversion holds (from_dgl_module's) runs through the conversion's layers
    held = {id(sub) for m in model.modules()
            if isinstance(m, Layer) or getattr(m, "_sarc_converted", False)
            for sub in m.modules() if sub is not m}
    inside = {id(sub) for c in convs for sub in c.modules() if sub is not c}
    routed = sum(type(m).forward._sarc_round_count(m) for m in model.modules()
                 if getattr(type(m).forward, "_sarc_routed", False) and id(m) not in held)
    return sum(id(m) not in inside for m in sarc_layers(model)) + len(convs) + routed


def check_minibatch_budget(model: nn.Module, mem_budget) -> None:
    """A memory budget of a step on workers is shared over its blocks, a sarc layer's
    each (``sarc.distributed.train.BlockGraphs``); a ``sarc.HeteroConv``'s block runs a
    layer per relation, which the sharing does not price: refused with a budget."""
    from ..hetero import HeteroConv
    if mem_budget is not None and any(isinstance(m, HeteroConv) for m in model.modules()):
        raise TrainError("--mem-budget in a mini-batch mode shares the budget over the step's "
                         "blocks, one sarc layer each; a sarc.HeteroConv runs a layer per "
                         "relation on its block, which it does not price: train it without "
                         "--mem-budget, or full-batch")


def never_called(model: nn.Module | None, called: set[int]) -> str:
    """``; it never called ...``, naming the sarc layers of ``model`` whose ids are not in
    ``called`` (a forward pass that left them out: each still counts as a block)."""
    from ..dsl import Layer
    names = [name for name, m in (model.named_modules() if model is not None else ())
             if isinstance(m, Layer) and id(m) not in called]
    if not names:
        return ""
    return (f"; it never called {', '.join(names)}: remove the sarc layers a forward pass "
            f"does not call, or call them")


def _layer_name(model: nn.Module | None, layer) -> str:
    """``layer``'s name in ``model`` (its attribute path), else its class's."""
    for name, m in (model.named_modules() if model is not None else ()):
        if m is layer and name:
            return name
    return type(layer).__name__


_ROWS_MISMATCH = "at non-singleton dimension 0"
"""torch's error for two operands of other row counts (``The size of tensor a (1664) must
match the size of tensor b (644) at non-singleton dimension 0``)."""


@dataclass(frozen=True, eq=False)
class BlockCall:
    """A module's call on one block of a step that runs its own layers on it
    (``sarc.HeteroConv``, a layer per relation): the block (a ``Graph``, or a worker's
    ``DistGraph``), its edges' span ``[lo, hi)`` in the step's edge inputs (of
    ``step_edges``), its local rows as rows of the whole graph's (this worker's: where
    the whole graph's degrees are read) and the whole graph with its inputs (the
    evaluation ``Batch``, which normalizes as a block must)."""

    graph: Any
    edges: tuple[int, int]
    step_edges: int
    rows: torch.Tensor | None
    whole: Batch | None
    inputs: Mapping[str, torch.Tensor] | None = None   # the step's own (the model's inputs)


class MiniBatchGraph:
    """A step's blocks as the graph ``model(g, x)`` runs on: its k-th sarc layer call in a
    forward pass runs on ``graphs[k]`` (block k + 1, input layer first).

    Edges are every block's, block after block: edge inputs of the step
    (``Batch.edge_inputs``) and ``dst`` / ``perm`` / ``num_edges`` cover them all, and a
    layer call gets its block's slice of an edge input of that length. Their
    destinations are every block's too: ``dst`` numbers each block's after the previous
    block's, and ``num_dst`` and ``in_degree`` (the whole graph's, as a layer reads
    ``dst.in_degree``) count them so; so a per-edge quantity a model computes from ``g``
    (R-GCN's 1 / |N_r(v)|, ``1 / g.in_degree[g.input_dst]``: ``input_dst`` is ``dst`` in
    the edge inputs' order, ``dst`` in CSR order) is each block's, on one process
    and on P workers alike. It has no ``src`` (``WHY_NOT``): each block's sources are
    numbered by that block, and on workers not at all. What else a model reads of ``g``
    (``num_src``, ``out_degree``, ``device``) answers for the block of its next layer
    call (``current``).

    ``rows[k]``: block k's local rows as rows of the whole graph's local rows (this
    worker's), and ``whole``: the whole graph's ``Batch``; what a module that runs several
    layers on a block reads (``take_block``)."""

    WHY_NOT = {"src": "in mfg and sampling modes `g` is a step's blocks, whose edges run "
                      "from each block's sources, numbered by that block (on workers, "
                      "partly other workers' rows), so it has no `src`; a layer reads its "
                      "sources through the DSL (`edges.src`), and `dst` / `perm` / "
                      "`in_degree` give every block's destinations"}

    def __init__(self, graphs: Sequence[Any], rows: Sequence[torch.Tensor] | None = None,
                 whole: Batch | None = None, inputs: Mapping[str, torch.Tensor] | None = None):
        if not graphs:
            raise TrainError("a mini-batch graph needs at least one block")
        self.graphs = tuple(graphs)
        self.rows, self.whole = rows, whole
        self.inputs = inputs   # the step's edge and node inputs, as the model is given them
        offsets = [0]
        for g in self.graphs:
            offsets.append(offsets[-1] + g.num_edges)
        self.edge_offsets = tuple(offsets)
        self.calls = 0
        self.called: set[int] = set()   # the ids of the layers called in this pass
        self.callers: set[int] = set()  # and of the modules that called (check_call)
        self.model: nn.Module | None = None   # the model of this pass (its layers' names)
        self.in_pass = False   # within forward_pass (else the model was called on it directly)

    @contextlib.contextmanager
    def forward_pass(self, model: nn.Module | None = None):
        """One forward pass (of ``model``): the layer calls start at block 1, and must use
        every block."""
        self.calls, self.called, self.callers, self.model = 0, set(), set(), model
        self.in_pass = True
        try:
            yield self
        except RuntimeError as e:
            if _ROWS_MISMATCH not in str(e):
                raise
            where = raised_at(e)
            raise TrainError(f"{f'{where}: ' if where else ''}{one_line(e)}; in mfg and "
                             f"sampling modes a layer's output has its block's destination "
                             f"rows, fewer than its input: a value made before the layer and "
                             f"combined with its output (an initial residual h0) is cut to its "
                             f"rows, h0[:h.shape[0]]") from e
        finally:
            self.in_pass = False
        calls, self.calls, self.callers = self.calls, 0, set()   # a direct call: a new pass
        if calls != len(self.graphs):
            raise TrainError(self._mismatch(f"{calls} sarc layer call{'s' * (calls != 1)}") +
                             (never_called(model, self.called) if calls < len(self.graphs)
                              else ""))

    def _mismatch(self, what: str) -> str:
        n = len(self.graphs)
        return (f"the model made {what} in one forward pass, but the step has {n} block"
                f"{'s' * (n != 1)} (one per sarc layer: the model's layers are counted when "
                f"training starts, and --fanouts gives one per layer); a model in mfg or "
                f"sampling mode calls each of its sarc layers once, input layer first")

    @property
    def current(self):
        return self.graphs[min(self.calls, len(self.graphs) - 1)]

    def check_call(self, caller: nn.Module) -> None:
        """``caller`` (a sarc layer, or a library conv that declares its layer from its
        first call's rows, before it reads the rows of a block not its own) has a block
        left for it; where none is left and it was called before in the pass (weight
        sharing, a block per layer), it is named, at the line that calls it."""
        again = id(caller) in self.callers
        self.callers.add(id(caller))
        if self.calls >= len(self.graphs):
            if not self.in_pass:   # the model called on the step's graph, not its first time
                raise TrainError(f"every block of the step ({len(self.graphs)}) was taken by "
                                 f"earlier sarc layer calls on this graph: a forward pass "
                                 f"called on it directly again starts in `with "
                                 f"graph.forward_pass(model):` (sarc.training.loop.forward "
                                 f"runs each pass so); within one pass, each sarc layer is "
                                 f"called once (a block per layer)")
            if again:   # a block per call: a layer called again takes one no layer has
                from .layer_calls import called_again
                raise TrainError(called_again(_layer_name(self.model, caller), user_loc()))
            raise TrainError(self._mismatch(f"more than {len(self.graphs)} sarc layer calls"))

    def take_block(self, caller: nn.Module) -> BlockCall:
        """The next block, for ``caller``'s call: a sarc layer's, or a module's that runs
        layers of its own on it (which count as called)."""
        k = self.calls
        self.check_call(caller)
        self.calls += 1
        self.called.update(id(m) for m in caller.modules())
        return BlockCall(self.graphs[k], (self.edge_offsets[k], self.edge_offsets[k + 1]),
                         self.num_edges, None if self.rows is None else self.rows[k],
                         self.whole, self.inputs)

    def run_layer(self, layer, args: tuple, feats: dict):
        call = self.take_block(layer)
        given = resolve_features(layer, args, feats)
        lo, hi = call.edges
        for name in layer._sarc_edge:
            t = given.get(name)
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == self.num_edges:
                given[name] = t[lo:hi]
        return call.graph.run_layer(layer, (), given)

    @property
    def num_edges(self) -> int:
        return self.edge_offsets[-1]

    @property
    def dst(self) -> torch.Tensor:
        return self._destinations("dst")

    def _destinations(self, name: str) -> torch.Tensor:
        """Every block's ``name`` (its edges' destination rows), each block's numbered
        after the previous block's."""
        out, base = [], 0
        for g in self.graphs:
            out.append(getattr(g, name) + base)
            base += g.num_dst
        return torch.cat(out)

    @property
    def perm(self) -> torch.Tensor:
        return torch.cat([g.perm + off for g, off in zip(self.graphs, self.edge_offsets)])

    @property
    def input_dst(self) -> torch.Tensor:
        """Every block's edges' destinations (numbered as ``dst`` numbers them) in the order
        of the step's edge inputs."""
        return self._destinations("input_dst")

    @property
    def num_dst(self) -> int:
        return sum(g.num_dst for g in self.graphs)

    @property
    def in_degree(self) -> torch.Tensor:
        """[num_dst]: every block's destinations' in-degrees, numbered as ``dst`` numbers
        them."""
        return torch.cat([g.in_degree for g in self.graphs])   # each block's has num_dst rows

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("graphs", "calls", "edge_offsets", "rows", "whole"):
            raise AttributeError(name)
        if name in self.WHY_NOT:
            missing_attribute(self, name)
        return getattr(self.current, name)

    def __repr__(self) -> str:
        return f"MiniBatchGraph({', '.join(map(repr, self.graphs))})"


def local_blocks(blocks: Sequence[LayerBlock], device: torch.device | None = None) -> list:
    """``graphs_of`` on one process: each block's local block, a ``Graph`` (on ``device``),
    with its sources' in-degrees in the whole graph (``src.in_degree``)."""
    graphs = [dataclasses.replace(b.local_block, src_in_degree=b.shard.in_degree)
              for b in blocks]
    return graphs if device is None else [g.to(device) for g in graphs]


@dataclass(frozen=True, eq=False)
class ShardRows:
    """The rows a step reads of the worker's shard: its local nodes' input rows, labels
    and training mask (labeled training nodes)."""

    x: torch.Tensor
    label: torch.Tensor
    train: torch.Tensor


class SeedBatches:
    """Per epoch, the steps' seeds: the graph's labeled training nodes in the order of
    ``draws.uniform(seed, epoch, SHUFFLE_KEY, original id)`` (original ids without
    ``shuffle``), ``batch_size`` after ``batch_size`` (None: all in one step). A worker's
    seeds of a step are its nodes among them; so the steps are the same whatever the
    number of workers. Every worker keeps the original ids of all training nodes
    (gathered once, 8 bytes a node) to place its own in the order."""

    def __init__(self, shard: ShardedGraph, train: torch.Tensor, config: MiniBatchConfig,
                 seed: int, comm: Comm):
        train = torch.as_tensor(train).cpu()
        if train.dtype != torch.bool or train.shape != (shard.num_local,):
            raise TrainError(f"the training mask must be a bool tensor with one entry per local "
                             f"node ({shard.num_local}), got {train.dtype} {list(train.shape)}")
        local = train.nonzero().squeeze(1)
        self.nodes = local + shard.local_range[0]                 # new global ids
        mine = shard.orig_node_ids.cpu()[local]
        everyone = torch.unique(torch.cat(comm.exchange([mine] * comm.size)))  # sorted
        self.total = int(everyone.numel())
        self.where = torch.searchsorted(everyone, mine)            # my nodes among all
        self.everyone, self.seed, self.shuffle = everyone, seed, config.shuffle
        self.batch_size = config.batch_size or max(1, self.total)
        b = self.batch_size
        self.steps = self.total // b if config.drop_last else -(-self.total // b)

    def epoch(self, epoch: int):
        """``(this worker's seeds, the step's seeds over all workers)`` per step."""
        rank = torch.arange(self.total)
        if self.shuffle:
            order = torch.argsort(uniform(self.seed, epoch, SHUFFLE_KEY, self.everyone),
                                  stable=True)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(self.total)
        mine = rank[self.where]
        b = self.batch_size
        step_of = mine // b
        for s in range(self.steps):
            pick = (step_of == s).nonzero().squeeze(1)
            pick = pick[torch.argsort(mine[pick])]
            yield self.nodes[pick], min(b, self.total - s * b)


class MiniBatchSteps:
    """The steps of ``config``'s mode on ``shard`` (a worker's, or on one process the
    graph as one part): a ``sarc.training.loop.StepSource``.

    ``graphs_of(blocks)``: what each layer runs on for a step's blocks, layer k + 1 on
    block k (the local blocks on one process, ``DistGraph``s on P workers: ``BlockGraphs``); ``edge_names``: edge data the model takes as
    inputs (R-GCN's ``etype``), ``node_names``: node data it takes (``sarc.HeteroConv``'s
    ``ntype``), of a step's input rows. ``prefetch``: sample the next step in a thread while a
    step computes, which needs a ``comm`` whose process group nothing else uses at the
    same time (default: only without peers). Per epoch it records the steps, the seeds
    trained on, the seconds of the steps, the bytes the sampler sent and, given a
    ``counter`` (the layers' ``ByteCounter``), the bytes the layers' exchanges sent (and
    apart, those of the ``setup`` phase: a ``sarc.HeteroConv``'s relation sub-graphs of
    each block learn their rows' whole-graph degrees from the rows' owners)."""

    def __init__(self, shard: ShardedGraph, config: MiniBatchConfig, *, layers: int, seed: int,
                 comm: Comm, rows: ShardRows, evaluation: Batch, counts: dict[str, int],
                 graphs_of: Callable[[Sequence[LayerBlock]], Sequence[Any]], edge_names: Sequence[str] = (),
                 node_names: Sequence[str] = (), counter=None, prefetch: bool | None = None):
        self.shard, self.config, self.comm = shard, config, comm
        self.prefetch = comm.size == 1 if prefetch is None else prefetch
        self.spec = config.spec(layers, seed)
        self.rows, self.eval_batch, self.counts = rows, evaluation, dict(counts)
        self.graphs_of, self.edge_names, self.counter = graphs_of, tuple(edge_names), counter
        self.node_names = tuple(node_names)
        self.sampler = NeighbourSampler(shard, self.spec, comm)
        self.seeds = SeedBatches(shard, rows.train, config, seed, comm)
        config.check_steps(self.seeds.total)
        self.history: list[dict] = []
        self.prefetched = 0  # steps sampled ahead when the last step was handed out

    @property
    def steps_per_epoch(self) -> int:
        return self.seeds.steps

    def steps(self, epoch: int) -> Iterable[Batch]:
        if self.counter is not None:
            self.counter.reset()
        sampled_before = self.comm.bytes_sent
        t0, seeds, n = time.perf_counter(), 0, 0
        kept = kept_between_steps() if self.rows.x.device.type == "cpu" else contextlib.nullcontext()
        with kept:
            for step, (mb, rows, total) in enumerate(self.sampled(epoch), 1):
                yield self.batch(mb, total, rows)
                seeds, n = seeds + total, step
        # the layers' exchanges, and apart the setup of a HeteroConv's relations per block
        # (each owner's whole-graph degrees of the rows its readers still read)
        setup = 0 if self.counter is None else self.counter.sent.get("setup", 0)
        layers_sent = None if self.counter is None else self.counter.total_sent - setup
        self.history.append({"epoch": epoch, "steps": n, "seeds": seeds,
                             "seconds": time.perf_counter() - t0, "bytes_sent": layers_sent,
                             "sampling_bytes_sent": self.comm.bytes_sent - sampled_before,
                             "setup_bytes_sent": setup})

    def sampled(self, epoch: int):
        """``(blocks, their input rows and labels or None, the step's seeds over all
        workers)`` per step of ``epoch``. With ``prefetch``, the next step's blocks are
        sampled in a thread while the caller computes this step, and on the CPU their
        rows gathered there too (input rows that are learned are read after the step
        before has updated them); else between steps, in program order."""
        x = self.rows.x
        gather = self.prefetch and x.device.type == "cpu" and not x.requires_grad

        def draw(step: int, mine: torch.Tensor):
            injected_fault(self.comm.rank, f"{epoch}.{step}")  # RANK:EPOCH.STEP, before sampling
            mb = self.sampler.sample(mine, epoch)
            return mb, self.input_rows(mb) if gather else None
        batches = list(enumerate(self.seeds.epoch(epoch), 1))
        if not self.prefetch:
            for step, (mine, total) in batches:
                yield *draw(step, mine), total
            return
        with ThreadPoolExecutor(1, thread_name_prefix="sarc-sampling") as pool:
            ahead = [pool.submit(draw, step, mine) for step, (mine, _) in batches[:1]]
            for i, (step, (_, total)) in enumerate(batches):
                mb, rows = ahead.pop(0).result()
                if i + 1 < len(batches):
                    after, (mine, _) = batches[i + 1]
                    ahead.append(pool.submit(draw, after, mine))
                self.prefetched = len(ahead)
                yield mb, rows, total

    def input_rows(self, mb) -> tuple[torch.Tensor, torch.Tensor]:
        """The input rows of the blocks ``mb`` and the labels of their seeds (rows of this
        worker's shard)."""
        lo = self.shard.local_range[0]
        x_dev = self.rows.x.device
        inputs = (mb.input_nodes - lo).to(x_dev)
        seeds = (mb.seeds - lo).to(x_dev)
        return self.rows.x.index_select(0, inputs), self.rows.label.index_select(0, seeds)

    def batch(self, mb, total: int, rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> Batch:
        """The step's ``Batch`` of the blocks ``mb`` (a ``MiniBatch``), ``total`` seeds over
        all workers; ``rows``: their ``input_rows`` where gathered already."""
        x_dev = self.rows.x.device
        x, label = rows if rows is not None else self.input_rows(mb)
        lo = self.shard.local_range[0]
        edge_inputs = {name: torch.cat([e[name] for b in mb.blocks for e in b.shard.edata])
                       .to(x_dev) for name in self.edge_names}
        first = mb.blocks[0].shard.ndata   # the input rows' node data
        edge_inputs.update({name: first[name].to(x_dev) for name in self.node_names})
        graph = MiniBatchGraph(self.graphs_of(mb.blocks),
                               rows=[(b.src_nodes - lo).to(x_dev) for b in mb.blocks],
                               whole=self.eval_batch, inputs=edge_inputs)
        none = torch.zeros(label.shape[0], dtype=torch.bool, device=x_dev)
        return Batch(graph, x, edge_inputs, label,
                     {"train": torch.ones_like(none), "val": none, "test": none},
                     train_total=total, node_ids=mb.input_nodes.to(x_dev))

    def evaluation(self) -> Iterable[Batch]:
        return (self.eval_batch,)

    def epoch_line(self, epoch: int, loss: float, acc: dict, seconds: float) -> str:
        """The loop's epoch line with the epoch's steps, samples/s and bytes sent."""
        return f"{epoch_line(epoch, loss, acc, seconds)} | {self.progress()}"

    def progress(self) -> str:
        """The last epoch's steps, seeds per second and bytes sent (this worker)."""
        if not self.history:
            return ""
        h = self.history[-1]
        rate = h["seeds"] / h["seconds"] if h["seconds"] > 0 else float("inf")
        setup = h.get("setup_bytes_sent", 0)
        sent = ("" if h["bytes_sent"] is None else
                f", sent {h['bytes_sent'] / 2**20:.2f} MiB + {h['sampling_bytes_sent'] / 2**20:.2f}"
                f" MiB sampling" + (f" + {setup / 2**20:.2f} MiB relations" if setup else ""))
        return f"{h['steps']} step{'s' * (h['steps'] != 1)}, {rate:.0f} samples/s{sent}"


def whole_graph_shard(src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
                      edge_data: dict[str, torch.Tensor], *, self_loops: bool,
                      node_data: dict[str, torch.Tensor] | None = None) -> ShardedGraph:
    """The graph as the one part of a one-worker partition, for mini-batches on one process.
    With ``self_loops``, every self loop is replaced by one per node, whose original edge id
    is -1, as a worker's shard gets them (``sarc.distributed.prepare.with_self_loops``): the
    samples are then those of any number of workers; a float edge feature is
    ``SELF_LOOP_FILL`` on them, as there. ``node_data``: what the blocks keep of their rows
    (the node types a model reads)."""
    from ..datasets import add_self_loops_with_data
    from ..partition import cut_parts, relabel
    from ..runtime.sharded import build_shard
    one = relabel(torch.zeros(num_nodes, dtype=torch.int64), 1)  # the identity
    if not self_loops:
        (part,) = cut_parts(src, dst, one, node_data or {}, edge_data)
        return build_shard(part, one.offsets, 0)
    edge_ids = torch.cat([torch.arange(src.numel())[src != dst],
                          torch.full((num_nodes,), -1, dtype=torch.int64)])
    loop_src, loop_dst, loop_data = add_self_loops_with_data(src, dst, num_nodes, edge_data)
    (part,) = cut_parts(loop_src, loop_dst, one, node_data or {}, loop_data)
    shard = build_shard(part, one.offsets, 0)
    return dataclasses.replace(shard, orig_edge_ids=(edge_ids[shard.orig_edge_ids[0]],))
