"""Small graphs cut into in-memory shards, and workers that sample them over gloo."""
from __future__ import annotations

import datetime
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from sarc.graph import Graph
from sarc.partition import cut_parts, random_partition, relabel
from sarc.runtime.sharded import build_shard

FEATS = 5


@dataclass
class TinyGraph:
    num_nodes: int
    src: torch.Tensor          # original ids
    dst: torch.Tensor
    ndata: dict
    edata: dict

    def full(self) -> Graph:
        return Graph.from_edges(self.src, self.dst, self.num_nodes)


def tiny_graph(n: int = 30, e: int = 160, seed: int = 3, isolated: int = 3) -> TinyGraph:
    """A random directed multigraph (self loops and parallel edges included); the last
    ``isolated`` nodes have no edges."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - isolated, (e,), generator=gen)
    dst = torch.randint(0, n - isolated, (e,), generator=gen)
    ndata = {"feat": torch.randn(n, FEATS, generator=gen),
             "label": torch.randint(0, 3, (n,), generator=gen),
             "train_mask": torch.rand(n, generator=gen) < 0.6,
             "uid": (torch.arange(n) << 57) + 1}  # integers a float64 cannot hold
    edata = {"w": torch.rand(e, generator=gen) * (torch.rand(e, generator=gen) < 0.8),
             "etype": torch.randint(0, 2, (e,), generator=gen)}
    return TinyGraph(n, src, dst, ndata, edata)


def shards(g: TinyGraph, parts: int, seed: int = 0):
    """(the shards of a random partition into ``parts``, its relabeling)."""
    assign = random_partition(g.src, g.dst, g.num_nodes, parts, seed=seed)
    rl = relabel(assign, parts)
    out = [build_shard(p, rl.offsets, r)
           for r, p in enumerate(cut_parts(g.src, g.dst, rl, g.ndata, g.edata))]
    return out, rl


def run_workers(fn, parts: int, tmp: Path, *args, timeout_s: float = 90.0) -> list:
    """Fork ``parts`` gloo workers running ``fn(rank, group, *args)``; returns each one's
    result (saved with torch.save by the worker) by rank."""
    from distributed.harness import spawn
    tmp.mkdir(parents=True, exist_ok=True)
    codes, reports = spawn(_worker, parts, (fn, parts, str(tmp), args), timeout_s=timeout_s)
    errors = [r for r in reports if r and r != "ok"]
    assert not errors and codes == [0] * parts, (codes, "\n".join(map(str, errors)))
    return [torch.load(tmp / f"r{r}.pt", weights_only=False) for r in range(parts)]


def _worker(rank, port, queue, fn, parts, out, args):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=parts, timeout=datetime.timedelta(seconds=60))
    try:
        torch.save(fn(rank, None, *args), Path(out) / f"r{rank}.pt")
        dist.barrier()
        queue.put((rank, "ok"))
    except BaseException:
        queue.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()
