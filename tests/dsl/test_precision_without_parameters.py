"""A layer without float parameters computes in the float dtype of its features: nothing
fixes its precision, so float64 (or half) features give a float64 (half) layer, against
torch computing the same sum in that dtype. Features of two float dtypes are an error naming
both; a layer with parameters keeps their dtype and its error."""
from __future__ import annotations

import pytest
import torch

import sarc
from sarc.graph import GraphError
from sarc.ir.types import DType

D = 5


class WeightedMean(sarc.Layer):
    """No parameters: the mean of weighted source features, plus the node's own."""

    def __init__(self):
        super().__init__(node={"h": D}, edge={"w": ()})

    def message(self, src, dst, edge):
        return torch.tanh(src.h) * edge.w.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return agg.agg + dst.h


SRC, DST = (torch.randint(0, n, (40,), generator=torch.Generator().manual_seed(4 + n))
            for n in (10, 9))   # node 9 has no in-edges


def reference(g, h, w):
    src, dst = SRC, DST   # the input order, the order of w
    msg = torch.tanh(h[src]) * w.unsqueeze(-1)
    total = torch.zeros(g.num_dst, D, dtype=h.dtype).index_add_(0, dst, msg)
    count = torch.bincount(dst, minlength=g.num_dst).clamp(min=1).to(h.dtype)
    return total / count.unsqueeze(-1) + h[:g.num_dst]


@pytest.fixture
def g() -> sarc.Graph:
    return sarc.Graph.from_edges(SRC, DST, 10)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6),
                                       (torch.float16, 2e-2)])
def test_a_layer_without_parameters_computes_in_its_features_dtype(g, dtype, tol):
    layer = WeightedMean()
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(g.num_src, D, generator=gen).to(dtype).requires_grad_(True)
    w = torch.rand(g.num_edges, generator=gen).to(dtype).requires_grad_(True)
    out = layer(g, h, w)
    assert out.dtype == dtype and layer.precision() is DType.from_torch(dtype)
    h2, w2 = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    expect = reference(g, h2, w2)
    assert torch.allclose(out.double(), expect, rtol=tol, atol=tol)
    up = torch.randn(out.shape, generator=gen).to(dtype)
    out.backward(up)
    expect.backward(up.double())
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    assert torch.allclose(h.grad.double(), h2.grad, rtol=tol, atol=tol)
    assert torch.allclose(w.grad.double(), w2.grad, rtol=tol, atol=tol)


def test_the_next_call_in_another_dtype_recompiles(g):
    layer = WeightedMean()
    h, w = torch.randn(g.num_src, D), torch.rand(g.num_edges)
    assert layer(g, h.double(), w.double()).dtype == torch.float64
    out = layer(g, h, w)
    assert out.dtype == torch.float32
    assert torch.allclose(out, reference(g, h, w), atol=1e-6)


def test_features_of_two_dtypes_are_an_error_naming_both(g):
    with pytest.raises(GraphError, match=r"feature 'h' is torch.float64 and feature 'w' is "
                                         r"torch.float32: WeightedMean has no float "
                                         r"parameters") as info:
        WeightedMean()(g, torch.randn(g.num_src, D, dtype=torch.float64),
                       torch.rand(g.num_edges))
    assert "test_precision_without_parameters.py" in str(info.value)


def test_a_layer_with_parameters_keeps_their_dtype(g):
    class Scaled(WeightedMean):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(D))

        def update(self, dst, agg):
            return agg.agg * self.scale

    with pytest.raises(GraphError, match="the layer computes in torch.float32"):
        Scaled()(g, torch.randn(g.num_src, D, dtype=torch.float64),
                 torch.rand(g.num_edges, dtype=torch.float64))


def test_under_autocast_its_low_dtype_and_float32_run_in_float32(g):
    """As a float32 layer takes autocast's low-precision output of the layer before."""
    h, w = torch.randn(g.num_src, D).to(torch.bfloat16), torch.rand(g.num_edges)
    layer = WeightedMean()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(g, h, w)
    assert out.dtype == torch.float32
    assert torch.allclose(out, reference(g, h.float(), w), atol=1e-6)
    with pytest.raises(GraphError, match="feature 'h' is torch.bfloat16 and feature 'w'"):
        layer(g, h, w)   # without autocast, an error
