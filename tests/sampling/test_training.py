"""Mini-batch training steps (``sarc.training.minibatch``) on one process and P workers.

- MFG: one step with every training node as a seed equals the full-batch step (loss,
  every parameter gradient, the input features' gradient) and the single-process MFG
  step, for every model of models/ and one computing edge weights from ``g``'s degrees,
  P in {1, 2, 3, 4}, METIS and random partitions;
- sampling with fanouts above every in-degree is the MFG step;
- the loss of a few sampled steps over two epochs is the same whatever P.

Each P runs once: one group of forked gloo workers runs every case."""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn

import sarc
from sarc.graph import Graph
from sarc.partition import cut_parts, metis_partition, random_partition, relabel
from sarc.runtime.sharded import build_shard
from sarc.sampling import Comm
from sarc.training.loop import ONE_PROCESS, forward, global_cross_entropy, train_step
from sarc.training.minibatch import (MiniBatchConfig, MiniBatchSteps, ShardRows, local_blocks,
                                     whole_graph_shard)
from sarc.training.optim import EagerAdam

from .graphs import assert_same_step, run_workers, step_record, tiny_graph, x_grad_of

KINDS = ("gcn", "sage", "gat", "gin", "rgcn", "degnorm")
METHODS = ("metis", "random")
PARTS = (1, 2, 3, 4)
REL = 1e-5
CLASSES, RELS = 3, 2
MFG = MiniBatchConfig("mfg")
ABOVE_DEGREES = MiniBatchConfig("sampling", (100, 100))
SAMPLED = MiniBatchConfig("sampling", (2, 3), batch_size=4)   # 4 or 5 steps an epoch
TRAJECTORY_EPOCHS = (1, 2)


class _WeightedSum(sarc.Layer):
    """sum_u w_e W h_u + R h_v, w an edge input."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__(node={"h": d_in}, edge={"w": ()})
        self.lin, self.root = nn.Linear(d_in, d_out), nn.Linear(d_in, d_out, bias=False)

    def message(self, src, dst, edge):
        return self.lin(src.h) * edge.w.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + self.root(dst.h)


class _DegreeNormed(nn.Module):
    """Edge weights the model computes from ``g`` itself: 1 / in_degree(v) of each edge
    u -> v, indexed by ``g.input_dst`` (each edge's destination in the edges' input
    order), as R-GCN's relation_norm counts its 1 / |N_r(v)|."""

    def __init__(self, d_in: int, hidden: int, classes: int):
        super().__init__()
        self.c1, self.c2 = _WeightedSum(d_in, hidden), _WeightedSum(hidden, classes)

    def forward(self, g, x):
        w = (1.0 / g.in_degree.clamp_min(1))[g.input_dst].to(x.dtype)
        return self.c2(g, torch.relu(self.c1(g, x, w=w)), w=w)


def _model(kind: str):
    import gat
    import gcn
    import gin
    import rgcn
    import sage
    torch.manual_seed(1)  # the same weights on every worker and in the test process
    build = {"gcn": lambda: gcn.build_model(5, CLASSES, hidden=6, dropout=0.0),
             "sage": lambda: sage.build_model(5, CLASSES, hidden=6, dropout=0.0),
             "gat": lambda: gat.build_model(5, CLASSES, hidden=3, heads=2, dropout=0.0,
                                            attn_drop=0.0),
             "gin": lambda: gin.build_model(5, CLASSES, hidden=6, dropout=0.0, eps=0.1,
                                            train_eps=True),
             "rgcn": lambda: rgcn.build_model(5, CLASSES, num_etypes=RELS, hidden=6),
             "degnorm": lambda: _DegreeNormed(5, 6, CLASSES)}
    return build[kind]()


def _shards(g, parts: int, method: str):
    part = (metis_partition if method == "metis" else random_partition)(
        g.src, g.dst, g.num_nodes, parts, seed=0)
    rl = relabel(part, parts)
    return [build_shard(p, rl.offsets, r)
            for r, p in enumerate(cut_parts(g.src, g.dst, rl, g.ndata, g.edata))]


def _steps(kind, shard, config, group, rows_of, prefetch=False):
    """The step source of ``config`` on ``shard``: DistGraphs in a group, the blocks'
    Graphs on one process (``group is False``); ``prefetch``: on workers, the sampler in a
    group of its own, a step ahead (as the trainer runs it)."""
    if group is False:
        comm, graphs_of = Comm(), local_blocks
    else:
        from sarc.distributed.train import BlockGraphs, sampling_group
        comm = Comm(sampling_group(group) if prefetch else group)
        graphs_of = BlockGraphs(group, config.mode, torch.device("cpu"),
                                timeout=datetime.timedelta(seconds=60))
    x, label, train = rows_of
    x = x.clone().requires_grad_(True)
    counts = {"train": int(train.sum()) if group is False else _sum(int(train.sum()), group),
              "val": 0, "test": 0}
    src = MiniBatchSteps(shard, config, layers=2, seed=5, comm=comm,
                         rows=ShardRows(x, label, train), evaluation=None, counts=counts,
                         graphs_of=graphs_of, edge_names=("etype",) if kind == "rgcn" else (),
                         prefetch=None if group is False else prefetch)
    return src, x


def _sum(v, group):
    t = torch.tensor([v], dtype=torch.int64)
    dist.all_reduce(t, group=group)
    return int(t)


def _one_step(kind, shard, config, group, rows_of):
    """One step's loss, parameter gradients (summed over workers) and input gradient."""
    model = _model(kind)
    src, x = _steps(kind, shard, config, group, rows_of)
    (batch,) = list(src.steps(0))
    return step_record(model, batch, x, shard, group)


def _trajectory(kind, shard, group, rows_of, prefetch=False):
    """The losses of every sampled step of two epochs, training as the trainer does; on
    workers, with the layer programs compiled over those steps."""
    from sarc.distributed import schedule
    from sarc.distributed.train import AllReduce
    model = _model(kind)
    opt = EagerAdam(model.parameters(), lr=0.05)
    src, _ = _steps(kind, shard, SAMPLED, group, rows_of, prefetch)
    red = ONE_PROCESS if group is False else AllReduce(group)
    compiled, compile_layer = [], schedule.compile_layer

    def counted(layer, dg, name, need, *again):
        compiled.append(name)
        return compile_layer(layer, dg, name, need, *again)
    schedule.compile_layer = counted
    try:
        losses = [train_step(model, opt, b, red) for e in TRAJECTORY_EPOCHS for b in src.steps(e)]
    finally:
        schedule.compile_layer = compile_layer
    return losses if group is False else {"losses": losses, "compiled": compiled}


def _rows(nd):
    return nd["feat"], nd["label"], nd["train_mask"]


def _work(rank, group, g, parts):
    out = {}
    for method in METHODS:
        shard = _shards(g, parts, method)[rank]
        for kind in KINDS:
            out["mfg", method, kind] = _one_step(kind, shard, MFG, group, _rows(shard.ndata))
    shard = _shards(g, parts, "random")[rank]
    for kind in ("gcn", "gat"):
        out["above", kind] = _one_step(kind, shard, ABOVE_DEGREES, group, _rows(shard.ndata))
    for kind in ("sage", "rgcn", "degnorm"):
        out["trajectory", kind] = _trajectory(kind, shard, group, _rows(shard.ndata))
    out["prefetched", "sage"] = _trajectory("sage", shard, group, _rows(shard.ndata), True)
    return out


@pytest.fixture(scope="module")
def graph():
    return tiny_graph(n=40, e=220, seed=11, isolated=3)


@pytest.fixture(scope="module")
def one_process(graph):
    shard = whole_graph_shard(graph.src, graph.dst, graph.num_nodes, graph.edata,
                              self_loops=False)
    rows = _rows(graph.ndata)
    out = {("mfg", kind): _one_step(kind, shard, MFG, False, rows) for kind in KINDS}
    out.update({("trajectory", kind): _trajectory(kind, shard, False, rows)
                for kind in ("sage", "rgcn", "degnorm")})
    return out


@pytest.fixture(scope="module")
def runs(graph, tmp_path_factory):
    return {p: run_workers(_work, p, tmp_path_factory.mktemp(f"mb{p}"), graph, p, timeout_s=240)
            for p in PARTS}


def _full_batch(kind, g):
    model = _model(kind)
    x = g.ndata["feat"].clone().requires_grad_(True)
    edges = {"etype": g.edata["etype"]} if kind == "rgcn" else {}
    train = g.ndata["train_mask"]
    logits = model(Graph.from_edges(g.src, g.dst, g.num_nodes), x, **edges)
    loss = global_cross_entropy(logits, g.ndata["label"], train, int(train.sum()))
    loss.backward()
    return {"loss": float(loss.detach()), "grads": {k: p.grad for k, p in model.named_parameters()},
            "x_grad": x.grad}


@pytest.mark.parametrize("kind", KINDS)
def test_single_process_mfg_step_equals_the_full_batch_step(graph, one_process, kind):
    got = one_process["mfg", kind]
    assert_same_step(got, _full_batch(kind, graph), got["x_grad"], REL)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("p", PARTS)
def test_mfg_step_on_workers_equals_full_batch_and_single_process(graph, runs, one_process,
                                                                  p, kind, method):
    records = [r["mfg", method, kind] for r in runs[p]]
    x_grad = x_grad_of(records, graph.num_nodes)
    assert_same_step(records[0], _full_batch(kind, graph), x_grad, REL)
    assert_same_step(records[0], one_process["mfg", kind], x_grad, REL)


@pytest.mark.parametrize("kind", ("gcn", "gat"))
@pytest.mark.parametrize("p", PARTS)
def test_sampling_above_every_in_degree_is_the_mfg_step(graph, runs, p, kind):
    above = [r["above", kind] for r in runs[p]]
    mfg = [r["mfg", "random", kind] for r in runs[p]]
    assert above[0]["loss"] == mfg[0]["loss"]
    for name, g in mfg[0]["grads"].items():
        assert torch.equal(above[0]["grads"][name], g), name
    for a, m in zip(above, mfg):
        assert torch.equal(a["x_grad"], m["x_grad"])


@pytest.mark.parametrize("kind", ("sage", "rgcn", "degnorm"))
def test_sampled_losses_do_not_depend_on_the_worker_count(runs, one_process, kind):
    want = one_process["trajectory", kind]
    assert len(want) >= 8 and len(set(want)) == len(want)  # steps that differ
    for p in (1, 2, 3):
        for run in ("trajectory", "prefetched") if kind == "sage" else ("trajectory",):
            got = runs[p][0][run, kind]["losses"]
            assert len(got) == len(want)
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.parametrize("p", PARTS)
def test_layer_programs_are_compiled_once_for_every_step(runs, p):
    """Two layers, each compiled on the first step's block and run on every later one."""
    for r in runs[p]:
        assert r["trajectory", "sage"]["compiled"] == ["SAGELayer#0", "SAGELayer#1"]


def test_a_model_that_does_not_call_one_layer_per_block_is_refused(graph):
    import sage
    from torch import nn

    from sarc.training.inputs import TrainError
    shard = whole_graph_shard(graph.src, graph.dst, graph.num_nodes, graph.edata,
                              self_loops=False)
    src, _ = _steps("sage", shard, MFG, False, _rows(graph.ndata))
    (batch,) = list(src.steps(0))
    layer = sage.SAGELayer(5, 5)

    class Calls(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n, self.layer = n, layer

        def forward(self, g, x):
            for _ in range(self.n):
                x = self.layer(g, x)
            return x

    with pytest.raises(TrainError, match="made 1 sarc layer call in one forward pass, but the "
                                         "step has 2 blocks"):
        forward(Calls(1), batch)
    with pytest.raises(TrainError, match="the forward calls the sarc layer layer again: in mfg "
                                         "and sampling modes a step has a block per sarc layer"):
        forward(Calls(3), batch)   # a block per layer call: the third has none
    assert forward(Calls(2), batch).shape == (int(graph.ndata["train_mask"].sum()), 5)
    # called on the step's graph directly, outside a pass (sarc.training.loop.forward): the
    # first call after a pass is a pass, a second one is told how to start one (not that a
    # layer was called twice)
    x = batch.x[:, :5]
    want = Calls(2)(batch.graph, x)
    with pytest.raises(TrainError, match=r"every block .* taken .*forward_pass\(model\)"):
        Calls(2)(batch.graph, x)
    three = Calls(3)
    with pytest.raises(TrainError, match="calls the sarc layer layer again"):
        with batch.graph.forward_pass(three):
            three(batch.graph, x)
    with batch.graph.forward_pass():
        torch.testing.assert_close(Calls(2)(batch.graph, x), want)


def test_one_process_samples_the_next_step_while_a_step_computes(graph):
    """Each step is handed out with the next one's sample under way (the losses of these
    steps are those of P workers, with and without prefetch: the trajectory test above)."""
    shard = whole_graph_shard(graph.src, graph.dst, graph.num_nodes, graph.edata,
                              self_loops=False)
    src, _ = _steps("sage", shard, SAMPLED, False, _rows(graph.ndata))
    ahead = [src.prefetched for _ in src.steps(1)]
    assert len(ahead) >= 4 and ahead == [1] * (len(ahead) - 1) + [0]


def test_one_process_gathers_the_next_steps_rows_while_a_step_computes(graph):
    """Input rows that are data (no gradient) are gathered with the next step's sample, in
    the thread; learned ones are read in the step, after the step before updated them.
    Either way a step's rows are those of its blocks."""
    shard = whole_graph_shard(graph.src, graph.dst, graph.num_nodes, graph.edata,
                              self_loops=False)
    x, label, train = _rows(graph.ndata)
    counts = {"train": int(train.sum()), "val": 0, "test": 0}

    def source(x, prefetch):
        return MiniBatchSteps(shard, SAMPLED, layers=2, seed=5, comm=Comm(),
                              rows=ShardRows(x, label, train), evaluation=None, counts=counts,
                              graphs_of=local_blocks, prefetch=prefetch)
    ahead = [rows is not None for _, rows, _ in source(x, True).sampled(1)]
    assert len(ahead) >= 4 and all(ahead)
    learned = x.clone().requires_grad_(True)
    assert not any(rows is not None for _, rows, _ in source(learned, True).sampled(1))
    for a, b in zip(source(x, True).steps(1), source(x, False).steps(1), strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.label, b.label)
        assert torch.equal(a.node_ids, b.node_ids)
