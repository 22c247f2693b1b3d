"""DGL 2.1's nn modules, unmodified, through sarc's compiler (``sarc.frontends.dgl``; .venv-dgl).

One process: the imported layer's output, every parameter gradient and the input
gradients equal the DGL module's own (``max|sarc - dgl| <= 1e-5 * max|dgl|``, float32)
on a small random graph with isolated nodes and multi-edges (self loops added where
the module refuses nodes without in-edges). Distributed: a step on P real workers
(``sarc.distributed.DistGraph`` over ``sarc.partition.partition_graph``'s parts)
equals the one-process step.
"""
from __future__ import annotations

import copy
import datetime

import pytest
import torch

pytest.importorskip("dgl")

import dgl  # noqa: E402
import dgl.function as fn  # noqa: E402
from dgl.nn.functional import edge_softmax  # noqa: E402
from dgl.nn.pytorch import (APPNPConv, DotGatConv, EdgeConv, GATConv,  # noqa: E402
                            GATv2Conv, GINConv, GraphConv, RelGraphConv, SAGEConv, SGConv,
                            TAGConv)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from dgl_support import randomized  # noqa: E402
import sarc  # noqa: E402
import sarc.frontends.dgl  # noqa: E402
from sarc.errors import DSLError  # noqa: E402
from sarc.frontends.dgl import from_dgl_module  # noqa: E402

N, IN, R = 15, 6, 3


def _edges(self_loops: bool, seed: int = 0):
    """40 random edges among nodes 0..11 (12..14 isolated), 5 of them doubled."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 12, (40,), generator=gen)
    dst = torch.randint(0, 12, (40,), generator=gen)
    src, dst = torch.cat([src, src[:5]]), torch.cat([dst, dst[:5]])
    if self_loops:
        src, dst = torch.cat([src, torch.arange(N)]), torch.cat([dst, torch.arange(N)])
    return src, dst


def _edge_inputs(names, num_edges, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in names:
        if name == "etypes":
            out[name] = torch.randint(0, R, (num_edges,), generator=gen)
        elif name == "norm":
            out[name] = torch.rand(num_edges, 1, generator=gen) + 0.1
        else:  # an edge weight, [E]
            out[name] = torch.rand(num_edges, generator=gen) + 0.1
    return out


def _gin_mlp():
    return nn.Sequential(nn.Linear(IN, 8), nn.ReLU(), nn.Linear(8, 4))


class MaskedReduce(nn.Module):
    """A reduce UDF that reads node data and makes -inf and inf from an empty mailbox: DGL
    calls it on the nodes with in-edges only and gives the others 0."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, g, feat):
        with g.local_scope():
            h = self.lin(feat)
            g.srcdata["h"] = h
            g.dstdata["h0"] = h[:g.num_dst_nodes()]
            g.update_all(fn.copy_u("h", "m"), lambda nodes: {
                "o": torch.log(nodes.mailbox["m"].sum(1) ** 2) + nodes.data["h0"] * self.bias,
                "r": 1.0 / nodes.mailbox["m"].max(1).values})
            return g.dstdata["o"] + g.dstdata["r"]


# (id, module factory, edge inputs, self loops needed)
CASES = [
    ("graphconv-both", lambda: GraphConv(IN, 4), (), True),
    ("graphconv-right", lambda: GraphConv(IN, 8, norm="right", allow_zero_in_degree=True), (), False),
    ("graphconv-none", lambda: GraphConv(IN, 4, norm="none", allow_zero_in_degree=True), (), False),
    ("graphconv-edge-weight", lambda: GraphConv(IN, 4, allow_zero_in_degree=True),
     ("edge_weight",), False),
    ("sage-mean", lambda: SAGEConv(IN, 4, "mean"), (), False),
    ("sage-mean-wide", lambda: SAGEConv(IN, 9, "mean"), (), False),
    ("sage-pool", lambda: SAGEConv(IN, 4, "pool"), (), False),
    ("sage-gcn", lambda: SAGEConv(IN, 4, "gcn"), (), False),
    ("sage-mean-edge-weight", lambda: SAGEConv(IN, 4, "mean"), ("edge_weight",), False),
    ("gat-heads", lambda: GATConv(IN, 3, num_heads=2, allow_zero_in_degree=True), (), False),
    ("gat-residual", lambda: GATConv(IN, 3, num_heads=2, residual=True), (), True),
    ("gat-residual-identity", lambda: GATConv(IN, 3, num_heads=2, residual=True,
                                              allow_zero_in_degree=True), (), False),
    ("gatv2", lambda: GATv2Conv(IN, 3, num_heads=2, allow_zero_in_degree=True), (), False),
    ("gatv2-residual", lambda: GATv2Conv(IN, 3, num_heads=2, residual=True,
                                         share_weights=True), (), True),
    ("gin-sum", lambda: GINConv(_gin_mlp(), "sum"), (), False),
    ("gin-mean-learn-eps", lambda: GINConv(nn.Linear(IN, 4), "mean", learn_eps=True), (), False),
    ("gin-max", lambda: GINConv(None, "max", init_eps=0.3), (), False),
    ("relgraph", lambda: RelGraphConv(IN, 4, R), ("etypes", "norm"), False),
    ("relgraph-basis", lambda: RelGraphConv(IN, 4, R, regularizer="basis", num_bases=2),
     ("etypes",), False),
    ("relgraph-no-self-loop", lambda: RelGraphConv(IN, 4, R, self_loop=False), ("etypes",), False),
    ("edgeconv", lambda: EdgeConv(IN, 4), (), True),
    ("reduce-udf-masked", MaskedReduce, (), False),
    # g.local_var(), an edge softmax of dot products per head
    ("dotgat", lambda: DotGatConv(IN, 3, num_heads=2, allow_zero_in_degree=True), (), False),
    # source features scaled by g.in_degrees() (the in-degree read per source node)
    ("sgconv", lambda: SGConv(IN, 4, k=1), (), True),
    ("tagconv", lambda: TAGConv(IN, 4, k=1), (), False),
    # k rounds of message passing: a sarc layer per round (sarc.frontends.dgl_rounds)
    ("sgconv-k2", lambda: SGConv(IN, 4, k=2), (), True),
    ("tagconv-k3", lambda: TAGConv(IN, 4, k=3, activation=torch.tanh), (), False),
    ("appnp-k3", lambda: APPNPConv(3, 0.2), (), False),
]

EDGE_DECL = {"edge_weight": (), "etypes": sarc.INDEX, "norm": (1,)}


def _import(module, edge_names):
    return from_dgl_module(module, node={"feat": IN},
                           edge={k: EDGE_DECL[k] for k in edge_names})


def _grads(module):
    return {k: p.grad for k, p in module.named_parameters()}


def _close(got, want, what):
    assert got is not None and want is not None, what
    scale = max(float(want.abs().max()), 1e-3)
    err = float((got - want).abs().max())
    assert err <= 1e-5 * scale, f"{what}: max |sarc - dgl| = {err:.3g}, max |dgl| = {scale:.3g}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_imported_layer_equals_the_dgl_module(case):
    _, make, edge_names, self_loops = case
    torch.manual_seed(0)
    module = randomized(make())
    ref = copy.deepcopy(module)
    src, dst = _edges(self_loops)
    edges = _edge_inputs(edge_names, src.numel())
    x = torch.randn(N, IN)
    x_sarc, x_dgl = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    e_sarc = {k: (v.clone().requires_grad_(True) if v.is_floating_point() else v)
              for k, v in edges.items()}
    e_dgl = {k: (v.clone().requires_grad_(True) if v.is_floating_point() else v)
             for k, v in edges.items()}

    layer = _import(module, edge_names)
    out = layer(sarc.Graph.from_edges(src, dst, N), x_sarc, **e_sarc)
    want = ref(dgl.graph((src, dst), num_nodes=N), x_dgl, **e_dgl)
    assert out.shape == want.shape
    _close(out, want, "output")

    w = torch.randn(want.shape)
    (out * w).sum().backward()
    (want * w).sum().backward()
    _close(x_sarc.grad, x_dgl.grad, "input gradient")
    for k, v in e_dgl.items():
        if v.is_floating_point():
            _close(e_sarc[k].grad, v.grad, f"gradient of edge input {k}")
    got, ref_grads = _grads(layer.module), _grads(ref)
    assert set(got) == set(ref_grads)
    for k in ref_grads:
        _close(got[k], ref_grads[k], f"gradient of {k}")


MODE_CASES = [
    ("gat", lambda: GATConv(IN, 3, num_heads=2, feat_drop=0.5, attn_drop=0.5,
                            allow_zero_in_degree=True)),
    ("sage", lambda: SAGEConv(IN, 4, "mean", feat_drop=0.5)),
    ("appnp-k1", lambda: APPNPConv(1, 0.2, edge_drop=0.5)),
    ("appnp-k3", lambda: APPNPConv(3, 0.2, edge_drop=0.5)),
]


@pytest.mark.parametrize("make", [c[1] for c in MODE_CASES], ids=[c[0] for c in MODE_CASES])
def test_the_layer_follows_the_modules_mode_set_after_the_import(make):
    """``module.eval()`` after the import (a model holding the module switched to eval)
    turns the layer's dropout off, as DGL's forward has it; ``module.train()`` on again."""
    torch.manual_seed(0)
    module = make()
    layer = from_dgl_module(module, node={"feat": IN})
    src, dst = _edges(True)
    g, x = sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN)
    module.eval()
    _close(layer(g, x), module(dgl.graph((src, dst), num_nodes=N), x), "eval output")
    assert not layer.training
    module.train()
    assert not torch.equal(layer(g, x), layer(g, x))   # a mask drawn per call
    assert layer.training


def test_parameters_are_shared_with_the_module():
    module = GraphConv(IN, 4, allow_zero_in_degree=True)
    layer = from_dgl_module(module, node={"feat": IN})
    assert [id(p) for p in layer.parameters()] == [id(p) for p in module.parameters()]
    src, dst = _edges(False)
    g, x = sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN)
    before = layer(g, x)
    with torch.no_grad():
        module.weight.mul_(2)   # a step of the user's optimizer on the module's parameters
    torch.testing.assert_close(layer(g, x), 2 * before)


def test_traced_ir_has_no_edge_tensor_for_graphconv():
    """The traced module is an ordinary sarc function: GraphConv fuses into one aggregate."""
    from sarc.compiler import optimize
    layer = from_dgl_module(GraphConv(IN, 4), node={"feat": IN})
    ops = optimize(layer.trace()).op_counts()
    assert ops.get("aggregate") == 1 and "gather_src" not in ops and "reduce" not in ops


class _DotOfOtherWidths(nn.Module):
    def forward(self, g, feat, w):
        with g.local_scope():
            g.ndata["h"], g.edata["w"] = feat, w
            g.apply_edges(fn.u_dot_e("h", "w", "d"))   # [IN] . [1]: DGL raises
            g.update_all(fn.copy_e("d", "m"), fn.sum("m", "out"))
            return g.ndata["out"]


def test_a_dot_of_features_of_other_widths_is_refused_as_dgl_does():
    """DGL's ``fn.u_dot_e`` of a [IN] node feature and a [1] edge feature raises (its dot
    needs the last sizes equal); sarc refuses it at the user's line, naming both shapes,
    where broadcasting it would compute what DGL never does."""
    src, dst = _edges(True)
    module = _DotOfOtherWidths()
    with pytest.raises(Exception, match="same size on last dimension"):
        g = dgl.graph((src, dst), num_nodes=N)
        module(g, torch.randn(N, IN), torch.randn(src.numel(), 1))
    layer = from_dgl_module(module, node={"feat": IN}, edge={"w": (1,)})
    with pytest.raises(DSLError, match=rf"fn.u_dot_e of features \[{IN}\] and \[1\].*same "
                       r"size on the last dimension") as info:
        layer(sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN),
              w=torch.randn(src.numel(), 1))
    assert info.value.loc is not None and info.value.loc.file == __file__


def test_udfs_that_reduce_over_the_mailbox_are_traced():
    class UDFConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(IN, 4)

        def forward(self, g, feat):
            with g.local_scope():
                g.srcdata["h"] = self.lin(feat)
                g.dstdata["h"] = self.lin(feat[:g.num_dst_nodes()])
                g.update_all(lambda edges: {"m": edges.src["h"] * edges.dst["h"]},
                             lambda nodes: {"s": nodes.mailbox["m"].sum(1),
                                            "x": torch.max(nodes.mailbox["m"], dim=1)[0]})
                g.apply_edges(fn.u_dot_v("h", "h", "d"))
                g.update_all(fn.copy_e("d", "m"), fn.mean("m", "d"))
                return g.dstdata["s"] + g.dstdata["x"] * g.dstdata["d"]

    module = UDFConv()
    src, dst = _edges(False)
    x = torch.randn(N, IN)
    got = from_dgl_module(module, node={"feat": IN})(sarc.Graph.from_edges(src, dst, N), x)
    torch.testing.assert_close(got, module(dgl.graph((src, dst), num_nodes=N), x),
                               rtol=1e-5, atol=1e-5)


class MailboxUDF(nn.Module):
    """``lin(feat)`` sent along every edge as 'm', reduced by ``reduce`` (a DGL reduce UDF
    of its own writing 'o')."""

    def __init__(self, reduce):
        super().__init__()
        self.lin, self.reduce = nn.Linear(IN, 4), reduce

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), self.reduce)
            return g.dstdata["o"]


def _equals_dgl(module, node: str) -> None:
    """``module`` through sarc equals DGL's run of it: output, the input's gradient and the
    parameters' (random edges, some nodes without in-edges)."""
    src, dst = _edges(False)
    x = torch.randn(N, IN)
    layer = from_dgl_module(module, node={node: IN})
    xs, xd = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got = layer(sarc.Graph.from_edges(src, dst, N), xs)
    want = module(dgl.graph((src, dst), num_nodes=N), xd)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    w = torch.randn(want.shape)
    (got * w).sum().backward()
    grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    (want * w).sum().backward()
    torch.testing.assert_close(xs.grad, xd.grad, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, [p.grad for p in module.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_each_messages_arithmetic_in_a_reduce_udf_is_traced():
    """``(m * 2 - 1).relu().mean(1)``: arithmetic on the mailbox before its reduction (it was
    Python's "unsupported operand type(s) for *: '_Mailbox' and 'int'")."""
    module = MailboxUDF(lambda nodes: {
        "o": (nodes.mailbox["m"] * 2 - 1).relu().mean(1)
        + (nodes.mailbox["m"] ** 2).sum(1) / 3
        + torch.tanh(1 - nodes.mailbox["m"]).amax(1)
        + torch.nn.functional.relu(nodes.mailbox["m"]).sum(1)
        + (nodes.mailbox["m"] * nodes.mailbox["m"].sigmoid()).sum(1)})
    _equals_dgl(module, "feat")


class Applied(nn.Module):
    """``update_all(..., apply_node_func)``: DGL applies it on every destination node (those
    without in-edges too), to its data and the reduced values, and writes only what it
    returns. (The node rows as DGL's code slices them: ``[:g.num_src_nodes()]``,
    ``[:g.num_dst_nodes(), :3]``.)"""

    def __init__(self, reduce):
        super().__init__()
        self.lin, self.out, self.reduce = nn.Linear(IN, 4), nn.Linear(4, 3), reduce

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat[:g.num_src_nodes()])
            g.dstdata["r"] = self.lin(feat[:g.num_dst_nodes()])
            g.dstdata["kept"] = feat[:g.num_dst_nodes(), :3]
            g.update_all(fn.copy_u("h", "m"), self.reduce,
                         lambda nodes: {"o": torch.relu(self.out(nodes.data["s"]
                                                                 + nodes.data["r"]) + 1),
                                        "kept": nodes.data["kept"] * 2})
            assert "s" not in g.dstdata   # not returned by the apply function: not written
            return g.dstdata["o"] + g.dstdata["kept"]


@pytest.mark.parametrize("reduce", ["builtin", "udf"])
def test_update_alls_apply_node_func_equals_dgl(reduce):
    _equals_dgl(Applied(fn.sum("m", "s") if reduce == "builtin" else
                        (lambda nodes: {"s": nodes.mailbox["m"].max(1)[0]})), "feat")


class AppliedAfterExtremum(nn.Module):
    """A builtin max / min, then an apply_node_func: DGL's reduction is -inf / +inf on a node
    without in-edges, which the apply function reads (clamped to a bound, exponentiated),
    and DGL zeroes +-inf in the first key the function returns only ('o' doubled: +-inf
    there is 0; 'e', exp of it, is 0 or inf where sarc's 0 would give 1)."""

    def __init__(self, kind):
        super().__init__()
        self.lin, self.kind = nn.Linear(IN, 4), kind

    def forward(self, g, feat):
        with g.local_scope():
            g.ndata["h"] = self.lin(feat)
            sign = 1.0 if self.kind == "max" else -1.0
            g.update_all(fn.copy_u("h", "m"), getattr(fn, self.kind)("m", "s"),
                         lambda nodes: {"o": nodes.data["s"] * 2,
                                        "c": nodes.data["s"].clamp(-3.0, 3.0),
                                        "e": torch.exp(sign * nodes.data["s"]).clamp(max=5.0)})
            return g.ndata["o"] + g.ndata["c"] + g.ndata["e"]


@pytest.mark.parametrize("kind", ["max", "min"])
def test_an_apply_node_func_after_a_builtin_extremum_reads_dgls_infinities(kind):
    _equals_dgl(AppliedAfterExtremum(kind), "feat")


def test_mailbox_reductions_with_keepdim_or_a_tuple_of_dims_equal_dgl():
    """``mean(1, keepdim=True)`` (then squeezed, as DGL's code writes it), ``sum((1,))``,
    ``max(dim=1, keepdim=True)``: the same reductions over dim 1 (they were refused)."""
    module = MailboxUDF(lambda nodes: {
        "o": nodes.mailbox["m"].mean(1, keepdim=True).squeeze(1)
        + nodes.mailbox["m"].sum((1,))
        + torch.amax(nodes.mailbox["m"], (1,))
        + nodes.mailbox["m"].max(dim=1, keepdim=True)[0][:, 0]})
    _equals_dgl(module, "feat")


POINTWISE = {   # torch's pointwise functions of one message, with their number arguments
    "elu": lambda m: F.elu(m).sum(1),
    "leaky_relu": lambda m: F.leaky_relu(m, 0.2).max(1)[0],
    "leaky_relu_kw": lambda m: F.leaky_relu(m, negative_slope=0.3).mean(1),
    "gelu_silu": lambda m: (F.gelu(m) + F.silu(m)).sum(1),
    "softplus": lambda m: F.softplus(m, beta=2.0).amin(1),
    "clamp": lambda m: torch.clamp(m, min=-0.5, max=0.5).sum(1),
    "method": lambda m: m.clamp_min(0.1).log().mean(1),
}


@pytest.mark.parametrize("name", POINTWISE)
def test_pointwise_functions_of_the_messages_in_a_reduce_udf_equal_dgl(name):
    """F.elu, F.leaky_relu (its slope), clamp...: each message's own, as relu and tanh were;
    they were refused ("nodes.mailbox['m'] used by torch.elu")."""
    reduce = POINTWISE[name]
    module = MailboxUDF(lambda nodes: {"o": reduce(nodes.mailbox["m"])})
    _equals_dgl(module, "feat")


class TutorialGAT(nn.Module):
    """DGL's GAT tutorial's layer as written there (its graph given to forward): attention
    by apply_edges, its softmax over the mailbox in the reduce function."""

    def __init__(self, in_dim, out_dim, heads=None, method=False):
        super().__init__()
        self.heads, self.method = heads, method
        width = out_dim * (heads or 1)
        self.fc = nn.Linear(in_dim, width, bias=False)
        self.attn_fc = nn.Linear(2 * out_dim, 1, bias=False)

    def edge_attention(self, edges):
        z2 = torch.cat([edges.src["z"], edges.dst["z"]], dim=-1)
        return {"e": F.leaky_relu(self.attn_fc(z2))}

    def message_func(self, edges):
        return {"z": edges.src["z"], "e": edges.data["e"]}

    def reduce_func(self, nodes):
        e = nodes.mailbox["e"]
        alpha = e.softmax(dim=1) if self.method else F.softmax(e, dim=1)
        return {"h": torch.sum(alpha * nodes.mailbox["z"], dim=1)}

    def forward(self, g, h):
        z = self.fc(h)
        if self.heads:
            z = z.view(-1, self.heads, z.shape[-1] // self.heads)
        g.ndata["z"] = z
        g.apply_edges(self.edge_attention)
        g.update_all(self.message_func, self.reduce_func)
        out = g.ndata.pop("h")
        return out.flatten(1) if self.heads else out


@pytest.mark.parametrize("heads,method", [(None, False), (3, False), (None, True)],
                         ids=["one-head", "three-heads", "method"])
def test_the_gat_tutorials_softmax_over_the_mailbox_equals_dgl(heads, method):
    """``F.softmax(nodes.mailbox['e'], dim=1)``: the softmax of each node's messages, an
    edge softmax (it was refused as a function across the mailbox)."""
    _equals_dgl(TutorialGAT(IN, 4, heads, method), "h")


def test_a_softmax_over_each_messages_features_equals_dgl():
    module = MailboxUDF(lambda nodes: {"o": torch.softmax(nodes.mailbox["m"], -1).sum(1)
                                       + F.softmax(nodes.mailbox["m"], dim=2).amax(1)})
    src, dst = _edges(False)
    x = torch.randn(N, IN)
    layer = from_dgl_module(module, node={"feat": IN})
    got = layer(sarc.Graph.from_edges(src, dst, N), x)
    want = module(dgl.graph((src, dst), num_nodes=N), x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


ACROSS_THE_MAILBOX = {   # not of one message, nor a softmax of a node's messages
    "softmax_over_nodes": (lambda m: torch.softmax(m, dim=0).sum(1), "a softmax over dim=0"),
    "softmax_dtype": (lambda m: torch.softmax(m, 1, dtype=torch.float64).sum(1),
                      "a softmax with dtype"),
    "cumsum": (lambda m: torch.cumsum(m, 1).sum(1), "torch.cumsum"),
    "inplace": (lambda m: F.relu(m, inplace=True).sum(1), "torch.relu"),
}


@pytest.mark.parametrize("name", ACROSS_THE_MAILBOX)
def test_functions_across_the_mailbox_are_still_refused(name):
    reduce, what = ACROSS_THE_MAILBOX[name]
    module = MailboxUDF(lambda nodes: {"o": reduce(nodes.mailbox["m"])})
    src, dst = _edges(False)
    layer = from_dgl_module(module, node={"feat": IN})
    with pytest.raises(DSLError, match=rf"nodes.mailbox\['m'\] used by {what}"):
        layer(sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN))


@pytest.mark.parametrize("mailbox_first", [True, False])
def test_node_data_broadcast_over_the_mailbox_is_refused_by_name(mailbox_first):
    def times(a, b):
        return a * b if mailbox_first else b * a

    module = MailboxUDF(lambda nodes: {
        "o": times(nodes.mailbox["m"], nodes.data["h"].unsqueeze(1)).sum(1)})
    src, dst = _edges(False)
    with pytest.raises(sarc.DSLError, match=r"nodes.mailbox\['m'\] used by .*compute per-edge "
                                            r"values in the message function"):
        from_dgl_module(module, node={"feat": IN})(sarc.Graph.from_edges(src, dst, N),
                                                   torch.randn(N, IN))


class DotAttention(nn.Module):
    """A user's attention layer: ``fn.u_dot_v`` scores, DGL's ``edge_softmax`` imported by name."""

    def __init__(self):
        super().__init__()
        self.q, self.v = nn.Linear(IN, 4), nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata.update({"q": self.q(feat), "v": self.v(feat)})
            g.dstdata["q"] = self.q(feat[:g.num_dst_nodes()])
            g.apply_edges(fn.u_dot_v("q", "q", "s"))
            g.edata["a"] = edge_softmax(g, g.edata["s"] / 2.0)
            g.update_all(fn.u_mul_e("v", "a", "m"), fn.sum("m", "h"))
            return g.dstdata["h"]


class AggregateThenEdges(nn.Module):
    """The edges read the mean at their destination, then aggregate again there: on one
    process, DGL's result; in a distributed schedule, refused (each edge block has a part of
    the mean)."""

    def __init__(self, through_dst: bool):
        super().__init__()
        self.lin, self.through_dst = nn.Linear(IN, 4), through_dst

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "o"))
            if self.through_dst:
                g.dstdata["o"] = g.dstdata["o"].tanh() + 1
            g.apply_edges(fn.v_dot_u("o", "h", "e"))   # the line a refusal names
            g.update_all(fn.u_mul_e("h", "e", "m"), fn.sum("m", "r"))
            return g.dstdata["r"]


@pytest.mark.parametrize("through_dst", [False, True])
def test_edges_reading_their_layers_aggregate_are_refused_in_a_distributed_schedule(
        through_dst):
    """Read directly, the aggregate was each edge block's partial: two workers crashed in the
    backward, or would have trained on partial means."""
    from sarc.compiler import optimize
    from sarc.ir.split import split_layer
    from sarc.planner.cost import exchange_candidates
    from sarc.errors import DSLError

    torch.manual_seed(0)
    module = randomized(AggregateThenEdges(through_dst))
    src, dst = _edges(False)
    x = torch.randn(N, IN)
    layer = _import(copy.deepcopy(module), ())
    _close(layer(sarc.Graph.from_edges(src, dst, N), x), module(dgl.graph((src, dst),
                                                                            num_nodes=N), x),
           "one process's output")
    fn_ = optimize(layer.trace())
    for cand in exchange_candidates(fn_):
        with pytest.raises(DSLError, match="an edge computation reads an aggregate of the same "
                                           "layer .* make the second pass a layer of its own") \
                as err:
            split_layer(fn_, cand.values)
        assert err.value.loc is not None and err.value.loc.file == __file__


class HeldSoftmaxAttention(DotAttention):
    """DGL's ``edge_softmax`` held as an attribute: DGL's own ran on sarc's graph ("g._graph
    is not supported")."""

    def __init__(self):
        super().__init__()
        self.normalize = edge_softmax

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata.update({"q": self.q(feat), "v": self.v(feat)})
            g.dstdata["q"] = self.q(feat[:g.num_dst_nodes()])
            g.apply_edges(fn.u_dot_v("q", "q", "s"))
            g.edata["a"] = self.normalize(g, g.edata["s"] / 2.0)
            g.update_all(fn.u_mul_e("v", "a", "m"), fn.sum("m", "h"))
            return g.dstdata["h"]


@pytest.mark.parametrize("make", [DotAttention, HeldSoftmaxAttention],
                         ids=["imported", "held-as-attribute"])
def test_edge_softmax_imported_by_a_users_module_is_sarcs(make):
    module = make()
    src, dst = _edges(False)
    x = torch.randn(N, IN)
    got = from_dgl_module(module, node={"feat": IN})(sarc.Graph.from_edges(src, dst, N), x)
    torch.testing.assert_close(got, module(dgl.graph((src, dst), num_nodes=N), x),
                               rtol=1e-5, atol=1e-5)
    assert getattr(module, "normalize", edge_softmax) is edge_softmax   # put back


# --- P workers equal one process -------------------------------------------------------------

DIST_CASES = [("graphconv-both", 2), ("graphconv-both", 3), ("gat-heads", 2), ("gat-heads", 3),
              ("sage-mean", 2), ("sage-pool", 2), ("gatv2", 2), ("gin-sum", 2), ("relgraph", 2),
              ("relgraph-basis", 2), ("edgeconv", 2), ("graphconv-edge-weight", 2),
              ("reduce-udf-masked", 3), ("dotgat", 2), ("sgconv", 2), ("tagconv", 3),
              ("tagconv-k3", 2), ("appnp-k3", 3)]


def _dist_worker(rank, port, queue, parts_dir, name, state, world, patched=False):
    import torch.distributed as dist

    from sarc.distributed import DistGraph
    from sarc.distributed.train import allreduce_gradients
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        _, make, edge_names, _ = next(c for c in CASES if c[0] == name)
        module = make()
        module.load_state_dict(state)
        shard = ShardedGraph.from_partitions(load_partitions(parts_dir, verify=False), rank)
        dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60))
        x = shard.ndata["feat"].clone().requires_grad_(True)
        edges = {k: dg.edge_data(k) for k in edge_names}
        if patched:   # the DGL module called on the worker's DistGraph as on a DGLGraph
            sarc.frontends.dgl.patch()
            layer = module
        else:
            layer = _import(module, edge_names)
        out = layer(dg, x, **edges)
        (out * shard.ndata["w"].reshape(out.shape)).sum().backward()
        allreduce_gradients(layer)
        # a file, not the queue: a pipe holds 64 KiB, and the parent joins before it reads
        report = f"{parts_dir}.r{rank}.pt"
        torch.save({"ids": shard.orig_node_ids, "out": out.detach(), "x_grad": x.grad,
                    "grads": {k: p.grad for k, p in module.named_parameters()}}, report)
        queue.put((rank, report))
        dist.barrier()   # torch 2.2's gloo can hang in destroy when a peer has already left
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name,parts,patched", [(*c, False) for c in DIST_CASES] +
                         [("graphconv-edge-weight", 2, True), ("gat-heads", 3, True)],
                         ids=[f"{n}-P{p}" for n, p in DIST_CASES] +
                         ["graphconv-edge-weight-P2-patched", "gat-heads-P3-patched"])
def test_p_workers_equal_one_process(tmp_path, name, parts, patched):
    from distributed.harness import spawn

    from sarc.partition import partition_graph

    _, make, edge_names, self_loops = next(c for c in CASES if c[0] == name)
    torch.manual_seed(0)
    module = randomized(make())
    src, dst = _edges(self_loops, seed=3)
    edges = _edge_inputs(edge_names, src.numel())
    x = torch.randn(N, IN)
    layer = _import(copy.deepcopy(module), edge_names)
    xr = x.clone().requires_grad_(True)
    want = layer(sarc.Graph.from_edges(src, dst, N), xr, **edges)
    w = torch.randn(want.shape)
    (want * w).sum().backward()

    partition_graph(src, dst, N, parts, tmp_path / "parts", method="random",
                    node_data={"feat": x, "w": w.reshape(N, -1)}, edge_data=edges)
    codes, reports = spawn(_dist_worker, parts, (str(tmp_path / "parts"), name,
                                                 module.state_dict(), parts, patched),
                           timeout_s=40)
    assert codes == [0] * parts, codes
    out = torch.zeros(want.shape)
    x_grad = torch.zeros(N, IN)
    reports = [torch.load(r) for r in reports]
    for r in reports:
        out[r["ids"]] = r["out"]
        x_grad[r["ids"]] = r["x_grad"]
    _close(out, want, "output")
    _close(x_grad, xr.grad, "input gradient")
    for k, p in layer.module.named_parameters():
        for r in reports:
            _close(r["grads"][k], p.grad, f"gradient of {k}")


def _zero_in_degree_worker(rank, port, queue, parts_dir, world, name):
    import torch.distributed as dist

    from sarc.distributed import DistGraph
    from sarc.partition import load_partitions
    from sarc.runtime.sharded import ShardedGraph

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        _, make, edge_names, _ = next(c for c in CASES if c[0] == name)
        shard = ShardedGraph.from_partitions(load_partitions(parts_dir, verify=False), rank)
        dg = DistGraph(shard, timeout=datetime.timedelta(seconds=60))
        try:
            _import(make(), edge_names)(dg, shard.ndata["feat"])
            queue.put((rank, "ran"))
        except sarc.GraphError as e:
            queue.put((rank, str(e)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["sgconv", "sgconv-k2"])
def test_every_worker_refuses_nodes_without_in_edges_as_one_process(tmp_path, name):
    """SGConv's default allow_zero_in_degree=False on a graph whose isolated nodes have no
    in-edges: one process refuses, and so does every worker (none left waiting)."""
    from distributed.harness import spawn

    from sarc.partition import partition_graph
    src, dst = _edges(self_loops=False)
    _, make, edge_names, _ = next(c for c in CASES if c[0] == name)
    with pytest.raises(sarc.GraphError, match="nodes without incoming edges") as e:
        _import(make(), edge_names)(sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN))
    assert e.value.loc is not None and e.value.loc.file == __file__, e.value  # the call's line
    partition_graph(src, dst, N, 2, tmp_path / "parts", method="random",
                    node_data={"feat": torch.randn(N, IN)})
    codes, reports = spawn(_zero_in_degree_worker, 2, (str(tmp_path / "parts"), 2, name),
                           timeout_s=60)
    assert codes == [0, 0], codes
    assert all("nodes without incoming edges" in r for r in reports), reports


def test_a_refusal_in_dgls_own_code_says_it_is_the_modules():
    """TAGConv checks ``th.any(edge_weight <= 0)``: the refusal's hint ("name a feature
    dim") was written for the user's code, and read as if the user wrote the reduction."""
    src, dst = _edges(self_loops=True)
    layer = from_dgl_module(TAGConv(IN, 4, k=1), node={"feat": IN},
                            edge={"edge_weight": ()})
    g = sarc.Graph.from_edges(src, dst, N)
    with pytest.raises(sarc.DSLError) as e:
        layer(g, torch.randn(N, IN), torch.rand(len(src)) + 0.1)
    problem = str(e.value).splitlines()[0]
    assert "tagconv.py:" in problem and "TAGConv: any() over all axes" in problem, problem
    assert "this is in the module's own code: sarc does not trace TAGConv used this way" in problem


class _Unpacks(nn.Module):
    """A user's module that unpacks DGL's minibatch pair itself (``pair``), or through
    ``expand_as_pair``."""

    def __init__(self, pair: bool):
        super().__init__()
        self.pair, self.lin = pair, nn.Linear(5, 3)

    def forward(self, g, feat):
        with g.local_scope():
            h_src, h_dst = feat if self.pair else dgl.utils.expand_as_pair(feat, g)
            g.srcdata["h"], g.dstdata["hd"] = self.lin(h_src), self.lin(h_dst)
            g.update_all(fn.u_mul_v("h", "hd", "m"), fn.sum("m", "o"))
            return g.dstdata["o"]


def test_a_pair_unpacked_by_the_module_is_refused_naming_expand_as_pair():
    """``h_src, h_dst = feat`` iterates the traced feature, one value: the error says so
    and names what reads the pair (``expand_as_pair``), with which the module equals DGL."""
    torch.manual_seed(0)
    g = dgl.graph((torch.randint(0, 10, (30,)), torch.randint(0, 10, (30,))), num_nodes=10)
    seeds = torch.tensor([0, 1, 2, 5])
    block = dgl.to_block(dgl.in_subgraph(g, seeds), dst_nodes=seeds)
    x = torch.randn(block.num_src_nodes(), 5)
    pair = (x, x[:block.num_dst_nodes()])
    with pytest.raises(DSLError, match=r"unpacking a \(src, dst\) pair\?.*expand_as_pair") as e:
        from_dgl_module(_Unpacks(True), node={"feat": 5})(sarc.frontends.dgl.from_dgl(block),
                                                           pair)
    assert e.value.loc.line > 0 and e.value.loc.file == __file__
    module = _Unpacks(False)
    got = from_dgl_module(module, node={"feat": 5})(sarc.frontends.dgl.from_dgl(block), pair)
    torch.testing.assert_close(got, module(block, pair))
