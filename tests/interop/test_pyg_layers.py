"""sarc's model zoo against PyG's layers: outputs and all gradients (main environment).

Every test copies the PyG layer's weights (zero-initialized ones made random)
into the sarc layer and checks the output, the input-feature gradient and
every parameter gradient: ``max|sarc - pyg| <= 1e-5 * max|pyg|`` (float32,
whole tensors), with a floor for tensors that are zero in exact arithmetic
(see ``interop_check``). The graphs come from ``sarc.interop.from_pyg``.

Where PyG and sarc mean different things, the test runs the case where the
math agrees:

- GCN: ``GCNConv(add_self_loops=False, normalize=True)`` scales edge u->v by
  ``deg_in(u)^-1/2 deg_in(v)^-1/2`` (both degrees counted on targets, and 0
  where the degree is 0) while sarc's GCNLayer (and DGL) uses
  ``deg_out(u)^-1/2 deg_in(v)^-1/2``. On a symmetric graph in- and out-degree
  are equal, so every GCN graph here is symmetrized (self loops and
  multi-edges kept). A node of degree 0 has no edges, so PyG's 0 and sarc's
  clamp to 1 never meet an edge.
- GAT: ``GATConv(add_self_loops=False, dropout=0)``; self loops are in the graph
  when the test puts them there.
- RGCN: ``RGCNConv(aggr="mean")`` averages per relation, which is sarc's
  RGCNLayer with ``norm_e = 1 / |N_r(v)|``; ``aggr="add"`` is ``norm_e = 1``.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interop_check import (Pair, compare, graph_cases, one_thread, random_etypes,  # noqa: F401
                           relation_mean_norm, same, symmetric, transpose)
from sarc.interop import from_pyg

torch_geometric = pytest.importorskip("torch_geometric")
from torch_geometric.nn import GATConv, GCNConv, GINConv, RGCNConv, SAGEConv  # noqa: E402

from gat import GATLayer  # noqa: E402
from gcn import GCNLayer  # noqa: E402
from gin import GINLayer  # noqa: E402
from rgcn import RGCNLayer  # noqa: E402
from sage import SAGELayer  # noqa: E402

GRAPHS = graph_cases()
# (in, out) feature sizes, none a power of two; in > out and in < out both occur.
DIMS = [(3, 7), (100, 7), (7, 3)]
SMALL_DIMS = [(7, 3), (100, 7)]  # for the layers with more variants each


def edge_index(src, dst):
    return torch.stack([src, dst])


# --- pairs ----------------------------------------------------------------------------------

def gcn_pair(src, dst, n, d_in, d_out):
    sarc_layer, pyg = GCNLayer(d_in, d_out), GCNConv(d_in, d_out, add_self_loops=False,
                                                     normalize=True)
    g, ei = from_pyg(edge_index(src, dst), n), edge_index(src, dst)
    return Pair(sarc_layer, pyg, {"lin.weight": ("lin.weight", same), "bias": ("bias", same)},
                lambda x: sarc_layer(g, x), lambda x: pyg(x, ei))


def sage_pair(src, dst, n, d_in, d_out, num_dst=None, aggregator="mean"):
    """SAGEConv(aggr="mean"), or for sarc's pooling aggregator SAGEConv(aggr="max",
    project=True): relu(lin(x)) at the sources, their max."""
    sarc_layer = SAGELayer(d_in, d_out, aggregator)
    pool = aggregator == "pool"
    pyg = SAGEConv(d_in, d_out, aggr="max" if pool else "mean", project=pool)
    params = {"lin_neigh.weight": ("lin_l.weight", same), "lin_neigh.bias": ("lin_l.bias", same),
              "lin_self.weight": ("lin_r.weight", same)}
    if pool:
        params.update({"fc_pool.weight": ("lin.weight", same), "fc_pool.bias": ("lin.bias", same)})
    ei = edge_index(src, dst)
    if num_dst is None:
        g = from_pyg(ei, n)
        return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x), lambda x: pyg(x, ei))
    g = from_pyg(ei, (n, num_dst))
    return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x),
                lambda x: pyg((x, x[:num_dst]), ei, size=(n, num_dst)))


def gat_pair(src, dst, n, d_in, d_out, heads, concat, num_dst=None):
    sarc_layer = GATLayer(d_in, d_out, heads=heads, concat=concat)
    pyg = GATConv(d_in, d_out, heads=heads, concat=concat, add_self_loops=False, dropout=0.0)
    params = {"lin.weight": ("lin.weight", same), "att_src": ("att_src", same),
              "att_dst": ("att_dst", same), "bias": ("bias", same)}
    ei = edge_index(src, dst)
    if num_dst is None:
        g = from_pyg(ei, n)
        return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x), lambda x: pyg(x, ei))
    g = from_pyg(ei, (n, num_dst))
    return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x),
                lambda x: pyg((x, x[:num_dst]), ei, size=(n, num_dst)))


def gin_pair(src, dst, n, d_in, d_out, eps, train_eps, num_dst=None):
    hidden = 5
    sarc_layer = GINLayer(d_in, hidden, d_out, eps=eps, train_eps=train_eps)
    mlp = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, d_out))
    pyg = GINConv(mlp, eps=eps, train_eps=train_eps)
    params = {f"mlp.{i}.{w}": (f"nn.{i}.{w}", same) for i in (0, 2) for w in ("weight", "bias")}
    if train_eps:
        params["eps"] = ("eps", same)
    ei = edge_index(src, dst)
    if num_dst is None:
        g = from_pyg(ei, n)
        return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x), lambda x: pyg(x, ei))
    g = from_pyg(ei, (n, num_dst))
    return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x),
                lambda x: pyg((x, x[:num_dst]), ei, size=(n, num_dst)))


def rgcn_pair(src, dst, n, d_in, d_out, num_rels, num_bases, aggr, num_dst=None):
    sarc_layer = RGCNLayer(d_in, d_out, num_rels, num_bases)
    pyg = RGCNConv(d_in, d_out, num_rels, num_bases=num_bases, aggr=aggr)
    params = {"root.weight": ("root", transpose), "bias": ("bias", same)}
    if num_bases is None:
        params["rel.weight"] = ("weight", same)
    else:
        params["rel.bases"] = ("weight", same)
        params["rel.comp"] = ("comp", same)
    etype = random_etypes(src.numel(), num_rels)
    norm = relation_mean_norm(dst, etype, num_rels) if aggr == "mean" else torch.ones(src.numel())
    ei = edge_index(src, dst)
    g = from_pyg(ei, n if num_dst is None else (n, num_dst))
    run_pyg = ((lambda x: pyg(x, ei, etype)) if num_dst is None
               else (lambda x: pyg((x, x[:num_dst]), ei, etype)))
    return Pair(sarc_layer, pyg, params, lambda x: sarc_layer(g, x, etype=etype, norm=norm),
                run_pyg)


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("graph", GRAPHS)
def test_gcn(graph, dims):
    src, dst, n = GRAPHS[graph]
    src, dst = symmetric(src, dst)  # see the module docstring
    compare(gcn_pair(src, dst, n, *dims), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("aggregator", ["mean", "pool"])
@pytest.mark.parametrize("graph", GRAPHS)
def test_sage(graph, aggregator, dims):
    src, dst, n = GRAPHS[graph]
    compare(sage_pair(src, dst, n, *dims, aggregator=aggregator), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("heads,concat", [(1, True), (4, True), (4, False)])
@pytest.mark.parametrize("graph", GRAPHS)
def test_gat(graph, heads, concat, dims):
    src, dst, n = GRAPHS[graph]
    compare(gat_pair(src, dst, n, *dims, heads, concat), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("eps,train_eps", [(0.0, False), (0.3, False), (-0.2, True)])
@pytest.mark.parametrize("graph", GRAPHS)
def test_gin(graph, eps, train_eps, dims):
    src, dst, n = GRAPHS[graph]
    compare(gin_pair(src, dst, n, *dims, eps, train_eps), torch.randn(n, dims[0]))


@pytest.mark.parametrize("dims", SMALL_DIMS, ids=lambda d: f"{d[0]}to{d[1]}")
@pytest.mark.parametrize("num_bases,aggr", [(None, "mean"), (2, "mean"), (None, "add")])
@pytest.mark.parametrize("graph", GRAPHS)
def test_rgcn(graph, num_bases, aggr, dims):
    src, dst, n = GRAPHS[graph]
    compare(rgcn_pair(src, dst, n, *dims, 3, num_bases, aggr), torch.randn(n, dims[0]))


# Bipartite blocks (from_pyg with (num_src, num_dst)): PyG's layers take
# x = (x_src, x_dst) with x_dst = x_src[:num_dst], sarc's convention.
BLOCK_SRC = torch.tensor([0, 4, 5, 6, 6, 1, 2, 2, 7])
BLOCK_DST = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 2])   # dst 3 has no edges
BLOCK_N, BLOCK_DST_N = 8, 4


@pytest.mark.parametrize("layer", ["sage", "sage_pool", "gat", "gin", "rgcn"])
def test_bipartite_block(layer):
    args = (BLOCK_SRC, BLOCK_DST, BLOCK_N, 7, 3)
    pair = {"sage": lambda: sage_pair(*args, num_dst=BLOCK_DST_N),
            "sage_pool": lambda: sage_pair(*args, num_dst=BLOCK_DST_N, aggregator="pool"),
            "gat": lambda: gat_pair(*args, 4, True, num_dst=BLOCK_DST_N),
            "gin": lambda: gin_pair(*args, 0.3, True, num_dst=BLOCK_DST_N),
            "rgcn": lambda: rgcn_pair(*args, 3, 2, "mean", num_dst=BLOCK_DST_N)}[layer]()
    compare(pair, torch.randn(BLOCK_N, 7))


# --- random graphs --------------------------------------------------------------------------

@st.composite
def edge_lists(draw, max_nodes=12, max_edges=40):
    """(src, dst, n): any multigraph, self loops and isolated nodes included."""
    n = draw(st.integers(1, max_nodes))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)),
                          max_size=max_edges))
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    return src, dst, n


@settings(max_examples=20, deadline=None)
@given(graph=edge_lists(), layer=st.sampled_from(["gcn", "sage", "sage_pool", "gat1", "gat4"]),
       seed=st.integers(0, 2**31 - 1))
def test_random_graphs(graph, layer, seed):
    src, dst, n = graph
    torch.manual_seed(seed)
    if layer == "gcn":
        src, dst = symmetric(src, dst)
        pair = gcn_pair(src, dst, n, 5, 3)
    elif layer.startswith("sage"):
        pair = sage_pair(src, dst, n, 5, 3, aggregator="pool" if layer == "sage_pool" else "mean")
    else:
        pair = gat_pair(src, dst, n, 5, 3, heads=1 if layer == "gat1" else 4, concat=True)
    compare(pair, torch.randn(n, 5))


def test_from_pyg_keeps_edge_order_and_sizes():
    ei = torch.tensor([[2, 0, 1, 0], [0, 1, 0, 0]])
    g = from_pyg(ei, 4)
    assert (g.num_src, g.num_dst, g.num_edges) == (4, 4, 4)
    # CSR edge i is input edge perm[i]: the edge list comes back in input order
    assert torch.equal(ei[0][g.perm], g.src) and torch.equal(ei[1][g.perm], g.dst)
    assert g.in_degree.tolist() == [3.0, 1.0, 0.0, 0.0]
    assert g.out_degree.tolist() == [2.0, 1.0, 1.0, 0.0]
    block = from_pyg(ei, (4, 2))
    assert (block.num_src, block.num_dst) == (4, 2)

