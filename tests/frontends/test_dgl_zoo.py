"""More of DGL 2.1's convs through sarc (``sarc.frontends.dgl``; .venv-dgl): those that need
torch functions beyond arithmetic (``F.normalize``, ``Tensor.square``, ``torch.stack``,
``Tensor.tile``, ``nn.GRUCell``), several node outputs, and DGL's minibatch idiom on a block.

Each equals the DGL module on the DGL graph: every output, the input and parameter
gradients (``max|sarc - dgl| <= 1e-5 * max|dgl|``, float32).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("dgl")

import dgl  # noqa: E402
from dgl.nn.pytorch import (AGNNConv, APPNPConv, EGATConv, EGNNConv, GATConv,  # noqa: E402
                            GatedGraphConv, GraphConv, HGTConv, RelGraphConv, SAGEConv)

from dgl_support import randomized  # noqa: E402
import sarc  # noqa: E402
import sarc.frontends.dgl  # noqa: E402
from sarc.errors import DSLError  # noqa: E402
from sarc.frontends.dgl import from_dgl_module  # noqa: E402

N, IN = 12, 5


def _edges(self_loops):
    """30 random edges among nodes 0..8 (9..11 without edges), 4 of them doubled; with
    ``self_loops`` None, those from a node to itself dropped (EGNNConv's coordinate
    difference is 0 there, and the gradient of its norm NaN, in DGL)."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 9, (30,), generator=gen)
    dst = torch.randint(0, 9, (30,), generator=gen)
    src, dst = torch.cat([src, src[:4]]), torch.cat([dst, dst[:4]])
    if self_loops is None:
        src, dst = src[src != dst], dst[src != dst]
    if self_loops:
        src, dst = torch.cat([src, torch.arange(N)]), torch.cat([dst, torch.arange(N)])
    return src, dst


def _close(got, want, what):
    assert got is not None and want is not None, what
    # (GATConv's attn_r gradient cancels to nearly 0 over each destination's softmax)
    scale = max(float(want.abs().max()), 1e-2)
    err = float((got - want).abs().max())
    assert err <= 1e-5 * scale, f"{what}: max |sarc - dgl| = {err:.3g}, max |dgl| = {scale:.3g}"


def _inputs(decl, rows, gen):
    out = {}
    for k, d in decl.items():
        if d is sarc.INDEX:
            out[k] = torch.randint(0, 2 if k == "ntype" else 3, (rows,), generator=gen)
        else:
            shape = (d,) if isinstance(d, int) else tuple(d)
            out[k] = torch.rand(rows, *shape, generator=gen) + 0.1
    return out


def _grad(x):
    return x.clone().requires_grad_(True) if x.is_floating_point() else x


def _equals_dgl(module, node, edge=None, self_loops=False):
    """``module`` through sarc (``from_dgl_module``) equals ``module`` on the DGL graph: every
    output, the float inputs' and every parameter's gradient."""
    torch.manual_seed(0)
    module = randomized(module)
    ref = copy.deepcopy(module)
    src, dst = _edges(self_loops)
    gen = torch.Generator().manual_seed(1)
    feats = {**_inputs(node, N, gen), **_inputs(edge or {}, src.numel(), gen)}
    mine = {k: _grad(v) for k, v in feats.items()}
    theirs = {k: _grad(v) for k, v in feats.items()}
    layer = from_dgl_module(module, node=node, edge=edge or {})
    out = layer(sarc.Graph.from_edges(src, dst, N), **mine)
    want = ref(dgl.graph((src, dst), num_nodes=N), **theirs)
    outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
    assert isinstance(out, tuple) == isinstance(want, tuple) and len(outs) == len(wants)
    loss_sarc = loss_dgl = 0.0
    for i, (o, w) in enumerate(zip(outs, wants)):
        assert o.shape == w.shape
        _close(o, w, f"output {i}")
        cot = torch.randn(w.shape, generator=gen)
        loss_sarc, loss_dgl = loss_sarc + (o * cot).sum(), loss_dgl + (w * cot).sum()
    loss_sarc.backward()
    loss_dgl.backward()
    for k, v in theirs.items():
        if v.is_floating_point():
            _close(mine[k].grad, v.grad, f"gradient of {k}")
    grads = dict(module.named_parameters())
    for k, p in ref.named_parameters():
        _close(grads[k].grad, p.grad, f"gradient of {k}")


CASES = {
    # F.normalize of the features, a learned temperature
    "agnn": (lambda: AGNNConv(learn_beta=True), {"feat": IN}, None, True),
    "agnn-no-loops": (lambda: AGNNConv(init_beta=0.5, allow_zero_in_degree=True),
                      {"feat": IN}, None, False),
    # edge_weight.tile(1, heads, 1).transpose(0, 2): [E] -> [E, heads, 1]
    "gat-edge-weight": (lambda: GATConv(IN, 3, 2, allow_zero_in_degree=True), {"feat": IN},
                        {"edge_weight": ()}, False),
    # torch.stack of per-head scores over the heads axis, typed linears, W[etype]
    "hgt": (lambda: HGTConv(IN, 2, 2, 2, 3, dropout=0.0), {"x": IN, "ntype": sarc.INDEX},
            {"etype": sarc.INDEX}, False),
    "hgt-norm": (lambda: HGTConv(IN, 3, 2, 2, 3, dropout=0.0, use_norm=True),
                 {"x": IN, "ntype": sarc.INDEX}, {"etype": sarc.INDEX}, False),
    # Tensor.square of coordinate differences; two node outputs (h, x)
    "egnn": (lambda: EGNNConv(IN, 6, 4), {"node_feat": IN, "coord_feat": 3}, None, None),
    "egnn-edge-feat": (lambda: EGNNConv(IN, 6, 4, edge_feat_size=2),
                       {"node_feat": IN, "coord_feat": 3}, {"edge_feat": 2}, None),
    # nn.GRUCell (torch.gru_cell) of the aggregate and the state, one step; the input
    # padded to the output's width by new_zeros(N, out - in), a piece of 0 columns
    "gated-graph": (lambda: GatedGraphConv(IN, 7, 1, 1), {"feat": IN}, None, True),
    "gated-graph-same-width": (lambda: GatedGraphConv(IN, IN, 1, 1), {"feat": IN}, None, True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_equals_dgl(name):
    make, node, edge, self_loops = CASES[name]
    _equals_dgl(make(), node, edge, self_loops)


# --- called on a sarc graph after patch() ------------------------------------------------------

@pytest.fixture
def patched():
    sarc.frontends.dgl.patch()
    yield
    sarc.frontends.dgl.unpatch()


def test_a_tuple_of_node_outputs_is_a_tuple_after_patch(patched):
    torch.manual_seed(0)
    module = randomized(EGNNConv(IN, 6, 4))
    src, dst = _edges(None)
    h, x = torch.randn(N, IN), torch.randn(N, 3)
    got = module(sarc.frontends.dgl.from_dgl(dgl.graph((src, dst), num_nodes=N)), h, x)
    want = module(dgl.graph((src, dst), num_nodes=N), h, x)
    assert isinstance(got, tuple) and len(got) == 2
    for i in range(2):
        _close(got[i], want[i], f"output {i}")


def test_a_patched_convs_hooks_run_once_per_call(patched):
    """The conv's call ran its hooks, and the trace of its forward ran them again: a forward
    hook scaling by 3 scaled sarc's output by 9, and a pre-hook was called twice."""
    torch.manual_seed(0)
    src, dst = _edges(True)
    g, x = dgl.graph((src, dst), num_nodes=N), torch.randn(N, IN)
    module, calls = randomized(GraphConv(IN, 4)), []
    module.register_forward_pre_hook(lambda m, inputs: calls.append(1))
    module.register_forward_hook(lambda m, inputs, out: out * 3)
    want = module(g, x)
    assert len(calls) == 1
    got = module(sarc.frontends.dgl.from_dgl(g), x)
    assert len(calls) == 2
    _close(got, want, "output")
    _close(module(sarc.frontends.dgl.from_dgl(g), x), want, "output of a later call")
    assert len(calls) == 3
    held = from_dgl_module(module, node={"feat": IN})   # the module held: its hooks traced
    _close(held(sarc.frontends.dgl.from_dgl(g), x), want, "output of the held module")


class _ScaledGraphConv(GraphConv):
    """A user's subclass whose forward wraps DGL's: ``super().forward`` of scaled inputs."""

    def forward(self, graph, feat):
        return super().forward(graph, feat * 2.0) + 1.0


class _MeanHeadsGAT(GATConv):
    def forward(self, graph, feat):
        return super().forward(graph, feat).mean(1)


@pytest.mark.parametrize("make", [lambda: _ScaledGraphConv(IN, 4),
                                  lambda: _MeanHeadsGAT(IN, 3, num_heads=2)],
                         ids=["scaled-graphconv", "mean-heads-gat"])
def test_a_subclass_around_dgls_forward_runs_its_own_code_once(patched, make):
    """Its forward ran outside and again inside the trace of the module's forward: the
    scaling twice (GraphConv), the mean of heads twice (GAT: a wrong shape). The layer
    traces the forward of DGL's class the call reached, alone."""
    torch.manual_seed(0)
    src, dst = _edges(True)
    g, x = dgl.graph((src, dst), num_nodes=N), torch.randn(N, IN)
    module = randomized(make())
    want = module(g, x)
    _close(module(sarc.frontends.dgl.from_dgl(g), x), want, "output")


class _PatchedNet(nn.Module):
    """A GraphConv and a 2-round APPNPConv, their sarc layers made at their first call."""

    def __init__(self):
        super().__init__()
        self.conv = GraphConv(IN, 4)
        self.prop = APPNPConv(2, 0.1)

    def forward(self, g, x):
        return self.prop(g, self.conv(g, x))


def _held(model) -> list:
    return [layer for m in model.modules() if getattr(type(m).forward, "_sarc_held", None)
            for _, layer in type(m).forward._sarc_held(m)]


def test_the_backend_a_patched_model_is_placed_on_reaches_the_layers_its_calls_make(patched):
    """``placed(model, backend=)`` (``sarc train --backend``) before the convs made their
    layers: the layers they make at their first call compile for that backend, and a later
    ``placed`` moves them."""
    from sarc.backends.triton_backend import TritonUnavailable
    from sarc.training.device import placed
    torch.manual_seed(0)
    model = placed(_PatchedNet(), backend="triton")
    g = sarc.frontends.dgl.from_dgl(dgl.graph(_edges(True), num_nodes=N))
    for conv, x in ((model.conv, torch.randn(N, IN)), (model.prop, torch.randn(N, 4))):
        try:
            conv(g, x)
        except TritonUnavailable:  # this environment's Triton: the layers were made, for it
            pass
    held = _held(model)
    assert len(held) == 3 and {layer._sarc_backend for layer in held} == {"triton"}
    placed(model, backend="torch")
    assert {layer._sarc_backend for layer in _held(model)} == {"torch"}
    model(g, torch.randn(N, IN))


def test_an_edge_output_is_refused_by_name(patched):
    g = sarc.frontends.dgl.from_dgl(dgl.graph(_edges(True), num_nodes=N))
    module = EGATConv(IN, 2, 3, 3, 2)
    with pytest.raises(DSLError, match=r"EGATConv: forward returned an edge value \[2, 3\] as "
                                       r"output 2 of 2, not a value per destination node"):
        module(g, torch.randn(N, IN), torch.randn(g.num_edges, 2))


def _block():
    """A block of 9 source nodes, the first 5 of them its destinations."""
    g = dgl.graph(_edges(True), num_nodes=N)
    return dgl.to_block(dgl.in_subgraph(g, torch.arange(5)), dst_nodes=torch.arange(5))


def _pair_equals_dgl(module, call):
    """``call(block, (h, h[:num_dst]))`` through sarc equals ``module`` on DGL's block: the
    output and h's gradient. (sarc's block, h, num_dst, DGL's output) for further checks."""
    block = _block()
    x = torch.randn(block.num_src_nodes(), IN)
    mine, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    n = block.num_dst_nodes()
    sblock = sarc.frontends.dgl.from_dgl(block)
    out = call(sblock, (mine, mine[:n]))
    want = module(block, (theirs, theirs[:n]))
    _close(out, want, "output")
    cot = torch.randn(want.shape)
    (out * cot).sum().backward()
    (want * cot).sum().backward()
    _close(mine.grad, theirs.grad, "input gradient")
    return sblock, x, n, want


@pytest.mark.parametrize("make", [lambda: SAGEConv(IN, 3, "mean"), lambda: GraphConv(IN, 3),
                                  lambda: GATConv(IN, 3, 2), lambda: AGNNConv()],
                         ids=["sage", "graphconv", "gat", "agnn"])
def test_the_minibatch_pair_on_a_block_equals_dgl(patched, make):
    """``conv(block, (h, h[:block.num_dst_nodes()]))``, DGL's minibatch idiom: h's first rows
    are the destinations, as sarc reads them."""
    torch.manual_seed(0)
    module = randomized(make())
    sblock, x, n, want = _pair_equals_dgl(module, module)
    # DGL's names of the block's sizes, as a DGL user's loop slices with them
    assert (sblock.num_src_nodes(), sblock.num_dst_nodes()) == (x.shape[0], n)
    # equal values that are not a view of h are h's destinations too
    _close(module(sblock, (x, x[:n].clone())), want, "a copy")


@pytest.mark.parametrize("by", ["keyword", "position"])
def test_the_minibatch_pair_through_from_dgl_module_equals_dgl(by):
    """The same idiom on a layer of ``from_dgl_module``: the pair is h, as after ``patch()``
    (it was refused as a feature that is no tensor)."""
    torch.manual_seed(0)
    module = randomized(SAGEConv(IN, 3, "mean"))
    layer = from_dgl_module(copy.deepcopy(module), node={"feat": IN})
    sblock, x, n, _ = _pair_equals_dgl(module, lambda g, pair: layer(g, feat=pair)
                                       if by == "keyword" else layer(g, pair))
    with pytest.raises(DSLError, match="pass h_src alone"):
        layer(sblock, feat=(x, torch.randn(n, IN)))


def test_the_pair_of_one_tensor_on_a_graph_equals_dgl(patched):
    """``conv(g, (h, h))`` on a graph, h taking a gradient: it was refused as an h_dst that
    does not carry h_src's gradient, though it is h_src."""
    torch.manual_seed(0)
    module = randomized(SAGEConv(IN, 3, "mean"))
    g = dgl.graph(_edges(True), num_nodes=N)
    x = torch.randn(N, IN)
    mine, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out = module(sarc.frontends.dgl.from_dgl(g), (mine, mine))
    want = module(g, (theirs, theirs))
    _close(out, want, "output")
    out.sum().backward()
    want.sum().backward()
    _close(mine.grad, theirs.grad, "input gradient")


@pytest.mark.parametrize("pair, message", [
    (lambda x, n: (x, x[1:n + 1]), r"h_dst's values differ from h_src\[:5\]"),
    (lambda x, n: (x, x[:n + 1]), r"h_dst is not h_src\[:5\] \(its shape is not \[5, 5\]\)"),
    (lambda x, n: (x, x[:n].clone().requires_grad_()), "a separate tensor that takes a gradient"),
    # h takes a gradient that h_dst does not carry: DGL gives h none through h_dst
    (lambda x, n: (x.requires_grad_(), x[:n].detach()), "does not carry h_src's gradient"),
    (lambda x, n: (x.requires_grad_(), x[:n].detach().clone()), "does not carry h_src's gradient"),
    (lambda x, n: (x.requires_grad_(), x[:n].clone()), "does not carry h_src's gradient"),
])
def test_a_pair_that_is_not_the_blocks_destinations_is_refused_in_one_line(patched, pair,
                                                                          message):
    block = _block()
    x = torch.randn(block.num_src_nodes(), IN)
    with pytest.raises(DSLError, match=message) as err:
        SAGEConv(IN, 3, "mean")(sarc.frontends.dgl.from_dgl(block),
                                pair(x, block.num_dst_nodes()))
    text = str(err.value)
    assert "pass h_src alone" in text and "tensor(" not in text
    # the problem, and the user's call (its two lines)
    assert len(text.splitlines()) == 3 and text.splitlines()[2].strip().startswith("pair(x,")


@pytest.mark.parametrize("rows", [N, 4])
def test_an_external_weight_is_refused_with_what_to_write(patched, rows):
    """GraphConv(weight=False)(g, x, weight=W): never W read as a node input, even when its
    row count is the node count."""
    g = sarc.frontends.dgl.from_dgl(dgl.graph(_edges(True), num_nodes=N))
    with pytest.raises(DSLError, match=r"GraphConv: an external weight argument .* not "
                                       r"supported .*conv\(g, x @ W\)"):
        GraphConv(rows, 3, weight=False)(g, torch.randn(N, rows), weight=torch.randn(rows, 3))


_ETYPE = torch.arange(_edges(True)[0].numel()) % 2


@pytest.mark.parametrize("make, call", [
    (lambda: GATConv(IN, 3, 2), lambda c, g, x: c(g, x, get_attention=False)),
    (lambda: GraphConv(IN, 3), lambda c, g, x: c(g, x, None, None)),
    (lambda: RelGraphConv(IN, 3, 2), lambda c, g, x: c(g, x, _ETYPE, presorted=False))])
def test_a_default_argument_given_explicitly_is_the_default(patched, make, call):
    """``get_attention=False`` and ``presorted=False``, DGL's defaults, were refused as
    "tensor arguments only" on a sarc graph."""
    torch.manual_seed(0)
    conv = randomized(make())
    dg = dgl.graph(_edges(True), num_nodes=N)
    x = torch.randn(N, IN)
    want = call(conv, dg, x)
    _close(call(conv, sarc.frontends.dgl.from_dgl(dg), x), want, "output")


def test_relgraphconvs_presorted_is_dgls_alone(patched):
    """``presorted=True`` says the edges come sorted by type, which only DGL's kernels
    read: it was refused as a non-tensor argument."""
    torch.manual_seed(0)
    src, dst = _edges(True)
    order = torch.argsort(_ETYPE, stable=True)
    src, dst, etype = src[order], dst[order], _ETYPE[order]
    conv = randomized(RelGraphConv(IN, 3, 2))
    x = torch.randn(N, IN)
    want = conv(dgl.graph((src, dst), num_nodes=N), x, etype, presorted=True)
    got = conv(sarc.Graph.from_edges(src, dst, N), x, etype, presorted=True)
    _close(got, want, "output")


def test_another_value_than_the_default_is_refused(patched):
    g = sarc.frontends.dgl.from_dgl(dgl.graph(_edges(True), num_nodes=N))
    with pytest.raises(DSLError, match=r"GATConv: argument get_attention=True on a sarc graph"):
        GATConv(IN, 3, 2)(g, torch.randn(N, IN), get_attention=True)


def test_ones_over_the_edges_is_traced(patched):
    """APPNPConv's th.ones(g.num_edges(), 1): one round (k=1, traced) equals DGL, and so do
    more rounds (a layer per round, sarc.frontends.dgl_rounds)."""
    torch.manual_seed(0)
    src, dst = _edges(True)
    g = dgl.graph((src, dst), num_nodes=N)
    x = torch.randn(N, IN)
    for k in (1, 2):
        _close(APPNPConv(k, 0.2)(sarc.frontends.dgl.from_dgl(g), x), APPNPConv(k, 0.2)(g, x),
               f"output, k={k}")


class OnesNotRows(torch.nn.Module):
    def forward(self, g, feat):
        return feat * torch.ones(3, g.num_edges()).sum()


class FullOverNodes(torch.nn.Module):
    def forward(self, g, feat):
        return feat * torch.full((g.num_dst_nodes(), 1), 2.5) + torch.zeros(g.num_src_nodes(), IN)


def test_ones_zeros_and_full_over_a_graph_size():
    src, dst = _edges(True)
    x = torch.randn(N, IN)
    layer = from_dgl_module(FullOverNodes(), node={"feat": IN})
    torch.testing.assert_close(layer(sarc.Graph.from_edges(src, dst, N), x), x * 2.5)
    layer = from_dgl_module(OnesNotRows(), node={"feat": IN})
    with pytest.raises(DSLError, match=r"OnesNotRows: torch.ones\(3, E\): a row count .* is "
                                       r"the first size, the rows"):
        layer(sarc.Graph.from_edges(src, dst, N), x)


def test_a_batch_norm_inside_a_conv_is_refused_by_name():
    from dgl.nn.pytorch import EdgeConv
    layer = from_dgl_module(EdgeConv(IN, 3, batch_norm=True), node={"feat": IN})
    with pytest.raises(DSLError, match=r"EdgeConv: nn.BatchNorm1d reads self.training.* "
                                       r"DGL EdgeConv\(batch_norm=False\)"):
        layer(sarc.Graph.from_edges(*_edges(True), N), torch.randn(N, IN))
