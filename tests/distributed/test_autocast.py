"""``torch.autocast`` around a distributed step: the backward of each layer call runs under
the autocast its forward ran under, so what it recomputes is what the forward computed.

It recomputed in float32 what the forward had computed in bfloat16: the first of two
stacked max layers got no gradient (no recomputed edge attained the forward's maximum),
and R-GCN's backward failed on a bfloat16 tensor meeting a float32 one. P = 2 workers
(gloo, ``harness.spawn``) equal one process under the same autocast, to bfloat16's
rounding, and the float32 step to it too.
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.nn.functional as F

import sarc
from sarc.partition import partition_graph

from difftest import BACKENDS

from .harness import spawn
from .models import MODELS

N, FEATS, CLASSES = 30, 5, 3
TOL = 5e-2
"""bfloat16's rounding, relative to each tensor's largest entry."""


def _graph():
    """110 random edges among the first 27 nodes (3 without any)."""
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, N - 3, (110,), generator=gen), torch.randint(0, N - 3, (110,), generator=gen)
    x = torch.randn(N, FEATS, generator=torch.Generator().manual_seed(1))
    return src, dst, x, torch.randint(0, 3, (110,), generator=gen)


def _step(model, g, x, etype, backend):
    for m in model.modules():
        if isinstance(m, sarc.Layer):
            m.set_backend(backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(g, x, **({"etype": etype} if etype is not None else {}))
    (out.float() ** 2).sum().backward()
    return out


def _worker(rank, port, queue, parts, name, backend, state):
    import torch.distributed as dist

    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    shard = ShardedGraph.from_partitions(load_partitions(parts, verify=False), rank)
    model = MODELS[name](FEATS, CLASSES)
    model.load_state_dict(state)
    dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60))
    x = shard.ndata["feat"].clone().requires_grad_()
    etype = dg.edge_data("etype") if name.startswith("rgcn") else None
    out = _step(model, dg, x, etype, backend)
    from sarc.distributed.train import allreduce_gradients
    allreduce_gradients(model)
    # a file, not the queue: the queue's tensors live in this process, which exits
    report = f"{parts}.r{rank}.pt"
    torch.save({"ids": shard.orig_node_ids, "out": out.detach().float(), "x_grad": x.grad,
                "grads": {k: p.grad for k, p in model.named_parameters()}}, report)
    queue.put((rank, report))
    dist.barrier()


def _near(got, want, what):
    scale = float(want.abs().max())
    assert scale > 0, what
    err = float((got.float() - want.float()).abs().max())
    assert err <= TOL * scale, f"{what}: max |2 workers - 1 process| = {err:.3g}, scale {scale:.3g}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["max", "rgcn_bases"])
def test_two_workers_under_autocast_equal_one_process(tmp_path, name, backend):
    src, dst, x, etype = _graph()
    torch.manual_seed(0)
    model = MODELS[name](FEATS, CLASSES)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    xr = x.clone().requires_grad_()
    relational = name.startswith("rgcn")
    want = _step(model, sarc.Graph.from_edges(src, dst, N), xr, etype if relational else None,
                 backend)
    partition_graph(src, dst, N, 2, tmp_path / "parts", method="metis",
                    node_data={"feat": x}, edge_data={"etype": etype} if relational else {})
    codes, reports = spawn(_worker, 2, (str(tmp_path / "parts"), name, backend, state),
                           timeout_s=120)
    assert codes == [0, 0], codes
    reports = [torch.load(r, weights_only=False) for r in reports]
    out, x_grad = torch.zeros(want.shape), torch.zeros(N, FEATS)
    for r in reports:
        out[r["ids"]], x_grad[r["ids"]] = r["out"], r["x_grad"]
    _near(out, want.detach(), "output")
    _near(x_grad, xr.grad, "input gradient")
    for k, p in model.named_parameters():
        for r in reports:
            _near(r["grads"][k], p.grad, f"gradient of {k}")
