"""A DGL module's graph data through sarc (``sarc.frontends.dgl``; .venv-dgl): what the module
computes on the DGL graph, output and every gradient, or a sarc error naming the module and
the construct.

On a DGL graph (not a block) ``g.srcdata``, ``g.dstdata`` and ``g.ndata`` are one store: a
value written through one is read through the others.
"""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("dgl")

import dgl  # noqa: E402
import dgl.function as fn  # noqa: E402
from dgl.nn.pytorch import GCN2Conv, GraphConv, SGConv, TAGConv  # noqa: E402
from torch import nn  # noqa: E402

from dgl_support import randomized  # noqa: E402
import sarc  # noqa: E402
import sarc.frontends.dgl  # noqa: E402
from sarc.errors import DSLError, GraphError  # noqa: E402
from sarc.frontends.dgl import from_dgl_module  # noqa: E402

N, IN = 12, 5


def _edges(self_loops=False):
    """30 random edges among nodes 0..8 (9..11 without edges), 4 of them doubled."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 9, (30,), generator=gen)
    dst = torch.randint(0, 9, (30,), generator=gen)
    src, dst = torch.cat([src, src[:4]]), torch.cat([dst, dst[:4]])
    if self_loops:
        src, dst = torch.cat([src, torch.arange(N)]), torch.cat([dst, torch.arange(N)])
    return src, dst


def _close(got, want, what):
    """Close where finite, and infinite where DGL's is, with its sign."""
    assert got is not None and want is not None, what
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf]), what
    got, want = got[~inf], want[~inf]
    scale = max(float(want.abs().max()) if want.numel() else 0.0, 1e-3)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= 1e-5 * scale, f"{what}: max |sarc - dgl| = {err:.3g}, max |dgl| = {scale:.3g}"


def _equals_dgl(module, node=None, edge=None, self_loops=False):
    """``module`` through sarc equals ``module`` on the DGL graph: output, input and parameter
    gradients. ``edge``: name -> feature shape of random edge inputs."""
    torch.manual_seed(0)
    module = randomized(module)
    ref = copy.deepcopy(module)
    src, dst = _edges(self_loops)
    gen = torch.Generator().manual_seed(1)
    node = node or {"feat": IN}
    feats = {k: torch.randn(N, w, generator=gen) for k, w in node.items()}
    feats.update({k: torch.rand(src.numel(), *shape, generator=gen) + 0.1
                  for k, shape in (edge or {}).items()})
    mine = {k: v.clone().requires_grad_(True) for k, v in feats.items()}
    theirs = {k: v.clone().requires_grad_(True) for k, v in feats.items()}
    layer = from_dgl_module(module, node=node, edge=edge or {})
    out = layer(sarc.Graph.from_edges(src, dst, N), **mine)
    want = ref(dgl.graph((src, dst), num_nodes=N), **theirs)
    assert out.shape == want.shape
    _close(out, want, "output")
    w = torch.randn(want.shape, generator=gen)
    (out * w).sum().backward()
    (want * w).sum().backward()
    for k in feats:
        _close(mine[k].grad, theirs[k].grad, f"gradient of {k}")
    grads = dict(module.named_parameters())
    for k, p in ref.named_parameters():
        if p.grad is None:   # a parameter DGL's graph does not reach
            assert grads[k].grad is None or not grads[k].grad.any(), k
            continue
        _close(grads[k].grad, p.grad, f"gradient of {k}")


def _refused(module, *needles):
    layer = from_dgl_module(module, node={"feat": IN})
    src, dst = _edges()
    with pytest.raises(DSLError) as err:
        layer(sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN))
    text = str(err.value)
    for n in (f"{type(module).__name__}: ", *needles):
        assert n in text, (n, text)
    assert err.value.loc is not None and err.value.loc.file == __file__, text
    return err.value


# --- srcdata, dstdata and ndata are one store --------------------------------------------------

class SrcReadAtDst(nn.Module):
    """Writes g.srcdata['h'] only and reads 'h' at both ends of each edge."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.apply_edges(fn.u_sub_v("h", "h", "d"))
            g.update_all(fn.copy_e("d", "m"), fn.sum("m", "o"))
            return g.dstdata["o"] + g.dstdata["h"]


class DstReadAtSrc(nn.Module):
    """Writes g.dstdata['h'] (node code on the inputs) and sends it from the sources."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.dstdata["h"] = torch.tanh(self.lin(feat[:g.num_dst_nodes()]))
            g.update_all(lambda edges: {"m": edges.src["h"] * edges.dst["h"]}, fn.sum("m", "o"))
            return g.dstdata["o"]


class NData(nn.Module):
    """g.ndata as a homogeneous graph's module writes it, the result read back from it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.ndata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "a"))
            return g.ndata["a"] + g.ndata["h"] * 2.0


class SrcOverwrittenByDst(nn.Module):
    """srcdata['x'] and dstdata['x'] set to different values, then srcdata['x'] read: on a
    DGL graph the later value (one store), on a DGL block its own (two stores)."""

    def __init__(self):
        super().__init__()
        self.lin, self.other = nn.Linear(IN, 4), nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["x"] = self.other(feat)
            g.dstdata["x"] = self.lin(feat[:g.num_dst_nodes()])
            g.update_all(fn.copy_u("x", "m"), fn.sum("m", "o"))
            return g.dstdata["o"]


class EGAT(nn.Module):
    """DGL's EGATConv (it writes a source value into g.dstdata), node output."""

    def __init__(self):
        super().__init__()
        from dgl.nn.pytorch import EGATConv
        self.conv = EGATConv(IN, 2, 3, 3, num_heads=2)

    def forward(self, g, nfeats, efeats):
        h, _ = self.conv(g, nfeats, efeats)
        return h.flatten(1)


@pytest.mark.parametrize("make", [SrcReadAtDst, DstReadAtSrc, NData],
                         ids=lambda m: m.__name__)
def test_node_data_is_one_store_as_on_a_dgl_graph(make):
    _equals_dgl(make())


def test_a_key_set_to_two_values_through_srcdata_and_dstdata_is_refused_where_read():
    """A layer runs on graphs and on blocks, which DGL reads differently here: it was the
    graph's reading on both (on a DGL block, silently another result than DGL's)."""
    with pytest.raises(DSLError, match=r"SrcOverwrittenByDst: g.srcdata\['x'\] is read after "
                                       r"g.dstdata\['x'\] was set to another value .* give the "
                                       r"two values different names"):
        from_dgl_module(SrcOverwrittenByDst(), node={"feat": IN}).trace()


def test_egatconv_equals_dgl():
    _equals_dgl(EGAT(), node={"nfeats": IN}, edge={"efeats": (2,)}, self_loops=True)


class TwoHops(nn.Module):
    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = feat
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))   # DGL: sends the first hop's h
            return g.dstdata["h"]


class EdgesAfterUpdate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            g.apply_edges(fn.u_add_v("h", "h", "s"))   # DGL: both ends read the aggregated h
            g.update_all(fn.copy_e("s", "m"), fn.sum("m", "o"))
            return g.dstdata["o"]


class NDataTwoHops(nn.Module):
    def forward(self, g, feat):
        with g.local_scope():
            g.ndata["h"] = feat
            for _ in range(2):
                g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            return g.ndata["h"]


@pytest.mark.parametrize("make", [TwoHops, EdgesAfterUpdate, NDataTwoHops],
                         ids=lambda m: m.__name__)
def test_a_second_round_of_message_passing_is_refused(make):
    """What update_all computed per destination node, sent again from the source nodes: DGL's
    second hop, which one sarc layer does not compute (sarc read the input again)."""
    _refused(make(), "second round of message passing", "'h'")


def test_a_second_round_through_builtins_is_not_said_to_read_srcdata():
    """The builtins of the second update_all read 'h' per source node, not the user's code."""
    err = _refused(TwoHops(), "second round of message passing")
    assert "g.srcdata['h'] reads" not in str(err)


class ReadsTheGraphsEdgeData(nn.Module):
    """Reads edge weights the user set on the DGL graph (``G.edata['w'] = ...``), which
    a sarc graph does not carry."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.ndata["z"] = self.lin(feat)
            g.update_all(fn.u_mul_e("z", "w", "m"), fn.sum("m", "o"))
            return g.ndata["o"]


def test_graph_data_set_outside_the_module_is_said_to_be_an_argument():
    """It was "g.edata['w'] is read before it is set (set: nothing)": the user had set it,
    on the DGL graph."""
    _refused(ReadsTheGraphsEdgeData(), "g.edata['w'] is read before it is set",
             "a sarc graph does not carry a DGL graph's data", "argument of forward",
             "edge={'w': ...}")


# --- reduce UDFs run on the nodes with in-edges only ---------------------------------------------

class ReduceWithNodeData(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            h = self.lin(feat)
            g.srcdata["h"] = h
            g.dstdata["h0"] = h[:g.num_dst_nodes()]
            g.update_all(fn.copy_u("h", "m"),
                         lambda nodes: {"o": nodes.mailbox["m"].sum(1) + nodes.data["h0"]})
            return g.dstdata["o"]


class ReduceWithBiasAndActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), lambda nodes: {
                "a": torch.sigmoid(nodes.mailbox["m"].max(1).values + self.bias),
                "b": nodes.mailbox["m"].mean(1) * 2.0 + 1.0,
                "c": nodes.mailbox["m"].sum(1)})
            return g.dstdata["a"] + g.dstdata["b"] * g.dstdata["c"]


@pytest.mark.parametrize("make", [ReduceWithNodeData, ReduceWithBiasAndActivation],
                         ids=lambda m: m.__name__)
def test_a_reduce_udf_gives_zero_on_nodes_without_in_edges(make):
    """DGL calls a reduce UDF on the nodes with in-edges only and gives the others 0; what the
    UDF adds to its reductions is not computed there (sarc gave nodes.data, a constant, a
    bias or sigmoid(0) on those nodes; one that makes inf there: test_dgl.py's MaskedReduce)."""
    _equals_dgl(make())


def test_cfconv_with_its_shifted_softplus_equals_dgl():
    """CFConv's edge network ends in a shifted softplus (F.softplus(x, beta, threshold)):
    traced, output and gradients equal DGL's."""
    from dgl.nn.pytorch import CFConv
    _equals_dgl(CFConv(IN, 4, 6, 5), node={"node_feats": IN}, edge={"edge_feats": (4,)})


def test_gmmconv_equals_dgl():
    """GMMConv: Gaussian kernels of pseudo-coordinates per edge, a mean over the edges."""
    from dgl.nn.pytorch import GMMConv
    _equals_dgl(GMMConv(IN, 5, 2, 3, "mean", allow_zero_in_degree=True), node={"feat": IN},
                edge={"pseudo": (2,)})


# --- DGL's idioms on a traced value, a user's module on a sarc graph ----------------------------

class DeviceIdiom(nn.Module):
    """``norm.to(feat.device)``, as DGL's own layers write it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            norm = torch.pow(g.out_degrees().to(feat).clamp(min=1), -0.5)
            norm = norm.to(feat.device).unsqueeze(1)
            assert isinstance(feat.device, torch.device)
            g.srcdata["h"] = self.lin(feat).to(feat.device) * norm
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            return g.dstdata["h"]


def test_device_of_a_traced_value():
    _equals_dgl(DeviceIdiom())


class WidenedSum(nn.Module):
    """Sums in float64 and converts back, with ``.to(dtype)``, ``.float()`` and ``.to(feat)``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat).to(torch.float64) * 1e3
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            wide = g.dstdata["h"]
            return wide.float() / 1e3 + (wide / 1e3).to(feat).to(feat.device)


def test_dtype_conversions_of_a_traced_value():
    _equals_dgl(WidenedSum())


@pytest.mark.parametrize("make", [lambda: SGConv(IN, 3), lambda: TAGConv(IN, 3, k=1),
                                  lambda: GCN2Conv(IN, 1, allow_zero_in_degree=True)],
                         ids=["SGConv", "TAGConv", "GCN2Conv"])
def test_stock_convs_scaling_sources_by_in_degree_equal_dgl(make):
    """These read ``.device`` (traced) and scale the source features by the in-degrees: the
    in-degree read per source node."""
    module = make()
    node = {"feat": IN, "feat_0": IN} if type(module).__name__ == "GCN2Conv" else None
    _equals_dgl(module, node=node, self_loops=True)


class AttentionFromAHelper(nn.Module):
    """Calls an edge softmax that a helper module of its own imported by name."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)
        self.att = nn.Linear(4, 1, bias=False)

    def forward(self, g, feat):
        from dgl_helpers import attention
        with g.local_scope():
            h = self.lin(feat)
            g.ndata["h"], g.ndata["s"] = h, self.att(h)
            g.apply_edges(fn.u_add_v("s", "s", "e"))
            g.edata["a"] = attention(g, g.edata["e"])
            g.update_all(fn.u_mul_e("h", "a", "m"), fn.sum("m", "h"))
            return g.ndata["h"]


def test_edge_softmax_called_from_a_helper_module_equals_dgl():
    _equals_dgl(AttentionFromAHelper(), self_loops=True)


class SparseOps(nn.Module):
    """dgl.ops' named message functions: copy_u_sum, u_mul_e_mean, an edge score u_dot_v,
    copy_e_max and e_sub_v."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat, w):
        h = self.lin(feat)
        score = dgl.ops.u_dot_v(g, h, h)
        out = dgl.ops.copy_u_sum(g, h) + dgl.ops.u_mul_e_mean(g, h, w * score)
        return out + dgl.ops.copy_e_max(g, dgl.ops.e_sub_v(g, w * score, h))


def test_dgl_ops_message_functions_equal_dgl():
    _equals_dgl(SparseOps(), edge={"w": (1,)}, self_loops=True)


class SparseExtrema(nn.Module):
    """dgl.ops' max and min: DGL's gspmm leaves a node without in-edges at -inf / inf
    (update_all's fn.max / fn.min give it 0; sarc gave 0 here too)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat, w):
        h = self.lin(feat)
        return torch.cat([dgl.ops.copy_u_min(g, h), dgl.ops.u_add_e_max(g, h, w),
                          dgl.ops.copy_e_min(g, w)], -1)


def test_dgl_ops_extrema_of_no_edges_equal_dgl():
    """Output, and gradients where the output is finite: DGL's backward of such a row sends
    its gradient to node 0 (the argmax it leaves there), which sarc does not copy."""
    torch.manual_seed(0)
    module = randomized(SparseExtrema())
    ref = copy.deepcopy(module)
    src, dst = _edges(False)
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(N, IN, generator=gen), torch.rand(src.numel(), 1, generator=gen) + 0.1
    mine, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    layer = from_dgl_module(module, node={"feat": IN}, edge={"w": (1,)})
    out = layer(sarc.Graph.from_edges(src, dst, N), mine, w)
    want = ref(dgl.graph((src, dst), num_nodes=N), theirs, w)
    assert want.isinf().any()
    _close(out, want, "output")
    up = torch.randn(want.shape, generator=gen).masked_fill(want.isinf(), 0.0)
    (out * up).sum().backward()
    (want * up).sum().backward()
    _close(mine.grad, theirs.grad, "gradient of feat")
    _close(module.lin.weight.grad, ref.lin.weight.grad, "gradient of lin.weight")


class OutDegreePerDestination(nn.Module):
    """Scales what it aggregated by the out-degrees, read per destination node."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            return g.dstdata["h"] * g.out_degrees().float().unsqueeze(1)


def test_out_degrees_read_per_destination_equal_dgl():
    _equals_dgl(OutDegreePerDestination())


def test_in_degrees_of_sources_on_a_block_are_refused():
    """A block whose sources are not all destinations, built without their in-degrees, does
    not know them: refused, naming the module and what to do."""
    src, dst = _edges(self_loops=True)
    block = sarc.Graph.from_edges(src, dst % 5, num_src=N, num_dst=5)
    layer = from_dgl_module(SGConv(IN, 3, allow_zero_in_degree=True), node={"feat": IN})
    with pytest.raises(GraphError, match=r"SGConv reads the in-degree of source nodes .* "
                                         rf"it has {N} sources for 5 destinations.*"
                                         r"src_in_degree="):
        layer(block, torch.randn(N, IN))


class OwnModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "h"))
            return g.dstdata["h"]


def test_a_users_own_module_on_a_sarc_graph_points_to_from_dgl_module():
    """After patch(), DGL's convs run on a sarc graph; a module of the user's own reaching for a
    DGLGraph method on it is told to wrap the module (it was "'Graph' object has no attribute
    'local_scope'")."""
    sarc.frontends.dgl.patch()
    src, dst = _edges()
    g = sarc.Graph.from_edges(src, dst, N)
    with pytest.raises(DSLError) as err:
        OwnModule()(g, torch.randn(N, IN))
    text = str(err.value)
    for needle in ("OwnModule: ", "g.local_scope", "from_dgl_module"):
        assert needle in text, (needle, text)
    assert err.value.loc is not None and err.value.loc.file == __file__
    assert not hasattr(g, "local_scope") and not hasattr(g, "no_such_attribute")
    # wrapped as the error says, it equals DGL
    _equals_dgl(OwnModule())


def test_unpatch_gives_dgl_its_own_forward_back():
    """``unpatch()`` undoes ``patch()``: the convs' own ``forward`` again, and a DGLGraph
    method on a sarc graph a plain AttributeError (no hint hook left behind)."""
    original = GraphConv.forward
    sarc.frontends.dgl.patch()
    try:
        assert getattr(GraphConv.forward, "_sarc_routed", False)
        sarc.frontends.dgl.unpatch()
        assert not getattr(GraphConv.forward, "_sarc_routed", False)
        assert GraphConv.forward is getattr(original, "__wrapped__", original)
        src, dst = _edges()
        g = sarc.Graph.from_edges(src, dst, N)
        with pytest.raises(AttributeError) as err:
            OwnModule()(g, torch.randn(N, IN))
        assert not isinstance(err.value, DSLError), err.value
        sarc.frontends.dgl.unpatch()   # twice: a no-op
    finally:
        sarc.frontends.dgl.patch()   # as the other tests of this process may have left it
        if not getattr(original, "_sarc_routed", False):
            sarc.frontends.dgl.unpatch()


def test_a_patched_conv_on_a_graph_of_as_many_edges_as_nodes_keeps_its_declaration():
    """A patched conv declares its features from the first call's rows; on a later graph
    with as many edges as nodes (a mini-batch block can be one) a feature's rows fit both,
    and the earlier declaration is taken (it was refused as unclear: a sampled step failed
    at random). A first call on such a graph reads the argument as DGL names it: ``feat``
    is node data, ``edge_weight`` edge data (it was refused)."""
    sarc.frontends.dgl.patch()
    torch.manual_seed(0)
    conv = GraphConv(IN, 3, allow_zero_in_degree=True)
    src, dst = _edges()
    x = torch.randn(N, IN)
    conv(sarc.Graph.from_edges(src, dst, N), x)
    ring = torch.arange(N)
    square = sarc.Graph.from_edges(ring, (ring + 1) % N, N)        # N nodes, N edges
    got = conv(square, x)
    want = conv(dgl.graph(((ring).tolist(), ((ring + 1) % N).tolist()), num_nodes=N), x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    first = GraphConv(IN, 3, allow_zero_in_degree=True)
    w = torch.rand(N) + 0.5
    torch.testing.assert_close(first(square, x, edge_weight=w),
                               first(dgl.graph((ring.tolist(), ((ring + 1) % N).tolist()),
                                               num_nodes=N), x, edge_weight=w),
                               rtol=1e-5, atol=1e-6)
    (layer,) = first.__dict__["_sarc_layers"].values()
    assert set(layer._sarc_node) == {"feat"} and set(layer._sarc_edge) == {"edge_weight"}


class _OptionalWeights(nn.Module):
    """A branch on ``isinstance(w, torch.Tensor)``: taken for the traced edge weights, as
    DGL's code takes it for the tensor (it was False, and the weights silently ignored)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, g, feat, w):
        with g.local_scope():
            g.srcdata["h"] = torch.pow(self.lin(feat), 2.0)
            if isinstance(w, torch.Tensor):
                g.edata["w"] = w.unsqueeze(-1)
            else:
                g.edata["w"] = torch.ones(g.num_edges(), 1)
            g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "o"))
            return torch.where(g.dstdata["o"] > 0.1, g.dstdata["o"], 0.0)


def test_a_traced_value_is_a_tensor_to_the_modules_code():
    torch.manual_seed(0)
    src, dst = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])
    x, w = torch.randn(3, 3), torch.tensor([0.5, 2.0, 3.0, 0.1])
    module = _OptionalWeights()
    want = module(dgl.graph((src, dst), num_nodes=3), x, w)
    layer = from_dgl_module(module, node={"feat": 3}, edge={"w": ()})
    got = layer(sarc.Graph.from_edges(src, dst, 3), x, w)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got, want)


class _KeepsIsolated(nn.Module):
    """``g.in_degrees() == 0`` as a mask: nodes without in-edges keep their own features
    (it was an internal AttributeError)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(IN, 4)

    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.mean("m", "o"))
            alone = (g.in_degrees() == 0).unsqueeze(-1)
            return torch.where(alone, self.lin(feat[:g.num_dst_nodes()]), g.dstdata["o"])


def test_no_in_edges_as_a_mask_equals_dgl():
    _equals_dgl(_KeepsIsolated())


class _BiasIfIsolated(_KeepsIsolated):
    def forward(self, g, feat):
        with g.local_scope():
            g.srcdata["h"] = self.lin(feat)
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "o"))
            out = g.dstdata["o"]
            if (g.in_degrees() == 0).any():  # ERR:branch
                out = out + 1.0
            return out


def test_a_branch_on_nodes_without_in_edges_is_refused_naming_it():
    """It was traced as DGL's convs' check (False, then a graph with such nodes refused,
    saying to build the module with allow_zero_in_degree=True, an option it has not)."""
    src, dst = _edges(False)
    layer = from_dgl_module(_BiasIfIsolated(), node={"feat": IN})
    line = next(n for n, text in enumerate(open(__file__).read().splitlines(), 1)
                if text.endswith("# ERR:branch"))
    with pytest.raises(GraphError, match=rf"_BiasIfIsolated: there are nodes without incoming "
                                         rf"edges, and the module branches on whether there are "
                                         rf"\(\(g.in_degrees\(\) == 0\).any\(\) at "
                                         rf".*test_dgl_graph_data.py:{line}\)"):
        layer(sarc.Graph.from_edges(src, dst, N), torch.randn(N, IN))
    with_loops = sarc.Graph.from_edges(torch.cat([src, torch.arange(N)]),
                                       torch.cat([dst, torch.arange(N)]), N)
    assert layer(with_loops, torch.randn(N, IN)).shape == (N, 4)
