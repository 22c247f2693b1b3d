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


def summed_grads(model, group) -> dict:
    """Each parameter's gradient, summed over the workers of ``group`` (``False``: one
    process, as it is)."""
    grads = {}
    for name, prm in model.named_parameters():
        t = prm.grad.clone()
        if group is not False:
            dist.all_reduce(t, group=group)
        grads[name] = t
    return grads


def step_record(model, batch, x, shard, group) -> dict:
    """One training step of ``model`` on ``batch`` (``x`` its input rows, a leaf): the loss
    over all workers, the parameter gradients summed over them, this worker's input
    gradient and its rows' original ids."""
    from sarc.training.loop import forward, global_cross_entropy
    loss = global_cross_entropy(forward(model, batch), batch.label, batch.masks["train"],
                                batch.train_total)
    loss.backward()
    total = loss.detach().reshape(1)
    if group is not False:
        dist.all_reduce(total, group=group)
    return {"loss": float(total), "grads": summed_grads(model, group),
            "x_grad": x.grad.clone(), "x_ids": shard.orig_node_ids.clone()}


def rel_err(got, want) -> float:
    scale = float(want.norm())
    return float((got - want).norm()) / (scale if scale > 0 else 1.0)


def assert_same_step(got: dict, want: dict, x_grad: torch.Tensor, rel: float) -> None:
    """``got`` (a ``step_record``, with ``x_grad`` the input gradient over every worker) is
    ``want``'s step within ``rel``: the loss, every parameter gradient, the input's."""
    assert abs(got["loss"] - want["loss"]) <= rel * abs(want["loss"])
    assert set(got["grads"]) == set(want["grads"])
    for name, g in want["grads"].items():
        assert rel_err(got["grads"][name], g) <= rel, name
    assert float(want["x_grad"].norm()) > 0
    assert rel_err(x_grad, want["x_grad"]) <= rel


def x_grad_of(records: list, n: int) -> torch.Tensor:
    """The input gradient of ``n`` nodes from every worker's ``step_record``."""
    g = torch.zeros(n, records[0]["x_grad"].shape[1])
    for r in records:
        g[r["x_ids"]] += r["x_grad"]
    return g

