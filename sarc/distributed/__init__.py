"""Distributed full-batch training: sarc layers on graph shards over torch.distributed.

    dg = DistGraph(shard, group)             # collective: one per worker of the group
    out = model(dg, x_local)                 # each sarc layer runs its distributed schedule
    loss = global_loss(...) ; loss.backward()
    allreduce_gradients(model, group)        # parameter gradients summed over workers

Modules, in pipeline order: ``split`` (a layer's IR cut at the exchange),
``merge`` (partial aggregates -> aggregates) and ``kernels`` (their block
kernels), ``exchange`` (rows in rounds, byte counters), ``graph``
(``DistGraph``), ``schedule`` (the runtime generated schedules call; the
generated code itself comes from ``sarc.backends.dist_backend``),
``batchnorm``, ``prepare`` (a worker's shard as the trainer's hyperparameters
ask: self loops, features, masks), ``train`` (a worker's run of the training loop of
``sarc.training.loop``: its shard, the all-reduce, the report),
``worker`` (its torchrun entry point), ``launch`` (``sarc train --workers P``),
``agent`` (torchrun as ``sarc train`` runs it) and ``supervise`` (nothing of a run
outlives it).
"""
from .batchnorm import SyncBatchNorm
from .exchange import ByteCounter
from .graph import DistError, DistGraph
from ..training.loop import global_cross_entropy
from .train import allreduce_gradients

__all__ = ["DistGraph", "DistError", "SyncBatchNorm", "ByteCounter", "allreduce_gradients",
           "global_cross_entropy"]
