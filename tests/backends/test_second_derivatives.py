"""A second derivative through a sarc layer (``create_graph=True``: a gradient penalty)
is torch's, or refused: never a silently wrong one.

sarc's fused kernels differentiate once (their backward passes are kernels too); a
``torch.autograd.Function`` whose backward is not itself differentiable must say so
(``once_differentiable``), else a double backward treats that backward's output as a
constant. ``gradgradcheck`` compares the second derivative with finite differences in
float64: it passes, or the layer refuses (``sarc.backward_once``).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import sarc
from difftest import BACKENDS

N = 5
SRC = torch.tensor([0, 1, 2, 3, 0, 2, 4, 4])
DST = torch.tensor([1, 2, 0, 0, 2, 1, 1, 3])
REDUCES = ("sum", "mean", "max", "min", "softmax", "weighted")


class Penalised(sarc.Layer):
    """A message per edge, reduced by one of ``REDUCES`` (``softmax``: an attention-weighted
    sum; ``weighted``: a sum weighted by an edge feature)."""

    def __init__(self, reduce: str):
        super().__init__(node={"h": 3}, edge={"w": 1})
        self.kind = reduce
        self.lin = nn.Linear(3, 2)
        self.att = nn.Linear(3, 1)

    def message(self, src, dst, edge):
        return {"m": torch.tanh(self.lin(src.h)), "s": self.att(src.h + dst.h).squeeze(-1),
                "w": edge.w}

    def reduce(self, msg):
        if self.kind == "softmax":
            return sarc.sum(msg.m * msg.w * sarc.edge_softmax(msg.s).unsqueeze(-1))
        if self.kind == "weighted":
            return sarc.sum(msg.m * msg.w) + 0 * sarc.sum(msg.s.unsqueeze(-1))
        return getattr(sarc, self.kind)(msg.m) + 0 * sarc.sum(msg.s.unsqueeze(-1) * msg.w)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", REDUCES)
def test_a_second_derivative_is_torchs_or_refused(reduce, backend, autodiff):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(SRC, DST, N)
    layer = Penalised(reduce).double().set_backend(backend).set_autodiff(autodiff)
    x = torch.randn(N, 3, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(len(SRC), 1, dtype=torch.float64) + 0.5).requires_grad_()
    layer(g, x, w)   # compiled: an error now is not about derivatives
    try:
        assert torch.autograd.gradgradcheck(lambda x, w: layer(g, x, w), (x, w),
                                            raise_exception=False)
    except sarc.SarcError as e:
        assert "a sarc layer differentiates once" in str(e), e


@pytest.mark.parametrize("reduce", REDUCES)
def test_the_interpreters_second_derivative_is_torchs(reduce):
    """The oracle's ops are torch's own, so it differentiates twice."""
    from difftest import reference
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(SRC, DST, N)
    layer = Penalised(reduce).double()
    x = torch.randn(N, 3, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(len(SRC), 1, dtype=torch.float64) + 0.5).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda x, w: reference(layer, g, {"h": x, "w": w})["h"],
                                        (x, w))


def test_a_gradient_penalty_through_a_layer_is_refused_at_the_backward_pass():
    """The penalty's own value is first order; building its graph is what is refused."""
    g = sarc.Graph.from_edges(SRC, DST, N)
    layer = Penalised("sum").double()
    x = torch.randn(N, 3, dtype=torch.float64, requires_grad=True)
    w = torch.ones(len(SRC), 1, dtype=torch.float64)
    out = layer(g, x, w)
    first, = torch.autograd.grad(out.pow(2).sum(), x, retain_graph=True)
    assert torch.isfinite(first).all()
    with pytest.raises(sarc.SarcError, match="a sarc layer differentiates once"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", REDUCES)
def test_a_graph_kept_by_retain_graph_gives_the_same_gradients_again(reduce, backend, autodiff):
    """Two backward passes through one forward (``retain_graph=True``: two losses, gradcheck,
    jacobian): a max / min's backward dropped its kept output and counts after the first,
    and the second failed on them."""
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(SRC, DST, N)
    layer = Penalised(reduce).set_backend(backend).set_autodiff(autodiff)
    x = torch.randn(N, 3, requires_grad=True)
    w = (torch.rand(len(SRC), 1) + 0.5).requires_grad_()
    out = layer(g, x, w)
    cot = torch.randn_like(out)
    first = torch.autograd.grad(out, [x, w, *layer.parameters()], cot, retain_graph=True,
                                allow_unused=True)
    again = torch.autograd.grad(out, [x, w, *layer.parameters()], cot, allow_unused=True)
    for a, b in zip(first, again):
        assert (a is None and b is None) or torch.equal(a, b)
