"""Half and bfloat16 layers (``layer.to(dtype)``, features too) on the Triton backend,
compiled for the GPU: outputs and every gradient in the low precision, equal to the
float32 layer on the same rounded weights and features to that precision's rounding, and
to the PyTorch backend's low-precision layer on the same GPU. Tolerances are those of
tests/dsl/test_precision.py (the torch backend against float32, every zoo layer)."""
from __future__ import annotations

import copy

import pytest
import torch
from difftest import CANCEL_FLOOR, random_block
from gpu_check import CUDA, assert_compiled, graph, needs_gpu, on_backend, on_gpu, run
from zoo import LAYERS, features

pytestmark = [pytest.mark.gpu, needs_gpu]

D = 6
LOW = {"f16": (torch.float16, 2e-2), "bf16": (torch.bfloat16, 8e-2)}
"""precision -> (dtype, tolerance on max |error| / max |float32 value|), as test_precision."""


def _scaled_err(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    a, b = a.detach().float(), b.detach().float()
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / max(float(b.abs().max()), floor, 1e-6))


def _pair(model: str, dtype: torch.dtype):
    """A low-precision layer and its float32 twin holding the same rounded weights."""
    low = LAYERS[model](D).to(dtype).eval()
    ref = LAYERS[model](D).eval()
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    return low.to(CUDA), ref.to(CUDA)


@pytest.mark.parametrize("precision", sorted(LOW))
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_low_precision_triton_layer_on_gpu(model, precision):
    dtype, tol = LOW[precision]
    g = random_block(torch.Generator().manual_seed(3), 12, 12, 48).to(CUDA)
    low, ref = _pair(model, dtype)
    feats = on_gpu(features(low, g, D), dtype)
    tri = on_backend(copy.deepcopy(low), "triton")
    out_t, grads_t = run(tri, g, feats)
    out_l, grads_l = run(on_backend(copy.deepcopy(low), "torch"), g, feats)
    out_r, grads_r = run(on_backend(ref, "torch"), g, on_gpu(feats, torch.float32))
    assert tri.compiled().fallbacks == ()
    assert_compiled(tri.compiled())

    assert out_t["h"].dtype == dtype
    assert _scaled_err(out_t["h"], out_r["h"]) < tol
    assert _scaled_err(out_t["h"], out_l["h"]) < 2 * tol
    floor = CANCEL_FLOOR * max(float(t.detach().abs().max()) for t in [*grads_r.values(), out_r["h"]]
                               if t.numel())
    for name, want in grads_r.items():
        got = grads_t[name]
        assert got.dtype == dtype, name
        assert _scaled_err(got, want, floor) < 4 * tol, f"grad of {name} against float32"
        assert _scaled_err(got, grads_l[name], floor) < 8 * tol, f"grad of {name} against torch"


HUB = {"f16": 5e-3, "bf16": 4e-2}
"""Relative error (norm of the hub's output row), as test_precision's hub test."""


@pytest.mark.parametrize("precision", sorted(HUB))
@pytest.mark.parametrize("model", ["gcn", "sage", "gat_4heads_concat", "gin", "rgcn"])
def test_a_hub_of_thousands_of_in_edges_is_summed_in_float32_on_gpu(model, precision):
    dtype = LOW[precision][0]
    n = 3000
    gen = torch.Generator().manual_seed(4)
    src = torch.cat([torch.arange(1, n), torch.randint(0, n, (3000,), generator=gen)])
    dst = torch.cat([torch.zeros(n - 1, dtype=torch.long), torch.randint(0, n, (3000,), generator=gen)])
    g = graph(src, dst, n)
    low, ref = _pair(model, dtype)
    feats = on_gpu(features(low, g, D), dtype)
    tri = on_backend(low, "triton")
    with torch.no_grad():
        hub = tri(g, **feats)[0].float()
        want = on_backend(ref, "torch")(g, **on_gpu(feats, torch.float32))[0]
    assert_compiled(tri.compiled())
    assert float((hub - want).norm() / want.norm()) < HUB[precision]



@pytest.mark.parametrize("precision", sorted(LOW))
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_autocast_triton_layer_on_gpu(model, precision):
    """A float32 layer under ``torch.autocast("cuda", dtype)`` on the Triton backend: its
    output has the torch backend's dtype under the same autocast (an aggregate of
    low-precision messages rounded to them, a softmax's float32), and both are within the
    precision's rounding of each other, gradients too."""
    dtype, tol = LOW[precision]
    g = random_block(torch.Generator().manual_seed(3), 12, 12, 48).to(CUDA)
    layer = LAYERS[model](D).eval().to(CUDA)
    feats = on_gpu(features(layer, g, D))
    results = {}
    for backend in ("triton", "torch"):
        with torch.autocast("cuda", dtype=dtype):
            results[backend] = run(on_backend(copy.deepcopy(layer), backend), g, feats)
    (out_t, grads_t), (out_l, grads_l) = results["triton"], results["torch"]
    assert out_t["h"].dtype == out_l["h"].dtype
    assert _scaled_err(out_t["h"], out_l["h"]) < 2 * tol
    floor = CANCEL_FLOOR * max(float(t.detach().abs().max())
                               for t in [*grads_l.values(), out_l["h"]] if t.numel())
    for name, want in grads_l.items():
        assert _scaled_err(grads_t[name], want, floor) < 8 * tol, f"grad of {name}"
