"""The PyTorch backend against the reference interpreter, layer by layer.

Every model layer (in several configurations) and a few dedicated layers for
the reduce kinds and edge_softmax run compiled and interpreted on graphs with
the awkward cases: nodes without in-edges, self loops, multi-edges (exact ties
in max / min), a single node, no edges at all, blocks with more source than
destination nodes, and feature sizes that are not powers of two. Outputs and
the gradients of every parameter and input feature must agree to 1e-5.

A dense oracle (a Python loop over destination nodes with ``torch.amax``,
``torch.softmax``, ...) pins the meaning of the reductions themselves, so the
two implementations cannot agree on a wrong answer.
"""
from __future__ import annotations

import pytest
import torch
from difftest import (assert_close, block, check_layer, one_torch_thread,  # noqa: F401
                      random_block, reference)
from zoo import LAYERS, features

import sarc


def _graphs() -> dict[str, sarc.Graph]:
    gen = torch.Generator().manual_seed(1)
    return {
        "random": random_block(gen, 9, 9, 30),
        # nodes 0, 4, 5 have no in-edges; 5 has no edges at all
        "zero_in_degree": block([0, 0, 1, 2, 4], [1, 2, 3, 3, 1], 6),
        "self_loops": block([0, 1, 2, 3, 0, 2], [0, 1, 2, 3, 1, 0], 4),
        # the same edge several times: equal messages, exact ties in max / min
        "multi_edges": block([0, 0, 0, 1, 1, 2, 3, 3], [1, 1, 1, 2, 2, 2, 0, 0], 4),
        "one_node": block([], [], 1),
        "one_node_self_loop": block([0, 0], [0, 0], 1),
        "no_edges": block([], [], 5),
        "block": block([0, 3, 4, 5, 6, 6, 2, 1, 6], [0, 0, 1, 1, 1, 2, 2, 0, 0], 7, 3),
        "block_empty_dst": block([3, 4], [0, 0], 5, 2),
    }


GRAPHS = _graphs()


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_model_on_graph(model, graph):
    g = GRAPHS[graph]
    layer = LAYERS[model](7)
    out = check_layer(layer, g, features(layer, g, 7))
    assert next(iter(out.values())).shape[0] == g.num_dst


@pytest.mark.parametrize("d", [1, 3, 100])   # and 7, in test_model_on_graph
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_model_feature_sizes(model, d):
    g = GRAPHS["random"]
    layer = LAYERS[model](d)
    check_layer(layer, g, features(layer, g, d))


def test_model_in_eval_mode():
    g = GRAPHS["random"]
    from gat import GATLayer
    layer = GATLayer(7, 3, heads=2, attn_drop=0.5).eval()
    check_layer(layer, g, features(layer, g, 7))


# --- dedicated layers: one per reduce kind, edge_softmax ---------------------------------

REDUCERS = {"sum": sarc.sum, "mean": sarc.mean, "max": sarc.max, "min": sarc.min}


class ReduceLayer(sarc.Layer):
    """m = src.h * w + dst.h (an edge weight, both endpoints), reduced by ``kind``."""

    def __init__(self, kind: str, d: int):
        super().__init__(node={"h": d}, edge={"w": ()})
        self.kind = kind

    def message(self, src, dst, edge):
        return src.h * edge.w.unsqueeze(-1) + dst.h

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


class GatherReduceLayer(sarc.Layer):
    """Reduce a transformed source feature: equal per multi-edge, so ties are exact.

    ``relu`` of mostly negative inputs makes many messages exactly 0, the case
    where a scatter-based max with a zero initial value gets its gradient wrong.
    """

    def __init__(self, kind: str, d: int, act: bool):
        super().__init__(node={"h": d})
        self.kind, self.act = kind, act

    def message(self, src, dst, edge):
        return src.h.relu() if self.act else src.h * 2.0

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


class SoftmaxLayer(sarc.Layer):
    """Attention-weighted sum with ``heads`` scores per edge (GAT without the linear maps)."""

    def __init__(self, heads: int, d: int):
        super().__init__(node={"h": (heads, d)})
        self.heads = heads

    def message(self, src, dst, edge):
        return {"v": src.h, "score": (src.h * dst.h).sum(-1)}

    def reduce(self, msg):
        return sarc.sum(msg.v * sarc.edge_softmax(msg.score).unsqueeze(-1))


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_reduce_kinds(kind, graph):
    g = GRAPHS[graph]
    check_layer(ReduceLayer(kind, 3), g, {"h": torch.randn(g.num_src, 3),
                                         "w": torch.randn(g.num_edges)})


TIE_GRAPHS = ["multi_edges", "one_node_self_loop", "zero_in_degree", "block", "no_edges"]


@pytest.mark.parametrize("act", [False, True], ids=["scaled", "relu"])
@pytest.mark.parametrize("graph", TIE_GRAPHS)
@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_reduce_kinds_with_ties(kind, graph, act):
    g = GRAPHS[graph]
    h = torch.randn(g.num_src, 4) - (1.0 if act else 0.0)
    check_layer(GatherReduceLayer(kind, 4, act), g, {"h": h})


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("heads", [1, 3])
def test_edge_softmax(heads, graph):
    g = GRAPHS[graph]
    check_layer(SoftmaxLayer(heads, 5), g, {"h": torch.randn(g.num_src, heads, 5)})


def test_edge_softmax_large_scores_do_not_overflow():
    g = GRAPHS["multi_edges"]
    out = check_layer(SoftmaxLayer(2, 3), g, {"h": 30.0 * torch.randn(g.num_src, 2, 3)})
    assert torch.isfinite(out["h"]).all()


# --- a dense oracle for the reductions -----------------------------------------------------

def _dense_reduce(kind: str, x: torch.Tensor, g: sarc.Graph) -> torch.Tensor:
    """Per destination, the reduction of its incoming edges' rows (0 if none)."""
    rows = []
    for v in range(g.num_dst):
        xs = x[g.dst == v]
        if xs.shape[0] == 0:
            rows.append(torch.zeros(x.shape[1:]))
        elif kind == "sum":
            rows.append(xs.sum(0))
        elif kind == "mean":
            rows.append(xs.mean(0))
        elif kind == "max":
            rows.append(xs.amax(0))   # amax: the gradient is split evenly among ties
        else:
            rows.append(xs.amin(0))
    return torch.stack(rows) if rows else x.new_zeros(0, *x.shape[1:])


def _grad_or_zeros(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not loss.requires_grad:     # no edges: the oracle's zeros do not depend on x
        return torch.zeros_like(x)
    (gx,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if gx is None else gx


@pytest.mark.parametrize("values", ["relu", "integers"])
@pytest.mark.parametrize("graph", ["random", "multi_edges", "zero_in_degree", "block", "no_edges"])
@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_reductions_match_dense_oracle(kind, graph, values):
    """Both implementations of y[v] = kind_{u->v} m(h_u), values and gradients.

    ``relu``: m = relu(h), many messages exactly 0. ``integers``: m = 2 h with h in
    {-1, 0, 1}: ties between different sources, and extrema that are exactly 0 with a
    nonzero gradient (where a scatter into zeros counts its initial value as a tie).
    """
    g = GRAPHS[graph]
    act = values == "relu"
    layer = GatherReduceLayer(kind, 4, act=act)
    if act:
        h = torch.randn(g.num_src, 4) - 0.5
        h[0] = -1.0
    else:
        h = torch.randint(-1, 2, (g.num_src, 4)).float()
    cot = torch.randn(g.num_dst, 4)

    h_o = h.clone().requires_grad_()
    m = torch.relu(h_o) if act else 2.0 * h_o
    want = _dense_reduce(kind, m[g.src], g)
    want_grad = _grad_or_zeros((want * cot).sum(), h_o)

    for name, run in [("compiled", lambda x: layer(g, x)),
                      ("interpreter", lambda x: reference(layer, g, {"h": x})["h"])]:
        x = h.clone().requires_grad_()
        y = run(x)
        assert_close(y, want, what=f"{name} value")
        assert_close(_grad_or_zeros((y * cot).sum(), x), want_grad, what=f"{name} grad")


@pytest.mark.parametrize("graph", ["random", "multi_edges", "self_loops", "block"])
def test_edge_softmax_matches_dense_oracle(graph):
    g = GRAPHS[graph]
    layer = SoftmaxLayer(2, 3)
    h = torch.randn(g.num_src, 2, 3)
    cot = torch.randn(g.num_dst, 2, 3)

    def oracle(x):
        rows = []
        for v in range(g.num_dst):
            e = g.dst == v
            score = (x[g.src[e]] * x[v]).sum(-1)               # [deg, heads]
            alpha = torch.softmax(score, dim=0).unsqueeze(-1)
            rows.append((alpha * x[g.src[e]]).sum(0))
        return torch.stack(rows)

    h_o = h.clone().requires_grad_()
    want = oracle(h_o)
    (want_grad,) = torch.autograd.grad((want * cot).sum(), h_o)
    x = h.clone().requires_grad_()
    y = layer(g, x)
    assert_close(y, want, what="value")
    (gx,) = torch.autograd.grad((y * cot).sum(), x)
    assert_close(gx, want_grad, what="grad")


def test_max_tie_gradient_is_split_evenly_under_negative_cotangent():
    """Three parallel edges carry the maximum; each gets a third of a negative gradient."""
    g = block([0, 0, 0, 1], [1, 1, 1, 1], 2)
    layer = GatherReduceLayer("max", 1, act=False)
    x = torch.tensor([[2.0], [1.0]], requires_grad=True)
    y = layer(g, x)
    (gx,) = torch.autograd.grad(y[1, 0] * -3.0, x)
    # d max / d x0 = 2 (the message is 2 * x) split evenly over the three tied edges, summed back
    assert gx[0, 0].item() == pytest.approx(-6.0)
    assert gx[1, 0].item() == 0.0
    assert y[0, 0].item() == 0.0   # node 0 has no in-edges


# --- IR-level: axes, params broadcasting -----------------------------------------------------

def test_negative_feature_axes_mean_the_same_in_both():
    """sum_axis / concat with a negative axis count from the last feature axis."""
    from sarc.backends import torch_backend
    from sarc.ir import interpreter
    from sarc.ir.function import Builder
    from sarc.ir.ops import Op
    from sarc.ir.types import Domain, DType, TensorType

    b = Builder("Axes")
    h = b.leaf(Op.INPUT, "h", TensorType(Domain.SRC, DType.F32, (2, 3)))
    e = b.add(Op.GATHER_SRC, [h])
    s = b.add(Op.SUM_AXIS, [e], {"axis": -1})
    c = b.add(Op.CONCAT, [e, e], {"axis": -2})
    fn = b.finish([("s", b.add(Op.REDUCE, [s], {"kind": "sum"})),
                   ("c", b.add(Op.REDUCE, [c], {"kind": "max"}))])
    g = GRAPHS["random"]
    x = torch.randn(g.num_src, 2, 3)
    got_i = interpreter.run(fn, g, {"h": x}, {})
    got_c = torch_backend.compile(fn)(g, {"h": x}, {}, False)
    want_s = torch.zeros(g.num_dst, 2).index_add(0, g.dst, x[g.src].sum(-1))
    for got in (got_i, got_c):
        assert_close(got["s"], want_s)
        assert got["c"].shape == (g.num_dst, 4, 3)
        assert_close(got["c"], _dense_reduce("max", torch.cat([x[g.src], x[g.src]], 1), g))


def test_param_broadcast_against_heads():
    """att [1, H, C] times an edge value [E, H, C] (PyG's layout) keeps [E, H, C]."""

    class Att(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": (4, 3)})
            self.att = torch.nn.Parameter(torch.randn(1, 4, 3))
            self.scale = torch.nn.Parameter(torch.randn(3))

        def message(self, src, dst, edge):
            return (src.h * self.att).sum(-1) + (dst.h * self.scale).sum(-1)

        def reduce(self, msg):
            return sarc.sum(msg.m)

    g = GRAPHS["random"]
    out = check_layer(Att(), g, {"h": torch.randn(g.num_src, 4, 3)})
    assert out["h"].shape == (g.num_dst, 4)
