"""A shard's in-edges as one table, and the neighbour sample of a set of its nodes.

``InEdges`` lists every edge into the shard's nodes (from any source shard), grouped
by destination and, within a destination, in original-edge-id order: an order that
does not depend on the partitioning, so the rank of an edge among its destination's
in-edges is the same whatever the number of workers.

``sample`` picks, for each destination v of layer k, ``fanout`` of its in-edges:

- without replacement: the ``fanout`` edges of largest key ``log(u) / w`` (uniform
  ``u`` per edge, ``w`` its weight, 1 without probabilities): a uniform subset, or
  with weights the weighted draw without replacement of Efraimidis and Spirakis (as
  successive draws proportional to ``w`` among the edges not yet drawn); edges of
  weight 0 are never drawn, so a node may get fewer than ``fanout``;
- with replacement: ``fanout`` independent draws, each an edge with probability
  ``w / sum(w)`` (inverse CDF over the edges in their order);
- ``fanout == -1``: every in-edge (weights ignored).

Each ``u`` is ``draws.uniform(seed, epoch, k, orig id of v, tag, edge rank or draw
index)``: v's sample depends on nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.sharded import ShardedGraph
from .draws import NEIGHBOUR_KEY, REPLACEMENT_DRAW, uniform
from .spec import ALL, SamplingError


@dataclass(frozen=True, eq=False)
class InEdges:
    rowptr: torch.Tensor      # [num_local + 1]: in-edges of local row i are rowptr[i] .. rowptr[i+1]-1
    src: torch.Tensor         # [E] source node, new global id
    block: torch.Tensor       # [E] the source shard j (the edge is in shard.blocks[j])
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
                if prob not in shard.edata[j]:
                    have = ", ".join(sorted(shard.edata[j])) or "none"
                    raise SamplingError(f"no edge data {prob!r} for the sampling probabilities "
                                        f"(the graph has: {have})")
                w = _weights(shard.edata[j][prob], prob).index_select(0, perm)
            parts.append((b.dst.cpu(), src, torch.full_like(rows, j), rows, perm,
                          shard.orig_edge_ids[j].cpu().index_select(0, perm), w))
        dst, src, block, src_row, edge, orig = (torch.cat([p[i] for p in parts]) for i in range(6))
        weight = torch.cat([p[6] for p in parts]) if prob is not None else None
        order = torch.argsort(orig, stable=True)
        order = order[torch.argsort(dst[order], stable=True)]
        counts = torch.bincount(dst, minlength=shard.num_local)
        rowptr = torch.zeros(shard.num_local + 1, dtype=torch.int64)
        rowptr[1:] = torch.cumsum(counts, 0)
        pick = lambda t: t.index_select(0, order)  # noqa: E731
        return InEdges(rowptr, pick(src), pick(block), pick(src_row), pick(edge), pick(orig),
                       None if weight is None else pick(weight))

    @property
    def num_edges(self) -> int:
        return int(self.src.numel())


def _weights(t: torch.Tensor, name: str) -> torch.Tensor:
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
    starts, ends = table.rowptr[rows], table.rowptr[rows + 1]
    deg = ends - starts
    pos = torch.repeat_interleave(torch.arange(rows.numel()), deg)
    first = torch.cumsum(deg, 0) - deg                      # each group's first candidate
    rank = torch.arange(int(deg.sum())) - first[pos]         # rank among its dst's in-edges
    cand = starts[pos] + rank
    if fanout == ALL or not cand.numel():
        return cand, pos
    seed, epoch, layer = key
    w = table.weight
    if not replace:
        u = uniform(seed, epoch, layer, orig_ids[pos], NEIGHBOUR_KEY, rank)
        score = torch.log(u)
        if w is not None:
            score = score / w[cand]                          # -inf where w == 0
        by_score = torch.argsort(-score, stable=True)
        order = by_score[torch.argsort(pos[by_score], stable=True)]
        nth = torch.arange(order.numel()) - first[pos[order]]
        keep = order[(nth < fanout) & torch.isfinite(score[order])]
        keep = keep[torch.argsort(pos[keep] * (int(deg.max()) + 1) + rank[keep])] if keep.numel() else keep
        return cand[keep], pos[keep]
    # with replacement: fanout draws per destination that has an edge of positive weight
    total = deg.to(torch.float64) if w is None else _group_sums(w[cand], pos, rows.numel())
    live = (total > 0).nonzero().squeeze(1)
    dpos = live.repeat_interleave(fanout)
    draw = torch.arange(fanout).repeat(live.numel())
    u = uniform(seed, epoch, layer, orig_ids[dpos], REPLACEMENT_DRAW, draw)
    if w is None:
        pick = torch.minimum((u * deg[dpos]).floor().to(torch.int64), deg[dpos] - 1)
        return starts[dpos] + pick, dpos
    cum = torch.cumsum(w[cand], 0)
    base = torch.where(first > 0, cum[(first - 1).clamp_min(0)], torch.zeros_like(total))
    at = torch.searchsorted(cum, base[dpos] + u * total[dpos], right=True)
    at = torch.minimum(torch.maximum(at, first[dpos]), first[dpos] + deg[dpos] - 1)
    return cand[at], dpos


def _group_sums(values: torch.Tensor, group: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=values.dtype).index_add_(0, group, values)
