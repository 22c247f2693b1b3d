"""The ``sarc`` command line: one subcommand per ``add_*_parser`` in ``SUBCOMMANDS``.

A subcommand is a function ``add_NAME_parser(subparsers)`` that adds its
parser and sets ``func`` (``parser.set_defaults(func=NAME_command)``) to a
function ``NAME_command(args) -> int`` (the exit status). Adding one is a
line in ``SUBCOMMANDS``. A command checks every value it is given before any
work (``check_train_args``): before a dataset is loaded or partitioned, a worker
launched or an epoch trained; a result file's directory must exist and be
writable by then. Errors sarc raises on the user's behalf (a mistake in the
model file, a missing dataset, bad arguments: ``SarcError``) print as one
``sarc: error: ...`` message, with the model file's line where there is one,
and exit with status 2; anything else is a bug in sarc and keeps its traceback.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .checkpoint import add_checkpoint_arguments, checkpoint_config
from .errors import SarcError
from .planner.plan import EXEC_MODES, MODES


class UsageError(SarcError):
    """A command-line argument that cannot be honoured."""


# --- checking option values, before any work ---------------------------------------------

SEED_LIMIT = 2**31
"""Seeds are 0 .. 2**31 - 1: what every seeded library here (torch, numpy, METIS) accepts."""

MAX_TIMEOUT_S = 1e9
"""The longest --timeout, in seconds (about 31 years; torch's timers overflow far beyond)."""


def at_least(option: str, value: int | None, low: int) -> None:
    """``option``'s value is None (not given) or at least ``low``."""
    if value is not None and value < low:
        raise UsageError(f"{option} must be at least {low}, got {value}")


def add_mode_arguments(p, group=None) -> None:
    """``--mode full|mfg|sampling`` (what a step computes on) and ``--exec
    sar|oneshot|hybrid`` (how a layer's remote rows cross); one vocabulary for every
    command. The spellings before it (``--exec-mode``, ``--mode sar``) are errors
    naming the new one (``check_mode_arguments``)."""
    p.add_argument("--mode", default="full", metavar="{" + ",".join(MODES) + "}",
                   help="full (every node, every step), mfg (per step, the nodes that reach "
                        "the seeds) or sampling (sampled neighborhoods); default full")
    (group or p).add_argument(
        "--exec", dest="exec_mode", choices=EXEC_MODES,
        help="how every layer's remote rows cross: sar (one remote shard's rows at a time, "
             "re-fetched in backward), oneshot (all remote rows fetched once and kept), "
             "hybrid (keep what --mem-budget allows); default: the planner's")
    p.add_argument("--exec-mode", dest="old_exec_mode", help=argparse.SUPPRESS)


def check_mode_arguments(args) -> None:
    if args.old_exec_mode is not None:
        raise UsageError(f"--exec-mode is now --exec (--exec {args.old_exec_mode})")
    if args.mode in EXEC_MODES:
        raise UsageError(f"--mode {args.mode}: the exchange strategy is now --exec {args.mode}; "
                         f"--mode is one of {', '.join(MODES)}")
    if args.mode not in MODES:
        raise UsageError(f"--mode must be one of {', '.join(MODES)}, got {args.mode!r}")


def check_seed(option: str, value: int | None) -> None:
    if value is not None and not 0 <= value < SEED_LIMIT:
        raise UsageError(f"{option} must be in 0 .. 2**31 - 1, got {value}")


def check_timeout(option: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise UsageError(f"{option} must be a number of seconds > 0 and at most "
                         f"{MAX_TIMEOUT_S:g}, got {seconds}")


def check_input_dir(option: str, path: str | None) -> None:
    """``path`` (if given) is an existing directory."""
    if path is not None and not Path(path).is_dir():
        raise UsageError(f"{option} {path} " + ("is not a directory" if Path(path).exists()
                                                 else "does not exist"))


def check_output_file(option: str, path: str | None) -> None:
    """A file can be written at ``path`` (if given): its directory exists and is writable."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {path} is a directory; give the path of a file")
    where = p.absolute().parent
    if not where.exists():
        raise UsageError(f"{option} {path}: the directory {where} does not exist")
    _writable_dir(option, path, where)
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{option} {path} exists and is not writable")


def check_output_dir(option: str, path: str | None) -> None:
    """A directory can be written at ``path`` (if given): it is one or can be made, in a
    writable place (the directory is written beside itself, then renamed into place)."""
    if path is None:
        return
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path} exists and is not a directory")
    where = p.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    _writable_dir(option, path, where)


def _writable_dir(option: str, path: str, where: Path) -> None:
    if not where.is_dir():
        raise UsageError(f"{option} {path}: {where} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the directory {where} is not writable")


def check_train_args(args):
    """Every value of ``sarc train`` checked, before any data is loaded, partitioned or
    trained on: the (spec, hyperparameters) of the run. The model file is imported here:
    ``--set`` is checked against its ``HPARAMS`` and ``build_model``."""
    from .artifacts import parse_bytes
    from .loader import load_model_file
    from .train import hyperparameters

    at_least("--workers", args.workers, 1)
    check_mode_arguments(args)
    if args.mode != "full":
        raise UsageError(f"--mode {args.mode}: sarc train trains full-batch (--mode full); "
                         f"`sarc compile --mode {args.mode}` prints that mode's plan")
    if args.workers > 1 or args.partition:
        if args.quiet:
            raise UsageError("--quiet is not supported with --workers > 1 (rank 0 prints the epochs)")
    else:
        given = [f for f, on in (("--exec", args.exec_mode), ("--mem-budget", args.mem_budget),
                                 ("--baseline", args.baseline),
                                 ("--max-restarts", args.max_restarts),
                                 ("--master-port", args.master_port is not None)) if on]
        if given:
            raise UsageError(f"{', '.join(given)}: distributed options; they need --workers > 1 "
                             f"(or a --partition)")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError(f"--master-port must be a TCP port (1 to 65535), got {args.master_port}")
    at_least("--max-restarts", args.max_restarts, 0)
    at_least("--epochs", args.epochs, 1)
    at_least("--log-every", args.log_every, 1)
    at_least("--threads", args.threads, 1)
    check_seed("--seed", args.seed)
    check_timeout("--timeout", args.timeout)
    if args.mem_budget is not None:
        parse_bytes(args.mem_budget)
    check_input_dir("--data-dir", args.data_dir)
    check_output_file("--json", args.json)
    check_output_file("--save", args.save)
    spec = load_model_file(args.model)
    return spec, hyperparameters(spec, parse_overrides(args.overrides), epochs=args.epochs)


def add_check_data_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check-data", dest="check_data", action="store_false",
                   help="skip the scans of the dataset's feature values (NaN, Inf) and edge "
                        "ids (in range), for speed on a dataset known to be sound; its "
                        "arrays' presence, types and shapes are still checked")


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train", help="train a model file on a node-classification dataset",
        description="Train the model of MODEL.py (its build_model and HPARAMS) full-batch "
                    "on one process, and report validation-selected test accuracy.")
    p.add_argument("model", metavar="MODEL.py", help="the model file (defines build_model and HPARAMS)")
    p.add_argument("--dataset", help="dataset name (cora, aifb, citeseer, pubmed) or .npz path "
                   "(default: the model's HPARAMS['dataset'], else cora)")
    p.add_argument("--data-dir", help="directory of datasets not embedded in sarc")
    add_check_data_argument(p)
    p.add_argument("--epochs", type=int, help="most epochs (default: the model's HPARAMS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1,
                   help="processes: 1 trains in this process; P > 1 launches P workers through "
                        "torchrun on this machine (gloo, or NCCL with CUDA), each on a shard")
    dist = p.add_argument_group("distributed training (--workers > 1)")
    add_mode_arguments(p, dist)
    dist.add_argument("--partition", metavar="DIR",
                      help="a partition set (sarc partition) with one part per worker; "
                           "default: partition the dataset into a temporary directory")
    dist.add_argument("--method", choices=("metis", "random"), default="metis",
                      help="how to partition when no --partition is given (default metis)")
    dist.add_argument("--mem-budget", help="memory per worker for kept remote rows, e.g. 512M")
    dist.add_argument("--baseline", action="store_true",
                      help="the SAR-equivalent schedule: the raw layer input crosses the "
                           "network, no online softmax")
    dist.add_argument("--timeout", type=float, default=120.0,
                      help="seconds a worker waits for a peer before giving up (default 120)")
    dist.add_argument("--max-restarts", type=int, default=0, metavar="K",
                      help="when a worker dies, restart all workers up to K times; with "
                           "--checkpoint they resume from the latest checkpoint (default 0)")
    dist.add_argument("--master-port", type=int, metavar="PORT",
                      help="the rendezvous port on 127.0.0.1 (default: a free one)")
    add_checkpoint_arguments(p)
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hyperparameter, e.g. --set hidden=32 --set lr=0.005")
    p.add_argument("--log-every", type=int, default=1, help="print every N-th epoch (default 1)")
    p.add_argument("--quiet", action="store_true", help="print only the final result")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.set_defaults(func=train_command)
    return p


def train_command(args) -> int:
    from .datasets import load_dataset
    from .train import train

    checkpoint = checkpoint_config(args)
    spec, hp = check_train_args(args)
    if args.workers > 1 or args.partition:
        from .distributed.launch import launch
        return launch(args)
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    data = load_dataset(args.dataset or hp["dataset"], args.data_dir, check=args.check_data)
    result = train(spec, data, epochs=args.epochs, seed=args.seed,
                   hparams=parse_overrides(args.overrides), log=None if args.quiet else print,
                   log_every=args.log_every, checkpoint=checkpoint, save=args.save)
    if args.quiet:
        print(f"{result['model']} on {result['dataset']} (seed {result['seed']}): "
              f"test acc {result['test_acc']:.4f} (val {result['val_acc']:.4f}, "
              f"epoch {result['best_epoch']} of {result['epochs']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: v for k, v in result.items() if k != "module"}, f, indent=2)
            f.write("\n")
    return 0


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["hidden=32", "lr=5e-3", "num_bases=None"]`` -> dict of Python literals (else strings)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key.strip()] = value
    return out


def _compile_parser(subparsers):
    from .artifacts import add_compile_parser
    return add_compile_parser(subparsers)


def _partition_parser(subparsers):
    from .partition.cli import add_partition_parser
    return add_partition_parser(subparsers)


def _worker_parser(subparsers):
    from .distributed.worker import add_worker_parser
    return add_worker_parser(subparsers)


SUBCOMMANDS: tuple[Callable[[Any], Any], ...] = (add_train_parser, _compile_parser,
                                                  _partition_parser, _worker_parser)
"""Every subcommand, in the order ``sarc --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sarc", description="sarc: a compiler for "
                                     "distributed training of graph neural networks")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"sarc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SarcError as e:
        print(f"sarc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
