"""A traced PyG conv (``TracedConv``) computes what the conv computes, or is refused.

The conv's ``forward`` runs on stand-ins: ``x`` (and the edge feature, the conv's
parameters and every value computed from them) are ``isinstance(..., Tensor)`` as PyG's
code expects, and so is ``edge_index``: a forward that prepares the graph under ``if
isinstance(edge_index, Tensor)`` (self loops, ``gcn_norm``) runs that code on the real
graph when the inputs are prepared (``frontends.pyg_prepare``; tested further in
``test_pyg_graph_code.py``), and PyG's ``if isinstance(x, Tensor): x = (x, x)`` runs. Each conv that imports is compared with
PyG's own: output, the gradient of x, of every parameter and of the edge features.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import pytest
import torch
from hypothesis import given, settings, strategies as st
import torch.nn.functional as F
from torch import Tensor, nn

pytest.importorskip("torch_geometric")
from torch_geometric import nn as pyg  # noqa: E402
from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.utils import add_self_loops, degree, softmax  # noqa: E402

from interop.interop_check import assert_all_close  # noqa: E402
from sarc.errors import DSLError  # noqa: E402
from sarc.frontends.pyg import (ConversionError, GATConvLayer, GCNConvLayer,  # noqa: E402
                                SAGEConvLayer, TracedConv, as_conv, from_message_passing)

N, D = 7, 3


def graph() -> torch.Tensor:
    """Duplicates, a self loop, a node without in-edges (6) and one without any (5)."""
    return torch.tensor([[0, 1, 2, 3, 0, 4, 4, 2, 6], [1, 2, 3, 0, 2, 1, 1, 2, 0]])


def randomize_zeros(conv) -> None:
    with torch.no_grad():
        for p in conv.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape) * 0.5)


def check_same(run_sarc, run_pyg, conv, x, edge=None) -> None:
    """Outputs and gradients (x, parameters, edge features) of the two runs agree."""
    params = dict(conv.named_parameters())
    upstream = torch.randn(run_pyg(x, *([] if edge is None else [edge])).shape)

    def grads(run):
        xs = x.clone().requires_grad_(True)
        args = [xs]
        if edge is not None:
            args.append(edge.clone().requires_grad_(edge.is_floating_point()))
        for p in params.values():
            p.grad = None
        out = run(*args)
        (out * upstream).sum().backward()
        got = {k: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
               for k, p in params.items()}
        if edge is not None and edge.is_floating_point():
            got["<edge>"] = args[1].grad
        return out.detach(), xs.grad, got

    out_s, xg_s, g_s = grads(run_sarc)
    out_p, xg_p, g_p = grads(run_pyg)
    assert set(g_s) == set(g_p)
    assert_all_close([("output", out_s, out_p), ("grad of x", xg_s, xg_p)]
                     + [(f"grad of {k}", g_s[k], g_p[k]) for k in g_p])


def check_both_paths(conv, edge=None, **options) -> None:
    """from_message_passing(...).run and as_conv(...) both equal the conv."""
    ei = graph()
    layer = from_message_passing(conv, **options)
    wrapped = as_conv(conv, **options)
    extra = [] if edge is None else [edge]
    for run in (lambda x, *e: layer.run(x, ei, *e), lambda x, *e: wrapped(x, ei, *e)):
        check_same(run, lambda x, *e: conv(x, ei, *e), conv, torch.randn(N, D), *extra)


# --- 1. graph preparation under isinstance(edge_index, Tensor) runs, not skipped ----------------

class SelfLoopSum(MessagePassing):
    """PyG's idiom: self loops added when edge_index is a Tensor."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D

    def forward(self, x, edge_index):
        if isinstance(edge_index, Tensor):
            edge_index, _ = add_self_loops(edge_index, num_nodes=x.shape[0])
        return self.propagate(edge_index, x=x)


class CatchesTheRefusal(SelfLoopSum):
    """A forward that would swallow an error of its graph preparation."""

    def forward(self, x, edge_index):
        try:
            edge_index, _ = add_self_loops(edge_index, num_nodes=N)
        except Exception:   # noqa: BLE001 - the point of the test
            pass
        return self.propagate(edge_index, x=x)


class TanhGCN(pyg.GCNConv):
    """A user's tweak of GCNConv: only update overridden; GCNConv's forward normalizes."""

    def update(self, aggr_out):
        return torch.tanh(aggr_out)


class TanhLG(pyg.LGConv):
    """LGConv (converted, its gcn_norm prepared by sarc) with update overridden: traced, its
    forward's gcn_norm run as graph code."""

    def update(self, aggr_out):
        return torch.tanh(aggr_out)


class HalfSG(pyg.SGConv):
    def message(self, x_j, edge_weight):
        return 0.5 * edge_weight.view(-1, 1) * x_j


class HalfAPPNP(pyg.APPNP):
    """APPNP (converted into rounds) with message overridden: traced, so its forward's K
    propagates are refused."""

    def message(self, x_j, edge_weight):
        return 0.5 * edge_weight.view(-1, 1) * x_j


PREPARES_THE_GRAPH = {
    "lgconv_subclass_update": (lambda: TanhLG(), {"in_channels": D}, None),
    "sgconv_subclass_weighted": (lambda: HalfSG(D, 2, K=1), {"edge_dim": ()}, "weight"),
    "gcn_subclass_update": (lambda: TanhGCN(D, 2), {}, None),
    "self_loops_isinstance": (lambda: SelfLoopSum(), {}, None),
    "self_loops_caught": (lambda: CatchesTheRefusal(), {}, None),
}


@pytest.mark.parametrize("name", PREPARES_THE_GRAPH)
def test_graph_preparation_in_forward_runs_on_the_real_graph(name):
    """Self loops, gcn_norm of an edge weight (its gradient too): the conv's own code."""
    make, options, edge = PREPARES_THE_GRAPH[name]
    torch.manual_seed(0)
    conv = make()
    randomize_zeros(conv)
    extra = None if edge is None else torch.rand(graph().size(1)) + 0.5
    check_both_paths(conv, extra, **options)


def test_a_forward_of_several_propagates_is_refused_at_the_second():
    with pytest.raises(ConversionError, match=r"^HalfAPPNP: a forward that calls propagate "
                                              r"twice \(the second call at .*appnp.py:\d+\)"):
        as_conv(HalfAPPNP(K=2, alpha=0.1), in_channels=D)(torch.randn(N, D), graph())


class ScalarOverloads(MessagePassing):
    """torch builtins with an overload taking a number where the traced value is
    (``torch.pow(h, 2.0)``, ``torch.where(c, h, 0.0)``): torch's argument parser read the
    value, which says it is a tensor, as one (a crash of the process)."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(D, D)

    def forward(self, x, edge_index):
        h = torch.pow(self.lin(x), 2.0)
        h = torch.where(h > 0.5, h, 0.0)
        return self.propagate(edge_index, x=h)

    def message(self, x_j):
        return torch.pow(x_j, 0.5) + torch.where(x_j > 1.0, 1.0, x_j)


def test_torch_builtins_with_number_overloads_trace():
    check_both_paths(ScalarOverloads())


# --- edge_updater: per-edge values of edge_update, computed in message --------------------------

class EdgeUpdater(MessagePassing):
    """Per-edge weights from ``edge_updater`` (``edge_update``), then a propagate."""

    def __init__(self, softmax_over_targets=False):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(D, D)
        self.softmax_over_targets = softmax_over_targets

    def forward(self, x, edge_index):
        h = self.lin(x)
        w = self.edge_updater(edge_index, x=(h, x))
        return self.propagate(edge_index, x=h, w=w)

    def edge_update(self, x_j, x_i, index, ptr, dim_size):
        w = (x_j * x_i).sum(-1, keepdim=True)
        if self.softmax_over_targets:
            w = softmax(w, index, ptr, dim_size)
        return w

    def message(self, x_j, w):
        return x_j * w


class ReluGAT(pyg.GATConv):
    """A user's GATConv with its own message: traced, GATConv's forward with it (its
    attention from edge_updater, self loops by graph code)."""

    def message(self, x_j, alpha):
        return torch.relu(x_j) * alpha.unsqueeze(-1)


class ScaledGATv2(pyg.GATv2Conv):
    def message(self, x_j, alpha):
        return 0.5 * super().message(x_j, alpha)


EDGE_UPDATERS = {
    "user": (lambda: EdgeUpdater(), None),
    "user_softmax": (lambda: EdgeUpdater(softmax_over_targets=True), None),
    "gat": (lambda: ReluGAT(D, 2, heads=2), None),
    "gat_mean_no_loops": (lambda: ReluGAT(D, 2, heads=3, concat=False, add_self_loops=False),
                          None),
    "gat_edge_dim": (lambda: ReluGAT(D, 2, heads=2, edge_dim=3), "edge"),
    "gat_edge_dim_fill_add": (lambda: ReluGAT(D, 2, heads=2, edge_dim=3, fill_value="add"),
                              "edge"),
    "gat_residual_eval_dropout": (lambda: ReluGAT(D, 2, heads=2, residual=True,
                                                  dropout=0.5).eval(), None),
    "gatv2": (lambda: ScaledGATv2(D, 2, heads=2), None),
}


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("name", EDGE_UPDATERS)
def test_edge_updater_is_edge_update_per_edge(name, flow):
    """What edge_update computes from both ends of an edge (GATConv's attention) is traced
    once per edge, in message, and equals PyG: output and every gradient."""
    make, edge = EDGE_UPDATERS[name]
    conv = make()
    conv.flow = flow
    randomize_zeros(conv)
    if edge is None:
        check_both_paths(conv)
    else:
        check_both_paths(conv, torch.randn(graph().size(1), 3), edge_dim=3)


def test_edge_updates_attention_dropout_is_drawn_once_per_edge():
    """In training, GAT's attention dropout (in edge_update) is one mask over the edges:
    each kept weight is scaled by 1/(1-p), each other is 0, and the output is what PyG's
    forward gives with that mask."""
    torch.manual_seed(0)
    conv = ReluGAT(D, 2, heads=1, dropout=0.5, add_self_loops=False)
    randomize_zeros(conv)
    layer = from_message_passing(conv)
    x, ei = torch.randn(N, D), graph()
    outs = [layer.run(x, ei) for _ in range(2)]
    assert not torch.equal(outs[0], outs[1])   # a mask per call
    conv.eval()
    full = conv(x, ei)
    assert not torch.equal(outs[0], full)


class ScaledBeforePropagate(EdgeUpdater):
    def forward(self, x, edge_index):
        w = self.edge_updater(edge_index, x=(x, x))
        w = w * 2  # ERR:edge-updated-used
        return self.propagate(edge_index, x=x, w=w)


class CountsEdges(EdgeUpdater):
    def edge_update(self, x_j, x_i, index):
        if index.numel() > 3:  # ERR:numel
            return x_j.sum(-1, keepdim=True)
        return x_i.sum(-1, keepdim=True)


@pytest.mark.parametrize("make, needle", [
    (ScaledBeforePropagate, "ScaledBeforePropagate: edge_updater's value used in "
                            "torch.Tensor.mul in forward or update at "
                            ".*test_pyg_tracing.py:{line} is not supported \\(sarc computes "
                            "edge_update per edge, in message: give its value to propagate"),
    (CountsEdges, "CountsEdges: index.numel\\(\\) > 3 at .*test_pyg_tracing.py:{line} is not "
                  "supported \\(the number of edges is known when the layer runs; sarc reads "
                  "it only compared with 0\\)"),
], ids=["edge-updated-used", "numel"])
def test_what_edge_update_cannot_be_traced_as_is_refused_at_its_line(make, needle):
    tag = "# ERR:" + ("numel" if make is CountsEdges else "edge-updated-used")
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith(tag))
    with pytest.raises(ConversionError, match=needle.format(line=line)):
        as_conv(make())(torch.randn(N, D), graph())


# --- subclasses of the converted classes -----------------------------------------------------------

class PlainGCN(pyg.GCNConv):
    """Only a new __init__: still GCNConv, converted as one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.note = "mine"


class DoubledSAGE(pyg.SAGEConv):
    def message(self, x_j):
        return 2 * x_j


def test_a_subclass_that_overrides_nothing_is_converted():
    conv = PlainGCN(D, 2)
    randomize_zeros(conv)
    assert type(from_message_passing(conv)) is GCNConvLayer
    check_both_paths(conv)


class PlainGAT(pyg.GATConv):
    """A subclass that overrides nothing of a conv with an edge_update, for which PyG also
    generates edge_updater and edge_collect on the class (it was traced, and refused)."""


def test_a_subclass_of_gatconv_that_overrides_nothing_is_converted():
    conv = PlainGAT(D, 2, heads=2)
    randomize_zeros(conv)
    assert type(from_message_passing(conv)) is GATConvLayer
    assert "edge_updater" in vars(PlainGAT)   # generated by PyG, not the user's
    check_both_paths(conv)


def test_a_subclass_that_overrides_message_is_traced():
    conv = DoubledSAGE(D, 2)
    randomize_zeros(conv)
    layer = from_message_passing(conv)
    assert type(layer) is TracedConv and not isinstance(layer, SAGEConvLayer)
    check_both_paths(conv)


class TwiceSG(pyg.SGConv):
    """A user's SGConv with its own message: traced, SGConv's forward with it."""

    def message(self, x_j, edge_weight):
        return 2 * super().message(x_j, edge_weight)


SUBCLASS_REFUSALS = {
    # SGConv's forward with K=2: propagate twice, one sarc layer is one round
    "sgconv_message": (lambda: TwiceSG(D, 2, K=2), ConversionError, "SGConv", "message"),
}


@pytest.mark.parametrize("name", SUBCLASS_REFUSALS)
def test_a_refused_subclass_of_a_converted_conv_says_why_it_was_traced(name):
    """The refusal comes from the stock conv's forward, which the user did not write: it
    says which of the stock conv's methods the subclass overrides (so it is traced, not
    converted), where the subclass is, and what is converted as written."""
    make, error, stock, method = SUBCLASS_REFUSALS[name]
    conv = make()
    cls = type(conv).__name__
    with pytest.raises(error) as info:
        as_conv(conv)(torch.randn(N, D), graph())
    text = str(info.value)
    assert text.startswith(f"{Path(pyg.__file__).parent}") or text.startswith(f"{cls}:"), text
    assert (f"{cls} overrides {stock}'s {method} ({cls} is defined at "
            f"{Path(__file__)}:") in text, text
    assert (f"so sarc traces {cls}'s code, {stock}.forward included; a subclass that "
            f"overrides none of {stock}'s methods is converted as a {stock}") in text, text


class SubOfUserConv(SelfLoopSum):
    """A subclass of a user's conv PyG already generated a propagate for."""

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x * 2)


def test_a_subclass_of_an_instantiated_user_conv_is_traced():
    SelfLoopSum()   # PyG generates SelfLoopSum.propagate, which the subclass inherits
    check_both_paths(SubOfUserConv())


class StashesAlpha(MessagePassing):
    """PyG's GATConv idiom: the attention kept on the module (``self._alpha = alpha``)."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.att = nn.Linear(D, 1)
        self._alpha = None

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_j, x_i, index, size_i):
        from torch_geometric.utils import softmax
        alpha = softmax(self.att(x_i + x_j), index, num_nodes=size_i)
        self._alpha = alpha
        return x_j * alpha


def test_a_value_the_conv_stores_on_itself_while_traced_is_not_kept():
    """It was a traced value left on the conv, which broke the layer's next call (and the
    conv's own use). What the code stores while traced is put back as it was."""
    conv = StashesAlpha()
    check_both_paths(conv)
    assert conv._alpha is None or isinstance(conv._alpha, torch.Tensor)


# --- x passes isinstance(x, Tensor): PyG's (x, x) pair ----------------------------------------------

X_PAIR = {
    "graphconv": lambda: pyg.GraphConv(D, 2),
    "graphconv_mean": lambda: pyg.GraphConv(D, 2, aggr="mean"),
    "leconv": lambda: pyg.LEConv(D, 2),
    "simpleconv_cat": lambda: pyg.SimpleConv(combine_root="cat"),
}


@pytest.mark.parametrize("name", X_PAIR)
def test_convs_that_pair_x_equal_pyg(name):
    conv = X_PAIR[name]()
    randomize_zeros(conv)
    check_both_paths(conv, in_channels=D)


class PairAtBothEnds(MessagePassing):
    """A pair given to propagate, read at both ends. ``typed=False`` leaves message's
    ``ptr`` unannotated, as PyG's tutorials write it: PyG then cannot generate the
    class's collect and falls back on ``MessagePassing._collect``, which reads the pair's
    second value at x_j under ``flow='target_to_source'`` (the generated code reads the
    first, whatever the flow)."""

    def __init__(self, flow, typed):
        super().__init__(aggr="add", flow=flow)
        self.typed = typed
        self.lin = nn.Linear(D, 2)
        self.root = nn.Linear(D, 2)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=(self.lin(x), self.root(x)))

    def message(self, x_j, x_i, index, ptr, size_i):
        return x_j * torch.sigmoid(x_i) + softmax(x_i, index, ptr, size_i)


class TypedPairAtBothEnds(PairAtBothEnds):
    def message(self, x_j, x_i, index: Tensor, ptr: Optional[Tensor], size_i: Optional[int]):
        return x_j * torch.sigmoid(x_i) + softmax(x_i, index, ptr, size_i)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
@pytest.mark.parametrize("typed", [True, False])
def test_a_pair_is_read_as_pygs_collect_reads_it(flow, typed):
    conv = (TypedPairAtBothEnds if typed else PairAtBothEnds)(flow, typed)
    # the two collects PyG has: generated for the typed class, its fallback for the other
    assert (type(conv).propagate is not MessagePassing.propagate) == typed
    check_both_paths(conv, in_channels=D)


class OwnEdgeUpdater(EdgeUpdater):
    def edge_updater(self, edge_index, **kwargs):
        return super().edge_updater(edge_index, **kwargs) * 2


def test_an_overridden_edge_updater_is_refused():
    """sarc computes edge_update per edge in message; an edge_updater of the class's own
    (which PyG runs) would silently not run."""
    with pytest.raises(ConversionError, match="OwnEdgeUpdater: an overridden edge_updater "
                                              "is not supported"):
        from_message_passing(OwnEdgeUpdater()).run(torch.randn(N, D), graph())


class Heads(MessagePassing):
    """[N, heads, C] node values (or messages): PyG gathers and aggregates them along
    ``node_dim``, which must be their rows (0) for sarc."""

    def __init__(self, node_dim=None, view_in="forward", aggr="add"):
        super().__init__(aggr=aggr, **({} if node_dim is None else {"node_dim": node_dim}))
        self.view_in = view_in
        self.lin = nn.Linear(D, 2 * N)

    def forward(self, x, edge_index):
        h = self.lin(x)
        if self.view_in == "forward":
            h = h.view(-1, N, 2)
        return self.propagate(edge_index, x=h).flatten(1)

    def message(self, x_j):
        return x_j.view(-1, N, 2) if self.view_in == "message" else x_j


@pytest.mark.parametrize("view_in, shown", [("forward", "node values \\(x_j\\)"),
                                            ("message", "messages")])
def test_node_dim_minus_two_on_values_of_three_dims_is_refused(view_in, shown):
    """PyG's default node_dim=-2 is the heads axis of [N, heads, C] values: given as many
    heads as nodes, PyG gathers them along the heads, and runs; sarc refuses rather than
    go along the rows. (PyG's aggregation of such messages fails where the heads are not
    the edges' count.)"""
    conv = Heads(view_in=view_in)
    if view_in == "forward":
        conv(torch.randn(N, D), graph())
    with pytest.raises(ConversionError, match=f"Heads: node_dim=-2 with {shown} of 3 "
                                              f"dimensions is not supported"):
        from_message_passing(conv, in_channels=D).run(torch.randn(N, D), graph())


@pytest.mark.parametrize("view_in", ["forward", "message"])
def test_node_dim_zero_on_values_of_three_dims_equals_pyg(view_in):
    conv = Heads(node_dim=0, view_in=view_in)
    check_both_paths(conv, in_channels=D)


@pytest.mark.parametrize("aggr", ["softmax", "powermean"])
def test_an_aggregation_per_channel_of_messages_of_three_dims_is_refused_as_pyg_does(aggr):
    from torch_geometric.nn import aggr as aggrs
    module = (aggrs.SoftmaxAggregation(learn=True, channels=2) if aggr == "softmax"
              else aggrs.PowerMeanAggregation(learn=True, channels=2))
    conv = Heads(node_dim=0, aggr=module)
    with pytest.raises(ValueError, match="two-dimensional"):
        conv(torch.randn(N, D), graph())
    with pytest.raises(ConversionError, match=f"Heads: {type(module).__name__}\\(channels=2\\)"
                                              f" of messages of 3 dimensions is not supported"):
        from_message_passing(conv, in_channels=D).run(torch.randn(N, D), graph())


def test_filmconv_with_its_split_equals_pyg():
    """FiLMConv splits a linear's output into a scale and a shift (Tensor.split): traced."""
    conv = pyg.FiLMConv(D, 6)
    randomize_zeros(conv)
    check_both_paths(conv, in_channels=D)


@pytest.mark.parametrize("edge_dim", [0, 3])
def test_cgconv_with_its_softplus_equals_pyg(edge_dim):
    """CGConv's message gates a softplus: traced (F.softplus), with and without edge
    features."""
    conv = pyg.CGConv(D, dim=edge_dim)
    randomize_zeros(conv)
    edge = torch.randn(graph().shape[1], edge_dim) if edge_dim else None
    options = {"in_channels": D, **({"edge_dim": edge_dim} if edge_dim else {})}
    check_both_paths(conv, edge, **options)


# --- 2. dropout after propagate is traced ----------------------------------------------------------

class DropAfter(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(D, 4)

    def forward(self, x, edge_index):
        out = self.propagate(edge_index, x=self.lin(x))
        return F.dropout(out, p=0.5, training=self.training)


class DropBefore(DropAfter):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=F.dropout(x, p=0.5, training=self.training))


def test_dropout_after_propagate_follows_the_mode():
    conv = DropAfter()
    ei, x = graph(), torch.randn(N, D)
    layer = from_message_passing(conv)
    conv.eval()
    layer.eval()
    check_same(lambda x: layer.run(x, ei), lambda x: conv(x, ei), conv, x)
    full = conv(x, ei).detach()
    layer.train()
    got = layer.run(x, ei).detach()
    kept = got != 0
    assert 0 < kept.sum() < got.numel()
    assert torch.allclose(got[kept], 2 * full[kept], atol=1e-5)


def test_dropout_before_propagate_is_refused():
    with pytest.raises(ConversionError, match="DropBefore: dropout in forward before propagate"):
        from_message_passing(DropBefore().eval()).run(torch.randn(N, D), graph())


class Centered(DropAfter):
    def forward(self, x, edge_index):
        x = x - x.mean(0)   # across all nodes
        return self.propagate(edge_index, x=self.lin(x))


class CenteredAfter(DropAfter):
    def forward(self, x, edge_index):
        out = self.propagate(edge_index, x=self.lin(x))
        return torch.stack([out, out], dim=0).sum(0)


@pytest.mark.parametrize("conv,op", [(Centered, "dim 0"),
                                     (CenteredAfter, "torch.stack(..., dim=0)")])
def test_forward_across_nodes_is_refused_as_across_nodes(conv, op):
    """x is a node value in the user's forward: the error says so (it said "the row axis of
    an edge value": sarc traces the forward at each end of an edge)."""
    with pytest.raises(DSLError) as e:
        from_message_passing(conv().eval()).run(torch.randn(N, D), graph())
    text = str(e.value)
    assert f"{conv.__name__}: {op}" in text, text
    assert "edge value" not in text and "dst value" not in text, text
    assert "across the nodes of the forward's values" in text and "before the conv" in text, text
    assert f"{Path(__file__)}:" in text, text


# --- 3. the aggregation is PyG's aggr_module, not the aggr attribute -------------------------------

class Sum(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(D, 2)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))


class SeveralAggregations(MessagePassing):
    """``aggr=[...]``: PyG's MultiAggregation, the aggregations concatenated (mode 'cat')."""

    def __init__(self, aggr, **kwargs):
        super().__init__(aggr=aggr, **kwargs)
        self.in_channels = D
        self.lin = nn.Linear(D, 2)
        self.out = nn.Linear(2 * len(aggr), 3)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j, x_i):
        return torch.tanh(x_j - 0.5 * x_i)

    def update(self, aggr_out):
        return self.out(aggr_out)


@pytest.mark.parametrize("aggr", [["mean", "max"], ["sum", "min", "mean"], ["mean", "std"],
                                  ["var", "softmax", "powermean"]], ids="-".join)
def test_several_aggregations_concatenated_equal_pyg(aggr):
    check_both_paths(SeveralAggregations(aggr))


@pytest.mark.parametrize("mode", ["sum", "mean", "max", "min", "logsumexp", "std", "var",
                                  "proj"])
@pytest.mark.parametrize("aggr", [["mean", "max"], ["sum", "min", "mean"], ["max", "min"]],
                         ids="-".join)
def test_several_aggregations_combined_equal_pyg(aggr, mode):
    """MultiAggregation's other modes: reduced over the aggregations as torch reduces a
    stack of them (ties of max / min, and a std of equal outputs: a node with one edge or
    none, take torch's gradients), or projected."""
    options = {"mode": mode}
    if mode == "proj":
        options["mode_kwargs"] = {"in_channels": 2, "out_channels": 4}
    conv = SeveralAggregations(aggr, aggr_kwargs=options)
    conv.out = nn.Linear(4 if mode == "proj" else 2, 3)
    check_both_paths(conv)


@pytest.mark.parametrize("aggr,options,shown", [
    (["mean", "max"], {"aggr_kwargs": {"mode": "attn", "mode_kwargs": {
        "in_channels": 2, "out_channels": 4, "num_heads": 2}}},
     "aggr=MultiAggregation([MeanAggregation, MaxAggregation], mode='attn')"),
    (["mean", "median"], {}, "aggr=MultiAggregation([MeanAggregation, MedianAggregation], "
                             "mode='cat')")], ids=["mode-attn", "median"])
def test_several_aggregations_sarc_has_not_are_refused(aggr, options, shown):
    with pytest.raises(ConversionError, match=re.escape(f"SeveralAggregations: {shown} is not "
                                                        f"supported")):
        from_message_passing(SeveralAggregations(aggr, **options))


def test_aggr_set_after_construction_is_what_pyg_uses():
    conv = Sum()
    conv.aggr = "mean"   # PyG keeps summing with aggr_module
    check_both_paths(conv)


# --- 4. errors name the conv and the construct; parameters given to propagate -----------------------

class ParamKwarg(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.w = nn.Parameter(torch.randn(D))

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x, w=self.w * 2)

    def message(self, x_j, w):
        return x_j * w


def test_a_parameter_given_to_propagate_equals_pyg():
    check_both_paths(ParamKwarg())


class EdgeNeeds(MessagePassing):
    def __init__(self, edge_dim=None):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin = nn.Linear(2, D)

    def forward(self, x, edge_index, edge_attr):
        return self.propagate(edge_index, x=x, e=edge_attr)

    def message(self, x_j, e):
        return x_j * self.lin(e)


def test_as_conv_takes_from_message_passing_options():
    conv = EdgeNeeds()
    check_both_paths(conv, torch.randn(graph().size(1), 2), edge_dim=2)
    with pytest.raises(ConversionError, match="edge_index of unknown width|edge_attr of unknown"):
        as_conv(EdgeNeeds())
    with pytest.raises(ConversionError, match="as_conv: in_channels= and edge_dim= are for"):
        as_conv(from_message_passing(Sum()), in_channels=D)


class NoneWeight(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D

    def forward(self, x, edge_index, edge_weight=None):
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_j, edge_weight):
        return edge_weight.view(-1, 1) * x_j


class NodeKwarg(ParamKwarg):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x, w=x)


class EdgeAtAnEnd(EdgeNeeds):
    def message(self, x_j, e_j):
        return x_j * self.lin(e_j)


class ParamAtAnEnd(ParamKwarg):
    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x, w=self.w.unsqueeze(0))

    def message(self, x_j, w_j):
        return x_j * w_j


REFUSED = {
    "message_raises": (lambda: NoneWeight(), {},
                       r"^NoneWeight\.message cannot be traced at .*: AttributeError"),
    "node_values_unsuffixed": (lambda: NodeKwarg(), {},
                               r"^NodeKwarg: message argument 'w' holding node values"),
    "edge_values_at_an_end": (lambda: EdgeAtAnEnd(), {"edge_dim": 2},
                              r"^EdgeAtAnEnd: message argument 'e_j' on edge values"),
    "param_at_an_end": (lambda: ParamAtAnEnd(), {},
                        r"^ParamAtAnEnd: message argument 'w_j' on values that are not"),
    "pointnet_signature": (lambda: pyg.PointNetConv(nn.Linear(D + 3, 2)), {"in_channels": D},
                           r"^PointNetConv: forward\(x, pos, edge_index\), edge_index not its "
                           r"second argument"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_cannot_be_modelled_is_a_clear_error(name):
    make, options, message = REFUSED[name]
    ei = graph()
    extra = [torch.randn(ei.size(1), 2)] if "edge_dim" in options else []
    with pytest.raises(ConversionError, match=message):
        from_message_passing(make(), **options).run(torch.randn(N, D), ei, *extra)


# --- graph code in forward: run on the real graph when the inputs are prepared ------------------

class TutorialGCN(MessagePassing):
    """PyG's tutorial GCN ("Creating Message Passing Networks"), as written there."""

    def __init__(self, in_channels, out_channels):
        super().__init__(aggr="add")
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.randn(out_channels))

    def forward(self, x, edge_index):
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        x = self.lin(x)
        row, col = edge_index
        deg = degree(col, x.size(0), dtype=x.dtype)
        deg_inv_sqrt = deg.pow(-0.5)
        deg_inv_sqrt[deg_inv_sqrt == float("inf")] = 0
        norm = deg_inv_sqrt[row] * deg_inv_sqrt[col]
        out = self.propagate(edge_index, x=x, norm=norm)
        out = out + self.bias
        return out

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_tutorial_gcn_equals_pyg(dtype):
    torch.manual_seed(0)
    conv = TutorialGCN(D, 4).to(dtype)
    ei, x = graph(), torch.randn(N, D, dtype=dtype)
    for run in (lambda x: from_message_passing(conv, in_channels=D).run(x, ei),
                lambda x: as_conv(conv, in_channels=D)(x, ei)):
        check_same(run, lambda x: conv(x, ei), conv, x)
    layer = from_message_passing(conv, in_channels=D)
    layer.prepare(ei, N)
    assert layer.graph_code == (False, (("norm", ()),))   # an edge feature of its name


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8)),
                                   max_size=30), st.integers(0, 2**16))
def test_the_tutorial_gcn_equals_pyg_on_random_graphs(n, edges, seed):
    """Any graph: no edges, self loops, duplicates, nodes without in-edges."""
    edges = [(u % n, v % n) for u, v in edges]
    ei = torch.tensor(edges, dtype=torch.long).t().reshape(2, -1)
    torch.manual_seed(seed)
    conv = TutorialGCN(D, 2)
    x = torch.randn(n, D)
    got = as_conv(conv, in_channels=D)(x, ei)
    torch.testing.assert_close(got, conv(x, ei), rtol=1e-5, atol=1e-6)


class NormalizedEdges(MessagePassing):
    """Graph code (a mean's weights) beside an edge feature that forward transforms."""

    def __init__(self):
        super().__init__(aggr="add")
        self.in_channels = D
        self.lin_edge = nn.Linear(2, D)

    def forward(self, x, edge_index, edge_attr):
        deg = degree(edge_index[1], x.size(0), dtype=x.dtype).clamp(min=1)
        norm = deg.reciprocal()[edge_index[1]]
        return self.propagate(edge_index, x=x, e=self.lin_edge(edge_attr), norm=norm)

    def message(self, x_j, e, norm):
        return norm.view(-1, 1) * torch.relu(x_j + e)


def test_graph_code_beside_a_traced_edge_feature():
    torch.manual_seed(0)
    conv = NormalizedEdges()
    check_both_paths(conv, torch.randn(graph().size(1), 2), edge_dim=2)


class LoopsAndEdgeFeature(NormalizedEdges):
    def forward(self, x, edge_index, edge_attr):
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        return self.propagate(edge_index, x=x, e=self.lin_edge(edge_attr), norm=x[:, 0])


def test_graph_code_that_adds_edges_beside_an_edge_feature_is_refused():
    """The edge feature has a row per edge given; the graph propagate is given has more."""
    with pytest.raises(ConversionError, match=r"^LoopsAndEdgeFeature: an edge feature "
                                              r"edge_attr with a forward that changes the "
                                              r"edges \(9 edges given, 16 given to propagate\)"):
        as_conv(LoopsAndEdgeFeature(), edge_dim=2)(torch.randn(N, D), graph(),
                                                    torch.randn(graph().size(1), 2))


def test_a_graph_cached_by_the_conv_is_refused():
    """A traced conv with cached=True reads, after PyG's own call, the graph it kept."""
    conv = TanhGCN(D, 2, cached=True)
    x, ei = torch.randn(N, D), graph()
    conv(x, ei)
    with pytest.raises(ConversionError, match=r"^TanhGCN: a forward that changes edge_index "
                                              r"before propagate"):
        as_conv(conv)(x, ei)


class EmptyShortcut(MessagePassing):
    """A forward that returns before propagate on a graph without edges."""

    def __init__(self):
        super().__init__(aggr="add")
        self.lin = nn.Linear(D, 4)
        self._normalize = True   # a private option its graph code reads

    def forward(self, x, edge_index):
        if edge_index.numel() == 0:
            return self.lin(x)
        deg = degree(edge_index[1], x.size(0)).clamp(min=1)   # float32, whatever x's dtype
        norm = deg[edge_index[1]].reciprocal() if self._normalize else \
            torch.ones_like(deg[edge_index[1]])
        return self.propagate(edge_index, x=self.lin(x), norm=norm)

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


def test_a_forward_that_returns_before_propagate_on_one_graph_is_refused_on_that_graph():
    """The empty graph is refused; the graphs before and after it still equal PyG (the
    first refusal kept the layer refused for good)."""
    torch.manual_seed(0)
    conv = EmptyShortcut()
    layer = from_message_passing(conv, in_channels=D)
    x = torch.randn(N, D)
    torch.testing.assert_close(layer.run(x, graph()), conv(x, graph()))
    with pytest.raises(ConversionError, match=r"^EmptyShortcut: a forward that returns before "
                                              r"propagate on this graph \(7 nodes, 0 edges\)"):
        layer.run(x, torch.zeros(2, 0, dtype=torch.long))
    torch.testing.assert_close(layer.run(x, graph()), conv(x, graph()))


def test_a_float32_graph_value_of_a_float64_conv_is_promoted_as_torch_does():
    torch.manual_seed(0)
    conv = EmptyShortcut().double()
    x = torch.randn(N, D, dtype=torch.float64)
    for run in (from_message_passing(conv, in_channels=D).run,
                as_conv(conv, in_channels=D)):
        check_same(lambda x: run(x, graph()), lambda x: conv(x, graph()), conv, x)


def test_a_private_option_the_graph_code_reads_prepares_the_graph_again():
    torch.manual_seed(0)
    conv = EmptyShortcut()
    wrapped, x = as_conv(conv, in_channels=D), torch.randn(N, D)
    torch.testing.assert_close(wrapped(x, graph()), conv(x, graph()))
    conv._normalize = False
    torch.testing.assert_close(wrapped(x, graph()), conv(x, graph()))


def test_a_cached_traced_conv_runs_its_first_call_through_as_conv():
    """as_conv stored PyG's cache on the conv before its first trace, which then read the
    cached tensors as constants."""
    torch.manual_seed(0)
    conv = TanhGCN(D, 2, cached=True)
    x = torch.randn(N, D)
    torch.testing.assert_close(as_conv(conv)(x, graph()), conv(x, graph()))


def test_the_node_count_is_no_number_outside_the_graph_code():
    """It was the stand-in graph's (4) wherever it was read: a branch on it took the
    stand-in's way."""
    class Branches(TutorialGCN):
        def update(self, aggr_out, x):
            return aggr_out * 3 if x.size(0) == 4 else aggr_out

    with pytest.raises(DSLError, match=r"the node count \(x\.size\(0\)\) is not known while "
                                       r"sarc traces the conv"):
        as_conv(Branches(D, 2), in_channels=D)(torch.randn(N, D), graph())


class OnesOfX(MessagePassing):
    """Edge weights made with x's dtype (``x.new_ones(E)``), summed per node by scatter."""

    def __init__(self):
        super().__init__(aggr="add")
        self.lin = nn.Linear(D, 4)

    def forward(self, x, edge_index):
        from torch_geometric.utils import scatter
        edge_index, _ = add_self_loops(edge_index, num_nodes=x.size(0))
        w = x.new_ones(edge_index.size(1))
        deg = scatter(w, edge_index[1], 0, dim_size=x.size(0), reduce="sum")
        return self.propagate(edge_index, x=self.lin(x), norm=deg.reciprocal()[edge_index[1]])

    def message(self, x_j, norm):
        return norm.view(-1, 1) * x_j


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tensor_made_like_x_is_graph_code(dtype):
    """x.new_ones(E) takes x's dtype, none of its values: it was refused as x meeting the
    graph code."""
    torch.manual_seed(0)
    conv = OnesOfX().to(dtype)
    x = torch.randn(N, D, dtype=dtype)
    for run in (from_message_passing(conv, in_channels=D).run, as_conv(conv, in_channels=D)):
        check_same(lambda x: run(x, graph()), lambda x: conv(x, graph()), conv, x)


def test_a_tensor_sized_by_the_node_count_beside_graph_code_is_refused_at_its_line():
    """With graph code, x.size(0) sizes the stand-in graph's tensors: one used with x is
    refused, saying so, not taken for a constant."""
    class OnesBesideLoops(TutorialGCN):
        def update(self, aggr_out, x):
            return aggr_out + torch.ones(x.size(0), aggr_out.size(-1))  # ERR:stand-in

    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.endswith("# ERR:stand-in"))
    with pytest.raises(DSLError, match=rf"test_pyg_tracing.py:{line} .*a tensor of shape "
                                       rf"\[4, 2\] sized by the node count \(x\.size\(0\)\)"):
        as_conv(OnesBesideLoops(D, 2), in_channels=D)(torch.randn(N, D), graph())


class _RelationScaled(MessagePassing):
    """A user's relation-typed conv: ``x_j * scale[edge_type]``, the edge type an id."""

    def __init__(self, d: int, relations: int):
        super().__init__(aggr="add")
        self.in_channels = d
        self.scale = nn.Parameter(torch.randn(relations, d))

    def forward(self, x, edge_index, edge_type):
        return self.propagate(edge_index, x=x, edge_type=edge_type)

    def message(self, x_j, edge_type):
        return x_j * self.scale[edge_type]


def test_an_integer_edge_feature_imported_as_an_index_equals_pyg():
    """Relation ids per edge, imported with ``edge_dim=sarc.INDEX``: output and gradients
    equal PyG's; imported as a float feature (``edge_dim=()``) they are refused, saying so
    (they were cast to float and refused at the table lookup)."""
    import sarc
    conv = _RelationScaled(4, 3)
    x = torch.randn(8, 4)
    ei = torch.tensor([[0, 1, 2, 3, 0, 4, 4, 2], [1, 2, 3, 0, 2, 1, 1, 2]])
    et = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    xs, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = as_conv(conv, edge_dim=sarc.INDEX)(xs, ei, et)
    want = conv(xp, ei, et)
    torch.testing.assert_close(got, want)
    cot = torch.randn(want.shape)
    (gs,) = torch.autograd.grad((got * cot).sum(), [xs])
    gp, gw = torch.autograd.grad((want * cot).sum(), [xp, conv.scale])
    torch.testing.assert_close(gs, gp)
    conv.scale.grad = None
    (as_conv(conv, edge_dim=sarc.INDEX)(x, ei, et) * cot).sum().backward()
    torch.testing.assert_close(conv.scale.grad, gw)
    with pytest.raises(ConversionError, match=r"edge_type of torch.int64 \(ids.*edge_dim=sarc"):
        as_conv(conv, edge_dim=())(x, ei, et)
