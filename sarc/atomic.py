"""Writing a directory sarc owns, atomically: the whole new set appears at once, or the
old one stays. ``sarc compile --out`` and ``sarc partition --out`` both write through
``atomic_directory``.

    with atomic_directory(path, kind="compile", overwrite=False) as tmp:
        (tmp / "plan.txt").write_text(text, encoding="utf-8")

What ``path`` may be (``check_target``, which the commands also run before their work):

- missing, or an empty directory: the set is written there;
- a set sarc wrote, of the same ``kind``: replaced, with ``overwrite=True``
  (``--overwrite``) only. sarc writes ``MANIFEST`` (``sarc-set.json``) into every set,
  listing its files; a set that holds anything else (a file the user put there) is
  refused, naming it;
- anything else (a file, a symbolic link, a non-empty directory without a manifest,
  the current directory or one holding it): refused, with or without ``overwrite``.
  sarc never deletes what it did not write.

How, step by step (each step calls ``_step(name)``, a no-op the tests replace to kill
the process there):

- ``created``: a temporary sibling ``.NAME.tmp-PID-RAND`` (same file system; NAME is
  the target's name, or for a name too long for that, its start and a digest of it);
- ``written``: the ``with`` block has written the files;
- ``sealed``: the manifest is written, every file and directory fsynced;
- ``swapped``: the new set is at ``path``: renamed there (``path`` missing or empty), or
  swapped with the old set by ``renameat2(RENAME_EXCHANGE)`` (Linux), one atomic step;
- ``done``: the old set, now under the temporary name, is removed.

Where the exchange is unavailable (another OS, a file system without it) the old set is
renamed aside first (``aside``: ``.NAME.old-PID-RAND``), then the new one into place.

A process killed at any step leaves the old set at ``path`` (before ``swapped``) or the
new one (from ``swapped`` on), except in the fallback between ``aside`` and ``swapped``,
where ``path`` is missing and the old set lies whole under ``.NAME.old-*``. The next
write to ``path`` (``settle``) puts such a set back, and removes every ``.NAME.tmp-*``
and ``.NAME.old-*`` whose process is gone (a live writer's are left alone).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from .errors import SarcError, cannot_write
from .names import system_path

MANIFEST = "sarc-set.json"
FORMAT = "sarc-set"
VERSION = 1
def _bytecode_only(folder: str) -> bool:
    """Whether ``folder`` is what importing a generated module adds beside it: a
    ``__pycache__`` of plain ``.pyc`` files. Anything else in one is a file of the user's."""
    if os.path.basename(folder) != "__pycache__" or os.path.islink(folder):
        return False
    with os.scandir(folder) as entries:
        return all(e.name.endswith(".pyc") and e.is_file(follow_symlinks=False)
                   for e in entries)


class DirectoryExistsError(SarcError, FileExistsError):
    """The target cannot be written: it is a file, a folder sarc did not write, or a set
    sarc wrote that ``overwrite`` was not given for."""


def _step(name: str) -> None:
    """Called at each step of a write (see the module's docstring); tests kill here."""


# --- what a target is -----------------------------------------------------------------------

def read_manifest(path: Path) -> dict | None:
    """The manifest of the set at ``path``, or None where there is none (or it is not sarc's)."""
    try:
        meta = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT
            and isinstance(meta.get("files"), list)):
        return None
    return meta


def _files_under(path: Path) -> list[str]:
    """Every entry under ``path`` that is not a plain directory, as relative posix paths."""
    out = []
    for root, dirs, files in os.walk(path):
        rel = Path(root).relative_to(path)
        for d in list(dirs):
            if _bytecode_only(os.path.join(root, d)):
                dirs.remove(d)
            elif os.path.islink(os.path.join(root, d)):
                out.append((rel / d).as_posix())
        out.extend((rel / f).as_posix() for f in files)
    return sorted(out)


def foreign_entries(path: Path, meta: dict) -> list[str]:
    """What the set at ``path`` holds that its manifest does not list."""
    listed = set(meta["files"]) | {MANIFEST}
    return [f for f in _files_under(path) if f not in listed]


def _complete(path: Path) -> bool:
    """Whether ``path`` holds a whole set: a manifest and every file it lists."""
    meta = read_manifest(path)
    return meta is not None and all((path / f).is_file() for f in meta["files"])


def _absolute(path) -> Path:
    path = system_path(path)
    if not path.name:
        raise DirectoryExistsError(f"cannot write a set at {path}: name a directory below it")
    return path


def check_target(path, overwrite: bool, kind: str | None = None) -> None:
    """Settle what an interrupted write left at ``path`` (``settle``), then refuse a target
    sarc may not write: see the module's docstring. ``kind``, where given, is the kind of
    set about to be written; a set of another kind is not replaced."""
    path = _absolute(path)
    settle(path)
    if path.is_symlink():
        raise DirectoryExistsError(f"{path} is a symbolic link; sarc writes its sets only to "
                                   f"a real directory: choose another --out")
    if not path.exists():
        return
    if not path.is_dir():
        raise DirectoryExistsError(f"{path} exists and is not a directory; sarc never "
                                   f"replaces a file: choose another --out")
    meta = None
    if any(path.iterdir()):
        meta = read_manifest(path)
        if meta is None:
            raise DirectoryExistsError(
                f"{path} exists, is not empty and is not a set sarc wrote (it has no "
                f"{MANIFEST}); sarc replaces only its own sets, even with --overwrite: choose "
                f"another --out, or empty it yourself")
        extra = foreign_entries(path, meta)
        if extra:
            shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
            raise DirectoryExistsError(
                f"{path} is a set sarc wrote, but it also holds {shown}, which sarc did not "
                f"write; sarc does not delete them: move them out, or choose another --out")
        if kind is not None and meta.get("kind") != kind:
            raise DirectoryExistsError(
                f"{path} is a {meta.get('kind')} set sarc wrote, not a {kind} set; it is not "
                f"replaced by one: choose another --out")
    if _holds_cwd(path):
        raise DirectoryExistsError(f"{path} is the current directory or holds it; sarc writes "
                                   f"a set as a whole directory and swaps it in, so --out must "
                                   f"be a directory you are not in: choose another --out")
    if meta is not None and not overwrite:
        raise DirectoryExistsError(f"{path} exists and is not empty (a {meta.get('kind')} set "
                                   f"sarc wrote); pass --overwrite to replace it")


def _holds_cwd(path: Path) -> bool:
    try:
        cwd = Path(os.getcwd())
    except OSError:  # the current directory is gone
        return False
    real = Path(os.path.realpath(path))
    return cwd == real or real in cwd.parents


# --- what an interrupted write left -----------------------------------------------------------

# A sibling's name is ".NAME.tmp-PID-RAND" (or .old-): the bytes it adds to NAME, with a
# PID of up to 10 digits. A file name may have 255 bytes (NAME_MAX).
_NAME_MAX = 255
_SIBLING_BYTES = len("..tmp-") + 10 + len("-") + 8


def _sibling_stem(path: Path) -> str:
    """The NAME of ``path``'s temporary siblings: its name where the sibling's name fits
    in NAME_MAX, else the name's first characters, ``-`` and a digest of the whole name
    (still one NAME per ``path``, so a later run finds a dead writer's siblings)."""
    name = path.name
    raw = os.fsencode(name)
    if len(raw) + _SIBLING_BYTES <= _NAME_MAX:
        return name
    tag = "-" + hashlib.sha256(raw).hexdigest()[:16]
    room, size, keep = _NAME_MAX - _SIBLING_BYTES - len(tag), 0, 0
    for c in name:  # whole characters (a multi-byte one is kept or dropped whole)
        size += len(os.fsencode(c))
        if size > room:
            break
        keep += 1
    return name[:keep] + tag


def _sibling(path: Path, kind: str) -> Path:
    return path.parent / f".{_sibling_stem(path)}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _leftover_pattern(path: Path) -> re.Pattern:
    return re.compile(rf"\.{re.escape(_sibling_stem(path))}\.(tmp|old)-(\d+)-[0-9a-f]{{8}}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def settle(path) -> None:
    """Undo what writers of ``path`` that died left: where ``path`` is missing and a dead
    writer's old set lies whole beside it, put it back; remove the dead writers'
    temporary and old directories. A live writer's are left alone."""
    path = _absolute(path)
    if not path.parent.is_dir():
        return
    pattern = _leftover_pattern(path)
    dead: list[tuple[str, Path]] = []
    for entry in os.scandir(path.parent):
        m = pattern.fullmatch(entry.name)
        if m and not _alive(int(m.group(2))):
            dead.append((m.group(1), Path(entry.path)))
    if not os.path.lexists(path):
        olds = [p for kind, p in dead if kind == "old" and _complete(p)]
        if olds:
            best = max(olds, key=lambda p: p.stat().st_mtime)
            os.rename(best, path)
            _fsync(path.parent)
            dead = [(k, p) for k, p in dead if p != best]
    for kind, p in dead:
        if kind == "old" and not os.path.lexists(path):
            continue  # never remove the only copy of a set, whole or not
        shutil.rmtree(p, ignore_errors=True)


# --- the write ---------------------------------------------------------------------------------

@contextlib.contextmanager
def atomic_directory(path, *, kind: str, overwrite: bool = False) -> Iterator[Path]:
    """A fresh temporary directory to write a ``kind`` set into; when the block ends
    normally it becomes ``path`` (see the module's docstring); when it raises, it is
    removed and ``path`` is left as it was."""
    path = _absolute(path)
    check_target(path, overwrite, kind)
    tmp = _sibling(path, "tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise cannot_write(path, e) from e
    try:
        _step("created")
        yield tmp
        _step("written")
        _write_manifest(tmp, kind)
        _fsync_tree(tmp)
        _step("sealed")
        _move_into_place(tmp, path, kind, overwrite)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        # writing the set failed (a full disk): said as such; an OSError of what the block
        # read is the block's own
        if isinstance(e, OSError) and e.filename is not None and _under(e.filename, tmp, path):
            raise cannot_write(path, e) from e
        raise
    _fsync(path.parent)
    _step("done")


def _under(name, *dirs: Path) -> bool:
    return any(system_path(name).is_relative_to(d) for d in dirs)


def _write_manifest(tmp: Path, kind: str) -> None:
    from .version import __version__
    files = [f for f in _files_under(tmp) if f != MANIFEST]
    meta = {"format": FORMAT, "version": VERSION, "kind": kind,
            "created_by": f"sarc {__version__}", "files": files}
    (tmp / MANIFEST).write_text(json.dumps(meta, indent=1) + "\n")


def _move_into_place(tmp: Path, path: Path, kind: str, overwrite: bool) -> None:
    # Checked again: the target may have changed while the files were written.
    check_target(path, overwrite, kind)
    if not path.exists() or not any(path.iterdir()):
        os.rename(tmp, path)
        _step("swapped")
        return
    if _exchange(tmp, path):
        _step("swapped")
        shutil.rmtree(tmp)  # now the old set
        return
    old = _sibling(path, "old")
    os.rename(path, old)
    _step("aside")
    os.rename(tmp, path)
    _step("swapped")
    shutil.rmtree(old)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where that is not supported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"exchanging {a} and {b}: {os.strerror(err)}")


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            _fsync(Path(dirpath) / f)
        _fsync(Path(dirpath))


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
