"""Names from the user's code (features, parameters, classes, submodules, dict keys) where
sarc writes them: into generated Python, and into file names.

Generated code never pastes such a name as code: it reads it as a string literal
(``literal``), and comments and docstrings show it as itself only when it is plain
printable text, else as that literal (``shown``), so no quote, backslash or line break
of a name can end a string or a comment. Generated variable names are sarc's own
(``v12``), never the user's.

A file name made from a name (``file_stem``) keeps only ``[A-Za-z0-9_.-]``, never starts
with a dot and, where anything was changed, ends with a digest of the raw name, so two
names never share a file; ``inside`` joins it to its folder and refuses a path that
would leave it.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from .errors import SarcError

GENERATED_PACKAGE = "sarc_generated"
"""The package of every generated module in ``sys.modules`` (its name a ``file_stem``):
sarc's code, not the user's (``sarc.trace_guards.code_namespaces`` leaves them out)."""


class BadNameError(SarcError):
    """A name from the user's code that sarc cannot use (not a string)."""


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(name: str) -> str:
    """``name`` with every quote, backslash and non-printable character (line breaks
    included) written as a Python escape: safe inside a comment or a string literal."""
    if not isinstance(name, str):
        raise BadNameError(f"names in a sarc layer must be strings, got {name!r} "
                         f"({type(name).__name__})")
    return "".join(_ESCAPES.get(c) or (c if c.isprintable() else repr(c)[1:-1]) for c in name)


def literal(name: str) -> str:
    """``name`` as a double-quoted Python string literal (``ast.literal_eval`` gives it back)."""
    return f'"{escaped(name)}"'


def _plain(name: str) -> bool:
    return isinstance(name, str) and name != "" and name.isprintable() \
        and not any(c in name for c in "\"'\\")


def shown(name: str) -> str:
    """``name`` for a comment or docstring of generated code: itself when it is plain
    printable text without quotes or backslashes, else its ``literal``."""
    return name if _plain(name) else literal(name)


def one_line(text: str) -> str:
    """Free text (which may hold names) for one line: of a ``#`` comment, of a report
    (``plan.txt``, ``schedule.txt``) or of the terminal. Non-printable characters (line
    breaks, terminal escapes, bidirectional controls) are written as escapes, so a name
    can neither end the line nor drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_STEM = 96


def file_stem(name: str, *, digest: bool = False) -> str:
    """A file name for ``name``: ``name`` itself when it is made of ``[A-Za-z0-9_.-]``,
    does not start with a dot and is not too long (and ``digest`` is false); else those
    characters (others become ``_``, leading dots too) plus ``-`` and a digest of ``name``."""
    if not isinstance(name, str):
        raise BadNameError(f"names in a sarc layer must be strings, got {name!r} "
                         f"({type(name).__name__})")
    safe = _UNSAFE.sub("_", name)
    safe = "_" * (len(safe) - len(safe.lstrip("."))) + safe.lstrip(".")
    if safe == name and 0 < len(name) <= _MAX_STEM and not digest:
        return name
    tag = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[:_MAX_STEM]}-{tag}"


def system_path(path) -> Path:
    """``path`` made absolute as the system resolves it: ``lnk/../x`` is ``x`` beside the
    folder the link ``lnk`` names, where ``os.path.abspath`` (and ``tempfile``) would put
    it in the current directory. Its last component is not followed (a link there stays a
    link), unless it is ``..``."""
    p = Path(path)
    if not p.is_absolute():
        p = Path(os.getcwd()) / p
    if p.name in ("", ".."):
        return Path(os.path.realpath(p))
    return Path(os.path.realpath(p.parent)) / p.name


def inside(folder: Path, relative: str) -> Path:
    """``folder / relative``, checked to stay inside ``folder`` (no absolute part, no ``..``)."""
    base = os.path.abspath(folder)
    path = os.path.abspath(os.path.join(base, relative))
    if os.path.commonpath([base, path]) != base or path == base:
        raise BadNameError(f"the file name {relative!r} would leave {folder}")
    return Path(path)
