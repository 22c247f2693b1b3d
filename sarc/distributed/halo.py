"""A worker's rows and the boundary rows its edges read, fetched once for many layers.

A ``sarc.HeteroConv`` runs one layer per relation. On its relation's own ``DistGraph``
(``DistGraph.edge_subgraph``) each layer exchanges the rows its relation reads, in its
own schedule: a conv of R relations exchanges R times a pass, each time with a round of
small messages. Where nothing asks that remote rows be dropped and fetched again (no
memory budget, or one the fetched rows fit; no ``sar`` execution:
``DistGraph.fetches_once``), the conv instead
fetches each input's boundary rows once (``Halo.fetch``: a message per peer; its
backward sends each row's gradient to its owner once) and runs every relation's layer on
the worker's ``Halo.graph``: a ``Graph`` whose sources are the worker's rows, then the
rows it reads of each peer (``needed_rows[j]``, peers in rank order), whose destinations
are the worker's rows, and whose edges are the DistGraph's, in its edge order. A
relation's degrees on it are the whole graph's (``relation_degrees``, found once per
edge types). Each fetch is planned (``sarc.planner.plan.plan_fetch``), and each
relation's layer's run on the fetched rows (``LayerRun``, ``sarc.planner.plan.on_halo``:
nothing sent, its share of the shard kept): a step's bytes sent and kept are predicted as
a layer program's are.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from ..graph import Graph
from ..planner.plan import LayerPlan, on_halo, plan_fetch, plan_layer
from .graph import DistError
from .relations import swap
from ..backward_once import once_differentiable

ROWS_TAG, GRADS_TAG = 116, 118
"""Row messages go on the rows' process group, gradients on the gradients' (tag % 4 == 2,
``exchange.Exchanger``)."""
COUNTS_TAG, DEGREES_TAG, IDS_TAG = 108, 112, 120


class FetchRun(NamedTuple):
    """A fetch that ran under autograd, as a step's layer programs are recorded
    (``DistGraph.step_calls``): its name and plan (a relation's layer's run on the fetched
    rows is a ``LayerRun``)."""

    name: str
    plan: LayerPlan


class LayerRun:
    """A relation's layer that ran on a HeteroConv's fetched rows under autograd, as a
    step's layer programs are recorded (``DistGraph.step_calls``): its name, and its plan
    (``sarc.planner.plan.on_halo``), made when first read (the run's report, after its
    steps), so a step pays no planning."""

    def __init__(self, name: str, layer, inputs_need_grad: bool, dg):
        self.name, self._of, self._plan = name, (layer, inputs_need_grad, dg), None

    @property
    def plan(self) -> LayerPlan:
        if self._plan is None:
            from ..compiler import compile_layer
            layer, need, dg = self._of
            fn = compile_layer(layer, layer._sarc_backend, through="optimize").optimized
            self._plan = on_halo(plan_layer(self.name, fn, mode=dg.mode, workers=dg.size,
                                            stats=dg.stats, baseline=dg.baseline,
                                            inputs_need_grad=need, distributed=True),
                                 dg.stats, dg.size)
        return self._plan


class Halo:
    """One worker's rows and the rows of other workers its edges read (module docstring).
    Made once per shard (``DistGraph.halo``); ``fetch`` and ``relation_degrees`` are
    collective."""

    def __init__(self, dg):
        shard = dg.shard
        self.dg, self.shard = dg, shard
        self.num_local = n = shard.num_local
        self.spans: dict[int, tuple[int, int]] = {}   # peer -> its rows here, [lo, hi)
        srcs, dsts, start = [], [], n
        for j, b in enumerate(shard.blocks):
            src, dst = b.input_edges()
            if j != shard.rank:
                self.spans[j] = (start, start + b.num_src)
                src = src + start
                start += b.num_src
            srcs.append(src)
            dsts.append(dst)
        self.num_rows = start
        dev = shard.in_degree.device
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        self.graph = Graph.from_edges(torch.cat(srcs) if srcs else empty,
                                      torch.cat(dsts) if dsts else empty,
                                      num_src=start, num_dst=dg.num_dst)
        self.plans: dict[tuple, LayerPlan] = {}   # each fetch's
        self.runs: dict[tuple, LayerRun] = {}     # each relation's layer's (layer_ran)
        self._sorted: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # positions' lookups

    def fetch(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x`` (a row per local row) on every row of ``graph``: the local rows, then the
        boundary rows from their owners. Under autograd the step records the fetch's plan
        (``name``: what it fetches, as plans print it)."""
        if torch.is_grad_enabled():
            dg = self.dg
            width = math.prod(int(d) for d in x.shape[1:])
            key = (name, width, x.element_size(), x.requires_grad)
            if key not in self.plans:
                self.plans[key] = plan_fetch(name, (f"{name}[{width}]",), width,
                                             x.element_size(), x.requires_grad,
                                             workers=dg.size, stats=dg.stats)
            self._ran(key, FetchRun(name, self.plans[key]))
        return _Fetch.apply(self, x)

    def layer_ran(self, layer, args: tuple, feats: dict) -> None:
        """A relation's ``layer`` ran on the fetched rows under autograd (given ``args`` and
        ``feats``): the step records its run, planned as ``sarc compile`` plans it
        (``sarc.planner.plan.on_halo``: it sends nothing, and keeps its share of the
        worker's shard) when the plan is first read (``LayerRun``), once per layer, input
        gradient need and layer state (the key of its kernel, which the call compiled)."""
        from ..runtime.bind import resolve_features
        from ..training.layer_calls import input_needs_grad
        dg = self.dg
        need = input_needs_grad(layer, resolve_features(layer, args, feats))
        state = layer._sarc_compiled[0] if layer._sarc_compiled is not None else None
        key = ("halo", id(layer), need, state)
        if key not in self.runs:
            self.runs[key] = LayerRun(dg.layer_name(layer), layer, need, dg)
        self._ran(key[:3], self.runs[key])

    def _ran(self, key, run) -> None:
        self.dg.training_programs[key] = run
        self.dg.step_calls.add(run)

    def positions(self, part: "Halo", rows: torch.Tensor) -> torch.Tensor:
        """Where each row of ``part``'s graph is among this halo's rows: ``part`` is a
        mini-batch block's halo on this worker, whose local rows are this halo's local rows
        ``rows`` (this one the whole graph's). A block reads of a peer only rows the whole
        graph's edges into this worker read; each owner says which of its rows they are (an
        id a row, ``setup``; collective)."""
        ex = part.dg.exchanger
        rows = rows.to(device=self.graph.perm.device, dtype=torch.int64)
        got = swap(ex, {j: rows.index_select(0, part.shard.send_rows[j]) for j in part.spans},
                   {j: hi - lo for j, (lo, hi) in part.spans.items()}, IDS_TAG, torch.int64)
        out, wanted, found = [rows], [], []
        for j in sorted(got, key=lambda j: part.spans[j][0]):
            if j not in self._sorted:   # once per peer: the whole graph's rows of j, sorted
                have = self.shard.needed_rows[j]
                order = torch.argsort(have)
                self._sorted[j] = (have.index_select(0, order), order)
            have, order = self._sorted[j]
            if have.numel() == 0:
                raise DistError(f"a block reads rows of worker {j}, of which the whole graph's "
                                f"edges into this worker read none")
            at = torch.searchsorted(have, got[j]).clamp_max(have.numel() - 1)
            wanted.append(got[j])
            found.append(have.index_select(0, at))
            out.append(self.spans[j][0] + order.index_select(0, at))
        if wanted and not torch.equal(torch.cat(found), torch.cat(wanted)):   # one sync
            raise DistError("a block reads rows of another worker that the whole graph's "
                            "edges into this worker do not")
        return torch.cat(out)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        shard, ex = self.shard, self.dg.exchanger
        out = x.new_empty((self.num_rows, *x.shape[1:]))
        out[:self.num_local] = x
        sends, recvs = ex.swap({j: x.index_select(0, shard.send_rows[j]) for j in self.spans},
                               {j: (hi - lo, *x.shape[1:]) for j, (lo, hi) in self.spans.items()},
                               x.dtype, x.device, ROWS_TAG, "forward")
        for j, pending in recvs.items():
            lo, hi = self.spans[j]
            out[lo:hi] = pending.wait()
        for pending in sends:
            pending.wait()
        return out

    def _grads(self, grad: torch.Tensor) -> torch.Tensor:
        shard, ex = self.shard, self.dg.exchanger
        total = grad[:self.num_local].clone()
        sends, recvs = ex.swap({j: grad[lo:hi] for j, (lo, hi) in self.spans.items()},
                               {j: (int(shard.send_rows[j].numel()), *grad.shape[1:])
                                for j in self.spans},
                               grad.dtype, grad.device, GRADS_TAG, "backward")
        for j, pending in recvs.items():
            total.index_add_(0, shard.send_rows[j], pending.wait())
        for pending in sends:
            pending.wait()
        return total

    def relation_degrees(self, etype: torch.Tensor, relations: Sequence[int]
                         ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Each of ``relations``' in- and out-degree of every row of ``graph`` in the whole
        graph (every edge is of one of them): each worker counts its edges per relation;
        the readers send the owners their counts of the owners' rows (their out-degrees
        add up there); the owners send every reader both degrees of the rows it reads.
        Two exchanges for all the relations (collective)."""
        shard, ex = self.shard, self.dg.exchanger
        n, rows, k = self.num_local, self.num_rows, len(relations)
        dev = shard.in_degree.device
        slot = torch.full((max(relations, default=-1) + 2,), k, dtype=torch.int64, device=dev)
        slot[torch.as_tensor(list(relations), dtype=torch.int64, device=dev)] = torch.arange(
            k, device=dev)
        etype = torch.as_tensor(etype).to(device=dev, dtype=torch.int64)
        which = slot[etype.clamp(0, slot.numel() - 1)]   # k: a relation not asked for
        src, dst = self.graph.input_edges()
        ins = torch.bincount(dst * (k + 1) + which, minlength=n * (k + 1)).reshape(n, k + 1)
        outs = torch.bincount(src * (k + 1) + which, minlength=rows * (k + 1)).reshape(rows, k + 1)
        ins, outs = ins[:, :k].to(torch.float32), outs[:, :k].to(torch.float32)
        counts = swap(ex, {j: outs[lo:hi] for j, (lo, hi) in self.spans.items()},
                      {j: (int(shard.send_rows[j].numel()), k) for j in self.spans}, COUNTS_TAG)
        mine = outs[:n].clone()
        for j, c in counts.items():
            mine.index_add_(0, shard.send_rows[j], c)
        both = torch.cat([ins, mine], 1)
        got = swap(ex, {j: both.index_select(0, shard.send_rows[j]) for j in self.spans},
                   {j: (hi - lo, 2 * k) for j, (lo, hi) in self.spans.items()}, DEGREES_TAG)
        every = torch.zeros(rows, 2 * k, dtype=torch.float32, device=dev)
        every[:n] = both
        for j, d in got.items():
            lo, hi = self.spans[j]
            every[lo:hi] = d
        return {r: (every[:, i].contiguous(), every[:, k + i].contiguous())
                for i, r in enumerate(relations)}


class _Fetch(torch.autograd.Function):
    """``Halo._rows``; backward: each boundary row's gradient to its owner, added there."""

    @staticmethod
    def forward(ctx, halo: Halo, x: torch.Tensor):
        ctx.halo = halo
        return halo._rows(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return None, ctx.halo._grads(grad.contiguous())
