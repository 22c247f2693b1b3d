"""``sarc worker`` and ``python -m sarc.cli.worker``: the command line of one worker of a
distributed run (``sarc.distributed.worker``), as torchrun starts it:

    torchrun --nproc-per-node P -m sarc.cli.worker MODEL.py --partition DIR [options]

``sarc train --workers P`` starts it on this machine; across machines, run it under
torchrun on each. Every value is checked before the worker joins its group.
"""
from __future__ import annotations

import argparse

from ..checkpoint import add_checkpoint_arguments, checkpoint_config
from ..loader import parse_overrides
from .options import (MEM_BUDGET_HELP, ArgumentParser, add_device_arguments,
                      add_embedding_arguments, add_mode_arguments, add_sampling_arguments,
                      check_backend, check_input_dir, check_mode_arguments, check_run_options,
                      minibatch_config, parse_bytes, parse_device, UsageError)


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.py", help="the model file (build_model, HPARAMS)")
    p.add_argument("--partition", required=True,
                   help="the partition set (sarc partition), or a DGL partition's NAME.json")
    add_mode_arguments(p)
    add_sampling_arguments(p)
    add_device_arguments(p, worker=True)
    p.add_argument("--mem-budget", metavar="SIZE", help=MEM_BUDGET_HELP)
    p.add_argument("--baseline", action="store_true",
                   help="the SAR-equivalent schedule: raw input crosses, no online softmax")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    add_embedding_arguments(p)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch CPU threads per worker")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any collective or exchange may wait for a peer (default 120)")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the result as JSON to PATH")
    p.add_argument("--dataset", help="the dataset's name, recorded in checkpoints and --save "
                   "files (default: the one the partition set records); a set that records "
                   "another refuses it")
    add_checkpoint_arguments(p)


def add_worker_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("worker", help="one worker of a distributed run (under torchrun)",
                              description=__doc__.split("\n\n")[0])
    add_worker_arguments(p)
    p.set_defaults(func=worker_command)
    return p


def check_worker_args(args) -> None:
    """Every option value checked before the worker joins its group (a bad one would
    otherwise fail inside the run, or after it)."""
    check_mode_arguments(args)
    minibatch_config(args)
    check_run_options(args)
    check_backend(args.backend, parse_device(args.device))  # the GPU: when joining the group
    from ..partition.source import is_dgl_partition
    if not is_dgl_partition(args.partition):  # a DGL config is a file, read in place
        check_input_dir("--partition", args.partition)
        check_recorded_dataset(args)


def check_recorded_dataset(args) -> None:
    """``--dataset`` names what the run records; a set that records the dataset it was
    partitioned from (``sarc partition --dataset``) refuses another name. A set without
    one (partitioned from arrays, or from another tool's files) takes the name as given:
    ``sarc train --partition`` checks it against the graph before starting workers."""
    from ..datasets import same_dataset
    from ..partition import open_partition
    if not args.dataset:
        return
    recorded = open_partition(args.partition, verify=False).dataset
    if recorded is None:
        return
    same = same_dataset(recorded, args.dataset)
    if same is not None:
        args.dataset = same   # the dataset the set was partitioned from, as the set names it
    else:
        raise UsageError(f"--dataset {args.dataset}: --partition {args.partition} was "
                         f"partitioned from the dataset {recorded}; the workers train on the "
                         f"partition: leave --dataset out (the run then records {recorded}) "
                         f"or give --dataset {recorded}")


def worker_command(args) -> None:
    """``sarc worker``: the worker's run, in a process that ends with its torchrun agent."""
    from ..distributed.worker import enter

    enter(lambda: run(args))


def run(args) -> int:
    """The checked options as the worker's configuration, then its run (its exit status)."""
    from ..distributed.train import WorkerConfig
    from ..distributed.worker import run_worker
    from ..loader import load_model_file
    from ..train import hyperparameters

    check_worker_args(args)
    from ..distributed.launch import check_launchers_sarc
    check_launchers_sarc()
    cfg = WorkerConfig(partition=args.partition, exec_mode=args.exec_mode,
                       mem_budget=parse_bytes(args.mem_budget) if args.mem_budget else None,
                       baseline=args.baseline, epochs=args.epochs, seed=args.seed,
                       hparams=parse_overrides(args.overrides), log_every=args.log_every,
                       eval_every=args.eval_every, json_path=args.json, timeout_s=args.timeout, dataset=args.dataset,
                       checkpoint=checkpoint_config(args), save_path=args.save,
                       minibatch=minibatch_config(args), device=args.device,
                       backend=args.backend)
    spec = load_model_file(args.model)
    hp = hyperparameters(spec, cfg.hparams, epochs=args.epochs)  # before the group forms
    if args.mode == "sampling":
        from .train import model_layers
        minibatch_config(args, model_layers(spec, hp))
    return run_worker(spec, cfg, threads=args.threads)


def main(argv: list[str] | None = None) -> None:
    from ..distributed.worker import enter

    p = ArgumentParser(prog="python -m sarc.cli.worker",
                       description=__doc__.split("\n\n")[0])
    add_worker_arguments(p)
    args = p.parse_args(argv)
    enter(lambda: run(args))


if __name__ == "__main__":
    main()
