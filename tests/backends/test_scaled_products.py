"""A sparse product whose operand or result is scaled by a number per node, GCN's
``sum_u h_u W / sqrt(deg_out(u))`` times ``1 / sqrt(deg_in(v))``, scales inside the product
(``sarc.ir.patterns.scaled_products``, ``torch_ops.spmm``'s ``src_scale`` / ``dst_scale``):
the generated code, which products fold which scales, and values and gradients against
the interpreter, with and without sarc's CPU kernels, where the scales need a gradient
too (the product then multiplies as written)."""
from __future__ import annotations

import pytest
import torch
from difftest import check_layer, random_block
from gcn import GCNLayer
from torch import nn

import sarc
from sarc.backends import torch_ops
from sarc.compiler import compile_layer, optimize
from sarc.ir.patterns import scaled_products

G = random_block(torch.Generator().manual_seed(3), 11, 7, 60)  # more src than dst rows


class Scaled(sarc.Layer):
    """``dst_scale * reduce(lin(src.h) * src_scale [* w])`` with each part switchable, the
    scales from the degrees (no gradient) or from the features (a gradient)."""

    def __init__(self, kind="sum", src=True, dst=True, learned=False, weighted=False,
                 heads=0, bias=True):
        edge = {"w": 1} if weighted else {}
        super().__init__(node={"h": 4}, edge=edge)
        self.kind, self.src, self.dst, self.learned = kind, src, dst, learned
        self.weighted, self.heads = weighted, heads
        self.lin = nn.Linear(4, 6, bias=False)
        self.bias = nn.Parameter(torch.randn(6)) if bias else None

    def _scale(self, side):
        if self.learned:
            return side.h.sum(-1, keepdim=True).sigmoid()
        degree = side.out_degree if side is self._srcs else side.in_degree
        return degree.clamp_min(1).rsqrt().unsqueeze(-1)

    def message(self, src, dst, edge):
        self._srcs = src
        z = self.lin(src.h)
        if self.heads:
            z = z.reshape(-1, 2, 3)
        if self.src:
            s = self._scale(src)
            z = z * (s.unsqueeze(-1) if self.heads else s)
        return z * edge.w if self.weighted else z

    def reduce(self, msg):
        return getattr(sarc, self.kind)(msg.m)

    def update(self, dst, agg):
        h = agg.agg
        if self.dst:
            s = self._scale(dst)
            h = h * (s.unsqueeze(-1) if self.heads else s)
        if self.heads:
            h = h.reshape(-1, 6)
        return h + self.bias if self.bias is not None else h


def _feats(layer) -> dict[str, torch.Tensor]:
    feats = {"h": torch.randn(G.num_src, 4)}
    if layer.weighted:
        feats["w"] = torch.rand(G.num_edges, 1) + 0.1
    return feats


def _code(layer) -> list[str]:
    return [line.strip() for line in compile_layer(layer).kernel.source.splitlines()
            if not line.strip().startswith("#")]


def _products(code) -> list[str]:
    return [line for line in code if "K.spmm(" in line]


@pytest.fixture(params=["kernels", "torch"])
def cpu_kernels(request, monkeypatch):
    """With sarc's CPU kernels (scaling as they read and write) and torch's products."""
    monkeypatch.setenv("SARC_CPU_KERNELS", "1" if request.param == "kernels" else "0")
    return request.param


def test_gcn_scales_in_its_product():
    """GCN's two degree scales are the product's; no node-sized multiply is left."""
    code = _code(GCNLayer(4, 6))
    (product,) = _products(code)
    assert "src_scale=" in product and "dst_scale=" in product, code
    assert not any(" * " in line or "torch.addcmul(" in line for line in code), code


CASES = {
    "both": {},
    "src": {"dst": False},
    "dst": {"src": False},
    "mean": {"kind": "mean"},
    "weighted": {"weighted": True},
    "heads": {"heads": 2},
    "no_bias": {"bias": False},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scaled_products_match_the_interpreter(case, cpu_kernels):
    layer = Scaled(**CASES[case])
    fn = optimize(layer.trace())
    (p,) = scaled_products(fn).values()
    assert (p.src_scale is not None, p.dst_scale is not None) == (layer.src, layer.dst)
    assert (p.weight is not None) == layer.weighted
    check_layer(layer, G, _feats(layer))


@pytest.mark.parametrize("case", ["both", "weighted"])
def test_scales_that_need_a_gradient_are_multiplied(case, cpu_kernels):
    """Scales from the features: the code is the same, the product multiplies as written
    and autograd differentiates the scales."""
    layer = Scaled(learned=True, **CASES[case])
    assert "src_scale=" in _products(_code(layer))[0]
    check_layer(layer, G, _feats(layer))


@pytest.mark.parametrize("kind", ["max", "min"])
def test_a_nonlinear_reducer_keeps_its_scales(kind):
    """max(s x) is not s max(x) for a negative s: nothing is folded."""
    layer = Scaled(kind=kind, learned=True)
    assert scaled_products(optimize(layer.trace())) == {}
    check_layer(layer, G, _feats(layer))


class ReadTwice(Scaled):
    """The scaled operand and the product are read again: neither scale folds."""

    def message(self, src, dst, edge):
        z = self.lin(src.h) * src.out_degree.clamp_min(1).rsqrt().unsqueeze(-1)
        return z

    def update(self, dst, agg):
        h = agg.agg * dst.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)
        return h + agg.agg


class PerFeature(Scaled):
    """A node value as wide as the features is no scale."""

    def message(self, src, dst, edge):
        return self.lin(src.h) * self.lin(src.h).sigmoid()


def test_a_product_read_twice_keeps_its_dst_scale():
    layer = ReadTwice()
    (p,) = scaled_products(optimize(layer.trace())).values()
    assert p.src_scale is not None and p.dst_scale is None
    check_layer(layer, G, _feats(layer))


def test_a_per_feature_factor_is_no_scale():
    layer = PerFeature(dst=False)
    assert scaled_products(optimize(layer.trace())) == {}
    check_layer(layer, G, _feats(layer))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_spmm_scales_equal_the_multiplies(kind, dtype, cpu_kernels):
    """``torch_ops.spmm`` with scales == the scales multiplied before and after, values and
    the gradient of x, with per-head weights too."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(G.num_src, 2, 3, generator=gen, dtype=dtype)
    cs = torch.rand(G.num_src, 1, 1, generator=gen, dtype=dtype)
    rs = torch.rand(G.num_dst, 1, 1, generator=gen, dtype=dtype)
    for w in (None, torch.rand(G.num_edges, 2, 1, generator=gen, dtype=dtype)):
        got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
        got = torch_ops.spmm(kind, G, got_x, w, "src", src_scale=cs, dst_scale=rs)
        want = torch_ops.spmm(kind, G, want_x * cs, w, "src") * rs
        torch.testing.assert_close(got, want)
        dy = torch.randn(want.shape, generator=gen, dtype=dtype)
        (got * dy).sum().backward()
        (want * dy).sum().backward()
        torch.testing.assert_close(got_x.grad, want_x.grad)


class SelfTerm(Scaled):
    """The update reads the scaled operand's rows (``lin(dst.h) * s(dst)`` is the first rows
    of ``lin(src.h) * s(src)``, ``patterns.dst_rows_of_src``): that operand is computed."""

    def message(self, src, dst, edge):
        return self.lin(src.h) * src.h.sum(-1, keepdim=True).sigmoid()

    def update(self, dst, agg):
        return agg.agg + self.lin(dst.h) * dst.h.sum(-1, keepdim=True).sigmoid()


def test_an_operand_whose_rows_are_read_again_is_computed(cpu_kernels):
    layer = SelfTerm()
    assert scaled_products(optimize(layer.trace()))
    code = _code(layer)
    assert any("K.dst_rows(" in line for line in code), code
    assert not any("src_scale=" in line for line in _products(code)), code
    check_layer(layer, G, _feats(layer))
