"""``sarc compile``: a model file -> IR, plan, kernels and schedules, printed and written.

For every ``sarc.Layer`` in the model (in module order) it runs the compile
pipeline (``sarc.compiler``: trace, passes, plan for the requested mode and
worker count, the cut at the exchange, the backend's code and the schedule;
``sarc.artifacts``), prints a summary and the plan it compiled, and writes the
artifacts the user asks for (``--emit``) to ``--out`` (see ``sarc.artifacts``
for the files).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..artifacts import (EMITS, SET_KIND, CompileError, compile_model, format_summary,
                         write_artifacts)
from ..atomic import check_target
from ..compiler import BACKENDS
from ..planner.plan import format_plan
from ..planner.stats import ShardStats
from .options import add_mode_arguments, check_mode_arguments, check_output_dir, parse_bytes


def add_compile_parser(sub) -> None:
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
    from ..datasets import load_dataset
    from ..loader import load_model_file
    from ..train import DEFAULTS, build

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
                        baseline=args.baseline, exec_mode=args.exec_mode,
                        schedules="schedule" in emit)
    print(format_summary(art), end="")
    if "plan" in emit:
        print(format_plan(art.plan), end="")
    if args.out:
        written = write_artifacts(art, Path(args.out), emit, overwrite=args.overwrite)
        print(f"wrote {len(written)} files to {args.out}")
    return 0


def _partition_stats(path: Path) -> ShardStats:
    """Statistics of a partition set written by ``sarc partition``."""
    from ..partition import load_partitions
    return ShardStats.from_partition_set(load_partitions(path))
