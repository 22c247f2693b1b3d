"""``sarc train``: a model file trained on a dataset, on one process or P workers."""
from __future__ import annotations

import argparse
import sys

from ..checkpoint import add_checkpoint_arguments, checkpoint_config
from ..loader import exits_raise, parse_overrides
from ..names import one_line
from ..training.loop import score, write_result
from .options import (MEM_BUDGET_HELP, UsageError, add_check_data_argument, add_device_arguments,
                      add_embedding_arguments, add_mode_arguments, add_sampling_arguments,
                      at_least, check_device_arguments, overrides, check_input_dir,
                      check_mode_arguments, check_files_dir, check_output_file,
                      check_outputs_apart, check_run_options, minibatch_config)


def check_train_args(args):
    """Every value of ``sarc train`` checked, before any data is loaded, partitioned or
    trained on: the (spec, hyperparameters) of the run. The model file is imported here:
    ``--set`` is checked against its ``HPARAMS`` and ``build_model``."""
    from ..loader import load_model_file
    from ..train import hyperparameters

    if args.workers is None:   # a partition's runs take a worker per part, as compile plans
        args.workers = _parts(args.partition) if args.partition else 1
    at_least("--workers", args.workers, 1)
    check_mode_arguments(args)
    minibatch_config(args)  # the options alone; the fanouts against the model below
    if args.workers > 1 or args.partition:
        if args.quiet:
            why = "--workers > 1" if args.workers > 1 else f"--partition {args.partition}"
            raise UsageError(f"--quiet is not supported with {why}, a run on workers (rank 0 "
                             f"prints the epochs)")
        if args.partition and args.method:  # refused, not ignored: the set keeps its parts
            raise UsageError(f"--method {args.method}: the --partition set is partitioned "
                             f"already; --method says how --workers P partitions the dataset "
                             f"when no --partition is given")
    else:
        given = [f for f, on in (("--exec", args.exec_mode), ("--method", args.method),
                                 ("--mem-budget", args.mem_budget),
                                 ("--baseline", args.baseline),
                                 ("--max-restarts", args.max_restarts),
                                 ("--master-port", args.master_port is not None)) if on]
        if given:
            raise UsageError(f"{', '.join(given)}: distributed options; they need --workers > 1 "
                             f"(or a --partition)")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError(f"--master-port must be a TCP port (1 to 65535), got {args.master_port}")
    at_least("--max-restarts", args.max_restarts, 0)
    check_run_options(args)
    check_device_arguments(args, args.workers if args.workers > 1 or args.partition else 1)
    check_input_dir("--data-dir", args.data_dir)
    check_output_file("--save", args.save, replaced=True)
    check_files_dir("--checkpoint", args.checkpoint)
    check_outputs_apart(args)
    spec = load_model_file(args.model)
    if args.task == "link":
        from .link import check_link_args
        if args.mode != "full":
            raise UsageError(f"--task link trains full-batch; --mode {args.mode} is for node "
                             f"classification")
        check_link_args(args, spec)
    elif args.negatives:
        raise UsageError("--negatives: an option of link prediction; it needs --task link")
    hp = hyperparameters(spec, overrides(args), epochs=args.epochs)
    if args.task == "link":
        from ..training.link import check_link_hparams
        check_link_hparams(hp)
    if args.mode == "sampling":
        minibatch_config(args, model_layers(spec, hp))
    return spec, hp


def _parts(path: str) -> int:
    """The parts of the partition at ``path`` (its metadata; its files are checked when the
    run opens it)."""
    from ..partition import open_partition
    check_input_dir("--partition", path)
    return open_partition(path, verify=False).num_parts


def model_layers(spec, hp) -> int | None:
    """The sarc layers of the model ``spec`` builds with ``hp`` (on small stand-in sizes),
    or None if it does not build without the dataset (the trainer counts them then)."""
    import torch

    from ..training.minibatch import graph_layers
    try:
        with exits_raise():
            model = spec.call_builder(4, 2, num_nodes=4, num_etypes=1, **hp)
    except (Exception, SystemExit):  # the model file's code; the trainer reports its errors
        return None
    return graph_layers(model) if isinstance(model, torch.nn.Module) else None


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train", help="train a model file on a node-classification dataset",
        description="Train the model of MODEL.py (its build_model and HPARAMS) on one "
                    "process or P workers, full-batch (--mode full) or in mini-batches "
                    "(--mode mfg|sampling), and report validation-selected test accuracy.")
    p.add_argument("model", metavar="MODEL.py", help="the model file (defines build_model and HPARAMS)")
    p.add_argument("--dataset", help="dataset name (cora, aifb, citeseer, pubmed) or .npz path "
                   "(default: the model's HPARAMS['dataset'], else cora)")
    p.add_argument("--data-dir", help="directory of datasets not embedded in sarc")
    add_check_data_argument(p)
    p.add_argument("--epochs", type=int, help="most epochs (default: the model's HPARAMS)")
    p.add_argument("--task", choices=("node", "link"), default="node",
                   help="node classification (default), or link prediction on the graph's "
                        "edges: test MRR and Hits@K (a link model file, e.g. models/sage_lp.py)")
    p.add_argument("--negatives", choices=("uniform", "degree"),
                   help="--task link: the negatives' distribution, uniform or by degree^0.75 "
                        "(default: the model's HPARAMS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int,
                   help="processes: 1 trains in this process; P > 1 launches P workers through "
                        "torchrun on this machine (gloo, or NCCL with --device cuda), each on "
                        "a shard (default: 1, or one per part of --partition)")
    add_device_arguments(p)
    dist = p.add_argument_group("distributed training (--workers > 1)")
    add_mode_arguments(p, dist)
    add_sampling_arguments(p, p.add_argument_group("mini-batch training (--mode mfg|sampling)"))
    dist.add_argument("--partition", metavar="DIR",
                      help="a partition set (sarc partition) with one part per worker, or the "
                           "NAME.json of a DGL partition (read in place, with DGL); default: "
                           "partition the dataset into a temporary directory")
    dist.add_argument("--method", choices=("metis", "random"),
                      help="how to partition when no --partition is given (default metis)")
    dist.add_argument("--mem-budget", metavar="SIZE", help=MEM_BUDGET_HELP)
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
    add_embedding_arguments(p, p.add_argument_group("featureless graphs (--set embedding_dim=D)"))
    p.add_argument("--log-every", type=int, default=1, help="print every N-th epoch (default 1)")
    p.add_argument("--eval-every", type=int, default=1, metavar="N",
                   help="evaluate every N-th epoch and the last (default 1); the model "
                        "selection and early stopping see those epochs")
    p.add_argument("--quiet", action="store_true",
                   help="print only the final result (one process: not with --workers > 1)")
    p.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    p.set_defaults(func=train_command)
    return p


def train_command(args) -> int:
    from ..datasets import load_dataset
    from ..train import train

    checkpoint = checkpoint_config(args)
    spec, hp = check_train_args(args)
    if args.workers > 1 or args.partition:
        from ..distributed.launch import launch
        return launch(args, minibatch_config(args))
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    from ..distributed.supervise import Stopped, stop_on_signals
    try:   # a stop signal raises in the run, whose cleanup runs (an unused --checkpoint DIR)
        with stop_on_signals():
            data = load_dataset(args.dataset or hp["dataset"], args.data_dir,
                                check=args.check_data)
            if args.task == "link":
                from .link import link_command
                return link_command(args, spec, data)
            result = train(spec, data, epochs=args.epochs, seed=args.seed,
                           hparams=parse_overrides(args.overrides),
                           log=None if args.quiet else print, log_every=args.log_every,
                           eval_every=args.eval_every, checkpoint=checkpoint, save=args.save,
                           minibatch=minibatch_config(args), device=args.device,
                           backend=args.backend)
    except Stopped as e:
        sys.stderr.write(f"sarc train: stopped by {e}\n")
        return 128 + e.signum
    if args.quiet:
        print(f"{one_line(result['model'])} on {one_line(result['dataset'])} (seed {result['seed']}): "
              f"test acc {score(result['test_acc'])} (val {score(result['val_acc'])}, "
              f"epoch {result['best_epoch']} of {result['epochs']})")
    if args.json:
        write_result(args.json, result)
    return 0
