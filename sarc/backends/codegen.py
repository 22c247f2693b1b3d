"""What every code generator shares: templates, the body of one line per IR value
(``emit_values``), writing and importing modules.

Templates write names from the user's code through the filters ``literal`` (a string
literal in code) and ``shown`` (a comment or docstring), see ``sarc.names``. Generated
modules go to a private cache (``cache_dir``) under file names sarc derives
(``sarc.names.file_stem``), never the raw names.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable, Mapping, Sequence

import jinja2

from .. import names
from ..ir.function import Function, Region, Value
from ..ir.printer import format_value
from ..native.cache import cache_dir, cannot_write_cache

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
_ENV.filters.update(literal=names.literal, shown=names.shown, one_line=names.one_line)


def render(template: str, **ctx) -> str:
    return _ENV.get_template(template).render(**ctx)


RegionNames = Callable[[], list[str]]
Lower = Callable[[int, Value, list[str], RegionNames], "str | tuple[str, ...]"]
"""How a generator lowers value ``i``: ``(i, value, operand names, region names)`` -> the
expression assigned to ``v{i}``, or the lines written in its place (a tuple). Calling
the region names writes the value's regions as functions (``region_function``)."""

RegionFunction = Callable[[str, Region, int], list[str]]


def emit_values(fn: Function, indices: Iterable[int], lower: Lower, *, live_out: Iterable[int],
                region_function: RegionFunction, inputs: Mapping[int, Sequence[int]] | None = None,
                region_prefix: str = "") -> tuple[list[list[str]], list[str]]:
    """The body every generator writes for ``fn``'s values ``indices`` (in order): per value,
    its IR instruction as a comment, one line ``v{i} = ...`` (``lower``), then ``del`` of
    the values no later line reads (``live_out`` stay alive). ``inputs`` overrides the
    values a value reads (a kernel that reads a value's operand itself). Returns the
    region functions the lowering asked for (named ``{region_prefix}_v{i}_{attr}``) and
    the body's lines, unindented."""
    order = list(indices)
    reads = {i: list(fn.values[i].inputs if inputs is None else inputs[i]) for i in order}
    last: dict[int, int] = {}
    for i in order:
        for j in reads[i]:
            last[j] = i
    for j in live_out:
        last[j] = len(fn.values)
    regions: list[list[str]] = []
    body: list[str] = []
    for i in order:
        v = fn.values[i]
        made: list[str] = []

        def region_names(i=i, v=v, made=made) -> list[str]:
            if not made:
                for attr, r in v.attrs:
                    if isinstance(r, Region):
                        made.append(f"{region_prefix}_v{i}_{attr}")
                        regions.append(region_function(made[-1], r, len(v.inputs)))
            return list(made)

        body.extend(f"# {line}" for line in format_value(i, v, with_loc=True).split("\n"))
        code = lower(i, v, [f"v{j}" for j in reads[i]], region_names)
        body.extend(code if isinstance(code, tuple) else (f"v{i} = {code}",))
        dead = [f"v{j}" for j in sorted(set(reads[i])) if last.get(j) == i]
        if dead:
            body.append(f"del {', '.join(dead)}")
    return regions, body


def source_of(fn: Function) -> str:
    """The user's file the layer was traced from (for generated-file headers)."""
    for v in fn.values:
        if v.loc is not None:
            return os.path.basename(v.loc.file)
    return "<unknown>"


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:   # names in it: any locale
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_module(name: str, source: str) -> tuple[Path, ModuleType]:
    """Write ``source`` to the cache as ``name.py`` (``name`` made a safe file name) and
    import it."""
    stem = names.file_stem(name)
    path = names.inside(cache_dir(), f"{stem}.py")
    if not path.exists() or path.read_text(encoding="utf-8", errors="replace") != source:
        try:
            write_atomic(path, source)
        except OSError as e:
            raise cannot_write_cache(path, e) from None
    mod_name = f"{names.GENERATED_PACKAGE}.{stem}"
    if mod_name in sys.modules:
        return path, sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[mod_name] = module
    return path, module
