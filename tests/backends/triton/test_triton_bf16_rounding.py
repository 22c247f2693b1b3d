"""Conversions to bfloat16 in Triton kernels round to nearest even, as torch's do.

A cast inside a fused region (from a float32 or float64 compute dtype) and the store of a
bfloat16 output both round: Triton's own ``x.to(tl.bfloat16)`` truncates from float32 and
gives 0 / NaN from float64 under TRITON_INTERPRET=1, so the kernels round with integer bit
operations (see the helpers of ``templates/triton_header.j2``). Float64 rounds through
float32, as torch's conversion does.
"""
from __future__ import annotations

import pytest
import torch
from difftest import check_layer

import sarc
from sarc.ir.ops import Op

W = 3


def _graph() -> sarc.Graph:
    return sarc.Graph.from_edges(torch.tensor([0, 1, 2, 3, 1, 0]), torch.tensor([1, 2, 3, 0, 0, 2]), 4)


class RoundTrip(sarc.Layer):
    """A bfloat16 round trip of a value of both ends of an edge: the cast stays in the
    aggregation's kernel (``w``, ones, gives the layer its dtype)."""

    def __init__(self):
        super().__init__(node={"h": W})
        self.w = torch.nn.Parameter(torch.ones(W))

    def message(self, src, dst, edge):
        return dst.h - src.h * self.w

    def reduce(self, msg):
        m = msg.m
        return sarc.sum(m.bfloat16().to(m.dtype))


def _torch_round_trip(g: sarc.Graph, h: torch.Tensor) -> torch.Tensor:
    src, dst = g.src, g.dst
    m = (h[dst] - h[src]).bfloat16().to(h.dtype)
    return torch.zeros_like(h).index_add_(0, dst, m)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_a_bf16_round_trip_inside_a_region_equals_the_interpreter_and_torch(dtype, autodiff):
    g = _graph()
    layer = RoundTrip().to(dtype).set_backend("triton").set_autodiff(autodiff)
    h = torch.randn(4, W, generator=torch.Generator().manual_seed(0), dtype=dtype)
    out = check_layer(layer, g, {"h": h})["h"]
    fused = [v for v in layer.compiled().function.values if v.op is Op.AGGREGATE]
    assert any(u.op is Op.CAST for v in fused for u in v.attr["body"].values)
    torch.testing.assert_close(out.detach(), _torch_round_trip(g, h), rtol=1e-6, atol=0)


class Bf16InSum(sarc.Layer):
    """A float32 layer whose per-edge value is rounded to bfloat16, next to a float64 row
    sum: the backward region (autodiff="ir") computes in float64 and rounds there."""

    def __init__(self):
        super().__init__(node={"h": 5})
        self.lin = torch.nn.Linear(5, 8)

    def message(self, src, dst, edge):
        z = self.lin(src.h).bfloat16().float() * dst.h.sum(-1, keepdim=True)
        return z.sum(-1, keepdim=True, dtype=torch.float64).float() * z

    def reduce(self, msg):
        return sarc.mean(msg.m)


def _grads(layer: sarc.Layer, g: sarc.Graph, h: torch.Tensor):
    h = h.clone().requires_grad_()
    out = layer(g, h)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    return (out.detach(), *torch.autograd.grad((out * cot).sum(), [h, *layer.parameters()]))


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
def test_a_bf16_cast_next_to_a_float64_sum_has_the_torch_backends_gradients(autodiff):
    """With autodiff="ir" the gradients were all 0; also against the interpreter there."""
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 10, (30,)), torch.randint(0, 10, (30,)), 10)
    h = torch.randn(10, 5)
    base = Bf16InSum()
    got = {}
    for backend in ("torch", "triton"):
        layer = Bf16InSum()
        layer.load_state_dict(base.state_dict())
        got[backend] = _grads(layer.set_backend(backend).set_autodiff(autodiff), g, h)
    for a, b in zip(got["triton"], got["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if autodiff == "ir":
        check_layer(Bf16InSum().set_backend("triton").set_autodiff("ir"), g, {"h": h})


def _bf16_values(shape, seed: int) -> torch.Tensor:
    """bfloat16 values of magnitude in [1/16, 4): any few of them sum exactly in float32,
    so a kernel's result is its one final rounding."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    return (x.sign() * x.abs().clamp(1 / 16, 3.9)).bfloat16()


class Sum(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 8})

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
def test_a_bf16_layers_stored_outputs_and_gradients_are_rounded_to_nearest_even(autodiff):
    torch.manual_seed(0)
    n = 30
    src, dst = torch.randint(0, n, (200,)), torch.randint(0, n, (200,))
    g = sarc.Graph.from_edges(src, dst, n)
    h = _bf16_values((n, 8), 1).requires_grad_()
    cot = _bf16_values((n, 8), 2)
    outs = {}
    for backend in ("torch", "triton"):
        layer = Sum().bfloat16().set_backend(backend).set_autodiff(autodiff)
        hb = h.detach().clone().requires_grad_()
        out = layer(g, hb)
        (dh,) = torch.autograd.grad(out, hb, cot)
        outs[backend] = out.detach(), dh
    hd = h.detach().double()
    want = torch.zeros(n, 8, dtype=torch.float64).index_add_(0, g.dst, hd[g.src]).bfloat16()
    want_dh = torch.zeros(n, 8, dtype=torch.float64).index_add_(
        0, g.src, cot.double()[g.dst]).bfloat16()
    out, dh = outs["triton"]
    assert out.dtype == dh.dtype == torch.bfloat16
    assert torch.equal(out, want)
    assert torch.equal(dh, want_dh)
    assert torch.equal(out, outs["torch"][0])


class Gated(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 8})
        self.lin = torch.nn.Linear(8, 8)

    def message(self, src, dst, edge):
        return torch.tanh(self.lin(src.h)) * torch.sigmoid(self.lin(dst.h))

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_bf16_layers_output_is_not_biased_toward_zero():
    """Against the torch backend: the outputs differ by the float32 accumulation's order at
    most, not by a truncation on every other entry."""
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 30, (200,)), torch.randint(0, 30, (200,)), 30)
    base = Gated().bfloat16()
    h = torch.randn(30, 8).bfloat16()
    outs = {}
    for backend in ("torch", "triton"):
        layer = Gated().bfloat16()
        layer.load_state_dict(base.state_dict())
        outs[backend] = layer.set_backend(backend)(g, h).float()
    differ = outs["triton"] != outs["torch"]
    assert int(differ.sum()) <= outs["torch"].numel() // 20
    torch.testing.assert_close(outs["triton"], outs["torch"], rtol=8e-3, atol=1e-2)
