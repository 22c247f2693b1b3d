"""The planner: per layer, how the work is spread over workers, and the Plan it prints.

For each layer it decides

- what crosses the network: the narrowest of the exchange candidates the cost
  model offers (the pushed-down ``W h`` or the raw ``h``), each boundary row
  sent once per round;
- the execution mode: ``sar`` (one remote shard's rows at a time, re-fetched in
  the backward pass), ``oneshot`` (all remote rows fetched at once and kept), or
  ``hybrid`` (keep the peers' rows that fit the memory budget, re-fetch the
  rest); ``local`` with one worker;
- what is saved and what is recomputed in the backward pass;
- the exchange rounds (round k: worker r sends to r+k and receives from r-k,
  so no two workers send to one peer at once) and whether the next round is
  prefetched while the current one computes.

In the minibatch modes (``mfg``, ``sampling``) a layer runs on its own blocks, which
change from step to step: ``plan_model`` takes a ``BlockSample`` (per layer, the
statistics of its blocks in a sample of batches), plans each layer for the largest
figures of its sample (so the rows it keeps fit the budget in every batch of the
sample), then evaluates that plan on every batch: bytes sent and kept per step, mean
and max. Without a sample the plan is symbolic in the block's sizes (``N_src``,
``N_dst``, ``E``, ``B``), which depend on the seeds.

``baseline=True`` plans the SAR-equivalent schedule: the raw layer input
crosses the network (no pushdown across the exchange) and attention layers
fetch twice (no online softmax), for comparison.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import sympy

from .. import names
from ..ir.function import Function
from ..ir.ops import FUSED, Op
from ..ir.types import E, N_DST, N_SRC
from .cost import (B, Exchange, _needs_grad, exchange_candidates, forward_flops,
                   saved_for_backward)
from .stats import BlockSample, ShardStats

MODES = ("full", "mfg", "sampling")
MINIBATCH_MODES = ("mfg", "sampling")
EXEC_MODES = ("sar", "oneshot", "hybrid")


@dataclass(frozen=True)
class LayerPlan:
    name: str
    layer_class: str
    exec_mode: str                       # sar | oneshot | hybrid | local | halo
    exchange: Exchange | None
    alternatives: tuple[Exchange, ...]   # the candidates not chosen
    fetch_passes: int                    # forward fetches per round (2: softmax without online normalization)
    saved: dict                          # symbolic bytes kept for backward (edge / node / total)
    flops: sympy.Expr
    recomputed: tuple[str, ...]
    kept_peers: tuple[tuple[int, ...], ...]  # per worker, the peers whose rows it keeps
    bytes_sent: tuple[int, ...] | None       # per worker per training step (None: symbolic only)
    bytes_kept: tuple[int, ...] | None
    bytes_sent_expr: sympy.Expr = field(default=sympy.Integer(0))
    backward_passes: int = 1                 # backward passes over the blocks (2: unfused edge_softmax;
    #                                          0: no gradient flows through the edges)
    batches: "BatchFigures | None" = None    # a minibatch layer's plan on each batch of the sample


@dataclass(frozen=True)
class BatchFigures:
    """A minibatch layer's plan evaluated on each batch of a sample, its choices (exchange,
    execution mode, kept peers) fixed: what one training step sends and keeps."""

    blocks: dict                              # BlockSample.summary: block sizes, mean / max
    bytes_sent: tuple[tuple[int, ...], ...]   # [batch][worker], forward + backward
    bytes_kept: tuple[tuple[int, ...], ...]   # [batch][worker]
    fanout: int | None = None                 # in-edges sampled per destination (None: all)

    @staticmethod
    def _mean_max(rows) -> dict:
        values = [v for row in rows for v in row]
        return {"mean": sum(values) / len(values), "max": max(values)}

    @property
    def sent(self) -> dict:
        """Bytes a worker sends in a step: mean and max over batches and workers."""
        return self._mean_max(self.bytes_sent)

    @property
    def kept(self) -> dict:
        return self._mean_max(self.bytes_kept)

    def to_json(self) -> dict:
        return {"blocks": self.blocks, "fanout": self.fanout,
                "bytes_sent_per_step": {**self.sent, "per_batch": [list(b) for b in self.bytes_sent]},
                "bytes_kept_per_step": {**self.kept, "per_batch": [list(b) for b in self.bytes_kept]}}


@dataclass(frozen=True)
class Plan:
    mode: str
    workers: int
    mem_budget: int | None
    baseline: bool
    layers: tuple[LayerPlan, ...]
    stats: ShardStats | None
    sample: BlockSample | None = None    # the minibatch modes' block statistics
    batch_size: int | None = None        # the minibatch modes' seeds per worker and step
    fanouts: tuple[int, ...] | None = None  # sampling: per layer, input layer first
    fetches: tuple[LayerPlan, ...] = ()  # HeteroConv inputs fetched once (exec "halo")

    @property
    def minibatch(self) -> bool:
        return self.mode in MINIBATCH_MODES

    @property
    def rounds(self) -> list[list[tuple[int, int, int]]]:
        """Round k: (worker, sends to, receives from) for every worker."""
        p = self.workers
        return [[(r, (r + k) % p, (r - k) % p) for r in range(p)] for k in range(1, p)]

    def step_bytes_kept(self) -> list[int] | None:
        """Per worker, the bytes a training step keeps for backward, all layers together (a
        minibatch plan: each layer's largest batch of the sample)."""
        every = (*self.layers, *self.fetches)
        if any(lp.bytes_kept is None for lp in every):
            return None
        return [sum(lp.bytes_kept[r] for lp in every) for r in range(self.workers)]

    def over_budget(self) -> list[int]:
        """The workers whose step keeps more than the memory budget."""
        step = self.step_bytes_kept()
        if step is None or self.mem_budget is None:
            return []
        return [r for r, b in enumerate(step) if b > self.mem_budget]

    def total_bytes_sent(self) -> list[int] | None:
        every = (*self.layers, *self.fetches)
        if any(lp.bytes_sent is None for lp in every):
            return None
        return [sum(lp.bytes_sent[r] for lp in every) for r in range(self.workers)]

    def to_json(self) -> dict:
        def ex(x: Exchange | None):
            return None if x is None else {"values": list(x.values), "names": list(x.names),
                                           "width": x.width, "row_bytes": x.row_bytes,
                                           "needs_grad": x.needs_grad,
                                           "recompute": list(x.recompute)}

        def layer(lp: LayerPlan) -> dict:
            return {
                "name": lp.name, "class": lp.layer_class, "exec_mode": lp.exec_mode,
                "exchange": ex(lp.exchange), "alternatives": [ex(a) for a in lp.alternatives],
                "fetch_passes": lp.fetch_passes, "backward_passes": lp.backward_passes,
                "saved_bytes": {k: str(v) for k, v in lp.saved.items()},
                "flops": str(lp.flops), "recomputed": list(lp.recomputed),
                "kept_peers": [list(k) for k in lp.kept_peers],
                "bytes_sent_per_worker": None if lp.bytes_sent is None else list(lp.bytes_sent),
                "bytes_kept_per_worker": None if lp.bytes_kept is None else list(lp.bytes_kept),
                "bytes_sent_formula": str(lp.bytes_sent_expr),
                **({} if lp.batches is None else {"batches": lp.batches.to_json()}),
            }
        out = {
            "mode": self.mode, "workers": self.workers, "mem_budget": self.mem_budget,
            "baseline": self.baseline,
            "rounds": [[list(t) for t in rnd] for rnd in self.rounds],
            "stats": None if self.stats is None else self.stats.to_json(),
            "layers": [layer(lp) for lp in self.layers],
        }
        if self.fetches:
            out["fetches"] = [layer(lp) for lp in self.fetches]
        if self.minibatch:
            out["minibatch"] = {"batch_size": self.batch_size,
                                "fanouts": None if self.fanouts is None else list(self.fanouts),
                                "sample": None if self.sample is None else self.sample.to_json()}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


def _has_softmax(fn: Function) -> bool:
    return any(v.op in (Op.EDGE_SOFTMAX, Op.SOFTMAX_AGGREGATE) for v in fn.values)


def _edges_need_grad(fn: Function, inputs_need_grad: bool) -> bool:
    """Does some aggregate over edges depend on a parameter (or a feature input needing a
    gradient)? If not, the backward pass has nothing to do on the edges (GraphSAGE's
    first layer: the mean of raw features)."""
    memo: dict = {}
    return any(_needs_grad(fn, i, memo, inputs_need_grad) for i, v in enumerate(fn.values)
               if v.op in (Op.REDUCE, Op.AGGREGATE, Op.SOFTMAX_AGGREGATE))


def _has_unfused_softmax(fn: Function) -> bool:
    """An edge_softmax left unfused (e.g. attention dropout between it and the sum): its
    normalization spans every block, so a normalizer pass precedes the main pass, forward
    and backward (``sarc.distributed.merge``)."""
    return any(v.op is Op.EDGE_SOFTMAX for v in fn.values)


def _choose(cands: list[Exchange], baseline: bool) -> tuple[Exchange | None, tuple[Exchange, ...]]:
    if not cands:
        return None, ()
    if baseline:
        chosen = cands[-1]  # the raw inputs
    else:  # the narrowest; ties go to the one that needs no recompute
        chosen = min(cands, key=lambda c: (c.row_bytes, len(c.recompute)))
    return chosen, tuple(c for c in cands if c is not chosen)


def _local_kept(saved_total: sympy.Expr, stats: ShardStats, r: int) -> int:
    return int(saved_total.subs({N_SRC: stats.nodes[r], N_DST: stats.dst(r), E: stats.edges[r]}))


@dataclass(frozen=True)
class _Costs:
    """What planning one layer starts from: the exchange, the passes, what backward keeps."""

    chosen: Exchange | None
    alts: tuple[Exchange, ...]
    passes: int        # forward fetches per round
    bwd_passes: int    # backward passes over the blocks
    saved: dict        # symbolic bytes kept for backward

    def local_kept(self, stats: ShardStats) -> list[int]:
        """Per worker, the bytes backward keeps of its own shard (kept in every mode)."""
        return [_local_kept(self.saved["total"], stats, r) for r in range(stats.num_parts)]

    def kept_bytes(self, stats: ShardStats, kept: tuple[int, ...], r: int) -> int:
        """The bytes worker r keeps: its own share and the rows of the peers ``kept``."""
        remote = 0 if self.chosen is None else self.chosen.row_bytes * sum(
            stats.boundary[r][j] for j in kept)
        return _local_kept(self.saved["total"], stats, r) + remote

    def rows_saved_per_row_kept(self) -> int:
        """Row transfers a kept remote row saves a worker in one step: the forward passes
        after the first, the backward re-fetches, and the gradients sent back per pass
        instead of once."""
        grad = 1 if self.chosen is not None and self.chosen.needs_grad else 0
        return (self.passes - 1) + self.bwd_passes + grad * max(self.bwd_passes - 1, 0)


def _costs(fn: Function, baseline: bool, inputs_need_grad: bool,
           distributed: bool = True) -> _Costs:
    chosen, alts = _choose(exchange_candidates(fn, inputs_need_grad), baseline)
    unfused = _has_unfused_softmax(fn)
    passes = 2 if ((baseline and _has_softmax(fn)) or unfused) else 1
    # the backward pass revisits the blocks only if a gradient flows through the edges
    bwd_passes = (2 if unfused else 1) if _edges_need_grad(fn, inputs_need_grad) else 0
    return _Costs(chosen, alts, passes, bwd_passes,
                  saved_for_backward(fn, inputs_need_grad, distributed=distributed,
                                     exchanged=chosen.values if chosen is not None else ()))


def plan_layer(name: str, fn: Function, *, mode: str = "full", workers: int = 1,
               stats: ShardStats | None = None, mem_budget: int | None = None,
               baseline: bool = False, exec_mode: str | None = None,
               inputs_need_grad: bool = True,
               kept_peers: tuple[tuple[int, ...], ...] | None = None,
               distributed: bool | None = None) -> LayerPlan:
    """Plan one optimized layer. ``kept_peers``: per worker, the peers whose rows it keeps,
    as ``share_budget`` chose them for the whole step (else ``mem_budget`` is this layer's).
    ``distributed``: the layer runs its distributed schedule (default: on more than one
    worker), whose kept bytes are the schedule's, not a ``Graph`` kernel's."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if exec_mode is not None and exec_mode not in EXEC_MODES:
        raise ValueError(f"unknown execution mode {exec_mode!r}; expected one of {', '.join(EXEC_MODES)}")
    if stats is not None and stats.num_parts != workers:
        raise ValueError(f"the partition has {stats.num_parts} parts but {workers} workers were asked for")
    costs = _costs(fn, baseline, inputs_need_grad,
                   workers > 1 if distributed is None else distributed)
    chosen, alts, passes, bwd_passes, saved = (costs.chosen, costs.alts, costs.passes,
                                               costs.bwd_passes, costs.saved)
    recomputed = [f"edge values of {v.op.value} %{i}" for i, v in enumerate(fn.values) if v.op in FUSED
                  and v.op is not Op.SDDMM]
    if chosen is not None and chosen.recompute:
        recomputed.append("on received rows: " + ", ".join(f"%{j}" for j in chosen.recompute))
    if workers == 1 or chosen is None:
        return LayerPlan(name, fn.name, "local", chosen, alts, passes, saved, forward_flops(fn),
                         tuple(recomputed), tuple(() for _ in range(workers)),
                         None if stats is None else tuple(0 for _ in range(workers)),
                         None if stats is None else tuple(
                             _local_kept(saved["total"], stats, r) for r in range(workers)),
                         backward_passes=bwd_passes)
    default = "sar" if mode == "full" else "oneshot"
    rb = chosen.row_bytes
    grad = 1 if chosen.needs_grad else 0
    if stats is None:
        em = exec_mode or default
        refetch = 1 if em == "sar" else 0
        expr = (B * rb * (1 + grad) if em == "oneshot"
                else B * rb * (passes + bwd_passes * (refetch + grad)))
        if em != "oneshot":
            recomputed.append("remote rows (re-fetched in backward)")
        return LayerPlan(name, fn.name, em, chosen, alts, passes, saved, forward_flops(fn),
                         tuple(recomputed), tuple(() for _ in range(workers)), None, None, expr,
                         bwd_passes)
    p = workers
    bnd = stats.boundary
    local = [_local_kept(saved["total"], stats, r) for r in range(p)]
    if kept_peers is not None and exec_mode in (None, "hybrid"):
        kept = [tuple(k) for k in kept_peers]
        full = all(len(k) == p - 1 for k in kept)
        em = exec_mode or ("oneshot" if full else ("sar" if not any(kept) else "hybrid"))
    elif exec_mode is not None:
        em = exec_mode
        kept = [tuple(j for j in range(p) if j != r) if em == "oneshot" else () for r in range(p)]
        if em == "hybrid":
            kept = _fit(stats, rb, local, mem_budget)
    elif mem_budget is None:
        em = default
        kept = [tuple(j for j in range(p) if j != r) if em == "oneshot" else () for r in range(p)]
    else:
        kept = _fit(stats, rb, local, mem_budget)
        full = all(len(k) == p - 1 for k in kept)
        em = "oneshot" if full else ("sar" if not any(kept) else "hybrid")
    # bytes sent by worker r (what sarc.distributed's exchange counts): its rows to every reader, once
    # to a reader that keeps them and once per forward pass to one that does not, again per
    # backward pass to the readers that did not keep them; and the gradients of the rows it
    # received, once per backward pass (kept rows: accumulated, sent once at the end)
    sent = _bytes_sent(bnd, rb, kept, passes, bwd_passes, grad)
    kept_bytes = [costs.kept_bytes(stats, kept[r], r) for r in range(p)]
    if em != "oneshot":
        recomputed.append("remote rows (re-fetched in backward)")
    expr = (B * rb * (1 + grad) if em == "oneshot"
            else B * rb * (passes + bwd_passes * (1 + grad)))
    return LayerPlan(name, fn.name, em, chosen, alts, passes, saved, forward_flops(fn),
                     tuple(recomputed), tuple(kept), tuple(sent), tuple(kept_bytes), expr,
                     bwd_passes)


def fetches_once(mem_budget: int | None, baseline: bool, exec_mode: str | None) -> bool:
    """Whether a ``sarc.HeteroConv`` on workers fetches its inputs' boundary rows once for all
    its relations (``sarc.distributed.halo``), not once per relation's schedule: where
    nothing asks that remote rows be dropped and fetched again (no memory budget, the
    planner's or ``oneshot`` execution, not the SAR baseline)."""
    return mem_budget is None and not baseline and exec_mode in (None, "oneshot")


def plan_fetch(name: str, names: Sequence[str], width: int, dtype_bytes: int,
               needs_grad: bool, *, workers: int, stats: ShardStats | None = None) -> LayerPlan:
    """The plan of a ``sarc.HeteroConv``'s input fetched once for all its relations
    (``sarc.distributed.halo``): each boundary row of ``width`` values (``names``) sent once
    to each worker that reads it and kept there for the relations' layers and their
    backward (``exec="halo"``), its gradient sent back once."""
    exchange = Exchange((), tuple(names), width, dtype_bytes, needs_grad, ())
    rb = exchange.row_bytes
    grad = 1 if needs_grad else 0
    kept_bytes = B * rb
    saved = {"edge": sympy.Integer(0), "node": kept_bytes, "total": kept_bytes}
    p = workers
    kept = tuple(tuple(j for j in range(p) if j != r) for r in range(p))
    sent = held = None
    if stats is not None:
        sent = tuple(_bytes_sent(stats.boundary, rb, kept, 1, 1, grad))
        held = tuple(rb * sum(stats.boundary[r]) for r in range(p))
    return LayerPlan(name, "HeteroConv", "halo", exchange, (), 1, saved, sympy.Integer(0), (),
                     kept, sent, held, B * rb * (1 + grad), 1)


def over_budget_why(fetched: bool) -> str:
    """Why a step's plan keeps more than the memory budget (``Plan.over_budget``): its
    layers' shares of their own shards alone exceed it (every layer then runs in sar); or,
    where HeteroConvs fetched their inputs once within it (``fetch_within``), those rows
    with the shares, where the decision priced a fetch per conv, of its first relation's
    declared inputs, and each relation's layer as the step's first block's input needing
    no gradient (``call_blocks``), and the step kept more (a conv called twice fetches
    twice; a relation's input that needs one keeps more for some layers)."""
    if fetched:
        return ("the rows its HeteroConvs fetched once and what backward keeps of their own "
                "shards exceed it (the budget's decision priced one fetch per conv, of its "
                "first relation's declared inputs, before the first step: a conv called "
                "twice fetches twice)")
    return ("what backward keeps of their own shards alone exceeds it (every layer sar: "
            "nothing remote kept)")


def on_halo(lp: LayerPlan, stats: ShardStats | None, workers: int) -> LayerPlan:
    """``lp``, a ``sarc.HeteroConv`` relation's layer, as it runs on the rows its conv
    fetched once (``sarc.distributed.halo``): it exchanges nothing (``exec="halo"``; the
    fetch's plan counts the rows) and keeps for backward its share of each worker's own
    shard, priced on the whole shard as the budget's decision prices it
    (``fetch_within``; the relation's edges of it are fewer)."""
    recomputed = tuple(r for r in lp.recomputed if not r.startswith("remote rows"))
    return replace(
        lp, exec_mode="halo", exchange=None, alternatives=(), recomputed=recomputed,
        kept_peers=tuple(() for _ in range(workers)), batches=None,
        bytes_sent=None if stats is None else (0,) * workers,
        bytes_kept=None if stats is None else tuple(
            _local_kept(lp.saved["total"], stats, r) for r in range(workers)),
        bytes_sent_expr=0)


def _bytes_sent(bnd, rb: int, kept, passes: int, bwd_passes: int, grad: int) -> list[int]:
    """Per worker, the bytes of one step of a layer whose workers keep the rows of
    ``kept[r]``'s peers, on blocks whose worker r reads ``bnd[r][j]`` rows of worker j."""
    p = len(bnd)
    sent = []
    for r in range(p):
        fwd = sum(bnd[j][r] * (1 if r in kept[j] else passes) for j in range(p) if j != r)
        refetch = sum(bnd[j][r] for j in range(p) if j != r and r not in kept[j])
        grads = sum(bnd[r][j] * (1 if j in kept[r] else bwd_passes) for j in range(p) if j != r)
        sent.append(rb * (fwd + bwd_passes * refetch + grad * grads))
    return sent


def step_bytes_sent(plans: list[LayerPlan], stats: list[ShardStats]) -> list[int]:
    """Per worker, the bytes one step sends whose layer ``l`` runs the program planned as
    ``plans[l]`` (its exchange, passes and kept peers, fixed) on blocks of ``stats[l]``:
    the prediction for a mini-batch step whose blocks are not those it was planned on."""
    p = stats[0].num_parts
    total = [0] * p
    for lp, st in zip(plans, stats):
        if lp.exchange is None or lp.exec_mode == "local":
            continue
        grad = 1 if lp.exchange.needs_grad else 0
        sent = _bytes_sent(st.boundary, lp.exchange.row_bytes, lp.kept_peers, lp.fetch_passes,
                           lp.backward_passes, grad)
        total = [a + b for a, b in zip(total, sent)]
    return total


def _fit(stats: ShardStats, rb: int, local: list[int], budget):
    """Per worker, the peers whose rows fit the budget (largest first); ``budget`` is one
    figure for every worker or one per worker."""
    p = stats.num_parts
    kept = []
    for r in range(p):
        mine_budget = budget if budget is None or isinstance(budget, int) else budget[r]
        room = (mine_budget if mine_budget is not None else 0) - local[r]
        mine = []
        for j in sorted((j for j in range(p) if j != r), key=lambda j: -stats.boundary[r][j]):
            need = stats.boundary[r][j] * rb
            if mine_budget is not None and need <= room:
                mine.append(j)
                room -= need
        kept.append(tuple(sorted(mine)))
    return kept


def share_budget(layers: list[tuple[Function, bool]], stats: ShardStats | list[ShardStats],
                 mem_budget: int, baseline: bool = False) -> list[tuple[tuple[int, ...], ...]]:
    """The memory budget of a whole training step, shared by its layers: per layer
    (``(optimized layer, its inputs need a gradient)``, in call order), per worker, the
    peers whose rows it keeps.

    Every layer keeps what its backward needs of the worker's own shard (that much is
    spent whatever the plan); the room left on each worker goes to remote rows, the
    (layer, peer) pairs that save the most row transfers per byte kept first (a layer
    with a normalizer pass or a backward pass saves more), larger ones first among
    equals, each taken if it fits. So the kept bytes summed over the layers stay
    within ``mem_budget`` on every worker whenever the shards' own share does.
    ``stats``: the shards', or per layer its blocks' (a minibatch step).
    """
    per_layer = list(stats) if isinstance(stats, (list, tuple)) else [stats] * len(layers)
    p = per_layer[0].num_parts
    costs = [_costs(fn, baseline, need) for fn, need in layers]
    room = [mem_budget - sum(c.local_kept(st)[r] for c, st in zip(costs, per_layer))
            for r in range(p)]
    kept: list[list[list[int]]] = [[[] for _ in range(p)] for _ in costs]
    for r in range(p):
        cands = [(c.rows_saved_per_row_kept(), per_layer[l].boundary[r][j] * c.chosen.row_bytes, l, j)
                 for l, c in enumerate(costs) if c.chosen is not None
                 for j in range(p) if j != r]
        for _, need, l, j in sorted(cands, key=lambda t: (-t[0], -t[1], t[2], t[3])):
            if need <= room[r]:
                kept[l][r].append(j)
                room[r] -= need
    return [tuple(tuple(sorted(k)) for k in layer) for layer in kept]


def fetch_within(layers: list[tuple[Function, bool]], on_halo: Sequence[bool],
                 fetch_row_bytes: int, stats: ShardStats, mem_budget: int,
                 baseline: bool = False) -> int | None:
    """Under a memory budget, whether a step's ``sarc.HeteroConv`` calls may fetch their
    inputs once (``fetches_once``, the fewest bytes and rounds): whether the rows they
    fetch (``fetch_row_bytes``, all fetches' row bytes together, for every remote row a
    worker reads) and every layer's share of its own shard fit the budget on every
    worker. ``on_halo[l]``: layer ``l`` is a relation's, run on the fetched rows. Returns
    the budget the other layers share (``share_budget``) then, what the fetches and the
    relations' layers keep taken off on the fullest worker; None where it does not fit
    (each relation runs a memory-bounded schedule of its own)."""
    p = stats.num_parts
    local = [_costs(fn, baseline, need).local_kept(stats) for fn, need in layers]
    fixed = [fetch_row_bytes * sum(stats.boundary[r])
             + sum(kept[r] for kept, halo in zip(local, on_halo) if halo) for r in range(p)]
    if any(fixed[r] + sum(kept[r] for kept, halo in zip(local, on_halo) if not halo) > mem_budget
           for r in range(p)):
        return None
    return mem_budget - max(fixed)


def step_kept_bytes(layers: list[tuple[Function, bool]], stats: list[ShardStats],
                    kept: list[tuple[tuple[int, ...], ...]], r: int,
                    baseline: bool = False) -> int:
    """The bytes worker ``r`` keeps for backward in one step whose layer ``l`` runs on
    blocks of ``stats[l]`` keeping the rows of peers ``kept[l][r]`` (``share_budget``'s
    choice): each layer's share of its own block and the kept remote rows, summed.
    Only worker ``r``'s figures are read (``ShardStats.of_worker``: a worker can check a
    step alone)."""
    return sum(_costs(fn, baseline, need).kept_bytes(st, k[r], r)
               for (fn, need), st, k in zip(layers, stats, kept))


def plan_model(layers: list[tuple[str, Function]], *, mode: str = "full", workers: int = 1,
               stats: ShardStats | None = None, mem_budget: int | None = None,
               baseline: bool = False, exec_mode: str | None = None,
               sample: BlockSample | None = None, batch_size: int | None = None,
               fanouts: tuple[int, ...] | None = None) -> Plan:
    """Plan every layer of a model, the memory budget shared by the whole step
    (``share_budget``); the first layer's input features need no gradient. A minibatch
    mode plans each layer on its blocks' statistics in ``sample`` (``plan_minibatch``)."""
    if sample is not None:
        return plan_minibatch(layers, sample, mode=mode, workers=workers, mem_budget=mem_budget,
                              baseline=baseline, exec_mode=exec_mode)
    needs = [k > 0 for k in range(len(layers))]
    shared = [None] * len(layers)
    if mem_budget is not None and stats is not None and workers > 1 and exec_mode in (None, "hybrid"):
        shared = share_budget([(fn, need) for (_, fn), need in zip(layers, needs)], stats,
                              mem_budget, baseline)
    plans = tuple(plan_layer(name, fn, mode=mode, workers=workers, stats=stats,
                             mem_budget=mem_budget, baseline=baseline, exec_mode=exec_mode,
                             inputs_need_grad=need, kept_peers=kept)
                  for (name, fn), need, kept in zip(layers, needs, shared))
    return Plan(mode, workers, mem_budget, baseline, plans, stats, None, batch_size,
                None if fanouts is None else tuple(fanouts))


def share_step(layers: list[tuple[Function, bool]], fetched: tuple[Sequence[bool], int] | None,
               stats: ShardStats, mem_budget: int,
               baseline: bool = False) -> tuple[list[tuple[tuple[int, ...], ...] | None], bool]:
    """A full-batch step's budget shared by its ``layers`` (in module order, as the workers
    price it before their first step): where the step's HeteroConvs' fetches (``fetched``:
    which layers are relations', the bytes of a fetched row; None without a conv, or where
    they cannot fetch once) fit it with every layer's own share (``fetch_within``), they
    fetch once and the other layers share what is left. Returns per layer its kept peers
    (None for a relation's layer on the fetched rows) and whether the convs fetch once."""
    room = None if fetched is None else fetch_within(layers, *fetched, stats, mem_budget,
                                                     baseline)
    relations = list(fetched[0]) if room is not None else [False] * len(layers)
    rest = [fn for fn, halo in zip(layers, relations) if not halo]
    shares = iter(share_budget(rest, stats, mem_budget if room is None else room, baseline)
                  if rest else ())
    return [None if halo else next(shares) for halo in relations], room is not None


def on_batches(lp: LayerPlan, sample: BlockSample, k: int,
               per_batch: Sequence[LayerPlan]) -> LayerPlan:
    """``lp``, planned for block k of a minibatch step, with its figures on each batch of
    ``sample`` (``per_batch[b]``: its plan on batch b's blocks, its choices fixed):
    ``bytes_sent`` / ``bytes_kept`` per worker the largest over the batches, ``batches``
    every batch's."""
    sent = tuple(b.bytes_sent for b in per_batch)
    kept = tuple(b.bytes_kept for b in per_batch)
    figures = BatchFigures(sample.summary(k), sent, kept,
                           None if sample.fanouts is None else sample.fanouts[k])
    return replace(lp, bytes_sent=tuple(map(max, zip(*sent))),
                   bytes_kept=tuple(map(max, zip(*kept))), batches=figures)


def plan_minibatch(layers: list[tuple[str, Function]], sample: BlockSample, *, mode: str,
                   workers: int, mem_budget: int | None = None, baseline: bool = False,
                   exec_mode: str | None = None, needs: Sequence[bool] | None = None,
                   blocks: Sequence[int] | None = None) -> Plan:
    """Plan every layer of a minibatch step on its own blocks: each layer for the largest
    figures of its blocks in ``sample`` (``ShardStats.elementwise_max``; the budget shared
    by the layers as in ``plan_model``), then that plan, its choices fixed, on each batch
    of the sample. A layer's ``bytes_sent`` / ``bytes_kept`` are per worker the largest
    over the batches; ``batches`` holds every batch's figures. ``needs``: per layer,
    whether its inputs need a gradient (default: all but the first's); ``blocks``: per
    layer, the block it runs on (default: layer k on block k; a ``sarc.HeteroConv``'s
    relations' layers share their conv's)."""
    if mode not in MINIBATCH_MODES:
        raise ValueError(f"a block sample plans a minibatch mode ({', '.join(MINIBATCH_MODES)}), "
                         f"not {mode!r}")
    if sample.num_parts != workers:
        raise ValueError(f"the block sample has {sample.num_parts} workers but {workers} "
                         f"workers were asked for")
    blocks = list(range(len(layers))) if blocks is None else list(blocks)
    if len(blocks) != len(layers) or any(b not in (a, a + 1) for a, b in
                                         zip([-1, *blocks], blocks)):
        raise ValueError(f"blocks gives each of the {len(layers)} layers its block, in call "
                         f"order from block 0, a layer on its predecessor's block or the "
                         f"next; got {blocks}")
    if sample.num_layers != len(set(blocks)):
        raise ValueError(f"the block sample has {sample.num_layers} layers but the model's "
                         f"step takes {len(set(blocks))} blocks")
    needs = [k > 0 for k in range(len(layers))] if needs is None else list(needs)
    largest = [sample.largest(b) for b in blocks]
    shared = [None] * len(layers)
    if mem_budget is not None and workers > 1 and exec_mode in (None, "hybrid"):
        shared = share_budget([(fn, need) for (_, fn), need in zip(layers, needs)], largest,
                              mem_budget, baseline)
    plans = []
    for k, ((name, fn), need) in enumerate(zip(layers, needs)):
        lp = plan_layer(name, fn, mode=mode, workers=workers, stats=largest[k],
                        mem_budget=mem_budget, baseline=baseline, exec_mode=exec_mode,
                        inputs_need_grad=need, kept_peers=shared[k])
        fixed = None if lp.exec_mode == "local" else lp.exec_mode
        plans.append(on_batches(lp, sample, blocks[k], [
            plan_layer(name, fn, mode=mode, workers=workers, stats=st, baseline=baseline,
                       exec_mode=fixed, inputs_need_grad=need, kept_peers=lp.kept_peers)
            for st in sample.layer(blocks[k])]))
    return Plan(mode, workers, mem_budget, baseline, tuple(plans), None, sample,
                sample.batch_size, sample.fanouts)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _passes_note(lp: LayerPlan, baseline: bool) -> str:
    if lp.fetch_passes == 1:
        return ""
    why = "no online softmax (baseline)" if baseline else "a normalizer pass first: unfused edge_softmax"
    return f", fetched twice ({why}; fetch_passes={lp.fetch_passes})"


def _minibatch_lines(plan: Plan) -> list[str]:
    fan = ("" if plan.fanouts is None
           else f", fanouts {','.join(map(str, plan.fanouts))} (input layer first)")
    seeds = "?" if plan.batch_size is None else str(plan.batch_size)
    if plan.sample is None:
        return [f"  minibatch: {seeds} seeds / step over all workers{fan}; block sizes depend on the seeds: "
                f"symbolic (N_src, N_dst, E, B of each layer's block; --partition measures them)"]
    return [f"  minibatch: {seeds} seeds / step over all workers{fan}; block sizes from "
            f"{len(plan.sample.batches)} sampled batch{'es' * (len(plan.sample.batches) != 1)} "
            f"(mean / max over batches and workers), "
            f"each layer planned for its largest"]


def _block_lines(b: BatchFigures, workers: int) -> list[str]:
    def mm(d):
        return f"{d['mean']:.1f} / {d['max']}"
    blk = b.blocks
    lines = [f"  blocks / worker (mean / max): dst {mm(blk['dst'])}, src {mm(blk['src'])}, "
             f"edges {mm(blk['edges'])}, remote rows {mm(blk['remote_rows'])}"
             + ("" if b.fanout is None else f"; fanout {b.fanout}")]
    if workers > 1:
        lines.append(f"  bytes sent / worker / step: mean {_fmt_bytes(b.sent['mean'])}, "
                     f"max {_fmt_bytes(b.sent['max'])}")
    lines.append(f"  bytes kept / worker / step: mean {_fmt_bytes(b.kept['mean'])}, "
                 f"max {_fmt_bytes(b.kept['max'])}")
    return lines


def format_plan(plan: Plan) -> str:
    budget = "none" if plan.mem_budget is None else _fmt_bytes(plan.mem_budget)
    lines = [f"plan: mode={plan.mode} workers={plan.workers} mem-budget={budget} "
             f"{'baseline (SAR-equivalent)' if plan.baseline else 'pushdown+online-softmax'}"]
    if plan.minibatch:
        lines.extend(_minibatch_lines(plan))
    if plan.workers > 1:
        lines.append(f"  exchange rounds: {plan.workers - 1} (round k: worker r -> r+k, "
                     f"r-k -> r), next round prefetched while the current one computes")
    for lp in plan.layers:
        lines.append(f"layer {lp.name} ({lp.layer_class}): exec={lp.exec_mode}")
        if lp.exchange is not None:
            x = lp.exchange
            row = f"{' + '.join(x.names)} = {x.width} x {x.dtype_bytes} B/row"
            if plan.workers > 1:
                lines.append(f"  exchanged: {row}{', gradients sent back' if x.needs_grad else ''}"
                             f"{_passes_note(lp, plan.baseline)}")
            else:  # what P workers would send; one sends nothing
                lines.append(f"  exchanged on P > 1 workers: {row} (one worker: nothing sent)")
            for a in lp.alternatives:
                lines.append(f"  not chosen: {' + '.join(a.names)} = {a.width} x {a.dtype_bytes} B/row")
        lines.append(f"  kept for backward: edge {lp.saved['edge']} B, node {lp.saved['node']} B")
        lines.append(f"  forward flops: {lp.flops}")
        if lp.recomputed:
            lines.append(f"  recomputed in backward: {'; '.join(lp.recomputed)}")
        if lp.batches is not None:
            lines.extend(_block_lines(lp.batches, plan.workers))
            if lp.exec_mode == "hybrid":
                lines.append(f"  kept peers: {', '.join(f'{r}:{list(p)}' for r, p in enumerate(lp.kept_peers))}")
        elif lp.bytes_sent is not None and plan.workers > 1:
            s, k = lp.bytes_sent, lp.bytes_kept
            lines.append(f"  bytes sent / worker / step: max {_fmt_bytes(max(s))}, "
                         f"mean {_fmt_bytes(sum(s) / len(s))}")
            lines.append(f"  bytes kept / worker: max {_fmt_bytes(max(k))}")
            if lp.exec_mode == "hybrid":
                lines.append(f"  kept peers: {', '.join(f'{r}:{list(p)}' for r, p in enumerate(lp.kept_peers))}")
        elif plan.workers > 1:
            lines.append(f"  bytes sent / worker / step: {lp.bytes_sent_expr}")
    for lp in plan.fetches:
        x = lp.exchange
        lines.append(f"fetch {lp.name} ({lp.layer_class}): exec={lp.exec_mode}, its input's "
                     f"boundary rows fetched once for all its relations' layers (those above "
                     f"with exec=halo, which exchange nothing of their own)")
        lines.append(f"  exchanged: {' + '.join(x.names)} = {x.width} x {x.dtype_bytes} B/row"
                     f"{', gradients sent back' if x.needs_grad else ''}")
        if lp.batches is not None:
            lines.extend(_block_lines(lp.batches, plan.workers))
        elif lp.bytes_sent is not None:
            lines.append(f"  bytes sent / worker / step: max {_fmt_bytes(max(lp.bytes_sent))}, "
                         f"mean {_fmt_bytes(sum(lp.bytes_sent) / len(lp.bytes_sent))}")
            lines.append(f"  bytes kept / worker: max {_fmt_bytes(max(lp.bytes_kept))}")
        else:
            lines.append(f"  bytes sent / worker / step: {lp.bytes_sent_expr}")
    step = plan.step_bytes_kept()
    if step is not None and (plan.workers > 1 or plan.sample is not None):
        lines.append(f"step: bytes kept / worker (all layers"
                     f"{', each at its largest batch' if plan.sample is not None else ''}): "
                     f"max {_fmt_bytes(max(step))}"
                     + (f" of the budget {budget}" if plan.mem_budget is not None else ""))
        sent = plan.total_bytes_sent()
        if plan.sample is not None and plan.workers > 1:
            lines.append(f"step: bytes sent / worker (all layers, each at its largest batch): "
                         f"max {_fmt_bytes(max(sent))}")
        over = plan.over_budget()
        if over:
            lines.append(f"  over the budget on workers {over}: {over_budget_why(bool(plan.fetches))}")
    return "".join(names.one_line(line) + "\n" for line in lines)  # names stay on their line
