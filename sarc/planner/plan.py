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

``baseline=True`` plans the SAR-equivalent schedule: the raw layer input
crosses the network (no pushdown across the exchange) and attention layers
fetch twice (no online softmax), for comparison.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import sympy

from ..ir.function import Function
from ..ir.ops import FUSED, Op
from ..ir.types import E, N_DST, N_SRC
from .cost import (B, Exchange, _needs_grad, exchange_candidates, forward_flops,
                   saved_for_backward)
from .stats import ShardStats

MODES = ("full", "mfg", "sampling")
EXEC_MODES = ("sar", "oneshot", "hybrid")


@dataclass(frozen=True)
class LayerPlan:
    name: str
    layer_class: str
    exec_mode: str                       # sar | oneshot | hybrid | local
    exchange: Exchange | None
    alternatives: tuple[Exchange, ...]   # the candidates not chosen
    fetch_passes: int                    # forward fetches per round (2: softmax without online normalization)
    saved: dict                          # symbolic bytes kept for backward (edge / node / total)
    flops: sympy.Expr
    recomputed: tuple[str, ...]
    kept_peers: tuple[tuple[int, ...], ...]  # per worker, the peers whose rows it keeps
    bytes_sent: tuple[int, ...] | None       # per worker per epoch (None: symbolic only)
    bytes_kept: tuple[int, ...] | None
    bytes_sent_expr: sympy.Expr = field(default=sympy.Integer(0))
    backward_passes: int = 1                 # backward passes over the blocks (2: unfused edge_softmax;
    #                                          0: no gradient flows through the edges)


@dataclass(frozen=True)
class Plan:
    mode: str
    workers: int
    mem_budget: int | None
    baseline: bool
    layers: tuple[LayerPlan, ...]
    stats: ShardStats | None

    @property
    def rounds(self) -> list[list[tuple[int, int, int]]]:
        """Round k: (worker, sends to, receives from) for every worker."""
        p = self.workers
        return [[(r, (r + k) % p, (r - k) % p) for r in range(p)] for k in range(1, p)]

    def total_bytes_sent(self) -> list[int] | None:
        if self.stats is None:
            return None
        return [sum(lp.bytes_sent[r] for lp in self.layers) for r in range(self.workers)]

    def to_json(self) -> dict:
        def ex(x: Exchange | None):
            return None if x is None else {"values": list(x.values), "names": list(x.names),
                                           "width": x.width, "row_bytes": x.row_bytes,
                                           "needs_grad": x.needs_grad,
                                           "recompute": list(x.recompute)}
        return {
            "mode": self.mode, "workers": self.workers, "mem_budget": self.mem_budget,
            "baseline": self.baseline,
            "rounds": [[list(t) for t in rnd] for rnd in self.rounds],
            "stats": None if self.stats is None else self.stats.to_json(),
            "layers": [{
                "name": lp.name, "class": lp.layer_class, "exec_mode": lp.exec_mode,
                "exchange": ex(lp.exchange), "alternatives": [ex(a) for a in lp.alternatives],
                "fetch_passes": lp.fetch_passes, "backward_passes": lp.backward_passes,
                "saved_bytes": {k: str(v) for k, v in lp.saved.items()},
                "flops": str(lp.flops), "recomputed": list(lp.recomputed),
                "kept_peers": [list(k) for k in lp.kept_peers],
                "bytes_sent_per_worker": None if lp.bytes_sent is None else list(lp.bytes_sent),
                "bytes_kept_per_worker": None if lp.bytes_kept is None else list(lp.bytes_kept),
                "bytes_sent_formula": str(lp.bytes_sent_expr),
            } for lp in self.layers],
        }

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
    n = stats.nodes[r]
    return int(saved_total.subs({N_SRC: n, N_DST: n, E: stats.edges[r]}))


def plan_layer(name: str, fn: Function, *, mode: str = "full", workers: int = 1,
               stats: ShardStats | None = None, mem_budget: int | None = None,
               baseline: bool = False, exec_mode: str | None = None,
               inputs_need_grad: bool = True) -> LayerPlan:
    """Plan one optimized layer."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if exec_mode is not None and exec_mode not in EXEC_MODES:
        raise ValueError(f"unknown execution mode {exec_mode!r}; expected one of {', '.join(EXEC_MODES)}")
    if stats is not None and stats.num_parts != workers:
        raise ValueError(f"the partition has {stats.num_parts} parts but {workers} workers were asked for")
    cands = exchange_candidates(fn, inputs_need_grad)
    chosen, alts = _choose(cands, baseline)
    unfused = _has_unfused_softmax(fn)
    passes = 2 if ((baseline and _has_softmax(fn)) or unfused) else 1
    # the backward pass revisits the blocks only if a gradient flows through the edges
    bwd_passes = (2 if unfused else 1) if _edges_need_grad(fn, inputs_need_grad) else 0
    saved = saved_for_backward(fn, inputs_need_grad)
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
    if exec_mode is not None:
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
    sent = []
    for r in range(p):
        fwd = sum(bnd[j][r] * (1 if r in kept[j] else passes) for j in range(p) if j != r)
        refetch = sum(bnd[j][r] for j in range(p) if j != r and r not in kept[j])
        grads = sum(bnd[r][j] * (1 if j in kept[r] else bwd_passes) for j in range(p) if j != r)
        sent.append(rb * (fwd + bwd_passes * refetch + grad * grads))
    kept_bytes = [local[r] + rb * sum(bnd[r][j] for j in kept[r]) for r in range(p)]
    if em != "oneshot":
        recomputed.append("remote rows (re-fetched in backward)")
    expr = (B * rb * (1 + grad) if em == "oneshot"
            else B * rb * (passes + bwd_passes * (1 + grad)))
    return LayerPlan(name, fn.name, em, chosen, alts, passes, saved, forward_flops(fn),
                     tuple(recomputed), tuple(kept), tuple(sent), tuple(kept_bytes), expr,
                     bwd_passes)


def _fit(stats: ShardStats, rb: int, local: list[int], budget: int | None):
    """Per worker, the peers whose rows fit the budget (largest first)."""
    p = stats.num_parts
    kept = []
    for r in range(p):
        room = (budget if budget is not None else 0) - local[r]
        mine = []
        for j in sorted((j for j in range(p) if j != r), key=lambda j: -stats.boundary[r][j]):
            need = stats.boundary[r][j] * rb
            if budget is not None and need <= room:
                mine.append(j)
                room -= need
        kept.append(tuple(sorted(mine)))
    return kept


def plan_model(layers: list[tuple[str, Function]], *, mode: str = "full", workers: int = 1,
               stats: ShardStats | None = None, mem_budget: int | None = None,
               baseline: bool = False, exec_mode: str | None = None) -> Plan:
    """Plan every layer of a model; the first layer's input features need no gradient."""
    plans = tuple(plan_layer(name, fn, mode=mode, workers=workers, stats=stats,
                             mem_budget=mem_budget, baseline=baseline, exec_mode=exec_mode,
                             inputs_need_grad=(k > 0))
                  for k, (name, fn) in enumerate(layers))
    return Plan(mode, workers, mem_budget, baseline, plans, stats)


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


def format_plan(plan: Plan) -> str:
    budget = "none" if plan.mem_budget is None else _fmt_bytes(plan.mem_budget)
    lines = [f"plan: mode={plan.mode} workers={plan.workers} mem-budget={budget} "
             f"{'baseline (SAR-equivalent)' if plan.baseline else 'pushdown+online-softmax'}"]
    if plan.workers > 1:
        lines.append(f"  exchange rounds: {len(plan.rounds)} (round k: worker r -> r+k, "
                     f"r-k -> r), next round prefetched while the current one computes")
    for lp in plan.layers:
        lines.append(f"layer {lp.name} ({lp.layer_class}): exec={lp.exec_mode}")
        if lp.exchange is not None:
            x = lp.exchange
            lines.append(f"  exchanged: {' + '.join(x.names)} = {x.width} x {x.dtype_bytes} B/row"
                         f"{', gradients sent back' if x.needs_grad else ''}"
                         f"{_passes_note(lp, plan.baseline)}")
            for a in lp.alternatives:
                lines.append(f"  not chosen: {' + '.join(a.names)} = {a.width} x {a.dtype_bytes} B/row")
        lines.append(f"  kept for backward: edge {lp.saved['edge']} B, node {lp.saved['node']} B")
        lines.append(f"  forward flops: {lp.flops}")
        if lp.recomputed:
            lines.append(f"  recomputed in backward: {'; '.join(lp.recomputed)}")
        if lp.bytes_sent is not None and plan.workers > 1:
            s, k = lp.bytes_sent, lp.bytes_kept
            lines.append(f"  bytes sent / worker / epoch: max {_fmt_bytes(max(s))}, "
                         f"mean {_fmt_bytes(sum(s) / len(s))}")
            lines.append(f"  bytes kept / worker: max {_fmt_bytes(max(k))}")
            if lp.exec_mode == "hybrid":
                lines.append(f"  kept peers: {', '.join(f'{r}:{list(p)}' for r, p in enumerate(lp.kept_peers))}")
        elif plan.workers > 1:
            lines.append(f"  bytes sent / worker / epoch: {lp.bytes_sent_expr}")
    return "\n".join(lines) + "\n"
