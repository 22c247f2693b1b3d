"""Records read back from disk, checked field by field against a table.

A file sarc wrote can come back hand-edited, truncated or made by someone else. Each
reader states what its record holds (``{"graph.num_nodes": "count", "types": "object?"}``:
a dotted field, the kind it must be, ``?`` where it may be absent) and checks the whole
table before reading a field, so a damaged file is refused naming the field rather than
failing wherever the field is first used.
"""
from __future__ import annotations

import io
import reprlib
from collections.abc import Callable, Mapping
from pathlib import Path


def _is_count(v) -> bool:
    return type(v) is int and v >= 0


def _is_tensor(v) -> bool:
    import torch
    return isinstance(v, torch.Tensor)


KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "json-str": (lambda v: isinstance(v, str), "a JSON object in a string"),
    "json-object": (lambda v: isinstance(v, dict), "a JSON object"),
    "count": (_is_count, "a non-negative integer"),
    "number": (lambda v: type(v) in (int, float), "a number"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "positive": (lambda v: type(v) is int and v > 0, "a positive integer"),
    "counts": (lambda v: isinstance(v, list) and all(_is_count(x) for x in v),
               "a list of non-negative integers"),
    "range": (lambda v: isinstance(v, list) and len(v) == 2 and all(_is_count(x) for x in v),
              "a [first, end) pair of node ids"),
    "sha256": (lambda v: isinstance(v, str) and len(v) == 64
               and all(c in "0123456789abcdef" for c in v), "a sha256 hex digest"),
    "tensor": (_is_tensor, "a tensor"),
    "tensors": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _is_tensor(t) for k, t in v.items()), "a dict of named tensors"),
}
"""kind -> (its check, what a value of it is, for the error)."""

_ABSENT = object()


def load_plain(source, what: str, error: type[Exception]):
    """``torch.load(source, weights_only=True)``: tensors and plain data, never code. A file
    it refuses raises ``error`` naming ``what`` and why in one line; where the file holds
    other Python objects, torch's own text goes on to say how to load it anyway (running
    its code), which sarc does not pass on."""
    import torch
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as e:
        raise error(f"{what}: {_not_saved(source) or load_problem(e)}") from None


TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")
"""How a file ``torch.save`` wrote begins: a zip archive (torch >= 1.6), or a pickle."""


def _not_saved(source) -> str | None:
    """Why ``source`` (a path, or a file's bytes) is no file ``torch.save`` wrote, from its
    first bytes (a JSON or text file's): None where it may be one."""
    if isinstance(source, io.BytesIO):
        head = source.getvalue()[:8]
    elif isinstance(source, (str, Path)):
        try:
            with open(source, "rb") as f:
                head = f.read(8)
        except OSError:
            return None
    else:
        return None
    if not head:
        return "the file is empty"
    if head.startswith(TORCH_FILE_STARTS):
        return None
    kind = "JSON" if head.lstrip()[:1] in (b"{", b"[") else "another format"
    return f"not a file torch.save wrote (it begins {head!r}: {kind})"


def load_problem(e: BaseException) -> str:
    """Why ``torch.load(..., weights_only=True)`` refused a file, in one line."""
    if "Weights only load failed" in str(e):
        return "it holds Python objects other than tensors and plain data, which sarc does not load"
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {first}"


class Record:
    """The errors of one record: ``what`` names it (``"x/metadata.json: corrupt metadata"``)
    and ``error`` is the exception class the reader raises."""

    def __init__(self, what: str, error: type[Exception]):
        self.what, self.error = what, error

    def check_value(self, value, kind: str, name: str) -> None:
        """Refuse ``value`` unless it is of ``kind``; the error names the field ``name``."""
        ok, desc = KINDS[kind]
        if not ok(value):
            raise self.error(f"{self.what}: {name} must be {desc}, got {reprlib.repr(value)}")

    def check_fields(self, record, schema: Mapping[str, str], prefix: str = "") -> None:
        """Check ``record`` against ``schema`` (dotted field -> kind), in order, so an object
        is checked before its fields; an error names ``prefix`` + the field."""
        for field, kind in schema.items():
            value = record
            for key in field.split("."):
                value = value.get(key, _ABSENT) if isinstance(value, dict) else _ABSENT
            if kind.endswith("?"):  # may be absent; where present it is of the kind (not null)
                if value is _ABSENT:
                    continue
                kind = kind[:-1]
            elif value is _ABSENT:
                raise self.error(f"{self.what}, lacks {prefix}{field}")
            self.check_value(value, kind, prefix + field)
