"""The K-hop closure of a step's seeds across shards, sampled or whole (MFG).

frontier_K = seeds; frontier_{k-1} = frontier_k plus the sources of the (sampled)
in-edges of frontier_k. A worker knows the in-edges of its own nodes only, so per
layer, from the top down, each worker:

1. samples the in-edges of its nodes of frontier_k (``neighbours.sample``);
2. sends the sources it does not own to their owners (one exchange of ids): the
   owner adds them to its frontier_{k-1};
3. orders its frontier_{k-1} nodes (its frontier_k nodes first, then the others by
   id) and answers each request with the rows of the requested ids (a second
   exchange, of the same sizes): the requester's ``needed_rows``, the owner's
   ``send_rows``;
4. builds the layer's ``LayerBlock`` (one ``all_gather`` of the row counts numbers
   the rows across workers).

Nothing but ids crosses the network; no worker holds more of the graph than its shard.
Seeds a worker does not own go to their owner first. Every worker takes part in every
exchange, with no seeds too.
"""
from __future__ import annotations

import threading

import torch

from ..graph import Graph
from ..runtime.sharded import ShardedGraph
from .blocks import LayerBlock, MiniBatch
from .comm import Comm
from .neighbours import InEdges, sample
from .spec import SamplingError, SamplingSpec

_EMPTY = torch.zeros(0, dtype=torch.int64)


class NeighbourSampler:
    """Minibatches of one worker's shard: ``sampler.sample(seeds, epoch)`` (collective)."""

    def __init__(self, shard: ShardedGraph, spec: SamplingSpec, comm: Comm | None = None):
        if not isinstance(spec, SamplingSpec):
            raise SamplingError(f"expected a SamplingSpec, got {type(spec).__name__}")
        spec.check_edge_data(list(shard.edata[0]) if shard.edata else [])
        self.comm = comm if comm is not None else Comm()
        if (self.comm.rank, self.comm.size) != (shard.rank, shard.num_parts):
            raise SamplingError(f"worker {self.comm.rank} of {self.comm.size} holds the shard of "
                                f"part {shard.rank} of {shard.num_parts}")
        self.shard, self.spec = shard, spec
        try:  # the weights are this worker's edges': every worker learns if one is bad
            table, problem = InEdges.of(shard, spec.prob), None
        except SamplingError as e:
            table, problem = None, str(e)
        self.comm.agree(problem)
        self.table = table
        self.offsets = shard.node_offsets.cpu()
        self.orig_ids = shard.orig_node_ids.cpu()
        self.in_degree, self.out_degree = shard.in_degree.cpu(), shard.out_degree.cpu()
        # scratch of one sample() at a time: a local node's row in the layer's frontier,
        # -1 between calls (a layer resets the rows it set: no pass over every node)
        self._row_of = torch.full((shard.num_local,), -1, dtype=torch.int64)
        self._lock = threading.Lock()

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self.offsets, ids, right=True) - 1

    def route_seeds(self, seeds) -> torch.Tensor:
        """This worker's share of the step's seeds: those it owns, from every worker
        (sorted, each once)."""
        seeds, problem = _seed_ids(seeds, self.shard.num_nodes)
        self.comm.agree(problem)
        owner = self.owner(seeds)
        out = [torch.unique(seeds[owner == j]) for j in range(self.comm.size)]
        return torch.unique(torch.cat(self.comm.exchange(out)))

    def sample(self, seeds, epoch: int = 0) -> MiniBatch:
        """The step's blocks, input layer first (collective: every worker calls it, each with
        its seeds, possibly none)."""
        with self._lock:
            try:
                return self._sample(seeds, epoch)
            except BaseException:
                self._row_of.fill_(-1)
                raise

    def _sample(self, seeds, epoch: int) -> MiniBatch:
        sh, spec, comm, row_of = self.shard, self.spec, self.comm, self._row_of
        r, p = comm.rank, comm.size
        lo = sh.local_range[0]
        dst = self.route_seeds(seeds)
        blocks = []
        for k in range(spec.num_layers, 0, -1):
            rows = dst - lo
            cand, pos = sample(self.table, rows, self.orig_ids.index_select(0, rows),
                               spec.fanouts[k - 1], spec.replace, (spec.seed, epoch, k))
            src = self.table.src.index_select(0, cand)
            edges = _by_owner(self.owner(src), p) if p > 1 else [None]
            part = [src if e is None else src.index_select(0, e) for e in edges]
            requests = [_EMPTY if j == r else torch.unique(part[j]) for j in range(p)]
            asked = comm.exchange(requests)
            # this worker's frontier_{k-1}: its frontier_k nodes first, then the others by id
            row_of[rows] = torch.arange(rows.numel())
            more = torch.unique(torch.cat([part[r], *[a for j, a in enumerate(asked) if j != r]]))
            more = more[row_of.index_select(0, more - lo) < 0]
            row_of[more - lo] = rows.numel() + torch.arange(more.numel())
            nodes = torch.cat([dst, more])
            answers = comm.exchange([_EMPTY if j == r else row_of[asked[j] - lo] for j in range(p)],
                                    sizes=[int(t.numel()) for t in requests])
            counts = [c[0] for c in comm.all_gather([int(nodes.numel())])]
            blocks.append(self._layer_block(k, nodes, rows.numel(), cand, pos, edges, part,
                                            requests, answers, asked, counts))
            row_of[nodes - lo] = -1
            dst = nodes
        return MiniBatch(tuple(reversed(blocks)))

    def _layer_block(self, k, nodes, num_dst, cand, pos, edges, part, requests, answers, asked,
                     counts) -> LayerBlock:
        """Layer k's block: ``edges[j]`` (None: all) are the sampled edges ``cand`` (into
        destinations ``pos``) from worker j's nodes ``part[j]``."""
        sh, t, row_of = self.shard, self.table, self._row_of
        r, p = sh.rank, sh.num_parts
        lo = sh.local_range[0]
        local = nodes - lo
        in_deg = self.in_degree.index_select(0, local)
        out_deg = self.out_degree.index_select(0, local)
        dst_in = in_deg[:num_dst]
        offsets = torch.zeros(p + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0)
        blocks, needed, send, edata, edge_ids, remote = [], [], [], [], [], []
        for j, (e, src) in enumerate(zip(edges, part)):
            ce, dst = (cand, pos) if e is None else (cand[e], pos[e])
            if j == r:
                rows = torch.arange(nodes.numel())
                block = Graph.from_edges(row_of.index_select(0, src - lo), dst,
                                         num_src=nodes.numel(), num_dst=num_dst,
                                         in_degree=dst_in, out_degree=out_deg)
                send_j = _EMPTY
                remote.append(_EMPTY)
            else:
                order = torch.argsort(answers[j])
                rows = answers[j][order]                       # needed_rows[j], sorted
                index = torch.empty_like(order)
                index[order] = torch.arange(order.numel())     # requested id i -> block src row
                src_rows = index[torch.searchsorted(requests[j], src)]
                deg = torch.zeros(rows.numel(), dtype=torch.float32)
                deg[src_rows] = sh.blocks[j].out_degree.cpu()[t.src_row[ce]]
                block = Graph.from_edges(src_rows, dst, num_src=rows.numel(), num_dst=num_dst,
                                         dst_in_src=False, in_degree=dst_in, out_degree=deg)
                send_j = torch.sort(row_of[asked[j] - lo]).values
                remote.append(requests[j][order])
            blocks.append(block)
            needed.append(rows)
            send.append(send_j)
            at = t.edge.index_select(0, ce) if sh.edata[j] else None
            edata.append({name: v.index_select(0, at.to(v.device))
                          for name, v in sh.edata[j].items()})
            edge_ids.append(t.orig_edge.index_select(0, ce))
        shard = ShardedGraph(r, p, offsets, tuple(blocks), tuple(needed), tuple(send),
                             in_deg, out_deg,
                             {name: v.index_select(0, local.to(v.device)) for name, v in sh.ndata.items()},
                             tuple(edata), self.orig_ids.index_select(0, local), tuple(edge_ids))
        sampled = torch.bincount(pos, minlength=num_dst).to(torch.float32)
        return LayerBlock(k, shard, num_dst, nodes, tuple(remote), sampled)


def _by_owner(owner: torch.Tensor, p: int) -> list[torch.Tensor]:
    """The positions of the entries of each owner 0..p-1, in order."""
    return [(owner == j).nonzero().squeeze(1) for j in range(p)]


def _seed_ids(seeds, n: int) -> tuple[torch.Tensor, str | None]:
    """(the seeds as a 1-d int64 tensor, what is wrong with them or None)."""
    t = torch.as_tensor(seeds)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        return _EMPTY, f"seed nodes must be integer node ids, got {t.dtype}"
    t = t.to(torch.int64).cpu().reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        return _EMPTY, f"seed node {bad} is not a node of the graph (ids 0..{n - 1})"
    return t, None
