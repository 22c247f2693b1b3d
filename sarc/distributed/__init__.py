"""Distributed full-batch training: sarc layers on graph shards over torch.distributed.

    dg = DistGraph(shard, group)             # collective: one per worker of the group
    out = model(dg, x_local)                 # each sarc layer runs its distributed schedule
    loss = global_loss(...) ; loss.backward()
    allreduce_gradients(model, group)        # parameter gradients summed over workers

Modules, in pipeline order (the cut of a layer at the exchange is ``sarc.ir.split``):
``merge`` (partial aggregates -> aggregates; the block ops computing them are the
backends', ``sarc.backends.registry.BLOCK_OPS``), ``exchange`` (rows in rounds, byte counters), ``graph``
(``DistGraph``), ``schedule`` (the runtime generated schedules call; the
generated code itself comes from ``sarc.backends.dist_backend``),
``batchnorm``, ``store`` (tensors sharded by global id: pull / push) and
``embedding`` (sharded learnable embeddings, sparse optimizers), ``prepare`` (a worker's
shard as the trainer's hyperparameters ask: self loops, features, masks), ``train`` (a
worker's run of the training loop of ``sarc.training.loop``: its shard, the all-reduce,
the report),
``worker`` (its torchrun entry point), ``launch`` (``sarc train --workers P``),
``agent`` (torchrun as ``sarc train`` runs it), ``supervise`` (nothing of a run
outlives it) and ``stacks`` (where a run is stuck).
"""
__all__ = ["DistGraph", "DistError", "SyncBatchNorm", "ByteCounter", "allreduce_gradients",
           "global_cross_entropy", "ShardedTensor", "Embedding", "SparseAdagrad", "SparseAdam"]

_FROM = {"SyncBatchNorm": ".batchnorm", "Embedding": ".embedding", "SparseAdagrad": ".embedding",
         "SparseAdam": ".embedding", "ByteCounter": ".exchange", "DistError": ".graph",
         "DistGraph": ".graph", "ShardedTensor": ".store", "global_cross_entropy": "..training.loop",
         "allreduce_gradients": ".train"}
"""The module of each name above, imported at its first use: torchrun's agent
(``agent``, ``supervise``, ``stacks``) imports this package without the compiler."""


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(_FROM[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_FROM})
