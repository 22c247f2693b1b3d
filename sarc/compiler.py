"""The compilation pipeline, top to bottom (``STAGES``, run by ``compile_layer``): a layer
-> trace -> verify -> grad -> passes and the backend's passes -> plan for a ``Target`` ->
the cut at the plan's exchange (distributed targets) -> the backend's kernel and the
distributed schedule."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Callable

from .backends.registry import BACKENDS, get_backend  # noqa: F401 (BACKENDS: the names)
from .ir.autodiff import grad, has_gradient
from .ir.function import Function
from .ir.passes import (const_fold, cse, dce, fuse, linear_through_aggregate, pushdown,
                        split_concat, twins_first)
from .ir.printer import format_function
from .ir.split import LayerSplit, aggregates, split_layer
from .ir.verifier import verify
from .names import one_line
from .planner.plan import LayerPlan, plan_layer
from .planner.stats import ShardStats


def debug_level() -> int:
    try:
        return int(os.environ.get("SARC_DEBUG", "0"))
    except ValueError:
        return 0


PIPELINE = (const_fold, split_concat, linear_through_aggregate, pushdown, dce, cse, twins_first,
            fuse, dce)
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
class Target:
    """What a layer is planned for (``sarc.planner.plan.plan_layer``'s arguments).

    ``distributed``: cut the layer at the exchange and generate its distributed schedule
    even on one worker (more than one worker always does)."""

    mode: str = "full"                  # full | mfg | sampling
    workers: int = 1
    stats: ShardStats | None = None     # the shards' sizes (None: symbolic plan)
    exec_mode: str | None = None        # sar | oneshot | hybrid (None: the planner's choice)
    mem_budget: int | tuple[int, ...] | None = None  # bytes per worker kept for backward
    kept_peers: tuple[tuple[int, ...], ...] | None = None  # the whole step's choice (share_budget)
    baseline: bool = False              # the SAR-equivalent schedule
    inputs_need_grad: bool = True       # the layer's feature inputs need gradients
    distributed: bool = False

    @property
    def splits(self) -> bool:
        """Whether the ``distribute`` stage cuts the layer."""
        return self.distributed or self.workers > 1


@dataclass(frozen=True)
class Compilation:
    """Every stage's result for one layer (None for a stage not run): what ``sarc compile``
    prints is what runs."""

    backend: str
    name: str                         # the layer's name in the plan and the schedule
    target: Target | None             # what ``plan`` planned for (None: no plan)
    traced: Function                  # as the tracer built it
    verified: Function                # checked (sarc.ir.verifier)
    backward: Function | None         # the layer's backward IR, optimized (autodiff="ir")
    optimized: Function               # after the pipeline and the backend's own passes
    plan: LayerPlan | None            # the planner's choices for ``target``
    split: LayerSplit | None          # ``optimized`` cut at the plan's exchange
    kernel: object                    # the backend's callable kernel (its ``function`` is ``optimized``)
    schedule: object                  # the distributed schedule (``dist_backend.Generated``) of ``split``


def _trace(c: dict) -> None:
    layer = c["layer"]
    c["traced"] = layer if isinstance(layer, Function) else layer.trace()
    c["name"] = c["name"] or c["traced"].name


def _verify(c: dict) -> None:
    c["verified"] = verify(c["traced"])


def _grad(c: dict) -> None:
    # autodiff differentiates the verified layer; the passes then optimize both. A layer no
    # output of which has a gradient has no backward: it runs as under torch's autodiff.
    ir = c["autodiff"] == "ir" and has_gradient(c["verified"])
    c["backward"] = optimize(grad(c["verified"]), c["passes"]) if ir else None


def _optimize(c: dict) -> None:
    c["optimized"] = optimize(c["verified"], c["passes"])


def _plan(c: dict) -> None:
    t = c["target"]
    if t is not None:
        c["plan"] = plan_layer(c["name"], c["optimized"], mode=t.mode, workers=t.workers,
                               stats=t.stats, mem_budget=t.mem_budget, baseline=t.baseline,
                               exec_mode=t.exec_mode, inputs_need_grad=t.inputs_need_grad,
                               kept_peers=t.kept_peers, distributed=t.splits)


def _distribute(c: dict) -> None:
    t = c["target"]
    if t is not None and t.splits and aggregates(c["optimized"]):
        x = c["plan"].exchange
        c["split"] = split_layer(c["optimized"], x.values if x is not None else None)


def _lower(c: dict) -> None:
    c["kernel"] = get_backend(c["backend"]).compile(c["optimized"], c["backward"])
    if c.get("split") is not None:
        from .backends import dist_backend
        t = c["target"]
        c["schedule"] = dist_backend.compile(c["split"], c["plan"], backend=c["backend"],
                                             baseline=t.baseline, layer_name=c["name"],
                                             workers=t.workers)


STAGES: tuple[tuple[str, Callable[[dict], None]], ...] = (
    ("trace", _trace), ("verify", _verify), ("grad", _grad), ("optimize", _optimize),
    ("plan", _plan), ("distribute", _distribute), ("lower", _lower))
"""The compile stages, in order; each reads and adds entries of the compilation's record.
``optimize`` runs the pipeline (``PIPELINE``) and the backend's passes (``Backend.passes``);
``plan`` and ``distribute`` run for a ``Target`` (``distribute`` when it ``splits``)."""
NEEDS_TARGET = ("plan", "distribute")


def compile_layer(layer, backend: str = "torch", passes=PIPELINE, autodiff: str = "torch",
                  through: str = "lower", target: Target | None = None,
                  name: str | None = None) -> Compilation:
    """Run ``STAGES`` on ``layer`` (a ``sarc.Layer``, or its traced ``Function``), up to and
    including ``through``; every stage's result. ``target``: what to plan for (None: no
    plan, no split, no schedule); ``name``: the layer's name there (default: the traced
    function's)."""
    be = get_backend(backend)  # an unknown name is an error naming the available backends
    if autodiff not in AUTODIFF:
        raise ValueError(f"unknown autodiff {autodiff!r}; available: {', '.join(AUTODIFF)}")
    if through not in dict(STAGES):
        raise ValueError(f"unknown stage {through!r}; stages: {', '.join(n for n, _ in STAGES)}")
    if through in NEEDS_TARGET and target is None:
        raise ValueError(f"stage {through!r} plans for a target; pass target=Target(...)")
    extra = be.passes if passes == PIPELINE else ()
    record = {"layer": layer, "name": name, "backend": backend, "autodiff": autodiff,
              "target": target, "passes": (*passes, *extra)}
    for stage_name, stage in STAGES:
        stage(record)
        if stage_name == through:
            break
    if debug_level() >= 1 and "kernel" in record:
        print(one_line(f"--- sarc: {record['name']} ({backend}) -> {record['kernel'].path} ---"))
    return Compilation(**{f.name: record.get(f.name) for f in fields(Compilation)})


def compile_function(fn: Function, backend: str = "torch", passes=PIPELINE,
                     autodiff: str = "torch"):
    """The backend's callable kernel of the traced layer ``fn`` (``compile_layer``)."""
    return compile_layer(fn, backend, passes, autodiff).kernel
