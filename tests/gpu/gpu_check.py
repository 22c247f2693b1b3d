"""The Triton backend on a CUDA GPU, compiled (not interpreted), against the PyTorch backend
on the same GPU: graphs, runs and comparisons shared by the tests of this directory.

``SKIP`` says why these tests cannot run here (no CUDA GPU, no usable Triton); the test
modules skip on it. ``compare`` checks outputs and the gradients of every parameter and
float feature under one seeded random cotangent, as tests/backends/triton/triton_check.py
does in the interpreter, with every tensor on the GPU.
"""
from __future__ import annotations

import copy
import dataclasses
from types import ModuleType
from typing import Mapping

import pytest
import torch
from difftest import CANCEL_FLOOR, assert_close

import sarc


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return ("no CUDA GPU here (torch.cuda.is_available() is False): the GPU tests run "
                "on a machine with one (scripts/gpu_session.sh)")
    import os

    from sarc.backends import triton_backend
    saved = os.environ.pop("TRITON_INTERPRET", None)  # Triton decorates its library on import
    try:
        triton_backend.check_triton()
    except triton_backend.TritonUnavailable as e:
        return str(e)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return interpreted_library()


def interpreted_library() -> str | None:
    """Why compiled kernels cannot work in this process: Triton was imported under
    ``TRITON_INTERPRET=1`` (its own ``@triton.jit`` library functions are then the
    interpreter's), e.g. by a whole-suite run that collected tests/backends/triton first."""
    import triton.language.standard as standard
    if any(type(v).__name__ == "InterpretedFunction" for v in vars(standard).values()):
        return ("Triton was imported under TRITON_INTERPRET=1 in this process (a run that "
                "collected tests/backends/triton first): run `pytest -m gpu tests/gpu` on its own")
    return None


SKIP = _skip_reason()
needs_gpu = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
"""Apply to every test here (with ``pytest.mark.gpu``): ``pytestmark = [gpu, needs_gpu]``."""

CUDA = torch.device("cuda")

LONG_SUM_RTOL = 1e-4
"""Relative tolerance where a row sums ~1e5 float32 terms (a hub, a relation of 8M rows): the
PyTorch backend adds them in another order (atomics), and rounding grows with the row."""


def graph(src, dst, num_nodes: int) -> sarc.Graph:
    return sarc.Graph.from_edges(torch.as_tensor(src), torch.as_tensor(dst), num_nodes).to(CUDA)


def on_gpu(feats: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict:
    """Features on the GPU; float ones converted to ``dtype`` when given."""
    return {k: v.to(CUDA, dtype) if dtype is not None and v.is_floating_point() else v.to(CUDA)
            for k, v in feats.items()}


def kernel_modules(obj, seen=None) -> list[ModuleType]:
    """The generated kernel modules (those with a ``kernel``) reachable from a runtime op."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, ModuleType):
        return [obj] if hasattr(obj, "kernel") else []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    else:
        return []
    return [m for c in children for m in kernel_modules(c, seen)]


def _fresh(feats: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in feats.items()}


def run(layer: torch.nn.Module, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
        cot_seed: int = 7) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Outputs, and gradients of (params, float features) under a seeded random cotangent
    (drawn on the CPU, the same for every layer and dtype; the loss summed in float32)."""
    fs = _fresh(feats)
    out = layer(g, **fs)
    out = dict(out) if isinstance(out, Mapping) else {"h": out}
    gen = torch.Generator().manual_seed(cot_seed)
    cot = {k: torch.randn(v.shape, generator=gen).to(v.device) for k, v in sorted(out.items())}
    loss = sum(((out[k].float() * cot[k]).sum() for k in cot), torch.zeros((), device=CUDA))
    named = [(n, p) for n, p in layer.named_parameters() if p.requires_grad]
    named += [(f"feature {k}", fs[k]) for k in sorted(fs) if fs[k].is_floating_point()]
    if not loss.requires_grad:
        return out, {n: torch.zeros_like(w) for n, w in named}
    grads = torch.autograd.grad(loss, [w for _, w in named], allow_unused=True)
    return out, {n: torch.zeros_like(w) if gr is None else gr for (n, w), gr in zip(named, grads)}


def on_backend(layer: torch.nn.Module, backend: str) -> torch.nn.Module:
    for m in layer.modules():
        if isinstance(m, sarc.Layer):
            m.set_backend(backend)
    return layer


def both_backends(layer: sarc.Layer, g: sarc.Graph, feats: Mapping[str, torch.Tensor]):
    """(Triton layer, its outputs and gradients, the PyTorch backend's); the same dropout
    seed for both (sarc.ir.rng draws it from torch's generator)."""
    tri = on_backend(copy.deepcopy(layer), "triton")
    ref = on_backend(copy.deepcopy(layer), "torch")
    torch.manual_seed(1234)
    got = run(tri, g, feats)
    torch.manual_seed(1234)
    want = run(ref, g, feats)
    return tri, got, want


def compare(layer: sarc.Layer, g: sarc.Graph, feats: Mapping[str, torch.Tensor],
            rtol: float = 1e-5) -> sarc.Layer:
    """Triton == PyTorch backend on the GPU, outputs and every gradient, every op on Triton
    kernels that were compiled for the GPU; returns the Triton layer."""
    tri, (out_t, grads_t), (out_r, grads_r) = both_backends(layer, g, feats)
    kernel = tri.compiled()
    assert kernel.fallbacks == (), kernel.fallbacks
    assert_compiled(kernel)
    assert sorted(out_t) == sorted(out_r)
    for k in out_r:
        assert out_t[k].device.type == CUDA.type
        assert_close(out_t[k].to(out_r[k].dtype), out_r[k], rtol, f"output {k!r}")
    floor = CANCEL_FLOOR * max([t.abs().max().item() for t in grads_r.values() if t.numel()]
                               + [t.abs().max().item() for t in out_r.values() if t.numel()]
                               + [0.0])
    assert sorted(grads_t) == sorted(grads_r)
    for name in grads_r:
        assert_close(grads_t[name].to(grads_r[name].dtype), grads_r[name], rtol,
                     f"grad of {name}", floor)
    return tri


def assert_compiled(kernel) -> None:
    """Every kernel of a compiled layer is a GPU kernel, not Triton's CPU interpreter's."""
    from sarc.backends.triton_runtime import interpreted
    mods = kernel_modules(list(kernel.ops))
    assert mods, "the layer has no Triton kernels"
    wrong = [m.__name__ for m in mods if interpreted(m.kernel)]
    assert not wrong, f"kernels decorated under TRITON_INTERPRET=1: {wrong}"
