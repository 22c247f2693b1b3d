"""Tracing: run the user's message / reduce / update on symbolic proxies to record IR.

A ``Proxy`` stands for one IR value. Arithmetic on proxies, the ``sarc.*``
functions and the torch functions listed in ``TORCH_FUNCTIONS`` (reached through
``__torch_function__``, so ``torch.nn.Linear`` and ``F.leaky_relu`` work as
written) append instructions to the tracer's builder. Every instruction records
the user's file and line, which every later error quotes.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .errors import DSLError, SourceLoc
from .ir.function import Builder
from .ir.ops import Op
from .ir.types import Domain, DType, TensorType

_SARC_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def user_loc() -> SourceLoc | None:
    """The innermost stack frame outside sarc and torch: the user's line."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not (path.startswith(_SARC_DIR + os.sep) or path.startswith(_TORCH_DIR + os.sep)):
            return SourceLoc(f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


class Tracer:
    """Owns the builder while one layer is traced."""

    def __init__(self, name: str):
        self.builder = Builder(name)

    def emit(self, op: Op, inputs: list["Proxy"], attrs: dict | None = None) -> "Proxy":
        for p in inputs:
            if p.tracer is not self:
                raise DSLError("a value from another layer's trace was used here", user_loc())
        idx = self.builder.add(op, [p.index for p in inputs], attrs, user_loc())
        return Proxy(self, idx)

    def const(self, value: float, like: "Proxy") -> "Proxy":
        t = TensorType(Domain.PARAM, like.type.dtype if like.type.dtype.is_float else DType.F32, ())
        return Proxy(self, self.builder.const(value, t, user_loc()))

    def lift(self, x: Any, like: "Proxy") -> "Proxy":
        """Turn a python number or 0-d tensor into a constant; reject other tensors."""
        if isinstance(x, Proxy):
            return x
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.const(float(x), like)
        if isinstance(x, torch.Tensor):
            if x.dim() == 0 and not x.requires_grad:
                return self.const(float(x), like)
            raise DSLError(
                f"a torch tensor of shape {list(x.shape)} that is not a parameter of the layer "
                f"is used here; declare it as an nn.Parameter (or a sarc layer input)",
                user_loc())
        raise DSLError(f"cannot use a {type(x).__name__} in a sarc layer", user_loc())


def _dim_to_axis(p: "Proxy", dim: int) -> int:
    """Map a torch dim (row axis first for graph values) to a feature axis."""
    t = p.type
    if t.domain is Domain.PARAM:
        return dim
    ndim = len(t.feat) + 1
    d = dim + ndim if dim < 0 else dim
    if d == 0:
        raise DSLError(f"dim {dim} is the row axis of {t.domain.article} value; aggregate "
                       f"over rows with sarc.sum/mean/max/min in reduce", user_loc())
    if not 0 < d < ndim:
        raise DSLError(f"dim {dim} is out of range for a value of shape {_shape(t)}", user_loc())
    return d - 1


def _shape(t: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in t.shape) + "]"


class _UnsupportedMethod(DSLError, AttributeError):
    """A DSLError that is also an AttributeError, so ``hasattr`` on a proxy stays False."""


class Proxy:
    """A symbolic tensor during tracing; rows first, as in torch."""

    __slots__ = ("tracer", "index")

    def __init__(self, tracer: Tracer, index: int):
        self.tracer = tracer
        self.index = index

    @property
    def type(self) -> TensorType:
        return self.tracer.builder.values[self.index].type

    @property
    def shape(self) -> tuple:
        return self.type.shape

    def dim(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"Proxy(%{self.index}: {self.type})"

    def __getattr__(self, name: str):
        # Reached only for names a Proxy lacks: say so for a torch.Tensor method sarc
        # does not trace, rather than "'Proxy' object has no attribute".
        if name.startswith("__") or not hasattr(torch.Tensor, name):
            raise AttributeError(f"'Proxy' object has no attribute {name!r}")
        raise _UnsupportedMethod(f"Tensor.{name} is not supported in a sarc layer", user_loc())

    def __bool__(self):
        raise DSLError("a traced value has no truth value: data-dependent control flow "
                       "cannot be compiled (use elementwise ops instead)", user_loc())

    # --- arithmetic -----------------------------------------------------------------
    def _bin(self, op: Op, other, reverse=False) -> "Proxy":
        other = self.tracer.lift(other, self)
        a, b = (other, self) if reverse else (self, other)
        return self.tracer.emit(op, [a, b])

    def __add__(self, o): return self._bin(Op.ADD, o)
    def __radd__(self, o): return self._bin(Op.ADD, o, True)
    def __sub__(self, o): return self._bin(Op.SUB, o)
    def __rsub__(self, o): return self._bin(Op.SUB, o, True)
    def __mul__(self, o): return self._bin(Op.MUL, o)
    def __rmul__(self, o): return self._bin(Op.MUL, o, True)
    def __truediv__(self, o): return self._bin(Op.DIV, o)
    def __rtruediv__(self, o): return self._bin(Op.DIV, o, True)
    def __neg__(self): return self.tracer.emit(Op.NEG, [self])

    def __pow__(self, exponent):
        if not isinstance(exponent, (int, float)):
            raise DSLError("only constant exponents are supported", user_loc())
        return self.tracer.emit(Op.POW, [self], {"exponent": float(exponent)})

    def __matmul__(self, other):
        other = self.tracer.lift(other, self)
        return self.tracer.emit(Op.MATMUL, [self, other])

    def __rmatmul__(self, other):
        raise DSLError("write x @ W with the traced value on the left (W a parameter)", user_loc())

    def __getitem__(self, idx):
        if isinstance(idx, Proxy):
            return self.tracer.emit(Op.INDEX, [self, idx])
        raise DSLError("only a parameter table indexed by an int64 node or edge value "
                       "(e.g. W[edge.etype]) is supported; slicing is not", user_loc())

    # --- methods as on torch tensors --------------------------------------------------
    def exp(self): return self.tracer.emit(Op.EXP, [self])
    def log(self): return self.tracer.emit(Op.LOG, [self])
    def relu(self): return self.tracer.emit(Op.RELU, [self])
    def sigmoid(self): return self.tracer.emit(Op.SIGMOID, [self])
    def tanh(self): return self.tracer.emit(Op.TANH, [self])
    def clamp_min(self, min: float):
        return self.tracer.emit(Op.CLAMP_MIN, [self], {"min": float(min)})

    def clamp(self, min: float | None = None, max: float | None = None):
        if max is not None or min is None:
            raise DSLError("only clamp(min=...) is supported", user_loc())
        return self.clamp_min(min)

    def sqrt(self): return self ** 0.5
    def rsqrt(self): return self ** -0.5

    def sum(self, dim: int | None = None, keepdim: bool = False):
        if dim is None:
            raise DSLError("sum over all axes is not supported; name a feature dim", user_loc())
        out = self.tracer.emit(Op.SUM_AXIS, [self], {"axis": _dim_to_axis(self, dim)})
        return out.unsqueeze(dim) if keepdim else out

    def mean(self, dim: int | None = None, keepdim: bool = False):
        if dim is None:
            raise DSLError("mean over all axes is not supported; name a feature dim", user_loc())
        t = self.type
        axis = _dim_to_axis(self, dim)
        return self.sum(dim, keepdim) / float(t.feat[axis] if t.domain is not Domain.PARAM else t.feat[dim])

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        t = self.type
        if t.domain is Domain.PARAM:
            feat = _resolve_minus_one(shape, t.feat)
        else:
            if not shape or shape[0] != -1:
                raise DSLError("reshape a graph value with -1 as its first dim (the row axis), "
                               f"e.g. x.view(-1, heads, dim); got {list(shape)}", user_loc())
            feat = _resolve_minus_one(shape[1:], t.feat)
        return self.tracer.emit(Op.RESHAPE, [self], {"feat": feat})

    view = reshape

    def unsqueeze(self, dim: int):
        t = self.type
        full = list(t.shape)
        d = dim + len(full) + 1 if dim < 0 else dim
        if t.domain is not Domain.PARAM and d == 0:
            raise DSLError("cannot insert an axis before the row axis", user_loc())
        full.insert(d, 1)
        feat = tuple(full) if t.domain is Domain.PARAM else tuple(full[1:])
        return self.tracer.emit(Op.RESHAPE, [self], {"feat": feat})

    def flatten(self, start_dim: int = 1):
        t = self.type
        if t.domain is Domain.PARAM:
            raise DSLError("flatten of a parameter is not supported; use reshape", user_loc())
        a = _dim_to_axis(self, start_dim)
        n = 1
        for d in t.feat[a:]:
            n *= d
        return self.tracer.emit(Op.RESHAPE, [self], {"feat": (*t.feat[:a], n)})

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = TORCH_FUNCTIONS.get(func)
        if handler is None:
            raise DSLError(f"torch function {_torch_name(func)} is not supported in a sarc layer",
                           user_loc())
        return handler(*args, **kwargs)


def _torch_name(func) -> str:
    """A torch function as the user wrote it: torch.sin, torch.nn.functional.gelu, Tensor.sin
    (not its C-level qualname, such as _VariableFunctionsClass.sin)."""
    name = getattr(func, "__name__", None) or repr(func)
    module = getattr(func, "__module__", None)
    if (getattr(func, "__qualname__", None) or "").startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    if module == "torch._C._nn":
        return f"torch.nn.functional.{name}"
    return f"{module}.{name}" if module else name


def _resolve_minus_one(shape, feat: tuple[int, ...]) -> tuple[int, ...]:
    shape = [int(s) for s in shape]
    total = 1
    for d in feat:
        total *= d
    if shape.count(-1) > 1:
        raise DSLError("at most one -1 in a feature reshape", user_loc())
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = total // known if known else 0
    return tuple(shape)


def _first_proxy(*xs) -> Proxy:
    for x in xs:
        if isinstance(x, Proxy):
            return x
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, Proxy):
                    return y
    raise AssertionError("no proxy among the arguments")


def _unary(op: Op) -> Callable:
    def fn(x, *rest, **kw):
        return x.tracer.emit(op, [x])
    return fn


def _binary(op: Op) -> Callable:
    def fn(a, b, *rest, **kw):
        p = _first_proxy(a, b)
        return p.tracer.emit(op, [p.tracer.lift(a, p), p.tracer.lift(b, p)])
    return fn


# --- the DSL's functions (also reachable as torch functions) ---------------------------

def linear(x: Proxy, weight, bias=None) -> Proxy:
    """``x @ weight.T + bias``, weight ``[out, in]`` as in torch.nn.Linear."""
    p = _first_proxy(x, weight)
    if not isinstance(x, Proxy) or not isinstance(weight, Proxy):
        raise DSLError("linear needs a traced input and a parameter weight", user_loc())
    y = p.tracer.emit(Op.LINEAR, [x, weight])
    return y if bias is None else y + bias


def leaky_relu(x: Proxy, negative_slope: float = 0.01, inplace: bool = False) -> Proxy:
    return x.tracer.emit(Op.LEAKY_RELU, [x], {"slope": float(negative_slope)})


def elu(x: Proxy, alpha: float = 1.0, inplace: bool = False) -> Proxy:
    return x.tracer.emit(Op.ELU, [x], {"alpha": float(alpha)})


def dropout(x: Proxy, p: float = 0.5, training: bool = True, inplace: bool = False) -> Proxy:
    """Dropout with rate ``p``, active while the compiled layer is in training mode."""
    if not 0.0 <= p < 1.0:
        raise DSLError(f"dropout rate must be in [0, 1), got {p}", user_loc())
    # The key (the dropout's rank in the trace) names its mask stream; see sarc.ir.rng.
    key = sum(1 for v in x.tracer.builder.values if v.op is Op.DROPOUT)
    return x.tracer.emit(Op.DROPOUT, [x], {"p": float(p), "key": key})


def concat(xs, dim: int = -1) -> Proxy:
    xs = list(xs)
    p = _first_proxy(xs)
    xs = [p.tracer.lift(x, p) for x in xs]
    return p.tracer.emit(Op.CONCAT, xs, {"axis": _dim_to_axis(p, dim)})


def matmul(a, b) -> Proxy:
    p = _first_proxy(a, b)
    return p.tracer.emit(Op.MATMUL, [p.tracer.lift(a, p), p.tracer.lift(b, p)])


def _sum(x, dim=None, keepdim=False, **kw):
    if dim is None:
        raise DSLError("sum over all axes is not supported; name a feature dim", user_loc())
    return x.sum(dim, keepdim)


def _pow(x, exponent):
    return x ** exponent


def _method(name: str) -> Callable:
    def fn(x, *args, **kw):
        return getattr(x, name)(*args, **kw)
    return fn


TORCH_FUNCTIONS: dict[Any, Callable] = {
    F.linear: linear,
    F.leaky_relu: leaky_relu,
    F.elu: elu,
    F.dropout: dropout,
    torch.cat: concat,
    torch.concat: concat,
    torch.matmul: matmul,
    torch.sum: _sum,
    torch.pow: _pow,
    torch.Tensor.__matmul__: matmul,
    torch.Tensor.__getitem__: lambda t, i: Proxy.__getitem__(t, i),
    torch.Tensor.reshape: _method("reshape"),
    torch.Tensor.view: _method("reshape"),
    torch.Tensor.unsqueeze: _method("unsqueeze"),
    torch.Tensor.flatten: _method("flatten"),
    torch.Tensor.sum: _sum,
    torch.mean: _method("mean"),
    torch.Tensor.mean: _method("mean"),
    torch.clamp_min: _method("clamp_min"),
    torch.Tensor.clamp_min: _method("clamp_min"),
    torch.clamp: _method("clamp"),
    torch.Tensor.clamp: _method("clamp"),
    torch.rsqrt: _method("rsqrt"),
    torch.Tensor.rsqrt: _method("rsqrt"),
    torch.sqrt: _method("sqrt"),
    torch.Tensor.sqrt: _method("sqrt"),
}
for _op, _fns in {
    Op.EXP: (torch.exp, torch.Tensor.exp),
    Op.LOG: (torch.log, torch.Tensor.log),
    Op.RELU: (torch.relu, F.relu, torch.Tensor.relu),
    Op.SIGMOID: (torch.sigmoid, F.sigmoid, torch.Tensor.sigmoid),
    Op.TANH: (torch.tanh, F.tanh, torch.Tensor.tanh),
    Op.NEG: (torch.neg, torch.Tensor.neg, torch.Tensor.__neg__),
}.items():
    for _f in _fns:
        TORCH_FUNCTIONS[_f] = _unary(_op)
for _op, _fns in {
    Op.ADD: (torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__),
    Op.SUB: (torch.sub, torch.Tensor.sub, torch.Tensor.__sub__),
    Op.MUL: (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__),
    Op.DIV: (torch.div, torch.Tensor.div, torch.Tensor.__truediv__),
}.items():
    for _f in _fns:
        TORCH_FUNCTIONS[_f] = _binary(_op)
TORCH_FUNCTIONS[torch.Tensor.__rsub__] = lambda a, b: _binary(Op.SUB)(b, a)
TORCH_FUNCTIONS[torch.Tensor.__rtruediv__] = lambda a, b: _binary(Op.DIV)(b, a)
