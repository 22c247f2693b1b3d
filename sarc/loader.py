"""Loading a user's model file: the ``build_model`` + ``HPARAMS`` convention.

A model file (``models/gcn.py`` is one) defines, next to its ``sarc.Layer``
classes:

- ``build_model(in_feats, num_classes, **hparams) -> torch.nn.Module``: the
  whole model, called as ``model(g, x)`` (plus ``etype=...`` on relational
  graphs). It receives every ``HPARAMS`` entry and the dataset facts
  ``num_nodes`` and ``num_etypes``, and ignores what it does not use
  (``**_``); a builder without ``**`` receives the keywords it names
  (``ModelSpec.call_builder``). An ``HPARAMS`` key that neither it names nor the trainer reads
  is refused (``sarc.train.check_declared``): a misspelling would train on the
  default silently.
- ``HPARAMS`` (optional): a dict of hyperparameters. The trainer reads
  ``lr``, ``weight_decay``, ``epochs``, ``patience``, ``self_loops``,
  ``norm_features``, ``embedding_dim``, ``embedding_optimizer``, ``embedding_lr`` and
  ``dataset`` (see
  ``sarc.train.DEFAULTS``); the rest is for ``build_model``.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from .errors import SarcError
from .names import one_line


class ModelFileError(SarcError):
    """A model file cannot be loaded or does not follow the convention."""


class OverrideError(SarcError):
    """A ``--set KEY=VALUE`` that is not of that form."""


@dataclass(frozen=True)
class ModelSpec:
    """What a model file provides: its builder and hyperparameters."""

    name: str
    build_model: Callable[..., Any]
    hparams: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    def builder_keywords(self) -> tuple[list[inspect.Parameter], inspect.Parameter | None] | None:
        """``build_model``'s keyword parameters after its two sizes (a ``*args`` takes the
        sizes) and its ``**`` parameter, if any; None for a callable without a signature."""
        try:
            params = list(inspect.signature(self.build_model).parameters.values())
        except (TypeError, ValueError):
            return None
        sizes = 0
        while sizes < 2 and params and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                            params[0].POSITIONAL_OR_KEYWORD):
            params, sizes = params[1:], sizes + 1
        named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        rest = next((p for p in params if p.kind is p.VAR_KEYWORD), None)
        return named, rest

    def call_builder(self, in_feats: int, num_classes: int, **keywords):
        """``build_model`` on the two sizes and ``keywords`` (the dataset's sizes, every
        hyperparameter): all of them to a builder taking ``**options``; to one without,
        the keywords it names (``build_model(in_feats, num_classes, hidden=16)`` reads
        ``hidden`` alone; the others are the trainer's)."""
        found = self.builder_keywords()
        if found is not None and found[1] is None:
            named = {p.name for p in found[0]}
            keywords = {k: v for k, v in keywords.items() if k in named}
        return self.build_model(in_feats, num_classes, **keywords)

    def hparams_at(self, key: str) -> str:
        """``file:line: `` of ``key`` in the file's ``HPARAMS`` literal, else ``file: ``."""
        where = self.path or self.name
        try:
            tree = ast.parse(Path(self.path).read_text(encoding="utf-8"))
        except (TypeError, OSError, SyntaxError, ValueError):
            return f"{where}: "
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "HPARAMS" for t in node.targets)):
                for k in node.value.keys:
                    if isinstance(k, ast.Constant) and k.value == key:
                        return f"{where}:{k.lineno}: "
        return f"{where}: "

    @staticmethod
    def from_namespace(name: str, namespace: dict[str, Any],
                       path: str | None = None) -> "ModelSpec":
        where = path or name
        build = namespace.get("build_model")
        if build is None:
            raise ModelFileError(
                f"{where}: no build_model function{_layers_hint(namespace)}. A model file must "
                f"define build_model(in_feats, num_classes, **hparams) returning the "
                f"torch.nn.Module to train, and may define a dict HPARAMS of hyperparameters")
        if not callable(build):
            raise ModelFileError(f"{where}: build_model must be a function, "
                                 f"got {type(build).__name__}")
        hparams = namespace.get("HPARAMS", {})
        if not isinstance(hparams, dict):
            raise ModelFileError(f"{where}: HPARAMS must be a dict, got {type(hparams).__name__}")
        for key in hparams:
            if not isinstance(key, str) or not key.isidentifier():
                raise ModelFileError(f"{where}: HPARAMS key {key!r} is not a string naming a "
                                     f"hyperparameter (a Python identifier, as build_model's "
                                     f"keywords and --set KEY=VALUE take)")
        # the file's name is shown in sarc train's lines and reports: escaped, as a dataset's
        return ModelSpec(one_line(name), build, dict(hparams), path)

    @staticmethod
    def from_module(module: ModuleType) -> "ModelSpec":
        path = getattr(module, "__file__", None)
        name = Path(path).stem if path else module.__name__
        return ModelSpec.from_namespace(name, vars(module), path)


def load_model_file(path: str | Path) -> ModelSpec:
    """Import the model file at ``path`` and return its ``ModelSpec``.

    The file is imported under a private module name (derived from its
    absolute path), so ``models/gcn.py`` never collides with another ``gcn``
    module; modules beside it import as from a script (its folder is searched,
    after the installed packages). Errors raised while importing it are reported
    with the user's file and line.
    """
    p = Path(path)
    if p.is_dir():
        raise ModelFileError(f"model file {path} is a directory; give the model's .py file")
    if not p.is_file():
        raise ModelFileError(f"model file {path} does not exist")
    if p.suffix != ".py":
        raise ModelFileError(f"model file {path} is not a .py file")
    resolved = p.resolve()
    # its folder's modules importable, as `python MODEL.py` makes them (a helper module
    # beside it), after every installed one, so none of those is shadowed
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    digest = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:12]
    mod_name = f"sarc_user_models.{p.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with exits_raise():
            spec.loader.exec_module(module)
    except SarcError:
        sys.modules.pop(mod_name, None)
        raise
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise ModelFileError(f"{e.filename}:{e.lineno}: syntax error: {e.msg}") from e
    except SystemExit as e:
        sys.modules.pop(mod_name, None)
        raise ModelFileError(f"{_user_frame(e, resolved)}importing {path} called "
                             f"{exit_call(e)}: a model file defines build_model and "
                             f"HPARAMS, and runs nothing when imported (put a script's code under "
                             f"if __name__ == \"__main__\":)") from e
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise ModelFileError(f"{_user_frame(e, resolved)}importing {path} failed: "
                             f"{type(e).__name__}: {e}") from e
    return ModelSpec.from_namespace(p.stem, vars(module), str(path))


def local_imports(namespace: dict[str, Any], folder: Path) -> list[Path]:
    """The files of the modules in ``folder`` (a model file's) that ``namespace`` (the
    model module's) reaches through what it imported, and what those imported: the code
    the model is made of besides its own file (a helper module of its layers)."""
    import types
    folder = folder.resolve()
    found: dict[Path, None] = {}
    todo = [namespace]
    while todo:
        for value in list(todo.pop().values()):
            name = getattr(value, "__module__", None)
            mod = value if isinstance(value, types.ModuleType) else (
                sys.modules.get(name) if isinstance(name, str) else None)
            file = getattr(mod, "__file__", None)
            if not isinstance(file, str):
                continue
            path = Path(file).resolve()
            if path in found or not path.is_relative_to(folder) or path.suffix != ".py":
                continue
            found[path] = None
            todo.append(vars(mod))
    return sorted(found)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["hidden=32", "lr=5e-3", "num_bases=None"]`` -> dict of Python literals (else
    strings). A key given twice must have one value (the last would win unseen)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        except (RecursionError, MemoryError):   # the parser's limits: 10,000 unary minuses
            raise OverrideError(f"--set {key.strip()}=...: the value ({len(text)} characters) "
                                f"nests too deeply to read as a Python literal") from None
        key = key.strip()
        if key in out and (out[key] != value or type(out[key]) is not type(value)):
            raise OverrideError(f"--set {key} given twice ({out[key]!r}, then {value!r}); give "
                                f"each setting once")
        out[key] = value
    return out


class OsExit(SystemExit):
    """``os._exit(code)``, called by the model file's code while ``exits_raise`` holds."""


@contextlib.contextmanager
def exits_raise():
    """``os._exit`` raises ``OsExit`` while the model file's code runs (its import, its
    ``build_model``): it would end the process where no ``except`` sees it, a run that
    did nothing ending with the status the user's code chose (0: success)."""
    real = os._exit

    def refused(code):
        raise OsExit(code)

    os._exit = refused
    try:
        yield
    finally:
        os._exit = real


def exit_call(e: SystemExit) -> str:
    """``sys.exit(0)`` of an exit the user's code raised: never the run's own exit status."""
    name = "os._exit" if isinstance(e, OsExit) else "sys.exit"
    return f"{name}({e.code!r})" if e.code is not None else f"{name}()"


def _layers_hint(namespace: dict[str, Any]) -> str:
    """`` (it defines layer A, B)`` for the sarc layers a file defines itself."""
    from .dsl import Layer
    layers = sorted(k for k, v in namespace.items() if isinstance(v, type) and issubclass(v, Layer)
                    and v.__module__ == namespace.get("__name__"))
    if not layers:
        return ""
    return f" (it defines layer{'s' if len(layers) > 1 else ''} {', '.join(layers)})"


def _user_frame(e: BaseException, path: Path) -> str:
    """``file:line: `` of the innermost frame of the traceback inside the user's file."""
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        if Path(frame.filename).resolve() == path:
            where = f"{frame.filename}:{frame.lineno}: "
    return where
