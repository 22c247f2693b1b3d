"""A heterogeneous model's training step on P workers equals the one-process step.

``sarc.HeteroConv`` on a worker's ``DistGraph`` either fetches each input's boundary rows
once and runs every relation's layer on the worker's halo graph (without a memory
budget: ``DistGraph.fetches_once``), or runs each relation's layer on the relation's own
``DistGraph`` (``DistGraph.edge_subgraph``, in ``sar`` execution): its shard's edges of
that relation, the rows they read, the relation's whole-graph degrees. On a random typed
graph (two node types of different feature widths, four relations, an edge weight,
sum / mean / max layers), P = 2 and 3, both ways, with and without node types: the loss,
the whole output, the input gradient and every parameter gradient equal one process's
(relative error <= 1e-5), and each worker's bytes sent in the step equal the planner's
prediction (the relations' programs, or each conv's one fetch and its relations' layers'
runs on the fetched rows, which send nothing).
"""
from __future__ import annotations

import datetime
import io

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import sarc
import hetero_layers
from hetero_layers import MaxLayer, MeanLayer, NormSumLayer, TypedNet
from sarc.distributed.halo import FetchRun

from .harness import spawn

N, E, RELS, CLASSES, HIDDEN = 60, 400, 4, 3, 6
WIDTHS = {0: 4, 1: 7}
REL_TOL = 1e-5


def Net(typed: bool = True):
    """Relation 3 goes into node type 1 (``typed_graph``): said, for a graph where it has no
    edges."""
    return TypedNet((MeanLayer, NormSumLayer, MaxLayer, MeanLayer), WIDTHS, HIDDEN, CLASSES,
                    typed=typed, dst_types={3: 1})


def typed_graph(empty: bool = False):
    """``empty``: relation 3's edges left out (a relation without edges)."""
    data = hetero_layers.typed_graph(N, E, RELS, WIDTHS, CLASSES, seed=11, isolated=4,
                                     train=0.7)
    if empty:
        keep = data["etype"] != 3
        data.update({k: data[k][keep] for k in ("src", "dst", "etype", "w")})
    return data


def single_process(data, state, typed=True):
    model = Net(typed)
    model.load_state_dict(state)
    g = sarc.Graph.from_edges(data["src"], data["dst"], N)
    x = data["feat"].clone().requires_grad_(True)
    logits = model(g, x, data["etype"], data["ntype"], data["w"])
    m = data["train_mask"]
    loss = F.cross_entropy(logits[m], data["label"][m], reduction="sum") / int(m.sum())
    loss.backward()
    return {"logits": logits.detach(), "x_grad": x.grad, "loss": float(loss.detach()),
            "grads": {k: p.grad for k, p in model.named_parameters()}}


def _worker(rank, port, q, size, partdir, state, total, exec_mode, typed):
    from sarc.distributed import DistGraph
    from sarc.distributed.train import allreduce_gradients
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=60))
    try:
        shard = ShardedGraph.from_partitions(load_partitions(partdir, verify=False), rank)
        dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60), exec_mode=exec_mode)
        model = Net(typed)
        model.load_state_dict(state)
        x = shard.ndata["feat"].clone().requires_grad_(True)
        logits = model(dg, x, dg.edge_data("etype"), shard.ndata["ntype"], dg.edge_data("w"))
        m = shard.ndata["train_mask"]
        loss = F.cross_entropy(logits[m], shard.ndata["label"][m], reduction="sum") / total
        loss.backward()
        sent = dg.counter.snapshot()["sent"]
        allreduce_gradients(model)
        loss_all = loss.detach().reshape(1).clone()
        dist.all_reduce(loss_all)
        buf = io.BytesIO()  # tensors leave the process as bytes (the queue would share memory)
        torch.save({"ids": shard.orig_node_ids, "logits": logits.detach(), "x_grad": x.grad,
                    "loss": float(loss_all), "planned": dg.planned_bytes_sent(),
                    "sent": sum(v for k, v in sent.items() if k != "setup"),
                    "grads": {k: p.grad for k, p in model.named_parameters()},
                    "programs": len(dg.training_programs), "kept": dg.planned_bytes_kept(),
                    "fetches_kept": sum(p.plan.bytes_kept[rank]
                                        for p in dg.training_programs.values()
                                        if isinstance(p, FetchRun))}, buf)
        q.put((rank, buf.getvalue()))
    finally:
        dist.destroy_process_group()


def rel_err(got, want):
    return float((got - want).norm()) / max(float(want.norm()), 1e-30)


@pytest.mark.parametrize("parts,method,empty,exec_mode,typed", [
    (2, "metis", False, None, True), (3, "random", False, None, True),
    (2, "random", True, None, True), (3, "random", False, None, False),
    (1, "random", False, None, True),
    (2, "metis", False, "sar", True), (3, "random", False, "sar", True),
    (2, "random", True, "sar", True), (3, "random", False, "sar", False)],
    ids=["2-metis", "3-random", "2-random-a-relation-without-edges", "3-random-untyped", "1-part",
         "2-metis-sar", "3-random-sar", "2-random-a-relation-without-edges-sar",
         "3-random-untyped-sar"])
def test_hetero_step_on_workers_equals_one_process(tmp_path, parts, method, empty, exec_mode,
                                                   typed):
    from sarc.partition import partition_graph
    data = typed_graph(empty)
    torch.manual_seed(0)
    state = Net().state_dict()
    want = single_process(data, state, typed)
    partition_graph(data["src"], data["dst"], N, parts, tmp_path / "parts", method=method,
                    node_data={k: data[k] for k in ("feat", "label", "train_mask", "ntype")},
                    edge_data={"etype": data["etype"], "w": data["w"]})
    codes, reports = spawn(_worker, parts, (parts, str(tmp_path / "parts"), state,
                                            int(data["train_mask"].sum()), exec_mode, typed),
                           timeout_s=120)
    assert codes == [0] * parts, codes
    reports = [torch.load(io.BytesIO(r), weights_only=False) for r in reports]
    logits = torch.zeros(N, CLASSES)
    x_grad = torch.zeros_like(data["feat"])
    for r in reports:
        logits[r["ids"]] = r["logits"]
        x_grad[r["ids"]] = r["x_grad"]
    assert abs(reports[0]["loss"] - want["loss"]) <= REL_TOL * abs(want["loss"])
    assert rel_err(logits, want["logits"]) <= REL_TOL
    assert rel_err(x_grad, want["x_grad"]) <= REL_TOL
    for k, g in want["grads"].items():
        assert rel_err(reports[0]["grads"][k], g) <= REL_TOL, k
    for r in reports:  # every relation's program of both HeteroConvs (on the fetched rows
        # with the halo: the convs' two fetches too)
        assert r["programs"] == 2 * RELS + (0 if exec_mode == "sar" else 2)
        assert r["sent"] == r["planned"] and (r["sent"] > 0) == (parts > 1)
        # what a step keeps: with the halo, the fetched rows and the relations' layers' shares
        assert r["kept"] > (0 if exec_mode == "sar" else r["fetches_kept"])


def _relations_found_by_a_halo(rank, port, q, partdir):
    from sarc.distributed import DistGraph
    from sarc.hetero import relation_graphs
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        shard = ShardedGraph.from_partitions(load_partitions(partdir, verify=False), rank)
        dg = DistGraph(shard, exec_mode="sar", timeout=datetime.timedelta(seconds=60))
        etype = dg.edge_data("etype")
        model = Net(typed=False)
        # as a mini-batch step's fetching block finds the whole graph's relations: no
        # sub-graphs made; then the whole graph's own call in sar needs them
        relation_graphs(dg, etype, model.conv1.relation_ids, compare=False, subgraphs=False)
        h = torch.randn(shard.num_local, HIDDEN)
        out = model.conv1(dg, h, etype=etype, w=dg.edge_data("w"))
        q.put((rank, list(out.shape)))
    finally:
        dist.destroy_process_group()


def test_relations_found_without_sub_graphs_get_them_when_a_call_needs_them(tmp_path):
    from sarc.partition import partition_graph
    data = typed_graph()
    partition_graph(data["src"], data["dst"], N, 2, tmp_path / "parts", method="random",
                    node_data={"feat": data["feat"]},
                    edge_data={"etype": data["etype"], "w": data["w"]})
    codes, reports = spawn(_relations_found_by_a_halo, 2, (str(tmp_path / "parts"),),
                           timeout_s=120)
    assert codes == [0, 0], reports
    assert all(r[1] == HIDDEN for r in reports), reports
