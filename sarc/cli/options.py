"""What every command shares: checking option values before any work, and the options
that mean the same in every command (``--mode``, ``--exec``, ``--set``, sizes)."""
from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path

from ..errors import SarcError
from ..names import system_path
from ..planner.plan import EXEC_MODES, MODES
from ..training.progress import plural  # noqa: F401 (the commands' counts)


class UsageError(SarcError):
    """A command-line argument that cannot be honoured."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose errors (a value not among an option's choices, an unknown
    option, a missing argument, a value of the wrong type) are one line, ``PROG: error:
    ...``, with exit status 2, as sarc's own checks report them (``sarc COMMAND --help``
    shows the usage). Its subcommands' parsers are of this class too."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            name = (max(action.option_strings, key=len) if action.option_strings
                    else action.metavar or action.dest)
            raise argparse.ArgumentError(None, f"{name} must be one of "
                                               f"{', '.join(map(str, action.choices))}, "
                                               f"got {value!r}")

    def error(self, message: str):
        message = message[len("argument "):] if message.startswith("argument ") else message
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


SEED_LIMIT = 2**31
"""Seeds are 0 .. 2**31 - 1: what every seeded library here (torch, numpy, METIS) accepts."""


MAX_TIMEOUT_S = 1e9
"""The longest --timeout, in seconds (about 31 years; torch's timers overflow far beyond)."""


MEM_BUDGET_HELP = ("per worker, the most one training step keeps for its backward pass, all "
                   "layers together: each layer's share of the worker's own rows first, the "
                   "room left for remote rows kept rather than fetched again (the planner picks "
                   "oneshot, hybrid or sar per layer to fit), e.g. 512M (K, M, G, T are "
                   "binary: 512M and 512MB are 512 MiB); default: no budget "
                   "(sar in --mode full, oneshot in mfg and sampling, unless --exec says)")


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


def add_sampling_arguments(p, group=None) -> None:
    """What ``--mode mfg`` and ``--mode sampling`` train on per step (``sarc train``, the
    worker): ``--batch-size``, ``--fanouts``, ``--replace``, ``--prob``, ``--drop-last``,
    ``--no-shuffle``."""
    g = group or p
    g.add_argument("--batch-size", type=int, metavar="B",
                   help="mfg / sampling: training seeds per step over all workers (the same "
                        "steps whatever the number of workers; default: all of them, one step "
                        "per epoch)")
    g.add_argument("--fanouts", metavar="F1,F2,...",
                   help="sampling: in-edges sampled per node at each layer, input layer first "
                        "(one per sarc layer of the model; -1: all of them), e.g. 10,25")
    g.add_argument("--replace", action="store_true", help="sampling: draw with replacement")
    g.add_argument("--prob", metavar="EDGE_DATA",
                   help="sampling: edge data holding each edge's sampling weight")
    g.add_argument("--drop-last", action="store_true",
                   help="mfg / sampling: leave out the last batch when it is not full")
    g.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                   help="mfg / sampling: the seeds in node order (default: reshuffled every "
                        "epoch from the seed)")


class _SetHyperparameter(argparse.Action):
    """An option that stands for ``--set KEY=VALUE`` (appended to ``overrides``), so that it
    is checked, recorded in checkpoints and passed to the workers as ``--set`` is."""

    def __init__(self, option_strings, dest, key: str, **kw):
        super().__init__(option_strings, "overrides", default=argparse.SUPPRESS, **kw)
        self.key = key

    def __call__(self, parser, namespace, value, option_string=None):
        items = list(getattr(namespace, "overrides", None) or [])
        setattr(namespace, "overrides", items + [f"{self.key}={value!r}"])


def add_embedding_arguments(p, group=None) -> None:
    """``--embedding-optimizer`` and ``--embedding-lr``: how a featureless graph's learned
    input (``--set embedding_dim=D``) trains; they set the hyperparameters of those names."""
    from ..training.inputs import EMBEDDING_OPTIMIZERS
    g = group or p
    g.add_argument("--embedding-optimizer", action=_SetHyperparameter, key="embedding_optimizer",
                   choices=EMBEDDING_OPTIMIZERS,
                   help="the sparse optimizer of a featureless graph's learned node embedding: "
                        "sparse_adam (torch's SparseAdam, the default) or sparse_adagrad; it "
                        "updates only the rows a step read, on their owners with --workers")
    g.add_argument("--embedding-lr", action=_SetHyperparameter, key="embedding_lr", type=float,
                   metavar="LR", help="its learning rate (default: the model's lr)")


SIGNED_LISTS = ("--fanouts",)
"""Options whose value may start with a minus sign: argparse takes ``-1,-1`` (not one
number) for an option, so ``attach_values`` gives it as ``--fanouts=-1,-1``."""


def attach_values(argv: list[str]) -> list[str]:
    """``argv`` with each option of ``SIGNED_LISTS`` followed by a list of signed integers
    written as ``OPTION=VALUE``."""
    out: list[str] = []
    k = 0
    while k < len(argv):
        a = argv[k]
        if a == "--":
            return out + argv[k:]
        if a in SIGNED_LISTS and k + 1 < len(argv) and re.fullmatch(r"-\d+(,\s*-?\d+)*",
                                                                    argv[k + 1]):
            out.append(f"{a}={argv[k + 1]}")
            k += 2
            continue
        out.append(a)
        k += 1
    return out


def parse_fanouts(text: str) -> tuple[int, ...]:
    try:
        fanouts = tuple(int(f) for f in text.split(","))
    except ValueError:
        raise UsageError(f"--fanouts: cannot read {text!r}: one integer per sarc layer, input "
                         f"layer first, separated by commas (e.g. 10,25; -1 takes every "
                         f"in-edge)") from None
    for f in fanouts:
        if f < -1:
            raise UsageError(f"--fanouts {text}: {f} is not a fanout (a number of neighbours "
                             f">= 0, or -1 for all of them)")
    return fanouts


def minibatch_config(args, layers: int | None = None):
    """``--mode`` and the sampling options as a ``sarc.training.minibatch.MiniBatchConfig``
    (None for ``--mode full``), checked; ``layers``: the model's sarc layers, which the
    fanouts must match (None: not known here)."""
    from ..training.minibatch import MiniBatchConfig
    given = [f for f, on in (("--fanouts", args.fanouts is not None),
                             ("--batch-size", args.batch_size is not None),
                             ("--replace", args.replace), ("--prob", args.prob is not None),
                             ("--drop-last", args.drop_last), ("--no-shuffle", not args.shuffle))
             if on]
    if args.mode == "full":
        if given:
            raise UsageError(f"{', '.join(given)}: mini-batch options; they need --mode "
                             f"sampling (or --mode mfg); --mode full trains on every node "
                             f"every step")
        return None
    at_least("--batch-size", args.batch_size, 1)
    if args.mode == "mfg":
        wrong = [f for f in given if f in ("--fanouts", "--replace", "--prob")]
        if wrong:
            raise UsageError(f"{', '.join(wrong)}: --mode mfg takes every in-edge at every "
                             f"layer; sampling options need --mode sampling")
        return MiniBatchConfig("mfg", batch_size=args.batch_size, shuffle=args.shuffle,
                               drop_last=args.drop_last)
    if args.fanouts is None:
        raise UsageError("--mode sampling needs --fanouts, one per sarc layer of the model, "
                         "input layer first (e.g. --fanouts 10,25)")
    fanouts = parse_fanouts(args.fanouts)
    if layers is not None and len(fanouts) != layers:
        raise UsageError(f"--fanouts {args.fanouts}: {len(fanouts)} fanout"
                         f"{'s' * (len(fanouts) != 1)} for a model of {layers} sarc layer"
                         f"{'s' * (layers != 1)}; give one per layer, input layer first")
    if args.prob is not None and not args.prob:
        raise UsageError("--prob needs the name of edge data")
    return MiniBatchConfig("sampling", fanouts, batch_size=args.batch_size, replace=args.replace,
                           prob=args.prob, shuffle=args.shuffle, drop_last=args.drop_last)


def overrides(args) -> dict:
    """``--set KEY=VALUE``s as a dict (``loader.parse_overrides``), a ``dataset`` among them
    agreeing with ``--dataset``."""
    from ..loader import parse_overrides
    out = parse_overrides(args.overrides)
    given = getattr(args, "dataset", None)
    if given is not None and out.get("dataset", given) != given:
        raise UsageError(f"--dataset {args.dataset} and --set dataset={out['dataset']!r} "
                         f"disagree; give the dataset once")
    return out


def check_seed(option: str, value: int | None) -> None:
    if value is not None and not 0 <= value < SEED_LIMIT:
        raise UsageError(f"{option} must be in 0 .. 2**31 - 1, got {value}")


def check_timeout(option: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise UsageError(f"{option} must be a number of seconds > 0 and at most "
                         f"{MAX_TIMEOUT_S:g}, got {seconds}")


INPUT_PATHS = {"model": "MODEL.py", "dataset": "--dataset", "data_dir": "--data-dir",
               "partition": "--partition", "graph": "--graph", "from_dgl": "--from-dgl",
               "from_pyg": "--from-pyg"}
"""The options (by ``args`` name) that name a file or directory a command reads."""


def check_no_empty_inputs(args) -> None:
    """An empty input path is an error, as an empty output path is: an unset shell variable
    (``--dataset "$DATA"``) would otherwise read as the option not given (the model's
    dataset, one process instead of a partition's workers)."""
    for dest, option in INPUT_PATHS.items():
        if getattr(args, dest, None) == "":
            raise UsageError(f"{option} names nothing (an empty path)")


def check_input_dir(option: str, path: str | None) -> None:
    """``path`` (if given) is an existing directory."""
    if path is not None and not Path(path).is_dir():
        raise UsageError(f"{option} {path} " + ("is not a directory" if Path(path).exists()
                                                 else "does not exist"))


def check_output_file(option: str, path: str | None, *, replaced: bool = False) -> None:
    """A file can be written at ``path`` (if given): its directory exists and is writable.
    ``replaced``: the file is written beside the path and replaces it
    (``checkpoint.write_atomic``), so the path must not be a pipe or a device, which a
    report is written into in place."""
    if path is None:
        return
    if not path:   # an unset shell variable: `--json "$OUT"`
        raise UsageError(f"{option} names no file (an empty path)")
    p = Path(path)
    if p.is_dir() or path.endswith(os.sep):   # Path drops the slash: results/ wrote "results"
        raise UsageError(f"{option} {path} is a directory; give the path of a file")
    if replaced and (p.is_fifo() or p.is_char_device() or p.is_block_device()
                     or p.is_socket()):   # through links: /dev/stdout is one to a pipe
        raise UsageError(f"{option} {path} is not a regular file (a pipe or a device): the "
                         f"file is written beside it and then replaces it; give the path of "
                         f"a regular file")
    if p.exists() and not p.is_file():   # /dev/stdout, a pipe: written in place, not beside
        # (through its link: /dev/stdout's target, pipe:[N], names no file of /proc/PID/fd)
        if not os.access(p, os.W_OK):
            raise UsageError(f"{option} {path} exists and is not writable")
        return
    if p.is_symlink():   # written beside the file the link names (checkpoint.write_atomic)
        try:
            p = p.resolve()
        except (RuntimeError, OSError) as e:   # a loop
            raise UsageError(f"{option} {path} is a link that names no file ({e})") from None
    where = p.absolute().parent
    if not where.exists():
        raise UsageError(f"{option} {path}: the directory {where} does not exist")
    _writable_dir(option, path, where)
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{option} {path} exists and is not writable")


def check_outputs_apart(args) -> None:
    """``--json`` and ``--save`` name files of their own: not the model file or the dataset
    file the run reads, not each other, and not inside the ``--checkpoint`` or
    ``--partition`` directory the run reads or writes itself (a report written over the
    model file, or over the checkpoint's manifest, is data lost)."""
    def key(path) -> Path:
        return Path(path).expanduser().resolve()

    outputs = [(o, getattr(args, a, None)) for o, a in (("--json", "json"), ("--save", "save"))]
    outputs = [(o, p) for o, p in outputs if p]
    files = [("the model file", getattr(args, "model", None))]
    dataset = getattr(args, "dataset", None)
    if dataset and Path(dataset).is_file():
        files.append(("the --dataset file", dataset))
    files += outputs
    dirs = []
    for o, a in (("--checkpoint", "checkpoint"), ("--partition", "partition")):
        d = getattr(args, a, None)
        if d:   # a DGL partition is given by its JSON file: the run reads its directory
            dirs.append((f"the {o} directory", Path(d).parent if Path(d).is_file() else d))
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint:   # its files go into a directory of its own
        target = key(checkpoint)
        for what, d in (x for x in dirs if x[0] != "the --checkpoint directory"):
            if target == key(d) or key(d) in target.parents:
                raise UsageError(f"--checkpoint {checkpoint} is inside {what} ({d}), which "
                                 f"the run reads; give the checkpoint a directory of its own")
        _refuse_inside_a_set("--checkpoint", checkpoint, (target, *target.parents),
                             "give the checkpoint a directory of its own")
    for option, path in outputs:
        target = key(path)
        _refuse_inside_a_set(option, path, target.parents, "give the result a file outside it")
        for what, other in files:
            if other and what != option and key(other) == target:
                raise UsageError(f"{option} {path} is {what}; give the result a file of its own")
        for what, d in dirs:
            if target == key(d) or key(d) in target.parents:
                raise UsageError(f"{option} {path} is inside {what} ({d}), which the run "
                                 f"reads or writes itself; give the result a file outside it")


def _refuse_inside_a_set(option: str, path, dirs, what_to_do: str) -> None:
    """``option path`` refused where one of ``dirs`` (its resolved directories) is a set sarc
    wrote: a partition or a compiled model, which only sarc rewrites whole."""
    from ..atomic import MANIFEST
    for d in dirs:
        if (d / MANIFEST).is_file():
            raise UsageError(f"{option} {path} is inside a set sarc wrote ({d}: a partition or "
                             f"a compiled model, which only sarc rewrites whole); {what_to_do}")


def check_output_dir(option: str, path: str | None) -> None:
    """A directory can be written at ``path`` (if given): it is one or can be made, in a
    writable place (the directory is written beside itself, then renamed into place)."""
    if path is None:
        return
    if not path:   # an unset shell variable: `--out "$OUT"`
        raise UsageError(f"{option} names no directory (an empty path)")
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {path} exists and is not a directory")
    where = p.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    _writable_dir(option, path, where)


def check_files_dir(option: str, path: str | None) -> None:
    """A directory sarc writes files into (``--checkpoint``): where it exists, a writable
    directory; else one that can be made in a writable place (``check_output_dir``).
    Refused before the run trains, not at its first save."""
    if path and Path(path).is_dir():
        try:   # a file made and dropped: permissions, a read-only mount, an immutable flag
            tempfile.TemporaryFile(dir=system_path(path)).close()
        except OSError as e:
            raise UsageError(f"{option} {path}: the directory is not writable "
                             f"({e.strerror or e})") from None
        return
    check_output_dir(option, path)


def _writable_dir(option: str, path: str, where: Path) -> None:
    if not where.is_dir():
        raise UsageError(f"{option} {path}: {where} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the directory {where} is not writable")
    try:   # as root os.access says yes to /proc: a file made and removed says it for sure
        # in the folder as the system resolves it (mkstemp's name collapses lnk/.. as text)
        fd, probe = tempfile.mkstemp(dir=system_path(where), prefix=".sarc-", suffix=".probe")
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create a file in {where} "
                         f"({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def add_check_data_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-check-data", dest="check_data", action="store_false",
                   help="skip the scans of the dataset's feature values (NaN, Inf) and edge "
                        "ids (in range), for speed on a dataset known to be sound; its "
                        "arrays' presence, types and shapes are still checked")


_SIZE = re.compile(r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1000000' -> bytes; anything else (negative, inf, nan, words)
    is a ``UsageError`` naming --mem-budget."""
    m = _SIZE.fullmatch(text.strip())
    size = float(m[1]) * _UNITS[m[2].upper()] if m else math.nan
    if not math.isfinite(size) or size >= 2**63:
        raise UsageError(f"--mem-budget: cannot read {text!r} as a size: a number of bytes "
                           f">= 0, with K, M, G or T for KiB .. TiB (e.g. 512M, 2G)")
    return int(size)


def check_run_options(args) -> None:
    """The options ``sarc train`` and its workers share: counts, seed, timeout, memory
    budget, the result file's folder."""
    at_least("--epochs", args.epochs, 1)
    at_least("--log-every", args.log_every, 1)
    at_least("--eval-every", args.eval_every, 1)
    at_least("--threads", args.threads, 1)
    check_seed("--seed", args.seed)
    check_timeout("--timeout", args.timeout)
    if args.mem_budget is not None:
        parse_bytes(args.mem_budget)
    check_output_file("--json", args.json)


def add_device_arguments(p, group=None, worker: bool = False) -> None:
    """``--device cpu|cuda|cuda:N`` (where the model, its inputs and the shards live) and
    ``--backend torch|triton`` (the kernels every sarc layer is compiled to), for ``sarc
    train`` and its workers (``worker``: the help of one worker under torchrun) alike."""
    from ..compiler import BACKENDS
    g = group or p
    if worker:
        device_help = ("where this worker trains: cpu (default), or cuda: the GPU of its "
                       "LOCAL_RANK (cuda:LOCAL_RANK, with NCCL), a GPU per worker of the "
                       "machine; cuda:N only where it is the machine's only worker")
    else:
        device_help = ("where to train: cpu (default), cuda (a worker of --workers P takes "
                       "cuda:LOCAL_RANK, with NCCL) or cuda:N (one process)")
    g.add_argument("--device", default="cpu", help=device_help)
    g.add_argument("--backend", choices=BACKENDS, default=None,
                   help="the kernels of every sarc layer: torch or triton (a GPU, or Triton's "
                        "interpreter on the CPU under TRITON_INTERPRET=1); default: each "
                        "layer's own (its backend=, torch unless it says)")


_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")


def parse_device(text: str):
    """``--device``'s value as a ``torch.device``: cpu, cuda or cuda:N (not checked against
    this machine: ``check_device``)."""
    import torch
    m = _DEVICE.fullmatch(text.strip())
    if m is None or (m[1] == "cpu" and m[2] is not None):
        raise UsageError(f"--device {text}: not a device sarc trains on; give cpu, cuda or "
                         f"cuda:N (N: the index of a GPU)")
    return torch.device(m[1], int(m[2]) if m[2] is not None else None)


def check_device(text: str, processes: int = 1):
    """``--device`` parsed and present on this machine for ``processes`` local processes
    (each worker takes a GPU of its own); the ``torch.device``."""
    import torch
    device = parse_device(text)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = ("this torch build has no CUDA" if torch.version.cuda is None
               else "torch.cuda.is_available() is False: no GPU or driver visible")
        raise UsageError(f"--device {text}: no CUDA device ({why}; torch {torch.__version__}); "
                         f"train on the CPU with --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and processes > 1:
        raise UsageError(f"--device {text} names one GPU, but {processes} workers each take a "
                         f"GPU of their own (cuda:LOCAL_RANK); give --device cuda")
    wanted = processes if device.index is None else device.index + 1
    if wanted > count:
        what = (f"{processes} workers need {processes} GPUs" if device.index is None
                else f"there is no GPU {device.index}")
        raise UsageError(f"--device {text}: {what}; this machine has {count} CUDA device"
                         f"{'s' * (count != 1)} (cuda:0 .. cuda:{count - 1})")
    return device


def check_backend(backend: str | None, device) -> None:
    """``--backend triton`` needs a GPU, or Triton's interpreter on the CPU, and Triton."""
    if backend != "triton":
        return
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "") in ("", "0"):
        raise UsageError("--backend triton on the CPU: Triton's kernels run on a GPU (--device "
                         "cuda), or in Triton's interpreter on the CPU, slowly, with "
                         "TRITON_INTERPRET=1 in the environment (TRITON_INTERPRET=1 sarc train "
                         "... --backend triton)")
    from ..backends.triton_backend import TritonUnavailable, check_triton
    try:
        check_triton()
    except TritonUnavailable as e:
        raise UsageError(f"--backend triton: {e}") from None


def check_device_arguments(args, processes: int = 1):
    """``--device`` and ``--backend`` checked before any work; the ``torch.device``."""
    device = check_device(args.device, processes)
    check_backend(args.backend, device)
    return device
