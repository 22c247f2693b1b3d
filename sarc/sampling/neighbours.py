"""A shard's in-edges as one table, and the neighbour sample of a set of its nodes.

``InEdges`` lists every edge into the shard's nodes (from any source shard), grouped
by destination and, within a destination, in original-edge-id order: an order that
does not depend on the partitioning, so the rank of an edge among its destination's
in-edges is the same whatever the number of workers.

``sample`` picks, for each destination v of layer k, ``fanout`` of its in-edges:

- without replacement and probabilities, a uniform subset by Floyd's algorithm: of v's
  ``d`` in-edges (ranked 0..d-1), for ``J = d - fanout .. d - 1`` the rank
  ``t = floor(u_J (J + 1))``, or ``J`` if ``t`` is drawn already: ``fanout`` draws,
  however many in-edges a hub has;
- without replacement, with weights ``w``: the ``fanout`` edges of largest key
  ``log(u_rank) / w`` (ties to the lower rank), the weighted draw without replacement
  of Efraimidis and Spirakis (as successive draws proportional to ``w`` among the edges
  not yet drawn); edges of weight 0 are never drawn, so a node may get fewer than
  ``fanout``;
- with replacement: ``fanout`` independent draws, each an edge with probability
  ``w / sum(w)`` (inverse CDF over the edges in their order);
- ``fanout == -1``: every in-edge (weights ignored).

Each ``u`` is ``draws.uniform(seed, epoch, k, orig id of v, tag, edge rank or draw
index)``: v's sample depends on nothing else. On the CPU it is drawn by sarc's C kernel
(``sarc.native``: Floyd's draws, or a heap of the best keys per node); without it by
the same draws in torch (Floyd's over all destinations at once, a bucketed top-k of the
keys): the same samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..native.kernels import kernels
from ..runtime.sharded import ShardedGraph
from .draws import NEIGHBOUR_KEY, REPLACEMENT_DRAW, uniform
from .spec import ALL, SamplingError, check_prob


@dataclass(frozen=True, eq=False)
class InEdges:
    rowptr: torch.Tensor      # [num_local + 1]: in-edges of local row i are rowptr[i] .. rowptr[i+1]-1
    src: torch.Tensor         # [E] source node, new global id (its owner j: the edge is in
                              #     shard.blocks[j])
    src_row: torch.Tensor     # [E] its source row in blocks[j]
    edge: torch.Tensor        # [E] its index in blocks[j]'s input order (edata, orig_edge_ids)
    orig_edge: torch.Tensor   # [E] its original edge id
    weight: torch.Tensor | None  # [E] float64 sampling weight (None: uniform)

    @staticmethod
    def of(shard: ShardedGraph, prob: str | None = None) -> "InEdges":
        lo = shard.local_range[0]
        parts = []
        for j, b in enumerate(shard.blocks):
            rows = b.src.cpu()
            src = (rows + lo if j == shard.rank
                   else shard.needed_rows[j].cpu()[rows] + int(shard.node_offsets[j]))
            perm = b.perm.cpu()
            w = None
            if prob is not None:
                check_prob(prob, shard.edata[j])
                w = edge_weights(shard.edata[j][prob], prob).index_select(0, perm)
            parts.append((b.dst.cpu(), src, rows, perm,
                          shard.orig_edge_ids[j].cpu().index_select(0, perm), w))
        dst, src, src_row, edge, orig = (torch.cat([p[i] for p in parts]) for i in range(5))
        weight = torch.cat([p[5] for p in parts]) if prob is not None else None
        order = torch.argsort(orig, stable=True)
        order = order[torch.argsort(dst[order], stable=True)]
        counts = torch.bincount(dst, minlength=shard.num_local)
        rowptr = torch.zeros(shard.num_local + 1, dtype=torch.int64)
        rowptr[1:] = torch.cumsum(counts, 0)
        pick = lambda t: t.index_select(0, order)  # noqa: E731
        return InEdges(rowptr, pick(src), pick(src_row), pick(edge), pick(orig),
                       None if weight is None else pick(weight))

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())


def edge_weights(t: torch.Tensor, name: str) -> torch.Tensor:
    """Edge data ``name`` as sampling weights: float64 on the CPU, one per edge, >= 0."""
    if t.dim() != 1 or not (t.dtype.is_floating_point or t.dtype in (torch.int32, torch.int64)):
        raise SamplingError(f"edge data {name!r} cannot be sampling probabilities: it must be "
                            f"one number per edge, got {t.dtype} {list(t.shape)}")
    w = t.detach().cpu().to(torch.float64)
    if w.numel() and not (torch.isfinite(w).all() and (w >= 0).all()):
        raise SamplingError(f"edge data {name!r} has negative or non-finite values: sampling "
                            f"probabilities are weights >= 0")
    return w


def sample(table: InEdges, rows: torch.Tensor, orig_ids: torch.Tensor, fanout: int,
           replace: bool, key: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled in-edges of local ``rows`` (whose original ids are ``orig_ids``):
    (table indices, position in ``rows`` of each edge's destination), grouped by
    destination in ``rows`` order, each group in edge order (draw order with replacement).
    ``key``: (seed, epoch, layer)."""
    if fanout != ALL and not replace:
        native = kernels()
        if native is not None:
            return native.sample(table.rowptr, rows, orig_ids, fanout, key, NEIGHBOUR_KEY,
                                 table.weight)
    starts = table.rowptr[rows]
    deg = table.rowptr[rows + 1] - starts
    if fanout == ALL or not replace:
        return _without_replacement(table, starts, deg, orig_ids, fanout, key)
    seed, epoch, layer = key
    w = table.weight
    # with replacement: fanout draws per destination that has an edge of positive weight
    if w is None:
        total = deg.to(torch.float64)
    else:
        cand, pos, first = _all_in_edges(starts, deg)
        if not cand.numel():
            return cand, pos
        total = _group_sums(w[cand], pos, rows.numel())
    live = (total > 0).nonzero().squeeze(1)
    dpos = live.repeat_interleave(fanout)
    draw = torch.arange(fanout).repeat(live.numel())
    u = uniform(seed, epoch, layer, orig_ids[dpos], REPLACEMENT_DRAW, draw)
    if w is None:
        pick = torch.minimum((u * deg[dpos]).floor().to(torch.int64), deg[dpos] - 1)
        return starts[dpos] + pick, dpos
    return cand[_inverse_cdf(w[cand], pos, first, deg, dpos, u)], dpos


def _inverse_cdf(w: torch.Tensor, pos: torch.Tensor, first: torch.Tensor, deg: torch.Tensor,
                 dpos: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """For each draw (its destination ``dpos``, its uniform ``u``), the index into ``w`` of
    the first of its destination's edges (``first``, ``deg``: each group of ``w``) whose
    prefix sum of weights exceeds ``u`` times their sum. The prefix sums are each
    destination's own (a segmented scan, not one running sum over the batch, in which a
    small destination's weights would be lost to the others' rounding), so its draws
    depend on its weights alone and never pick an edge of weight 0."""
    n = w.numel()
    index = torch.arange(n)
    cum = w.clone()
    step, widest = 1, int(deg.max())
    while step < widest:  # Hillis-Steele: cum[i] += cum[i - step] within i's destination
        back = (index - step).clamp_min(0)
        cum = cum + torch.where(index - step >= first[pos], cum[back], torch.zeros_like(cum))
        step *= 2
    positive = w > 0
    last = torch.full((deg.numel(),), -1, dtype=torch.int64).scatter_reduce(
        0, pos[positive], index[positive], "amax")
    lo, hi = first[dpos], first[dpos] + deg[dpos]
    target = u * cum[(hi - 1).clamp_min(0)]
    while bool((lo < hi).any()):  # the first index whose prefix sum exceeds the target
        mid, open_ = (lo + hi) // 2, lo < hi
        right = cum[mid.clamp(max=n - 1)] <= target
        lo, hi = (torch.where(open_ & right, mid + 1, lo),
                  torch.where(open_ & ~right, mid, hi))
    return torch.minimum(lo, last[dpos])  # u * sum rounding to the sum: the last positive edge


def _all_in_edges(starts: torch.Tensor, deg: torch.Tensor):
    """Every in-edge of the destinations (``starts``/``deg`` into the table): (table
    indices, each one's destination position, each destination's first index in them)."""
    pos = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    first = torch.cumsum(deg, 0) - deg
    cand = starts[pos] + (torch.arange(pos.numel()) - first[pos])
    return cand, pos, first


def _without_replacement(table: InEdges, starts: torch.Tensor, deg: torch.Tensor,
                         orig_ids: torch.Tensor, fanout: int, key) -> tuple[torch.Tensor, torch.Tensor]:
    """Each destination's sample without replacement (every in-edge with ``ALL``).

    A destination with at most ``fanout`` in-edges keeps all of them (those of positive
    weight), with no draw. Without weights the others draw by Floyd's algorithm, all
    at once (``_floyd``). With weights they are grouped by in-degree into buckets of
    widths up to twice their smallest, and each bucket picks its edges with one ``topk``
    over a [destinations, width] table of keys (padding at -inf): work and memory in
    proportion to the candidates, with no sort over all of them."""
    w = table.weight
    small = (deg <= fanout) if fanout != ALL else torch.ones_like(deg, dtype=torch.bool)
    idx = small.nonzero().squeeze(1)
    cand, pos, _ = _all_in_edges(starts[idx], deg[idx])
    pos = idx[pos]
    if w is not None and fanout != ALL:
        keep = w[cand] > 0
        cand, pos = cand[keep], pos[keep]
    cands, poss = [cand], [pos]
    big = (~small).nonzero().squeeze(1)
    if big.numel() and w is None:
        ranks = _floyd(deg[big], orig_ids[big], fanout, key)
        cands.append((starts[big][:, None] + ranks).reshape(-1))
        poss.append(big.repeat_interleave(fanout))
    elif big.numel():
        seed, epoch, layer = key
        bucket = torch.floor(torch.log2(deg[big].to(torch.float64))).to(torch.int64)
        for b in torch.unique(bucket).tolist():
            rows = big[bucket == b]
            d = deg[rows]
            width = int(d.max())
            rank = torch.arange(width)
            valid = rank[None, :] < d[:, None]
            at = starts[rows][:, None] + rank[None, :]
            flat = at[valid]
            u = uniform(seed, epoch, layer, orig_ids[rows][:, None].expand(-1, width)[valid],
                        NEIGHBOUR_KEY, rank[None, :].expand(rows.numel(), -1)[valid])
            score = u if w is None else torch.log(u) / w[flat]  # -inf where w == 0
            keys = torch.full((rows.numel(), width), -math.inf, dtype=torch.float64)
            keys[valid] = score
            top, pick = torch.topk(keys, fanout, dim=1, sorted=False)
            pick = torch.where(torch.isfinite(top), pick, width)   # width: none
            pick = torch.sort(pick, dim=1).values
            got = pick < width
            cands.append(at.gather(1, pick.clamp_max(width - 1))[got])
            poss.append(rows[:, None].expand(-1, fanout)[got])
    cand, pos = torch.cat(cands), torch.cat(poss)
    order = torch.argsort(pos * (int(deg.max()) + 1 if deg.numel() else 1)
                          + (cand - starts[pos])) if cand.numel() else cand
    return cand[order], pos[order]


def _floyd(deg: torch.Tensor, orig_ids: torch.Tensor, fanout: int, key) -> torch.Tensor:
    """[n, fanout] the ranks Floyd's algorithm draws of each destination's ``deg`` (all
    > fanout) in-edges, sorted: draw i of every destination at once."""
    n = deg.numel()
    ranks = torch.empty(n, fanout, dtype=torch.int64)
    for i in range(fanout):
        top = deg - fanout + i                                    # J
        u = uniform(*key, orig_ids, NEIGHBOUR_KEY, top)
        t = torch.minimum((u * (top + 1).to(torch.float64)).to(torch.int64), top)
        if i:
            t = torch.where((ranks[:, :i] == t[:, None]).any(1), top, t)
        ranks[:, i] = t
    return torch.sort(ranks, dim=1).values


def _group_sums(values: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=values.dtype).index_add_(0, group, values)
