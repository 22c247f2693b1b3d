"""Property tests: backend == interpreter on random graphs and random DSL programs.

Graphs: 1..30 nodes, random edges with duplicates and self loops, blocks with
fewer destination than source nodes, graphs without edges. Programs: random
layers from ``programs.specs`` (gathers, elementwise math, linear maps,
parameters broadcast against edge values, every reduce kind, edge_softmax with
one or two heads, updates with the destination's own features). Values and the
gradients of every parameter and feature must agree (``difftest.check_layer``).
"""
from __future__ import annotations

import torch
from difftest import check_layer, one_torch_thread  # noqa: F401  (autouse fixture)
from gat import GATLayer
from gcn import GCNLayer
from gin import GINLayer
from hypothesis import example, given, settings
from hypothesis import strategies as st
from programs import Spec, features, graphs, make_layer, out_width, specs
from rgcn import RGCNLayer
from sage import SAGELayer

import sarc
from sarc.compiler import optimize
from sarc.ir.verifier import verify

MODELS = {
    "gcn": lambda d: GCNLayer(d, 3),
    "sage": lambda d: SAGELayer(d, 3),
    "gat": lambda d: GATLayer(d, 3, heads=2),
    "gat_mean": lambda d: GATLayer(d, 3, heads=2, concat=False),
    "gin": lambda d: GINLayer(d, 4, 3, train_eps=True),
    "rgcn": lambda d: RGCNLayer(d, 3, 3, num_bases=2),
}


@settings(max_examples=40, deadline=None)
@given(g=graphs(), model=st.sampled_from(sorted(MODELS)), d=st.sampled_from([1, 3, 6]),
       seed=st.integers(0, 2**16))
def test_models_on_random_graphs(g, model, d, seed):
    torch.manual_seed(seed)
    layer = MODELS[model](d)
    feats = {"h": torch.randn(g.num_src, d)}
    if model == "rgcn":
        feats["etype"] = torch.randint(0, 3, (g.num_edges,))
        feats["norm"] = torch.rand(g.num_edges)
    check_layer(layer, g, feats)


# -2 (theta h_u - theta h_v) summed into a hub whose sources are one node: the output
# and theta's gradient cancel, and the two implementations round their terms apart.
_HUB_OF_ONE_SOURCE = Spec(
    din=2, d=1, use_x=False, use_w=False, use_t=False, lins=((2, 1, False),), params=(),
    typed=(), messages=(("scale", -2.0, ("bin", "sub", ("src_lin", 0), ("dst_lin", 0))),),
    reduces=(("sum", 1),), update_self=None, update_act="tanh", concat=None, update_norm=True)
_HUB = sarc.Graph.from_edges(torch.tensor([0, 0, 0, 0, 0]), torch.tensor([0, 2, 2, 2, 2]),
                             num_src=3, num_dst=3)


@settings(max_examples=50, deadline=None)
@given(spec=specs(), g=graphs(), seed=st.integers(0, 2**16))
@example(spec=_HUB_OF_ONE_SOURCE, g=_HUB, seed=309)      # theta's gradient cancels
@example(spec=_HUB_OF_ONE_SOURCE, g=_HUB, seed=1458)     # the output cancels
def test_random_programs(spec, g, seed):
    torch.manual_seed(seed)
    layer = make_layer(spec)
    out = check_layer(layer, g, features(layer, g, seed))
    assert out["h"].shape == (g.num_dst, out_width(spec))


@settings(max_examples=30, deadline=None)
@given(spec=specs(), g=graphs(max_nodes=12, max_edges=30), seed=st.integers(0, 2**16))
def test_random_programs_in_eval_mode(spec, g, seed):
    torch.manual_seed(seed)
    layer = make_layer(spec).eval()
    check_layer(layer, g, features(layer, g, seed))


@settings(max_examples=25, deadline=None)
@given(spec=specs(max_depth=2), seed=st.integers(0, 2**16))
def test_random_programs_trace_and_optimize_verify(spec, seed):
    """Tracing gives verifying IR and the optimizer keeps it verifying, outputs intact."""
    torch.manual_seed(seed)
    fn = verify(make_layer(spec).trace())
    opt = optimize(fn)
    assert [name for name, _ in opt.outputs] == [name for name, _ in fn.outputs]
    for (_, i), (_, j) in zip(fn.outputs, opt.outputs):
        assert opt[j].type == fn[i].type


def test_graph_strategy_covers_the_edge_cases():
    """The graph strategy does produce the cases the properties are meant to cover."""
    seen = set()

    @settings(max_examples=200, deadline=None)
    @given(g=graphs())
    def probe(g):
        pairs = list(zip(g.src.tolist(), g.dst.tolist()))
        if g.num_edges == 0:
            seen.add("no_edges")
        if len(set(pairs)) < len(pairs):
            seen.add("multi_edges")
        if any(u == v for u, v in pairs):
            seen.add("self_loops")
        if g.num_dst < g.num_src:
            seen.add("block")
        if (g.in_degree == 0).any():
            seen.add("zero_in_degree")
        if g.num_src == 1:
            seen.add("one_node")

    probe()
    assert seen == {"no_edges", "multi_edges", "self_loops", "block", "zero_in_degree", "one_node"}

