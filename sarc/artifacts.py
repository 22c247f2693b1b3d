"""A model's compiled artifacts: IR, plan, kernels and schedules (what ``sarc compile``,
``sarc.cli.compile``, prints and writes).

For every ``sarc.Layer`` in the model (in module order) ``compile_model`` traces the
layer, compiles it (the pipeline and the backend's passes: the IR that runs) and plans
the layers for the requested mode and worker count. ``write_artifacts`` writes the
artifacts the user asks for (``--emit``) to ``--out``:

- ``ir``:       ``<layer>.traced.ir`` and ``<layer>.ir`` (before / after passes)
- ``plan``:     ``plan.txt`` and ``plan.json``
- ``kernels``:  the generated code of each layer (``<layer>.<backend>.py``); with the
                Triton backend also each kernel as its own module (``<layer>.kernels/``)
- ``schedule``: ``schedule.txt``, the exchange rounds of each layer, forward and backward,
  and ``<layer>.schedule.py``, the generated distributed schedule of each layer
  (``sarc.backends.dist_backend``: its parts, forward and backward over torch.distributed)

``--out`` is written as a whole, through ``sarc.atomic`` (as ``sarc partition`` writes
its sets): into a temporary sibling, then swapped into place, so an error or a kill
leaves the old set or the new one. A missing or empty ``--out`` is written; a set an
earlier ``sarc compile`` wrote is replaced with ``--overwrite``; anything else (the
user's files, a file, another kind of set) is refused before the model is compiled.
File names come from the model's submodule names, made safe (``sarc.names.file_stem``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from . import names
from .atomic import atomic_directory
from .compiler import compile_layer
from .dsl import Layer
from .errors import SarcError
from .ir.function import Function
from .ir.ops import FUSED
from .ir.printer import format_function
from .planner.plan import Plan, format_plan, plan_model
from .planner.stats import ShardStats

EMITS = ("ir", "plan", "kernels", "schedule")
SET_KIND = "compile"  # the kind of set in its manifest (``sarc.atomic``)


class CompileError(SarcError):
    """The compile command's arguments or inputs are wrong."""


@dataclass(frozen=True)
class CompiledLayer:
    name: str
    traced: Function
    optimized: Function
    kernel_source: str
    kernel_files: tuple[tuple[str, str], ...] = ()  # (file name, text) of each separate kernel


@dataclass(frozen=True)
class ModelArtifacts:
    model_name: str
    backend: str
    layers: tuple[CompiledLayer, ...]
    plan: Plan
    seconds: float


def find_layers(model: nn.Module) -> list[tuple[str, Layer]]:
    """The model's sarc layers in module order (the documented convention)."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, Layer)]
    if not layers:
        raise CompileError(f"the model ({type(model).__name__}) contains no sarc.Layer")
    return layers


def compile_model(model: nn.Module, name: str, *, mode: str = "full", backend: str = "torch",
                  workers: int = 1, stats: ShardStats | None = None,
                  mem_budget: int | None = None, baseline: bool = False,
                  exec_mode: str | None = None) -> ModelArtifacts:
    t0 = time.perf_counter()
    compiled = []
    for lname, layer in find_layers(model):
        traced = layer.trace()
        compiled_layer = compile_layer(traced, backend=backend)
        kernel, optimized = compiled_layer.kernel, compiled_layer.optimized  # the IR that runs
        files = tuple(kernel.kernel_files().items()) if hasattr(kernel, "kernel_files") else ()
        compiled.append(CompiledLayer(lname, traced, optimized, kernel.source, files))
    plan = plan_model([(c.name, c.optimized) for c in compiled], mode=mode, workers=workers,
                      stats=stats, mem_budget=mem_budget, baseline=baseline, exec_mode=exec_mode)
    return ModelArtifacts(name, backend, tuple(compiled), plan, time.perf_counter() - t0)


def format_schedule(art: ModelArtifacts) -> str:
    plan = art.plan
    lines = [f"schedule: {art.model_name}, mode={plan.mode}, workers={plan.workers}"]
    for lp in plan.layers:
        lines.append(f"layer {lp.name} ({lp.exec_mode})")
        if plan.workers == 1 or lp.exchange is None:
            lines.append("  forward: aggregate the local block; backward: autograd on the local block")
            continue
        x = " + ".join(lp.exchange.names)
        lines.append("  forward:")
        lines.append(f"    compute {x} on owned rows")
        for k, rnd in enumerate(plan.rounds, 1):
            pairs = ", ".join(f"{r}->{s}" for r, s, _ in rnd)
            lines.append(f"    round {k}: send boundary rows of {x} ({pairs}); "
                         f"aggregate the received shard into local rows"
                         f"{'; free it' if lp.exec_mode != 'oneshot' else '; keep it'}"
                         f"{' (next round prefetched)' if k < len(plan.rounds) else ''}")
        lines.append("    aggregate the local shard; update")
        lines.append("  backward:")
        for k, rnd in enumerate(plan.rounds, 1):
            refetch = "re-fetch the shard's rows (rematerialize), " if lp.exec_mode != "oneshot" else ""
            grad = "send their gradients back to the owners" if lp.exchange.needs_grad else \
                "no gradient leaves (the exchanged rows need none)"
            lines.append(f"    round {k}: {refetch}recompute the edge values, {grad}")
        lines.append("    all-reduce parameter gradients")
    return "\n".join(lines) + "\n"


def schedule_sources(art: ModelArtifacts) -> dict[str, str]:
    """Each layer's generated distributed schedule (the module ``sarc train --workers`` runs),
    for the plan's mode and workers."""
    from .backends import dist_backend
    from .distributed.split import split_layer
    out = {}
    for c, lp in zip(art.layers, art.plan.layers):
        split = split_layer(c.optimized, lp.exchange)
        out[c.name] = dist_backend.generate(split, lp, baseline=art.plan.baseline,
                                            layer_name=c.name, workers=art.plan.workers,
                                            backend=art.backend)
    return out


def format_summary(art: ModelArtifacts) -> str:
    head = ["layer", "class", "ops traced", "ops optimized", "fused", "exec", "exchanged",
            "width", "sent/worker"]
    rows = []
    for c, lp in zip(art.layers, art.plan.layers):
        fused = ", ".join(v.op.value for v in c.optimized.values if v.op in FUSED) or "-"
        if lp.exchange is None:
            exch, width, sent = "-", "-", "-"
        else:
            exch, width = " + ".join(lp.exchange.names), str(lp.exchange.width)
            sent = (f"{max(lp.bytes_sent) / 2**20:.2f} MiB" if lp.bytes_sent is not None
                    else f"{lp.bytes_sent_expr} bytes")
        rows.append([c.name, c.traced.name, str(len(c.traced)), str(len(c.optimized)), fused,
                     lp.exec_mode, exch, width, sent])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip()
    out = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)]
    out.append(f"compiled {len(art.layers)} layer(s) for mode={art.plan.mode}, "
               f"backend={art.backend}, workers={art.plan.workers} in {art.seconds:.2f} s")
    return "\n".join(out) + "\n"


def write_artifacts(art: ModelArtifacts, out: Path, emit: tuple[str, ...], *,
                    overwrite: bool = False) -> list[Path]:
    """Write the chosen artifacts as the set at ``out``, all at once (``sarc.atomic``);
    ``overwrite`` replaces a set an earlier compile wrote there."""
    files: dict[str, str] = {}
    for c in art.layers:
        stem = names.file_stem(c.name)
        if "ir" in emit:
            files[f"{stem}.traced.ir"] = format_function(c.traced)
            files[f"{stem}.ir"] = format_function(c.optimized)
        if "kernels" in emit:
            files[f"{stem}.{art.backend}.py"] = c.kernel_source
            for name, text in c.kernel_files:
                files[f"{stem}.kernels/{_python_file(name)}"] = text
    if "plan" in emit:
        files["plan.txt"] = format_plan(art.plan)
        files["plan.json"] = art.plan.dumps()
    if "schedule" in emit:
        files["schedule.txt"] = format_schedule(art)
        for lname, source in schedule_sources(art).items():
            files[f"{names.file_stem(lname)}.schedule.py"] = source
    with atomic_directory(out, kind=SET_KIND, overwrite=overwrite) as tmp:
        for rel, text in files.items():
            path = names.inside(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return [Path(out) / rel for rel in files]


def _python_file(name: str) -> str:
    """A kernel's file name (``NAME.py``, NAME maybe from the layer's class) made safe."""
    return f"{names.file_stem(name.removesuffix('.py'))}.py"
