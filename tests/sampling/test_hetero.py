"""A heterogeneous model (``sarc.TypedInput``, ``sarc.HeteroConv``) in mini-batch steps.

A ``HeteroConv`` takes one block of a step, and each relation's layer runs on the block's
edges of its relation with the whole graph's relation degrees, so:

- MFG: one step with every training node as a seed equals the full-batch step (loss,
  every parameter gradient, the input features' gradient), on one process and on P
  workers (P = 2 METIS, 3 random), for relation layers that read what a block changes:
  a mean, a max, a sum normed by the relation's ``src.out_degree`` and ``dst.in_degree``
  and one by ``src.in_degree``, with an edge weight;
- sampling: the losses of every step of two epochs (Adam between them) are the same
  whatever P, and each worker's layer bytes per step equal the planner's prediction
  on the step's blocks (each conv's fetch of its inputs' rows, or in sar the relations'
  programs);
- on random typed graphs (hypothesis), every MFG batch gives its seeds the whole graph's
  outputs and parameter gradients, with and without node types.
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

import hetero_layers
from hetero_layers import InDegreeLayer, MaxLayer, MeanLayer, NormSumLayer, TypedNet
from sarc.graph import Graph
from sarc.partition import cut_parts, metis_partition, random_partition, relabel
from sarc.runtime.sharded import build_shard
from sarc.sampling import Comm
from sarc.training.loop import ONE_PROCESS, Batch, global_cross_entropy, train_step
from sarc.training.minibatch import MiniBatchConfig, MiniBatchSteps, ShardRows, local_blocks
from sarc.training.optim import EagerAdam

from hypothesis import given, settings
from hypothesis import strategies as st

from .graphs import assert_same_step, run_workers, step_record, x_grad_of

N, E, RELS, CLASSES, HIDDEN = 48, 320, 4, 3, 6
WIDTHS = {0: 4, 1: 7}
REL = 1e-5
MFG = MiniBatchConfig("mfg")
SAMPLED = MiniBatchConfig("sampling", (2, 3), batch_size=6)
EPOCHS = (1, 2)
EDGES, NODES = ("etype", "w"), ("ntype",)
KINDS = (MeanLayer, NormSumLayer, MaxLayer, InDegreeLayer)
CONFIGS = ((2, "metis", None), (3, "random", None), (3, "random", "sar"))
"""Workers, partitioning and execution: the inputs' rows fetched once for every relation
(the planner's execution, no budget), or each relation's layer in its own schedule (sar)."""
IDS = ["2-metis", "3-random", "3-random-sar"]


def typed_graph() -> dict:
    """``hetero_layers.typed_graph`` as node and edge data."""
    data = hetero_layers.typed_graph(N, E, RELS, WIDTHS, CLASSES, seed=7, isolated=3, train=0.6)
    return {"src": data["src"], "dst": data["dst"],
            "ndata": {k: data[k] for k in ("feat", "label", "train_mask", "ntype")},
            "edata": {k: data[k] for k in ("etype", "w")}}


def _model(typed: bool = True) -> TypedNet:
    torch.manual_seed(3)  # the same weights on every worker and in the test process
    return TypedNet(KINDS, WIDTHS, HIDDEN, CLASSES, typed)


def _shard(data, parts: int, method: str, rank: int):
    n = data["ndata"]["ntype"].shape[0]
    part = (metis_partition if method == "metis" else random_partition)(
        data["src"], data["dst"], n, parts, seed=0)
    rl = relabel(part, parts)
    parts_ = list(cut_parts(data["src"], data["dst"], rl, data["ndata"], data["edata"]))
    return build_shard(parts_[rank], rl.offsets, rank)


def _steps(shard, config, group, exec_mode=None):
    """The step source of ``config`` on ``shard`` (one process: ``group is False``), with
    the whole graph (a ``Graph``, or the workers' ``DistGraph``) as its evaluation batch."""
    nd = shard.ndata
    x = nd["feat"].clone().requires_grad_(True)
    if group is False:
        whole = Graph.from_edges(*shard.local_block.input_edges(), shard.num_nodes)
        edge_inputs = {k: shard.edata[0][k] for k in EDGES}
        comm, graphs_of, train = Comm(), local_blocks, int(nd["train_mask"].sum())
    else:
        from sarc.distributed import DistGraph
        from sarc.distributed.train import BlockGraphs
        timeout = datetime.timedelta(seconds=60)
        whole = DistGraph(shard, group, timeout=timeout)
        edge_inputs = {k: whole.edge_data(k) for k in EDGES}
        comm, graphs_of = Comm(group), BlockGraphs(group, config.mode, torch.device("cpu"),
                                                   timeout=timeout, counter=whole.counter,
                                                   exec_mode=exec_mode)
        train = _sum(int(nd["train_mask"].sum()), group)
    edge_inputs["ntype"] = nd["ntype"]
    counts = {"train": train, "val": 0, "test": 0}
    evaluation = Batch(whole, x, edge_inputs, nd["label"], {}, train_total=train)
    src = MiniBatchSteps(shard, config, layers=2, seed=5, comm=comm,
                         rows=ShardRows(x, nd["label"], nd["train_mask"]),
                         evaluation=evaluation, counts=counts, graphs_of=graphs_of,
                         edge_names=EDGES, node_names=NODES,
                         counter=None if group is False else whole.counter)
    return src, x, graphs_of


def _sum(v, group):
    t = torch.tensor([v], dtype=torch.int64)
    dist.all_reduce(t, group=group)
    return int(t)


def _one_step(shard, group, typed: bool = True, exec_mode=None):
    """One MFG step's loss, parameter gradients (summed over workers) and input gradient."""
    model = _model(typed)
    src, x, _ = _steps(shard, MFG, group, exec_mode)
    (batch,) = list(src.steps(0))
    return step_record(model, batch, x, shard, group)


def _trajectory(shard, group, exec_mode=None):
    """The losses of every sampled step of two epochs; on workers, with each epoch's layer
    bytes per step sent and planned."""
    from sarc.distributed.train import AllReduce
    model = _model()
    opt = EagerAdam(model.parameters(), lr=0.05)
    src, _, blocks = _steps(shard, SAMPLED, group, exec_mode)
    red = ONE_PROCESS if group is False else AllReduce(group)
    losses, bytes_ = [], []
    for e in EPOCHS:
        losses += [train_step(model, opt, b, red) for b in src.steps(e)]
        if group is not False:
            h = src.history[-1]
            bytes_.append((h["bytes_sent"], blocks.planned_bytes_sent(h["steps"]),
                           h["setup_bytes_sent"]))
    return {"losses": losses, "bytes": bytes_}


def _work(rank, group, data, parts, method, exec_mode):
    return {"mfg": _one_step(_shard(data, parts, method, rank), group, exec_mode=exec_mode),
            "sampled": _trajectory(_shard(data, parts, method, rank), group, exec_mode)}


@pytest.fixture(scope="module")
def data():
    return typed_graph()


@pytest.fixture(scope="module")
def one_process(data):
    return {"mfg": _one_step(_shard(data, 1, "random", 0), False),
            "sampled": _trajectory(_shard(data, 1, "random", 0), False)}


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    return {(p, m, x): run_workers(_work, p, tmp_path_factory.mktemp(f"het{p}"), data, p, m,
                                   x, timeout_s=240)
            for p, m, x in CONFIGS}


def _full_batch(data, typed: bool = True):
    model = _model(typed)
    nd = data["ndata"]
    x = nd["feat"].clone().requires_grad_(True)
    train = nd["train_mask"]
    logits = model(Graph.from_edges(data["src"], data["dst"], N), x, data["edata"]["etype"],
                   nd["ntype"], data["edata"]["w"])
    loss = global_cross_entropy(logits, nd["label"], train, int(train.sum()))
    loss.backward()
    return {"loss": float(loss.detach()), "x_grad": x.grad,
            "grads": {k: p.grad for k, p in model.named_parameters()}}


def test_the_blocks_normalize_otherwise_than_the_whole_graph(data):
    """What the MFG tests below tell apart: a block's relation degrees are not the whole
    graph's (its sources' out-edges into nodes outside the step are left out)."""
    src, _, _ = _steps(_shard(data, 1, "random", 0), MFG, False)
    (batch,) = list(src.steps(0))
    last = batch.graph.graphs[-1]
    whole = Graph.from_edges(data["src"], data["dst"], N)
    assert last.num_dst < N and last.num_edges < whole.num_edges
    out = torch.bincount(last.input_edges()[0], minlength=last.num_src).to(torch.float32)
    rows = batch.graph.rows[-1]
    assert bool((out < whole.out_degree[rows]).any())


def test_single_process_mfg_step_equals_the_full_batch_step(data, one_process):
    got = one_process["mfg"]
    assert_same_step(got, _full_batch(data), got["x_grad"], REL)


def test_single_process_mfg_step_without_node_types_equals_the_full_batch_step(data):
    got = _one_step(_shard(data, 1, "random", 0), False, typed=False)
    assert_same_step(got, _full_batch(data, typed=False), got["x_grad"], REL)


@pytest.mark.parametrize("parts,method,exec_mode", CONFIGS, ids=IDS)
def test_mfg_step_on_workers_equals_the_full_batch_step(data, runs, one_process, parts,
                                                        method, exec_mode):
    records = [r["mfg"] for r in runs[parts, method, exec_mode]]
    assert_same_step(records[0], _full_batch(data), x_grad_of(records, N), REL)
    assert_same_step(records[0], one_process["mfg"], x_grad_of(records, N), REL)


@pytest.mark.parametrize("parts,method,exec_mode", CONFIGS, ids=IDS)
def test_sampled_steps_do_not_depend_on_the_worker_count(runs, one_process, parts, method,
                                                         exec_mode):
    want = one_process["sampled"]["losses"]
    assert len(want) == 2 * -(-int(typed_graph()["ndata"]["train_mask"].sum()) // 6)
    for r in runs[parts, method, exec_mode]:
        got = r["sampled"]["losses"]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert abs(a - b) <= REL * abs(b), (got, want)


@pytest.mark.parametrize("parts,method,exec_mode", CONFIGS, ids=IDS)
def test_each_workers_layer_bytes_are_the_planners(runs, parts, method, exec_mode):
    for r in runs[parts, method, exec_mode]:
        for sent, planned, setup in r["sampled"]["bytes"]:
            assert sent == planned and sent > 0
            assert setup > 0   # the relations' degrees of the rows their readers read


@st.composite
def typed_graphs(draw):
    """A random graph of two node types (each with at least one node) whose relation r,
    of 1 to 5, has edges into node type r % 2 only (at least one edge each), and up to two
    relations more without edges."""
    relations = draw(st.integers(1, 5))
    empty = draw(st.integers(0, 2))
    n = draw(st.integers(4, 30))
    e = draw(st.integers(relations, 120))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    ntype = torch.randint(0, 2, (n,), generator=gen)
    ntype[:2] = torch.tensor([0, 1])
    etype = torch.arange(e) % relations
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.empty(e, dtype=torch.int64)
    for t in (0, 1):
        into = torch.nonzero(ntype == t).squeeze(1)
        rows = torch.nonzero(etype % 2 == t).squeeze(1)
        dst[rows] = into[torch.randint(0, into.numel(), (rows.numel(),), generator=gen)]
    feat = torch.randn(n, max(WIDTHS.values()), generator=gen)
    ndata = {"feat": feat, "label": torch.randint(0, CLASSES, (n,), generator=gen),
             "train_mask": torch.rand(n, generator=gen) < 0.5, "ntype": ntype}
    ndata["train_mask"][0] = True
    return {"src": src, "dst": dst, "ndata": ndata,
            "edata": {"etype": etype, "w": torch.rand(e, generator=gen)}}, relations, empty


@settings(max_examples=30, deadline=None)
@given(typed_graphs(), st.integers(1, 6), st.booleans())
def test_each_mfg_batchs_outputs_are_the_whole_graphs_at_its_seeds(graph, batch, typed):
    """On random typed graphs, every MFG batch of an epoch gives each of its seeds the
    whole graph's output there, and the gradient of their sum the whole graph's (the
    relations' degrees and destination types the whole graph's, relations without
    edges in a block, or in the graph, included)."""
    data, relations, empty = graph
    torch.manual_seed(0)
    kinds = [KINDS[(r + 1) % len(KINDS)] for r in range(relations + empty)]   # one reads w
    model = TypedNet(kinds, WIDTHS, HIDDEN, CLASSES, typed,
                     dst_types={r: r % 2 for r in range(relations, relations + empty)})
    nd = data["ndata"]
    whole = Graph.from_edges(data["src"], data["dst"], nd["ntype"].shape[0])
    full = model(whole, nd["feat"], data["edata"]["etype"], nd["ntype"], data["edata"]["w"])
    src, x, _ = _steps(_shard(data, 1, "random", 0), MiniBatchConfig("mfg", batch_size=batch),
                       False)
    ids = src.shard.orig_node_ids
    for b in src.steps(1):
        out = model(b.graph, b.x, **b.edge_inputs)
        seeds = ids[b.node_ids[:out.shape[0]]]
        torch.testing.assert_close(out, full[seeds], rtol=1e-5, atol=1e-6)
        got = torch.autograd.grad(out.sum(), list(model.parameters()), allow_unused=True)
        want = torch.autograd.grad(full[seeds].sum(), list(model.parameters()),
                                   allow_unused=True, retain_graph=True)
        for g, w in zip(got, want):
            if g is None or w is None:   # a relation without edges into the batch's seeds
                assert all(t is None or float(t.abs().max()) == 0.0 for t in (g, w))
            else:
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)



def test_a_hetero_conv_in_a_step_needs_the_whole_graph_and_the_steps_edge_types(data):
    """Refused by name: a step built without the whole graph (``MiniBatchSteps`` given no
    evaluation batch), and edge types that are not one per edge of the step's blocks."""
    import sarc
    from sarc.training.minibatch import MiniBatchGraph
    src, x, _ = _steps(_shard(data, 1, "random", 0), MFG, False)
    (batch,) = list(src.steps(0))
    conv = _model().conv1
    h = torch.randn(x.shape[0], HIDDEN)
    etype, w = batch.edge_inputs["etype"], batch.edge_inputs["w"]
    alone = MiniBatchGraph(batch.graph.graphs)   # no rows, no whole graph
    with pytest.raises(sarc.GraphError, match="no whole graph with an etype input"):
        conv(alone, h, etype=etype, w=w)
    with pytest.raises(sarc.GraphError, match=r"an edge type per edge of the step's blocks "
                                              rf"\({etype.numel()}\), got shape "
                                              rf"\[{etype.numel() - 1}\]"):
        conv(batch.graph, h, etype=etype[1:], w=w)


def _first_step_conv(data):
    """One process's first MFG step: its batch, a fresh model's first conv, an input of
    the step's rows, and the step's edge types, edge weights and node types."""
    src, x, _ = _steps(_shard(data, 1, "random", 0), MFG, False)
    (batch,) = list(src.steps(0))
    inputs = batch.edge_inputs
    return (batch, _model().conv1, torch.randn(x.shape[0], HIDDEN),
            (inputs["etype"], inputs["w"], inputs["ntype"]))


def test_node_types_other_than_the_whole_graphs_are_refused_in_a_step(data):
    """In a step a relation's destination type is the whole graph's (its ntype input, the
    dataset's): a model that passes other types (relabeled, or its own where the whole
    graph has none) is refused by name; they counted for other nodes (a KeyError, an id out
    of range, or on workers a silently other loss)."""
    import sarc
    batch, conv, h, (etype, w, ntype) = _first_step_conv(data)
    with pytest.raises(sarc.GraphError, match=r"node types other than the whole graph's"):
        conv(batch.graph, h, etype=etype, w=w, ntype=1 - ntype)
    batch.graph.calls = 0
    del batch.graph.whole.edge_inputs["ntype"]
    with pytest.raises(sarc.GraphError, match=r"was given node types, but the whole graph "
                                              r"has none"):
        conv(batch.graph, h, etype=etype, w=w, ntype=ntype)


def test_edge_types_other_than_the_steps_are_refused_in_a_step(data):
    """In a step a relation's degrees and destination type are the whole graph's relation's
    (its etype input, the dataset's): a model that passes a conv other edge types (its own
    relabeling) is refused by name; its step was silently another than the full batch's
    (or, with node types, an id out of range)."""
    import sarc
    batch, conv, h, (etype, w, ntype) = _first_step_conv(data)
    with pytest.raises(sarc.GraphError, match=r"edge types other than the step's"):
        conv(batch.graph, h, etype=(etype + 1) % RELS, w=w, ntype=ntype)
    batch.graph.calls = 0
    assert conv(batch.graph, h, etype=etype.clone(), w=w, ntype=ntype).shape[1] == HIDDEN
