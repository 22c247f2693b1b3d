"""Each elementwise function as a kernel computes it (an edge-level value, which stays in
the kernel) against torch's, element by element in relative error, on arguments from tiny
to large and on inf and NaN. Comparisons scaled by a tensor's largest value hide a function
that loses its digits near 0: ``2 sigmoid(2x) - 1`` gave tanh(1e-8) = 0, and
``exp(x) - 1`` gave elu(-1e-8) = 0."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_check import set_backend

import sarc

ARGS = [-30.0, -5.0, -1.0, -0.1, -1e-3, -1e-6, -1e-8, -1e-30, 0.0, 1e-30, 1e-8, 1e-6, 1e-3,
        0.1, 1.0, 5.0, 30.0, float("inf"), float("-inf"), float("nan")]

FUNCTIONS = {
    "tanh": torch.tanh,
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.5),
    "sigmoid": torch.sigmoid,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs()),
    "log1p": lambda x: torch.log1p(x.abs()),
    "relu": torch.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "neg": torch.neg,
    "sin": torch.sin,
    "cos": torch.cos,
    "erf": torch.erf,
}


class Elementwise(sarc.Layer):
    def __init__(self, f):
        super().__init__(node={"h": len(ARGS)})
        self.f = f

    def message(self, src, dst, edge):
        return self.f(src.h * dst.h)   # an edge value: computed in the kernel

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_an_elementwise_function_keeps_its_digits(name):
    f = FUNCTIONS[name]
    g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    h = torch.stack([torch.tensor(ARGS), torch.ones(len(ARGS))])   # dst.h = 1: x * 1 = x
    out = set_backend(Elementwise(f), "triton")(g, h=h)[1]
    ref = set_backend(Elementwise(f), "torch")(g, h=h)[1]
    torch.testing.assert_close(out, ref, rtol=4e-6, atol=0.0, equal_nan=True)
