"""The torch functions a layer may call equal torch on real tensors, output and gradient.

Each case is a function ``f`` of a per-node value, traced inside a layer's ``update``
(``f(dst.h)``, after a sum over self loops that hands each node its own features): the
compiled layer on every backend, and the reference interpreter, give ``f`` of the tensor
as torch computes it, and the gradient torch's autograd gives. The activations sarc
composes from its ops (GELU, SiLU, softplus, layer norm, clamp's max) are held to
torch's own; new axes (``x[..., None]``) and ``squeeze`` are reshapes.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from difftest import assert_close, check_layer

N, W = 12, 8


class Apply(sarc.Layer):
    """``update`` returns ``fn(self, h)`` for each node (``reduce`` hands it its own h)."""

    def __init__(self, fn, width=W, module: nn.Module | None = None):
        super().__init__(node={"h": width})
        self.fn, self.mod = fn, module

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.fn(self, agg.agg)


CASES = {
    "gelu": lambda s, x: F.gelu(x),
    "gelu-tanh": lambda s, x: F.gelu(x, approximate="tanh"),
    "gelu-module": lambda s, x: s.mod(x),
    "silu": lambda s, x: F.silu(x),
    "silu-module": lambda s, x: s.mod(x),
    "softplus": lambda s, x: F.softplus(x),
    "softplus-beta-threshold": lambda s, x: F.softplus(x, beta=2.0, threshold=3.0),
    "softplus-module": lambda s, x: s.mod(x),
    "erf": lambda s, x: torch.erf(x) + x.erf(),
    "layer-norm-module": lambda s, x: s.mod(x),
    "layer-norm-2-axes": lambda s, x: F.layer_norm(x.view(-1, 2, 4), (2, 4), eps=1e-3).flatten(1),
    "layer-norm-no-affine": lambda s, x: s.mod(x),
    "clamp-both": lambda s, x: torch.clamp(x, -0.5, 0.75),
    "clamp-max": lambda s, x: x.clamp(max=0.5) + torch.clamp_max(x, 1.0),
    "clip": lambda s, x: x.clip(min=-1.0, max=1.0),
    "new-axes": lambda s, x: (x[..., None] * x[:, None, :]).sum(-1),
    "squeeze": lambda s, x: (x.view(-1, 1, 2, 4, 1).squeeze().sum(-1).sum(-1, keepdim=True)
                             * x.view(-1, 8, 1).squeeze(-1) + x.view(-1, 1, 8).squeeze(1)),
}
MODULES = {"gelu-module": lambda: nn.GELU(), "silu-module": lambda: nn.SiLU(),
           "softplus-module": lambda: nn.Softplus(beta=0.5),
           "layer-norm-module": lambda: nn.LayerNorm(W),
           "layer-norm-no-affine": lambda: nn.LayerNorm(W, elementwise_affine=False)}


def _features():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, W, generator=gen) * 3
    x[0] = torch.tensor([-0.5, 0.75, 0.5, 1.0, -1.0, 0.0, 30.0, -30.0])  # the kinks, saturation
    return x


def _layer(name):
    torch.manual_seed(1)
    module = MODULES[name]() if name in MODULES else None
    if isinstance(module, nn.LayerNorm) and module.weight is not None:
        with torch.no_grad():
            module.weight.normal_()
            module.bias.normal_()
    return Apply(CASES[name], module=module)


LOOPS = sarc.Graph.from_edges(torch.arange(N), torch.arange(N), N)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(set(CASES) - {"squeeze"}) + ["squeeze"])
def test_equals_torch(name, backend):
    layer = _layer(name)
    layer.set_backend(backend)
    x = _features().requires_grad_()
    out = layer(LOOPS, x)
    xr = _features().requires_grad_()
    want = CASES[name](layer, xr)
    assert out.shape == want.shape
    assert_close(out, want, 1e-5, "output")
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    got = torch.autograd.grad((out * cot).sum(), [x, *layer.parameters()])
    ref = torch.autograd.grad((want * cot).sum(), [xr, *layer.parameters()])
    for a, b in zip(got, ref):
        assert_close(a, b, 1e-5, "gradient", 1e-6)
    check_layer(_layer(name), LOOPS, {"h": _features()})  # the interpreter agrees too


@pytest.mark.parametrize("key, message", [
    (lambda x: x[:, 1:3], "slicing is not"),
    (lambda x: x[None], "before the row axis"),
    (lambda x: F.gelu(x, approximate="erf"), "approximate must be 'none' or 'tanh'"),
    (lambda x: F.layer_norm(x, (3,)), r"layer_norm over \[3\]"),
    (lambda x: torch.clamp(x), "clamp needs min=... or max=..."),
])
def test_what_is_not_modelled_is_refused(key, message):
    layer = Apply(lambda s, x: key(x))
    with pytest.raises(sarc.DSLError, match=message):
        layer.trace()
