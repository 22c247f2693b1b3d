"""Tensors a layer or a graph shares with the user's code.

A weight tied across two modules of a layer (``self.b.weight = self.a.weight``, ordinary
torch) is one parameter, as torch computes it; edges changed after ``Graph.from_edges``
do not change the graph built from them (its kernels index node rows by those edges: a
changed one read memory outside the rows).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import sarc
from difftest import BACKENDS, assert_close, check_layer

from .catalogue import case


class Tied(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin_src, self.lin_dst = nn.Linear(3, 3), nn.Linear(3, 3)
        self.lin_dst.weight = self.lin_src.weight
        self.scale = nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
        self.again = self.scale   # a second name of one parameter, on the layer itself

    def message(self, src, dst, edge):
        return self.lin_src(src.h) * self.scale + self.lin_dst(dst.h) * self.again

    def reduce(self, msg):
        return sarc.sum(msg.m)


@case("dsl", "a layer whose modules share a weight (`self.b.weight = self.a.weight`)", "exact")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tied_weight_is_one_parameter(backend):
    """It was two leaves, the second named as no parameter: a KeyError from the generated
    module."""
    torch.manual_seed(0)
    layer = Tied().set_backend(backend)
    x = torch.randn(4, 3, requires_grad=True)
    src, dst = torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 0, 1, 3, 3])
    g = sarc.Graph.from_edges(src, dst, 4)
    out = layer(g, x)
    xr = x.detach().clone().requires_grad_()
    m = layer.lin_src(xr[src]) * layer.scale + layer.lin_dst(xr[dst]) * layer.again
    want = torch.zeros(4, 3).index_add(0, dst, m)
    assert_close(out, want, 1e-6, "output")
    params = list(layer.parameters())
    assert len(params) == 4   # lin_src's weight and bias, lin_dst's bias, scale
    cot = torch.randn(4, 3)
    got = torch.autograd.grad((out * cot).sum(), [x, *params])
    ref = torch.autograd.grad((want * cot).sum(), [xr, *params])
    for a, b in zip(got, ref):
        assert_close(a, b, 1e-5, "gradient")
    check_layer(Tied(), g, {"h": torch.randn(4, 3)})


@case("dsl", "the edge tensors given to `Graph.from_edges` changed afterwards", "exact")
def test_edges_changed_after_building_leave_the_graph_as_built():
    src, dst = torch.tensor([1, 2, 3, 0]), torch.tensor([0, 1, 2, 3])   # already in dst order
    g = sarc.Graph.from_edges(src, dst, 4)
    want = sarc.Graph.from_edges(src.clone(), dst.clone(), 4)
    src[0], dst[1] = 10 ** 9, -5
    layer = Tied()
    x = torch.randn(4, 3)
    assert torch.equal(layer(g, x), layer(want, x))
