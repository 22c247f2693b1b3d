"""A distributed block's backward surrogate on Triton ops, ``op.surrogate(g, cot, *xs)`` =
``sum(op(g, *xs) * cot)`` for its gradient alone: the same gradients as the expression for
sum and mean aggregates (a region with edge and source operands, a typed product both
ways), no forward kernel launched; a max falls back to the expression."""
from __future__ import annotations

import pytest
import torch
from test_triton_kernels import MessageLayer, message_feats
from test_triton_typed import SIZES, Typed, _feats, _graph
from triton_check import power_law_block, set_backend

from sarc.backends import triton_runtime


def _op(layer):
    """The layer's one aggregate op and the operands it reads, from the layer module."""
    kernel = layer.compiled()
    ops = [o for o in kernel.ops if hasattr(o, "surrogate")]
    assert len(ops) == 1, ops
    return ops[0]


def _operands(layer, g, feats):
    """The op's operands as the layer module passes them (captured from one call)."""
    op = _op(layer)
    seen = []
    real = type(op).__call__

    def spy(self, g_, *xs):
        seen.append(xs)
        return real(self, g_, *xs)

    type(op).__call__ = spy
    try:
        layer(g, **feats)
    finally:
        type(op).__call__ = real
    return op, [x.detach().requires_grad_(x.is_floating_point()) for x in seen[0]]


def _check(op, g, xs, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    y = op(g, *xs)
    cot = torch.randn(y.shape, generator=gen)
    wrt = [x for x in xs if x.requires_grad]
    want = torch.autograd.grad((y * cot).sum(), wrt)
    launched = []
    for cls in (triton_runtime.AggregateKernel, triton_runtime.SoftmaxKernel):
        real = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, _r=real, **k:
                            launched.append(self) or _r(self, *a, **k))
    real_rows = triton_runtime.typed_rows
    monkeypatch.setattr(triton_runtime, "typed_rows",
                        lambda *a, **k: launched.append("rows") or real_rows(*a, **k))
    loss = op.surrogate(g, cot, *xs)
    in_forward = list(launched)  # the backward's launches come after
    return loss, in_forward, torch.autograd.grad(loss, wrt), want


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_aggregate_surrogate_runs_only_the_backward(kind, monkeypatch):
    g = power_law_block()
    layer = set_backend(MessageLayer(kind, 5), "triton")
    op, xs = _operands(layer, g, message_feats(g, 5))
    loss, launched, got, want = _check(op, g, xs, monkeypatch)
    assert launched == [] and loss.item() == 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("way", sorted(SIZES))
def test_typed_product_surrogate_runs_only_the_backward(way, monkeypatch):
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    layer = set_backend(Typed("sum", 6, 5, types), "triton")
    op, xs = _operands(layer, g, _feats(g, 6, types))
    loss, launched, got, want = _check(op, g, xs, monkeypatch)
    assert launched == [] and loss.item() == 0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_max_surrogate_is_the_expression(monkeypatch):
    g = power_law_block()
    layer = set_backend(MessageLayer("max", 5), "triton")
    op, xs = _operands(layer, g, message_feats(g, 5))
    loss, launched, got, want = _check(op, g, xs, monkeypatch)
    assert launched  # the forward ran: a max's backward reads its result
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
