"""Link prediction on P workers (``sarc train --task link --workers P``).

The launcher splits the dataset's edges (``sarc.training.link.split_edges``),
partitions the message-passing graph (the training pairs, both directions) and
stores the split beside the parts as ``link_edges.pt`` (original node ids; every
worker loads all of it). A partition set holding that file is a link-prediction
set: ``sarc.distributed.train.train_worker`` hands it to ``train_link_worker``.

A worker runs the model's forward on its shard (``DistGraph``), owns the pairs whose
second endpoint ``v`` it owns, and fetches the endpoint embeddings it scores from
their owners with ``pull_rows``: a ``ShardedTensor.pull`` whose backward routes the
rows' gradients back to their owners (``ShardedTensor.route``), so that the
gradient of the embedding rows, and through them of the parameters, is exact.
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..backward_once import once_differentiable
from ..loader import ModelSpec
from ..sampling.comm import Comm
from ..sampling.negative import negative_sampler
from ..training.link import (EVAL_SPLITS, LinkSplit, LinkSteps, check_link_hparams, link_line,
                             link_result, link_selection, check_link_model, split_edges)
from ..training.loop import Batch, fit
from .store import ShardedTensor, owners

LINK_FILE = "link_edges.pt"
"""The edge split of a link-prediction partition set, in its directory."""


def has_link_split(partition) -> bool:
    return (Path(partition) / LINK_FILE).is_file()


def partition_link_dataset(args, data, out: Path, node_data: dict) -> str:
    """Split ``data``'s edges (seed ``args.seed``), partition the message graph into
    ``out`` and store the split there; returns the directory."""
    from ..partition import partition_graph
    from ..training.inputs import TrainError
    from .launch import DEFAULT_METHOD

    if data.etype is not None:
        raise TrainError(f"link prediction on the relational graph {data.name} is not "
                         f"supported (its edge types would not follow the split)")
    split = split_edges(data.edge_src, data.edge_dst, data.num_nodes, seed=args.seed)
    src, dst = split.message_edges()
    method = args.method or DEFAULT_METHOD
    pset = partition_graph(src, dst, data.num_nodes, args.workers, out, method=method,
                           node_data=node_data, seed=args.seed, dataset=data.recorded)
    split.save(Path(out) / LINK_FILE)
    print(f"split {data.name}'s edges into {split.train.shape[1]} / {split.val.shape[1]} / "
          f"{split.test.shape[1]} train / val / test pairs; partitioned the message graph "
          f"({src.numel()} edges) into {args.workers} parts ({method}): edge cut "
          f"{pset.stats.edge_cut}", flush=True)
    return str(out)


class _PullRows(torch.autograd.Function):
    """Rows of global ids from their owners; backward: their gradients to the owners."""

    @staticmethod
    def forward(ctx, local, ids, offsets, rank, comm):
        store = ShardedTensor(local.detach(), offsets, rank, comm, "embeddings")
        ctx.store, ctx.ids = store, ids
        return store.pull(ids, phase="embeddings")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        store = ctx.store
        rows, values = store.route(ctx.ids, grad.contiguous(), "add", phase="embedding grads")
        out = grad.new_zeros(store.local.shape)
        out.index_add_(0, rows.to(out.device), values.to(out.dtype))
        return out, None, None, None, None


def pull_rows(local: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, rank: int,
              comm: Comm) -> torch.Tensor:
    """The rows of global ``ids`` of the sharded ``[N, d]`` tensor whose rows
    ``offsets[rank] ..`` are ``local``, with the gradient flowing back to their owners'
    rows. Collective, forward and backward: every worker calls it, and backpropagates
    through it, in the same order."""
    return _PullRows.apply(local, ids, offsets, rank, comm)


def row_map(shard, group) -> torch.Tensor:
    """Each original node id's global row (new id), from every worker's original ids."""
    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, shard.orig_node_ids.cpu(), group=group)
    row_of = torch.empty(shard.num_nodes, dtype=torch.int64)
    for j, orig in enumerate(parts):
        lo = int(shard.node_offsets[j])
        row_of[orig] = torch.arange(lo, lo + orig.numel())
    return row_of


def link_source(shard, dg, data, split: LinkSplit, hp: dict, seed: int, comm: Comm,
                group) -> LinkSteps:
    """The worker's step source: its pairs (those whose ``v`` it owns), negatives from the
    whole message graph's degrees, rows pulled from their owners."""
    row_of = row_map(shard, group)
    offsets = shard.node_offsets.cpu()
    rank = shard.rank
    mine = {}
    for s in ("train", *EVAL_SPLITS):
        v = split.pairs(s)[1]
        mine[s] = torch.nonzero(owners(offsets, row_of[v]) == rank).squeeze(1)
    from .train import global_ids
    batch = Batch(dg, data.x, {}, data.label, data.masks, train_total=0,
                  node_ids=global_ids(shard))
    return LinkSteps(batch, split, row_of=row_of, mine=mine,
                     rows=lambda h, ids: pull_rows(h, ids, offsets, rank, comm),
                     sampler=negative_sampler(hp["negatives"], split.num_nodes, split.degree()),
                     hparams=hp, seed=seed)


def train_link_worker(spec: ModelSpec, cfg, group=None,
                      log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train ``spec``'s link model on this worker's shard of ``cfg.partition`` (collective)."""
    from ..checkpoint import seed_all
    from ..train import hyperparameters
    from ..training.device import placed
    from ..training.inputs import optimizer
    from .exchange import ByteCounter, Exchanger
    from .graph import DistGraph, comm_device
    from .prepare import prepare_worker, with_self_loops
    from .train import (AllReduce, _build, broadcast_parameters, count_parameters,
                        dataset_name, embedding_bytes, load_shard, peak_memory,
                        recorded_dataset, resident_bytes, sharded_table)

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    say = (log if rank == 0 and log else (lambda s: None))
    hp = hyperparameters(spec, cfg.hparams, epochs=cfg.epochs)
    device = comm_device(group) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    fixed_rss = resident_bytes()  # the runtime: imports, the process group
    shard = load_shard(cfg.partition, group).to(device)
    split = LinkSplit.load(Path(cfg.partition) / LINK_FILE)
    check_link_hparams(hp, shard.num_nodes)
    counter = ByteCounter()
    if hp["self_loops"]:
        shard = with_self_loops(shard, Exchanger(rank, size, group, counter, timeout))
    dg = DistGraph(shard, group, exec_mode=cfg.exec_mode, mem_budget=cfg.mem_budget,
                   baseline=cfg.baseline, timeout=timeout, counter=counter)
    data = prepare_worker(shard, hp, group)
    torch.manual_seed(cfg.seed)
    model = placed(_build(spec, data, hp, shard.num_nodes,
                          sharded_table(shard, group, timeout, cfg.seed), name=dataset_name(cfg),
                          group=group, say=say),
                   device, cfg.backend)
    check_link_model(model)
    broadcast_parameters(model, group)
    dg.share_memory(model)
    seed_all(cfg.seed * 1000003 + rank)
    opt = optimizer(model, hp)
    source = link_source(shard, dg, data, split, hp, cfg.seed, Comm(group, timeout=timeout), group)
    say(f"sarc train: {spec.name}, link prediction on {shard.num_nodes} nodes "
        f"({split.train.shape[1]} / {split.val.shape[1]} / {split.test.shape[1]} train / val / "
        f"test edges), {size} workers, {hp['negatives']} negatives, seed {cfg.seed}, "
        f"{count_parameters(model)} parameters")
    selection = link_selection(hp["patience"])
    last = int(hp["epochs"])
    out = fit(model, opt, source, selection, epochs=last, reduction=AllReduce(group),
              log=log, log_every=cfg.log_every, eval_every=cfg.eval_every, line=lambda *a: link_line(*a, of=last))
    workers: list = [None] * size
    dist.all_gather_object(workers, {"rank": rank, **peak_memory(fixed_rss),
                                     **embedding_bytes(model, opt)}, group=group)
    result = link_result(selection, out, model=spec.name, dataset=recorded_dataset(cfg),
                         seed=cfg.seed,
                         negatives=hp["negatives"], workers=size, per_worker=workers)
    if rank == 0 and cfg.json_path:
        from ..training.loop import write_result
        write_result(cfg.json_path, result)
    return {**result, "module": model}
