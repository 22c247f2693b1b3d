"""Half and bfloat16 layers on the Triton backend: parameters and features in the low
precision, the kernels summing in float32; output and gradients equal the float32 layer on
the same rounded weights and features to the low precision's rounding."""
from __future__ import annotations

import pytest
import torch
from difftest import random_block
from zoo import LAYERS, features

D = 6
TOL = {torch.float16: 5e-3, torch.bfloat16: 4e-2}


def _low(feats, dtype):
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in feats.items()}


def _rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("model", ["gcn", "sage", "gat_4heads_concat", "rgcn"])
def test_low_precision_triton_layer(model, dtype):
    g = random_block(torch.Generator().manual_seed(2), 14, 14, 50)
    low = LAYERS[model](D).to(dtype).eval().set_backend("triton")
    feats = _low(features(low, g, D), dtype)
    ref = LAYERS[model](D).eval()
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    out = low(g, **feats)
    want = ref(g, **_low(feats, torch.float32))
    assert out.dtype == dtype and _rel(out, want) < TOL[dtype]
    out.float().square().sum().backward()
    want.square().sum().backward()
    for (name, p), (_, q) in zip(low.named_parameters(), ref.named_parameters()):
        if q.grad is not None:
            assert p.grad.dtype == dtype and _rel(p.grad, q.grad) < 4 * TOL[dtype], name
