"""What every code generator shares: templates, liveness, writing and importing modules."""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import jinja2

from ..ir.function import Function

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
    keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)


def render(template: str, **ctx) -> str:
    return _ENV.get_template(template).render(**ctx)


def last_uses(fn: Function) -> list[int]:
    """For each value, the index of its last user (outputs count as used at the end)."""
    last = [-1] * len(fn.values)
    for i, v in enumerate(fn.values):
        for j in v.inputs:
            last[j] = i
    for _, j in fn.outputs:
        last[j] = len(fn.values)
    return last


def source_of(fn: Function) -> str:
    """The user's file the layer was traced from (for generated-file headers)."""
    for v in fn.values:
        if v.loc is not None:
            return os.path.basename(v.loc.file)
    return "<unknown>"


def cache_dir() -> Path:
    """Where generated modules are written: $SARC_CACHE_DIR or a per-user temp dir."""
    env = os.environ.get("SARC_CACHE_DIR")
    root = Path(env) if env else Path(tempfile.gettempdir()) / f"sarc-{os.getuid()}" / "kernels"
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_module(name: str, source: str) -> tuple[Path, ModuleType]:
    """Write ``source`` to the cache as ``name.py`` and import it."""
    path = cache_dir() / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        write_atomic(path, source)
    mod_name = f"sarc_generated.{name}"
    if mod_name in sys.modules:
        return path, sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[mod_name] = module
    return path, module
