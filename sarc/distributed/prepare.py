"""A worker's training data: its shard prepared as the trainer's hyperparameters ask.

``sarc.train.prepare`` on one shard, with the same rules (``sarc.training.inputs``):

- ``self_loops``: every edge u -> u dropped, one self loop per node added
  (``sarc.datasets.add_self_loops`` on the shard's local block, where a node's loop
  lives). The whole-graph out-degree of the *remote* rows a worker reads changes
  too, so the owners send their new out-degrees of the boundary rows once (an
  exchange in the ``setup`` phase);
- ``norm_features``: each node's features divided by their sum (local rows);
- the labeled train / val / test masks, and the global counts a loss and the
  accuracies are normalized by (an all-reduce).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.distributed as dist

from ..datasets import add_self_loops_with_data
from ..graph import Graph
from ..runtime.sharded import ShardedGraph
from ..training.inputs import labeled_masks, node_features
from .exchange import Exchanger, RowFetch
from .graph import DistError, comm_device


def with_self_loops(shard: ShardedGraph, ex: Exchanger, reads=()) -> ShardedGraph:
    """``shard`` of the graph with its self loops replaced by one per node (collective).

    ``reads``: the edge data the model reads (``sarc.dsl.edge_inputs_for``); the shard keeps
    only those, and the loops get ``sarc.datasets.SELF_LOOP_FILL`` in a float feature (an
    integer one is an error naming it)."""
    r = shard.rank
    n = shard.num_local
    local = shard.local_block
    src, dst = local.input_edges()   # in the block's input order
    keep = src != dst
    loops = torch.bincount(dst[~keep], minlength=n).to(torch.float32)
    new_src, new_dst, local_data = add_self_loops_with_data(
        src, dst, n, {k: shard.edata[r][k] for k in reads})
    in_degree = shard.in_degree - loops + 1
    out_degree = shard.out_degree - loops + 1
    # the owners' new out-degrees of the rows each worker reads from them
    fetch = RowFetch(ex, shard, out_degree.unsqueeze(1), phase="setup",
                     send_to=set(range(shard.num_parts)) - {r},
                     recv_from=set(range(shard.num_parts)) - {r}, keep=set(), kept={})
    halo = {p.peer: rows for p, rows in fetch if p.peer != r}
    blocks = []
    for j, b in enumerate(shard.blocks):
        if j == r:
            blocks.append(Graph.from_edges(new_src, new_dst, num_src=n, num_dst=n,
                                           in_degree=in_degree, out_degree=out_degree))
        else:
            out_deg = halo[j].squeeze(1) if j in halo else b.out_degree
            blocks.append(dataclasses.replace(b, in_degree=in_degree, out_degree=out_deg))
    edge_ids = list(shard.orig_edge_ids)
    edge_ids[r] = torch.cat([edge_ids[r][keep], edge_ids[r].new_full((n,), -1)])
    edata = tuple(local_data if j == r else {k: e[k] for k in reads}
                  for j, e in enumerate(shard.edata))
    return dataclasses.replace(shard, blocks=tuple(blocks), in_degree=in_degree,
                               out_degree=out_degree, orig_edge_ids=tuple(edge_ids), edata=edata)


@dataclass(frozen=True, eq=False)
class WorkerData:
    """What one worker feeds its model: ``model(dg, x, **edge_inputs)`` on its rows."""

    x: torch.Tensor
    label: torch.Tensor
    masks: dict[str, torch.Tensor]        # "train" / "val" / "test", labeled local nodes
    counts: dict[str, int]                # the same, over all workers
    num_features: int
    num_classes: int
    num_etypes: int
    num_ntypes: int = 0       # node types (0: the partition has no ntype)

    def to(self, device) -> "WorkerData":
        """The rows, labels and masks on ``device`` (the counts and sizes are host data)."""
        return dataclasses.replace(self, x=self.x.to(device), label=self.label.to(device),
                                   masks={k: m.to(device) for k, m in self.masks.items()})


def prepare_worker(shard: ShardedGraph, hparams: dict, group=None,
                   sizes: Mapping[str, int] | None = None) -> WorkerData:
    """Features, labels and masks of the shard's nodes, with the global counts (collective).
    ``sizes``: the classes and types the partitioned dataset declares (``PartitionSet.sizes``),
    which the model is built for as on one process; where the set records none, the largest
    label and type ids over all workers + 1."""
    nd = shard.ndata
    for k in ("label", "train_mask", "val_mask", "test_mask"):
        if k not in nd:
            raise DistError(f"the partition has no node data {k!r}; partition a node-"
                            f"classification dataset (sarc partition --dataset ...)")
    none = torch.zeros(shard.num_local, 0, device=shard.in_degree.device)  # featureless
    x = node_features(nd.get("feat", none), hparams)
    label = nd["label"].to(torch.int64)
    masks = labeled_masks(label, nd["train_mask"], nd["val_mask"], nd["test_mask"])
    dev = comm_device(group)
    etype = [e["etype"] for e in shard.edata if "etype" in e]
    local = torch.tensor([int(masks["train"].sum()), int(masks["val"].sum()),
                          int(masks["test"].sum())], dtype=torch.int64, device=dev)
    dist.all_reduce(local, group=group)
    ntype = nd.get("ntype")
    maxes = torch.tensor([int(label.max()) if label.numel() else -1,
                          max((int(t.max()) for t in etype if t.numel()), default=-1),
                          int(ntype.max()) if ntype is not None and ntype.numel() else -1],
                         dtype=torch.int64, device=dev)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group)
    counts = dict(zip(("train", "val", "test"), local.cpu().tolist()))
    declared = sizes or {}
    seen = [int(m) + 1 for m in maxes.cpu().tolist()]
    for key, used, what in (("num_classes", seen[0], "labels"), ("num_etypes", seen[1],
                            "edge types"), ("num_ntypes", seen[2], "node types")):
        if key in declared and used > declared[key]:   # every worker sees the same maxima
            raise DistError(f"the partition set records {key}={declared[key]}, but its "
                            f"{what} go up to {used - 1}: its metadata is not its data's; "
                            f"partition the dataset again")
    return WorkerData(x, label, masks, counts, int(x.shape[1]),
                      max(declared.get("num_classes", 0), seen[0]),
                      max(declared.get("num_etypes", 0), seen[1]) if etype else 0,
                      max(declared.get("num_ntypes", 0), seen[2]) if ntype is not None else 0)
