"""Whole models of the zoo with every layer on the Triton backend: the same loss and the
same gradient for every parameter as on the PyTorch backend, in training mode (dropout
on inputs, hidden features and attention weights: the same masks from the same seed)
and in eval mode, on a graph with self loops, on a power-law graph with split rows, and
with the layers' gradients taken from their backward IR (``autodiff="ir"``), which the
Triton backend compiles too."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from difftest import CANCEL_FLOOR, assert_close
from triton_check import power_law_block, set_backend

import edgeconv
import gat
import gcn
import rgcn
import sarc

NUM_CLASSES = 3


def _graph(kind: str) -> sarc.Graph:
    if kind == "power_law":
        return power_law_block(30)
    gen = torch.Generator().manual_seed(4)
    n = 20
    src = torch.cat([torch.randint(0, n, (60,), generator=gen), torch.arange(n)])
    dst = torch.cat([torch.randint(0, n, (60,), generator=gen), torch.arange(n)])
    return sarc.Graph.from_edges(src, dst, n)


def _model(name: str, num_rels: int):
    torch.manual_seed(0)
    if name == "gcn":
        return gcn.build_model(12, NUM_CLASSES, hidden=8, dropout=0.5)
    if name == "gat":
        return gat.build_model(12, NUM_CLASSES, hidden=4, heads=4, out_heads=2,
                               dropout=0.5, attn_drop=0.5)
    if name == "rgcn":
        return rgcn.build_model(12, NUM_CLASSES, num_etypes=num_rels, hidden=8)
    if name == "edgeconv":
        return edgeconv.build_model(12, NUM_CLASSES, hidden=8, dropout=0.5)
    return rgcn.build_model(12, NUM_CLASSES, num_etypes=num_rels, hidden=8, num_bases=2)


def _loss_and_grads(model, g, x, etype, labels, train: bool):
    model.train(train)
    torch.manual_seed(99)  # the same dropout masks on both backends
    out = model(g, x, etype) if etype is not None else model(g, x)
    loss = F.cross_entropy(out, labels)
    names = [n for n, p in model.named_parameters()]
    grads = torch.autograd.grad(loss, [p for p in model.parameters()], allow_unused=True)
    return loss, {n: torch.zeros(()) if gr is None else gr for n, gr in zip(names, grads)}


@pytest.mark.parametrize("graph, train", [("self_loops", False), ("self_loops", True),
                                           ("power_law", True)])
@pytest.mark.parametrize("name", ["gcn", "gat", "rgcn", "rgcn_bases", "edgeconv"])
def test_model_loss_and_gradients(name, graph, train, split_small):
    g = _graph(graph)
    num_rels = 3
    ref = set_backend(_model(name, num_rels), "torch")
    tri = set_backend(copy.deepcopy(ref), "triton")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(g.num_src, 12, generator=gen)
    labels = torch.randint(0, NUM_CLASSES, (g.num_dst,), generator=gen)
    etype = torch.randint(0, num_rels, (g.num_edges,), generator=gen) if "rgcn" in name else None
    loss_r, grads_r = _loss_and_grads(ref, g, x, etype, labels, train)
    loss_t, grads_t = _loss_and_grads(tri, g, x, etype, labels, train)
    for m in tri.modules():
        if isinstance(m, sarc.Layer):
            assert m.compiled().fallbacks == ()
            assert type(m.compiled()).__name__ == "TritonKernel"
    assert_close(loss_t, loss_r, 1e-5, "loss")
    floor = CANCEL_FLOOR * max(t.abs().max().item() for t in grads_r.values())
    for n in grads_r:
        assert_close(grads_t[n], grads_r[n], 1e-4, f"grad of {n}", floor)


@pytest.mark.parametrize("name", ["gcn", "gat", "rgcn"])
def test_model_with_ir_backward(name):
    """Gradients from the layers' backward IR compiled by the Triton backend (its
    scatter_src runs as a transposed aggregate over CSC)."""
    g = _graph("self_loops")
    ref = set_backend(_model(name, 3), "torch")
    tri = set_backend(copy.deepcopy(ref), "triton")
    for m in tri.modules():
        if isinstance(m, sarc.Layer):
            m.set_autodiff("ir")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(g.num_src, 12, generator=gen)
    labels = torch.randint(0, NUM_CLASSES, (g.num_dst,), generator=gen)
    etype = torch.randint(0, 3, (g.num_edges,), generator=gen) if name == "rgcn" else None
    loss_r, grads_r = _loss_and_grads(ref, g, x, etype, labels, True)
    loss_t, grads_t = _loss_and_grads(tri, g, x, etype, labels, True)
    kernel = tri.conv1.compiled()
    assert kernel.backward is not None and kernel.backward.fallbacks == ()
    assert any("scatter_src" in f for f in kernel.kernel_files())
    assert_close(loss_t, loss_r, 1e-5, "loss")
    floor = CANCEL_FLOOR * max(t.abs().max().item() for t in grads_r.values())
    for n in grads_r:
        assert_close(grads_t[n], grads_r[n], 1e-4, f"grad of {n}", floor)
