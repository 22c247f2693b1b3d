"""``sarc compile``: a model file -> IR, plan, kernels and schedules, printed and written.

For every ``sarc.Layer`` in the model (in module order) it traces the layer,
runs the pass pipeline, generates the backend's code and plans the layer for
the requested mode and worker count. It prints a summary table and writes the
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

import argparse
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from . import names
from .atomic import atomic_directory, check_target
from .compiler import BACKENDS, compile_function
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
        kernel = compile_function(traced, backend=backend)
        optimized = kernel.function  # the IR that runs: the pipeline and the backend's passes
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
                                            layer_name=c.name, workers=art.plan.workers)
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


_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1000000' -> bytes; anything else (negative, inf, nan, words)
    is a ``CompileError`` naming --mem-budget."""
    m = _SIZE.fullmatch(text.strip())
    size = float(m[1]) * _UNITS[m[2].upper()] if m else math.nan
    if not math.isfinite(size) or size >= 2**63:
        raise CompileError(f"--mem-budget: cannot read {text!r} as a size: a number of bytes "
                           f">= 0, with K, M, G or T for KiB .. TiB (e.g. 512M, 2G)")
    return int(size)


def add_compile_parser(sub) -> None:
    from .cli import add_mode_arguments

    p = sub.add_parser("compile", help="compile a model file and show its IR, plan, kernels, schedule",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the model file (defines build_model and HPARAMS)")
    add_mode_arguments(p)
    p.add_argument("--backend", choices=BACKENDS, default="torch")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--partition", help="a partition directory (real statistics for the plan)")
    p.add_argument("--dataset", help="the dataset whose sizes build the model (default: the model's)")
    p.add_argument("--mem-budget", help="memory per worker for kept remote rows, e.g. 512M")
    p.add_argument("--baseline", action="store_true",
                   help="plan the SAR-equivalent schedule (no pushdown across the exchange, no online softmax)")
    p.add_argument("--emit", default="ir,plan,kernels,schedule",
                   help=f"comma-separated artifacts to write: {', '.join(EMITS)}")
    p.add_argument("--out", help="the directory to write the artifacts to: missing or empty, "
                   "or a set an earlier sarc compile wrote (with --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the set an earlier sarc compile wrote at --out")
    p.set_defaults(func=compile_command)


def check_compile_args(args) -> tuple[str, ...]:
    """Every value of ``sarc compile`` checked before any work; the artifacts to emit."""
    from .cli import check_mode_arguments, check_output_dir

    check_mode_arguments(args)
    emit = tuple(e.strip() for e in args.emit.split(",") if e.strip())
    bad = [e for e in emit if e not in EMITS]
    if bad:
        raise CompileError(f"--emit: unknown artifact {', '.join(bad)}; choose from {', '.join(EMITS)}")
    if args.workers < 1:
        raise CompileError(f"--workers must be at least 1, got {args.workers}")
    if args.mem_budget is not None:
        parse_bytes(args.mem_budget)
    check_output_dir("--out", args.out)
    if args.out:
        check_target(args.out, args.overwrite, SET_KIND)  # before the work, not only after it
    elif args.overwrite:
        raise CompileError("--overwrite applies to --out, which is not given")
    return emit


def compile_command(args) -> int:
    from .datasets import load_dataset
    from .loader import load_model_file
    from .train import DEFAULTS, build

    emit = check_compile_args(args)
    spec = load_model_file(args.model)
    hparams = {**DEFAULTS, **spec.hparams}
    data = load_dataset(args.dataset or hparams["dataset"])
    model = build(spec, data, hparams)
    stats = None
    if args.partition:
        stats = _partition_stats(Path(args.partition))
        if stats.num_parts != args.workers:
            if args.workers != 1:
                raise CompileError(f"--partition has {stats.num_parts} parts but --workers is {args.workers}")
            args.workers = stats.num_parts
    art = compile_model(model, spec.name, mode=args.mode, backend=args.backend,
                        workers=args.workers, stats=stats,
                        mem_budget=parse_bytes(args.mem_budget) if args.mem_budget else None,
                        baseline=args.baseline, exec_mode=args.exec_mode)
    print(format_summary(art), end="")
    if "plan" in emit:
        print(format_plan(art.plan), end="")
    if args.out:
        written = write_artifacts(art, Path(args.out), emit, overwrite=args.overwrite)
        print(f"wrote {len(written)} files to {args.out}")
    return 0


def _partition_stats(path: Path) -> ShardStats:
    """Statistics of a partition set written by ``sarc partition``."""
    from .partition import load_partitions
    return ShardStats.from_partition_set(load_partitions(path))
