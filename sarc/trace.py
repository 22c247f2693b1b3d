"""Tracing: run the user's message / reduce / update on symbolic proxies to record IR.

A ``Proxy`` stands for one IR value. Arithmetic on proxies, the ``sarc.*``
functions and the torch functions in ``TORCH_FUNCTIONS`` (reached through
``__torch_function__``, so ``torch.nn.Linear`` and ``F.leaky_relu`` work as
written; the table is ``sarc.trace_torch``) append instructions to the tracer's
builder. Every instruction records the user's file and line, which every later
error quotes.

The tracer never silently gives a wrong answer; what it cannot record exactly is
a ``DSLError`` at the user's line:

- each traced function (a ``Traced``) is written with torch's signature; an
  argument sarc does not model defaults to ``Fixed(torch's default)``, and any
  other value for it is refused, never dropped;
- a traced value has no concrete value, so Python control flow on it (``if``,
  ``int()``, indexing a list, ``len``, iteration, comparisons) cannot be traced,
  as in ``torch.fx``; nor can the row count in its ``shape``;
- in-place ops (``h += 1``, ``h.add_(1)``, ``h[i] = v``) would change every
  alias of a value: refused;
- while a layer is traced (``sarc.trace_guards.tracing``) ``module.training``
  reads as ``TRAINING``, since one kernel serves training and evaluation, and
  random draws outside sarc's dropout are refused.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import itertools
import numbers
import os
import sys
import sysconfig
import threading
from typing import Any, Callable, Iterable

import numpy as np
import torch

from .errors import DSLError, SourceLoc
from .ir.function import Builder
from .ir.ops import Op
from .ir.types import Domain, DType, TensorType


def _package_dir(name: str) -> str | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    origin = spec.origin if spec is not None else None
    return os.path.dirname(os.path.abspath(origin)) if origin else None


# Code that is never the user's: sarc and the libraries a layer calls into (torch, numpy);
# and Python's standard library, apart from the installed packages a venv keeps inside it.
_SARC_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NUMPY_DIR = (_package_dir("numpy") or "<no numpy>") + os.sep
_LIBRARY_DIRS = (_SARC_DIR, _package_dir("torch") + os.sep, _NUMPY_DIR)
_STDLIB_DIRS = tuple(dict.fromkeys(os.path.abspath(d) + os.sep for d in (
    sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")) if d))
# Where installed packages live, in a venv, a system Python or a Debian one.
_INSTALLED = tuple(os.sep + d + os.sep for d in ("site-packages", "dist-packages"))


def _installed(path: str) -> bool:
    return any(d in path for d in _INSTALLED)


@functools.lru_cache(maxsize=4096)
def _is_core_library(path: str) -> bool:
    if path.startswith("<frozen"):   # importlib's and other frozen stdlib modules
        return True
    path = os.path.abspath(path)
    return path.startswith(_LIBRARY_DIRS) or (path.startswith(_STDLIB_DIRS)
                                              and not _installed(path))


def _is_sarc(path: str) -> bool:
    return os.path.abspath(path).startswith(_SARC_DIR)


def _is_library(path: str) -> bool:
    """Whether ``path`` is library code, skipped when looking for the user's line: sarc,
    torch, numpy, the standard library and installed packages, except the files of the
    modules being traced (``traced_code``): a layer or a converted PyG / DGL module
    installed under site-packages is still the code the user's error is in."""
    if _is_core_library(path):
        return True
    return _installed(os.path.abspath(path)) and (
        os.path.abspath(path) not in getattr(_TRACED, "files", ()))


_TRACED = threading.local()


@contextlib.contextmanager
def traced_code(files: Iterable[str]):
    """While tracing: ``files`` (those defining the traced modules' classes) are the user's
    code even where they are installed packages."""
    saved = getattr(_TRACED, "files", frozenset())
    _TRACED.files = saved | {os.path.abspath(f) for f in files if not _is_core_library(f)}
    try:
        yield
    finally:
        _TRACED.files = saved


def user_loc(frame=None) -> SourceLoc | None:
    """The innermost stack frame outside library code (``_is_library``): the user's line;
    from ``frame`` outwards where given (past frames that are neither: a dataclass's
    generated ``__init__``), else from the caller's."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if not _is_library(f.f_code.co_filename):
            return SourceLoc(f.f_code.co_filename, f.f_lineno, f.f_code.co_name, _end_line(f))
        f = f.f_back
    return None


def _end_line(frame) -> int:
    """The last line of the expression ``frame`` is evaluating (Python 3.11's positions), or
    0 where unknown."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None or frame.f_lasti < 0:
        return 0
    here = next(itertools.islice(positions(), frame.f_lasti // 2, None), None)
    return (here[1] or 0) if here else 0


def _numpy_caller() -> str | None:
    """The numpy function the user called, when it is what calls into sarc: ``np.sum(x,
    axis=-1)`` calls ``x.sum(axis=-1, out=None)`` on a traced value."""
    f, name = sys._getframe(1), None
    while f is not None and _is_library(f.f_code.co_filename):
        if os.path.abspath(f.f_code.co_filename).startswith(_NUMPY_DIR):
            name = f.f_code.co_name
        f = f.f_back
    return name


def call_returning(fn: Callable, *args) -> tuple[Any, SourceLoc | None]:
    """``fn(*args)`` and the user's line it returned from, which an error about its result
    names (``return msg.m`` in reduce). The line is read from ``fn``'s frame after the call;
    the frame is caught by a profile hook that removes itself at once. None where another
    profiler is installed (it is left alone) or ``fn`` is library code."""
    frames = []

    def catch(frame, event, arg):
        if event == "call":
            frames.append(frame)
            sys.setprofile(None)

    if sys.getprofile() is None:
        sys.setprofile(catch)
    try:
        result = fn(*args)
    finally:
        if sys.getprofile() is catch:
            sys.setprofile(None)
    f = frames.pop() if frames else None
    try:
        if f is None or _is_library(f.f_code.co_filename):
            return result, None
        return result, SourceLoc(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
    finally:
        # fn's frame holds this one (f_back), which holds it: a cycle that would keep every
        # caller's frame, and what their locals hold, alive until the collector runs
        del f


_NO_CONTROL_FLOW = ("a traced value has no concrete value while tracing, so data-dependent "
                    "control flow cannot be traced")
_SELECT_HINT = ("for a per-element choice use torch.where(x > 0, a, b) or "
                "x.masked_fill(cond, value), and sarc.max / sarc.min across edges")


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _kind(x: Any) -> str:
    return "a traced value" if isinstance(x, Proxy) else type(x).__name__


class Tracer:
    """Owns the builder while one layer is traced. ``proxy_type``: the class of the values
    it makes (a front end may make them look like what the code it traces expects)."""

    def __init__(self, name: str, precision: DType | None = None):
        self.builder = Builder(name)
        self.proxy_type: type = Proxy
        self.precision = precision   # the layer's float dtype: constants made over rows

    def emit(self, op: Op, inputs: list["Proxy"], attrs: dict | None = None) -> "Proxy":
        for p in inputs:
            if p.tracer is not self:
                raise DSLError("a value from another layer's trace was used here", user_loc())
        idx = self.builder.add(op, [p.index for p in inputs], attrs, user_loc())
        return self.proxy_type(self, idx)

    def const(self, value: float, like: "Proxy") -> "Proxy":
        t = TensorType(Domain.PARAM, like.type.dtype if like.type.dtype.is_float else DType.F32, ())
        return self.proxy_type(self, self.builder.const(value, t, user_loc()))

    def lift(self, x: Any, like: "Proxy") -> "Proxy":
        """Turn a python number or 0-d tensor into a constant; reject other tensors."""
        if isinstance(x, Proxy):
            return x
        if _is_number(x):
            return self.const(float(x), like)
        # what the tracer made but refuses: said by its class, or by the value itself (a
        # tensor sized by a stand-in graph's row count, ``trace_torch._filled``)
        refusal = getattr(type(x), "_sarc_refusal", None) or \
            getattr(x, "__dict__", {}).get("_sarc_refusal")
        if refusal is not None:
            raise DSLError(refusal(x), user_loc())
        if isinstance(x, torch.Tensor):
            if x.dim() == 0 and not x.requires_grad:
                return self.const(float(x), like)
            raise DSLError(
                f"a torch tensor of shape {list(x.shape)} that is not a parameter of the layer "
                f"is used here; {_REGISTER_IT}", user_loc())
        if isinstance(x, np.ndarray) and x.dtype.kind in "iuf":
            if x.ndim == 0:
                return self.const(float(x), like)
            raise DSLError(f"a numpy array of shape {list(x.shape)} is used here; {_REGISTER_IT} "
                           f"(torch.as_tensor(...))", user_loc())
        if isinstance(x, RowCount):
            raise DSLError(x._message(), user_loc())
        if x is TRAINING:
            raise DSLError(_TRAINING_MESSAGE, user_loc())
        raise DSLError(f"cannot use a {type(x).__name__} in a sarc layer", user_loc())


_REGISTER_IT = ("declare it on the layer as an nn.Parameter (learned) or with "
                "self.register_buffer (a constant), or pass it as a sarc layer input")


def _number(x: Any, what: str) -> float:
    """A python number, or a 0-d tensor that is not learned, as a float; else an error."""
    if _is_number(x):
        return float(x)
    if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.requires_grad:
        return float(x)
    raise DSLError(f"{what} must be a number, got {_kind(x)}", user_loc())


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(t: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


def _traced(x: Any, what: str) -> "Proxy":
    if not isinstance(x, Proxy):
        raise DSLError(f"{what} takes a traced value, got {_kind(x)}", user_loc())
    return x


# --- the symbolic value -------------------------------------------------------------------

class _UnsupportedMethod(DSLError, AttributeError):
    """A DSLError that is also an AttributeError, so ``hasattr`` on a proxy stays False."""


_READS_VALUE = frozenset({"item", "tolist", "numpy", "data_ptr", "storage",
                          "untyped_storage"})


# Conversions to float dtypes are traced (sarc.trace_torch: x.float(), x.to(dtype), ...);
# these are to dtypes a layer has not.
_CONVERSIONS = frozenset({"int", "short", "bool", "byte", "char", "cfloat", "cdouble",
                          "chalf"})
INTEGER_CONVERSION = (
    "a sarc layer converts values to float dtypes only (x.float(), x.half(), "
    "x.to(torch.bfloat16), x.to(h.dtype)): rounding a value to an integer is not traced; an "
    "integer (index) value is a feature declared with sarc.INDEX or sarc.Feature(shape, "
    "dtype=\"i64\") and given as an int64 tensor, used as it is (W[edge.etype])")
"""Why a conversion to an integer (or to a dtype sarc has not) is refused, and what to write."""


def _method_message(name: str) -> str:
    if name in _CONVERSIONS:
        return f"Tensor.{name}: {INTEGER_CONVERSION}"
    if name in _READS_VALUE:
        return f"Tensor.{name} reads the value of a traced tensor: {_NO_CONTROL_FLOW}"
    if name.endswith("_"):
        out_of_place = name[:-1]
        alt = (f"; use Tensor.{out_of_place}" if hasattr(torch.Tensor, out_of_place)
               else "; write it out of place")
        return (f"Tensor.{name} is an in-place op, which a sarc layer does not support "
                f"(it would change every alias of the value){alt}")
    return f"Tensor.{name} is not supported in a sarc layer"


def _refuse(message: str) -> Callable:
    def refuse(self, *args, **kwargs):
        raise DSLError(message, user_loc())
    return refuse


class Proxy:
    """A symbolic tensor during tracing; rows first, as in torch.

    Its methods and operators are the traced torch functions (``TORCH_FUNCTIONS``),
    installed below; what it cannot trace raises at the user's line.
    """

    __slots__ = ("tracer", "index")
    __hash__ = object.__hash__   # by identity, as a torch.Tensor's
    # numpy's operators defer to ours (``np.float32(a) * x``), as they do to a torch.Tensor's
    __array_priority__ = 1000

    def __init__(self, tracer: Tracer, index: int):
        self.tracer = tracer
        self.index = index

    @property
    def type(self) -> "ValueType":
        """The value's IR type; called, torch's ``Tensor.type`` (``x.type(torch.float32)``)."""
        return ValueType(self.tracer.builder.values[self.index].type, self)

    @property
    def shape(self) -> tuple:
        """Rows first: a graph value's row count is a ``RowCount`` (symbolic)."""
        t = self.type
        if t.domain is Domain.PARAM:
            return t.feat
        return (RowCount(t.domain.rows, self.tracer, user_loc()), *t.feat)

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.type.dtype.to_torch()

    @property
    def device(self) -> "TracedDevice":
        return TRACED_DEVICE

    def dim(self) -> int:
        return len(self.type.shape)

    def size(self, dim: int | None = None):
        """``x.size()``: the shape; ``x.size(d)``: its entry ``d`` (``x.size(0)``, the rows,
        is a ``RowCount``, which view, reshape, slices and ``torch.ones`` take)."""
        shape = self.shape
        if dim is None:
            return shape
        if not _is_int(dim) or not -len(shape) <= dim < len(shape):
            raise DSLError(f"size({dim!r}): dim out of range for a value of "
                           f"{len(shape)} dims", user_loc())
        return shape[dim]

    def __repr__(self) -> str:
        return f"Proxy(%{self.index}: {self.type})"

    def __getattr__(self, name: str):
        # Reached only for names a Proxy lacks: say so for a torch.Tensor method sarc
        # does not trace, rather than "'Proxy' object has no attribute".
        if name.startswith("__") or not hasattr(torch.Tensor, name):
            raise AttributeError(f"'Proxy' object has no attribute {name!r}")
        raise _UnsupportedMethod(_inside_torch_module(_method_message(name), sys._getframe(1)),
                                 user_loc())

    def __setattr__(self, name: str, value) -> None:
        if any(name in getattr(c, "__slots__", ()) for c in type(self).__mro__):
            object.__setattr__(self, name, value)
            return
        raise DSLError(f"x.{name} = ... on a traced tensor is not supported in a sarc layer "
                       f"(it would change the value in place): compute a new value instead",
                       user_loc())

    def __array__(self, *args, **kwargs):
        raise DSLError("a traced tensor converted to a numpy array (np.asarray, np.array, a "
                       "numpy function): its values exist only when the layer runs; compute "
                       "with torch functions", user_loc())

    def __len__(self) -> int:
        t = self.type
        if t.domain is Domain.PARAM and t.feat:
            return t.feat[0]
        raise DSLError(f"len() of a traced {t.domain.value} value {_shape(t)}: "
                       f"{_NO_CONTROL_FLOW}", user_loc())

    __bool__ = _refuse(f"a traced value used as a Python bool (if, while, and, or, not): "
                       f"{_NO_CONTROL_FLOW}; {_SELECT_HINT}")
    __index__ = __int__ = _refuse(
        f"a traced value used as a Python int (an index, range(), int()): {_NO_CONTROL_FLOW}; "
        f"to pick a weight per edge or node type use sarc.TypedLinear or index a parameter "
        f"table (W[edge.etype])")
    __float__ = __complex__ = __round__ = __trunc__ = __floor__ = __ceil__ = _refuse(
        f"a traced value used as a Python number: {_NO_CONTROL_FLOW}")
    def __iter__(self):
        hint = ""
        if self.type.domain in (Domain.SRC, Domain.DST):   # `h_src, h_dst = feat`
            hint = ("; unpacking a (src, dst) pair? A node feature is one value, over the "
                    "source rows, the destinations' being its first rows (a pair given at "
                    "the call, DGL's (h, h[:num_dst]), is taken as h): write "
                    "`h_src, h_dst = dgl.utils.expand_as_pair(feat, g)`, which sarc reads so, "
                    "or h[:g.num_dst_nodes()]")
        raise DSLError(f"iterating over a traced value: {_NO_CONTROL_FLOW} (nor are its rows "
                       f"known){hint}", user_loc())
    __contains__ = _refuse(f"`in` on a traced value: {_NO_CONTROL_FLOW}")
    __setitem__ = __delitem__ = _refuse(
        "assigning into a traced value (h[...] = ...) is not supported: it would change "
        "every alias of the value; build a new value instead")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return call_torch(func, args, kwargs or {})


class ValueType(TensorType):
    """A traced value's ``TensorType`` (``Proxy.type``), equal to the plain one, and callable
    as torch's ``Tensor.type``: ``x.type(torch.float32)`` converts the value (traced as the
    other conversions, ``sarc.trace_torch``)."""

    def __init__(self, t: TensorType, proxy: "Proxy"):
        super().__init__(t.domain, t.dtype, t.feat)
        object.__setattr__(self, "_proxy", proxy)

    def __call__(self, *args, **kwargs):
        return call_torch(torch.Tensor.type, (self._proxy, *args), kwargs)

    def __eq__(self, other):
        if not isinstance(other, TensorType):
            return NotImplemented
        return (self.domain, self.dtype, self.feat) == (other.domain, other.dtype, other.feat)

    __hash__ = TensorType.__hash__


class RowCount:
    """The row count of a graph value (``N_src``, ``N_dst``, ``E``) in ``Proxy.shape``: the
    same for every graph the layer runs on, so it has no value while tracing. It is the
    rows of a tensor of constants (``torch.ones(x.shape[0], 4)``: ``tracer``'s)."""

    __slots__ = ("symbol", "tracer", "taken")
    value: int | None = None   # a stand-in graph's count where graph code needs a number

    def __init__(self, symbol, tracer: "Tracer | None" = None, taken: SourceLoc | None = None):
        self.symbol = symbol
        self.tracer = tracer
        self.taken = taken   # the user's line that read it (``x.shape[0]``)

    def __repr__(self) -> str:
        return str(self.symbol)

    def __hash__(self) -> int:
        return hash(self.symbol)

    def __eq__(self, other):
        if isinstance(other, RowCount) and other.symbol == self.symbol:
            return True
        raise DSLError(self._message(), user_loc())

    def _message(self) -> str:
        here, taken = user_loc(), self.taken
        where = (f"; it was taken at {taken.file}:{taken.line}" if taken is not None and
                 (here is None or (here.file, here.line) != (taken.file, taken.line)) else "")
        return (f"the row count {self.symbol} of a traced value is not known while tracing "
                f"(the layer runs on any graph): a feature size is, e.g. h.shape[-1]{where}")

    def _refuse(self, *args):
        raise DSLError(self._message(), user_loc())

    def _same(self, other) -> bool:
        """Whether ``other`` is this count (the same rows): an order of the two is known
        (``min(x_src.size(0), x_dst.size(0))`` of one x); any other is refused."""
        if isinstance(other, RowCount) and other.symbol == self.symbol:
            return True
        self._refuse()

    def __ne__(self, other):
        return not self._same(other)

    def __lt__(self, other):
        return not self._same(other)

    def __gt__(self, other):
        return not self._same(other)

    def __le__(self, other):
        return self._same(other)

    def __ge__(self, other):
        return self._same(other)

    __bool__ = __index__ = __int__ = _refuse
    __float__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _refuse


class TracedDevice:
    """``x.device`` of a traced value: where the layer will run, which tracing does not know
    (a compiled layer runs on the device of the tensors it is given). A tensor of constants
    takes it (``torch.zeros(x.size(0), 4, device=x.device)``, nn.GRUCell's zero state: made
    where the layer runs); reading it is refused."""

    __slots__ = ()
    __hash__ = object.__hash__

    def _sarc_refusal(self) -> str:
        return ("the device of a traced value is not known while tracing (a compiled layer "
                "runs on the device of the tensors it is given): pass it only as the device= "
                "of a tensor of constants")

    def _refuse(self, *args, **kwargs):
        raise DSLError(self._sarc_refusal(), user_loc())

    __eq__ = __ne__ = __str__ = __bool__ = __index__ = _refuse

    def __getattr__(self, name):
        self._refuse()

    def __repr__(self) -> str:
        return "<the device of a traced value>"


TRACED_DEVICE = TracedDevice()


_COMPARISONS = {"__eq__": "==", "__ne__": "!=", "__lt__": "<", "__le__": "<=",
                "__gt__": ">", "__ge__": ">="}
for _name, _sym in _COMPARISONS.items():
    setattr(Proxy, _name, _refuse(f"comparing traced values ({_sym}) is not supported: "
                                  f"{_NO_CONTROL_FLOW}; {_SELECT_HINT}"))

_INPLACE = {"__iadd__": "+", "__isub__": "-", "__imul__": "*", "__itruediv__": "/",
            "__ifloordiv__": "//", "__imod__": "%", "__ipow__": "**", "__imatmul__": "@",
            "__iand__": "&", "__ior__": "|", "__ixor__": "^", "__ilshift__": "<<",
            "__irshift__": ">>"}
for _name, _sym in _INPLACE.items():
    setattr(Proxy, _name, _refuse(
        f"in-place {_sym}= on a traced value is not supported (it would change every alias "
        f"of the value); write h = h {_sym} ..."))

_OPERATORS = {"__add__": "+", "__radd__": "+", "__sub__": "-", "__rsub__": "-",
              "__mul__": "*", "__rmul__": "*", "__truediv__": "/", "__rtruediv__": "/",
              "__rdiv__": "/", "__pow__": "**", "__rpow__": "**", "__matmul__": "@",
              "__rmatmul__": "@", "__neg__": "unary -", "__pos__": "unary +", "__abs__": "abs()",
              "__getitem__": "[]", "__floordiv__": "//", "__rfloordiv__": "//",
              "__mod__": "%", "__rmod__": "%", "__and__": "&", "__rand__": "&",
              "__or__": "|", "__ror__": "|", "__xor__": "^", "__rxor__": "^",
              "__invert__": "~", "__lshift__": "<<", "__rlshift__": "<<",
              "__rshift__": ">>", "__rrshift__": ">>"}


# --- traced functions: torch's signature, the arguments sarc models ------------------------

class Fixed:
    """The default of a torch argument sarc does not model: only this value is accepted."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Fixed({self.value!r})"


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    plain = (bool, int, float, str)
    return isinstance(value, plain) and isinstance(default, plain) and value == default


def _show(value: Any) -> str:
    if isinstance(value, (Proxy, torch.Tensor)):
        return "a traced value" if isinstance(value, Proxy) else "a tensor"
    return repr(value)


def _has_proxy(args: Iterable, kwargs: dict) -> bool:
    for x in (*args, *kwargs.values()):
        if isinstance(x, Proxy) or (isinstance(x, (list, tuple))
                                    and any(isinstance(y, Proxy) for y in x)):
            return True
    return False


class Traced:
    """A function the tracer records: torch's (or sarc's) signature and its recorder.

    ``record`` is written with the function's signature, the arguments sarc does not
    model defaulting to ``Fixed(default)``. A call is bound to that signature (an
    unknown argument is an error) and a ``Fixed`` argument given any other value is
    refused, so no argument is ever dropped. Called directly it is a DSL function
    (``sarc.linear``), checked the same way.
    """

    def __init__(self, record: Callable, name: str):
        functools.update_wrapper(self, record)
        self.record = record
        self.name = name
        self.signature = inspect.signature(record)
        self.fixed = {k: p.default.value for k, p in self.signature.parameters.items()
                      if isinstance(p.default, Fixed)}

    def __call__(self, *args, **kwargs):
        if not _has_proxy(args, kwargs):
            raise DSLError(f"{self.name} takes a traced value: call it in a sarc layer's "
                           f"message, reduce or update", user_loc())
        return self.call(self.name, args, kwargs)

    def call(self, name: str, args: tuple, kwargs: dict):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            via = _numpy_caller()
            hint = (f" (numpy.{via} called it with numpy's arguments: numpy functions are not "
                    f"traced; use the torch function or Tensor method, e.g. torch.sum(x, dim))"
                    if via else "")
            raise DSLError(f"{name}: {e}{hint}", user_loc()) from None
        for arg, default in self.fixed.items():
            if arg in bound.arguments and not _same(bound.arguments[arg], default):
                raise DSLError(f"{name}: argument {arg}={_show(bound.arguments[arg])} is not "
                               f"supported in a sarc layer (only {arg}={default!r})", user_loc())
        bound.apply_defaults()
        bound.arguments.update(self.fixed)
        out = self.record(*bound.args, **bound.kwargs)
        return out if torch.is_grad_enabled() else _without_grad(out)

    def __repr__(self) -> str:
        return f"<traced {self.name}{self.signature}>"


def _without_grad(out):
    """What a function computed under ``torch.no_grad()``, ``set_grad_enabled(False)`` or
    ``inference_mode()`` in the layer's code: its float values detached, as torch records no
    gradient through them (``sarc.trace_guards.tracing`` traces with gradients enabled)."""
    if isinstance(out, Proxy):
        return out.tracer.emit(Op.DETACH, [out]) if out.type.dtype.is_float else out
    if isinstance(out, (tuple, list)):
        items = [_without_grad(o) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


TORCH_FUNCTIONS: dict[Any, Traced] = {}
"""Every torch function, Tensor method and operator the tracer records."""


def traces(*funcs, name: str = "") -> Callable[[Callable], Traced]:
    """Register the decorated recorder for the torch functions ``funcs``."""
    def register(record: Callable) -> Traced:
        traced = Traced(record, name or record.__name__)
        for f in funcs:
            if TORCH_FUNCTIONS.get(f, traced) is not traced:
                raise AssertionError(f"{_torch_name(f)} is traced twice")
            TORCH_FUNCTIONS[f] = traced
        return traced
    return register


def call_torch(func, args: tuple, kwargs: dict):
    """Record the torch function ``func`` called on proxies; refuse one sarc does not trace."""
    traced = TORCH_FUNCTIONS.get(func)
    if traced is None:
        raise DSLError(_inside_torch_module(_unsupported(func), sys._getframe(1)),
                       user_loc())
    return traced.call(_torch_name(func), args, kwargs)


def _torch_name(func) -> str:
    """A torch function as the user wrote it: torch.sin, torch.nn.functional.gelu, Tensor.sin
    (not its C-level qualname, such as _VariableFunctionsClass.sin)."""
    name = getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    if (getattr(func, "__qualname__", None) or "").startswith(("TensorBase.", "Tensor.")):
        return f"the {_OPERATORS[name]} operator" if name in _OPERATORS else f"Tensor.{name}"
    if module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    return f"{module}.{name}" if module else name


def _unsupported(func) -> str:
    name = _torch_name(func)
    short = getattr(func, "__name__", "")
    if short == "isclose":
        return (f"{name} is not traced: write the condition itself, (a - b).abs() <= atol + "
                f"rtol * b.abs() (a comparison of traced values is)")
    if short in ("allclose", "equal"):
        return (f"{name} gives a Python bool of the values of traced tensors: "
                f"{_NO_CONTROL_FLOW}; {_SELECT_HINT}")
    if short in _COMPARISONS or func in _TORCH_COMPARISONS:
        sym = _COMPARISONS.get(short) or _TORCH_COMPARISONS[func]
        return (f"comparing traced values ({sym}) is not supported: {_NO_CONTROL_FLOW}; "
                f"{_SELECT_HINT}")
    if short == "where":
        return (f"{name} selects by a condition, which needs a comparison of traced values: "
                f"{_NO_CONTROL_FLOW}; {_SELECT_HINT}")
    if short in _INPLACE or short == "__setitem__" or (short.endswith("_")
                                                       and not short.endswith("__")):
        return (f"{name} is an in-place op, which a sarc layer does not support (it would "
                f"change every alias of the value)")
    if short in _OPERATORS:
        return f"{name} is not supported on a traced value"
    return f"torch function {name} is not supported in a sarc layer"


_TORCH_COMPARISONS = {f: sym for fname, sym in (
    ("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="),
    ("greater", ">"), ("greater_equal", ">="), ("less", "<"), ("less_equal", "<="),
    ("not_equal", "!="), ("equal", "=="), ("isclose", "=="), ("allclose", "=="),
) for f in (getattr(torch, fname, None), getattr(torch.Tensor, fname, None)) if f is not None}


# --- the training mode, as traced ---------------------------------------------------------

_TRAINING_MESSAGE = (
    "self.training is not known while tracing: a sarc layer compiles to one kernel for "
    "training and evaluation. Dropout follows the mode by itself (sarc.dropout, nn.Dropout, "
    "F.dropout(x, p, self.training)); other mode-dependent code belongs outside the layer")


_BATCH_NORM = (
    "batch norm normalizes by the batch's statistics while training and by its running "
    "statistics in evaluation. Build the conv without it (PyG CGConv(batch_norm=False), "
    "GENConv(norm='layer'); DGL EdgeConv(batch_norm=False)), use nn.LayerNorm, or apply the "
    "batch norm to the layer's output, outside the layer")


def _torch_module_at(frame) -> torch.nn.Module | None:
    """The innermost torch module (``torch.nn.*``) running between ``frame`` and the user's
    code: what a refusal inside torch's own code names (an ``nn.BatchNorm1d`` inside a conv,
    the ``nn.GRUCell`` a layer called)."""
    f = frame
    while f is not None and _is_library(f.f_code.co_filename):
        module = f.f_locals.get("self")
        if (isinstance(module, torch.nn.Module)
                and type(module).__module__.startswith("torch.nn.")):
            return module
        f = f.f_back
    return None


def _inside_torch_module(message: str, frame) -> str:
    """``message`` of a refusal reached inside a torch module, saying which: the op it names
    is the module's, not one the user wrote."""
    module = _torch_module_at(frame)
    if module is None:
        return message
    return (f"{message} (called inside nn.{type(module).__name__}, which sarc does not trace: "
            f"write its computation with the ops a layer supports)")


def _training_message(frame) -> str:
    """The refusal of reading the mode, naming the torch module that read it (from
    ``frame`` outwards, up to the user's code): an ``nn.BatchNorm1d`` inside a conv."""
    module = _torch_module_at(frame)
    if module is None:
        return _TRAINING_MESSAGE
    what = (_BATCH_NORM if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
            else "other mode-dependent code belongs outside the layer")
    return (f"nn.{type(module).__name__} reads self.training, which is not known while "
            f"tracing (a sarc layer compiles to one kernel for training and evaluation): {what}")


def _refuse_training(self, *args):
    raise DSLError(_training_message(sys._getframe(1)), user_loc())


class _TrainingMode:
    """What ``module.training`` reads while a layer is traced: not a bool, since the
    compiled layer serves both modes. Dropout takes it (and follows the mode at run time);
    Python control flow on it is refused, naming the torch module that read it."""

    __slots__ = ()
    __hash__ = object.__hash__
    __bool__ = __eq__ = __ne__ = __int__ = __index__ = __float__ = _refuse_training

    def __repr__(self) -> str:
        return "<the layer's training mode, as traced>"


TRAINING = _TrainingMode()


# The table fills TORCH_FUNCTIONS; the DSL's own functions are among its recorders.
from .trace_torch import concat, dropout, elu, leaky_relu, linear  # noqa: E402,F401
