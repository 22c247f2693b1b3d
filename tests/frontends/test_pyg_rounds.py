"""PyG convs of K rounds (SGConv, APPNP, TAGConv, ChebConv) as K sarc layers
(``sarc.frontends.pyg_rounds``), against PyG's own conv:

- the output, x's gradient and every parameter's in float64, with and without edge
  weights, the prepared graph reused by a second call;
- three Adam steps of a model of them, loss for loss;
- the conv's state-dict keys; a conv whose K changed after conversion, APPNP's dropout and
  SGConv's ``cached`` refused;
- one MFG step whose seeds are every training node (a block per round) equals the
  full-batch step, on one process and on two workers (DGL's APPNPConv too, in the DGL
  environment: ``sarc.frontends.dgl_rounds``).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402

from sarc.frontends.pyg import ConversionError, as_conv, from_message_passing  # noqa: E402
from sarc.frontends.pyg_rounds import PyGRounds  # noqa: E402
from sarc.graph import Graph  # noqa: E402

from test_pyg_zoo import D, F64, adam_losses, check_prepared, graph, randomize, x64  # noqa: E402

ROUNDS = {
    "sgconv_k2": (lambda: pyg.SGConv(D, 3, K=2), {}),
    "sgconv_k3_no_loops": (lambda: pyg.SGConv(D, 3, K=3, add_self_loops=False), {}),
    "appnp": (lambda: pyg.APPNP(K=3, alpha=0.2), {"in_channels": D}),
    "appnp_cached": (lambda: pyg.APPNP(K=2, alpha=0.3, cached=True), {"in_channels": D}),
    "appnp_unnormalized": (lambda: pyg.APPNP(K=2, alpha=0.1, normalize=False),
                           {"in_channels": D}),
    "tagconv": (lambda: pyg.TAGConv(D, 3, K=3), {}),
    "tagconv_unnormalized_no_bias": (lambda: pyg.TAGConv(D, 3, K=2, normalize=False,
                                                         bias=False), {}),
    "chebconv_k1": (lambda: pyg.ChebConv(D, 3, K=1), {}),
    "chebconv_sym": (lambda: pyg.ChebConv(D, 3, K=3), {}),
    "chebconv_rw": (lambda: pyg.ChebConv(D, 3, K=4, normalization="rw"), {}),
    "chebconv_laplacian": (lambda: pyg.ChebConv(D, 3, K=2, normalization=None), {}),
}


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", ROUNDS)
def test_k_round_conv_equals_pyg(name, weighted):
    check_prepared(*ROUNDS[name], weighted)


def test_a_conv_of_k_rounds_is_k_sarc_layers():
    layer = from_message_passing(pyg.TAGConv(D, 3, K=3))
    assert isinstance(layer, PyGRounds) and len(layer.rounds) == 3
    assert type(from_message_passing(pyg.SGConv(D, 3, K=1))).__name__ == "SGConvLayer"


class Net(nn.Module):
    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x, ei):
        return self.second(F.relu(self.first(x, ei)), ei)


def test_k_round_convs_train_three_steps_as_pyg():
    def model(wrap):
        first = randomize(pyg.TAGConv(D, 3, K=2))
        second = randomize(pyg.APPNP(K=3, alpha=0.25))
        return Net(wrap(first), wrap(second, in_channels=3))

    x, ei = x64(), graph()
    y = torch.randint(0, 2, (x.size(0),), generator=torch.Generator().manual_seed(2))
    losses = [adam_losses(net, x, ei, y) for net in (model(lambda c, **_: c), model(as_conv))]
    assert losses[1] == pytest.approx(losses[0], rel=1e-10, abs=1e-12)


def test_state_dict_keys_are_the_convs():
    conv = randomize(pyg.ChebConv(D, 3, K=3))
    wrapped = as_conv(conv)
    assert list(wrapped.state_dict()) == list(conv.state_dict())
    other = randomize(pyg.ChebConv(D, 3, K=3))
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    wrapped.load_state_dict(other.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(conv.parameters(), other.parameters()))


def test_a_conv_whose_k_changed_after_conversion_is_refused():
    conv = pyg.SGConv(D, 3, K=2).to(F64)
    wrapped = as_conv(conv)
    conv.K = 3
    with pytest.raises(ConversionError, match="SGConv: it was converted for 2 rounds and now "
                                              "has 3; convert it again"):
        wrapped(x64(), graph())


@pytest.mark.parametrize("make,needle", [
    (lambda: pyg.APPNP(K=2, alpha=0.1, dropout=0.5), r"APPNP: dropout=0.5 is not supported "
                                                     r"\(PyG drops the edge weights again"),
    (lambda: pyg.SGConv(D, 3, K=2, cached=True), "SGConv: cached=True is not supported"),
    (lambda: pyg.SGConv(D, 3, K=1, cached=True), "SGConv: cached=True is not supported")])
def test_what_rounds_cannot_model_is_refused(make, needle):
    with pytest.raises(ConversionError, match=needle):
        as_conv(make(), in_channels=D)


# --- a mini-batch step: a block per round ---------------------------------------------------------

class RoundsModel(nn.Module):
    """A sarc model of two K-round convs on the graph's given edge weights ``w``: TAGConv
    (2 rounds) then APPNP (2 rounds), four blocks per step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.tag = from_message_passing(pyg.TAGConv(5, 3, K=2, normalize=False))
        self.appnp = from_message_passing(pyg.APPNP(K=2, alpha=0.2, normalize=False),
                                          in_channels=3)

    def forward(self, g, x, w):
        return self.appnp(g, F.relu(self.tag(g, x, edge_weight=w)), edge_weight=w)


class DGLRoundsModel(nn.Module):
    """DGL's APPNPConv (3 rounds) after a linear: the rounds read out-degrees at the sources
    and in-degrees at the destinations, which a block has."""

    def __init__(self):
        super().__init__()
        from dgl.nn.pytorch import APPNPConv

        from sarc.frontends.dgl import from_dgl_module
        torch.manual_seed(3)
        self.lin = nn.Linear(5, 3)
        self.appnp = from_dgl_module(APPNPConv(3, 0.2), node={"feat": 3})

    def forward(self, g, x, w):
        return self.appnp(g, self.lin(x))


class DGLSourceDegreesModel(nn.Module):
    """DGL's SGConv then TAGConv (2 rounds each, four blocks per step), whose rounds scale
    source features by the sources' in-degrees: the whole graph's, which a block carries."""

    def __init__(self):
        super().__init__()
        from dgl.nn.pytorch import SGConv, TAGConv

        from sarc.frontends.dgl import from_dgl_module
        torch.manual_seed(3)
        self.sg = from_dgl_module(SGConv(5, 3, k=2, allow_zero_in_degree=True),
                                  node={"feat": 5})
        self.tag = from_dgl_module(TAGConv(3, 3, k=2), node={"feat": 3})

    def forward(self, g, x, w):
        return self.tag(g, F.relu(self.sg(g, x)))


MODELS = {"pyg": RoundsModel, "dgl": DGLRoundsModel, "dgl_sources": DGLSourceDegreesModel}


def _mfg_step(shard, group, rows, kind="pyg"):
    import datetime
    from sarc.sampling import Comm
    from sarc.training.loop import forward, global_cross_entropy
    from sarc.training.minibatch import (MiniBatchConfig, MiniBatchSteps, ShardRows,
                                         graph_layers, local_blocks)
    model = MODELS[kind]()
    x, label, train = rows
    x = x.clone().requires_grad_(True)
    config = MiniBatchConfig("mfg")
    if group is False:
        comm, graphs_of, total = Comm(), local_blocks, int(train.sum())
    else:
        import torch.distributed as dist
        from sarc.distributed.train import BlockGraphs
        comm = Comm(group)
        graphs_of = BlockGraphs(group, "mfg", torch.device("cpu"),
                                timeout=datetime.timedelta(seconds=60))
        t = torch.tensor([int(train.sum())])
        dist.all_reduce(t, group=group)
        total = int(t)
    steps = MiniBatchSteps(shard, config, layers=graph_layers(model), seed=5, comm=comm,
                           rows=ShardRows(x, label, train), evaluation=None,
                           counts={"train": total, "val": 0, "test": 0},
                           graphs_of=graphs_of, edge_names=("w",))
    (batch,) = list(steps.steps(0))
    loss = global_cross_entropy(forward(model, batch), batch.label, batch.masks["train"],
                                batch.train_total)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    loss = loss.detach().reshape(1)
    if group is not False:
        import torch.distributed as dist
        for t in [*grads.values(), loss]:
            dist.all_reduce(t, group=group)
    return {"loss": float(loss), "grads": grads, "x_grad": x.grad.clone(),
            "x_ids": shard.orig_node_ids.clone(), "layers": graph_layers(model)}


def _work(rank, group, g, parts, kind):
    from sampling.graphs import shards
    shard = shards(g, parts)[0][rank]
    return _mfg_step(shard, group, (shard.ndata["feat"], shard.ndata["label"],
                                    shard.ndata["train_mask"]), kind)


def _full_batch(g, kind="pyg"):
    from sarc.training.loop import global_cross_entropy
    model = MODELS[kind]()
    x = g.ndata["feat"].clone().requires_grad_(True)
    train = g.ndata["train_mask"]
    logits = model(Graph.from_edges(g.src, g.dst, g.num_nodes), x, w=g.edata["w"])
    loss = global_cross_entropy(logits, g.ndata["label"], train, int(train.sum()))
    loss.backward()
    return {"loss": float(loss.detach()),
            "grads": {k: p.grad for k, p in model.named_parameters()}, "x_grad": x.grad}


def _close(got, want, x_grad):
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert set(got["grads"]) == set(want["grads"])
    for k, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][k], g, rtol=1e-5, atol=1e-6, msg=k)
    assert float(want["x_grad"].norm()) > 0
    torch.testing.assert_close(x_grad, want["x_grad"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("kind", ["pyg", "dgl", "dgl_sources"])
def test_mfg_step_of_k_round_convs_equals_the_full_batch_step(kind, parts, tmp_path):
    """PyG's TAGConv and APPNP (4 rounds), DGL's APPNPConv (3 rounds), DGL's SGConv and
    TAGConv (4 rounds reading their sources' in-degrees)."""
    from sampling.graphs import run_workers, tiny_graph
    from sarc.training.minibatch import whole_graph_shard
    if kind.startswith("dgl"):
        pytest.importorskip("dgl", reason="DGL's convs: in the DGL environment")
    g = tiny_graph(n=30, e=150, seed=7, isolated=2)
    want = _full_batch(g, kind)
    if parts == 1:
        shard = whole_graph_shard(g.src, g.dst, g.num_nodes, g.edata, self_loops=False)
        got = _mfg_step(shard, False, (g.ndata["feat"], g.ndata["label"],
                                       g.ndata["train_mask"]), kind)
        assert got["layers"] == {"pyg": 4, "dgl": 3, "dgl_sources": 4}[kind]
        _close(got, want, got["x_grad"])
        return
    records = run_workers(_work, parts, tmp_path, g, parts, kind, timeout_s=240)
    x_grad = torch.zeros_like(want["x_grad"])
    for r in records:
        x_grad[r["x_ids"]] += r["x_grad"]
    _close(records[0], want, x_grad)


@pytest.mark.parametrize("kind", ["dgl", "dgl_sources"])
def test_converted_dgl_convs_count_their_rounds_once_after_patch(kind):
    """``patch()`` routes DGL's convs; one a model converted itself (``from_dgl_module``)
    runs through its own sarc layers and is not counted again as routed: the step's
    blocks are the model's rounds with or without ``patch()``."""
    pytest.importorskip("dgl", reason="DGL's convs: in the DGL environment")
    import sarc.frontends.dgl as sarc_dgl
    from sarc.training.minibatch import graph_layers
    from dgl.nn.pytorch import APPNPConv
    model, want = MODELS[kind](), {"dgl": 3, "dgl_sources": 4}[kind]
    was_patched = getattr(APPNPConv.forward, "_sarc_routed", False)
    sarc_dgl.unpatch()
    try:
        assert graph_layers(model) == want
        sarc_dgl.patch()
        assert graph_layers(model) == want
    finally:
        sarc_dgl.patch() if was_patched else sarc_dgl.unpatch()
