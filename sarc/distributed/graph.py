"""``DistGraph``: what a sarc layer runs on in a distributed program.

A worker holds its shard (``sarc.runtime.sharded.ShardedGraph``) in a process
group. Calling a compiled layer with a ``DistGraph`` instead of a ``Graph``,

    out = layer(dg, h_local)                 # h_local: [num_local, ...], local rows
                                             # out: [num_dst, ...], the first local rows

runs the layer's distributed schedule (``sarc.distributed.schedule``) over the group:
node features are this worker's rows (local row i = new global id lo + i),
the output is its rows, and autograd works as usual, so a training loop is
plain PyTorch. Edge features are given in the DistGraph's edge order: the
blocks' edges one after another (block 0, 1, ..., P-1), each block's in the
order of ``ShardedGraph.edata[j]``; ``edge_data(name)`` gives a partition's
edge data in that order.

Construction is collective (every worker of the group builds its DistGraph
together): it gathers the shard statistics the planner needs (nodes, edges,
boundary rows per pair) and checks that the group's size is the partition's
number of parts.
"""
from __future__ import annotations

import copy
import ctypes
import ctypes.util
import datetime
import os

import torch
import torch.distributed as dist

from ..errors import SarcError
from ..graph import Graph, missing_attribute
from ..planner.plan import EXEC_MODES, fetches_once
from ..planner.stats import ShardStats
from ..runtime.sharded import ShardedGraph
from .exchange import ByteCounter, Exchanger
from .pieces import DEFAULT_CHUNK_ROWS, cut_blocks


class DistError(SarcError):
    """A distributed run cannot proceed (wrong world size, mismatched partitions, a lost peer)."""


DEFAULT_TIMEOUT = datetime.timedelta(seconds=120)


class DistGraph:
    __getattr__ = missing_attribute  # sarc.graph's hooks (a front end's hint), then the error
    WHY_NOT = {"src": "a DistGraph's edges read other workers' rows, which have no local row "
                      "number, so it has no `src`; a layer reads its sources through the DSL "
                      "(`edges.src`), and `dst` / `perm` give the local destinations"}

    def __init__(self, shard: ShardedGraph, group=None, *, exec_mode: str | None = None,
                 mem_budget: int | None = None, baseline: bool = False,
                 timeout: datetime.timedelta | None = DEFAULT_TIMEOUT,
                 counter: ByteCounter | None = None, chunk_rows: int | None = DEFAULT_CHUNK_ROWS,
                 mode: str = "full", stats: ShardStats | None = None):
        if exec_mode is not None and exec_mode not in EXEC_MODES:
            raise DistError(f"unknown execution mode {exec_mode!r}; expected one of "
                            f"{', '.join(EXEC_MODES)}")
        size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        if size != shard.num_parts:
            raise DistError(f"the process group has {size} workers but the partition has "
                            f"{shard.num_parts} parts; start one worker per part")
        if rank != shard.rank:
            raise DistError(f"worker {rank} of the group holds the shard of part {shard.rank}")
        self.shard, self.group = shard, group
        self.rank, self.size = rank, size
        self.exec_mode, self.mem_budget, self.baseline = exec_mode, mem_budget, baseline
        self.mode = mode  # what the planner plans for: full, or a minibatch's mfg / sampling
        if chunk_rows is not None and chunk_rows < 1:
            raise DistError(f"chunk_rows must be a positive number of rows (or None), got {chunk_rows}")
        self.counter = counter if counter is not None else ByteCounter()
        # every worker's shard fits (``stats``: gathered already, with other shards')
        self.stats = gather_stats(shard, group, chunk_rows) if stats is None else stats
        self.exchanger = Exchanger(rank, size, group, self.counter, timeout)
        self.chunk_rows = chunk_rows
        self.programs: dict = {}     # (layer id, inputs need grad) -> sarc.distributed.schedule.LayerProgram
        self.layer_names: dict = {}  # layer id -> its name in plans and generated headers
        # layer id -> the program of its last call under autograd; a HeteroConv's fetches and
        # its relations' layers on the fetched rows by their own keys (sarc.distributed.halo)
        self.training_programs: dict = {}
        self.step_calls = StepCalls()      # the programs a step's calls ran (sarc train's steps)
        self.awaiting: dict = {}           # layer id -> its last call under autograd, weakly
        self.kept_share: dict = {}   # layer id -> per worker, the peers it keeps (share_memory)
        # a step's block k: (k, the model's sarc layers its budget share pairs with blocks)
        self.share_of: tuple | None = None
        self.ran_by = None   # the layer that ran on it, where it has a share_of
        self.ran_program = None   # the program of its last call under autograd
        self.fetch_within_budget = False   # its HeteroConvs' fetches fit the budget (share_memory)
        # a relation's sub-graph of the whole graph: its layers' programs are planned on its
        # statistics, not shared with other sub-graphs' (a mini-batch block's are re-priced)
        self.plans_own = False
        # the sub-graphs made of it (a HeteroConv's relations on a step's block), shared
        # by its copies for other shards (on_shard): what a step's prediction prices
        self.subgraph_runs: list = []
        self._set_shard(shard)
        if stats is None:
            trim_heap()  # the loading's and the setup's transients go back to the system

    def _set_shard(self, shard: ShardedGraph) -> None:
        self.shard = shard
        self.pieces = cut_blocks(shard, self.chunk_rows)  # [P]: each source block in row chunks
        offsets = [0]
        for b in shard.blocks:
            offsets.append(offsets[-1] + b.num_edges)
        self.edge_offsets = tuple(offsets)
        self._csr = None
        self._edges_into = None
        self._own = None
        self._rows = None
        self._degrees: dict = {}
        self._halo = None

    def on_shard(self, shard: ShardedGraph) -> "DistGraph":
        """This DistGraph's programs, exchanger and counter on another shard of the same
        workers (the same layer's block of the next minibatch): nothing is gathered and
        nothing compiled again. The programs keep the plans made on the shard they were
        compiled for (its statistics); what a plan decides without a memory budget (the
        execution mode, which peers' rows are kept) does not depend on them. Local."""
        if (shard.rank, shard.num_parts) != (self.rank, self.size):
            raise DistError(f"worker {self.rank} of {self.size} cannot run the shard of part "
                            f"{shard.rank} of {shard.num_parts}")
        other = copy.copy(self)
        other._set_shard(shard)
        return other

    def layer_name(self, module) -> str:
        """``module``'s name in this graph's plans and generated headers: its class and the
        order of its first call (``Class#k``), kept for every later call."""
        return self.layer_names.setdefault(id(module),
                                           f"{type(module).__name__}#{len(self.layer_names)}")

    def record_training_call(self, layer, program) -> None:
        """``layer`` ran ``program`` on this graph under autograd: a training call, whose
        plan predicts the step's exchanges (``StepCalls``, ``planned_bytes_sent``)."""
        self.training_programs[id(layer)] = program
        self.ran_program = program
        self.step_calls.add(program)

    def run_layer(self, layer, args: tuple, feats: dict):
        """``layer(dg, ...)``: the layer's distributed schedule on this worker's shard."""
        from .schedule import run_layer
        return run_layer(layer, self, args, feats)

    def edge_subgraph(self, keep: torch.Tensor,
                      degrees: tuple[torch.Tensor, torch.Tensor] | None = None) -> "DistGraph":
        """The DistGraph of the edges ``keep`` marks (bool, this DistGraph's edge order), over
        the same nodes, in the same group (collective: every worker, in the same order). Its
        layers exchange only the rows those edges read, normalize by the sub-graph's degrees
        (``sarc.distributed.relations``; on a mini-batch step's block, ``degrees``: the local
        rows' in- and out-degrees in the whole graph's sub-graph), count bytes in this
        graph's counter, and their programs join this graph's (plans, predicted bytes,
        memory shares)."""
        return self.edge_subgraphs([keep], None if degrees is None else [degrees])[0]

    def edge_subgraphs(self, keeps: list[torch.Tensor],
                       degrees: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                       ) -> list["DistGraph"]:
        """``edge_subgraph`` of each of ``keeps`` (with ``degrees[i]``), their shards set up
        and their statistics gathered in three collectives for them all (a HeteroConv's
        relations of one block)."""
        from .relations import edge_subshards
        if self.mode != "full" and degrees is None:
            raise DistError(f"a sub-graph of a {self.mode} step's block normalizes by the whole "
                            f"graph's degrees: give them (degrees=)")
        for keep in keeps:
            if keep.shape != (self.num_edges,):
                raise DistError(f"an edge mask has one entry per edge of the DistGraph "
                                f"({self.num_edges}), got shape {list(keep.shape)}")
        for pair in degrees or ():
            if any(d.shape != (self.num_local,) for d in pair):
                raise DistError(f"a sub-graph's degrees have one entry per local row "
                                f"({self.num_local}), got shapes "
                                f"{', '.join(str(list(d.shape)) for d in pair)}")
        shards = edge_subshards(self.shard, keeps, self.exchanger, degrees)
        subs = []
        for shard, stats in zip(shards, gather_stats_of(shards, self.group, self.chunk_rows)):
            sub = DistGraph(shard, self.group, exec_mode=self.exec_mode,
                            mem_budget=self.mem_budget, baseline=self.baseline,
                            timeout=self.exchanger.timeout, counter=self.counter,
                            chunk_rows=self.chunk_rows, mode=self.mode, stats=stats)
            sub.programs, sub.layer_names = self.programs, self.layer_names
            sub.training_programs, sub.kept_share = self.training_programs, self.kept_share
            sub.step_calls, sub.awaiting = self.step_calls, self.awaiting
            sub.plans_own = self.mode == "full"
            self.subgraph_runs.append(sub)
            subs.append(sub)
        return subs

    @property
    def fetches_once(self) -> bool:
        """Whether a ``sarc.HeteroConv`` fetches its inputs' boundary rows once for all its
        relations (``sarc.planner.plan.fetches_once``; under a memory budget where the
        fetched rows fit it, ``share_memory``)."""
        return (fetches_once(self.mem_budget, self.baseline, self.exec_mode)
                or self.fetch_within_budget)

    def halo(self):
        """This worker's rows and the boundary rows its edges read, as one ``Graph``
        (``sarc.distributed.halo.Halo``), made at first use per shard."""
        if self._halo is None:
            from .halo import Halo
            self._halo = Halo(self)
        return self._halo

    def share_memory(self, model) -> None:
        """Share the memory budget over a whole step of ``model`` (before its first step)."""
        from .schedule import share_memory
        share_memory(model, self)

    # --- what layers and models read -----------------------------------------------------
    @property
    def num_dst(self) -> int:
        """The destinations of this worker's edges: its nodes, or on a minibatch layer's
        shard (a bipartite local block, ``sarc.sampling.blocks``) their first rows."""
        return self.shard.local_block.num_dst

    @property
    def num_local(self) -> int:
        """This worker's rows (node features have one per row): its blocks' local sources."""
        return self.shard.num_local

    @property
    def num_src(self) -> int:
        """The rows a layer's node features have (as ``Graph.num_src``): this worker's."""
        return self.num_local

    @property
    def rows(self) -> Graph:
        """This worker's rows, its destinations first, as an edgeless block with their
        whole-graph degrees: what a layer that aggregates nothing over edges runs on."""
        if self._rows is None:
            empty = torch.zeros(0, dtype=torch.int64, device=self.device)
            ins = self.shard.in_degree
            self._rows = Graph.from_edges(empty, empty, num_src=self.num_local,
                                          num_dst=self.num_dst, in_degree=ins[:self.num_dst],
                                          out_degree=self.shard.out_degree, src_in_degree=ins)
        return self._rows

    @property
    def own(self) -> Graph:
        """This worker's rows as an edgeless graph, what a layer's node-local parts run on;
        built once per shard, not per layer call."""
        if self._own is None:
            empty = torch.zeros(0, dtype=torch.int64, device=self.device)
            self._own = Graph.from_edges(empty, empty, self.num_local)
        return self._own

    def degree(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """The shard's ``in_degree`` / ``out_degree`` (whole-graph degrees of its rows) in a
        layer's ``dtype``, converted once per shard."""
        key = (name, dtype)
        if key not in self._degrees:
            self._degrees[key] = getattr(self.shard, name).to(dtype)
        return self._degrees[key]

    @property
    def edges_into(self) -> torch.Tensor:
        """[num_dst] float32: the edges into each destination over all the blocks, what a
        mean divides by (the whole-graph in-degree on a full shard; on a sampled layer's
        shard, the sample's)."""
        if self._edges_into is None:
            count = torch.zeros(self.num_dst, dtype=torch.float32, device=self.device)
            for b in self.shard.blocks:
                count += (b.rowptr[1:] - b.rowptr[:-1]).to(torch.float32)
            self._edges_into = count
        return self._edges_into

    @property
    def num_edges(self) -> int:
        return self.edge_offsets[-1]

    @property
    def in_degree(self) -> torch.Tensor:
        """[num_dst] the whole graph's in-degrees of the destinations (as ``Graph``'s: the
        first rows of a minibatch layer's shard)."""
        return self.shard.in_degree[:self.num_dst]

    @property
    def out_degree(self) -> torch.Tensor:
        return self.shard.out_degree

    @property
    def device(self) -> torch.device:
        return self.shard.in_degree.device

    @property
    def dst(self) -> torch.Tensor:
        """Local destination row of every edge, sorted (with ``perm``, as ``Graph.dst``)."""
        return self._sorted()[0]

    @property
    def perm(self) -> torch.Tensor:
        """Sorted edge i is edge ``perm[i]`` of the DistGraph edge order (as ``Graph.perm``)."""
        return self._sorted()[1]

    @property
    def input_dst(self) -> torch.Tensor:
        """Local destination row of every edge in DistGraph edge order, the order of an edge
        input (as ``Graph.input_dst``)."""
        return torch.cat([b.input_dst for b in self.shard.blocks])

    def _sorted(self):
        if self._csr is None:
            sorted_dst, perm = torch.sort(self.input_dst, stable=True)
            self._csr = (sorted_dst, perm)
        return self._csr

    def edge_data(self, name: str) -> torch.Tensor:
        """The partition's edge data ``name`` in DistGraph edge order."""
        missing = [j for j, e in enumerate(self.shard.edata) if name not in e]
        if missing:
            raise DistError(f"the partition has no edge data {name!r} "
                            f"(it has: {', '.join(sorted(self.shard.edata[0])) or 'none'})")
        return torch.cat([e[name] for e in self.shard.edata])

    def planned_bytes_sent(self) -> int | None:
        """The planner's bytes this worker sends in one training step (forward + backward):
        of every call of the last step where steps are counted (``step_calls``: a layer
        called k times sends k times), else of the layers called so far under autograd,
        once each (None without partition statistics)."""
        return self._planned("bytes_sent")

    def planned_bytes_kept(self) -> int | None:
        """The planner's bytes this worker keeps for backward in one training step, of the
        programs ``planned_bytes_sent`` counts (a HeteroConv's fetches, and its relations'
        layers on the fetched rows, each with its share of the worker's shard:
        ``sarc.distributed.halo.LayerRun``)."""
        return self._planned("bytes_kept")

    def _planned(self, figure: str) -> int | None:
        total = 0
        programs = self.step_calls.programs
        for prog in programs if programs is not None else self.training_programs.values():
            value = getattr(prog.plan, figure)
            if value is None:
                return None
            total += value[self.rank]
        return total

    def __repr__(self) -> str:
        return (f"DistGraph(rank={self.rank}/{self.size}, nodes={self.num_dst}, "
                f"edges={self.num_edges}, exec_mode={self.exec_mode or 'planner'}"
                f"{', baseline' if self.baseline else ''})")


class StepCalls:
    """The programs the layer calls of a training step ran under autograd, in call order:
    counted from the first ``begin`` (a trainer's, at each step), so the planner's bytes
    are the step's, a layer called twice counted twice."""

    def __init__(self):
        self.programs: list | None = None

    def begin(self) -> None:
        self.programs = []

    def add(self, program) -> None:
        if self.programs is not None:
            self.programs.append(program)


def gather_stats(shard: ShardedGraph, group=None, chunk_rows: int | None = None) -> ShardStats:
    """The planner's statistics of every shard, gathered from the workers (collective).
    Every worker must cut messages at the same rows: a different ``chunk_rows`` on one
    of them is an error on all."""
    return gather_stats_of([shard], group, chunk_rows)[0]


def gather_stats_of(shards: list[ShardedGraph], group=None, chunk_rows: int | None = None
                    ) -> list[ShardStats]:
    """``gather_stats`` of each of ``shards`` (one graph's sub-graphs, the same number on
    every worker), in one all-gather."""
    if not shards:
        return []
    p = shards[0].num_parts
    figures = []
    for shard in shards:
        sends, reads = shard.boundary_digests()
        figures += [shard.num_local, sum(b.num_edges for b in shard.blocks),
                    -1 if chunk_rows is None else chunk_rows,
                    *(0 if j == shard.rank else shard.needed_rows[j].numel() for j in range(p)),
                    *sends, *reads, shard.local_block.num_dst]
    mine = torch.tensor(figures, dtype=torch.int64, device=comm_device(group))
    allv = [torch.zeros_like(mine) for _ in range(p)]
    dist.all_gather(allv, mine, group=group)
    width = len(figures) // len(shards)
    every = [v.cpu().tolist() for v in allv]
    return [_stats([row[k * width:(k + 1) * width] for row in every], p)
            for k in range(len(shards))]


def _stats(rows: list[list[int]], p: int) -> ShardStats:
    """One shard's statistics from every worker's figures (``gather_stats_of``)."""
    check_boundaries([(r[3 + p:3 + 2 * p], r[3 + 2 * p:3 + 3 * p]) for r in rows],
                     [f"the shard of part {r}" for r in range(p)])
    if len({r[2] for r in rows}) > 1:
        raise DistError(f"the workers cut messages at different chunk_rows "
                        f"({', '.join(str(r[2]) if r[2] >= 0 else 'None' for r in rows)} by rank); "
                        f"give every worker's DistGraph the same")
    nodes, dst = tuple(r[0] for r in rows), tuple(r[-1] for r in rows)
    return ShardStats(p, nodes, tuple(r[1] for r in rows), tuple(tuple(r[3:3 + p]) for r in rows),
                      None if dst == nodes else dst)  # a minibatch block: its destinations


def check_boundaries(digests: list, names: list[str]) -> None:
    """Raise unless every worker's shard fits the others: what worker i sends worker j is
    what j reads from i (``digests[i]`` is shard i's ``boundary_digests()``; ``names[i]``
    names its part). Shards that do not fit would exchange messages of other sizes than
    their peers expect (gloo aborts the process) or wrong rows; the message is the same on
    every worker, and names the part that fits none of its peers where one does."""
    p = len(digests)
    bad = [(i, j) for i in range(p) for j in range(p) if i != j and digests[i][0][j] != digests[j][1][i]]
    if not bad:
        return
    suspects = set(range(p))
    for i, j in bad:
        suspects &= {i, j}
    if len(suspects) == 1:
        (s,) = suspects
        peers = sorted({j for pair in bad for j in pair} - {s})
        raise DistError(f"{names[s]} does not fit the other parts of its partition set: the "
                        f"boundary rows it shares with part{'s' * (len(peers) > 1)} "
                        f"{', '.join(map(str, peers))} differ (a part of another graph or of "
                        f"another partitioning); partition the graph again")
    i, j = bad[0]
    raise DistError(f"{names[i]} and {names[j]} do not fit together: the boundary rows part {i} "
                    f"sends part {j} are not those part {j} reads from it (one is a part of another "
                    f"graph or of another partitioning); partition the graph again")


def comm_device(group=None) -> torch.device:
    """Where the group's collectives want their tensors: the GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# glibc's mallopt parameter; an explicit threshold also stops glibc raising it by itself
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 1 << 20
_libc = None


def trim_heap() -> None:
    """Keep a worker's heap from holding freed memory (glibc; elsewhere nothing).

    The first call makes every allocation over 1 MiB (tensors) its own mapping, returned
    to the system when freed, instead of heap space that glibc keeps at its high-water
    mark (its default threshold rises to 32 MiB as large blocks are freed, so the
    transients of loading a shard and of every exchange round pile up in the heap);
    ``MALLOC_MMAP_THRESHOLD_`` in the environment takes precedence. Every call returns
    the heap's free pages (``malloc_trim(0)``).

    The price is time: every large tensor is mapped afresh and its pages faulted in
    (at 500k nodes / 10M edges, GAT's epoch is ~40% longer than with glibc's default,
    whose heap holds ~200 MB more at the peak). ``MALLOC_MMAP_THRESHOLD_=33554432``
    chooses speed."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            lib.mallopt, lib.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _libc = False
            return
        _libc = lib
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            lib.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    if _libc:
        _libc.malloc_trim(0)
