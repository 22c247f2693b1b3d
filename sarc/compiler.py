"""The compilation pipeline, top to bottom: a traced layer -> verify -> grad -> passes and
the backend's passes -> the backend's kernel (``STAGES``, run by ``compile_layer``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Callable

from .backends.registry import BACKENDS, get_backend  # noqa: F401 (BACKENDS: the names)
from .ir.autodiff import grad
from .ir.function import Function
from .ir.passes import (const_fold, cse, dce, fuse, linear_through_aggregate, pushdown,
                        split_concat)
from .ir.printer import format_function
from .ir.verifier import verify


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


AUTODIFF = ("torch", "ir")
"""Where gradients come from: torch autograd through the generated code, or the
layer's backward IR (``sarc.ir.autodiff``), optimized and compiled like the layer."""


@dataclass(frozen=True)
class Compilation:
    """Every stage's result for one layer: what ``sarc compile`` prints is what runs."""

    backend: str
    traced: Function                  # as the tracer built it
    verified: Function                # checked (sarc.ir.verifier)
    backward: Function | None         # the layer's backward IR, optimized (autodiff="ir")
    optimized: Function               # after the pipeline and the backend's own passes
    kernel: object                    # the backend's callable kernel (its ``function`` is ``optimized``)


def _verify(c: dict) -> None:
    c["verified"] = verify(c["traced"])


def _grad(c: dict) -> None:
    # autodiff differentiates the verified layer; the passes then optimize both
    c["backward"] = (optimize(grad(c["verified"]), c["passes"]) if c["autodiff"] == "ir"
                     else None)


def _optimize(c: dict) -> None:
    c["optimized"] = optimize(c["verified"], c["passes"])


def _lower(c: dict) -> None:
    c["kernel"] = get_backend(c["backend"]).compile(c["optimized"], c["backward"])


STAGES: tuple[tuple[str, Callable[[dict], None]], ...] = (
    ("verify", _verify), ("grad", _grad), ("optimize", _optimize), ("lower", _lower))
"""The compile stages, in order; each reads and adds entries of the compilation's record.
``optimize`` runs the pipeline (``PIPELINE``) and the backend's passes (``Backend.passes``)."""


def compile_layer(fn: Function, backend: str = "torch", passes=PIPELINE,
                  autodiff: str = "torch", through: str = "lower") -> Compilation:
    """Run ``STAGES`` on the traced layer ``fn``, up to and including ``through``; every
    stage's result (None for the stages not run)."""
    be = get_backend(backend)  # an unknown name is an error naming the available backends
    if autodiff not in AUTODIFF:
        raise ValueError(f"unknown autodiff {autodiff!r}; available: {', '.join(AUTODIFF)}")
    extra = be.passes if passes == PIPELINE else ()
    record = {"traced": fn, "backend": backend, "autodiff": autodiff,
              "passes": (*passes, *extra)}
    if through not in dict(STAGES):
        raise ValueError(f"unknown stage {through!r}; stages: {', '.join(n for n, _ in STAGES)}")
    for name, stage in STAGES:
        stage(record)
        if name == through:
            break
    if debug_level() >= 1 and "kernel" in record:
        print(f"--- sarc: {fn.name} ({backend}) -> {record['kernel'].path} ---")
    return Compilation(**{f.name: record.get(f.name) for f in fields(Compilation)})


def compile_function(fn: Function, backend: str = "torch", passes=PIPELINE,
                     autodiff: str = "torch"):
    """The backend's callable kernel of the traced layer ``fn`` (``compile_layer``)."""
    return compile_layer(fn, backend, passes, autodiff).kernel
