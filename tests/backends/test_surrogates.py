"""A distributed block's backward surrogates, computed for their gradient alone:
``torch_ops.spmm_surrogate`` (``sum(spmm(...) * cot)``) has the expression's gradients for
every form of the product (unweighted sum and mean, an edge scalar, a weight per head, an
edge operand, low precision, no edges), and where the product is one CSR product its
forward is not run; ``torch_ops.fused_surrogate`` (``(fused(...) * cot).sum()``, the
softmax and select blocks') runs each row block once, in the backward pass."""
from __future__ import annotations

import pytest
import torch

import sarc
from sarc.backends import torch_ops as K


def _graph(n: int, e: int, seed: int = 0) -> sarc.Graph:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, max(1, n - 2), (e,), generator=gen)  # the last rows get no edges
    return sarc.Graph.from_edges(src, dst, n)


# name -> (kind, weight shape per edge or None, side, x's feature shape, dtype, edges)
FORMS = {
    "sum": ("sum", None, "src", (5,), torch.float32, 120),
    "mean": ("mean", None, "src", (5,), torch.float32, 120),
    "edge_scalar": ("sum", (), "src", (5,), torch.float32, 120),
    "per_head": ("sum", (3,), "src", (3, 4), torch.float32, 120),
    "edge_operand": ("sum", (), "edge", (5,), torch.float32, 120),
    "float64": ("sum", (), "src", (5,), torch.float64, 120),
    "mean_weighted": ("mean", (), "src", (5,), torch.float32, 120),   # not one CSR product
    "bfloat16": ("sum", (), "src", (5,), torch.bfloat16, 120),       # not one CSR product
    "no_edges": ("sum", None, "src", (5,), torch.float32, 0),
}
DIRECT = {"sum", "mean", "edge_scalar", "per_head", "edge_operand", "float64"}
"""The forms that are one ``_CsrProduct``: their surrogate runs no product forward."""


@pytest.mark.parametrize("form", sorted(FORMS))
def test_surrogate_has_the_expressions_gradients(form, monkeypatch):
    kind, wshape, side, feat, dtype, e = FORMS[form]
    g = _graph(30, e)
    gen = torch.Generator().manual_seed(1)
    rows = g.num_src if side == "src" else g.num_edges
    x = torch.randn(rows, *feat, generator=gen).to(dtype).requires_grad_()
    w = None
    if wshape is not None:
        w = (torch.rand(g.num_edges, *wshape, generator=gen) + 0.1).to(dtype).requires_grad_()
    cot = torch.randn(g.num_dst, *feat, generator=gen).to(dtype)
    wrt = [x] + ([w] if w is not None else [])
    want = torch.autograd.grad((K.spmm(kind, g, x, w, side) * cot).sum(), wrt)

    products = []
    real = K._products
    monkeypatch.setattr(K, "_products", lambda *a, **k: products.append(1) or real(*a, **k))
    loss = K.spmm_surrogate(cot, kind, g, x, w, side)
    forward_products = len(products)
    got = torch.autograd.grad(loss, wrt)
    if form in DIRECT:
        assert forward_products == 0 and loss.item() == 0  # never read: not computed
    elif e:
        assert forward_products > 0  # the expression as is (what the count would see)
    tol = {torch.bfloat16: 2e-2, torch.float64: 1e-12}.get(dtype, 1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("weighted", [False, True])  # .sum(), (* cot).sum()
@pytest.mark.parametrize("width", [4, K.EDGE_BLOCK_ELEMS // 8])  # one row block, many
def test_fused_surrogate_runs_each_block_once_in_the_backward_pass(width, weighted):
    """``fused_surrogate`` = ``(fused(...) * cot).sum()`` for its gradient: no block runs in
    the forward pass, each runs once in the backward pass, the gradients are the same."""
    g = _graph(30, 200)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(g.num_src, 4, generator=gen, requires_grad=True)
    w = torch.rand(g.num_edges, generator=gen, requires_grad=True)
    calls = []

    def block(gb, xb, wb):
        calls.append(gb.num_dst)
        return K.segment_sum(torch.tanh(xb.index_select(0, gb.src) * wb.unsqueeze(-1)), gb)

    cot = torch.randn(g.num_dst, 4, generator=gen) if weighted else None
    out = K.fused(block, g, ("src", "edge"), width, (x, w))
    want = torch.autograd.grad((out * cot if weighted else out).sum(), [x, w])
    blocks = len(K.row_blocks(g, width))
    calls.clear()
    loss = K.fused_surrogate(block, g, ("src", "edge"), width, (x, w), cot)
    assert calls == [] and loss.item() == 0
    got = torch.autograd.grad(loss, [x, w])
    assert len(calls) == blocks and sum(calls) == g.num_dst
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
