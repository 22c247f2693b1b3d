"""One process of a distributed training run, started by torchrun: it joins the process
group torchrun describes and trains (``run_worker``). Its command line is
``sarc.cli.worker``:

    torchrun --nproc-per-node P -m sarc.cli.worker MODEL.py --partition DIR [options]
    sarc worker MODEL.py --partition DIR [options]            (the same, as a subcommand)

It reads its place in the run from the environment torchrun sets (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so the same
entry runs on one machine (``sarc train --workers P`` starts it) or on many
(``torchrun --nnodes N --node-rank I --master-addr HOST ...`` on each). The
process group is gloo with ``--device cpu`` and NCCL with ``--device cuda``, where
each worker takes the GPU of its ``LOCAL_RANK`` (``worker_device``); every
collective has the ``--timeout``. Errors are printed as ``sarc worker R:
error: ...`` and the process exits with status 2; a timeout's is followed by the
stacks of the other workers on this machine. On SIGUSR1 a worker writes its threads'
stacks (``sarc.distributed.stacks``).

Workers that torchrun restarts after a failure (``--max-restarts K``) resume from
the latest complete checkpoint of ``--checkpoint DIR``, as if ``--resume`` had been
given.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import traceback

from ..errors import SarcError

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_worker(spec, cfg, *, threads: int | None = None) -> int:
    """One worker's run: join the group torchrun describes and train; the exit status
    (errors said as ``sarc worker R: error: ...``).

    The group is left by the process's exit (``enter``), never destroyed: destroying it
    drops the last reference to torch 2.2's ``ProcessGroupGloo``, whose destructor can
    block for good holding the GIL, where no watchdog thread can end it (a finished run
    was seen waiting for ever on such a worker). By then the run's result is written and
    every peer is past the last barrier."""
    import torch
    import torch.distributed as dist

    from .exchange import ExchangeError
    from .graph import DistError
    from .train import train_worker

    rank = _place_in_the_run()
    if threads:
        torch.set_num_threads(threads)
    cfg = dataclasses.replace(cfg, checkpoint=_resuming(cfg.checkpoint))
    device = worker_device(cfg.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    try:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout,
                                **_attempt_store(rank, timeout))
    except (RuntimeError, ValueError) as e:   # dist.DistError is a RuntimeError
        where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        raise DistError(f"could not join the run's process group at {where} (MASTER_ADDR:"
                        f"MASTER_PORT) within --timeout {cfg.timeout_s:g} s: "
                        f"{_first_line(e)}") from None
    try:
        train_worker(spec, cfg)
        # nobody closes its connections while a peer still completes the last collective
        dist.barrier()
    except SarcError as e:
        _say_error(f"sarc worker {rank}: error: {_first_line(e)}")
        if e.agreed:
            _wait_for_peers_to_say_it()
        return 2
    except (ExchangeError, dist.DistError) as e:
        # dist.DistError: what torch.distributed raises when a peer is lost or times out
        _say_peer_failure(rank, e, cfg.timeout_s)
        return 2
    except RuntimeError as e:
        if not _raised_by_torch_distributed(e):
            raise  # a bug: keep the traceback
        # gloo raises a plain RuntimeError from a collective whose peer is gone
        _say_peer_failure(rank, e, cfg.timeout_s, "a collective failed (a peer died)")
        return 2
    return 0


def _place_in_the_run() -> int:
    """This worker's rank, from the environment torchrun sets, checked: integers, a rank
    below the world size, a port number."""
    from .graph import DistError
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise DistError(f"sarc worker runs under torchrun, which sets {', '.join(ENV)} "
                        f"({', '.join(missing)} unset); to train on this machine use "
                        f"sarc train --workers P")
    values = {}
    for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        try:
            values[k] = int(os.environ[k])
        except ValueError:
            raise DistError(f"{k}={os.environ[k]!r} in the environment is not an integer "
                            f"(torchrun sets it; see its launch)") from None
    rank, world, port = values["RANK"], values["WORLD_SIZE"], values["MASTER_PORT"]
    if world < 1 or not 0 <= rank < world:
        raise DistError(f"RANK={rank} WORLD_SIZE={world} in the environment: a worker's rank "
                        f"is 0 .. WORLD_SIZE - 1 of at least one worker")
    if not 0 < port < 65536:
        raise DistError(f"MASTER_PORT={port} in the environment is not a port (1 .. 65535)")
    return rank


def worker_device(text: str):
    """This worker's ``torch.device`` for ``--device text``: cpu; for cuda, the GPU of its
    ``LOCAL_RANK`` (one per local worker); cuda:N where it is the machine's only worker."""
    import torch

    from .graph import DistError
    device = torch.device(text)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise DistError(f"--device {text}: no CUDA device on this machine "
                        f"(torch.cuda.is_available() is False); use --device cpu")
    count = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if device.index is not None:
        if local_workers > 1:
            raise DistError(f"--device {text} names one GPU, but this machine runs "
                            f"{local_workers} workers, each on a GPU of its own "
                            f"(cuda:LOCAL_RANK); give --device cuda")
        if device.index >= count:
            raise DistError(f"--device {text}: this machine has {count} CUDA device"
                            f"{'s' * (count != 1)} (cuda:0 .. cuda:{count - 1})")
        return device
    if local >= count:
        raise DistError(f"--device cuda: this worker is local worker {local} (LOCAL_RANK) but "
                        f"this machine has {count} CUDA device{'s' * (count != 1)}; start at "
                        f"most {count} workers per machine (--nproc-per-node)")
    return torch.device("cuda", local)


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


def _wait_for_peers_to_say_it() -> None:
    """After an error every worker raised at the same collective (``SarcError.agreed``),
    each has said it before any leaves: torchrun stops the others as soon as one exits,
    and a slower peer would be killed before saying its part. A peer lost meanwhile only
    ends the wait."""
    import torch.distributed as dist
    try:
        dist.barrier()
    except Exception:  # noqa: BLE001 - the error is said; a lost peer changes nothing
        pass


def _raised_by_torch_distributed(e: BaseException) -> bool:
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and f"{os.sep}torch{os.sep}distributed{os.sep}" in last


def _say_peer_failure(rank: int, e: BaseException, timeout_s: float, what: str = "") -> None:
    """A failed exchange or collective (``what`` failed), in words; a timeout says it is
    ``--timeout``'s, and is followed by where the other workers on this machine are
    (``sarc.distributed.stacks``): one of them is where the run is stuck."""
    from .stacks import ask
    from .supervise import RUN_DIR_ENV

    text = _first_line(e)
    timed_out = "timed out" in text.lower() or "timeout" in text.lower()
    if timed_out:
        text = (f"no answer from a peer within --timeout {timeout_s:g} s (it stalled or died): "
                f"{text}")
    elif what:
        text = f"{what}: {text}"
    _say_error(f"sarc worker {rank}: error: {text}")
    run_dir = os.environ.get(RUN_DIR_ENV)
    if timed_out and run_dir:
        peers = ask(run_dir, lambda name: name.startswith("worker ") and name != f"worker {rank}")
        if peers:
            _say_error(peers)


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if isinstance(e, SarcError) else text.splitlines()[0]


def run_guarded(run) -> int:
    """``run()``, with a ``SarcError`` said as ``sarc worker R: error: ...`` (status 2)."""
    try:
        return run()
    except SarcError as e:
        _say_error(f"sarc worker {os.environ.get('RANK', '?')}: error: {e}")
        return 2


def _exit(code: int) -> None:
    """Leave without Python's teardown or C++ static destructors: the process group's can
    block (see ``run_worker``), and after a gloo process group torch's teardown sometimes
    aborts ("terminate called without an active exception", after Python has finalized;
    seen with torch 2.13 under torchrun). The work is done and the output flushed by
    then, and the exit status must say so."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def enter(run) -> None:
    """The process's life: it ends with its parent (the torchrun agent), as torchrun cannot
    stop workers once it is gone (see ``sarc.distributed.supervise``), and writes its
    stacks on SIGUSR1 (``sarc.distributed.stacks``); then ``run()``."""
    import signal

    from ..checkpoint import remove_temporaries_on_sigterm
    from .stacks import dump_on_signal
    from .supervise import INTERRUPTED_EXIT, RUN_DIR_ENV, die_with_parent
    if not die_with_parent(signal.SIGKILL):
        _say_error(f"sarc worker {os.environ.get('RANK', '?')}: error: its torchrun agent is gone")
        _exit(2)
    dump_on_signal(f"worker {os.environ.get('RANK', '?')}", os.environ.get(RUN_DIR_ENV))
    remove_temporaries_on_sigterm()   # a checkpoint's, where SIGTERM stops it mid-write
    try:
        code = run_guarded(run)
    except KeyboardInterrupt:  # SIGINT to this worker alone: a line, and the shell's status
        _say_error(f"sarc worker {os.environ.get('RANK', '?')}: interrupted (SIGINT)")
        code = INTERRUPTED_EXIT
    except Exception:  # a bug: its traceback and Python's status for it, without its teardown
        traceback.print_exc()
        code = 1
    _exit(code)
