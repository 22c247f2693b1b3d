"""Checkpoints of a training run, and trained models saved for inference.

    DIR/checkpoint.json           the manifest: the epoch, and each rank's file with its sha256
    DIR/epoch-000010.rank-0.pt    one worker's state after epoch 10 (one file per rank)

A rank file holds plain data only (tensors, dicts, lists, numbers, strings), so
``torch.load(f, weights_only=True)`` reads it: the model's and the optimizer's state
dicts, the model selection (best epoch, its weights, the early-stopping counters),
the last epoch's loss and accuracies, and the worker's random states: torch's CPU
generator (which also seeds sarc's dropout masks: ``sarc.ir.rng`` draws each call's
seed from it and keeps no state of its own), CUDA's where CUDA is in use, Python's
``random`` and NumPy's global generator. Every worker writes its own file, since each
draws its own dropout masks. A file records the run it belongs to (``run``): the
model file's sha256, the hyperparameters, the seed, the dataset and its graph's
fingerprint, the world size and, distributed, the partition set's fingerprint;
resuming refuses a checkpoint of another run and names what differs. The number of
epochs is not part of a run: resuming with a larger ``--epochs`` trains on.

Saving is atomic twice over. Each file is written to a temporary file in DIR,
fsynced and renamed over its name (``os.replace``). A checkpoint is every rank's
file of one epoch: when all ranks have written theirs (a collective), rank 0
replaces the manifest the same way, and only then deletes older epochs' files. A
kill at any moment leaves the manifest naming a complete set, the previous one or
the new one; temporary files and unreferenced epochs left behind are removed when
the next run opens DIR (only files named exactly as sarc names them: a user's
``epoch-1.rank-0.pt`` stays).

``--save PATH`` writes the selected model (the weights of the epoch the model
selection chose) with the model file's sha256, the hyperparameters and the sizes
the model was built for; ``load_trained(PATH, MODEL.py)`` rebuilds it for inference.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import json
import os
import random
import re
import signal
import stat
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .errors import SarcError, agreed, cannot_write
from .names import system_path
from .partition.fingerprint import EDGE_DATA
from .records import Record, load_plain

FORMAT, MODEL_FORMAT, VERSION = "sarc-checkpoint", "sarc-model", 1
MANIFEST = "checkpoint.json"
KILL_ENV = "SARC_TEST_KILL_AT"
"""``RANK:EPOCH``: that worker kills itself (SIGKILL) as the epoch starts, in a run's
first attempt only (torchrun's ``TORCHELASTIC_RESTART_COUNT`` is 0 or unset): how the
tests kill a worker mid-run."""
STALL_ENV = "SARC_TEST_STALL_AT"
"""``RANK:EPOCH``: that worker stops there for good, alive (``stall_forever``), in a run's
first attempt only: how the tests hang a run."""

_RANK_FILE = re.compile(r"epoch-(\d+)\.rank-(\d+)\.pt")
_OWN_RANK_FILE = r"epoch-(\d{6}|[1-9]\d{6,})\.rank-(0|[1-9]\d*)\.pt"
_LEFTOVER = re.compile(rf"{_OWN_RANK_FILE}|\.(?:{_OWN_RANK_FILE}|checkpoint\.json)\.[a-z0-9_]{{8}}\.tmp")
"""The names sarc gives its files, exactly (``save``; ``write_atomic``'s temporary files):
all it removes from DIR, so a file of the user's that only looks like one is kept."""
_NOT_COMPARED = ("epochs", "dataset")  # a longer run is the same run; the graph is compared


class CheckpointError(SarcError):
    """A checkpoint cannot be written, read, or belongs to another run."""


@dataclass(frozen=True)
class CheckpointConfig:
    """``--checkpoint DIR [--checkpoint-every N] [--resume]``."""

    directory: str
    every: int = 10
    resume: bool = False


# --- command-line options, shared by ``sarc train`` and ``sarc worker`` --------------------

CHECKPOINT_EVERY = 10
"""Epochs between checkpoints when ``--checkpoint-every`` is not given."""


def add_checkpoint_arguments(p) -> None:
    g = p.add_argument_group("checkpoints")
    g.add_argument("--checkpoint", metavar="DIR",
                   help="save the training state (model, optimizer, random states, model "
                        "selection) in DIR every --checkpoint-every epochs and at the end")
    g.add_argument("--checkpoint-every", type=int, metavar="N",
                   help=f"epochs between checkpoints (default {CHECKPOINT_EVERY})")
    g.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint DIR (of the same model "
                        "file, hyperparameters, seed, dataset and workers); without one, "
                        "start at epoch 1")
    g.add_argument("--save", metavar="PATH",
                   help="write the selected model (best validation epoch) to PATH; "
                        "sarc.load_trained(PATH, MODEL.py) loads it for inference")


def checkpoint_config(args) -> CheckpointConfig | None:
    """The checked checkpoint options of parsed ``args`` (None without ``--checkpoint``)."""
    every = args.checkpoint_every
    if every is not None and every < 1:
        raise CheckpointError(f"--checkpoint-every must be at least 1, got {every}")
    if args.save and Path(args.save).is_dir():
        raise CheckpointError(f"--save {args.save} is a directory; name the file to write")
    if args.checkpoint == "":
        raise CheckpointError("--checkpoint names no directory (an empty path)")
    if not args.checkpoint:
        if args.resume:
            raise CheckpointError("--resume needs --checkpoint DIR (the checkpoint to continue)")
        if every is not None:  # refused, not ignored: the run would save nothing
            raise CheckpointError("--checkpoint-every needs --checkpoint DIR (where the "
                                  "checkpoints go)")
        return None
    if Path(args.checkpoint).exists() and not Path(args.checkpoint).is_dir():
        raise CheckpointError(f"--checkpoint {args.checkpoint} is not a directory")
    return CheckpointConfig(args.checkpoint, CHECKPOINT_EVERY if every is None else every,
                            args.resume)


def checkpoint_command_line(args) -> list[str]:
    """The checkpoint options of ``args`` as a worker's arguments."""
    cmd = [] if args.checkpoint_every is None else ["--checkpoint-every",
                                                    str(args.checkpoint_every)]
    if args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    if args.resume:
        cmd.append("--resume")
    if args.save:
        cmd += ["--save", args.save]
    return cmd


# --- what a run is ------------------------------------------------------------------------

def file_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def recorded_value(value: Any) -> str:
    """A hyperparameter JSON has no form for (a function, a class, an object) as a record
    keeps it: a function or class by its module and name, anything else by its repr without
    the memory address (which differs in every process, so a resume would never match)."""
    name = getattr(value, "__qualname__", None)
    module = getattr(value, "__module__", None)
    if callable(value) and isinstance(name, str) and isinstance(module, str):
        return f"<{type(value).__name__} {module}.{name}>"
    return _ADDRESS.sub("", repr(value))


def recorded_hparams(hparams: dict) -> str:
    return json.dumps(hparams, sort_keys=True, default=recorded_value)


def run_record(spec, hparams: dict, *, seed: int, dataset: str, graph: str, world_size: int = 1,
               partition: str = "", node_data: dict[str, str] | None = None,
               eval_every: int = 1, baseline: bool = False) -> dict[str, Any]:
    """What a checkpoint belongs to; ``resume`` compares all but the names. ``node_data``:
    the digests of the dataset's features, labels, splits, node types and edge data
    (``partition.fingerprint.data_digests``), so the same graph with other data is not
    taken for it; ``eval_every``: the epochs
    model selection and early stopping see."""
    if not spec.path or not Path(spec.path).is_file():
        raise CheckpointError(f"model {spec.name} has no file to record in a checkpoint")
    hp = {k: v for k, v in hparams.items() if k not in _NOT_COMPARED}
    return {"model": str(spec.path), "model_sha256": file_sha256(spec.path),
            "helpers": helper_digests(spec),
            "hparams": recorded_hparams(hp), "seed": int(seed),
            "dataset": str(dataset), "graph": graph, "world_size": int(world_size),
            "partition": partition, "node_data": dict(node_data or {}),
            "eval_every": int(eval_every), "baseline": bool(baseline)}


def helper_digests(spec) -> dict[str, str]:
    """The sha256 of each module of the model file's folder that the model imports
    (``loader.local_imports``), by its path relative to that folder."""
    from .loader import local_imports
    model = Path(spec.path).resolve()
    namespace = getattr(spec.build_model, "__globals__", {})
    return {str(f.relative_to(model.parent)): file_sha256(f)
            for f in local_imports(namespace, model.parent) if f != model}


def partition_fingerprint(pset) -> str:
    """Which nodes each rank owns: the graph, the node ranges and every part file's sha256."""
    key = json.dumps([pset.fingerprint, pset.meta["node_offsets"],
                      [p["sha256"] for p in pset.meta["parts"]]])
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _training_differences(saved: str | None, now: str | None) -> list[str]:
    """How two runs' mini-batch modes differ (``MiniBatchConfig.recorded``'s ``training``
    field; a full-batch run records none): the mode, else the options that differ."""
    def fields(text):
        return dict(re.findall(r"(\w+)=(.*?)(?=, \w+=|$)", text)) if text else {"mode": "full"}
    a, b = fields(saved), fields(now)
    if a == b:
        return []
    if a.get("mode") != b.get("mode"):
        return [f"the mode differs (--mode {a.get('mode')} in the checkpoint, --mode "
                f"{b.get('mode')} now)"]
    diff = [f"{k}: {a.get(k)} in the checkpoint, {b.get(k)} now"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return [f"the --mode {b.get('mode')} options differ ({'; '.join(diff)})"]


def run_differences(saved: dict, now: dict) -> list[str]:
    """How the run that wrote a checkpoint differs from this one, one phrase per field."""
    out = []
    if saved.get("model_sha256") != now["model_sha256"]:
        out.append(f"the model file differs (the checkpoint's is {saved.get('model')}, sha256 "
                   f"{str(saved.get('model_sha256'))[:12]}; this run's {now['model']}, sha256 "
                   f"{now['model_sha256'][:12]})")
    helpers = saved.get("helpers"), now.get("helpers")   # an older sarc recorded none
    if None not in helpers and helpers[0] != helpers[1]:
        a, b = helpers
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        out.append(f"a module the model file imports differs ({', '.join(changed)}: "
                   f"{'changed' if all(k in a and k in b for k in changed) else 'added or removed'}"
                   f" since the checkpoint)")
    if saved.get("hparams") != now["hparams"]:
        a, b = json.loads(saved.get("hparams") or "{}"), json.loads(now["hparams"])
        out += _training_differences(a.pop("training", None), b.pop("training", None))
        shown = lambda d, k: repr(d[k]) if k in d else "unset"  # noqa: E731
        diff = [f"{k}: {shown(a, k)} in the checkpoint, {shown(b, k)} now"
                for k in sorted(set(a) | set(b)) if a.get(k, KeyError) != b.get(k, KeyError)]
        if diff:
            out.append(f"hyperparameters differ ({'; '.join(diff)})")
    if saved.get("seed") != now["seed"]:
        out.append(f"the seed differs ({saved.get('seed')} in the checkpoint, {now['seed']} now)")
    if saved.get("graph") != now["graph"]:
        out.append(f"the dataset differs (the checkpoint's is {saved.get('dataset')}, graph "
                   f"{str(saved.get('graph'))[:19]}; this run's {now['dataset']}, graph "
                   f"{now['graph'][:19]})")
    else:   # what both runs recorded (a checkpoint of an older sarc, or a partition set,
        #     may record none)
        a, b = saved.get("node_data") or {}, now.get("node_data") or {}
        names = sorted(k for k in set(a) & set(b) if a[k] != b[k] and k != EDGE_DATA)
        if EDGE_DATA in a and EDGE_DATA in b:   # an edge array one record has is new
            names += sorted(k for k in set(a) ^ set(b) if k.startswith("edge:"))
        if names:
            out.append(f"the dataset differs: the same graph with other data ("
                       f"{', '.join(names)}; the checkpoint's is {saved.get('dataset')}, this "
                       f"run's {now['dataset']})")
    periods = saved.get("eval_every"), now.get("eval_every")   # an older sarc recorded none
    if None not in periods and periods[0] != periods[1]:
        out.append(f"--eval-every differs ({periods[0]} in the checkpoint, {periods[1]} now)")
    if bool(saved.get("baseline")) != bool(now.get("baseline")):   # older: none, not baseline
        out.append(f"--baseline differs ({'given' if saved.get('baseline') else 'not given'} "
                   f"in the checkpoint; its exchanges sum in another order, so a resumed run "
                   f"would not equal an uninterrupted one)")
    if saved.get("world_size") != now["world_size"]:
        out.append(f"the world size differs ({saved.get('world_size')} in the checkpoint, "
                   f"{now['world_size']} now)")
    elif saved.get("partition") != now["partition"]:
        out.append(f"the partition differs ({str(saved.get('partition'))[:19]} in the "
                   f"checkpoint, {now['partition'][:19]} now; resume on the same --partition DIR)")
    return out


# --- random states as tensors -------------------------------------------------------------

def seed_all(seed: int) -> None:
    """Seed torch's, Python's and NumPy's global generators: a run is a function of its seed
    whichever a model draws from, and so are the states a checkpoint keeps."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def rng_state() -> dict[str, Any]:
    """This process's random states, as tensors and numbers."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out = {"torch": torch.get_rng_state(),
           "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64),
                      "gauss_next": gauss},
           "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                     "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


# --- plain data, written atomically -------------------------------------------------------

_PLAIN = (str, int, float, bool, type(None))


def check_plain(obj, where: str = "checkpoint") -> None:
    """Raise TypeError unless ``obj`` is tensors, dicts, lists, tuples, numbers and strings
    only (what ``torch.load(weights_only=True)`` reads back)."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and not isinstance(obj, nn.Parameter):
            raise TypeError(f"{where}: a {type(obj).__name__} tensor subclass")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where}: a key of type {type(k).__name__}")
            check_plain(v, f"{where}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
    elif not isinstance(obj, _PLAIN):
        raise TypeError(f"{where}: a {type(obj).__name__}, not plain data")


def serialize(obj: dict) -> bytes:
    check_plain(obj)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _umask() -> int:
    """The process's umask, read without setting it where Linux says it (``os.umask``
    sets it, for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


_WRITING: set[str] = set()   # the temporary files write_atomic is writing now
_WATCHED = False             # SIGTERM mid-write removes them (remove_temporaries_on_sigterm)


def remove_temporaries_on_sigterm() -> None:
    """From now on, a SIGTERM that stops the process while ``write_atomic`` writes (a
    worker stopped by torchrun: a peer failed, or ``sarc train`` was stopped) removes the
    temporary file before the process dies by the signal, as it would have. During a write
    the signal gets a handler of its own, and the main thread writing the file (the GIL
    released) lets a thread woken by the signal's byte (``signal.set_wakeup_fd``) remove it
    at once; between writes SIGTERM ends the process as it did. Call from the main thread."""
    global _WATCHED
    if _WATCHED:
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write)   # written to only for signals with a Python handler

    def watch() -> None:
        # only while a write holds SIGTERM's handler (``writing``): another handler's signal
        # (the user's own) is its own to act on
        while signal.SIGTERM not in os.read(read, 64) or not _WRITING:
            pass
        for tmp in list(_WRITING):
            try:
                os.unlink(tmp)
            except OSError:
                pass
        ctypes.CDLL(None).signal(signal.SIGTERM, 0)   # SIG_DFL, set from any thread
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sarc-sigterm", daemon=True).start()
    _WATCHED = True
    os.register_at_fork(after_in_child=_unwatched)


def _unwatched() -> None:
    """A forked child has no watcher thread: its SIGTERM is its own (the default), and its
    writes are not watched (the pipe is its parent's)."""
    global _WATCHED
    if _WATCHED:
        _WATCHED = False
        _WRITING.clear()
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
            if signal.getsignal(signal.SIGTERM) is _held:   # forked mid-write
                signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _held(signum, frame) -> None:
    """SIGTERM's handler during a write: the watcher thread acts on the signal."""


@contextlib.contextmanager
def writing(tmp: str):
    """While ``tmp`` is being written and renamed into place: removed if SIGTERM stops the
    process meanwhile (where ``remove_temporaries_on_sigterm`` was called)."""
    guarded = _WATCHED and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _held) if guarded else None
    _WRITING.add(tmp)
    try:
        yield
    finally:
        _WRITING.discard(tmp)
        if guarded:
            signal.signal(signal.SIGTERM, previous)


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds its old content or all of ``data``, whenever the process dies. A link
    is written through: the file it names is replaced (the link stays), in that file's
    directory, which must be writable (``cli.options.check_output_file`` checks it); the
    file keeps the mode of the one it replaces, else gets the umask's, as ``open`` gives."""
    path = system_path(path)   # its folder as mkstemp's name for the temporary file has it
    if path.is_symlink():
        try:
            path = path.resolve()
        except RuntimeError as e:   # a loop (an OSError from Python 3.13)
            raise cannot_write(path, OSError(errno.ELOOP, str(e))) from None
        except OSError as e:
            raise cannot_write(path, e) from e
    try:
        st = path.stat()
    except OSError:
        mode = 0o666 & ~_umask()
    else:
        if not stat.S_ISREG(st.st_mode):   # a pipe, a device: the new file would replace it
            raise cannot_write(path, OSError(errno.EINVAL, "not a regular file"))
        mode = st.st_mode & 0o7777
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise cannot_write(path, e) from e
    try:
        with writing(tmp):
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise cannot_write(path, e) from e
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself
    finally:
        os.close(dfd)


def read_plain(path: Path, sha256: str | None = None) -> dict:
    """A file written by ``serialize``, checked against ``sha256`` where given."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read: {e.strerror or e}") from e
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(f"{path}: corrupt (its sha256 is not the one {MANIFEST} records)")
    obj = load_plain(io.BytesIO(data), f"{path}: not a sarc checkpoint file", CheckpointError)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a sarc checkpoint file")
    return obj


# --- a worker's training state ------------------------------------------------------------

def training_state(model: nn.Module, opt: torch.optim.Optimizer, selection, *, loss: float,
                   acc: dict, stopped_early: bool, elapsed_s: float) -> dict[str, Any]:
    """Everything the next epoch depends on, as plain data."""
    return {"model": model.state_dict(), "optimizer": opt.state_dict(),
            "selection": selection.state_dict(), "last": {"loss": float(loss), "acc": dict(acc)},
            "stopped_early": bool(stopped_early), "elapsed_s": float(elapsed_s),
            "rng": rng_state()}


@dataclass(frozen=True)
class Progress:
    """Where a run stands after its last saved epoch; a fresh run is at epoch 0."""

    epoch: int = 0
    stopped_early: bool = False
    elapsed_s: float = 0.0
    loss: float = float("nan")
    acc: dict = field(default_factory=dict)


_STATE_SCHEMA = {"model": "object", "optimizer": "object", "selection": "object",
                 "last": "object", "last.loss": "number", "last.acc": "object",
                 "stopped_early": "bool", "elapsed_s": "number", "rng": "object",
                 "rng.torch": "tensor", "rng.python": "object", "rng.python.version": "count",
                 "rng.python.state": "tensor", "rng.numpy": "object", "rng.numpy.kind": "str",
                 "rng.numpy.keys": "tensor", "rng.numpy.pos": "count",
                 "rng.numpy.has_gauss": "count", "rng.numpy.cached_gaussian": "number",
                 "rng.cuda": "list?"}
"""What ``training_state`` writes and ``restore_training`` reads, checked before any of it
is put back."""


def restore_training(state: dict, model: nn.Module, opt: torch.optim.Optimizer,
                     selection) -> Progress:
    """Put ``state`` (``training_state``) back, random states last; where the run stands.
    A part that does not fit (torch's load_state_dict's errors: shapes, parameter groups;
    a selection or random state of another form) is a CheckpointError naming it."""
    for part, put_back in (("model", lambda: model.load_state_dict(state["model"])),
                           ("optimizer", lambda: opt.load_state_dict(state["optimizer"])),
                           ("selection", lambda: selection.load_state_dict(state["selection"])),
                           ("random state", lambda: set_rng_state(state["rng"]))):
        try:
            put_back()
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
            built = (": what the model file builds it from changed since it was written (a "
                     "file or an environment variable it reads)" if part == "model" else "")
            raise CheckpointError(f"the checkpoint's {part} state does not fit the "
                                  f"{'model built now' if part == 'model' else 'run'} "
                                  f"({_first_reason(e)}){built}") from e
    return Progress(state["epoch"], state["stopped_early"], state["elapsed_s"],
                    state["last"]["loss"], state["last"]["acc"])


def _first_reason(e: Exception) -> str:
    """The first of a ``load_state_dict`` error's reasons (its first line only says that
    there are some), with how many more there are."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading"):
        lines = lines[1:]
    more = f"; and {len(lines) - 1} more" if len(lines) > 1 else ""
    return (lines[0].rstrip(".") if lines else type(e).__name__) + more


def injected_fault(rank: int, epoch: int | str) -> None:
    """SIGKILL this worker at ``$SARC_TEST_KILL_AT``, stall it at ``$SARC_TEST_STALL_AT``
    (``RANK:EPOCH``), first attempt only."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    here = f"{rank}:{epoch}"
    if os.environ.get(KILL_ENV) == here:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STALL_ENV) == here:
        stall_forever()


def stall_forever() -> None:
    """Sleep for good: a worker that stopped making progress, neither dead nor waiting on a
    peer (its stacks name this function)."""
    while True:
        time.sleep(3600)


def _refuse_entries_in_the_way(directory: Path) -> None:
    """A directory (or a pipe) in DIR named as a file the run writes or removes there (the
    manifest, an epoch's file) is refused before training: the first save, or the removal
    of an old epoch's files, would fail on it after the epochs were trained."""
    for f in directory.iterdir():
        if (f.name == MANIFEST or _RANK_FILE.fullmatch(f.name)
                or _LEFTOVER.fullmatch(f.name)) and (f.is_symlink() or not f.is_file()):
            raise CheckpointError(f"{f} is not a file, and a checkpoint's files are named so: "
                                  f"remove it or choose another --checkpoint DIR")


def read_manifest(cfg: CheckpointConfig, run: dict) -> dict | None:
    """The manifest in ``cfg.directory`` if there is one, checked: it may be resumed
    (``cfg.resume``) and belongs to ``run``."""
    directory = Path(cfg.directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return None
    try:
        meta = json.loads(manifest.read_text())
        meta["epoch"] = int(meta["epoch"])
        files = [{"file": str(f["file"]), "sha256": str(f["sha256"])} for f in meta["files"]]
        meta["files"] = files
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, OverflowError) as e:
        raise CheckpointError(f"{manifest}: corrupt manifest ({type(e).__name__}: {e})") from e
    for f in files:   # names this directory's own files only: never a path out of it
        if not _RANK_FILE.fullmatch(f["file"]):
            raise CheckpointError(f"{manifest}: corrupt manifest (file {f['file']!r} is not a "
                                  f"checkpoint file of this directory, epoch-N.rank-R.pt)")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{manifest}: not a sarc checkpoint of version {VERSION}")
    if not cfg.resume:
        raise CheckpointError(f"{directory} holds a checkpoint (epoch {meta['epoch']}); pass "
                              f"--resume to continue it, or remove it or choose another "
                              f"--checkpoint DIR to start over")
    saved = meta.get("run") or {}
    try:
        if not isinstance(saved, dict):
            raise TypeError(f"it is a {type(saved).__name__}, not an object")
        diff = run_differences(saved, run)
    except (ValueError, TypeError, AttributeError) as e:   # a field of another type
        raise CheckpointError(f"{manifest}: corrupt manifest (its run: {type(e).__name__}: "
                              f"{e})") from e
    if diff:
        raise CheckpointError(f"--resume: {directory} is a checkpoint of another run: "
                              + "; ".join(diff))
    return meta


def check_launch(args, partition: str, minibatch=None, dataset: str | None = None) -> None:
    """What the workers of ``sarc train --workers P`` (``args``) would refuse in the
    checkpoint directory, refused before any starts (a refused resume is not retried
    ``--max-restarts`` times). ``minibatch``: the run's ``MiniBatchConfig`` (None: full
    batch), recorded as the workers record it; ``dataset``: the name the workers record."""
    from .loader import parse_overrides
    from .loader import load_model_file
    from .partition import open_partition
    from .train import DEFAULTS

    cfg = checkpoint_config(args)
    if cfg is None:
        return
    spec = load_model_file(args.model)
    hp = {**DEFAULTS, **spec.hparams, **parse_overrides(args.overrides)}
    hp = minibatch.recorded(hp) if minibatch is not None else hp
    pset = open_partition(partition, verify=False)
    read_manifest(cfg, run_record(spec, hp, seed=args.seed, dataset=dataset or "",
                                  graph=pset.fingerprint, world_size=args.workers,
                                  partition=partition_fingerprint(pset),
                                  node_data=pset.node_digests, eval_every=args.eval_every,
                                  baseline=bool(getattr(args, "baseline", False))))


_HELD: dict[str, tuple[int, object]] = {}
"""The checkpoint directories this process holds the lock of: path -> (fd, its holder's
token)."""


def _lock_directory(owner, directory: Path) -> None:
    """Hold ``directory``'s lock (``flock`` on the directory itself: no file is added)
    while ``owner`` lives; held by another process, a CheckpointError. Two runs in one
    directory would each remove the other's epochs as leftovers, and publish a manifest of
    the other's files. The kernel drops the lock with its process, however the run ends;
    a later run of this process takes it over from an earlier one (ended, its Checkpointer
    kept alive only by a traceback)."""
    try:
        import fcntl
    except ImportError:   # not a POSIX system: no lock
        return
    key = str(directory.resolve())
    _let_go(key)
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise CheckpointError(f"{directory} is in use by another run (it holds the "
                              f"directory's lock); give each run a --checkpoint directory "
                              f"of its own") from None
    token = object()
    _HELD[key] = (fd, token)
    weakref.finalize(owner, _release, key, token)


def _let_go(key: str) -> None:
    """Close the lock this process holds on the directory ``key``, if it holds it."""
    if key in _HELD:
        os.close(_HELD.pop(key)[0])


def _release(key: str, token: object) -> None:
    """Drop the lock ``token``'s holder took, unless a later run of this process has it."""
    held = _HELD.get(key)
    if held is not None and held[1] is token:
        del _HELD[key]
        os.close(held[0])


class Checkpointer:
    """One worker's side of the checkpoints in ``cfg.directory``.

    ``gather(obj)`` collects an object from every rank (``all_gather_object``; the
    identity on one process): each load and save ends with the workers agreeing, so a
    problem on any rank stops all of them with its message.
    """

    def __init__(self, cfg: CheckpointConfig, run: dict, *, rank: int = 0, world_size: int = 1,
                 gather: Callable[[Any], list] | None = None,
                 log: Callable[[str], None] | None = print):
        self.cfg, self.run, self.rank, self.world_size = cfg, run, rank, world_size
        self.dir = Path(cfg.directory)
        self.gather = gather or (lambda obj: [obj])
        self.say = (log if rank == 0 and log else (lambda s: None))
        self.made_dir = False   # whether this run created DIR (``discard_if_unused``)

    def _agree(self, problem: str | None) -> list:
        got = self.gather(problem)
        for r, m in enumerate(got):
            if m is not None:
                raise agreed(CheckpointError(m if r == self.rank else f"worker {r}: {m}"))
        return got

    def resume(self, model: nn.Module, opt: torch.optim.Optimizer, selection) -> Progress:
        """The latest checkpoint's state put back (collective, ``load``), or a fresh start."""
        state = self.load()
        if state is None:
            return Progress()
        at, problem = None, None
        try:
            at = restore_training(state, model, opt, selection)
        except CheckpointError as e:
            problem = f"{self.dir}: {e}"
        self._agree(problem)
        return at

    def due(self, epoch: int, stopped: bool, last: int) -> bool:
        """Whether the run saves after ``epoch``: every ``--checkpoint-every``, on an early
        stop and at the last epoch."""
        return stopped or epoch % self.cfg.every == 0 or epoch == last

    def load(self) -> dict | None:
        """This worker's state of the checkpoint in DIR (collective); None to start fresh.

        Without ``resume`` a DIR that holds a checkpoint is refused (nothing would
        overwrite it unasked); with ``resume`` and no checkpoint, training starts at
        epoch 1 and says so.
        """
        state, problem = None, None
        try:
            existed = self.dir.exists()
        except OSError:
            existed = True   # the mkdir below says why
        # every worker looks before any makes it: DIR is this run's where none saw it
        self.made_dir = not any(self.gather(existed))
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if self.rank == 0:
                _lock_directory(self, self.dir)
            _refuse_entries_in_the_way(self.dir)
            state = self._read_mine()
        except (CheckpointError, OSError) as e:
            problem = str(e) if isinstance(e, CheckpointError) else f"{self.dir}: {e}"
        self._agree(problem)
        epochs = self.gather(None if state is None else state["epoch"])
        if len(set(epochs)) != 1:
            raise CheckpointError(f"{self.dir}: the workers read different checkpoints (epochs "
                                  f"{epochs}); every worker must see the same directory")
        if self.rank == 0:
            self._remove_leftovers(keep=epochs[0], say=True)
        if state is None and self.cfg.resume:
            self.say(f"--resume: no checkpoint in {self.dir}; starting at epoch 1")
        elif state is not None:
            self.say(f"resuming from {self.dir}: epoch {state['epoch']} done"
                     f"{' (stopped early)' if state['stopped_early'] else ''}")
        return state

    def discard_if_unused(self) -> None:
        """Remove DIR where this run created it and it is still empty: a run that fails
        before its first checkpoint (a layer refused at its first trace) leaves nothing
        behind. A directory the user made, or one holding a file, stays."""
        if self.rank != 0 or not self.made_dir:
            return
        _let_go(str(self.dir.resolve()))
        try:
            self.dir.rmdir()   # only an empty directory goes
        except OSError:
            pass

    def _read_mine(self) -> dict | None:
        meta = read_manifest(self.cfg, self.run)
        if meta is None:
            return None
        epoch, files = meta["epoch"], meta["files"]
        if self.rank >= len(files):
            raise CheckpointError(f"{self.dir / MANIFEST}: no file for worker {self.rank}")
        entry = files[self.rank]
        path = self.dir / entry["file"]
        state = read_plain(path, entry["sha256"])
        found = (state.get("format"), state.get("epoch"), state.get("rank"))
        if found != (FORMAT, epoch, self.rank):
            raise CheckpointError(f"{path}: not worker {self.rank}'s file of epoch {epoch}")
        Record(f"{path}: corrupt checkpoint", CheckpointError).check_fields(state, _STATE_SCHEMA)
        diff = run_differences(state.get("run", {}), self.run)
        if diff:
            raise CheckpointError(f"{path} is of another run: " + "; ".join(diff))
        return state

    def save(self, epoch: int, state: dict) -> None:
        """Write this worker's ``state`` after ``epoch``; rank 0 then publishes the set
        (collective)."""
        name = f"epoch-{epoch:06d}.rank-{self.rank}.pt"
        problem, digest = None, None
        try:
            data = serialize({"format": FORMAT, "version": VERSION, "run": self.run,
                              "epoch": epoch, "rank": self.rank, **state})
            write_atomic(self.dir / name, data)
            digest = hashlib.sha256(data).hexdigest()
        except OSError as e:
            problem = f"cannot write checkpoint {self.dir / name}: {e.strerror or e}"
        self._agree(problem)
        digests = self.gather(digest)
        problem = None
        if self.rank == 0:
            files = [{"file": f"epoch-{epoch:06d}.rank-{r}.pt", "sha256": d}
                     for r, d in enumerate(digests)]
            manifest = {"format": FORMAT, "version": VERSION, "epoch": epoch,
                        "world_size": self.world_size, "run": self.run, "files": files}
            try:
                write_atomic(self.dir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
                self._remove_leftovers(keep=epoch)
            except OSError as e:
                problem = f"cannot write checkpoint {self.dir / MANIFEST}: {e.strerror or e}"
        self._agree(problem)

    def _remove_leftovers(self, keep: int | None, say: bool = False) -> None:
        """Temporary files, and every epoch's files but ``keep``'s: after a save, the
        checkpoint it replaced; at a run's start (``say``: the epochs said), those of a
        checkpoint left unfinished, or whose manifest is gone, which no run resumes from."""
        removed = set()
        for f in self.dir.iterdir():
            m = _LEFTOVER.fullmatch(f.name)
            if m and (m.group(1) is None or int(m.group(1)) != keep):
                f.unlink(missing_ok=True)
                if m.group(1) is not None:
                    removed.add(int(m.group(1)))
        if removed and say:
            epochs = ", ".join(map(str, sorted(removed)))
            self.say(f"{self.dir}: removed the files of epoch{'s' * (len(removed) > 1)} "
                     f"{epochs}, which {MANIFEST} does not name"
                     f"{'' if keep is not None else ' (there is none)'}: a checkpoint left "
                     f"unfinished, which no run resumes from")


# --- the selected model, for inference ----------------------------------------------------

def save_model(path, state_dict: dict, *, run: dict, hparams: dict, sizes: dict,
               metrics: dict) -> None:
    """Write a trained model: its weights, and what ``load_trained`` rebuilds it from.

    ``sizes``: ``in_feats`` (0 for a featureless graph), ``num_classes``,
    ``num_nodes``, ``num_etypes`` (and ``num_ntypes`` for a graph of node types), the
    arguments ``build_model`` was called with.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, serialize({
        "format": MODEL_FORMAT, "version": VERSION, "model": run["model"],
        "model_sha256": run["model_sha256"], "dataset": run["dataset"],
        "helpers": dict(run.get("helpers", {})),
        "hparams": recorded_hparams(hparams), "sizes": dict(sizes),
        "metrics": dict(metrics), "state_dict": dict(state_dict)}))


# What a saved model holds besides its format and version, field by field (``sarc.records``;
# ``sizes``: the arguments ``build_model`` was called with, ``num_ntypes`` only for a graph
# of node types). ``read_saved`` checks them all, so a damaged or hand-made file is refused
# naming the field, not where ``load_trained`` first uses it.
_SAVED_SCHEMA = {"model": "str", "model_sha256": "sha256", "helpers": "object?", "dataset": "str",
                 "hparams": "json-str", "sizes": "object", "metrics": "object",
                 "state_dict": "tensors", "sizes.in_feats": "count",
                 "sizes.num_classes": "count", "sizes.num_nodes": "count",
                 "sizes.num_etypes": "count", "sizes.num_ntypes": "count?"}


def read_saved(path) -> dict:
    """The contents of a file ``--save`` wrote (weights and what they belong to), every
    field checked."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no saved model here")
    saved = read_plain(path)
    if saved.get("format") != MODEL_FORMAT or saved.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a model saved by sarc train --save (version {VERSION})")

    record = Record(f"{path}: corrupt saved model", CheckpointError)
    record.check_fields(saved, _SAVED_SCHEMA)
    try:
        hparams = json.loads(saved["hparams"])
    except ValueError as e:
        raise CheckpointError(f"{path}: corrupt saved model: hparams is not JSON ({e})") from e
    record.check_value(hparams, "json-object", "hparams")
    return {**saved, "hparams": hparams}


def load_trained(path, model_file, *, check_digest: bool = True) -> nn.Module:
    """The model ``sarc train --save PATH`` saved, built from ``model_file`` with its weights
    loaded, in eval mode. ``model_file`` must be the file it was trained from (its sha256
    is checked, and so are the modules of its folder it imports, ``helper_digests``;
    ``check_digest=False`` loads into an edited file's model anyway)."""
    from .datasets import Dataset
    from .loader import load_model_file
    from .train import DEFAULTS, build

    saved = read_saved(path)
    if check_digest and file_sha256(model_file) != saved["model_sha256"]:
        raise CheckpointError(f"{path} was trained from {saved['model']} (sha256 "
                              f"{saved['model_sha256'][:12]}); {model_file} differs (sha256 "
                              f"{file_sha256(model_file)[:12]}); pass check_digest=False to "
                              f"load it anyway")
    spec = load_model_file(model_file)
    helpers = saved.get("helpers")   # an older sarc recorded none
    if check_digest and helpers is not None and helpers != helper_digests(spec):
        now = helper_digests(spec)
        changed = sorted(k for k in set(helpers) | set(now) if helpers.get(k) != now.get(k))
        raise CheckpointError(f"{path} was trained with {', '.join(changed)} as it was then: "
                              f"it has changed since (a module {model_file} imports); pass "
                              f"check_digest=False to load it anyway")
    # a value JSON has no form for was recorded as a name (recorded_value): the file's own
    # value where it is the one recorded
    hp = {**DEFAULTS, **spec.hparams,
          **{k: v for k, v in saved["hparams"].items()
             if not (k in spec.hparams and isinstance(v, str)
                     and v == json.loads(recorded_hparams({k: spec.hparams[k]}))[k])}}
    s = saved["sizes"]
    empty = torch.zeros(0, dtype=torch.int64)
    shape_only = Dataset(saved["dataset"], int(s["num_nodes"]), empty, empty,
                         torch.zeros(0, int(s["in_feats"])), empty, empty.bool(), empty.bool(),
                         empty.bool(), int(s["num_classes"]),
                         etype=empty if s["num_etypes"] else None, num_etypes=int(s["num_etypes"]),
                         ntype=empty if s.get("num_ntypes") else None,
                         num_ntypes=int(s.get("num_ntypes", 0)))
    model = build(spec, shape_only, hp)
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the weights do not fit {model_file}'s model: "
                              f"{_first_reason(e)}") from e
    return model.eval()
