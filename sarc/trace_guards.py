"""What holds while a layer is traced (``tracing``, entered by ``Layer.trace``).

- ``module.training`` of the layer and its submodules reads as ``sarc.trace.TRAINING``
  in the tracing thread: one compiled kernel serves training and evaluation, so the mode
  has no value while tracing. Dropout takes it and follows the mode at run time; Python
  control flow on it is refused. Other threads (eager code sharing a submodule) read
  each module's own mode (``_TracedMode``).
- A random draw outside sarc's dropout (``random``, ``numpy.random``, torch's random
  functions) is refused at the user's line: it would be baked into the compiled layer
  as a constant; so is a generator object made before the trace (``random.Random``,
  ``np.random.default_rng()``, kept on the layer or in a module).
- A call Python refuses at the user's line (a wrong keyword to a torch function, an
  ``nn.Module`` called with an extra argument) is a ``DSLError`` there, not a traceback.
- ``torch.ones`` / ``zeros`` / ``full`` / ``reshape`` given a row count
  (``torch.ones(x.shape[0], 4)``) are traced (``trace_torch.ROW_COUNT_ROUTES``).

``routed`` swaps functions wherever modules hold them by name, for the span of a trace:
these guards and the front ends' routes (DGL's edge softmax, PyG's softmax) use it.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import weakref
from types import ModuleType
from typing import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .errors import (PASSES_ON, DSLError, GraphAttributeError, SarcError, SourceLoc, class_loc,
                     dsl_errors_made)
from .names import GENERATED_PACKAGE
from .trace import (TRAINING, _has_proxy, _inside_torch_module, _installed, _is_core_library,
                    _is_library, _is_sarc, _torch_name, call_torch, traced_code, user_loc)


_BAKED_IN = ("the draw would be baked into the compiled layer as a constant. The randomness a "
             "sarc layer models is dropout (sarc.dropout, nn.Dropout, F.dropout(x, p, "
             "self.training))")


def _random_message(name: str) -> str:
    return f"{name}() draws a random number while the layer is traced: {_BAKED_IN}"


def _torch_random_functions() -> frozenset:
    names = {torch: ("rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
                     "randperm", "normal", "bernoulli", "multinomial", "poisson", "dropout",
                     "alpha_dropout", "feature_alpha_dropout", "feature_dropout", "rrelu"),
             F: ("alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d",
                 "dropout3d", "rrelu", "gumbel_softmax"),
             torch.Tensor: ("uniform_", "normal_", "bernoulli_", "bernoulli", "random_",
                            "exponential_", "geometric_", "cauchy_", "log_normal_",
                            "multinomial")}
    return frozenset(getattr(owner, n) for owner, ns in names.items() for n in ns
                     if hasattr(owner, n))


_RANDOM_TORCH = _torch_random_functions()


_RRELU = frozenset(f for f in (F.rrelu, getattr(torch, "rrelu", None)) if f is not None)


def _eval_rrelu(args, kwargs) -> tuple | None:
    """``rrelu(x, lower, upper, training, inplace)`` where ``training`` is False (its
    default) as ``leaky_relu``'s arguments: slope (lower + upper) / 2, as torch computes it;
    None where it draws."""
    names = ("input", "lower", "upper", "training", "inplace")
    given = {**dict(zip(names, args)), **kwargs}
    if given.get("training", False) is not False:
        return None
    slope = (float(given.get("lower", 1.0 / 8)) + float(given.get("upper", 1.0 / 3))) / 2
    return given["input"], slope, given.get("inplace", False)


class _RefuseTorchRandomness(TorchFunctionMode):
    """Refuse torch's random functions (and F.dropout of an untraced tensor) while tracing."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RRELU and _has_proxy(args, kwargs):
            leaky = _eval_rrelu(args, kwargs)
            if leaky is not None:   # out of training: no draw
                return F.leaky_relu(*leaky)
        if func in _RANDOM_TORCH or (func is F.dropout and not _has_proxy(args, kwargs)):
            raise DSLError(_random_message(_torch_name(func)), user_loc())
        return func(*args, **kwargs)


_TRACING = threading.local()

TRACE_LOCK = threading.RLock()
"""Held while a layer is traced: the routes are module globals (``routed``), so two traces
in two threads would put each other's back; traces run one at a time. A trace swaps the
layer's parameters for the tracer's placeholders in place, so a call in another thread
reads the layer's state (its precision, its parameters, whether its kernel is current)
under it too (``Layer.run_local``, ``sarc.distributed.schedule.run_layer``)."""


def _python_random_functions() -> dict[int, tuple[str, Callable]]:
    """id -> (name, function) of the drawing functions of ``random`` and ``numpy.random``."""
    import random
    modules = [("random", random, ("seed", "getstate", "setstate"))]
    if "numpy" in sys.modules:
        modules.append(("numpy.random", sys.modules["numpy"].random,
                        ("seed", "get_state", "set_state", "get_bit_generator",
                         "set_bit_generator")))
    found = {}
    for prefix, module, keep in modules:
        for n in getattr(module, "__all__", ()):
            f = getattr(module, n, None)
            if callable(f) and not isinstance(f, type) and n not in keep:
                found[id(f)] = (f"{prefix}.{n}", f)
    return found


def _refusing(name: str, original: Callable) -> Callable:
    """``original``, except while this thread traces a layer."""
    def draw(*args, **kwargs):
        if getattr(_TRACING, "active", False):
            raise DSLError(_random_message(name), user_loc())
        return original(*args, **kwargs)
    draw.__name__ = getattr(original, "__name__", name)
    draw.__doc__ = getattr(original, "__doc__", None)
    return draw


@contextlib.contextmanager
def routed(routes: Mapping[Callable, Callable] | Iterable[tuple[Callable, Callable]],
           namespaces: Callable[[], Iterable[dict]]):
    """Each function of ``routes`` (a mapping, or (function, route) pairs) replaced by its
    route wherever ``namespaces()`` (modules' ``vars``) hold it by name, found by identity
    (``from random import random`` in a user's module included); put back when the block
    ends, however it ends, there and wherever ``namespaces()`` then holds a route (a module
    imported while tracing, which took the route by name)."""
    pairs = routes.items() if isinstance(routes, Mapping) else routes
    by_id = {id(f): (f, route) for f, route in pairs}
    of_route = {id(route): (route, f) for f, route in by_id.values()}
    swapped = []
    try:
        for ns in namespaces():
            for key, value in list(ns.items()):
                hit = by_id.get(id(value))
                if hit is not None and hit[0] is value:
                    ns[key] = hit[1]
                    swapped.append((ns, key, value))
        yield
    finally:
        for ns, key, value in reversed(swapped):
            ns[key] = value
        for ns in namespaces():
            for key, value in list(ns.items()):
                hit = of_route.get(id(value))
                if hit is not None and hit[0] is value:
                    ns[key] = hit[1]


@contextlib.contextmanager
def builtins_take_tensor_proxies(namespaces: Callable[[], Iterable[dict]],
                                 also: Mapping[Callable, Callable] | None = None):
    """While values that say they are tensors are traced (a frontend's proxies whose
    ``__class__`` is ``torch.Tensor``, so that ``isinstance(x, Tensor)`` in PyG's or DGL's
    code holds): torch's builtins (``torch.pow``, ``torch.where``, ``F``'s) given a proxy
    go to the tracer first. torch's argument parser takes such an object for a tensor and
    reads its memory as one, trying an overload with a number there (``torch.pow(x,
    2.0)``, ``torch.where(c, x, 0.0)``): a crash, not an error. Replaced in torch's and
    ``F``'s namespaces and in ``namespaces()`` (``from torch import where``), with the
    routes ``also`` (a front end's own, swapped in the same pass over the namespaces)."""
    routes = [*_tensor_proxy_routes(), *(also or {}).items()]
    with routed(routes, lambda: [vars(torch), vars(F)] + list(namespaces())):
        yield


@functools.cache
def _tensor_proxy_routes() -> tuple:
    builtins = {id(f): f for ns in (vars(torch), vars(F)) for f in ns.values()
                if type(f) is type(torch.pow) and "torch_function" not in f.__name__}

    def route(func):
        @functools.wraps(func)
        def call(*args, **kwargs):
            if _has_proxy(args, kwargs):
                return call_torch(func, args, kwargs)
            return func(*args, **kwargs)
        PASSES_ON.add(call.__code__)
        return call
    return tuple((f, route(f)) for f in builtins.values())


@contextlib.contextmanager
def _refuse_python_randomness(namespaces: Callable[[], list[dict]]):
    """Swap the drawing functions of ``random`` and ``numpy.random`` in their modules and
    in ``namespaces()`` (the user's modules: ``from random import random``) for refusing
    ones."""
    import random
    draws = [(f, _refusing(name, f)) for name, f in _python_random_functions().values()]
    spaces = [vars(random)] + ([vars(sys.modules["numpy"].random)] if "numpy" in sys.modules
                               else [])
    was_active, _TRACING.active = getattr(_TRACING, "active", False), True
    try:
        with routed(draws, lambda: spaces + namespaces()):
            yield
    finally:
        _TRACING.active = was_active


@contextlib.contextmanager
def _refuse_generator_objects(modules: list, namespaces: Callable[[], list[dict]]):
    """A generator object made before the trace (``random.Random(0)``,
    ``np.random.default_rng()``, kept on the layer or in a module) drawing while it is
    traced. ``random.Random``'s draws all go through its ``random`` and ``getrandbits``,
    swapped on the class for refusing ones (at the user's line); numpy's generators are
    C types: their states, on the layer's modules and in ``namespaces()``, compared after."""
    import random
    swapped = []
    for cls in (random.Random, random.SystemRandom):
        for name in ("random", "getrandbits"):
            swapped.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, _refusing(f"{cls.__module__}.{cls.__name__}.{name}",
                                         getattr(cls, name)))
    before = _numpy_generator_states(modules, namespaces())
    try:
        yield
    finally:
        for cls, name, original in reversed(swapped):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
    for where, (obj, state) in before.items():
        if not _same_state(_generator_state(obj), state):
            raise DSLError(f"{where} (numpy.random.{type(obj).__name__}) drew a random number "
                           f"while the layer was traced: {_BAKED_IN}",
                           class_loc(type(modules[0])) if modules else None)


def _numpy_generator_states(modules: list, namespaces: list[dict]) -> dict[str, tuple]:
    """``where -> (generator, its state)`` of numpy's generators on ``modules`` (their
    attributes: ``self.rng``) and in ``namespaces`` (a module's ``RNG``)."""
    np = sys.modules.get("numpy")
    if np is None:
        return {}
    kinds = (np.random.Generator, np.random.RandomState)
    found: dict[str, tuple] = {}
    for m in modules:
        for name, value in vars(m).items():
            if isinstance(value, kinds):
                found.setdefault(f"self.{name}", (value, _generator_state(value)))
    for space in namespaces:
        for name, value in list(space.items()):
            if isinstance(value, kinds):
                found.setdefault(name, (value, _generator_state(value)))
    return found


def _generator_state(g):
    return g.bit_generator.state if hasattr(g, "bit_generator") else g.get_state(legacy=False)


def _same_state(a, b) -> bool:
    """Two generator states (nested dicts of numbers and arrays) equal."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(
            _same_state(a[k], b[k]) for k in a)
    if hasattr(a, "shape"):
        return hasattr(b, "shape") and a.shape == b.shape and bool((a == b).all())
    return a == b


def _innermost(e: BaseException):
    """The frame ``e`` was raised in."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def _row_count_hint(e: Exception) -> str:
    """Why torch's argument parsing refused a graph size (``torch.arange(g.num_edges())``,
    ``torch.rand(x.shape[0], 1)``), which it names by its class."""
    from .trace import RowCount

    def names(cls):
        return {cls.__name__} | {n for sub in cls.__subclasses__() for n in names(sub)}
    if isinstance(e, TypeError) and "TracedDevice" in str(e):
        return (" (device= is the device of a traced value, which tracing does not know: only "
                "a tensor of constants over a row count takes it, torch.zeros(x.shape[0], 4, "
                "device=x.device); a tensor of fixed size made in a layer is a constant: "
                "write the number, or register it as a buffer)")
    if not isinstance(e, TypeError) or not any(n in str(e) for n in names(RowCount)):
        return ""
    return (" (the argument is a graph size, g.num_edges() or x.shape[0], which has no value "
            "while tracing: the layer runs on any graph. Only a filled tensor over it is traced, "
            "a constant per row (torch.ones / zeros / full / empty, x.new_ones ...); a value "
            "per row index, such as torch.arange, or a random draw over it is not)")


def code_namespaces(modules: Iterable[torch.nn.Module]) -> list[dict]:
    """Where the code being traced may hold a function by name (``from dgl.nn.functional
    import edge_softmax``, ``self.softmax = edge_softmax``): the modules defining the classes of ``modules`` (``_traced_modules``)
    and every loaded module of the user's own code, which is neither sarc (its generated
    modules included: a long run loads thousands), torch, numpy, the standard library nor
    an installed package (a helper module the layer calls)."""
    modules = list(modules)
    found = {id(m): m for m in _traced_modules(modules)}
    for mod in _users_modules():
        found.setdefault(id(mod), mod)
    # and the traced modules' own attributes (``self.softmax = edge_softmax`` in __init__)
    held = {id(sub): sub for m in modules if isinstance(m, torch.nn.Module)
            for sub in m.modules()}
    return [vars(m) for m in found.values()] + [vars(sub) for sub in held.values()]


_VERDICTS: dict[str, tuple[weakref.ref, bool]] = {}
"""Per name in ``sys.modules``: (the module, held weakly; whether it is the user's code),
so that a trace, which looks at every loaded module four times, asks each once."""


_USERS_OF: tuple = ((), [])
"""(what ``sys.modules`` held: its names and its modules' ids, the user's modules among
them): a trace looks four times, and most traces follow one another with no import."""


def _users_modules() -> list[ModuleType]:
    """The loaded modules of the user's own code (``code_namespaces``)."""
    global _USERS_OF
    held = (tuple(sys.modules), tuple(map(id, sys.modules.values())))
    if _USERS_OF[0] == held:
        return _USERS_OF[1]
    generated = GENERATED_PACKAGE + "."
    out = []
    for name, mod in list(sys.modules.items()):
        hit = _VERDICTS.get(name)
        if hit is None or hit[0]() is not mod:
            path = getattr(mod, "__file__", None)
            users = (isinstance(path, str) and not name.startswith(generated)
                     and _is_users(path))
            try:
                hit = _VERDICTS[name] = (weakref.ref(mod), users)
            except TypeError:  # not a module (a placeholder some packages put there)
                hit = (lambda: None, users)
        if hit[1]:
            out.append(mod)
    _USERS_OF = (held, out)
    return out


@functools.lru_cache(maxsize=None)
def _is_users(path: str) -> bool:
    """Whether the file is the user's own code: not sarc, torch, numpy, the standard
    library or an installed package."""
    return not (_is_core_library(path) or _is_sarc(path) or _installed(os.path.abspath(path)))


def _traced_modules(modules: Iterable[torch.nn.Module]) -> list[ModuleType]:
    """The Python modules defining the classes of ``modules`` (and their bases), sarc's,
    torch's, numpy's and the standard library's left out: the code being traced, whose
    lines the errors name, even where it is an installed package (a PyG or DGL conv)."""
    found = {}
    for m in modules:
        for cls in type(m).__mro__:
            mod = sys.modules.get(cls.__module__)
            path = getattr(mod, "__file__", None)
            if mod is not None and path and not _is_core_library(path):
                found[id(mod)] = mod
    return list(found.values())


def raised_at(e: BaseException) -> SourceLoc | None:
    """The user's line that raised ``e`` (an operation, or a call): the innermost user
    frame of its traceback, when no sarc code ran below it. Python refusing a call raises in the caller's frame (a
    wrong keyword to a function of the user's) or in a library's (an nn.Module called with
    an extra argument raises inside torch); a TypeError from sarc's own code is not the
    user's call, and stays as it is."""
    user, below_user = None, []
    tb = e.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not _is_library(path):
            user, below_user = tb, []
        elif user is not None and tb.tb_frame.f_code not in PASSES_ON:
            below_user.append(path)
        tb = tb.tb_next
    if user is None or (any(_is_sarc(p) for p in below_user)
                        and not isinstance(e, GraphAttributeError)):
        return None
    code = user.tb_frame.f_code
    return SourceLoc(code.co_filename, user.tb_lineno, code.co_name)


@contextlib.contextmanager
def tracing(modules: Iterable[torch.nn.Module]):
    """While a layer is traced: gradients are enabled (what the layer's code computes under
    its own ``torch.no_grad()`` is detached, ``sarc.trace._without_grad``), ``module.training``
    of ``modules`` reads ``TRAINING``,
    random draws outside sarc's dropout are refused at the user's line, the files of the
    modules' classes are the user's code (``sarc.trace.traced_code``), and a call that
    Python refuses, or an error the user's own code raises (a TypeError from the user's
    call, an AttributeError or NameError from a misspelt name; see ``raised_at``),
    is a DSLError at the user's line; what the code stores on the modules is put back
    (``_put_back``)."""
    modules = list(modules)
    stored = [(m, dict(vars(m))) for m in modules]   # their modes included
    traced = _traced_modules(modules)
    TRACE_LOCK.acquire()
    try:
        from .trace_torch import ROW_COUNT_ROUTES
        with torch.inference_mode(False), torch.enable_grad(), \
                traced_code(mod.__file__ for mod in traced), \
                _refuse_python_randomness(lambda: code_namespaces(modules)), \
                _refuse_generator_objects(modules, lambda: code_namespaces(modules)), \
                routed(ROW_COUNT_ROUTES, lambda: [vars(torch)] + code_namespaces(modules)), \
                _RefuseTorchRandomness(), _TracedMode(modules), dsl_errors_made() as refused:
            try:
                yield
            except SarcError:
                raise
            except Exception as e:  # noqa: BLE001 - the user's code failing as Python
                loc = raised_at(e)
                if loc is None:
                    raise
                what = "" if isinstance(e, TypeError) else f"{type(e).__name__}: "
                hint = _row_count_hint(e)   # then torch's first line says enough
                text = str(e).splitlines()[0].split(", but expected")[0] if hint else str(e)
                raise DSLError(_inside_torch_module(f"{what}{text}{hint}", _innermost(e)),
                               loc) from None
            if refused:  # the code went on past a refusal: it would trace another program
                first = refused[0]
                raise DSLError(f"{first.problem} (the code caught this error with a try / "
                               f"except of its own and went on: sarc cannot trace the "
                               f"code as written)", first.loc) from None
    finally:
        _put_back(stored)
        TRACE_LOCK.release()


class _TracedMode:
    """``nn.Module.training`` while a layer is traced (a context manager, which installs it
    on ``nn.Module`` for the trace): ``TRAINING`` where the tracing thread reads it of a
    traced module; elsewhere (another thread, a module outside the layer) the module's
    own mode, as without it. Setting a mode sets the module's own."""

    def __init__(self, modules: list):
        self.traced = {id(m) for m in modules}   # alive: the trace holds them
        self.thread = threading.get_ident()
        self.before = _ABSENT

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if id(obj) in self.traced and threading.get_ident() == self.thread:
            return TRAINING
        try:
            return obj.__dict__["training"]
        except KeyError:
            raise AttributeError("training") from None

    def __set__(self, obj, value) -> None:
        obj.__dict__["training"] = value

    def __enter__(self):
        self.before = vars(torch.nn.Module).get("training", _ABSENT)
        torch.nn.Module.training = self
        return self

    def __exit__(self, *exc) -> None:
        if self.before is _ABSENT:
            del torch.nn.Module.training
        else:
            torch.nn.Module.training = self.before


def _put_back(stored: list) -> None:
    """Each module's attributes as they were before the trace (``stored``: the modules and
    their attribute dicts then). What the layer's code stores on itself while traced
    (PyG's ``self._alpha = alpha``, a call counter) is a traced value, or a change the
    compiled layer would not make at its calls: the code does not run there. sarc's own
    (``_sarc_...``) stay; a module's parameter, buffer and submodule tables are the same
    dicts, kept with what they hold."""
    for m, before in stored:
        now = vars(m)
        for k in [k for k in now if k not in before and not k.startswith("_sarc")]:
            del now[k]
        for k, v in before.items():
            if now.get(k, _ABSENT) is not v and not k.startswith("_sarc"):
                now[k] = v


_ABSENT = object()
