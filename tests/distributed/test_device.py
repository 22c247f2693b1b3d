"""A worker's shard and data stay on the device they were moved to.

There is no GPU here, so two stand-ins check what a CUDA run needs:

- ``torch.set_default_device("meta")`` while a CPU shard is prepared: any tensor that
  ``with_self_loops`` or ``prepare_worker`` creates without naming a device lands on
  ``meta``, and the result (or a ``torch.cat`` with the shard's own tensors) shows it;
  on a GPU such a tensor would be a CPU tensor beside CUDA ones;
- ``.to("meta")``: every tensor of a moved shard and its data is on the new device.

``node_offsets`` is host metadata by design (``ShardedGraph.to`` keeps it on the CPU).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sarc.distributed.exchange import Exchanger
from sarc.distributed.prepare import WorkerData, prepare_worker, with_self_loops
from sarc.graph import Graph
from sarc.partition import partition_graph
from sarc.runtime.sharded import ShardedGraph

from .harness import spawn

HOST_METADATA = {"node_offsets"}


def tensors(obj, path: str = "shard"):
    """(path, tensor) of every tensor held by ``obj`` (dataclasses, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (Graph, ShardedGraph, WorkerData)):
        for f in dataclasses.fields(obj):
            if f.name not in HOST_METADATA:
                yield from tensors(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{path}[{k!r}]")


def off_device(obj, device: str) -> list[str]:
    return [f"{p} on {t.device}" for p, t in tensors(obj) if t.device.type != device]


@contextlib.contextmanager
def default_device(device: str):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


def _shard(tmp_path, parts: int = 2, rank: int = 0) -> ShardedGraph:
    """A shard of a random graph with self loops, features, labels and a float edge weight."""
    gen = torch.Generator().manual_seed(0)
    n, e = 40, 200
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    src[:5] = dst[:5]  # some self loops, which with_self_loops replaces
    node_data = {"feat": torch.rand(n, 3, generator=gen),
                 "label": torch.randint(0, 3, (n,), generator=gen),
                 **{k: torch.rand(n, generator=gen) < 0.5
                    for k in ("train_mask", "val_mask", "test_mask")}}
    pset = partition_graph(src, dst, n, parts, tmp_path / "parts", method="random",
                           node_data=node_data, edge_data={"w": torch.rand(e, generator=gen)})
    return ShardedGraph.from_partitions(pset, rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_self_loops_create_every_tensor_on_the_shards_device(tmp_path, rank):
    """No tensor of the shard with its self loops comes from the default device (a rank of
    two with an exchanger of one: the peers' out-degrees stay, every other path runs)."""
    shard = _shard(tmp_path, rank=rank)
    with default_device("meta"):
        looped = with_self_loops(shard, Exchanger(0, 1), reads=("w",))
    assert not off_device(looped, "cpu"), off_device(looped, "cpu")
    n = shard.num_local
    assert looped.local_block.num_edges == int((shard.local_block.src != shard.local_block.dst)
                                               .sum()) + n
    assert torch.equal(looped.orig_edge_ids[rank][-n:], torch.full((n,), -1))
    moved = looped.to("meta")
    assert not off_device(moved, "meta"), off_device(moved, "meta")


def _prepare_on_meta(rank, port, queue, shard_dir, feat):
    """In a forked process (its gloo group is left by exiting, never destroyed: see
    ``harness.spawn``): prepare a one-worker shard under the meta default device."""
    shard = _shard(Path(shard_dir), parts=1)
    if not feat:
        shard = dataclasses.replace(shard, ndata={k: v for k, v in shard.ndata.items()
                                                  if k != "feat"})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=1, timeout=datetime.timedelta(seconds=30))
    with default_device("meta"):
        data = prepare_worker(shard, {"norm_features": True}, None)
    moved = data.to("meta")
    queue.put((rank, {"off_cpu": off_device(data, "cpu"), "off_meta": off_device(moved, "meta"),
                      "x": tuple(data.x.shape), "num_local": shard.num_local,
                      "same": (moved.counts, moved.num_classes) == (data.counts,
                                                                    data.num_classes)}))


@pytest.mark.parametrize("feat", [True, False], ids=["features", "featureless"])
def test_a_workers_data_is_made_on_the_shards_device_and_moves_whole(tmp_path, feat):
    codes, (got,) = spawn(_prepare_on_meta, 1, (str(tmp_path), feat))
    assert codes == [0], codes
    assert not got["off_cpu"], got["off_cpu"]
    assert got["x"] == (got["num_local"], 3 if feat else 0)
    assert not got["off_meta"], got["off_meta"]
    assert got["same"]


def test_the_embeddings_step_flag_is_reduced_on_the_comm_device(monkeypatch):
    """``sarc.distributed.Embedding``'s optimizers agree on "any rows to update" with an
    all-reduce: on NCCL its tensor must be on the GPU (``Comm.device``), not the CPU."""
    from types import SimpleNamespace

    from sarc.distributed import embedding

    class Reduced(Exception):
        pass

    def all_reduce(t, group=None):
        raise Reduced(t.device)
    monkeypatch.setattr(embedding.dist, "all_reduce", all_reduce)
    store = SimpleNamespace(size=2, comm=SimpleNamespace(group=None, device=torch.device("meta")))
    with pytest.raises(Reduced) as seen:
        embedding._any_worker(store, True)
    assert seen.value.args[0] == torch.device("meta")
