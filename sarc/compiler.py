"""The compilation pipeline, top to bottom: trace -> verify -> passes -> backend."""
from __future__ import annotations

import os

from .ir.autodiff import grad
from .ir.function import Function
from .ir.passes import (const_fold, cse, dce, fuse, fuse_typed_linear,
                        linear_through_aggregate, pushdown, split_concat)
from .ir.printer import format_function
from .ir.verifier import verify

BACKENDS = ("torch", "triton")


def debug_level() -> int:
    try:
        return int(os.environ.get("SARC_DEBUG", "0"))
    except ValueError:
        return 0


PIPELINE = (const_fold, split_concat, linear_through_aggregate, pushdown, dce, cse, fuse, dce)
"""The optimizing passes, in order (each ``Function -> Function``)."""


def optimize(fn: Function, passes=PIPELINE) -> Function:
    """Run ``passes``; the verifier runs after every one."""
    for p in passes:
        fn = verify(p(fn))
        if debug_level() >= 2:
            print(f"--- after {p.__name__} ---\n{format_function(fn)}")
    return fn


UNFUSED = (const_fold, dce, cse, dce)
"""The pipeline without pushdown and fusion: the baseline benchmarks compare against."""


BACKEND_PASSES = {"torch": (fuse_typed_linear, dce), "triton": ()}
"""Passes one backend adds after the pipeline (fusions only its kernels implement)."""


AUTODIFF = ("torch", "ir")
"""Where gradients come from: torch autograd through the generated code, or the
layer's backward IR (``sarc.ir.autodiff``), optimized and compiled like the layer."""


def compile_function(fn: Function, backend: str = "torch", passes=PIPELINE,
                     autodiff: str = "torch"):
    """Optimize ``fn`` with ``passes`` and hand it to ``backend``; returns a callable kernel."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(BACKENDS)}")
    if autodiff not in AUTODIFF:
        raise ValueError(f"unknown autodiff {autodiff!r}; available: {', '.join(AUTODIFF)}")
    fn = verify(fn)
    # autodiff differentiates the traced layer: the passes then optimize both
    extra = BACKEND_PASSES[backend] if passes == PIPELINE else ()
    backward = optimize(grad(fn), (*passes, *extra)) if autodiff == "ir" else None
    fn = optimize(fn, (*passes, *extra))
    if backend == "torch":
        from .backends import torch_backend
        kernel = torch_backend.compile(fn, backward)
    elif backend == "triton":
        from .backends import triton_backend
        kernel = triton_backend.compile(fn, backward)
    if debug_level() >= 1:
        print(f"--- sarc: {fn.name} ({backend}) -> {kernel.path} ---")
    return kernel
