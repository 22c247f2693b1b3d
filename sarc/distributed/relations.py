"""A shard's sub-graph of some of its edges (one relation of a heterogeneous graph).

``edge_subshard(shard, keep, ex)`` is the shard of the graph made of the edges where
``keep`` is True (``keep`` in the DistGraph's edge order, block after block), over the
same nodes. A layer run on it (``DistGraph.edge_subgraph``) exchanges only the rows
*those* edges read: each block's source rows shrink to the sources of its kept edges,
and each owner learns which of its rows its readers still need. Degrees are the
sub-graph's, over the whole graph (as DGL computes a relation's in- and out-degrees):
the in-degree of a local node counts the kept edges of all its blocks; the out-degree
of a row counts kept edges on every worker that reads it, so the readers send their
counts to the owner, which sends the totals back to every reader (two exchanges in the
``setup`` phase, collective).

On a mini-batch step's block (``sarc.sampling.blocks``: its local rows are sources, the
first ``num_dst`` of them its destinations) the degrees a layer reads are the whole
graph's, not the block's: the caller gives each local row's in- and out-degree in the
whole graph's relation (``degrees``), and each owner sends its rows' to their readers.
"""
from __future__ import annotations

import dataclasses

import torch

from ..graph import Graph
from ..runtime.sharded import ShardedGraph
from .exchange import Exchanger

COUNTS_TAG, DEGREES_TAG = 100, 104
"""Multiples of 4: they go on the rows' process group (``exchange.Exchanger``)."""


def swap(ex: Exchanger, out: dict[int, torch.Tensor], shapes: dict[int, int | tuple], tag: int,
         dtype: torch.dtype = torch.float32) -> dict[int, torch.Tensor]:
    """Set-up traffic: send ``out[j]`` to every peer j and receive a tensor of ``dtype`` and
    shape ``shapes[j]`` (an int: that many values) from each (``Exchanger.swap``)."""
    device = next(iter(out.values())).device if out else None
    sends, recvs = ex.swap(out, {j: (n,) if isinstance(n, int) else n for j, n in shapes.items()},
                           dtype, device, tag, "setup")
    got = {j: p.wait() for j, p in recvs.items()}
    for p in sends:
        p.wait()
    return got


def edge_subshard(shard: ShardedGraph, keep: torch.Tensor, ex: Exchanger,
                  degrees: tuple[torch.Tensor, torch.Tensor] | None = None) -> ShardedGraph:
    """The shard of the sub-graph of ``shard``'s graph whose edges are those ``keep`` marks
    (bool, DistGraph edge order; every worker calls it with its own edges: collective).
    ``degrees``: ``(in_degree, out_degree)`` of the local rows in the sub-graph of the whole
    graph (a mini-batch block's; default: counted on these edges, a full shard's)."""
    return edge_subshards(shard, [keep], ex, None if degrees is None else [degrees])[0]


class _SubEdges:
    """One sub-graph's edges of ``shard`` (``edge_subshards``), as this worker finds them
    before the exchanges."""

    def __init__(self, shard: ShardedGraph, keep: torch.Tensor):
        r, n = shard.rank, shard.num_local
        nd = shard.local_block.num_dst
        dev = shard.in_degree.device
        self.masks = torch.split(keep.to(device=dev, dtype=torch.bool),
                                 [b.num_edges for b in shard.blocks])
        self.edges, self.counts = [], {}
        self.out_degree = torch.zeros(n, dtype=torch.float32, device=dev)
        self.in_degree = torch.zeros(n, dtype=torch.float32, device=dev)
        for j, (b, m) in enumerate(zip(shard.blocks, self.masks)):
            src, dst = b.input_edges()
            src, dst = src[m], dst[m]
            self.edges.append((src, dst))
            self.in_degree[:nd] += torch.bincount(dst, minlength=nd).to(torch.float32)
            used = torch.bincount(src, minlength=b.num_src).to(torch.float32)
            if j == r:
                self.out_degree += used
            else:
                self.counts[j] = used  # per row of needed_rows[j]: the kept edges it starts here
        self.send_rows = list(shard.send_rows)
        self.needed, self.kept_rows = list(shard.needed_rows), {}
        for j in self.counts:
            self.kept_rows[j] = torch.nonzero(self.counts[j] > 0).squeeze(1)  # old block rows
            self.needed[j] = shard.needed_rows[j].index_select(0, self.kept_rows[j])

    def readers_counted(self, shard: ShardedGraph, j: int, c: torch.Tensor) -> None:
        """Peer j's counts ``c`` of the kept edges each row it reads of this worker starts."""
        self.out_degree.index_add_(0, shard.send_rows[j], c.to(self.out_degree.dtype))
        self.send_rows[j] = shard.send_rows[j][c > 0]

    def shard(self, shard: ShardedGraph, degrees: dict[int, torch.Tensor]) -> ShardedGraph:
        """The sub-graph's shard, given the out-degrees of the rows it reads of each peer."""
        r, n = shard.rank, shard.num_local
        nd = shard.local_block.num_dst
        dev = shard.in_degree.device
        blocks = []
        for j, (src, dst) in enumerate(self.edges):
            if j == r:
                blocks.append(Graph.from_edges(src, dst, num_src=n, num_dst=nd,
                                               in_degree=self.in_degree[:nd],
                                               out_degree=self.out_degree))
                continue
            kept = self.kept_rows[j]
            renumber = torch.full((shard.blocks[j].num_src,), -1, dtype=torch.int64, device=dev)
            renumber[kept] = torch.arange(kept.numel(), device=dev)
            blocks.append(Graph.from_edges(
                renumber[src], dst, num_src=int(self.needed[j].numel()), num_dst=nd,
                dst_in_src=False, in_degree=self.in_degree[:nd],
                out_degree=degrees.get(j, torch.zeros(0, dtype=torch.float32, device=dev))))
        edata = tuple({k: v[m] for k, v in e.items()} for e, m in zip(shard.edata, self.masks))
        edge_ids = tuple(ids[m] for ids, m in zip(shard.orig_edge_ids, self.masks))
        return dataclasses.replace(shard, blocks=tuple(blocks), needed_rows=tuple(self.needed),
                                   send_rows=tuple(self.send_rows), in_degree=self.in_degree,
                                   out_degree=self.out_degree, edata=edata,
                                   orig_edge_ids=edge_ids)


def _as(counts: torch.Tensor, kind: torch.dtype) -> torch.Tensor:
    """``counts`` as sent: float32 counts, or uint8 whether each is above 0."""
    return counts if kind == torch.float32 else (counts > 0).to(kind)


def edge_subshards(shard: ShardedGraph, keeps: list[torch.Tensor], ex: Exchanger,
                   degrees: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                   ) -> list[ShardedGraph]:
    """``edge_subshard`` of each of ``keeps`` (with ``degrees[i]``), in two exchanges for
    them all (collective)."""
    r, p = shard.rank, shard.num_parts
    dev = shard.in_degree.device
    subs = [_SubEdges(shard, keep) for keep in keeps]
    empty = torch.zeros(0, dtype=torch.float32, device=dev)
    # the readers' counts of this worker's rows: which rows they still read, and the
    # rows' out-degrees over the whole sub-graph (given: only whether they still read them,
    # a byte a row)
    kind = torch.float32 if degrees is None else torch.uint8
    counts = {j: _as(torch.cat([s.counts[j] for s in subs]) if j != r and subs else empty, kind)
              for j in range(p)}
    sizes = {j: 0 if j == r else len(subs) * int(shard.send_rows[j].numel()) for j in range(p)}
    for j, c in swap(ex, counts, sizes, COUNTS_TAG, kind).items():
        for s, part in zip(subs, torch.split(c, int(shard.send_rows[j].numel()))):
            s.readers_counted(shard, j, part)
    if degrees is not None:   # the whole graph's, not these edges'
        for s, (ins, outs) in zip(subs, degrees):
            s.in_degree, s.out_degree = (d.to(device=dev, dtype=torch.float32)
                                         for d in (ins, outs))
    sent = {j: torch.cat([s.out_degree.index_select(0, s.send_rows[j]) for s in subs])
            if j != r and subs else empty for j in range(p)}
    got = swap(ex, sent, {j: 0 if j == r else sum(int(s.needed[j].numel()) for s in subs)
                           for j in range(p)}, DEGREES_TAG)
    split = {j: torch.split(v, [int(s.needed[j].numel()) for s in subs]) for j, v in got.items()}
    return [s.shard(shard, {j: parts[i] for j, parts in split.items()})
            for i, s in enumerate(subs)]
