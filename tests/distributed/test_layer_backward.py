"""What a layer's backward gives on a DistGraph, beyond the exactness matrix's steps.

On a graph without edges a distributed layer gives every input it reads a gradient as the
layer on one process does: an edge feature's is an empty tensor, not None. A module that
makes the edge feature (an embedding of edge types) then has a zero gradient on P workers
as on one process, and an optimizer with momentum moves it alike. A second backward pass
through one call (retain_graph=True) is refused, naming why."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn

import sarc

from shared_layers import TwoOutputs

from .harness import spawn

P = 2
N = 12


class EdgeWeighted(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"w": 2})
        self.lin = nn.Linear(3, 2)

    def message(self, src, dst, edge):
        return self.lin(src.h) * edge.w

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + dst.h[:, :2]


def _grads(layer, g, x, w) -> dict:
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    layer.zero_grad(set_to_none=True)
    layer(g, x, w=w).sum().backward()
    return {"x": x.grad, "w": w.grad, **{k: p.grad for k, p in layer.named_parameters()}}


def _on_worker(rank: int, port: int, parts: str, layer: sarc.Layer, state: dict,
               world_size: int = P):
    """Worker ``rank`` of a gloo group: ``layer`` with ``state``, its shard of ``parts``
    and the shard's DistGraph."""
    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=60))
    layer.load_state_dict(state)
    shard = ShardedGraph.from_partitions(load_partitions(parts, verify=False), rank)
    return layer, shard, DistGraph(shard)


def _worker(rank, port, q, parts, state):
    layer, shard, dg = _on_worker(rank, port, parts, EdgeWeighted(), state)
    grads = _grads(layer, dg, shard.ndata["feat"], torch.zeros(dg.num_edges, 2))
    q.put((rank, {"ids": shard.orig_node_ids.tolist(),
                  "grads": {k: None if g is None else g.tolist() for k, g in grads.items()},
                  "shapes": {k: None if g is None else list(g.shape) for k, g in grads.items()}}))
    dist.barrier()


def test_inputs_of_a_layer_on_a_graph_without_edges_have_gradients_on_workers(tmp_path):
    from sarc.partition import partition_graph
    none = torch.zeros(0, dtype=torch.long)
    torch.manual_seed(0)
    x, layer = torch.randn(N, 3), EdgeWeighted()
    parts = partition_graph(none, none, N, P, tmp_path / "parts", method="random",
                            node_data={"feat": x}).path
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    codes, reports = spawn(_worker, P, (str(parts), state), timeout_s=120)
    assert codes == [0] * P, reports
    want = _grads(layer, sarc.Graph.from_edges(none, none, N), x, torch.zeros(0, 2))
    for r in reports:
        assert [k for k, g in r["grads"].items() if g is None] == [], r["shapes"]
        assert r["shapes"]["w"] == [0, 2]
        torch.testing.assert_close(torch.tensor(r["grads"]["x"]), want["x"][r["ids"]])
        for k in ("lin.weight", "lin.bias"):
            torch.testing.assert_close(torch.tensor(r["grads"][k]), want[k])


def _twice(rank, port, q, parts, state):
    layer, shard, dg = _on_worker(rank, port, parts, EdgeWeighted(), state, world_size=1)
    w = torch.rand(dg.num_edges, 2, requires_grad=True)
    out = layer(dg, shard.ndata["feat"], w=w)
    out.sum().backward(retain_graph=True)
    try:
        out.sum().backward()
        q.put((rank, "a second backward ran"))
    except Exception as e:  # noqa: BLE001 (reported to the test)
        q.put((rank, f"{type(e).__name__}: {e}"))


def test_a_second_backward_through_one_distributed_call_is_refused(tmp_path):
    from sarc.partition import partition_graph
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
    parts = partition_graph(src, dst, 4, 1, tmp_path / "parts", method="random",
                            node_data={"feat": torch.randn(4, 3)}).path
    state = EdgeWeighted().state_dict()
    codes, reports = spawn(_twice, 1, (str(parts), state), timeout_s=120)
    assert codes == [0], reports
    assert reports[0].startswith("DistError: a layer on a DistGraph runs one backward pass "
                                 "per call"), reports


def _unread(rank, port, q, parts, state):
    from sarc.distributed.train import allreduce_gradients
    layer, shard, dg = _on_worker(rank, port, parts, TwoOutputs(), state)
    x = shard.ndata["feat"].clone().requires_grad_(True)
    layer(dg, x)["o2"].sum().backward()
    allreduce_gradients(layer)
    o2 = layer(dg, x.detach())["o2"]
    q.put((rank, {"ids": shard.orig_node_ids.tolist(), "x": x.grad.tolist(),
                  "params": [k for k, p in layer.named_parameters() if p.grad is not None],
                  "o2_requires_grad": o2.requires_grad}))
    dist.barrier()


def test_an_output_the_loss_does_not_read_gives_no_gradient_on_workers_as_on_one_process(
        tmp_path):
    """A parameter only an unread output reaches gets None on P workers as on one process
    (zeros there would be all-reduced into a gradient weight decay and momentum act on),
    and an output no leaf needing a gradient reaches has no grad_fn."""
    from sarc.partition import partition_graph
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, N, (50,), generator=gen), torch.randint(0, N, (50,), generator=gen)
    torch.manual_seed(0)
    x, layer = torch.randn(N, 3), TwoOutputs()
    parts = partition_graph(src, dst, N, P, tmp_path / "parts", method="random",
                            node_data={"feat": x}).path
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    codes, reports = spawn(_unread, P, (str(parts), state), timeout_s=120)
    assert codes == [0] * P, reports
    x = x.clone().requires_grad_(True)
    layer(sarc.Graph.from_edges(src, dst, N), x)["o2"].sum().backward()
    assert layer.lin.weight.grad is None
    for r in reports:
        assert r["params"] == [] and not r["o2_requires_grad"], r
        torch.testing.assert_close(torch.tensor(r["x"]), x.grad[r["ids"]])
