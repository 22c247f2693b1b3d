"""The worker entry point: one process of a distributed training run, started by torchrun.

    torchrun --nproc-per-node P -m sarc.distributed.worker MODEL.py --partition DIR [options]
    sarc worker MODEL.py --partition DIR [options]            (the same, as a subcommand)

It reads its place in the run from the environment torchrun sets (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so the same
entry runs on one machine (``sarc train --workers P`` starts it) or on many
(``torchrun --nnodes N --node-rank I --master-addr HOST ...`` on each). The
process group is gloo on the CPU, NCCL when CUDA is present, and every
collective has the ``--timeout``. Errors are printed as ``sarc worker R:
error: ...`` and the process exits with status 2.

With ``--checkpoint DIR`` (a directory every worker reads and writes at the same
path) each worker saves its state there (``sarc.checkpoint``); workers that
torchrun restarts after a failure (``--max-restarts K``) resume from the latest
complete checkpoint, as if ``--resume`` had been given.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

from ..checkpoint import add_checkpoint_arguments
from ..errors import SarcError

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    from ..cli import add_mode_arguments

    p.add_argument("model", metavar="MODEL.py", help="the model file (build_model, HPARAMS)")
    p.add_argument("--partition", required=True, help="the partition set (sarc partition)")
    add_mode_arguments(p)
    p.add_argument("--mem-budget", help="memory per worker for kept remote rows, e.g. 512M")
    p.add_argument("--baseline", action="store_true",
                   help="the SAR-equivalent schedule: raw input crosses, no online softmax")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch CPU threads per worker")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any collective or exchange may wait for a peer (default 120)")
    p.add_argument("--json", metavar="PATH", help="rank 0 writes the result as JSON to PATH")
    p.add_argument("--dataset", help="the dataset's name, recorded in checkpoints and --save files")
    add_checkpoint_arguments(p)


def add_worker_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("worker", help="one worker of a distributed run (under torchrun)",
                              description=__doc__.split("\n\n")[0])
    add_worker_arguments(p)
    p.set_defaults(func=_enter)
    return p


def check_worker_args(args) -> None:
    """Every option value checked before the worker joins its group (a bad one would
    otherwise fail inside the run, or after it)."""
    from ..artifacts import parse_bytes
    from ..cli import (UsageError, at_least, check_input_dir, check_mode_arguments,
                       check_output_file, check_seed, check_timeout)

    check_mode_arguments(args)
    if args.mode != "full":
        raise UsageError(f"--mode {args.mode}: the worker trains full-batch (--mode full)")
    at_least("--epochs", args.epochs, 1)
    at_least("--log-every", args.log_every, 1)
    at_least("--threads", args.threads, 1)
    check_seed("--seed", args.seed)
    check_timeout("--timeout", args.timeout)
    if args.mem_budget is not None:
        parse_bytes(args.mem_budget)
    check_input_dir("--partition", args.partition)
    check_output_file("--json", args.json)


def worker_command(args) -> int:
    import torch
    import torch.distributed as dist

    from ..artifacts import parse_bytes
    from ..checkpoint import checkpoint_config
    from ..cli import parse_overrides
    from ..loader import load_model_file
    from ..train import hyperparameters
    from .exchange import ExchangeError
    from .graph import DistError
    from .train import WorkerConfig, train_worker

    check_worker_args(args)
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise DistError(f"sarc worker runs under torchrun, which sets {', '.join(ENV)} "
                        f"({', '.join(missing)} unset); to train on this machine use "
                        f"sarc train --workers P")
    rank = int(os.environ["RANK"])
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = WorkerConfig(partition=args.partition, exec_mode=args.exec_mode,
                       mem_budget=parse_bytes(args.mem_budget) if args.mem_budget else None,
                       baseline=args.baseline, epochs=args.epochs, seed=args.seed,
                       hparams=parse_overrides(args.overrides), log_every=args.log_every,
                       json_path=args.json, timeout_s=args.timeout, dataset=args.dataset,
                       checkpoint=_resuming(checkpoint_config(args)), save_path=args.save)
    spec = load_model_file(args.model)
    hyperparameters(spec, cfg.hparams, epochs=args.epochs)  # before the group forms
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout,
                            **_attempt_store(rank, timeout))
    try:
        train_worker(spec, cfg)
        # nobody closes its connections while a peer still completes the last collective
        dist.barrier()
    except SarcError as e:
        _say_error(f"sarc worker {rank}: error: {_first_line(e)}")
        return 2
    except (ExchangeError, dist.DistError) as e:
        # dist.DistError: what torch.distributed raises when a peer is lost or times out
        _say_error(f"sarc worker {rank}: error: {_peer_failure(e, args.timeout)}")
        return 2
    except RuntimeError as e:
        if not _raised_by_torch_distributed(e):
            raise  # a bug: keep the traceback
        # gloo raises a plain RuntimeError from a collective whose peer is gone
        _say_error(f"sarc worker {rank}: error: "
                   f"{_peer_failure(e, args.timeout, 'a collective failed (a peer died)')}")
        return 2
    finally:
        dist.destroy_process_group()
    return 0


def _attempt_store(rank: int, timeout: datetime.timedelta) -> dict:
    """``init_process_group``'s store, when torchrun's agent hosts it: keys under this
    attempt's prefix. Across restarts the static rendezvous keeps one store, and without a
    prefix a restarted worker may read the address a dead worker of the previous attempt
    published, and fail to connect."""
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}  # no agent: rank 0 starts a fresh store
    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          False, timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"sarc/attempt-{attempt}", store), "rank": rank,
            "world_size": world}


def _resuming(cfg):
    """Workers torchrun restarted after a failure (``--max-restarts``) resume from the
    run's latest checkpoint, if it has written one."""
    if cfg is not None and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return dataclasses.replace(cfg, resume=True)
    return cfg


def _say_error(text: str) -> None:
    sys.stderr.write(text + "\n")  # one write: workers share the terminal
    sys.stderr.flush()


def _raised_by_torch_distributed(e: BaseException) -> bool:
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and f"{os.sep}torch{os.sep}distributed{os.sep}" in last


def _peer_failure(e: BaseException, timeout_s: float, what: str = "") -> str:
    """A failed exchange or collective (``what`` failed), in words; a timeout says it is
    ``--timeout``'s."""
    text = _first_line(e)
    if "timed out" in text.lower() or "timeout" in text.lower():
        return f"no answer from a peer within --timeout {timeout_s:g} s (it stalled or died): {text}"
    return f"{what}: {text}" if what else text


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, SarcError) else text.splitlines()[0]


def _run(args) -> int:
    try:
        return worker_command(args)
    except SarcError as e:
        _say_error(f"sarc worker {os.environ.get('RANK', '?')}: error: {e}")
        return 2


def _exit(code: int) -> None:
    """Leave without running C++ static destructors: after a gloo process group, torch's
    teardown sometimes aborts ("terminate called without an active exception", after Python
    has finalized; seen with torch 2.13 under torchrun). The work is done and the output
    flushed by then, and the exit status must say so."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _enter(args) -> None:
    """The process's life: it ends with its parent (the torchrun agent), as torchrun cannot
    stop workers once it is gone (see ``sarc.distributed.supervise``)."""
    import signal

    from .supervise import die_with_parent
    if not die_with_parent(signal.SIGKILL):
        _say_error(f"sarc worker {os.environ.get('RANK', '?')}: error: its torchrun agent is gone")
        _exit(2)
    _exit(_run(args))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sarc.distributed.worker", description=__doc__.split("\n\n")[0])
    add_worker_arguments(p)
    _enter(p.parse_args(argv))


if __name__ == "__main__":
    main()
