"""What a compiled layer was traced from besides its parameters' values: the key that says
when its kernel must be traced and compiled again.

Tracing reads a layer's state in three ways:

- parameters and floating-point buffers are PARAM leaves: their values are the kernel's
  inputs at each call, so only their names, shapes and dtypes are traced;
- Python numbers, strings and flags on the layer and its submodules (``self.alpha``,
  ``self.heads``; numpy's numbers too), on their classes (``self.SCALE`` a class
  attribute), in configuration objects they hold (``self.cfg.alpha``) and among the
  globals of the modules defining them (``TEMP`` read in ``message``) are read as
  constants or steer the trace;
- other tensors that are neither (an integer buffer, a 0-d tensor attribute), and a
  floating-point buffer the layer's code uses as a Python number (``math.sqrt(self.tau)``),
  are read as constants.

``state_key`` covers the last two and the first's shapes: a kernel compiled at one key is
valid while the key is the same, so a layer whose ``alpha`` is annealed, or whose integer
buffer is updated in place (its version counter moves), or whose parameter is replaced
by one of another shape, is traced again, never run on a stale constant. Reading it costs
no device synchronization: tensors are keyed by identity and version, not by value (the
key holds them, so a freed tensor's id is never taken for a new one's).
"""
from __future__ import annotations

import argparse
import dataclasses
import dis
import enum
import functools
import numbers
import sys
import types
from typing import Any

import torch
from torch import nn

_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | {"training"}
"""nn.Module's own attributes: hooks, the parameter / buffer / module tables, the mode
(which a trace never reads as a constant: see ``trace_guards``)."""

_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, enum.Enum,
            numbers.Number)   # numpy's scalars (np.float32, np.int64), Fraction, Decimal
_MAX_ITEMS = 4096
"""Containers of scalars and numpy arrays up to this size are keyed by value; a larger one
by identity and length (a table that large is not configuration a layer reads as
constants: replace it rather than change it in place)."""


class _Same:
    """An object in a key by identity (and a tensor's version counter and storage, which
    ``t.data = ...`` replaces without a new version): held, so its id is never a later
    object's, and compared with ``is`` (never a tensor's ``==``)."""

    __slots__ = ("obj", "version")

    def __init__(self, obj: Any):
        self.obj = obj
        self.version = ((obj._version, obj.data_ptr()) if isinstance(obj, torch.Tensor)
                        and not obj.is_inference() else getattr(obj, "_version", None))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Same) and self.obj is other.obj and self.version == other.version

    def __hash__(self) -> int:
        return id(self.obj)


_RECORDS = (types.SimpleNamespace, argparse.Namespace)
_MAX_DEPTH = 8
"""How deep configuration objects and containers nest before an object is keyed by identity."""


def _plain(value: Any, depth: int = 0) -> Any:
    """A value's key: scalars as they are, small containers of them as tuples (a dict's in
    its order, a set's as a frozenset), tensors by identity and version, functions and
    classes by identity (``self.act = torch.tanh`` swapped), configuration records (a
    ``SimpleNamespace``, a dataclass) by their fields; None where the value is nothing a
    trace reads as a constant (inside a container or record: that item, the others still
    watched). Containers nested past ``_MAX_DEPTH`` or larger than ``_MAX_ITEMS`` are keyed
    by identity, never by an object made here (whose identity would be new at each call).
    No value is formatted or compared element by element: a tensor's ``repr`` or ``==``
    would read it (a device sync)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, torch.Tensor):
        return _Same(value)
    if _is_numpy_scalar(value):      # np.bool_ (not a numbers.Number)
        return value.item()
    if _is_numpy_array(value):       # host memory: its bytes are its value
        if value.size > _MAX_ITEMS:
            return _Same(value), value.shape
        return "ndarray", value.dtype.str, value.shape, value.tobytes()
    if isinstance(value, (tuple, list, dict, set, frozenset)):
        if len(value) > _MAX_ITEMS or depth >= _MAX_DEPTH:
            return _Same(value), len(value)
        items = [x for kv in value.items() for x in kv] if isinstance(value, dict) else value
        keys = tuple(_plain(x, depth + 1) for x in items)
        return type(value).__name__, frozenset(keys) if isinstance(value, (set, frozenset)) \
            else keys
    if isinstance(value, _RECORDS) or (dataclasses.is_dataclass(value)
                                       and not isinstance(value, type)) or _is_users_object(value):
        fields = _fields(value)
        if len(fields) > _MAX_ITEMS or depth >= _MAX_DEPTH:
            return _Same(value), len(fields)
        return type(value), tuple((k, _plain(v, depth + 1)) for k, v in fields.items())
    if callable(value):   # a function, a class, a partial: what the trace calls
        return _Same(value)
    return None


def _is_numpy_scalar(value: Any) -> bool:
    return type(value).__module__ == "numpy" and getattr(value, "shape", None) == ()


def _is_numpy_array(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _slots(cls: type) -> list[str]:
    out = []
    for base in cls.__mro__:
        names = getattr(base, "__slots__", ())
        out.extend([names] if isinstance(names, str) else names)
    return [n for n in out if n not in ("__dict__", "__weakref__")]


def _fields(value: Any) -> dict:
    """A record's fields: its ``__dict__`` and ``__slots__``, or a dataclass's."""
    if dataclasses.is_dataclass(value) and not hasattr(value, "__dict__"):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    fields = dict(vars(value)) if hasattr(value, "__dict__") else {}
    for name in _slots(type(value)):
        if hasattr(value, name):
            fields[name] = getattr(value, name)
    return fields


@functools.lru_cache(maxsize=None)
def _users_module(name: str) -> bool:
    """Whether the module ``name`` is the user's own code: a file that is neither sarc,
    torch, numpy, the standard library nor an installed package (a tqdm bar or a logger on
    a layer is not configuration the layer reads)."""
    from .trace_guards import _is_users
    path = getattr(sys.modules.get(name), "__file__", None)
    if not isinstance(path, str):
        return name == "__main__"
    return _is_users(path)


def _is_users_object(value: Any) -> bool:
    """An instance of a class of the user's code holding its fields in ``__dict__`` or
    ``__slots__`` (a configuration object, ``self.cfg``), not a module (walked as one), a
    class, a function, nor an object of a library."""
    return ((hasattr(value, "__dict__") or bool(_slots(type(value))))
            and not isinstance(value, (type, nn.Module))
            and not callable(value) and _users_module(type(value).__module__ or "builtins"))


def _functions_of(value: Any) -> list[types.FunctionType]:
    """The functions a class attribute runs: a method, a static / class method's, and those
    a decorator wraps (``__wrapped__``, or held in the wrapper's closure)."""
    out, todo, seen = [], [value], set()
    while todo:
        f = todo.pop()
        f = getattr(f, "__func__", f)
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        out.append(f)
        todo.append(getattr(f, "__wrapped__", None))
        todo.extend(c.cell_contents for c in (f.__closure__ or ())
                    if _has_contents(c) and callable(c.cell_contents))
    return out


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # an empty cell
        return False
    return True


def _code_reads(code: types.CodeType, globals_: set, attributes: set) -> None:
    """The global names and the attribute names ``code`` (and the code nested in it) reads."""
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            globals_.add(ins.argval)
        elif "ATTR" in ins.opname or ins.opname == "LOAD_METHOD":
            attributes.add(ins.argval if isinstance(ins.argval, str) else str(ins.argval))
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_reads(c, globals_, attributes)


def _class_code(cls: type) -> tuple:
    """The code of ``cls`` and its bases (user code), function by function."""
    return tuple((base.__qualname__, name, func.__code__)
                 for base in cls.__mro__ if _users_module(base.__module__)
                 for name, value in vars(base).items() for func in _functions_of(value))


def _watched_code(cls: type) -> tuple:
    """What of ``cls``'s code and of the constants it reads the state key holds: the code
    a trace of it runs (``_code_of``), and the class attributes (``_class_constants``) and
    module globals (``_module_globals``) that code names; its code is read once a call."""
    own = _class_code(cls)
    globals_read, attributes_read = _names_read(cls, own)
    return (_code_of(cls, own, globals_read), _class_constants(cls, attributes_read),
            _module_globals(cls, globals_read))


def _code_of(cls: type, own: tuple, globals_read: frozenset) -> tuple:
    """The code a trace of ``cls`` runs: its methods' (``own``) and the module functions
    they name (a helper, one level down). A method replaced on the class, or a helper
    defined again (a notebook's cell run again), is other code: the layer is traced
    again."""
    out, names = list(own), sorted(globals_read)
    for base in cls.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or not _users_module(base.__module__):
            continue
        for name in names:
            out.extend((base.__module__, name, f.__code__)
                       for f in _functions_of(vars(module).get(name)))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _names_read(cls: type, code: tuple) -> tuple[frozenset, frozenset]:
    """(the global names, the attribute names) the code of ``cls`` and its bases (user code)
    reads, with the global names the module functions it names read (a helper the layer
    calls, one level down): the globals and class attributes a trace of it can read.
    ``code``: the class's code (``_class_code``), which keys the answer."""
    globals_: set = set()
    attributes: set = set()
    for _, _, func_code in code:
        _code_reads(func_code, globals_, attributes)
    helpers: set = set()
    for base in cls.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or not _users_module(base.__module__):
            continue
        for name in globals_:
            for func in _functions_of(vars(module).get(name)):
                _code_reads(func.__code__, helpers, attributes)
    return frozenset(globals_ | helpers), frozenset(attributes)


def _class_constants(cls: type, read: frozenset) -> tuple:
    """The scalars and containers of scalars ``cls`` and its bases (user code) define as
    class attributes and their code reads (``read``): ``self.SCALE``."""
    out = []
    for base in cls.__mro__:
        if not _users_module(base.__module__):
            continue
        for name, value in vars(base).items():
            if name not in read or name.startswith("__") or callable(value) \
                    or isinstance(value, (property, staticmethod, classmethod)):
                continue
            k = _plain(value)
            if k is not None:
                out.append((base.__qualname__, name, k))
    return tuple(out)


def _module_globals(cls: type, read: frozenset) -> tuple:
    """The numbers, strings and small containers among the globals of the modules defining
    ``cls`` and its bases (user code) that their code reads by name (``read``): ``TEMP`` in
    ``message`` (a global the layer's code does not name, a training loop's step counter,
    is not watched)."""
    out = []
    for base in cls.__mro__:
        name = base.__module__
        if not _users_module(name):
            continue
        module = sys.modules.get(name)
        if module is None:
            continue
        for key in read:
            if key not in vars(module):
                continue
            value = vars(module)[key]
            if key.startswith("__") or callable(value) or isinstance(value, types.ModuleType):
                continue
            k = _plain(value)   # a number, a container, a record or configuration object
            if k is not None:
                out.append((name, key, k))
    return tuple(sorted(out, key=lambda t: (t[0], t[1])))


def _leaf(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.dtype)


CALL_HOOKS = {"_forward_pre_hooks": "register_forward_pre_hook",
              "_forward_hooks": "register_forward_hook",
              "_backward_pre_hooks": "register_full_backward_pre_hook",
              "_backward_hooks": "register_full_backward_hook (or register_backward_hook)"}
"""nn.Module's hooks on its calls, by the dict holding them: what registers them."""


def call_hooks(mod: nn.Module) -> tuple:
    """The hooks registered on ``mod``'s calls, by their handles' ids."""
    return tuple((name, tuple(getattr(mod, name, {}))) for name in CALL_HOOKS
                 if getattr(mod, name, None))


def state_key(layer: nn.Module) -> tuple:
    """The key of everything ``layer``'s trace depends on besides its parameters' and
    floating-point buffers' values (see the module doc): those buffers too where its last
    trace read one as a Python number (``layer._sarc_numbers``, ``dsl._BufferProxy``)."""
    numbers = getattr(layer, "_sarc_numbers", ())
    key = []
    for path, mod in layer.named_modules():
        key.append(("module", path, type(mod), *_watched_code(type(mod)),
                    call_hooks(mod) if path else ()))
        for name, value in vars(mod).items():
            if name in _MODULE_INTERNALS or name.startswith("_sarc"):
                continue
            k = _plain(value)
            if k is not None:
                key.append((path, name, k))
        for name, p in mod._parameters.items():
            key.append((path, name, None if p is None else _leaf(p)))
        for name, b in mod._buffers.items():
            full = f"{path}.{name}" if path else name
            if b is None:
                key.append((path, name, None))
            elif b.is_floating_point() and full not in numbers:
                key.append((path, name, _leaf(b)))
            else:
                key.append((path, name, _plain(b)))
    return tuple(key)
