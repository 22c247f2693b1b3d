"""Writing a directory atomically: all of it appears at once, or none of it.

``atomic_directory(path)`` hands out a fresh temporary sibling of ``path``
(``.NAME.tmp-PID-RANDOM``, on the same file system, so a rename moves it).
When the ``with`` block ends normally, every file in it and the directory
itself are fsynced and it is renamed to ``path``, the last step; when the
block raises (or is interrupted), the temporary directory is removed and
``path`` is left as it was.

``path`` may not exist or be an empty directory (a rename replaces an empty
directory atomically). A non-empty directory is refused unless
``overwrite=True``; it is then swapped with the new one by
``renameat2(RENAME_EXCHANGE)`` (Linux), which is atomic, and the old one is
deleted. Where the exchange is unavailable (another OS, or a file system
without it), the old directory is first renamed aside and then deleted: a
crash between those two renames would leave ``path`` missing, with the old
set under ``.NAME.old-*``, never a mix.

A process killed outright (SIGKILL, power loss) cannot clean up: it leaves a
``.NAME.tmp-*`` directory, which is not ``path`` and never loads as it.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator

from ..errors import SarcError


class DirectoryExistsError(SarcError, FileExistsError):
    """The target directory exists and is not empty, and overwrite was not asked for."""


def check_target(path: Path, overwrite: bool) -> None:
    """Refuse a target that is a file, or a non-empty directory without ``overwrite``."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise DirectoryExistsError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise DirectoryExistsError(f"{path} exists and is not empty; pass overwrite=True "
                                   f"(sarc partition --overwrite) to replace it")


@contextlib.contextmanager
def atomic_directory(path, *, overwrite: bool = False) -> Iterator[Path]:
    path = Path(path)
    check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        for f in tmp.iterdir():
            _fsync(f)
        _fsync(tmp)
        _move_into_place(tmp, path, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(path.parent)


def _move_into_place(tmp: Path, path: Path, overwrite: bool) -> None:
    # Checked again: the target may have changed while the files were written.
    check_target(path, overwrite)
    if not path.exists() or not any(path.iterdir()):
        os.rename(tmp, path)
        return
    if _exchange(tmp, path):
        shutil.rmtree(tmp)  # now the old directory
        return
    old = path.parent / f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(path, old)
    os.rename(tmp, path)
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


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
