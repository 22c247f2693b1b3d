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


def _input_order(b: Graph) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's (src, dst) in the order its edges were given (its edge data's order)."""
    order = torch.argsort(b.perm)
    return b.src.index_select(0, order), b.dst.index_select(0, order)


def _swap(ex: Exchanger, out: dict[int, torch.Tensor], sizes: dict[int, int], tag: int
          ) -> dict[int, torch.Tensor]:
    """Send ``out[j]`` to every peer j and receive ``sizes[j]`` float32 values from each
    (``Exchanger.swap``)."""
    device = next(iter(out.values())).device
    sends, recvs = ex.swap(out, {j: (n,) for j, n in sizes.items()}, torch.float32, device,
                           tag, "setup")
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
    r, p, n = shard.rank, shard.num_parts, shard.num_local
    nd = shard.local_block.num_dst
    dev = shard.in_degree.device
    masks = torch.split(keep.to(device=dev, dtype=torch.bool), [b.num_edges for b in shard.blocks])
    edges, counts = [], {}
    out_degree = torch.zeros(n, dtype=torch.float32, device=dev)
    in_degree = torch.zeros(n, dtype=torch.float32, device=dev)
    for j, (b, m) in enumerate(zip(shard.blocks, masks)):
        src, dst = _input_order(b)
        src, dst = src[m], dst[m]
        edges.append((src, dst))
        in_degree[:nd] += torch.bincount(dst, minlength=nd).to(torch.float32)
        used = torch.bincount(src, minlength=b.num_src).to(torch.float32)
        if j == r:
            out_degree += used
        else:
            counts[j] = used  # per row of needed_rows[j]: the kept edges it starts here
    counts[r] = torch.zeros(0, dtype=torch.float32, device=dev)
    # the readers' counts of this worker's rows: which rows they still read, and the
    # rows' out-degrees over the whole sub-graph
    sizes = {j: 0 if j == r else int(shard.send_rows[j].numel()) for j in range(p)}
    readers = _swap(ex, counts, sizes, COUNTS_TAG)
    send_rows = list(shard.send_rows)
    for j, c in readers.items():
        out_degree.index_add_(0, shard.send_rows[j], c)
        send_rows[j] = shard.send_rows[j][c > 0]
    if degrees is not None:   # the whole graph's, not these edges'
        in_degree, out_degree = (d.to(device=dev, dtype=torch.float32) for d in degrees)
    needed, kept_rows = list(shard.needed_rows), {}
    for j in range(p):
        if j != r:
            kept_rows[j] = torch.nonzero(counts[j] > 0).squeeze(1)  # in the old block's rows
            needed[j] = shard.needed_rows[j].index_select(0, kept_rows[j])
    degrees = _swap(ex, {j: out_degree.index_select(0, send_rows[j]) if j != r else counts[r]
                         for j in range(p)},
                    {j: 0 if j == r else int(needed[j].numel()) for j in range(p)}, DEGREES_TAG)
    blocks = []
    for j, (src, dst) in enumerate(edges):
        if j == r:
            blocks.append(Graph.from_edges(src, dst, num_src=n, num_dst=nd,
                                           in_degree=in_degree[:nd], out_degree=out_degree))
            continue
        old = shard.blocks[j].num_src
        renumber = torch.full((old,), -1, dtype=torch.int64, device=dev)
        renumber[kept_rows[j]] = torch.arange(kept_rows[j].numel(), device=dev)
        rows = int(needed[j].numel())
        blocks.append(Graph.from_edges(
            renumber[src], dst, num_src=rows, num_dst=nd, dst_in_src=False,
            in_degree=in_degree[:nd],
            out_degree=degrees.get(j, torch.zeros(0, dtype=torch.float32, device=dev))))
    edata = tuple({k: v[m] for k, v in e.items()} for e, m in zip(shard.edata, masks))
    edge_ids = tuple(ids[m] for ids, m in zip(shard.orig_edge_ids, masks))
    return dataclasses.replace(shard, blocks=tuple(blocks), needed_rows=tuple(needed),
                               send_rows=tuple(send_rows), in_degree=in_degree,
                               out_degree=out_degree, edata=edata, orig_edge_ids=edge_ids)
