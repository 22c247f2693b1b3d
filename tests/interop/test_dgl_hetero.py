"""``sarc.HeteroConv`` against DGL's ``HeteroGraphConv`` (runs in the DGL environment).

A DGL heterograph of two node types and four canonical relations (within and across
the types) with ``GraphConv`` (norm both) or ``SAGEConv`` (mean) per relation, and the
same graph as sarc sees it: one node id space (type "a" first), an ``etype`` per edge
(the relation's index) and an ``ntype`` per node; each relation's sarc layer is its DGL
module traced by ``sarc.frontends.dgl.from_dgl_module`` (sharing its parameters). The
outputs per destination type, the input gradients and every parameter gradient equal.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dgl_support import require_dgl  # noqa: E402

import sarc  # noqa: E402

SIZES = {"a": 23, "b": 17}
RELATIONS = [("a", "r0", "a"), ("a", "r1", "b"), ("b", "r2", "a"), ("b", "r3", "b")]
F_IN, F_OUT = 5, 4


def hetero_graph(dgl, seed: int, empty: tuple = ()):
    """A random heterograph; the relations ``empty`` names have no edges."""
    gen = torch.Generator().manual_seed(seed)
    edges = {}
    for s, r, d in RELATIONS:
        e = int(torch.randint(15, 40, (1,), generator=gen)) if r not in empty else 0
        edges[(s, r, d)] = (torch.randint(0, SIZES[s] - 2, (e,), generator=gen),
                            torch.randint(0, SIZES[d] - 2, (e,), generator=gen))
    hg = dgl.heterograph(edges, num_nodes_dict=SIZES)
    feats = {t: torch.randn(n, F_IN, generator=gen) for t, n in SIZES.items()}
    return hg, edges, feats


def as_typed_graph(edges):
    """One id space (type "a" nodes, then "b"), an edge type and a node type per edge / node."""
    offset = {"a": 0, "b": SIZES["a"]}
    src, dst, etype = [], [], []
    for i, (s, r, d) in enumerate(RELATIONS):
        u, v = edges[(s, r, d)]
        src.append(u + offset[s])
        dst.append(v + offset[d])
        etype.append(torch.full_like(u, i))
    n = sum(SIZES.values())
    ntype = torch.cat([torch.zeros(SIZES["a"], dtype=torch.int64),
                       torch.ones(SIZES["b"], dtype=torch.int64)])
    return sarc.Graph.from_edges(torch.cat(src), torch.cat(dst), n), torch.cat(etype), ntype


def make_module(kind: str):
    from dgl.nn.pytorch import GraphConv, SAGEConv
    if kind == "graphconv":
        return GraphConv(F_IN, F_OUT, norm="both", allow_zero_in_degree=True)
    return SAGEConv(F_IN, F_OUT, "mean")


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max"])
@pytest.mark.parametrize("kind", ["graphconv", "sage", "mixed"])
@pytest.mark.parametrize("seed", [0, 1])
def test_hetero_conv_equals_dgl_heterographconv(aggregate, kind, seed):
    _equals_dgl(aggregate, kind, seed)


@pytest.mark.parametrize("aggregate", ["sum", "mean", "max"])
@pytest.mark.parametrize("empty", [("r3",), ("r1", "r2")])
def test_a_relation_without_edges_equals_dgls(aggregate, empty):
    """DGL runs a relation of the heterograph that has no edges (a SAGEConv's root term and
    bias, for its destination type); sarc, told the type (``dst_types``), the same."""
    _equals_dgl(aggregate, "sage", 3, empty)


def _equals_dgl(aggregate, kind, seed, empty=()):
    dgl = require_dgl()
    from dgl.nn.pytorch import HeteroGraphConv
    from sarc.frontends.dgl import from_dgl_module
    torch.manual_seed(seed)
    kinds = {"graphconv": ["graphconv"] * 4, "sage": ["sage"] * 4,
             "mixed": ["graphconv", "sage", "sage", "graphconv"]}[kind]
    mods = {r: make_module(k) for (_, r, _), k in zip(RELATIONS, kinds)}
    ours = sarc.HeteroConv({i: from_dgl_module(mods[r], node={"feat": F_IN})
                            for i, (_, r, _) in enumerate(RELATIONS)}, aggregate,
                           dst_types={i: "ab".index(d) for i, (_, r, d) in enumerate(RELATIONS)
                                      if r in empty})
    theirs = HeteroGraphConv(mods, aggregate=aggregate)
    hg, edges, feats = hetero_graph(dgl, seed, empty)
    g, etype, ntype = as_typed_graph(edges)

    xs = {t: f.clone().requires_grad_(True) for t, f in feats.items()}
    want = theirs(hg, xs)
    cot = {t: torch.randn(SIZES[t], F_OUT, generator=torch.Generator().manual_seed(9))
           for t in SIZES}
    torch.autograd.backward([want[t] for t in SIZES], [cot[t] for t in SIZES])
    want_grads = {k: p.grad.clone() for k, p in theirs.named_parameters()}
    theirs.zero_grad()

    x = torch.cat([feats["a"], feats["b"]]).requires_grad_(True)
    got = ours(g, x, etype=etype, ntype=ntype)
    got.backward(torch.cat([cot["a"], cot["b"]]))
    got_grads = {k: p.grad.clone() for k, p in theirs.named_parameters()}  # the same tensors

    torch.testing.assert_close(got[:SIZES["a"]], want["a"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[SIZES["a"]:], want["b"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, torch.cat([xs["a"].grad, xs["b"].grad]),
                               rtol=1e-5, atol=1e-6)
    assert set(got_grads) == set(want_grads)
    for k, w in want_grads.items():
        torch.testing.assert_close(got_grads[k], w, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("relations", [[("user", "buys", "item")], RELATIONS],
                         ids=["one-relation-two-types", "four-relations"])
def test_from_dgl_refuses_a_graph_of_several_node_types(relations):
    """One relation from users to items: from_dgl numbered both from 0 in one id space
    (user 0 -> item 0 became a self loop) rather than refuse, as it refuses several
    relations."""
    dgl = require_dgl()
    from sarc.errors import GraphError
    from sarc.interop import from_dgl
    hg = dgl.heterograph({r: (torch.tensor([0, 1]), torch.tensor([0, 0])) for r in relations})
    with pytest.raises(GraphError, match="from_dgl takes a homogeneous graph or block, got "
                                         ".*convert with dgl.to_homogeneous first"):
        from_dgl(hg)
