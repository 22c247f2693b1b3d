"""sarc's private cache directory: where generated modules and the compiled CPU kernels
are written and loaded from, and the checks that keep it this user's alone."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import SarcError
from ..names import system_path


class CacheDirError(SarcError):
    """The module cache directory is not private to this user."""


def cannot_write_cache(path: Path, e: OSError) -> CacheDirError:
    """The error of a file of the module cache that cannot be written (a read-only cache
    directory: a mount, a chmod, /proc), naming the file and what to set."""
    return CacheDirError(f"the module cache cannot be written ({path}: {e.strerror or e}); "
                         f"set SARC_CACHE_DIR to a directory of your own that you can write")


def cache_dir() -> Path:
    """Where generated modules are written and imported from: ``$SARC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sarc/kernels`` (``~/.cache/sarc/kernels``).

    sarc imports what it finds there, so the directory must be this user's alone: each
    level sarc creates is made with mode 0700, and a cache directory owned by another
    user, or writable by group or others, is refused (``CacheDirError``), as is one
    inside a folder where another user could swap it (owned by someone other than this
    user or root, or writable by all without the sticky bit, as /tmp has).
    """
    env = os.environ.get("SARC_CACHE_DIR")
    if env:   # as the system resolves it: the folder checked is the one imported from
        root = owned = system_path(Path(env).expanduser())
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg and os.path.isabs(xdg):
            base = Path(xdg)
        else:
            try:
                base = Path.home() / ".cache"
            except RuntimeError:
                raise CacheDirError("no home directory for the module cache: set "
                                    "SARC_CACHE_DIR (or XDG_CACHE_HOME)") from None
        root, owned = base / "sarc" / "kernels", base / "sarc"
    _make_private(root)
    for level in (owned, root) if owned != root else (root,):
        _check_private(level)
    _check_ancestors(owned)
    return root


def _make_private(path: Path) -> None:
    """Create ``path`` and its missing parents, each with mode 0700."""
    missing = []
    p = path.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass
        except OSError as e:   # a read-only parent, /proc, a file in the way
            raise CacheDirError(f"the module cache {path} cannot be created ({p}: "
                                f"{e.strerror or e}); set SARC_CACHE_DIR to a directory of "
                                f"your own") from None


def _check_private(path: Path) -> None:
    st = os.stat(path)
    fix = f"remove it, or make it yours alone (chown {os.getuid()} {path}; chmod 700 {path})"
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"the module cache {path} is not a directory; {fix}, or set "
                            f"SARC_CACHE_DIR to another directory")
    if st.st_uid != os.getuid():
        raise CacheDirError(f"the module cache {path} is owned by uid {st.st_uid}, not by "
                            f"you (uid {os.getuid()}); sarc imports code from it, so it "
                            f"refuses it: {fix}, or set SARC_CACHE_DIR to a directory of "
                            f"your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheDirError(f"the module cache {path} is writable by group or others "
                            f"(mode {stat.S_IMODE(st.st_mode):o}); sarc imports code from it, "
                            f"so it refuses it: chmod 700 {path}, or set SARC_CACHE_DIR to "
                            f"a private directory")


def _check_ancestors(path: Path) -> None:
    for folder in Path(os.path.realpath(path)).parents:
        st = os.stat(folder)
        if st.st_uid not in (os.getuid(), 0):
            raise CacheDirError(f"the module cache {path} is inside {folder}, which uid "
                                f"{st.st_uid} owns and could swap it; sarc imports code from "
                                f"the cache: set SARC_CACHE_DIR to a directory of your own")
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise CacheDirError(f"the module cache {path} is inside {folder}, which every "
                                f"user may write to (mode {stat.S_IMODE(st.st_mode):o}, no "
                                f"sticky bit) and so swap the cache; sarc imports code from "
                                f"the cache: set SARC_CACHE_DIR to a private directory")
