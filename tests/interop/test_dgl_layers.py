"""sarc's model zoo against DGL 2.1's layers: outputs and all gradients (.venv-dgl).

Every test copies the DGL layer's weights (zero-initialized ones made random)
into the sarc layer and checks the output, the input-feature gradient and
every parameter gradient: ``max|sarc - dgl| <= 1e-5 * max|dgl|`` (float32,
whole tensors), with a floor for tensors that are zero in exact arithmetic
(see ``interop_check``). Graphs and blocks come from ``sarc.interop.from_dgl``.

Library conventions the tests bridge:

- GraphConv(norm="both") scales u->v by ``deg_out(u)^-1/2 deg_in(v)^-1/2``,
  degrees clamped at 1: sarc's GCNLayer, on directed graphs too. Its weight is
  ``[in, out]``, sarc's ``lin.weight`` ``[out, in]``.
- SAGEConv("mean") puts the bias on ``fc_self``, sarc's SAGELayer on
  ``lin_neigh``: one shared bias either way.
- GATConv returns ``[N, H, C]`` with a per-head bias; sarc's ``concat=True`` is
  its output flattened. ``concat=False`` (mean over heads, then a ``[C]``
  bias) is GATConv(bias=False), averaged, plus a separate bias.
- RelGraphConv's TypedLinear holds ``W`` ``[R, in, out]`` (no regularizer) or
  ``W`` ``[B, in, out]`` with ``coeff`` ``[R, B]`` ("basis", ``W_r = sum_b
  coeff[r, b] W_b``): sarc's ``weight``, or ``bases`` and ``comp``. Its
  ``loop_weight`` ``[in, out]`` is sarc's ``root.weight`` transposed, ``h_bias``
  sarc's ``bias``; ``norm`` is an ``[E, 1]`` edge weight there, ``[E]`` in sarc.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from dgl_support import require_dgl
from interop_check import (Pair, compare, graph_cases, one_thread, random_etypes,  # noqa: F401
                           same, transpose)
from sarc import Graph
from sarc.interop import from_dgl, to_dgl

from edgeconv import EdgeConvLayer
from gat import GATLayer
from gcn import GCNLayer
from gin import GINLayer
from rgcn import RGCNLayer
from sage import SAGELayer

pytestmark = pytest.mark.dgl

GRAPHS = graph_cases()
DIMS = [(3, 7), (100, 7), (7, 3)]  # none a power of two; GraphConv's order flips at in > out
SMALL_DIMS = [(7, 3), (100, 7)]  # for the layers with more variants each


def dgl_graph(src, dst, n):
    dgl = require_dgl()
    return dgl.graph((src, dst), num_nodes=n)


# --- pairs: (DGL graph or block, sizes) -> Pair ---------------------------------------------

def gcn_pair(dg, d_in, d_out):
    from dgl.nn.pytorch import GraphConv
    sarc_layer = GCNLayer(d_in, d_out)
    lib = GraphConv(d_in, d_out, norm="both", allow_zero_in_degree=True)
    g = from_dgl(dg)
    return Pair(sarc_layer, lib, {"lin.weight": ("weight", transpose), "bias": ("bias", same)},
                lambda x: sarc_layer(g, x), lambda x: lib(dg, x))


NO_EDGE_MAX = ("DGL 2.1's max over a graph without edges passes a gradient to node 0's "
               "message (its backward's argmax of 0); sarc's is 0, as PyG's (test_pyg_layers)")


def sage_pair(dg, d_in, d_out, aggregator="mean"):
    """SAGEConv("mean"), or "pool": relu(fc_pool(x)) at the sources, their max."""
    from dgl.nn.pytorch import SAGEConv
    sarc_layer, lib = SAGELayer(d_in, d_out, aggregator), SAGEConv(d_in, d_out, aggregator)
    g = from_dgl(dg)
    params = {"lin_neigh.weight": ("fc_neigh.weight", same),
              "lin_neigh.bias": ("fc_self.bias", same),
              "lin_self.weight": ("fc_self.weight", same)}
    if aggregator == "pool":
        params.update({"fc_pool.weight": ("fc_pool.weight", same),
                       "fc_pool.bias": ("fc_pool.bias", same)})
    return Pair(sarc_layer, lib, params, lambda x: sarc_layer(g, x), lambda x: lib(dg, x))


class MeanHeadsGAT(nn.Module):
    """GATConv(bias=False) averaged over heads, plus a [C] bias: sarc's concat=False."""

    def __init__(self, conv, out_feats):
        super().__init__()
        self.conv = conv
        self.bias = nn.Parameter(torch.zeros(out_feats))

    def forward(self, dg, x):
        return self.conv(dg, x).mean(1) + self.bias


def gat_pair(dg, d_in, d_out, heads, concat):
    from dgl.nn.pytorch import GATConv
    sarc_layer = GATLayer(d_in, d_out, heads=heads, negative_slope=0.2, concat=concat)
    conv = GATConv(d_in, d_out, heads, negative_slope=0.2, allow_zero_in_degree=True,
                   bias=concat)
    g = from_dgl(dg)
    if concat:
        lib, prefix, run_lib = conv, "", (lambda x: conv(dg, x).flatten(1))
    else:
        lib = MeanHeadsGAT(conv, d_out)
        prefix, run_lib = "conv.", (lambda x: lib(dg, x))
    params = {"lin.weight": (prefix + "fc.weight", same), "att_src": (prefix + "attn_l", same),
              "att_dst": (prefix + "attn_r", same), "bias": ("bias", same)}
    return Pair(sarc_layer, lib, params, lambda x: sarc_layer(g, x), run_lib)


def gin_pair(dg, d_in, d_out, eps, learn_eps):
    from dgl.nn.pytorch import GINConv
    hidden = 5
    sarc_layer = GINLayer(d_in, hidden, d_out, eps=eps, train_eps=learn_eps)
    mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    lib = GINConv(mlp, "sum", init_eps=eps, learn_eps=learn_eps)
    g = from_dgl(dg)
    params = {f"mlp.{i}.{w}": (f"apply_func.{i}.{w}", same) for i in (0, 2)
              for w in ("weight", "bias")}
    if learn_eps:
        params["eps"] = ("eps", same)
    else:
        # sarc's fixed eps is a python float, DGL's a float32 buffer: the same value
        assert torch.equal(lib.eps, torch.tensor([sarc_layer.eps], dtype=torch.float32))
    return Pair(sarc_layer, lib, params, lambda x: sarc_layer(g, x), lambda x: lib(dg, x))


def edgeconv_pair(dg, d_in, d_out):
    """EdgeConv: theta(x_v - x_u) + phi(x_v), their max; DGL's without batch norm."""
    from dgl.nn.pytorch import EdgeConv
    sarc_layer = EdgeConvLayer(d_in, d_out)
    lib = EdgeConv(d_in, d_out, batch_norm=False, allow_zero_in_degree=True)
    g = from_dgl(dg)
    params = {f"{m}.{w}": (f"{m}.{w}", same) for m in ("theta", "phi") for w in ("weight", "bias")}
    return Pair(sarc_layer, lib, params, lambda x: sarc_layer(g, x), lambda x: lib(dg, x))


def rgcn_pair(dg, d_in, d_out, num_rels, num_bases):
    from dgl.nn.pytorch import RelGraphConv
    sarc_layer = RGCNLayer(d_in, d_out, num_rels, num_bases)
    regularizer = None if num_bases is None else "basis"
    lib = RelGraphConv(d_in, d_out, num_rels, regularizer=regularizer, num_bases=num_bases,
                       self_loop=True)
    params = {"root.weight": ("loop_weight", transpose), "bias": ("h_bias", same)}
    if num_bases is None:
        params["rel.weight"] = ("linear_r.W", same)
    else:
        params["rel.bases"] = ("linear_r.W", same)
        params["rel.comp"] = ("linear_r.coeff", same)
    etype = random_etypes(dg.num_edges(), num_rels)
    norm = torch.rand(dg.num_edges()) + 0.1  # any per-edge weight
    g = from_dgl(dg)
    return Pair(sarc_layer, lib, params, lambda x: sarc_layer(g, x, etype=etype, norm=norm),
                lambda x: lib(dg, x, etype, norm.unsqueeze(-1)))


# --- whole graphs ---------------------------------------------------------------------------

@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("graph", GRAPHS)
def test_gcn(graph, dims):
    src, dst, n = GRAPHS[graph]
    # Directed graphs as they are: DGL and sarc both use out-degree at the source.
    compare(gcn_pair(dgl_graph(src, dst, n), *dims), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("aggregator", ["mean", "pool"])
def test_sage(graph, dims, aggregator):
    src, dst, n = GRAPHS[graph]
    if aggregator == "pool" and src.numel() == 0:
        pytest.skip(NO_EDGE_MAX)
    compare(sage_pair(dgl_graph(src, dst, n), *dims, aggregator), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("heads,concat", [(1, True), (4, True), (4, False)])
@pytest.mark.parametrize("graph", GRAPHS)
def test_gat(graph, heads, concat, dims):
    src, dst, n = GRAPHS[graph]
    compare(gat_pair(dgl_graph(src, dst, n), *dims, heads, concat), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("eps,learn_eps", [(0.0, False), (0.3, False), (-0.2, True)])
@pytest.mark.parametrize("graph", GRAPHS)
def test_gin(graph, eps, learn_eps, dims):
    src, dst, n = GRAPHS[graph]
    compare(gin_pair(dgl_graph(src, dst, n), *dims, eps, learn_eps), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("graph", GRAPHS)
def test_edgeconv(graph, dims):
    src, dst, n = GRAPHS[graph]
    if src.numel() == 0:
        pytest.skip(NO_EDGE_MAX)
    compare(edgeconv_pair(dgl_graph(src, dst, n), *dims), torch.randn(n, dims[0]))


# RelGraphConv's edge UDF warns on a graph without edges; the result is still compared.
@pytest.mark.filterwarnings("ignore:The input graph for the user-defined edge function")
@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("num_bases", [None, 2], ids=["no_regularizer", "basis"])
@pytest.mark.parametrize("graph", GRAPHS)
def test_rgcn(graph, num_bases, dims):
    src, dst, n = GRAPHS[graph]
    compare(rgcn_pair(dgl_graph(src, dst, n), *dims, 3, num_bases), torch.randn(n, dims[0]))


# --- message flow graphs (dgl.to_block) -----------------------------------------------------

def _block(seeds):
    """An MFG of the "random" graph into ``seeds`` (seeds come first among its src nodes)."""
    dgl = require_dgl()
    src, dst, n = GRAPHS["random"]
    frontier = dgl.in_subgraph(dgl.graph((src, dst), num_nodes=n), seeds)
    return dgl.to_block(frontier, dst_nodes=seeds)


BLOCK_LAYERS = {
    "gcn": lambda b: gcn_pair(b, 7, 3),
    "sage": lambda b: sage_pair(b, 7, 3),
    "sage_pool": lambda b: sage_pair(b, 7, 3, "pool"),
    "gat": lambda b: gat_pair(b, 7, 3, 4, True),
    "gat_mean": lambda b: gat_pair(b, 7, 3, 4, False),
    "gin": lambda b: gin_pair(b, 7, 3, 0.3, True),
    "rgcn": lambda b: rgcn_pair(b, 7, 3, 3, 2),
    "edgeconv": lambda b: edgeconv_pair(b, 7, 3),
}


@pytest.mark.parametrize("layer", BLOCK_LAYERS)
def test_block(layer):
    # seed 11 has no in-edges (a dst row with zero in-degree); 3 has multi-edges
    block = _block(torch.tensor([3, 0, 11, 5]))
    assert block.num_src_nodes() > block.num_dst_nodes() == 4
    compare(BLOCK_LAYERS[layer](block), torch.randn(block.num_src_nodes(), 7))


class TwoLayers(nn.Module):
    """Two layers on a list of blocks, a ReLU between them."""

    def __init__(self, first, second, run):
        super().__init__()
        self.first, self.second, self.run = first, second, run

    def forward(self, x):
        return self.run(self.second, 1, torch.relu(self.run(self.first, 0, x)))


@pytest.mark.parametrize("layer", ["gcn", "sage", "gat"])
def test_two_layer_mfg(layer):
    """Blocks from DGL's neighbor sampler, chained: layer 2 reads layer 1's dst rows."""
    dgl = require_dgl()
    src, dst, n = GRAPHS["random"]
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(2)
    input_nodes, _, blocks = sampler.sample_blocks(dgl.graph((src, dst), num_nodes=n),
                                                   torch.tensor([0, 4, 12]))
    dims = [(7, 5), (5, 3)]
    make = {"gcn": lambda b, d: gcn_pair(b, *d), "sage": lambda b, d: sage_pair(b, *d),
            "gat": lambda b, d: gat_pair(b, d[0], d[1], 1, True)}[layer]
    pairs = [make(b, d) for b, d in zip(blocks, dims)]
    sarc_net = TwoLayers(pairs[0].sarc, pairs[1].sarc, lambda m, i, x: pairs[i].run_sarc(x))
    lib_net = TwoLayers(pairs[0].lib, pairs[1].lib, lambda m, i, x: pairs[i].run_lib(x))
    params = {f"{side}.{k}": (f"{side}.{v}", f) for side, p in zip(("first", "second"), pairs)
              for k, (v, f) in p.params.items()}
    compare(Pair(sarc_net, lib_net, params, sarc_net, lib_net),
            torch.randn(len(input_nodes), 7))


# --- random graphs --------------------------------------------------------------------------

@st.composite
def edge_lists(draw, max_nodes=12, max_edges=40):
    n = draw(st.integers(1, max_nodes))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=max_edges))
    return (torch.tensor([p[0] for p in pairs], dtype=torch.int64),
            torch.tensor([p[1] for p in pairs], dtype=torch.int64), n)


@settings(max_examples=20, deadline=None)
@given(graph=edge_lists(), layer=st.sampled_from(["gcn", "sage", "sage_pool", "gat1", "gat4"]),
       seed=st.integers(0, 2**31 - 1))
def test_random_graphs(graph, layer, seed):
    src, dst, n = graph
    assume(layer != "sage_pool" or src.numel() > 0)  # NO_EDGE_MAX
    dg = dgl_graph(src, dst, n)
    torch.manual_seed(seed)
    pair = {"gcn": lambda: gcn_pair(dg, 5, 3), "sage": lambda: sage_pair(dg, 5, 3),
            "sage_pool": lambda: sage_pair(dg, 5, 3, "pool"),
            "gat1": lambda: gat_pair(dg, 5, 3, 1, True),
            "gat4": lambda: gat_pair(dg, 5, 3, 4, True)}[layer]()
    compare(pair, torch.randn(n, 5))


# --- conversions ----------------------------------------------------------------------------

@pytest.mark.parametrize("graph", GRAPHS)
def test_graph_round_trip(graph):
    src, dst, n = GRAPHS[graph]
    dg = dgl_graph(src, dst, n)
    g = from_dgl(dg)
    assert (g.num_src, g.num_dst, g.num_edges) == (n, n, src.numel())
    assert torch.equal(g.in_degree, dg.in_degrees().float())
    assert torch.equal(g.out_degree, dg.out_degrees().float())
    back = to_dgl(g)
    assert not back.is_block and back.num_nodes() == n
    assert all(torch.equal(a, b) for a, b in zip(back.edges(order="eid"), (src, dst)))


def test_block_round_trip():
    block = _block(torch.tensor([3, 0, 11, 5]))
    g = from_dgl(block)
    assert (g.num_src, g.num_dst) == (block.num_src_nodes(), block.num_dst_nodes())
    assert torch.equal(g.in_degree, block.in_degrees().float())
    assert torch.equal(g.out_degree, block.out_degrees().float())
    back = to_dgl(g)
    assert back.is_block
    assert (back.num_src_nodes(), back.num_dst_nodes()) == (g.num_src, g.num_dst)
    assert all(torch.equal(a, b) for a, b in zip(back.edges(order="eid"),
                                                 block.edges(order="eid")))


def test_split_block():
    """A block made with include_dst_in_src=False: an error by default, a split block on request."""
    dgl = require_dgl()
    from sarc.errors import GraphError
    src, dst, n = GRAPHS["random"]
    seeds = torch.tensor([3, 0, 11, 5])
    frontier = dgl.in_subgraph(dgl.graph((src, dst), num_nodes=n), seeds)
    block = dgl.to_block(frontier, dst_nodes=seeds, include_dst_in_src=False)
    with pytest.raises(GraphError, match="dst_in_src=False"):
        from_dgl(block)
    g = from_dgl(block, dst_in_src=False)
    assert not g.dst_in_src
    assert (g.num_src, g.num_dst) == (block.num_src_nodes(), block.num_dst_nodes())
    back = to_dgl(g)
    assert back.is_block
    assert all(torch.equal(a, b) for a, b in zip(back.edges(order="eid"),
                                                 block.edges(order="eid")))
    # equal sizes do not make a split block a graph
    square = Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), num_src=2, num_dst=2,
                              dst_in_src=False)
    assert to_dgl(square).is_block


def test_from_dgl_rejects_heterographs():
    dgl = require_dgl()
    from sarc.errors import GraphError
    hg = dgl.heterograph({("a", "r", "b"): (torch.tensor([0]), torch.tensor([0])),
                          ("b", "s", "a"): (torch.tensor([0]), torch.tensor([0]))})
    with pytest.raises(GraphError, match="homogeneous"):
        from_dgl(hg)


def test_interop_does_not_import_dgl():
    """Importing sarc and sarc.interop leaves DGL unimported (it is imported inside functions)."""
    require_dgl()  # only meaningful where DGL is installed
    code = "import sys, sarc, sarc.interop; assert 'dgl' not in sys.modules, 'dgl was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
