"""Every kernel the Triton backend generates, against the PyTorch backend (values and gradients).

Each layer below makes the compiler generate one family of kernels; running it
forward and backward exercises them all:

- ``MessageLayer`` (sum / mean / max / min of ``src.h * edge.w + dst.h * p``):
  the CSR g-SpMM, the transposed (CSC) aggregate of the source gradient, the
  CSR aggregate of the destination gradient, the SDDMM of the edge gradient,
  the parameter gradient (per-row sums), and for max / min the tie count;
- ``AttentionLayer`` (GAT without its linear maps): the online-softmax
  aggregate and its backward (score and value gradients);
- ``GATLayer`` with attention dropout: an SDDMM score, the unfused edge_softmax
  and its backward, an aggregate of an edge weight times a source feature;
- ``RGCNLayer``: the typed (per-relation) linear with the gather of its input
  fused, its input and weight gradients, an aggregate of edge operands;
- ``SharedGatherLayer``: a gather used twice (an SDDMM copy kernel, whose
  gradient is a CSC aggregate).

on graphs with empty rows, zero-degree nodes, one node, no edges, blocks and a
power-law degree distribution (with the split length shrunk so its long rows
are cut into segments and merged), feature sizes 1, 3, 16, 100 and 257, 1 and
4 heads, and float16 / bfloat16 inputs (accumulated in float32) against a
float32 reference.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from attention_layers import SCORES, MaskedAttention, ScoreShapes, masked_attention_feats
from gat import GATLayer
from rgcn import RGCNLayer
from torch import nn
from difftest import assert_close
from triton_check import GRAPHS, compare, power_law_block, set_backend

import sarc

REDUCERS = {"sum": sarc.sum, "mean": sarc.mean, "max": sarc.max, "min": sarc.min}


class MessageLayer(sarc.Layer):
    """kind over the in-edges of ``src.h * edge.w + dst.h * p``: every operand side."""

    def __init__(self, kind: str, d: int, dtype: str = "f32"):
        super().__init__(node={"h": sarc.Feature((d,), dtype)}, edge={"w": sarc.Feature((), dtype)})
        self.kind = kind
        self.p = nn.Parameter(torch.randn(d))

    def message(self, src, dst, edge):
        return src.h * edge.w.unsqueeze(-1) + dst.h * self.p

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


class TiesLayer(sarc.Layer):
    """kind of ``relu(src.h)``: many messages exactly 0, exact ties on multi-edges."""

    def __init__(self, kind: str, d: int):
        super().__init__(node={"h": d})
        self.kind = kind

    def message(self, src, dst, edge):
        return src.h.relu()

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


class AttentionLayer(sarc.Layer):
    """Softmax-weighted sum of ``src.h`` with ``heads`` scores ``<src.h, dst.h> / sqrt(d)``."""

    def __init__(self, heads: int, d: int, dtype: str = "f32"):
        super().__init__(node={"h": sarc.Feature((heads, d), dtype)})
        self.scale = d ** -0.5

    def message(self, src, dst, edge):
        return {"v": src.h, "score": F.leaky_relu((src.h * dst.h).sum(-1) * self.scale, 0.2)}

    def reduce(self, msg):
        return sarc.sum(msg.v * sarc.edge_softmax(msg.score).unsqueeze(-1))


class SharedGatherLayer(sarc.Layer):
    """``src.h`` read per edge by a typed linear and by a max: the gather is its own kernel."""

    def __init__(self, d: int):
        super().__init__(node={"h": d}, edge={"etype": sarc.INDEX})
        self.rel = sarc.TypedLinear(d, d, 3)

    def message(self, src, dst, edge):
        x = src.h
        return {"a": self.rel(x, edge.etype), "b": x * 2.0}

    def reduce(self, msg):
        return {"a": sarc.sum(msg.a), "b": sarc.max(msg.b)}

    def update(self, dst, agg):
        return agg.a + agg.b


def message_feats(g, d, dtype=torch.float32):
    return {"h": torch.randn(g.num_src, d).to(dtype), "w": torch.randn(g.num_edges).to(dtype)}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_aggregate_kinds(kind, graph):
    g = GRAPHS[graph]
    compare(MessageLayer(kind, 3), g, message_feats(g, 3))


@pytest.mark.parametrize("graph", ["multi_edges", "one_node_self_loop", "zero_in_degree", "block"])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremum_ties(kind, graph):
    g = GRAPHS[graph]
    compare(TiesLayer(kind, 4), g, {"h": torch.randn(g.num_src, 4) - 0.5})


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("heads", [1, 4])
def test_softmax_aggregate(heads, graph):
    g = GRAPHS[graph]
    compare(AttentionLayer(heads, 3), g, {"h": torch.randn(g.num_src, heads, 3)})


@pytest.mark.parametrize("score", sorted(SCORES))
def test_softmax_weights_of_other_shapes(score):
    """A score kept with a size-1 axis, a scalar per edge, one per element, one per
    channel shared by the heads (unfused: an edge softmax, then the product's sum)."""
    torch.manual_seed(0)
    compare(ScoreShapes(5, 2, 4, score), power_law_block(), {"h": torch.randn(24, 5)})


def test_softmax_aggregate_large_scores_stay_finite():
    g = GRAPHS["multi_edges"]
    tri = compare(AttentionLayer(2, 3), g, {"h": 30.0 * torch.randn(g.num_src, 2, 3)})
    assert torch.isfinite(tri(g, h=30.0 * torch.randn(g.num_src, 2, 3))).all()


@pytest.mark.parametrize("split", [False, True], ids=["rows", "split_rows"])
@pytest.mark.parametrize("fill,shift", [(-1e9, 0.0), (-30.0, 1e5), (-30.0, -1e6)],
                         ids=["masked", "shifted_up", "shifted_down"])
@pytest.mark.parametrize("width", [4, 12])
def test_softmax_aggregate_of_scores_far_from_zero(width, fill, shift, split, request):
    """Scores of magnitude 1e5 to 1e9, rows whose every edge is masked among them: the
    weights the gradient kernels compute again are those of the forward (the row's max and
    sum kept apart: ``max + log(sum)`` rounds the sum away at such a max, and a masked row
    of k edges would weigh each 1, not 1 / k)."""
    if split:
        request.getfixturevalue("split_small")
    g = GRAPHS["power_law"]
    compare(MaskedAttention(width, fill, shift), g, masked_attention_feats(g))


@pytest.mark.parametrize("d", [1, 3, 16, 100, 257])
def test_feature_sizes_aggregate(d):
    g = GRAPHS["random"]
    compare(MessageLayer("sum", d), g, message_feats(g, d))
    compare(MessageLayer("max", d), g, message_feats(g, d))


@pytest.mark.parametrize("d", [1, 3, 16, 100, 257])
@pytest.mark.parametrize("heads", [1, 4])
def test_feature_sizes_attention(heads, d):
    g = GRAPHS["random"]
    compare(AttentionLayer(heads, d), g, {"h": torch.randn(g.num_src, heads, d)})


@pytest.mark.parametrize("d", [1, 3, 16, 100, 257])
def test_feature_sizes_gat_and_rgcn(d):
    g = GRAPHS["zero_in_degree"]
    compare(GATLayer(d, 3, heads=4, attn_drop=0.5).eval(), g, {"h": torch.randn(g.num_src, d)})
    compare(RGCNLayer(d, 5, 3), g, {"h": torch.randn(g.num_src, d),
                                    "etype": torch.randint(0, 3, (g.num_edges,)),
                                    "norm": torch.rand(g.num_edges) + 0.1})


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_edge_softmax_sddmm_typed_linear(graph):
    """GAT with attention dropout (sddmm, edge_softmax, aggregate of an edge weight), R-GCN
    (typed linear with a fused gather), a gather used twice (sddmm copy)."""
    g = GRAPHS[graph]
    h = torch.randn(g.num_src, 5)
    compare(GATLayer(5, 3, heads=4, attn_drop=0.3).eval(), g, {"h": h})
    etype = torch.randint(0, 3, (g.num_edges,))
    compare(RGCNLayer(5, 4, 3, num_bases=2), g,
            {"h": h, "etype": etype, "norm": torch.rand(g.num_edges) + 0.1})
    compare(SharedGatherLayer(5), g, {"h": h, "etype": etype})


def test_gat_attention_dropout_in_training():
    """Dropout on the attention weights runs as PyTorch between two kernels; same masks."""
    g = GRAPHS["power_law"]
    layer = GATLayer(6, 3, heads=2, attn_drop=0.5).train()
    h = torch.randn(g.num_src, 6)
    torch.manual_seed(11)
    compare(layer, g, {"h": h})


class NanLayer(sarc.Layer):
    """``kind`` of ``op(src.h - dst.h / 2)``, an edge value the kernel computes (not a node
    value pushed ahead of the gather): relu, clamp_min, clamp or none."""

    def __init__(self, kind: str, op: str):
        super().__init__(node={"h": 3})
        self.kind, self.op = kind, op

    def message(self, src, dst, edge):
        m = src.h - 0.5 * dst.h
        return {"relu": F.relu, "clamp_min": lambda t: t.clamp(min=0.25),
                "clamp": lambda t: t.clamp(-0.5, 0.5), "none": lambda t: t}[self.op](m)

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


@pytest.mark.parametrize("split", [False, True], ids=["rows", "split_rows"])
@pytest.mark.parametrize("op", ["relu", "clamp_min", "clamp", "none"])
@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_a_nan_propagates_as_in_torch(kind, op, split, request):
    """A NaN feature makes NaN every result that reads it, through relu / clamp in the
    edge kernel and the max / min reducers (Triton's maximum drops NaN by default), in
    whole rows and in split rows merged by the combine kernel; other results stay."""
    if split:
        request.getfixturevalue("split_small")
    g = GRAPHS["power_law"]
    h = torch.randn(g.num_src, 3)
    h[g.src[0], 0] = float("nan")  # one source: the rows of its out-edges
    layer = NanLayer(kind, op)
    with torch.no_grad():
        want = set_backend(copy.deepcopy(layer), "torch")(g, h)
        got = set_backend(copy.deepcopy(layer), "triton")(g, h)
    nan = torch.isnan(want)
    assert nan.any() and not nan.all()
    assert torch.equal(torch.isnan(got), nan)
    torch.testing.assert_close(got[~nan], want[~nan], rtol=1e-5, atol=1e-6)


# --- the schedule: degree buckets and split rows -------------------------------------------

@pytest.mark.parametrize("kind", sorted(REDUCERS))
def test_split_rows_aggregate(kind, split_small):
    g = GRAPHS["power_law"]
    compare(MessageLayer(kind, 5), g, message_feats(g, 5))


@pytest.mark.parametrize("heads", [1, 4])
def test_split_rows_attention(heads, split_small):
    g = GRAPHS["power_law"]
    compare(AttentionLayer(heads, 3), g, {"h": torch.randn(g.num_src, heads, 3)})
    compare(GATLayer(4, 3, heads=heads, attn_drop=0.3).eval(), g, {"h": torch.randn(g.num_src, 4)})


def test_split_rows_typed_linear(split_small):
    g = GRAPHS["power_law"]
    compare(RGCNLayer(6, 5, 3), g, {"h": torch.randn(g.num_src, 6),
                                    "etype": torch.randint(0, 3, (g.num_edges,)),
                                    "norm": torch.rand(g.num_edges) + 0.1})


def test_long_rows_without_splitting():
    """One program walks a hub's 200 edges in BLOCK_E steps (the default split length)."""
    g = sarc.Graph.from_edges(torch.arange(200) % 7, torch.zeros(200, dtype=torch.int64), 7)
    compare(MessageLayer("mean", 3), g, message_feats(g, 3))
    compare(AttentionLayer(2, 3), g, {"h": torch.randn(g.num_src, 2, 3)})


# --- half precision ------------------------------------------------------------------------

HALF = {"f16": (torch.float16, 5e-3), "bf16": (torch.bfloat16, 3e-2)}


def _twins(make, dtype):
    """A half-precision layer and its float32 twin with the same (rounded) parameters."""
    half = make(dtype).to(HALF[dtype][0])
    ref = make("f32")
    ref.load_state_dict({k: v.float() for k, v in half.state_dict().items()})
    return half, ref


@pytest.mark.parametrize("dtype", sorted(HALF))
@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
def test_half_precision_aggregate(kind, dtype):
    g = power_law_block()
    torch_dtype, rtol = HALF[dtype]
    half, ref = _twins(lambda dt: MessageLayer(kind, 16, dt), dtype)
    feats = message_feats(g, 16, torch_dtype)
    compare(half, g, feats, rtol=rtol, reference=ref,
            ref_feats={k: v.float() for k, v in feats.items()})


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_half_precision_attention(dtype, split_small):
    g = power_law_block()
    torch_dtype, rtol = HALF[dtype]
    half, ref = _twins(lambda dt: AttentionLayer(4, 8, dt), dtype)
    h = torch.randn(g.num_src, 4, 8).to(torch_dtype)
    compare(half, g, {"h": h}, rtol=rtol, reference=ref, ref_feats={"h": h.float()})


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_half_precision_typed_linear(dtype):
    g = power_law_block()
    torch_dtype, rtol = HALF[dtype]

    class Typed(sarc.Layer):
        def __init__(self, dt):
            super().__init__(node={"h": sarc.Feature((16,), dt)}, edge={"etype": sarc.INDEX})
            self.rel = sarc.TypedLinear(16, 16, 3)

        def message(self, src, dst, edge):
            return self.rel(src.h, edge.etype)

        def reduce(self, msg):
            return sarc.sum(msg.m)

    half, ref = _twins(Typed, dtype)
    feats = {"h": torch.randn(g.num_src, 16).to(torch_dtype),
             "etype": torch.randint(0, 3, (g.num_edges,))}
    compare(half, g, feats, rtol=rtol, reference=ref,
            ref_feats={"h": feats["h"].float(), "etype": feats["etype"]})


def test_float64():
    g = GRAPHS["random"]

    class Wide(MessageLayer):
        pass

    layer = Wide("mean", 4, "f64").double()
    compare(layer, g, message_feats(g, 4, torch.float64), rtol=1e-10)


class LinearMessages(sarc.Layer):
    """kind over the in-edges of ``lin(src.h)``: under autocast a half-precision operand of
    an op traced in float32."""

    def __init__(self, kind: str, d: int):
        super().__init__(node={"h": d})
        self.kind, self.lin = kind, nn.Linear(d, d)

    def message(self, src, dst, edge):
        return self.lin(src.h)

    def reduce(self, msg):
        return REDUCERS[self.kind](msg.m)


AUTOCAST_LAYERS = {**{k: (lambda k=k: LinearMessages(k, 6)) for k in ("sum", "mean", "max")},
                   "gat": lambda: GATLayer(6, 3, heads=2)}


@pytest.mark.parametrize("name", sorted(AUTOCAST_LAYERS))
def test_autocast_results_have_the_torch_backends_dtype(name):
    """Under ``torch.autocast`` (bfloat16) a layer's aggregates of half-precision messages
    are rounded to bfloat16 on both backends, a softmax's to float32, as torch's ops give
    them: the Triton layer's output has the torch layer's dtype and values."""
    torch.manual_seed(0)
    layer = AUTOCAST_LAYERS[name]()
    g = GRAPHS["multi_edges"]
    x = torch.randn(g.num_src, 6)
    outs = {}
    for backend in ("torch", "triton"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[backend] = set_backend(copy.deepcopy(layer), backend)(g, h=x)
    assert outs["triton"].dtype == outs["torch"].dtype
    assert_close(outs["triton"].float(), outs["torch"].float(), 1e-2, "output")


def test_copy_is_independent_of_the_original():
    g = GRAPHS["random"]
    layer = AttentionLayer(2, 3)
    a = compare(layer, g, {"h": torch.randn(g.num_src, 2, 3)})
    b = copy.deepcopy(a)
    h = torch.randn(g.num_src, 2, 3)
    assert torch.equal(a(g, h=h), b(g, h=h))


class ScalarLayer(sarc.Layer):
    """Scalars per node and edge: a score and a value without feature axes (0-d tiles)."""

    def __init__(self):
        super().__init__(node={"x": ()}, edge={"w": ()})

    def message(self, src, dst, edge):
        return {"v": src.x * edge.w, "score": src.x * dst.x, "m": dst.x.exp() + edge.w}

    def reduce(self, msg):
        return {"att": sarc.sum(msg.v * sarc.edge_softmax(msg.score)), "mx": sarc.max(msg.m),
                "mean": sarc.mean(msg.v)}

    def update(self, dst, agg):
        return {"h": agg.att + agg.mx + agg.mean}


@pytest.mark.parametrize("graph", ["random", "zero_in_degree", "power_law"])
def test_scalar_features(graph, split_small):
    g = GRAPHS[graph]
    compare(ScalarLayer(), g, {"x": torch.randn(g.num_src), "w": torch.randn(g.num_edges)})
