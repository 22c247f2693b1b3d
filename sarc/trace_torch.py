"""The torch functions the tracer records: ``TORCH_FUNCTIONS``, one recorder each.

Each recorder is written with torch's signature of the function it records (see
``sarc.trace.Traced``): an argument it models is honoured exactly (``alpha`` of
``torch.add``, ``training`` of ``F.dropout``), one it does not defaults to
``Fixed(torch's default)`` and any other value is refused at the user's line.
torch parses the arguments of its C functions itself before ``__torch_function__``,
so an argument torch does not have never reaches a recorder.

The DSL's own functions (``sarc.linear``, ``sarc.dropout``, ...) are recorders too,
checked the same way when called directly.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .errors import DSLError
from .ir.ops import INTEGER_HINT, Op
from .ir.types import Domain, DType, TensorType
from .trace import (_OPERATORS, INTEGER_CONVERSION, TORCH_FUNCTIONS, TRAINING, Fixed, Proxy,
                    RowCount, TRACED_DEVICE, _is_int,
                    _is_number, _kind, _number, _shape, _torch_name, _traced, call_torch,
                    traces, user_loc)


# --- axes ---------------------------------------------------------------------------------

class AcrossRowsError(DSLError):
    """``operation`` works across the rows of a node or edge value, which a layer, computed
    row by row, cannot: a front end that traces the user's code at other rows than the code
    reads (PyG's forward, traced at each end of an edge) says it in the user's terms."""

    def __init__(self, operation: str, problem: str):
        self.operation = operation
        super().__init__(f"{operation}{problem}", user_loc())


def _dim_to_axis(p: "Proxy", dim: Any) -> int:
    """Map a torch dim (row axis first for graph values) to a feature axis (>= 0)."""
    t = p.type
    if not _is_int(dim):
        raise DSLError(f"dim must be an int, got {_kind(dim)}", user_loc())
    ndim = len(t.shape)
    d = dim + ndim if dim < 0 else dim
    if t.domain is not Domain.PARAM and d == 0:
        raise AcrossRowsError(
            f"dim {dim}", f" is the row axis of {t.domain.article} value: a layer "
            f"computes row by row, so an operation across rows is an aggregation: over each "
            f"node's edges, in reduce (sarc.sum/mean/max/min); over the whole graph, outside "
            f"the layer (in the model's forward)")
    if not 0 <= d < ndim:
        raise DSLError(f"dim {dim} is out of range for a value of shape {_shape(t)}", user_loc())
    return d if t.domain is Domain.PARAM else d - 1


def _feature_axes(p: "Proxy", dim: Any, what: str) -> list[int]:
    """The sorted feature axes named by ``dim`` (an int or a tuple / list of them)."""
    if dim is None or (isinstance(dim, (tuple, list)) and not dim):
        raise DSLError(f"{what} over all axes is not supported; name a feature dim (the rows "
                       f"are among all axes: a layer computes each row by itself, so neither a "
                       f"value over every row nor Python control flow on one, `if h.sum() > 0:`, "
                       f"is modelled)", user_loc())
    dims = list(dim) if isinstance(dim, (tuple, list, torch.Size)) else [dim]
    axes = [_dim_to_axis(p, d) for d in dims]
    if len(set(axes)) != len(axes):
        raise DSLError(f"{what}: dim {dims} names an axis twice", user_loc())
    return sorted(axes)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


# --- the table ------------------------------------------------------------------------------

def _emit(op: Op, x: "Proxy", **attrs) -> "Proxy":
    return x.tracer.emit(op, [x], attrs)


def _first_proxy(*xs) -> Proxy:
    for x in xs:
        if isinstance(x, Proxy):
            return x
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, Proxy):
                    return y
    raise DSLError("no traced value among the arguments", user_loc())


def _arith(op: Op, a, b) -> Proxy:
    p = _first_proxy(a, b)
    xs = [p.tracer.lift(a, p), p.tracer.lift(b, p)]
    for x in xs:
        if not x.type.dtype.is_float:
            raise DSLError(_integer_arithmetic(x), user_loc())
    if all(is_condition(x) for x in xs):
        raise DSLError("arithmetic of two conditions (comparisons' results), which torch "
                       "computes as bools: combine them with &, | and ~, or convert one with "
                       ".float() first", user_loc())
    out = p.tracer.emit(op, xs)
    if op in (Op.ADD, Op.SUB, Op.MUL) and all(_whole(v) for v in (a, b)):
        _integral(out)   # cond * 2, torch.where(c, 1, 0) + 1: int64 in torch
    return out


_READ_AS = {Op.GATHER_SRC: "src", Op.GATHER_DST: "dst"}


def _integer_read(x: Proxy) -> str | None:
    """The feature an integer value reads (``edge.etype``), through reshapes and gathers."""
    values = x.tracer.builder.values
    v, role = values[x.index], None
    while v.op is Op.RESHAPE or v.op in _READ_AS:   # edge.etype.unsqueeze(-1), src.ntype
        role = role or _READ_AS.get(v.op)
        v = values[v.inputs[0]]
    return f"{role or v.type.domain.value}.{v.attr['name']}" if v.op is Op.INPUT else None


def _integer_arithmetic(x: Proxy) -> str:
    """The error for arithmetic on an integer value, naming the feature it reads."""
    read = _integer_read(x)
    what = (f"{read} is an integer feature ({x.type.dtype.value}) and" if read
            else f"an integer ({x.type.dtype.value}) value")
    return f"{what} is used in arithmetic: {INTEGER_HINT}"


# The DSL's functions (sarc.linear, ...), also the recorders of their torch namesakes.

@traces(F.linear, name="sarc.linear")
def linear(input, weight, bias=None) -> Proxy:
    """``input @ weight.T + bias``, weight ``[out, in]`` as in torch.nn.Linear."""
    if not isinstance(input, Proxy) or not isinstance(weight, Proxy):
        raise DSLError("linear needs a traced input and a parameter weight", user_loc())
    y = input.tracer.emit(Op.LINEAR, [input, weight])
    return y if bias is None else y + _cast_by_autocast(bias)


def _cast_by_autocast(x):
    """``x`` as an operand of a matmul under ``torch.autocast``: autocast casts every float
    operand of a linear or an addmm but a double to its low dtype, the bias among them,
    so the sum is in the low dtype however sarc's passes then place the add (the linear
    distributed over a difference, its bias summed over edges). The IR's type is ``x``'s:
    without autocast the cast does nothing."""
    if isinstance(x, Proxy) and x.type.dtype in (DType.F32, *_HALF):
        return _emit(Op.CAST, x, dtype=x.type.dtype, autocast=True)
    return x


@traces(F.leaky_relu, name="sarc.leaky_relu")
def leaky_relu(input, negative_slope=0.01, inplace=Fixed(False)) -> Proxy:
    return _emit(Op.LEAKY_RELU, _traced(input, "leaky_relu"),
                 slope=_number(negative_slope, "negative_slope"))


@traces(F.elu, name="sarc.elu")
def elu(input, alpha=1.0, inplace=Fixed(False)) -> Proxy:
    return _emit(Op.ELU, _traced(input, "elu"), alpha=_number(alpha, "alpha"))


@traces(name="sarc.dropout")
def dropout(input, p=0.5) -> Proxy:
    """Dropout with rate ``p``, active while the compiled layer trains (as nn.Dropout)."""
    x = _traced(input, "dropout")
    p = _number(p, "the dropout rate")
    if not 0.0 <= p < 1.0:
        raise DSLError(f"dropout rate must be in [0, 1), got {p}", user_loc())
    # The key (the dropout's rank in the trace) names its mask stream; see sarc.ir.rng.
    key = sum(1 for v in x.tracer.builder.values if v.op is Op.DROPOUT)
    return _emit(Op.DROPOUT, x, p=p, key=key)


@traces(name="sarc.concat")
def concat(tensors, dim=-1) -> Proxy:
    """Concatenate along ``dim`` (default: the last feature axis)."""
    return _concat(tensors, dim)


def _concat(tensors, dim) -> Proxy:
    if not isinstance(tensors, (list, tuple)):
        raise DSLError(f"concat takes a list of values, got {_kind(tensors)}", user_loc())
    p = _first_proxy(tensors)
    axis = _dim_to_axis(p, dim)
    for x in tensors:
        if isinstance(x, EmptyRows):
            x.check_piece(p, axis)
    xs = [p.tracer.lift(x, p) for x in tensors if not isinstance(x, EmptyRows)]
    return xs[0] if len(xs) == 1 else p.tracer.emit(Op.CONCAT, xs, {"axis": axis})


class EmptyRows:
    """A tensor of constants over a graph's rows with an empty feature axis
    (``feat.new_zeros((N, out - in))`` where ``out == in``: DGL's GatedGraphConv pads its
    input so): it holds no value, so ``torch.cat`` drops it and anything else refuses it."""

    def __init__(self, domain: Domain, feat: tuple[int, ...], written: str):
        object.__setattr__(self, "_about", (domain, tuple(feat), written))

    def _sarc_refusal(self) -> str:
        return (f"{self._about[2]}: an empty feature axis is supported only as a piece of "
                f"torch.cat, which drops it")

    def check_piece(self, like: Proxy, axis: int) -> None:
        """Refused as a piece of ``like``'s concatenation along ``axis`` unless it is empty
        along that axis, of ``like``'s rows and other sizes (as torch checks)."""
        domain, feat, written = self._about
        want = list(like.type.feat)
        if len(want) == len(feat):
            want[axis] = 0
        if domain is not like.type.domain or tuple(want) != feat:
            raise DSLError(f"torch.cat of {written} (rows {domain.rows}, feature shape "
                           f"{list(feat)}) with a value of rows {like.type.domain.rows}, "
                           f"feature shape {list(like.type.feat)}: the sizes differ off the "
                           f"axis joined", user_loc())

    def __getattr__(self, name):
        raise DSLError(self._sarc_refusal(), user_loc())


# The torch functions.

@traces(F.dropout)
def _f_dropout(input, p=0.5, training=True, inplace=Fixed(False)):
    """``training=self.training`` (or nn.Dropout): sarc's dropout, which follows the layer's
    mode at run time; ``training=False``: the identity; ``training=True`` would drop in
    evaluation too: refused."""
    if training is TRAINING:   # F.dropout(x, p, self.training), nn.Dropout
        return dropout.record(input, p)
    if type(training) in (bool, int):
        if training:
            raise DSLError(
                "F.dropout with training=True drops in evaluation too, which a sarc layer does "
                "not model: pass training=self.training (dropout while the layer trains, as "
                "nn.Dropout) or use sarc.dropout(x, p)", user_loc())
        if not 0.0 <= _number(p, "the dropout rate") <= 1.0:
            raise DSLError(f"dropout rate must be in [0, 1], got {p}", user_loc())
        return input
    raise DSLError(f"F.dropout: training must be a bool or self.training, got {_kind(training)}",
                   user_loc())


@traces(torch.cat, torch.concat, torch.concatenate)
def _cat(tensors, dim=0, *, out=Fixed(None)):
    return _concat(tensors, dim)


def _scaled(other, alpha):
    alpha = _number(alpha, "alpha")
    return other if alpha == 1.0 else other * alpha


@traces(torch.add, torch.Tensor.add)
def _add(input, other, *, alpha=1, out=Fixed(None)):
    return _arith(Op.ADD, input, _scaled(other, alpha))


@traces(torch.sub, torch.subtract, torch.Tensor.sub, torch.Tensor.subtract)
def _sub(input, other, *, alpha=1, out=Fixed(None)):
    return _arith(Op.SUB, input, _scaled(other, alpha))


@traces(torch.mul, torch.multiply, torch.Tensor.mul, torch.Tensor.multiply)
def _mul(input, other, *, out=Fixed(None)):
    return _arith(Op.MUL, input, other)


@traces(torch.div, torch.divide, torch.Tensor.div, torch.Tensor.divide)
def _div(input, other, *, rounding_mode=Fixed(None), out=Fixed(None)):
    return _arith(Op.DIV, input, other)


@traces(torch.true_divide, torch.Tensor.true_divide)
def _true_divide(dividend, divisor, *, out=Fixed(None)):
    return _arith(Op.DIV, dividend, divisor)


def _operator(op: Op, reverse: bool) -> Callable:
    def record(input, other):
        return _arith(op, other, input) if reverse else _arith(op, input, other)
    return record


for _op, _fwd, _rev in ((Op.ADD, "__add__", "__radd__"), (Op.SUB, "__sub__", "__rsub__"),
                        (Op.MUL, "__mul__", "__rmul__"),
                        (Op.DIV, "__truediv__", "__rtruediv__")):
    traces(getattr(torch.Tensor, _fwd))(_operator(_op, False))
    traces(getattr(torch.Tensor, _rev))(_operator(_op, True))


def _power(base, exponent) -> Proxy:
    if isinstance(base, Proxy):
        if isinstance(exponent, Proxy):
            raise DSLError("a traced value to a traced power is not supported; only constant "
                           "exponents are (or a constant positive base)", user_loc())
        return _emit(Op.POW, base, exponent=_number(exponent, "the exponent"))
    b = _number(base, "the base of a traced power")
    if not b > 0.0:
        raise DSLError(f"{b:g} ** (a traced value) is not supported: a constant base must be "
                       f"positive (it is computed as exp(x * log(base)))", user_loc())
    return (exponent * math.log(b)).exp()


@traces(torch.pow, torch.Tensor.pow)
def _pow(input, exponent, *, out=Fixed(None)):
    return _power(input, exponent)


@traces(torch.Tensor.__pow__)
def _pow_operator(input, exponent):
    return _power(input, exponent)


@traces(torch.Tensor.__rpow__)
def _rpow_operator(input, other):
    return _power(other, input)


def _product(input, other, written: str) -> Proxy:
    """``input @ other``: by a matrix parameter (a matmul), by a vector parameter, which
    torch contracts with input's last axis (``x @ w``, w [d]: one number per row and head),
    or of two graph values of as many axes, at least 3: a matrix product per row (and per
    further batch axis), as torch batches it (``x_j.unsqueeze(1) @ w``, w [E, in, out] a
    weight per edge: PyG's NNConv)."""
    if isinstance(input, Proxy) and isinstance(other, Proxy) \
            and other.type.domain is Domain.PARAM and len(other.type.feat) == 1:
        letters = _LETTERS[:len(input.shape)]
        return _contracted(f"{letters},{letters[-1]}->{letters[:-1]}", [input, other], written)
    if isinstance(input, Proxy) and isinstance(other, Proxy) \
            and Domain.PARAM not in (input.type.domain, other.type.domain) \
            and len(input.shape) == len(other.shape) >= 3:
        batch = _LETTERS[:len(input.shape) - 2]
        i, j, k = _LETTERS[len(batch):len(batch) + 3]
        return _contracted(f"{batch}{i}{j},{batch}{j}{k}->{batch}{i}{k}", [input, other],
                           written)
    return _arith(Op.MATMUL, input, other)


@traces(torch.matmul, torch.Tensor.matmul)
def _matmul(input, other, *, out=Fixed(None)):
    return _product(input, other, "torch.matmul")


@traces(torch.Tensor.__matmul__)
def _matmul_operator(input, other):
    return _product(input, other, "the @ operator")


@traces(torch.mm, torch.Tensor.mm)
def _mm(input, mat2, *, out=Fixed(None)):
    """``torch.mm``: the matmul of two matrices, which torch checks first (a graph value's
    row axis counts, so ``x @ W`` of per-row vectors)."""
    if any(isinstance(a, (Proxy, torch.Tensor)) and a.dim() != 2 for a in (input, mat2)):
        shapes = [_shape(a.type) if isinstance(a, Proxy) else list(a.shape) for a in (input, mat2)]
        raise DSLError(f"mm takes two matrices, got {shapes[0]} and {shapes[1]}; use x @ W "
                       f"(torch.matmul) for more axes", user_loc())
    return _arith(Op.MATMUL, input, mat2)


@traces(torch.Tensor.__rmatmul__)
def _rmatmul_operator(input, other):
    raise DSLError("write x @ W with the traced value on the left (W a parameter)", user_loc())


def _elementwise(op: Op, fixed: str = "out") -> Callable:
    """The recorder of a unary op, with torch's signature: ``(input, *, out=None)``,
    ``(input, inplace=False)`` (torch.nn.functional) or ``(input)``."""
    if fixed == "out":
        def record(input, *, out=Fixed(None)):
            return _emit(op, _traced(input, op.value))
    elif fixed == "inplace":
        def record(input, inplace=Fixed(False)):
            return _emit(op, _traced(input, op.value))
    else:
        def record(input):
            return _emit(op, _traced(input, op.value))
    return record


for _op, _fns in {
    Op.EXP: (torch.exp, torch.Tensor.exp),
    Op.LOG: (torch.log, torch.Tensor.log),
    Op.RELU: (torch.relu, torch.Tensor.relu),
    Op.SIGMOID: (torch.sigmoid, torch.Tensor.sigmoid),
    Op.TANH: (torch.tanh, torch.Tensor.tanh),
    Op.ERF: (torch.erf, torch.special.erf, torch.Tensor.erf),
    Op.COS: (torch.cos, torch.Tensor.cos),
    Op.SIN: (torch.sin, torch.Tensor.sin),
    Op.LOG1P: (torch.log1p, torch.special.log1p, torch.Tensor.log1p),
    Op.NEG: (torch.neg, torch.negative, torch.Tensor.neg, torch.Tensor.negative,
             torch.Tensor.__neg__),
}.items():
    traces(*_fns)(_elementwise(_op))
traces(F.relu)(_elementwise(Op.RELU, "inplace"))
traces(F.sigmoid)(_elementwise(Op.SIGMOID, ""))
traces(F.tanh)(_elementwise(Op.TANH, ""))


# Activations composed of the ops above: every backend runs them, and autodiff gives
# torch's own gradient formulas.

_HALF = (DType.F16, DType.BF16)


def _widened(x):
    """A float16 / bfloat16 value as float32 (others as they are): what torch computes layer
    norm, softmax and GELU of half tensors in, rounding the result once (on CPU and CUDA)."""
    if isinstance(x, Proxy) and x.type.dtype in _HALF:
        return _emit(Op.CAST, x, dtype=DType.F32)
    return x


def _narrowed(y: Proxy, like: Proxy) -> Proxy:
    """``y`` (computed by ``_widened``) back in ``like``'s dtype."""
    return y if y.type.dtype is like.type.dtype else _emit(Op.CAST, y, dtype=like.type.dtype)

@traces(F.gelu)
def _gelu(input, approximate="none"):
    """``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"`` torch's tanh form."""
    given = _traced(input, "gelu")
    x = _widened(given)   # the tanh form's cube overflows float16 past 40
    if approximate == "none":
        return _narrowed(0.5 * x * (1.0 + _emit(Op.ERF, x * (1.0 / math.sqrt(2.0)))), given)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return _narrowed(0.5 * x * (1.0 + _emit(Op.TANH, inner)), given)
    raise DSLError(f"F.gelu: approximate must be 'none' or 'tanh', got {approximate!r}",
                   user_loc())


@traces(F.silu, torch.nn.functional.silu)
def _silu(input, inplace=Fixed(False)):
    x = _traced(input, "silu")
    return x * _emit(Op.SIGMOID, x)


@traces(F.softplus)
def _softplus(input, beta=1.0, threshold=20.0):
    """torch's ``log(1 + exp(beta x)) / beta``, and ``x`` where ``beta x > threshold``: one
    op (``Op.SOFTPLUS``), which each backend computes as torch's kernel does, in one pass
    (CFConv's shifted softplus over the edges was thirteen)."""
    x = _traced(input, "softplus")
    beta, threshold = _number(beta, "softplus's beta"), _number(threshold, "softplus's threshold")
    return _emit(Op.SOFTPLUS, x, beta=beta, threshold=threshold)


@traces(F.layer_norm)
def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last ``normalized_shape``
    feature axes (the biased variance, as torch); a half value's in float32, rounded once,
    as torch (its squares would overflow float16 past magnitude 256)."""
    given = _traced(input, "layer_norm")
    x, weight, bias = _widened(given), _widened(weight), _widened(bias)
    shape = (normalized_shape,) if _is_int(normalized_shape) else tuple(normalized_shape)
    feat = x.type.feat
    if not shape or len(shape) > len(feat) or tuple(feat[len(feat) - len(shape):]) != shape:
        raise DSLError(f"layer_norm over {list(shape)}: the value's feature shape "
                       f"{list(feat)} does not end with it", user_loc())
    axes = list(range(len(feat) - len(shape), len(feat)))
    n = float(_prod(shape))
    centered = x - _sum_axes(x, axes, True) / n
    var = _sum_axes(centered * centered, axes, True) / n
    # a division by the square root, not a product with its reciprocal: the reciprocal's
    # derivative, (var + eps)^-1.5, overflows half precision where the variance is 0
    out = centered / _emit(Op.POW, var + _number(eps, "layer_norm's eps"), exponent=0.5)
    if weight is not None:
        out = out * weight
    return _narrowed(out if bias is None else out + bias, given)


# --- recurrent cells: nn.GRUCell, nn.LSTMCell, nn.RNNCell (a GGNN's or an MPNN's update) ---
# Each as ATen computes it on the CPU (RNN.cpp's GRUCell, LSTMCell, SimpleCell): the input's
# and the state's linears, gates from their chunks, in torch's order of operations.

def _cell_linears(input, hx, w_ih, w_hh, b_ih, b_hh, what: str, gates: int):
    x = _traced(input, what)
    h = x.tracer.lift(hx, x)
    if len(h.type.feat) != 1 or len(x.type.feat) != 1:
        raise DSLError(f"{what}: the input and the state are rows of one feature axis, got "
                       f"{list(x.type.feat)} and {list(h.type.feat)}", user_loc())
    return linear.record(x, w_ih, b_ih), linear.record(h, w_hh, b_hh), h


@traces(torch.gru_cell)
def _gru_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """``r, z = sigmoid(h_r + i_r), sigmoid(h_z + i_z)``, ``n = tanh(i_n + h_n r)``,
    ``h' = (h - n) z + n``."""
    gi, gh, h = _cell_linears(input, hx, w_ih, w_hh, b_ih, b_hh, "gru_cell", 3)
    i_r, i_z, i_n = _chunk.record(gi, 3, -1)
    h_r, h_z, h_n = _chunk.record(gh, 3, -1)
    r = _emit(Op.SIGMOID, h_r + i_r)
    z = _emit(Op.SIGMOID, h_z + i_z)
    n = _emit(Op.TANH, i_n + h_n * r)
    return (h - n) * z + n


@traces(torch.lstm_cell)
def _lstm_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    """``i, f, g, o`` the chunks of both linears' sum (sigmoid, sigmoid, tanh, sigmoid);
    ``c' = f c + i g``, ``h' = o tanh(c')``; returns ``(h', c')``."""
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise DSLError(f"lstm_cell: the state is a pair (h, c), got {_kind(hx)}", user_loc())
    gi, gh, _ = _cell_linears(input, hx[0], w_ih, w_hh, b_ih, b_hh, "lstm_cell", 4)
    c = gh.tracer.lift(hx[1], gh)
    i, f, g, o = _chunk.record(gh + gi, 4, -1)
    c_next = _emit(Op.SIGMOID, f) * c + _emit(Op.SIGMOID, i) * _emit(Op.TANH, g)
    return _emit(Op.SIGMOID, o) * _emit(Op.TANH, c_next), c_next


@traces(torch.rnn_tanh_cell)
def _rnn_tanh_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    gi, gh, _ = _cell_linears(input, hx, w_ih, w_hh, b_ih, b_hh, "rnn_tanh_cell", 1)
    return _emit(Op.TANH, gh + gi)


@traces(torch.rnn_relu_cell)
def _rnn_relu_cell(input, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    gi, gh, _ = _cell_linears(input, hx, w_ih, w_hh, b_ih, b_hh, "rnn_relu_cell", 1)
    return _emit(Op.RELU, gh + gi)


@traces(torch.positive, torch.Tensor.positive, torch.Tensor.__pos__)
def _positive(input):
    return _traced(input, "positive")


@traces(torch.abs, torch.absolute, torch.Tensor.abs, torch.Tensor.absolute,
        torch.Tensor.__abs__)
def _abs(input, *, out=Fixed(None)):
    """``|x| = relu(x) + relu(-x)``: exact (one term is 0), gradient sign(x) as torch's."""
    x = _traced(input, "abs")
    return x.relu() + (-x).relu()


@traces(torch.reciprocal, torch.Tensor.reciprocal)
def _reciprocal(input, *, out=Fixed(None)):
    x = _traced(input, "reciprocal")
    return 1.0 / x


@traces(torch.sqrt, torch.Tensor.sqrt)
def _sqrt(input, *, out=Fixed(None)):
    return _emit(Op.POW, _traced(input, "sqrt"), exponent=0.5)


@traces(torch.rsqrt, torch.Tensor.rsqrt)
def _rsqrt(input, *, out=Fixed(None)):
    return _emit(Op.POW, _traced(input, "rsqrt"), exponent=-0.5)


@traces(torch.clamp_min, torch.Tensor.clamp_min)
def _clamp_min(input, min, *, out=Fixed(None)):
    if isinstance(min, Proxy):   # a traced bound: clamp's
        return _clamp.record(input, min, None)
    return _emit(Op.CLAMP_MIN, _traced(input, "clamp_min"), min=_number(min, "clamp's min"))


@traces(torch.clamp_max, torch.Tensor.clamp_max)
def _clamp_max(input, max, *, out=Fixed(None)):
    """``-clamp_min(-x, -max)``: torch's gradient too (it passes where x <= max)."""
    if isinstance(max, Proxy):   # a traced bound: clamp's
        return _clamp.record(input, None, max)
    x = _traced(input, "clamp_max")
    return -_emit(Op.CLAMP_MIN, -x, min=-_number(max, "clamp's max"))


@traces(torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip)
def _clamp(input, min=None, max=None, *, out=Fixed(None)):
    """Number bounds: clamp_min / clamp_max. A traced bound (a parameter, another value):
    the bound where x passes it, else x, each side getting torch's gradient (x's where
    min <= x <= max, a bound's where x passes it); NaN stays."""
    if min is None and max is None:
        raise DSLError("clamp needs min=... or max=...", user_loc())
    if isinstance(min, Proxy) or isinstance(max, Proxy):
        x = given = _traced(input, "clamp")
        t = x.tracer
        lo, hi = (None if b is None else t.lift(b, x) for b in (min, max))
        if lo is not None:
            x = t.emit(Op.WHERE_POS, [lo - x, lo, x])
        if hi is not None:
            x = t.emit(Op.WHERE_POS, [x - hi, hi, x])
        # a NaN on any side: NaN, and no gradient (torch's masks compare false with NaN)
        numbers = _numbers(given, *(b for b in (lo, hi) if b is not None)) - 0.5
        return t.emit(Op.WHERE_POS, [numbers, x, t.lift(float("nan"), x)])
    x = input if min is None else _clamp_min.record(input, min)
    return x if max is None else _clamp_max.record(x, max)


# More activations, composed of the ops above with torch's formulas.

def _between(x: Proxy, lo: float, hi: float) -> Proxy:
    """``x`` clamped to [lo, hi] with torch's hardtanh gradient: passed strictly inside
    only (``clamp`` passes at the bounds too); a NaN stays NaN, as torch's."""
    tracer = x.tracer
    inner = tracer.emit(Op.WHERE_POS, [hi - x, x, tracer.lift(hi, x)])
    clamped = tracer.emit(Op.WHERE_POS, [x - lo, inner, tracer.lift(lo, x)])
    number = _numbers(x) - 0.5   # > 0 but where x is NaN
    return tracer.emit(Op.WHERE_POS, [number, clamped, x])


@traces(F.relu6)
def _relu6(input, inplace=Fixed(False)):
    return _between(_traced(input, "relu6"), 0.0, 6.0)


@traces(F.hardtanh)
def _hardtanh(input, min_val=-1.0, max_val=1.0, inplace=Fixed(False)):
    return _between(_traced(input, "hardtanh"), _number(min_val, "hardtanh's min_val"),
                    _number(max_val, "hardtanh's max_val"))


@traces(F.hardsigmoid)
def _hardsigmoid(input, inplace=Fixed(False)):
    """``relu6(x + 3) / 6``; torch's gradient, 1/6 strictly between -3 and 3."""
    return _between(_traced(input, "hardsigmoid") + 3.0, 0.0, 6.0) / 6.0


@traces(F.softsign)
def _softsign(input):
    x = _traced(input, "softsign")
    return x / (1.0 + _abs.record(x))


@traces(F.logsigmoid)
def _logsigmoid(input):
    """``-softplus(-x)``, which cannot overflow."""
    return -_softplus.record(-_traced(input, "logsigmoid"))


@traces(F.mish)
def _mish(input, inplace=Fixed(False)):
    x = _traced(input, "mish")
    return x * _emit(Op.TANH, _softplus.record(x))


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@traces(F.selu, torch.selu)
def _selu(input, inplace=Fixed(False)):
    return _SELU_SCALE * _emit(Op.ELU, _traced(input, "selu"), alpha=_SELU_ALPHA)


@traces(F.celu, torch.celu)
def _celu(input, alpha=1.0, inplace=Fixed(False)):
    """``alpha * elu(x / alpha)``."""
    a = _number(alpha, "celu's alpha")
    if a == 0:
        raise DSLError("celu: alpha cannot be 0 (torch refuses it too)", user_loc())
    return a * _emit(Op.ELU, _traced(input, "celu") / a, alpha=1.0)


@traces(F.glu)
def _glu(input, dim=-1):
    """The first half of ``dim`` gated by the sigmoid of the second."""
    x = _traced(input, "glu")
    size = x.type.feat[_dim_to_axis(x, dim)]
    if size % 2:
        raise DSLError(f"glu halves dim {dim}, of odd size {size}", user_loc())
    a, b = _chunk.record(x, 2, dim)
    return a * _emit(Op.SIGMOID, b)


@traces(F.prelu, torch.prelu)
def _prelu(input, weight):
    """``x`` where positive, else ``w x``; ``w`` one slope or one per channel (torch's
    axis 1), torch's gradients (at 0: ``w``)."""
    x = _traced(input, "prelu")
    if not isinstance(weight, Proxy) or weight.type.domain is not Domain.PARAM \
            or len(weight.type.feat) != 1:
        raise DSLError("prelu: the slopes are a 1-d parameter (nn.PReLU's weight)", user_loc())
    n = weight.type.feat[0]
    if n != 1:
        ndim = len(x.shape)
        if ndim < 2 or x.shape[1] != n:
            raise DSLError(f"prelu: {n} slopes for axis 1 of a value of shape "
                           f"{list(x.shape)}", user_loc())
        weight = _emit(Op.RESHAPE, weight, feat=(n,) + (1,) * (ndim - 2))
    return x.tracer.emit(Op.WHERE_POS, [x, x, weight * x])   # x > 0 ? x : w x, torch's


# --- dtype conversions ------------------------------------------------------------------

_DEVICE_MOVE = ("a sarc layer runs on the device of the tensors it is given: move them (and "
                "the layer) before the call, outside the layer")


def _converted(x: Proxy, dtype: Any, what: str) -> Proxy:
    """``x`` as ``dtype`` (a torch dtype): a cast, none where it is ``x``'s dtype already;
    conversions to integers and to dtypes sarc has not are refused."""
    if not isinstance(dtype, torch.dtype):
        raise DSLError(f"{what}: dtype must be a torch dtype, got {_kind(dtype)}", user_loc())
    if is_condition(x):
        if dtype is torch.bool:
            return x
        x = x * 1.0   # the 0 / 1 values, no longer a condition
    elif torch_integer_kind(x):   # torch's int64 count or selection
        if dtype is torch.int64:
            return x
        x = x * 1.0   # the same values, now a float as in torch
    try:
        to = DType.from_torch(dtype)
    except TypeError:
        to = None
    if to is x.type.dtype:
        return x
    if to is None and (dtype.is_floating_point or dtype.is_complex):
        raise DSLError(f"{what}: a sarc layer computes in torch.float32, float64, float16 or "
                       f"bfloat16, not {dtype}", user_loc())
    if to is None or not to.is_float:
        raise DSLError(f"{what} to {dtype}: {INTEGER_CONVERSION}", user_loc())
    return _emit(Op.CAST, x, dtype=to)


def _conversion(dtype: torch.dtype, name: str) -> Callable:
    def record(input, memory_format=Fixed(torch.preserve_format)):
        return _converted(_traced(input, name), dtype, name)
    return record


for _dtype, _fn in ((torch.float32, torch.Tensor.float), (torch.float64, torch.Tensor.double),
                    (torch.float16, torch.Tensor.half), (torch.bfloat16, torch.Tensor.bfloat16),
                    (torch.int64, torch.Tensor.long)):
    traces(_fn, name=f"Tensor.{_fn.__name__}")(_conversion(_dtype, f"Tensor.{_fn.__name__}"))


def _dtype_of(other, what: str) -> torch.dtype:
    if isinstance(other, (Proxy, torch.Tensor)):
        return other.dtype
    raise DSLError(f"{what} takes a tensor or traced value, got {_kind(other)}", user_loc())


@traces(torch.Tensor.to)
def _to(input, *args, **kwargs):
    """``x.to(dtype)``, ``x.to(dtype=...)``, ``x.to(other)`` (other's dtype): a cast.
    ``non_blocking`` and ``copy`` change nothing a layer computes (its values are never
    changed in place), so they are taken; a device is refused (see ``_DEVICE_MOVE``), and so
    is a memory format, which a layer's values do not have."""
    x = _traced(input, "Tensor.to")
    known = ("dtype", "device", "other", "non_blocking", "copy", "memory_format")
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        raise DSLError(f"Tensor.to: unexpected argument {unknown[0]}", user_loc())
    rest = list(args)
    dtype, device, other = kwargs.get("dtype"), kwargs.get("device"), kwargs.get("other")
    if rest and isinstance(rest[0], (Proxy, torch.Tensor)):
        other = rest.pop(0)
    elif rest and (isinstance(rest[0], (str, torch.device)) or _is_int(rest[0])):
        device = rest.pop(0)
    if rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    flags = [kwargs.get("non_blocking", False), kwargs.get("copy", False)]
    for i in range(2):
        if rest and type(rest[0]) is bool:
            flags[i] = rest.pop(0)
    if rest:
        raise DSLError(f"Tensor.to: unexpected argument {_show_arg(rest[0])}", user_loc())
    if device is not None:
        raise DSLError(f"Tensor.to({_show_arg(device)}): {_DEVICE_MOVE}", user_loc())
    if kwargs.get("memory_format", torch.preserve_format) is not torch.preserve_format:
        raise DSLError(f"Tensor.to: memory_format={kwargs['memory_format']} is not supported in "
                       f"a sarc layer (its values have no memory format; drop the argument)",
                       user_loc())
    if any(type(f) is not bool for f in flags):
        raise DSLError("Tensor.to: non_blocking and copy are bools", user_loc())
    if other is not None:
        if dtype is not None:
            raise DSLError("Tensor.to: give a dtype or a tensor, not both", user_loc())
        dtype = _dtype_of(other, "Tensor.to")
    if dtype is None:
        raise DSLError("Tensor.to needs a dtype (x.to(torch.float32)) or a tensor of the "
                       "dtype to convert to (x.to(h))", user_loc())
    return _converted(x, dtype, "Tensor.to")


def _show_arg(x) -> str:
    return _kind(x) if isinstance(x, (Proxy, torch.Tensor)) else repr(x)


# the legacy type names Tensor.type takes (a CPU type: a CUDA one would move the value)
_TYPE_NAMES = {"torch.FloatTensor": torch.float32, "torch.DoubleTensor": torch.float64,
               "torch.HalfTensor": torch.float16, "torch.BFloat16Tensor": torch.bfloat16,
               "torch.LongTensor": torch.int64, "torch.IntTensor": torch.int32,
               "torch.ShortTensor": torch.int16, "torch.CharTensor": torch.int8,
               "torch.ByteTensor": torch.uint8, "torch.BoolTensor": torch.bool}


@traces(torch.Tensor.type)
def _type(input, dtype=None, non_blocking=False, **kwargs):
    x = _traced(input, "Tensor.type")
    if dtype is None:
        raise DSLError("Tensor.type() names a value's type as a string, which a sarc layer does "
                       "not trace: read x.dtype, or convert with x.type(torch.float32)",
                       user_loc())
    if kwargs:
        raise DSLError(f"Tensor.type: unexpected argument {next(iter(kwargs))}", user_loc())
    if isinstance(dtype, type) and hasattr(dtype, "dtype") and hasattr(dtype, "is_cuda"):
        dtype = f"{dtype.__module__}.{dtype.__name__}"   # torch.FloatTensor, the class
    if isinstance(dtype, str):
        if dtype.startswith("torch.cuda."):
            raise DSLError(f"Tensor.type({dtype!r}): {_DEVICE_MOVE}", user_loc())
        if dtype not in _TYPE_NAMES:
            raise DSLError(f"Tensor.type: unknown type {dtype!r}; give a torch dtype "
                           f"(x.type(torch.float32))", user_loc())
        dtype = _TYPE_NAMES[dtype]
    return _converted(x, dtype, "Tensor.type")


@traces(torch.Tensor.type_as)
def _type_as(input, other):
    return _converted(_traced(input, "Tensor.type_as"), _dtype_of(other, "Tensor.type_as"),
                      "Tensor.type_as")


def _in_dtype(x: Proxy, dtype, what: str) -> Proxy:
    """The ``dtype=`` argument of a reduction or softmax: the input converted first, as
    torch does."""
    return x if dtype is None else _converted(x, dtype, f"{what}(dtype=...)")


@traces(torch.sum, torch.Tensor.sum)
def _sum(input, dim=None, keepdim=False, *, dtype=None, out=Fixed(None)):
    x = _in_dtype(_traced(input, "sum"), dtype, "sum")
    out = _sum_axes(x, _feature_axes(x, dim, "sum"), keepdim)
    return _integral(out) if dtype is None and _whole(input) else out   # a count: int64


@traces(torch.mean, torch.Tensor.mean)
def _mean(input, dim=None, keepdim=False, *, dtype=None, out=Fixed(None)):
    x = _in_dtype(_traced(input, "mean"), dtype, "mean")
    axes = _feature_axes(x, dim, "mean")
    return _sum_axes(x, axes, keepdim) / float(_prod(x.type.feat[a] for a in axes))


@traces(torch.var, torch.Tensor.var)
def _var(input, dim=None, unbiased=None, keepdim=False, *, correction=None,
         out=Fixed(None)):
    """``sum((x - mean)^2) / (n - correction)`` over feature axes, torch's two-pass form
    (``correction``: 1 by default, 0 with ``unbiased=False``)."""
    return _variance(input, dim, unbiased, keepdim, correction, "var")


@traces(torch.std, torch.Tensor.std)
def _std(input, dim=None, unbiased=None, keepdim=False, *, correction=None,
         out=Fixed(None)):
    """The square root of ``var``, with torch's gradient 0 where the variance is 0 (the
    root's derivative is infinite there): the root is taken of 1 in its place."""
    var = _variance(input, dim, unbiased, keepdim, correction, "std")
    tracer = var.tracer
    safe = tracer.emit(Op.WHERE_POS, [var, var, tracer.lift(1.0, var)])
    return tracer.emit(Op.WHERE_POS, [var, _emit(Op.POW, safe, exponent=0.5),
                                      var * 0.0])   # 0, or a NaN variance kept


def _variance(input, dim, unbiased, keepdim, correction, name: str) -> Proxy:
    x = _traced(input, name)
    if isinstance(dim, bool):   # torch's var(x, unbiased) form
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise DSLError(f"{name}: give unbiased= or correction=, not both", user_loc())
    c = (1.0 if unbiased is None or unbiased else 0.0) if correction is None \
        else _number(correction, f"{name}'s correction")
    axes = _feature_axes(x, dim, name)
    n = float(_prod(x.type.feat[a] for a in axes))
    centered = x - _sum_axes(x, axes, True) / n
    return _sum_axes(centered * centered, axes, keepdim) / (n - c)


@traces(torch.maximum, torch.Tensor.maximum)
def _maximum(input, other, *, out=Fixed(None)):
    return _extremum_of(input, other, "maximum")


@traces(torch.minimum, torch.Tensor.minimum)
def _minimum(input, other, *, out=Fixed(None)):
    return _extremum_of(input, other, "minimum")


def _extremum_of(a, b, name: str) -> Proxy:
    """The elementwise maximum (minimum) with torch's gradient: to the larger (smaller)
    operand, half to each where they tie (their mean, which is each of them there); where
    either is NaN, NaN with the whole gradient to each (their sum: torch halves only where
    they are equal, which NaN never is)."""
    like = a if isinstance(a, Proxy) else b
    if not isinstance(like, Proxy):
        raise DSLError(f"{name} of two values neither of which is traced", user_loc())
    tracer = like.tracer
    a, b = tracer.lift(a, like), tracer.lift(b, like)
    ahead = a - b if name == "maximum" else b - a   # > 0 where a is taken
    even = tracer.emit(Op.WHERE_POS, [_numbers(a, b) - 0.5, 0.5 * (a + b), a + b])
    return tracer.emit(Op.WHERE_POS, [ahead, a, tracer.emit(Op.WHERE_POS, [-ahead, b, even])])


def _numbers(*xs: Proxy) -> Proxy:
    """1 where every one of ``xs`` is a number, 0 where one is NaN (a constant: no gradient)."""
    out = None
    for x in xs:
        known = x.tracer.emit(Op.EQ_MASK, [x, x])
        out = known if out is None else out * known
    return out


def _extremum_axes(x: Proxy, axes: list[int], keepdim, kind: str) -> Proxy:
    return _reduce_axes(x, axes, keepdim, Op.MAX_AXIS, kind=kind)


@traces(torch.amax, torch.Tensor.amax)
def _amax(input, dim=(), keepdim=False, *, out=Fixed(None)):
    """The maximum over feature axes (torch's gradient: tied entries share it evenly)."""
    x = _traced(input, "amax")
    return _extremum_axes(x, _feature_axes(x, dim, "amax"), keepdim, "max")


@traces(torch.amin, torch.Tensor.amin)
def _amin(input, dim=(), keepdim=False, *, out=Fixed(None)):
    x = _traced(input, "amin")
    return _extremum_axes(x, _feature_axes(x, dim, "amin"), keepdim, "min")


class _ValuesOnly:
    """``torch.max(x, dim)``'s result while tracing: ``.values`` (or ``[0]``) is traced;
    the indices are integers computed from values, which a layer does not trace."""

    def __init__(self, values: Proxy, what: str):
        self.values, self._what = values, what

    @property
    def indices(self):
        raise DSLError(_untraced_indices(self._what), user_loc())

    def __getitem__(self, i):
        return self.values if i == 0 else self.indices

    def __iter__(self):
        # ``values, _ = x.max(-1)``: the indices are refused where they are used, not here
        return iter((self.values, _UntracedIndices(self._what)))


def _untraced_indices(what: str) -> str:
    return (f"{what}(x, dim).indices: the positions of the extrema are not traced; use "
            f".values (or torch.a{what}(x, dim))")


class _UntracedIndices:
    """The indices of ``values, indices = x.max(dim)``: unpacked, never used."""

    def __init__(self, what: str):
        object.__setattr__(self, "_what", what)

    def _sarc_refusal(self) -> str:
        return _untraced_indices(object.__getattribute__(self, "_what"))

    def _refuse(self, *args, **kwargs):
        raise DSLError(self._sarc_refusal(), user_loc())

    def __getattr__(self, name):
        self._refuse()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        what = next(a for a in args if isinstance(a, _UntracedIndices))
        what._refuse()

    __getitem__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __index__ = __int__ = __float__ = __bool__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = _refuse
    __hash__ = object.__hash__


def _extremum_method(kind: str):
    def record(input, dim=None, keepdim=False):
        x = _traced(input, kind)
        if dim is None:
            raise DSLError(f"{kind} over all axes is not supported; name a feature dim "
                           f"(x.{kind}(-1).values), or aggregate over edges with sarc.{kind}",
                           user_loc())
        if isinstance(dim, (Proxy, torch.Tensor)) and not keepdim:
            return _extremum_of(x, dim, "maximum" if kind == "max" else "minimum")  # max(x, y)
        if isinstance(dim, Proxy) or not _is_int(dim):
            raise DSLError(f"{kind}(x, other): other is a tensor or traced value (the "
                           f"elementwise {kind}); x.{kind}(dim) takes a feature axis, an int",
                           user_loc())
        return _ValuesOnly(_extremum_axes(x, [_dim_to_axis(x, dim)], keepdim, kind), kind)
    return record


traces(torch.max, torch.Tensor.max)(_extremum_method("max"))
traces(torch.min, torch.Tensor.min)(_extremum_method("min"))


@traces(F.softmax)
def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    """``exp(x - max) / sum(exp(x - max))`` over a feature axis (over the edges into a
    node it is ``sarc.edge_softmax``); ``dtype``: the input converted first; a half value's
    in float32, rounded once, as torch."""
    given = _in_dtype(_traced(input, "softmax"), dtype, "softmax")
    if dim is None:
        raise DSLError("softmax needs dim= (a feature axis); over a node's incoming edges "
                       "use sarc.edge_softmax", user_loc())
    x = _widened(given)
    axes = [_dim_to_axis(x, dim)]
    e = _emit(Op.EXP, x - _extremum_axes(x, axes, True, "max"))
    return _narrowed(e / _sum_axes(e, axes, True), given)


@traces(F.log_softmax)
def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    given = _in_dtype(_traced(input, "log_softmax"), dtype, "log_softmax")
    if dim is None:
        raise DSLError("log_softmax needs dim= (a feature axis)", user_loc())
    x = _widened(given)
    axes = [_dim_to_axis(x, dim)]
    shifted = x - _extremum_axes(x, axes, True, "max")
    return _narrowed(shifted - _emit(Op.LOG, _sum_axes(_emit(Op.EXP, shifted), axes, True)),
                     given)


@traces(torch.softmax, torch.Tensor.softmax)
def _softmax_function(input, dim, dtype=None):
    return _softmax.record(input, dim, dtype=dtype)


@traces(torch.log_softmax, torch.Tensor.log_softmax)
def _log_softmax_function(input, dim, dtype=None):
    return _log_softmax.record(input, dim, dtype=dtype)


def _sum_axes(x: Proxy, axes: list[int], keepdim) -> Proxy:
    return _reduce_axes(x, axes, keepdim, Op.SUM_AXIS)


def _reduce_axes(x: Proxy, axes: list[int], keepdim, op: Op, **attrs) -> Proxy:
    """``op`` (SUM_AXIS, MAX_AXIS) over each of ``axes``, last first; ``keepdim``: size 1
    kept in their place."""
    out = x
    for a in reversed(axes):
        out = _emit(op, out, axis=a, **attrs)
    if keepdim:
        feat = list(x.type.feat)
        for a in axes:
            feat[a] = 1
        out = _emit(Op.RESHAPE, out, feat=tuple(feat))
    return out


@traces(torch.Tensor.reshape, torch.Tensor.view)
def _reshape_method(input, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise DSLError(f"a view as another dtype ({shape[0]}) is not supported in a sarc layer",
                       user_loc())
    return _reshape(_traced(input, "reshape"), shape)


@traces(torch.reshape)
def _reshape_function(input, shape):
    return _reshape(_traced(input, "reshape"), tuple(shape))


@traces(torch.Tensor.view_as, torch.Tensor.reshape_as)
def _reshape_as(input, other):
    if not isinstance(other, (Proxy, torch.Tensor)):
        raise DSLError(f"view_as / reshape_as take a tensor or traced value, got {_kind(other)}",
                       user_loc())
    return _reshape(_traced(input, "view_as"), tuple(other.shape))


@traces(torch.Tensor.contiguous)
def _contiguous(input, memory_format=Fixed(torch.contiguous_format)):
    """A layout the compiled code chooses itself: the value as it is."""
    return _traced(input, "contiguous")


@traces(torch.clone, torch.Tensor.clone)
def _clone(input, *, memory_format=Fixed(torch.preserve_format)):
    """A copy: a traced value is never changed in place, so the value itself."""
    return _traced(input, "clone")


@traces(torch.detach, torch.Tensor.detach)
def _detach(input):
    """The value, through which no gradient flows (``x - x.amax(-1, keepdim=True).detach()``)."""
    return _emit(Op.DETACH, _traced(input, "detach"))


def _reshape(x: Proxy, shape: tuple) -> Proxy:
    t, written = x.type, list(shape)
    if t.domain is not Domain.PARAM:
        rows = shape[0] if shape else None
        own_rows = isinstance(rows, RowCount) and rows.symbol == t.domain.rows  # x.shape[0]
        if not own_rows and (not _is_int(rows) or rows != -1):
            raise DSLError("reshape a graph value with -1 as its first dim (the row axis), "
                           f"e.g. x.view(-1, heads, dim); got {list(shape)}", user_loc())
        shape = shape[1:]
    if not all(_is_int(s) for s in shape):
        raise DSLError(f"reshape takes int sizes, got {list(shape)}", user_loc())
    feat = _resolve_minus_one(shape, t.feat, written)
    if t.domain is not Domain.PARAM and _prod(feat) != _prod(t.feat):
        raise DSLError(f"reshape to {_shown(written)}: the first dim is the row axis, which a "
                       f"graph value keeps, so its features {list(t.feat)} must fit "
                       f"{list(feat)}; to flatten the features write x.flatten(1) or "
                       f"x.view(-1, {_prod(t.feat)})", user_loc())
    return _emit(Op.RESHAPE, x, feat=feat)


def _shown(shape: list) -> list:
    """A shape as written, the row count (``x.shape[0]``) shown as -1."""
    return [-1 if isinstance(s, RowCount) else s for s in shape]


def _resolve_minus_one(shape, feat: tuple[int, ...], written: list) -> tuple[int, ...]:
    """The feature sizes ``shape`` with its -1 inferred; ``written`` is the shape as the user
    wrote it (the row axis included), for the errors."""
    shape = [int(s) for s in shape]
    # As torch: a size is >= 0, or -1 once (inferred). A product check alone would pass
    # view(-1, -2, -2) on 4 features, which fails only when the generated code runs.
    bad = [s for s in shape if s < -1]
    if bad:
        raise DSLError(f"reshape to {written}: invalid size {bad[0]}; a size is a positive int, "
                       f"or -1 (at most once) for the size inferred from the others", user_loc())
    if shape.count(-1) > 1:
        raise DSLError("at most one -1 in a feature reshape", user_loc())
    if -1 in shape and 0 in shape:
        raise DSLError(f"reshape to {written}: the -1 is ambiguous next to a size 0 (any size "
                       f"fits it)", user_loc())
    if -1 in shape:
        known = _prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = _prod(feat) // known if known else 0
    return tuple(shape)


@traces(torch.unsqueeze, torch.Tensor.unsqueeze)
def _unsqueeze(input, dim):
    x = _traced(input, "unsqueeze")
    t = x.type
    if not _is_int(dim):
        raise DSLError(f"dim must be an int, got {_kind(dim)}", user_loc())
    full = list(t.shape)
    d = dim + len(full) + 1 if dim < 0 else dim
    if not 0 <= d <= len(full):
        raise DSLError(f"dim {dim} is out of range for unsqueeze of shape {_shape(t)}", user_loc())
    if t.domain is not Domain.PARAM and d == 0:
        raise DSLError("cannot insert an axis before the row axis", user_loc())
    full.insert(d, 1)
    feat = tuple(full) if t.domain is Domain.PARAM else tuple(full[1:])
    return _emit(Op.RESHAPE, x, feat=feat)


@traces(torch.squeeze, torch.Tensor.squeeze)
def _squeeze(input, dim=None):
    """The size-1 feature axes dropped (``dim``: an int or a tuple of them; an axis that is
    not of size 1 stays, as in torch); the row axis is never one."""
    x = _traced(input, "squeeze")
    t = x.type
    param = t.domain is Domain.PARAM
    if dim is None:
        axes = [a for a, s in enumerate(t.feat) if s == 1]
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        axes = []
        for d in dims:
            if not _is_int(d):
                raise DSLError(f"squeeze: dim must be an int, got {_kind(d)}", user_loc())
            n = max(len(t.shape), 1)
            if not -n <= d < n:
                raise DSLError(f"squeeze: dim {d} is out of range for a value of shape "
                               f"{_shape(t)}", user_loc())
            if not param and d in (0, -len(t.shape)):
                continue  # the row axis: torch leaves it unless there is one row
            if param and not t.feat:
                continue  # a 0-d parameter: nothing to squeeze, as in torch
            axes.append(_dim_to_axis(x, d) if not param else d % len(t.feat))
        axes = [a for a in axes if t.feat[a] == 1]
    feat = tuple(s for a, s in enumerate(t.feat) if a not in set(axes))
    return x if feat == t.feat else _emit(Op.RESHAPE, x, feat=feat)


def _permuted(x: Proxy, perm: tuple[int, ...]) -> Proxy:
    return x if perm == tuple(range(len(perm))) else _emit(Op.PERMUTE, x, perm=perm)


@traces(torch.transpose, torch.swapaxes, torch.swapdims, torch.Tensor.transpose,
        torch.Tensor.swapaxes, torch.Tensor.swapdims)
def _transpose(input, dim0, dim1):
    """Two feature axes swapped (``x.view(-1, H, C).transpose(1, 2)``); the row axis of a
    node or edge value stays first."""
    x = _traced(input, "transpose")
    a, b = _dim_to_axis(x, dim0), _dim_to_axis(x, dim1)
    perm = list(range(len(x.type.feat)))
    perm[a], perm[b] = perm[b], perm[a]
    return _permuted(x, tuple(perm))


@traces(torch.permute)
def _permute(input, dims):
    x = _traced(input, "permute")
    dims = tuple(dims)
    rows = x.type.domain is not Domain.PARAM
    if len(dims) != len(x.type.shape) or not all(_is_int(d) for d in dims):
        raise DSLError(f"permute{list(dims)} does not name each axis of a value of shape "
                       f"{_shape(x.type)} once", user_loc())
    n = len(x.type.shape)
    if any(not -n <= d < n for d in dims):
        raise DSLError(f"permute{list(dims)}: a dim is out of range for a value of shape "
                       f"{_shape(x.type)}", user_loc())
    full = [d % n for d in dims]
    if sorted(full) != list(range(len(full))):
        raise DSLError(f"permute{list(dims)} names an axis twice", user_loc())
    if rows:
        if full[0] != 0:
            raise AcrossRowsError(f"permute{list(dims)}", f" moves the row "
                                  f"axis of {x.type.domain.article} value; it stays first "
                                  f"(permute its feature axes)")
        full = [d - 1 for d in full[1:]]
    return _permuted(x, tuple(full))


@traces(torch.Tensor.permute)
def _permute_method(input, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
        dims = tuple(dims[0])
    return _permute.record(input, dims)


def _param_transpose(input, what: str) -> Proxy:
    x = _traced(input, what)
    if x.type.domain is not Domain.PARAM:
        raise DSLError(f"{what} of {x.type.domain.article} value would move its row axis; "
                       f"swap two feature axes with x.transpose(1, 2)", user_loc())
    return x


@traces(torch.t, torch.Tensor.t)
def _t(input):
    """A parameter of at most 2 axes transposed (``x @ self.W.t()``), as torch's ``t``."""
    x = _param_transpose(input, "t()")
    n = len(x.type.feat)
    if n > 2:
        raise DSLError(f"t() takes a parameter of at most 2 axes, got {_shape(x.type)}; use "
                       f"transpose or .mT", user_loc())
    return x if n < 2 else _permuted(x, (1, 0))


@traces(torch.Tensor.T.__get__)
def _T(instance, owner=None):
    """``.T``: a parameter's axes reversed, as torch's (``x @ self.W.T``)."""
    x = _param_transpose(instance, ".T")
    return _permuted(x, tuple(reversed(range(len(x.type.feat)))))


@traces(torch.Tensor.mT.__get__)
def _mT(instance, owner=None):
    """``.mT``: a parameter's last two axes swapped."""
    x = _param_transpose(instance, ".mT")
    n = len(x.type.feat)
    if n < 2:
        raise DSLError(f".mT takes a parameter of at least 2 axes, got {_shape(x.type)}",
                       user_loc())
    return _permuted(x, (*range(n - 2), n - 1, n - 2))


@traces(torch.flatten, torch.Tensor.flatten)
def _flatten(input, start_dim=0, end_dim=-1):
    x = _traced(input, "flatten")
    t = x.type
    if not t.shape:
        return _emit(Op.RESHAPE, x, feat=(1,))
    a, b = _dim_to_axis(x, start_dim), _dim_to_axis(x, end_dim)
    if b < a:
        raise DSLError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}", user_loc())
    feat = (*t.feat[:a], _prod(t.feat[a:b + 1]), *t.feat[b + 1:])
    return _emit(Op.RESHAPE, x, feat=feat)


@traces(torch.unflatten, torch.Tensor.unflatten)
def _unflatten(input, dim, sizes):
    """``unflatten``: one feature axis split into ``sizes`` (a -1 inferred), a reshape."""
    x = _traced(input, "unflatten")
    a, feat = _dim_to_axis(x, dim), x.type.feat
    if not isinstance(sizes, (tuple, list, torch.Size)) or not all(_is_int(s) for s in sizes):
        raise DSLError(f"unflatten takes a tuple of int sizes, got {_kind(sizes)}", user_loc())
    sizes = [int(s) for s in sizes]
    known = _prod(s for s in sizes if s != -1)
    if sizes.count(-1) > 1 or any(s < -1 for s in sizes) or not known or (
            feat[a] % known if -1 in sizes else known != feat[a]):
        raise DSLError(f"cannot unflatten features [{feat[a]}] into {sizes}", user_loc())
    sizes = [feat[a] // known if s == -1 else s for s in sizes]
    return _emit(Op.RESHAPE, x, feat=(*feat[:a], *sizes, *feat[a + 1:]))


@traces(torch.Tensor.__getitem__)
def _getitem(input, key):
    if any(is_condition(k) for k in (key if isinstance(key, tuple) else (key,))):
        raise DSLError("indexing by a condition (x[mask]) keeps a number of entries known "
                       "only from the values: not traced; select with torch.where(mask, x, "
                       "0.0) or x.masked_fill(~mask, 0.0)", user_loc())
    if isinstance(key, Proxy):
        return key.tracer.emit(Op.INDEX, [key.tracer.lift(input, key), key])
    if isinstance(input, Proxy):
        return _basic_index(input, key)
    raise DSLError("only a parameter table indexed by an int64 node or edge value "
                   "(e.g. W[edge.etype]) is supported", user_loc())


def _basic_index(x: Proxy, key) -> Proxy:
    """Basic indexing of a traced value: ranges and single entries of its feature axes
    (``x[:, :8]``, ``x[..., 0]``), new axes (``None``) and one ``...``; the row axis of a
    node or edge value is taken whole (``:``). Slices, then one reshape."""
    items = key if isinstance(key, tuple) else (key,)
    for k in items:
        if not (k is None or k is Ellipsis or isinstance(k, slice) or _is_int(k)):
            raise DSLError(f"indexing by {_kind(k)} is not supported: a traced value takes "
                           f"ranges, ints, None and ... (and a parameter table an int64 "
                           f"node or edge value, W[edge.etype])", user_loc())
    if sum(k is Ellipsis for k in items) > 1:
        raise DSLError("an index can have only one ellipsis (...)", user_loc())
    t = x.type
    shape = list(t.shape)
    real = sum(k is not None and k is not Ellipsis for k in items)
    if real > len(shape):
        raise DSLError(f"too many indices ({real}) for a value of shape {_shape(t)}", user_loc())
    if Ellipsis in items:
        e = items.index(Ellipsis)
        items = items[:e] + (slice(None),) * (len(shape) - real) + items[e + 1:]
    else:
        items = items + (slice(None),) * (len(shape) - real)
    rows = t.domain is not Domain.PARAM
    out, final, d = x, [], 0
    for k in items:
        if k is None:
            if rows and d == 0:
                raise DSLError("cannot insert an axis before the row axis", user_loc())
            final.append(1)
            continue
        size = shape[d]
        if rows and d == 0:
            whole = (isinstance(k, slice) and k.start in (None, 0) and k.stop is None
                     and k.step in (None, 1))
            if not whole:
                raise DSLError(f"the rows of {t.domain.article} value are taken whole (':'); "
                               f"index its feature axes (x[:, 0], x[..., :8])", user_loc())
            final.append(size)
            d += 1
            continue
        axis = d - 1 if rows else d
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            if step != 1:
                raise DSLError(f"a slice with step {k.step} is not supported (step 1 only)",
                               user_loc())
            if stop <= start:
                raise DSLError(f"the slice [{k.start}:{k.stop}] of an axis of size {size} is "
                               f"empty", user_loc())
            if (start, stop) != (0, size):
                out = _emit(Op.SLICE, out, axis=axis, start=start, stop=stop)
            final.append(stop - start)
        else:
            i = int(k) + size if k < 0 else int(k)
            if not 0 <= i < size:
                raise DSLError(f"index {k} is out of range for an axis of size {size}",
                               user_loc())
            out = _emit(Op.SLICE, out, axis=axis, start=i, stop=i + 1)
        d += 1
    feat = tuple(final[1:] if rows else final)
    return out if feat == out.type.feat else _emit(Op.RESHAPE, out, feat=feat)


def _pieces(x: Proxy, dim, sizes: list[int], what: str) -> tuple[Proxy, ...]:
    """``x`` cut along ``dim`` into consecutive pieces of ``sizes``."""
    axis = _dim_to_axis(x, dim)
    full = x.type.feat[axis]
    if sum(sizes) != full or any(s <= 0 for s in sizes):
        raise DSLError(f"{what}: sizes {sizes} are not positive sizes adding up to the axis' "
                       f"{full}", user_loc())
    out, start = [], 0
    for n in sizes:
        out.append(x if n == full else _emit(Op.SLICE, x, axis=axis, start=start,
                                              stop=start + n))
        start += n
    return tuple(out)


def _split_sizes(size: int, split, what: str) -> list[int]:
    if _is_int(split):
        if split <= 0:
            raise DSLError(f"{what}: split size must be positive, got {split}", user_loc())
        return [min(split, size - a) for a in range(0, size, split)]
    if isinstance(split, (tuple, list)) and all(_is_int(s) for s in split):
        return [int(s) for s in split]
    raise DSLError(f"{what}: split sizes must be an int or a list of ints, got {_kind(split)}",
                   user_loc())


@traces(torch.split)
def _split(tensor, split_size_or_sections, dim=0):
    x = _traced(tensor, "split")
    size = x.type.feat[_dim_to_axis(x, dim)]
    return _pieces(x, dim, _split_sizes(size, split_size_or_sections, "split"), "split")


@traces(torch.Tensor.split)
def _split_method(input, split_size, dim=0):
    return _split.record(input, split_size, dim)


@traces(torch.chunk, torch.Tensor.chunk)
def _chunk(input, chunks, dim=0):
    """torch's chunks: pieces of ceil(size / chunks), the last one shorter (or fewer)."""
    x = _traced(input, "chunk")
    if not _is_int(chunks) or chunks <= 0:
        raise DSLError(f"chunk: chunks must be a positive int, got {chunks!r}", user_loc())
    size = x.type.feat[_dim_to_axis(x, dim)]
    return _pieces(x, dim, _split_sizes(size, -(-size // chunks), "chunk"), "chunk")


@traces(torch.narrow, torch.Tensor.narrow)
def _narrow(input, dim, start, length):
    x = _traced(input, "narrow")
    axis = _dim_to_axis(x, dim)
    size = x.type.feat[axis]
    if not (_is_int(start) and _is_int(length)):
        raise DSLError("narrow: start and length must be ints", user_loc())
    start = start + size if start < 0 else start
    if not (0 <= start and length > 0 and start + length <= size):
        raise DSLError(f"narrow({dim}, {start}, {length}) is out of range for an axis of size "
                       f"{size}", user_loc())
    if (start, length) == (0, size):
        return x
    return _emit(Op.SLICE, x, axis=axis, start=start, stop=start + length)


@traces(torch.unbind, torch.Tensor.unbind)
def _unbind(input, dim=0):
    x = _traced(input, "unbind")
    axis = _dim_to_axis(x, dim)
    feat = x.type.feat[:axis] + x.type.feat[axis + 1:]
    return tuple(_emit(Op.RESHAPE, p, feat=feat)
                 for p in _pieces(x, dim, [1] * x.type.feat[axis], "unbind"))


# --- norms, squares, stacking and repeats over feature axes ----------------------------------

@traces(torch.square, torch.Tensor.square)
def _square(input, *, out=Fixed(None)):
    x = _traced(input, "square")
    return x * x


def _norm_order(p, what: str) -> int:
    """1 or 2: the vector norms sarc traces (``'fro'`` is the 2-norm of a feature axis)."""
    if p == "fro" or (_is_number(p) and float(p) == 2.0):
        return 2
    if _is_number(p) and float(p) == 1.0:
        return 1
    raise DSLError(f"{what}: the {p!r}-norm is not traced; sarc traces the 1-norm (p=1) and "
                   f"the 2-norm (p=2) over feature axes", user_loc())


def _vector_norm(x: Proxy, order: int, axes: list[int], keepdim) -> Proxy:
    """The ``order``-norm of ``x`` over ``axes``, with torch's gradient: the 2-norm's is
    ``x / norm``, 0 where the norm is 0 (a square root's derivative there is infinite, so
    the root is taken of a positive stand-in and the result selected); a half value's in
    float32, rounded once, as torch."""
    given = x
    x = _widened(x)
    if order == 1:
        return _narrowed(_sum_axes(_abs.record(x), axes, keepdim), given)
    emit = x.tracer.emit
    s = _sum_axes(x * x, axes, keepdim)
    zero, one = x.tracer.const(0.0, s), x.tracer.const(1.0, s)
    safe = s + emit(Op.WHERE_POS, [s, zero, one])   # s, or 1 where s is 0
    # s * 0 where s is not positive: 0, or NaN where a NaN made it (torch's norm keeps it)
    return _narrowed(emit(Op.WHERE_POS, [s, _emit(Op.POW, safe, exponent=0.5), s * 0.0]),
                     given)


@traces(torch.linalg.vector_norm)
def _linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=Fixed(None)):
    v = _in_dtype(_traced(x, "vector_norm"), dtype, "vector_norm")
    return _vector_norm(v, _norm_order(ord, "vector_norm"), _feature_axes(v, dim, "a norm"),
                        keepdim)


@traces(torch.linalg.norm)
def _linalg_norm(A, ord=None, dim=None, keepdim=False, *, out=Fixed(None), dtype=None):
    """A vector norm over one feature axis (``ord`` None: the 2-norm), or the Frobenius norm
    over two (``ord`` None or ``'fro'``: the 2-norm of their entries), as torch's."""
    v = _in_dtype(_traced(A, "linalg.norm"), dtype, "linalg.norm")
    axes = _feature_axes(v, dim, "a norm")
    if len(axes) > 2 or (len(axes) == 2 and ord not in (None, "fro")):
        raise DSLError(f"linalg.norm(ord={ord!r}, dim={dim!r}): sarc traces a vector norm "
                       f"(ord 1 or 2) over one feature axis and the Frobenius norm (ord=None "
                       f"or 'fro') over two", user_loc())
    if len(axes) == 1 and ord == "fro":
        raise DSLError("linalg.norm: the 'fro' norm is of a matrix: name two feature dims, "
                       "or give ord=2 for a vector", user_loc())
    return _vector_norm(v, 2 if ord is None else _norm_order(ord, "linalg.norm"), axes, keepdim)


def _norm_value(input, p, dim, keepdim, dtype) -> Proxy:
    v = _in_dtype(_traced(input, "norm"), dtype, "norm")
    return _vector_norm(v, _norm_order(p, "norm"), _feature_axes(v, dim, "a norm"), keepdim)


@traces(torch.norm)
def _norm(input, p="fro", dim=None, keepdim=False, out=Fixed(None), dtype=None):
    return _norm_value(input, p, dim, keepdim, dtype)


@traces(torch.Tensor.norm)
def _norm_method(input, p="fro", dim=None, keepdim=False, dtype=None):
    return _norm_value(input, p, dim, keepdim, dtype)


@traces(F.normalize)
def _normalize(input, p=2.0, dim=1, eps=1e-12, out=Fixed(None)):
    """``x / clamp_min(norm(x, p, dim), eps)``, torch's formula (and so its gradient)."""
    x = _traced(input, "normalize")
    norm = _vector_norm(x, _norm_order(p, "F.normalize"), [_dim_to_axis(x, dim)], True)
    return x / _emit(Op.CLAMP_MIN, norm, min=_number(eps, "normalize's eps"))


@traces(F.cosine_similarity, torch.cosine_similarity)
def _cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """``sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps))`` over ``dim``, torch's values; its
    gradient too, but where a norm is positive and below eps (torch then passes the
    gradient of the norm it clamped)."""
    p = _first_proxy(x1, x2)
    a, b = p.tracer.lift(x1, p), p.tracer.lift(x2, p)
    rank = max(len(a.type.shape), len(b.type.shape))   # of the broadcast operands
    if not _is_int(dim) or not -rank <= dim < rank:
        raise DSLError(f"cosine_similarity: dim {dim!r} is out of range for operands of "
                       f"{rank} dims", user_loc())
    d = dim % rank
    e = _number(eps, "cosine_similarity's eps")
    unit = []
    for v in (a, b):   # dim names an axis of the broadcast shape: each operand's own
        own = d - (rank - len(v.type.shape))
        if own < 0:
            raise DSLError(f"cosine_similarity: an operand of shape {_shape(v.type)} has no "
                           f"axis {dim} of the broadcast shape; expand it first", user_loc())
        axis = [_dim_to_axis(v, own)]
        unit.append(v / _emit(Op.CLAMP_MIN, _vector_norm(v, 2, axis, True), min=e))
    product = unit[0] * unit[1]
    return _sum_axes(product, [_dim_to_axis(product, d)], False)


@traces(F.pairwise_distance, torch.pairwise_distance)
def _pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of ``x1 - x2 + eps`` over the last axis (p = 1 or 2)."""
    d = x1 - x2 + _number(eps, "pairwise_distance's eps")
    return _vector_norm(d, _norm_order(p, "pairwise_distance"), [_dim_to_axis(d, -1)],
                        keepdim)


@traces(torch.stack)
def _stack(tensors, dim=0, *, out=Fixed(None)):
    """Values stacked along a new feature axis: each unsqueezed, then concatenated."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise DSLError(f"stack takes a non-empty list of values, got {_kind(tensors)}",
                       user_loc())
    p = _first_proxy(tensors)
    xs = [p.tracer.lift(x, p) for x in tensors]
    if not _is_int(dim):
        raise DSLError(f"stack: dim must be an int, got {_kind(dim)}", user_loc())
    n = len(p.type.shape) + 1
    if p.type.domain is not Domain.PARAM and dim in (0, -n):
        raise AcrossRowsError(f"torch.stack(..., dim={dim})",
                              f" stacks along the row axis of {p.type.domain.article} value, "
                              f"which a sarc layer does not do: stack along a feature axis "
                              f"(torch.stack(xs, dim=1), or dim=-1)")
    return _concat([_unsqueeze.record(x, dim) for x in xs], dim)


def _copies(x: Proxy, axis: int, times: int) -> Proxy:
    return x if times == 1 else x.tracer.emit(Op.CONCAT, [x] * times, {"axis": axis})


class _RowsNotFirst:
    """A node or edge value whose row axis is not its first (``w.tile(1, H, 1)`` of an
    ``[E]`` weight is ``[1, H, E]``): only moving the rows back first is traced
    (``.transpose(0, 2)``, ``.permute``), giving a traced value again. ``value`` holds it
    rows first; ``order[i]`` is the axis of ``value`` (0: the rows) at torch axis ``i``."""

    __slots__ = ("value", "order")

    def __init__(self, value: Proxy, order: tuple[int, ...]):
        self.value, self.order = value, order

    @property
    def shape(self) -> tuple:
        full = self.value.shape
        return tuple(full[a] for a in self.order)

    def dim(self) -> int:
        return len(self.order)

    ndim = property(dim)

    def _reordered(self, order: tuple[int, ...]):
        if order[0] != 0:
            return _RowsNotFirst(self.value, order)
        return _permuted(self.value, tuple(a - 1 for a in order[1:]))

    def _axis(self, d) -> int:
        n = len(self.order)
        if not _is_int(d) or not -n <= d < n:
            raise DSLError(f"dim {d!r} is out of range for a value of {n} axes", user_loc())
        return d % n

    def transpose(self, dim0, dim1):
        order = list(self.order)
        a, b = self._axis(dim0), self._axis(dim1)
        order[a], order[b] = order[b], order[a]
        return self._reordered(tuple(order))

    swapaxes = swapdims = transpose

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
            dims = tuple(dims[0])
        axes = [self._axis(d) for d in dims]
        if sorted(axes) != list(range(len(self.order))):
            raise DSLError(f"permute{list(dims)} does not name each of {len(self.order)} axes "
                           f"once", user_loc())
        return self._reordered(tuple(self.order[a] for a in axes))

    def _sarc_refusal(self, what: str = "arithmetic") -> str:
        return (f"{what} of a value whose row axis is not its first (it is axis "
                f"{self.order.index(0)}, after tile / repeat / expand added axes before it): "
                f"move the rows back first (x.transpose(0, {self.order.index(0)}) or permute) "
                f"before using it")

    def _refuse(self, what: str):
        raise DSLError(self._sarc_refusal(what), user_loc())

    def __getattr__(self, name):
        self._refuse(f"Tensor.{name}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        name = getattr(func, "__name__", "")
        if isinstance(x, _RowsNotFirst) and name in ("transpose", "swapaxes", "swapdims",
                                                     "permute"):
            return getattr(x, name)(*args[1:], **kwargs)
        rows = next(a for a in (*args, *kwargs.values()) if isinstance(a, _RowsNotFirst))
        rows._refuse(_torch_name(func))

    def _operator(self, *args):
        self._refuse("arithmetic")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _operator
    __truediv__ = __rtruediv__ = __matmul__ = __rmatmul__ = __neg__ = __pow__ = _operator
    __getitem__ = _operator


def _repeated(x: Proxy, reps: list[int], what: str):
    """``x`` with each axis repeated ``reps`` times (torch's ``tile``: whole copies one after
    another), ``reps`` as long as ``x.shape`` or longer (new leading axes); the rows of a
    node or edge value are not repeated."""
    t = x.type
    if not all(_is_int(r) for r in reps):
        raise DSLError(f"{what} takes int repeat counts, got {list(reps)}", user_loc())
    if any(r <= 0 for r in reps):
        raise DSLError(f"{what}{tuple(reps)}: a repeat count is a positive int", user_loc())
    extra = len(reps) - len(t.shape)
    rows = t.domain is not Domain.PARAM
    if rows and reps[extra] != 1:
        raise DSLError(f"{what}{tuple(reps)} repeats the rows of {t.domain.article} value, "
                       f"which a sarc layer does not do: repeat its feature axes (1 for the "
                       f"row axis)", user_loc())
    out = x if not extra else _emit(Op.RESHAPE, x, feat=(1,) * extra + t.feat)
    feat_reps = reps[:extra] + reps[extra + 1:] if rows else reps
    for axis, r in enumerate(feat_reps):
        out = _copies(out, axis, r)
    if rows and extra:
        return _RowsNotFirst(out, (*range(1, extra + 1), 0, *range(extra + 1, len(reps))))
    return out


def _sizes(sizes) -> list:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list, torch.Size)):
        return list(sizes[0])
    return list(sizes)


@traces(torch.Tensor.tile)
def _tile_method(input, *dims):
    return _tile.record(input, tuple(_sizes(dims)))


@traces(torch.tile)
def _tile(input, dims):
    """torch's ``tile``: ``dims`` shorter than the shape is padded with leading 1s."""
    x = _traced(input, "tile")
    reps = list(dims)
    reps = [1] * (len(x.type.shape) - len(reps)) + reps
    return _repeated(x, reps, "tile")


@traces(torch.Tensor.repeat)
def _repeat(input, *repeats):
    x = _traced(input, "repeat")
    reps = _sizes(repeats)
    if len(reps) < len(x.type.shape):
        raise DSLError(f"repeat{tuple(reps)}: give a count for each of the value's "
                       f"{len(x.type.shape)} axes (1 for the row axis)", user_loc())
    return _repeated(x, reps, "repeat")


@traces(torch.Tensor.expand)
def _expand(input, *sizes, implicit=Fixed(False)):
    """Size-1 axes widened to ``sizes`` (-1: kept), new leading axes added: copies of the
    value (concatenated), as torch's broadcast view reads them."""
    x = _traced(input, "expand")
    t = x.type
    sizes = _sizes(sizes)
    extra = len(sizes) - len(t.shape)
    if extra < 0:
        raise DSLError(f"expand{tuple(sizes)}: give a size for each of the value's "
                       f"{len(t.shape)} axes", user_loc())
    reps = []
    for i, s in enumerate(sizes):
        have = 1 if i < extra else x.shape[i - extra]
        if isinstance(have, RowCount):
            if not ((_is_int(s) and s == -1) or (isinstance(s, RowCount)
                                                  and s.symbol == have.symbol)):
                raise AcrossRowsError(f"expand{tuple(sizes)}", f": the row "
                                      f"axis of {t.domain.article} value is kept as it is (-1 "
                                      f"or x.shape[0])")
            reps.append(1)
        elif not _is_int(s):
            raise DSLError(f"expand takes int sizes, got {list(sizes)}", user_loc())
        elif s == -1 and i >= extra:
            reps.append(1)
        elif s == have or (have == 1 and s > 0):
            reps.append(s if have == 1 else 1)
        else:
            raise DSLError(f"expand{tuple(sizes)}: an axis of size {have} cannot be expanded "
                           f"to {s} (only size-1 axes widen)", user_loc())
    return _repeated(x, reps, "expand")


@traces(torch.Tensor.expand_as)
def _expand_as(input, other):
    if not isinstance(other, (Proxy, torch.Tensor, _RowsNotFirst)):
        raise DSLError(f"expand_as takes a tensor or traced value, got {_kind(other)}",
                       user_loc())
    return _expand.record(input, *other.shape)


# --- conditions: comparisons, their logic, and selections by them --------------------------
#
# A comparison of traced values is a mask, 1.0 where it holds and 0.0 elsewhere (NaN never
# compares, except !=), in the operands' float dtype, marked a condition by the tracer
# (``Tracer.conditions``). torch.where / masked_fill select by it (WHERE_POS: the gradient
# goes to the chosen side only, as torch's), & | ~ combine it, .float() and arithmetic read
# it as the 0 / 1 values torch promotes a bool to. No op is added to the IR: a > b is
# where_pos(a - b, 1, 0), a == b is eq_mask(a, b).

def _conditions(tracer) -> set:
    return tracer.__dict__.setdefault("conditions", set())


def _condition(x: Proxy) -> Proxy:
    _conditions(x.tracer).add(x.index)
    return x


def is_condition(x: Any) -> bool:
    """Whether ``x`` is a traced comparison (a mask marked as a condition)."""
    return isinstance(x, Proxy) and x.index in _conditions(x.tracer)


def _integers(tracer) -> set:
    return tracer.__dict__.setdefault("integers", set())


def _integral(x: Proxy) -> Proxy:
    _integers(x.tracer).add(x.index)
    return x


def _is_integral(v) -> bool:
    return isinstance(v, Proxy) and v.index in _integers(v.tracer)


def _whole(v) -> bool:
    """Whether ``v`` is a Python int or bool, a condition, or a value marked integral."""
    return isinstance(v, int) or _is_integral(v) or is_condition(v)


def torch_integer_kind(x: Any) -> str | None:
    """What torch would compute a traced 0 / 1 or whole-number value as, where sarc computes
    it as a float with the same values: ``bool`` for a condition, ``int64`` for a count or
    torch.where(cond, 1, 0) (``_integral``); None for a float value. A layer's output of
    either would change dtype silently, so the tracer refuses it."""
    if is_condition(x):
        return "bool"
    if _is_integral(x):
        return "int64"
    return None


def _compared(a, b, what: str) -> tuple[Proxy, Proxy]:
    p = _first_proxy(a, b)
    xs = [p.tracer.lift(a, p), p.tracer.lift(b, p)]
    for x in xs:
        if is_condition(x):
            raise DSLError(f"{what} a condition (a comparison's result): combine conditions "
                           f"with &, | and ~, or compare its .float()", user_loc())
        if not x.type.dtype.is_float:
            read = _integer_read(x)
            raise DSLError(f"{what} an integer ({x.type.dtype.value}) value"
                           f"{f' ({read})' if read else ''}: integer (type) values are not "
                           f"compared in a sarc layer; pick per-type values from a parameter "
                           f"table (W[edge.etype])", user_loc())
    common = _promoted(a, b, xs)
    return tuple(x if x.type.dtype is common else _converted(x, common.to_torch(), what)
                 for x in xs)


def _promoted(a, b, xs: list[Proxy]) -> DType:
    """The float dtype torch computes ``a`` op ``b`` in: the two traced values' promoted
    (float16 and bfloat16 give float32), a number taking the value's; two numbers, torch's
    default dtype."""
    traced = [x.type.dtype.to_torch() for v, x in zip((a, b), xs) if isinstance(v, Proxy)]
    if not traced and all(_is_int(v) for v in (a, b)):   # int64 in torch: arithmetic then
        return xs[0].type.dtype                        # takes the other operand's dtype
    if not traced:
        return DType.from_torch(torch.get_default_dtype())
    dtype = traced[0]
    for other in traced[1:]:
        dtype = torch.promote_types(dtype, other)
    return DType.from_torch(dtype)


def _greater_mask(a: Proxy, b: Proxy) -> Proxy:
    """1.0 where a > b: a - b is positive exactly there (never for NaN; inf - inf is NaN)."""
    return _where_positive(a - b, 1.0, 0.0)


def _equal_mask(a: Proxy, b: Proxy) -> Proxy:
    return a.tracer.emit(Op.EQ_MASK, [a, b])


_MASKS = {
    "gt": lambda a, b: _greater_mask(a, b),
    "lt": lambda a, b: _greater_mask(b, a),
    "ge": lambda a, b: _greater_mask(a, b) + _equal_mask(a, b),
    "le": lambda a, b: _greater_mask(b, a) + _equal_mask(a, b),
    "eq": _equal_mask,
    "ne": lambda a, b: 1.0 - _equal_mask(a, b),
}
_SYMBOLS = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}
_ALIASES = {"gt": ("greater",), "lt": ("less",), "ge": ("greater_equal",),
            "le": ("less_equal",), "eq": (), "ne": ("not_equal",)}


def _comparison(kind: str) -> Callable:
    def record(input, other, *, out=Fixed(None)):
        a, b = _compared(input, other, f"comparing ({_SYMBOLS[kind]})")
        return _condition(_MASKS[kind](a, b))
    return record


for _kind_name, _aliases in _ALIASES.items():
    _funcs = [getattr(torch, n) for n in (_kind_name, *_aliases)]
    _funcs += [getattr(torch.Tensor, n) for n in (_kind_name, *_aliases, f"__{_kind_name}__")]
    traces(*_funcs, name=f"torch.{_kind_name}")(_comparison(_kind_name))


def _as_condition(x, what: str) -> Proxy:
    if not is_condition(x):
        raise DSLError(f"{what} takes conditions (comparisons of traced values, x > 0), got "
                       f"{_kind(x) if not isinstance(x, Proxy) else 'a value that is not one'}",
                       user_loc())
    return x


def _both(a: Proxy, b: Proxy) -> Proxy:
    return a.tracer.emit(Op.MUL, [a, b])


@traces(torch.logical_and, torch.Tensor.logical_and, torch.Tensor.__and__,
        torch.Tensor.__rand__)
def _logical_and(input, other, *, out=Fixed(None)):
    a, b = _as_condition(input, "&"), _as_condition(other, "&")
    return _condition(_both(a, b))


@traces(torch.logical_or, torch.Tensor.logical_or, torch.Tensor.__or__, torch.Tensor.__ror__)
def _logical_or(input, other, *, out=Fixed(None)):
    a, b = _as_condition(input, "|"), _as_condition(other, "|")
    return _condition(a.tracer.emit(Op.ADD, [a, b]) - _both(a, b))


@traces(torch.logical_xor, torch.Tensor.logical_xor, torch.Tensor.__xor__,
        torch.Tensor.__rxor__)
def _logical_xor(input, other, *, out=Fixed(None)):
    a, b = _as_condition(input, "^"), _as_condition(other, "^")
    return _condition(a.tracer.emit(Op.ADD, [a, b]) - 2.0 * _both(a, b))


@traces(torch.logical_not, torch.Tensor.logical_not, torch.Tensor.__invert__,
        torch.Tensor.bitwise_not, torch.bitwise_not)
def _logical_not(input, *, out=Fixed(None)):
    return _condition(1.0 - _as_condition(input, "~"))


@traces(torch.isnan, torch.Tensor.isnan)
def _isnan(input):
    x = _traced(input, "isnan")
    return _condition(1.0 - _equal_mask(x, x))


@traces(torch.isfinite, torch.Tensor.isfinite)
def _isfinite(input):
    x = _traced(input, "isfinite")
    return _condition(_equal_mask(x - x, x.tracer.const(0.0, x)))   # inf - inf, NaN: NaN


@traces(torch.isinf, torch.Tensor.isinf)
def _isinf(input):
    x = _traced(input, "isinf")
    return _condition(_equal_mask(x, x) - _equal_mask(x - x, x.tracer.const(0.0, x)))


def _selected(cond, a, b, what: str) -> Proxy:
    """``a`` where ``cond`` holds, else ``b`` (numbers: constants), in the values' dtype."""
    c = _as_condition(cond, what)
    like = _first_proxy(a, b) if isinstance(a, Proxy) or isinstance(b, Proxy) else c
    xs = [c.tracer.lift(v, like) for v in (a, b)]
    for x in xs:
        if is_condition(x):
            raise DSLError(f"{what} between conditions: select values (a condition is read "
                           f"as its .float())", user_loc())
    dtype = _promoted(a, b, xs)
    xs = [x if x.type.dtype is dtype else _converted(x, dtype.to_torch(), what) for x in xs]
    mask = c if c.type.dtype is dtype else _converted(c, dtype.to_torch(), what)
    out = c.tracer.emit(Op.WHERE_POS, [mask, *xs])
    return _integral(out) if all(_whole(v) and not is_condition(v) for v in (a, b)) else out


@traces(torch.where)
def _where(condition, input=None, other=None, *, out=Fixed(None)):
    """``torch.where(cond, a, b)``: ``a`` where the comparison ``cond`` holds, else ``b``;
    the one-argument form (the indices where it holds) is refused."""
    if input is None or other is None:
        raise DSLError("torch.where(condition) gives the indices where it holds, a size "
                       "known only from the values: not traced; select with "
                       "torch.where(condition, a, b)", user_loc())
    return _selected(condition, input, other, "torch.where")


@traces(torch.Tensor.where)
def _where_method(input, condition, other):
    return _selected(condition, input, other, "Tensor.where")


@traces(torch.masked_fill, torch.Tensor.masked_fill)
def _masked_fill(input, mask, value):
    """``x.masked_fill(cond, value)``: ``value`` (a number) where ``cond`` holds, else x."""
    x = _traced(input, "masked_fill")
    if not _is_number(value) and not (isinstance(value, torch.Tensor) and value.dim() == 0):
        raise DSLError(f"masked_fill: the fill value is a number, got {_kind(value)}",
                       user_loc())
    fill, info = float(value), torch.finfo(x.type.dtype.to_torch())
    if math.isfinite(fill) and abs(fill) > info.max:   # torch refuses it too
        raise DSLError(f"masked_fill: the fill value {value!r} does not fit {x.type.dtype.value} "
                       f"(its largest is {info.max:.4g}); fill with torch.finfo(x.dtype).min "
                       f"or a value within it", user_loc())
    return _selected(mask, value, x, "masked_fill")


def _any_all(kind: str) -> Callable:
    def record(input, dim=None, keepdim=False, *, out=Fixed(None)):
        x = _as_condition(input, f"{kind}()")
        if dim is None:
            raise DSLError(f"{kind}() over all axes is not supported; name a feature dim "
                           f"(cond.{kind}(-1))", user_loc())
        axes = _feature_axes(x, dim, kind)
        return _condition(_reduce_axes(x, axes, keepdim, Op.MAX_AXIS,
                                       kind="max" if kind == "any" else "min"))
    return record


traces(torch.any, torch.Tensor.any, name="torch.any")(_any_all("any"))
traces(torch.all, torch.Tensor.all, name="torch.all")(_any_all("all"))


@traces(torch.Tensor.bool)
def _bool(input, memory_format=Fixed(torch.preserve_format)):
    """``cond.bool()``: a condition as it is; a float value is compared instead (x != 0)."""
    if is_condition(input):
        return input
    raise DSLError(f"Tensor.bool: {INTEGER_CONVERSION}; a condition is a comparison "
                   f"(x != 0)", user_loc())


def _keeps_conditions(traced) -> None:
    """Make a shape function (view, unsqueeze, cat, ...) of conditions give conditions."""
    record = traced.record

    def record_conditions(*args, **kwargs):
        out = record(*args, **kwargs)
        # the value reshaped: the first argument (view_as's other only gives a shape), or
        # each value of a list (cat, stack)
        first = args[0] if args else next(iter(kwargs.values()), None)
        given = [a for a in (first if isinstance(first, (list, tuple)) else (first,))
                 if isinstance(a, Proxy)]
        for kind, mark in ((is_condition, _condition), (_whole, _integral)):
            if given and all(kind(a) for a in given):
                for y in (out if isinstance(out, (list, tuple)) else (out,)):
                    if isinstance(y, Proxy):
                        mark(y)
                break
        return out
    traced.record = record_conditions


for _shape_function in (_reshape_method, _reshape_function, _reshape_as, _contiguous, _clone,
                        _detach,
                        _unsqueeze, _squeeze, _transpose, _permute, _permute_method, _flatten,
                        _getitem, _split, _split_method, _chunk, _narrow, _unbind, _cat,
                        _stack, _tile, _repeat, _expand):
    _keeps_conditions(_shape_function)


# --- more of torch, composed of the ops above with torch's formulas and gradients ---------

def _against(symbol: str, x: Proxy, number: float) -> Proxy:
    """The 0 / 1 mask of ``x <symbol> number`` (NaN compares false)."""
    kind = {v: k for k, v in _SYMBOLS.items()}[symbol]
    return _MASKS[kind](x, x.tracer.const(float(number), x))


def _where_positive(c: Proxy, a, b) -> Proxy:
    """``a`` where ``c`` > 0, else ``b`` (numbers: constants)."""
    t = c.tracer
    return t.emit(Op.WHERE_POS, [c, t.lift(a, c), t.lift(b, c)])


@traces(torch.sign, torch.Tensor.sign)
def _sign(input, *, out=Fixed(None)):
    """1, -1 or 0 (NaN: 0, as torch); no gradient."""
    x = _traced(input, "sign")
    return _where_positive(x, 1.0, _where_positive(-x, -1.0, 0.0))


@traces(F.hardswish)
def _hardswish(input, inplace=Fixed(False)):
    """``x (x + 3) / 6`` strictly inside (-3, 3), x above, 0 below (torch's gradient:
    (2x + 3) / 6 inside, 1 from 3 on, 0 up to -3; torch before 2.3 takes the inner one at
    -3 and 3 themselves)."""
    x = _traced(input, "hardswish")   # x <= -3 ? 0 : x >= 3 ? x : inside, as torch (NaN kept)
    xc = _between(x, -3.0, 3.0)   # so that the unchosen sides' gradients stay finite at ±inf
    inside = _where_positive(_against(">=", x, 3.0), x, xc * (xc + 3.0) / 6.0)
    return _where_positive(_against("<=", x, -3.0), x * 0.0, inside)   # -0, NaN at -inf


@traces(F.tanhshrink)
def _tanhshrink(input):
    x = _traced(input, "tanhshrink")
    return x - _emit(Op.TANH, x)


@traces(F.softshrink)
def _softshrink(input, lambd=0.5):
    x, lam = _traced(input, "softshrink"), _number(lambd, "softshrink's lambd")
    # x * 0 in the middle: 0 as torch's, NaN where x is
    return _where_positive(x - lam, x - lam, _where_positive(-lam - x, x + lam, x * 0.0))


@traces(F.hardshrink, torch.Tensor.hardshrink)
def _hardshrink(input, lambd=0.5):
    x, lam = _traced(input, "hardshrink"), _number(lambd, "hardshrink's lambd")
    inside = x.tracer.emit(Op.MUL, [_against(">=", x, -lam), _against("<=", x, lam)])
    return _where_positive(inside, 0.0, x)   # -l <= x <= l ? 0 : x, as torch (NaN kept)


@traces(torch.threshold, F.threshold)
def _threshold(input, threshold, value, inplace=Fixed(False)):
    """``value`` where x <= threshold, else ``x`` (a NaN kept), as torch."""
    x = _traced(input, "threshold")
    return _where_positive(_against("<=", x, _number(threshold, "threshold")),
                           _number(value, "value"), x)


@traces(torch.tan, torch.Tensor.tan)
def _tan(input, *, out=Fixed(None)):
    x = _traced(input, "tan")
    return _emit(Op.SIN, x) / _emit(Op.COS, x)


_LN2 = math.log(2.0)


@traces(torch.sinh, torch.Tensor.sinh)
def _sinh(input, *, out=Fixed(None)):
    """``exp(x - ln 2) - exp(-x - ln 2)``: no overflow short of torch's."""
    x = _traced(input, "sinh")
    return _emit(Op.EXP, x - _LN2) - _emit(Op.EXP, -x - _LN2)


@traces(torch.cosh, torch.Tensor.cosh)
def _cosh(input, *, out=Fixed(None)):
    x = _traced(input, "cosh")
    return _emit(Op.EXP, x - _LN2) + _emit(Op.EXP, -x - _LN2)


@traces(torch.exp2, torch.Tensor.exp2, torch.special.exp2)
def _exp2(input, *, out=Fixed(None)):
    return _emit(Op.EXP, _traced(input, "exp2") * _LN2)


@traces(torch.expm1, torch.Tensor.expm1, torch.special.expm1)
def _expm1(input, *, out=Fixed(None)):
    return _emit(Op.EXP, _traced(input, "expm1")) - 1.0


@traces(torch.log2, torch.Tensor.log2)
def _log2(input, *, out=Fixed(None)):
    return _emit(Op.LOG, _traced(input, "log2")) * (1.0 / _LN2)


@traces(torch.log10, torch.Tensor.log10)
def _log10(input, *, out=Fixed(None)):
    return _emit(Op.LOG, _traced(input, "log10")) * (1.0 / math.log(10.0))


@traces(torch.erfc, torch.Tensor.erfc, torch.special.erfc)
def _erfc(input, *, out=Fixed(None)):
    return 1.0 - _emit(Op.ERF, _traced(input, "erfc"))


@traces(torch.logit, torch.Tensor.logit, torch.special.logit)
def _logit(input, eps=None, *, out=Fixed(None)):
    """``log(x / (1 - x))``, x first clamped to [eps, 1 - eps] where eps is given (torch's
    gradient: none outside). Without eps, outside [0, 1] the value is NaN as torch's, and
    the gradient that formula's (finite), where torch's is NaN."""
    x = _traced(input, "logit")
    if eps is not None:
        lo = _number(eps, "logit's eps")
        x = _clamp.record(x, x.tracer.lift(lo, x), x.tracer.lift(1.0 - lo, x))
    return _emit(Op.LOG, x / (1.0 - x))


@traces(torch.heaviside, torch.Tensor.heaviside)
def _heaviside(input, values, *, out=Fixed(None)):
    """1 where x > 0, 0 where x < 0, ``values`` where x == 0; no gradient."""
    x = _traced(input, "heaviside")
    at_zero = x.tracer.lift(values, x)
    zero = x.tracer.const(0.0, x)
    return _where_positive(x, 1.0, x.tracer.emit(Op.WHERE_POS,
                                                 [_equal_mask(x, zero), at_zero, zero]))


@traces(torch.nan_to_num, torch.Tensor.nan_to_num)
def _nan_to_num(input, nan=0.0, posinf=None, neginf=None, *, out=Fixed(None)):
    """NaN, +inf and -inf replaced (by default: 0 and the dtype's largest / lowest
    number); the gradient passes where x is finite."""
    x = _traced(input, "nan_to_num")
    info = torch.finfo(x.type.dtype.to_torch())
    hi = info.max if posinf is None else _number(posinf, "posinf")
    lo = info.min if neginf is None else _number(neginf, "neginf")
    t = x.tracer
    finite = _equal_mask(x - x, t.const(0.0, x))
    infinite = _where_positive(x, hi, lo)
    number = t.emit(Op.WHERE_POS, [_equal_mask(x, x), infinite, t.lift(_number(nan, "nan"), x)])
    return t.emit(Op.WHERE_POS, [finite, x, number])


@traces(torch.lerp, torch.Tensor.lerp)
def _lerp(input, end, weight, *, out=Fixed(None)):
    """``start + w (end - start)`` where w < 0.5, else ``end - (end - start)(1 - w)``, as
    torch computes it."""
    start = _traced(input, "lerp")
    t = start.tracer
    end, w = t.lift(end, start), t.lift(weight, start)
    diff = end - start
    return t.emit(Op.WHERE_POS, [0.5 - w, start + w * diff, end - diff * (1.0 - w)])


@traces(torch.addcmul, torch.Tensor.addcmul)
def _addcmul(input, tensor1, tensor2, *, value=1, out=Fixed(None)):
    return input + _number(value, "value") * (tensor1 * tensor2)


@traces(torch.addcdiv, torch.Tensor.addcdiv)
def _addcdiv(input, tensor1, tensor2, *, value=1, out=Fixed(None)):
    return input + _number(value, "value") * (tensor1 / tensor2)


@traces(torch.addmm, torch.Tensor.addmm)
def _addmm(input, mat1, mat2, *, beta=1, alpha=1, out=Fixed(None)):
    """``beta input + alpha (mat1 @ mat2)``."""
    product = _arith(Op.MATMUL, mat1, mat2)
    beta, alpha = _number(beta, "beta"), _number(alpha, "alpha")
    scaled = product if alpha == 1 else product * alpha
    input = _cast_by_autocast(input)
    return scaled if beta == 0 else scaled + (input if beta == 1 else input * beta)


@traces(torch.rsub)
def _rsub(input, other, *, alpha=1):
    return other - _scaled(input, alpha)


@traces(torch.logsumexp, torch.Tensor.logsumexp, torch.special.logsumexp)
def _logsumexp(input, dim, keepdim=False, *, out=Fixed(None)):
    """``log(sum(exp(x - m))) + m`` over feature axes, m the maximum (0 where it is
    infinite, as torch)."""
    x = _traced(input, "logsumexp")
    axes = _feature_axes(x, dim, "logsumexp")
    m = _extremum_axes(x, axes, True, "max")
    t = x.tracer
    m = t.emit(Op.WHERE_POS, [_equal_mask(m - m, t.const(0.0, m)), m, t.const(0.0, m)])
    total = _sum_axes(_emit(Op.EXP, x - m), axes, True)
    out = _emit(Op.LOG, total) + m
    if keepdim:
        return out
    feat = tuple(n for a, n in enumerate(out.type.feat) if a not in set(axes))
    return _emit(Op.RESHAPE, out, feat=feat)


@traces(F.softmin)
def _softmin(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax.record(-_traced(input, "softmin"), dim, _stacklevel, dtype)


@traces(torch.std_mean)
def _std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return (_std.record(input, dim, unbiased, keepdim, correction=correction),
            _mean.record(input, dim, keepdim))


@traces(torch.var_mean)
def _var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return (_var.record(input, dim, unbiased, keepdim, correction=correction),
            _mean.record(input, dim, keepdim))


# Products of a value and parameters: einsum's.

@traces(torch.linalg.matmul)
def _linalg_matmul(input, other, *, out=Fixed(None)):
    return _product(input, other, "torch.linalg.matmul")


@traces(torch.linalg.vecdot)
def _vecdot(x, y, *, dim=-1, out=Fixed(None)):
    """The sum over ``dim`` (of the broadcast shape) of ``x * y``."""
    product = x * y
    return _sum_axes(product, _feature_axes(product, dim, "vecdot"), False)


def _letters_of(x) -> str:
    return _LETTERS[len(_LETTERS) - len(x.shape):]


@traces(torch.inner, torch.Tensor.inner)
def _inner(input, other, *, out=Fixed(None)):
    """The product over the last axes of both (``x @ W.T`` for a matrix W)."""
    a, b = _traced(input, "inner"), _traced(other, "inner")
    la, lb = _LETTERS[:len(a.shape)], _LETTERS[len(a.shape):len(a.shape) + len(b.shape)]
    lb = lb[:-1] + la[-1]
    return _contracted(f"{la},{lb}->{la[:-1]}{lb[:-1]}", [a, b], "torch.inner")


@traces(torch.outer, torch.ger, torch.Tensor.outer, torch.Tensor.ger)
def _outer(input, vec2, *, out=Fixed(None)):
    return _contracted("i,j->ij", [input, vec2], "torch.outer")


@traces(torch.mv, torch.Tensor.mv)
def _mv(input, vec, *, out=Fixed(None)):
    return _contracted("ij,j->i", [input, vec], "torch.mv")


@traces(torch.dot, torch.vdot, torch.Tensor.dot, torch.Tensor.vdot)
def _dot(input, other, *, out=Fixed(None)):
    return _contracted("i,i->", [input, other], "torch.dot")


@traces(torch.tensordot)
def _tensordot(a, b, dims=2, out=Fixed(None)):
    """einsum of ``a``'s last ``dims`` axes against ``b``'s first (or the listed axes)."""
    a, b = _traced(a, "tensordot"), _traced(b, "tensordot")
    na, nb = len(a.shape), len(b.shape)
    if _is_int(dims):
        pairs = list(zip(range(na - dims, na), range(dims)))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da = dims[0] if isinstance(dims[0], (list, tuple)) else [dims[0]]
        db = dims[1] if isinstance(dims[1], (list, tuple)) else [dims[1]]
        if len(da) != len(db) or not all(_is_int(d) for d in (*da, *db)):
            raise DSLError(f"tensordot: dims {dims!r} pair up axes of the two operands",
                           user_loc())
        pairs = [(d % na, e % nb) for d, e in zip(da, db)]
    else:
        raise DSLError(f"tensordot: dims is an int or two lists of axes, got {dims!r}",
                       user_loc())
    la, lb = list(_LETTERS[:na]), list(_LETTERS[na:na + nb])
    for d, e in pairs:
        lb[e] = la[d]
    shared = {la[d] for d, _ in pairs}
    out = [c for c in la if c not in shared] + [c for c in lb if c not in shared]
    return _contracted(f"{''.join(la)},{''.join(lb)}->{''.join(out)}", [a, b], "torch.tensordot")


@traces(F.bilinear, torch.bilinear)
def _bilinear(input1, input2, weight, bias=None):
    """``x1 W_o x2 + b_o`` for each output o, W [out, in1, in2]."""
    y = _contracted("ni,oij,nj->no", [input1, weight, input2], "F.bilinear")
    return y if bias is None else y + bias


# --- einsum -------------------------------------------------------------------------------

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
"""einsum's subscripts, in torch's order: a sublist's 0 is A, 26 is a."""


@traces(torch.einsum)
def _einsum(*args):
    """``torch.einsum`` as the ops it is made of, operand by operand, left to right: the
    running product and the next operand put in one axis order (size-1 axes where one
    lacks a letter) and multiplied, then summed over the letters no later operand and not
    the output has; the last product put in the output's order. A node or edge value's
    first letter is its row axis: every graph operand has the same one and the output
    keeps it first. A step that contracts one letter against a 2-d parameter is a matmul
    (``einsum('nhi,io->nho', x, W)``); another is a broadcast product of the two."""
    equation, operands = _einsum_arguments(args)
    return _contracted(equation, operands, f"einsum('{equation}')")


def _contracted(equation: str, operands: list, written: str) -> Proxy:
    """``einsum(equation, *operands)``; ``written``: the call as the user wrote it, for the
    errors (``torch.inner(x, y)`` is an einsum too)."""
    for x in operands:
        if isinstance(x, torch.Tensor) and not isinstance(x, Proxy):
            raise DSLError(f"{written}: an operand is a torch tensor of shape "
                           f"{list(x.shape)} that is not the layer's: make it a parameter "
                           f"(nn.Parameter) or a buffer of the layer (register_buffer)",
                           user_loc())
    proxies = [_traced(x, written) for x in operands]
    subscripts, output = _einsum_subscripts(equation, proxies, written)
    rows = _einsum_rows(written, proxies, subscripts, output)
    sizes: dict[str, int] = {}
    for x, letters in zip(proxies, subscripts):
        for letter, size in zip(_feature_letters(x, letters), x.type.feat):
            if sizes.get(letter, 1) not in (1, size) and size != 1:
                raise DSLError(f"{written}: subscript {letter} is of size "
                               f"{sizes[letter]} in one operand and {size} in another",
                               user_loc())
            sizes[letter] = max(sizes.get(letter, 1), size)
    order = [*output, *(c for c in dict.fromkeys(c for s in subscripts for c in s)
                        if c not in output)]
    product, letters = proxies[0], subscripts[0]
    for i in range(len(proxies)):
        needed = {*output, *(c for s in subscripts[i + 1:] for c in s)}
        if i > 0:
            product, letters = _einsum_step(product, letters, proxies[i], subscripts[i],
                                            needed, order)
        drop = [a for a, c in enumerate(_feature_letters(product, letters)) if c not in needed]
        if drop:
            product = _sum_axes(product, drop, False)
            letters = [c for c in letters if c in needed]
    own = _feature_letters(product, letters)
    product = _permuted(product, tuple(own.index(c) for c in output if c != rows))
    expanded = tuple(sizes[c] for c in output if c != rows)
    return product if product.type.feat == expanded else _expand.record(
        product, *((-1,) if product.type.domain is not Domain.PARAM else ()), *expanded)


def _einsum_step(a: Proxy, al: list[str], b: Proxy, bl: list[str], needed: set[str],
                 order: list[str]) -> tuple[Proxy, list[str]]:
    """The product of ``a`` and ``b`` (subscripts ``al``, ``bl``) and its subscripts: a
    matmul where it contracts one letter of a graph value against a 2-d parameter and
    nothing else needs it; else the two in ``order`` (the row axis first), multiplied."""
    for (x, xl), (w, wl) in (((a, al), (b, bl)), ((b, bl), (a, al))):
        if x.type.domain is Domain.PARAM or w.type.domain is not Domain.PARAM or len(wl) != 2:
            continue
        own = _feature_letters(x, xl)
        shared = [c for c in wl if c in own]
        if len(shared) != 1 or shared[0] in needed or wl[0] == wl[1]:
            continue
        k = shared[0]
        j = wl[1] if wl[0] == k else wl[0]
        if x.type.feat[own.index(k)] != w.type.feat[wl.index(k)]:
            continue
        x = _permuted(x, tuple([p for p, c in enumerate(own) if c != k] + [own.index(k)]))
        w = w if wl[0] == k else _permuted(w, (1, 0))
        rest = [c for c in xl if c != k]
        return _arith(Op.MATMUL, x, w), [*rest, j]
    batched = _einsum_per_batch(a, al, b, bl, needed, order)
    if batched is not None:
        return batched
    union = [c for c in order if c in al or c in bl]
    graph = a.type.domain is not Domain.PARAM or b.type.domain is not Domain.PARAM
    feat_letters = union[1:] if graph else union
    lined = []
    for x, xl in ((a, al), (b, bl)):
        own = _feature_letters(x, xl)
        size = dict(zip(own, x.type.feat))
        x = _permuted(x, tuple(sorted(range(len(own)),
                                      key=lambda p: feat_letters.index(own[p]))))
        feat = tuple(size.get(c, 1) for c in feat_letters)
        lined.append(x if x.type.feat == feat else _emit(Op.RESHAPE, x, feat=feat))
    return _arith(Op.MUL, *lined), union


_BATCHES = 64
"""The most matmuls a per-head contraction is unrolled into."""


def _einsum_per_batch(a: Proxy, al: list[str], b: Proxy, bl: list[str], needed: set[str],
                      order: list[str]) -> tuple[Proxy, list[str]] | None:
    """A graph value times a 3-d parameter sharing a kept letter (a head) and contracting
    another (``'nhi,hio->nho'``): a matmul per head, stacked, not the [rows, h, i, o]
    broadcast product; None where the step is not one (or has over ``_BATCHES`` heads)."""
    for (x, xl), (w, wl) in (((a, al), (b, bl)), ((b, bl), (a, al))):
        if x.type.domain is Domain.PARAM or w.type.domain is not Domain.PARAM or len(wl) != 3 \
                or len(set(wl)) != 3:
            continue
        own = _feature_letters(x, xl)
        shared = [c for c in wl if c in own]
        heads = [c for c in shared if c in needed]
        if len(shared) != 2 or len(heads) != 1:
            continue
        h = heads[0]
        n = x.type.feat[own.index(h)]
        if n != w.type.feat[wl.index(h)] or not 1 < n <= _BATCHES:
            continue
        xa, wa = own.index(h), wl.index(h)
        parts, letters = [], None
        for i in range(n):
            xi = _emit(Op.SLICE, x, axis=xa, start=i, stop=i + 1)
            xi = _emit(Op.RESHAPE, xi, feat=tuple(d for q, d in enumerate(xi.type.feat) if q != xa))
            wi = _emit(Op.SLICE, w, axis=wa, start=i, stop=i + 1)
            wi = _emit(Op.RESHAPE, wi, feat=tuple(d for q, d in enumerate(wi.type.feat) if q != wa))
            yi, letters = _einsum_step(xi, [c for c in xl if c != h], wi,
                                       [c for c in wl if c != h], needed, order)
            parts.append(_emit(Op.RESHAPE, yi, feat=(1, *yi.type.feat)))
        return x.tracer.emit(Op.CONCAT, parts, {"axis": 0}), [letters[0], h, *letters[1:]]
    return None


def _einsum_arguments(args) -> tuple[str, list]:
    """The equation and the operands, of either calling form: ``(equation, *operands)``
    (operands maybe one list) or torch's sublists ``(x, [0, 1], y, [1, 2], [0, 2])``."""
    if args and isinstance(args[0], str):
        operands = list(args[1:])
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = list(operands[0])
        return args[0].replace(" ", ""), operands

    def written(sublist) -> str:
        out = ""
        for s in sublist:
            if s is Ellipsis:
                out += "..."
            elif _is_int(s) and 0 <= s < len(_LETTERS):
                out += _LETTERS[s]
            else:
                raise DSLError(f"einsum: a sublist holds ints in [0, 52) or ..., got "
                               f"{_show_arg(s)}", user_loc())
        return out
    pairs, rest = list(args), None
    if len(pairs) % 2:
        rest = pairs.pop()
    operands, terms = pairs[0::2], [written(s) for s in pairs[1::2]]
    return ",".join(terms) + ("" if rest is None else "->" + written(rest)), operands


def _einsum_subscripts(equation: str, xs: list[Proxy],
                       written: str) -> tuple[list[list[str]], list[str]]:
    """Each operand's subscripts and the output's, as lists of names: ``...`` expanded to
    names of its own (aligned from the right, as torch broadcasts them); an output left
    implicit is the ellipsis, then the letters used once, in alphabetical order."""
    def refuse(why: str):
        raise DSLError(f"{written}: {why}", user_loc())
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        refuse(f"{len(terms)} operand subscripts for {len(xs)} operands")
    for term in [*terms, rhs]:
        if term.count("...") > 1:
            refuse(f"{term!r} has more than one ellipsis (...)")
        bad = term.replace("...", "")
        if bad.strip(_LETTERS) or "." in bad:
            refuse(f"a subscript is a letter (or ... once per operand), got {term!r}")
    widest, subscripts = 0, []
    for term, x in zip(terms, xs):
        ndim = len(x.type.shape)
        named = len(term.replace("...", ""))
        if "..." in term:
            if named > ndim:
                refuse(f"{term!r} names {named} axes of a value of shape {_shape(x.type)}")
            head, _, tail = term.partition("...")
            extra = ndim - named
            widest = max(widest, extra)
            ell = [f"...{i}" for i in range(extra - 1, -1, -1)]
            subscripts.append([*head, *ell, *tail])
        elif named != ndim:
            refuse(f"{term!r} names {named} axes of a value of shape {_shape(x.type)}")
        else:
            subscripts.append(list(term))
    for letters in subscripts:
        twice = {c for c in letters if letters.count(c) > 1}
        if twice:
            refuse(f"subscript {sorted(twice)[0]} twice in one operand takes a diagonal, "
                   f"which is not traced")
    ellipsis = [f"...{i}" for i in range(widest - 1, -1, -1)]
    if arrow:
        head, _, tail = rhs.partition("...")
        output = [*head, *ellipsis, *tail] if "..." in rhs else list(rhs)
    else:
        counts: dict[str, int] = {}
        for letters in subscripts:
            for c in letters:
                counts[c] = counts.get(c, 0) + 1
        output = [*ellipsis, *sorted(c for c, n in counts.items()
                                     if n == 1 and not c.startswith("..."))]
    used = {c for s in subscripts for c in s}
    for c in output:
        if c not in used:
            refuse(f"the output's subscript {c} is in no operand")
        if output.count(c) > 1:
            refuse(f"the output names subscript {c} twice")
    return subscripts, output


def _einsum_rows(written: str, xs: list[Proxy], subscripts, output) -> str | None:
    """The subscript of the row axis: the first of every node or edge operand, which a
    parameter does not have and the output keeps first (None: parameters only)."""
    graph = [s[0] for x, s in zip(xs, subscripts) if x.type.domain is not Domain.PARAM]
    if not graph:
        return None
    rows = graph[0]
    shown = rows if not rows.startswith("...") else "of the ellipsis"
    if any(r != rows for r in graph):
        raise DSLError(f"{written}: the node / edge operands' first subscripts "
                       f"{sorted(set(graph))} are their row axes, which are the same rows: "
                       f"give them one letter (an operation across rows is an aggregation, "
                       f"in reduce)", user_loc())
    if any(rows in s for x, s in zip(xs, subscripts) if x.type.domain is Domain.PARAM):
        raise DSLError(f"{written}: subscript {shown} is the row axis of the node / "
                       f"edge operands and names a parameter's axis too", user_loc())
    if rows not in output:
        raise AcrossRowsError(written, f": the output drops subscript {shown}, the "
                              f"row axis: a sum over rows is an aggregation, in reduce "
                              f"(sarc.sum/mean/max/min), or outside the layer")
    if output[0] != rows:
        raise DSLError(f"{written}: the row axis (subscript {shown}) is the "
                       f"output's first axis in a sarc layer", user_loc())
    for letters in subscripts:
        if rows in letters and letters[0] != rows:
            raise DSLError(f"{written}: the row axis (subscript {shown}) is the "
                           f"first axis of each operand", user_loc())
    return rows


def _feature_letters(x: Proxy, letters: list[str]) -> list[str]:
    return letters if x.type.domain is Domain.PARAM else letters[1:]


def _method(func) -> Callable:
    def method(self, *args, **kwargs):
        return call_torch(func, (self, *args), kwargs)
    method.__name__ = func.__name__
    method.__doc__ = f"Traced {_torch_name(func)}."
    return method


# Every traced Tensor method is a Proxy method; every operator torch.Tensor has, too
# (the ones sarc does not trace say so).
_TRACED_IDS = {id(f) for f in TORCH_FUNCTIONS}
# (not over a Proxy's own properties: its type is one, and calls torch's Tensor.type)
for _name in dir(torch.Tensor):
    _f = getattr(torch.Tensor, _name, None)
    if isinstance(Proxy.__dict__.get(_name), property):
        continue
    if _name in _OPERATORS or id(_f) in _TRACED_IDS:
        setattr(Proxy, _name, _method(_f))
# properties: a traced value's transposes
Proxy.T = property(lambda self: call_torch(torch.Tensor.T.__get__, (self,), {}))
Proxy.mT = property(lambda self: call_torch(torch.Tensor.mT.__get__, (self,), {}))


# --- constants over a value's rows -------------------------------------------------------

def ones_over_rows(degree: Proxy, feat: tuple[int, ...], value: float, dtype,
                   written: str) -> Proxy:
    """``value`` on every row of ``degree``'s domain (a degree, per row of the domain the
    tensor covers), of feature shape ``feat``: the degree compared with itself (1.0 on
    every row, never NaN, no gradient), scaled, widened to ``feat``, in ``dtype`` (a torch
    dtype, or None: the degree's)."""
    tracer = degree.tracer
    out = tracer.emit(Op.EQ_MASK, [degree, degree])
    if feat:
        out = tracer.emit(Op.RESHAPE, [out], {"feat": (1,) * len(feat)})
    if value != 1.0:
        out = out * value
    for axis, n in enumerate(feat):
        if not _is_int(n) or n < 1:
            raise DSLError(f"{written}: feature sizes are positive ints, got {n!r}", user_loc())
        out = _copies(out, axis, n)
    return out if dtype is None else _converted(out, dtype, written)


def degree_over(tracer, domain: Domain, dtype: DType) -> Proxy:
    """A degree over the rows of ``domain``: the destinations' in-degree (read per edge for
    the edges), the sources' out-degree (the inputs every layer is given); in ``dtype``
    where the layer reads it nowhere else (the leaf is shared by name and side)."""
    side = Domain.SRC if domain is Domain.SRC else Domain.DST
    name = "out_degree" if side is Domain.SRC else "in_degree"
    degree = tracer.proxy_type(tracer, tracer.builder.leaf(
        Op.INPUT, name, TensorType(side, dtype, ()), user_loc()))
    return tracer.emit(Op.GATHER_DST, [degree]) if domain is Domain.EDGE else degree


_TORCH_FILLS = {"ones": (torch.ones, 1.0), "zeros": (torch.zeros, 0.0),
                "full": (torch.full, None), "empty": (torch.empty, None)}
_TORCH_RESHAPE = torch.reshape


def _filled(name: str):
    """``torch.ones`` / ``zeros`` / ``full`` while a layer is traced: sized by a row count
    (``torch.ones(x.shape[0], 4)``, DGL's ``th.ones(g.num_edges(), 1)``) it is a constant
    per row of that domain, traced; other sizes are torch's own call. (Torch's argument
    parsing refuses a row count before any ``__torch_function__`` sees it.)"""
    original, value = _TORCH_FILLS[name]

    def fill(*args, **kwargs):
        if "size" in kwargs:
            args = (kwargs.pop("size"), *args)
        stand_in = _has_value(args)
        args = tuple(_valued(a) for a in args)
        size, rest = args, ()
        if name == "full":
            size, rest = args[:1], args[1:]
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        if not any(isinstance(d, RowCount) for d in size):
            if kwargs.get("device") is TRACED_DEVICE:   # made where tracing runs: a constant
                del kwargs["device"]                     # the tracer lifts (0-d) or refuses
            made = original(*args, **kwargs)
            if stand_in:   # sized by a stand-in graph's node count: for graph code only
                made._sarc_refusal = _sized_by_a_stand_in
            return made
        if name == "empty":
            raise DSLError(f"torch.empty({', '.join(map(str, size))}): its values are "
                           f"undefined; write torch.zeros or torch.full", user_loc())
        fill_value = value
        if name == "full":
            fill_value = rest[0] if rest else kwargs.pop("fill_value", None)
            rest = rest[1:]
        written = f"torch.{name}({', '.join(map(str, size))})"
        if rest or not _is_number(fill_value):
            raise DSLError(f"{written}: the fill value of a tensor over a graph's rows is a "
                           f"number", user_loc())
        return rows_filled(size, float(fill_value), kwargs, written)
    fill.__name__ = name
    fill.__doc__ = original.__doc__
    return fill


def _valued(x):
    """A row count that has a value (a stand-in graph's, ``frontends.pyg_prepare``) as that
    number, inside a size too: the graph code that reads it computes on real tensors."""
    if isinstance(x, RowCount) and x.value is not None:
        return x.value
    if isinstance(x, (tuple, list)):
        return type(x)(_valued(v) for v in x)
    return x


def _sized_by_a_stand_in(t: torch.Tensor) -> str:
    return (f"a tensor of shape {list(t.shape)} sized by the node count (x.size(0)) is used "
            f"with a traced value: with graph code in the forward, x.size(0) sizes only the "
            f"graph code's tensors; make a per-node tensor from x itself (torch.ones_like(x), "
            f"x[:, :1] * 0 + 1)")


def _has_value(x) -> bool:
    """Whether ``x`` (a size, or arguments) holds a row count that has a value."""
    if isinstance(x, RowCount):
        return x.value is not None
    return isinstance(x, (tuple, list)) and any(_has_value(v) for v in x)


def rows_filled(size: tuple, value: float, kwargs: dict, written: str) -> Proxy:
    """A tensor of ``value`` over the rows of a domain (``size[0]``, a row count) and the
    feature sizes ``size[1:]``: the domain's degree compared with itself (1.0 on every row,
    no gradient), times ``value``, widened to the feature sizes; in ``dtype=`` if given,
    else the layer's precision."""
    rows, feat = size[0], size[1:]
    if not isinstance(rows, RowCount) or any(not _is_int(d) or d < 0 for d in feat):
        raise DSLError(f"{written}: a row count (x.shape[0], g.num_edges()) is the first "
                       f"size, the rows; the others are feature sizes (ints)", user_loc())
    unknown = [k for k in kwargs if k not in ("dtype", "device", "requires_grad")]
    if unknown or kwargs.get("requires_grad"):
        arg = unknown[0] if unknown else "requires_grad"
        raise DSLError(f"{written}: argument {arg}= is not supported while sarc traces the "
                       f"layer (dtype= and device= are)", user_loc())
    if rows.tracer is None:
        raise DSLError(f"{written}: a row count of a value of no layer being traced",
                       user_loc())
    domain = next(d for d in (Domain.EDGE, Domain.DST, Domain.SRC) if d.rows == rows.symbol)
    if 0 in feat:
        return EmptyRows(domain, tuple(feat), written)
    degree = degree_over(rows.tracer, domain, rows.tracer.precision or DType.F32)
    return ones_over_rows(degree, tuple(feat), value, kwargs.get("dtype"), written)


def _reshape_routed(input, shape):
    """torch.reshape while a layer is traced: a traced value's shape may name its rows
    (``torch.reshape(x, x.shape[:1] + (1,))``), which torch's own argument parsing refuses."""
    if isinstance(input, Proxy):
        return call_torch(_TORCH_RESHAPE, (input, shape), {})
    return _TORCH_RESHAPE(input, shape)


_TORCH_EINSUM = torch.einsum


def _einsum_routed(*args):
    """torch.einsum while a layer is traced: torch's own einsum reads the sublist form only
    when its first operand is a torch.Tensor, so ``einsum(x, [0, 1], [1, 0])`` of a traced
    value would reach torch as an equation."""
    values = [a for a in args if isinstance(a, Proxy)]
    values += [v for a in args if isinstance(a, (list, tuple)) for v in a
               if isinstance(v, Proxy)]
    if values:
        return call_torch(_TORCH_EINSUM, args, {})
    return _TORCH_EINSUM(*args)


def _cat_routed(original):
    """torch.cat / torch.concat while a layer is traced: a piece of no value (``EmptyRows``,
    ``x.new_zeros(N, 0)``), which torch's own argument parsing refuses, is dropped."""
    def cat(tensors, *args, **kwargs):
        if isinstance(tensors, (list, tuple)) and any(isinstance(t, EmptyRows) for t in tensors):
            return call_torch(original, (tensors, *args), kwargs)
        return original(tensors, *args, **kwargs)
    cat.__name__ = original.__name__
    return cat


def valued_route(original):
    """``original`` (``torch.arange``) taking a row count that has a value (a stand-in
    graph's, ``frontends.pyg_prepare``) as that number, which torch's parsing of a Number
    takes."""
    def route(*args, **kwargs):
        return original(*(_valued(a) for a in args),
                        **{k: _valued(v) for k, v in kwargs.items()})
    route.__name__ = original.__name__
    return route


ROW_COUNT_ROUTES = {**{f: _filled(name) for name, (f, _) in _TORCH_FILLS.items()},
                    _TORCH_RESHAPE: _reshape_routed, _TORCH_EINSUM: _einsum_routed,
                    **{f: _cat_routed(f) for f in (torch.cat, torch.concat, torch.concatenate)}}
"""torch's functions whose arguments torch's own parsing keeps from the tracer (sizes
holding a row count; einsum's sublists of a traced value), and what runs in their place
while a layer is traced (``trace_guards.tracing``)."""


def _filled_like(name: str, value: float | None):
    def record(input, *args, fill_value=None, dtype=None, layout=Fixed(None),
               device=Fixed(None), requires_grad=Fixed(False),
               memory_format=Fixed(torch.preserve_format)):
        x = _traced(input, name)
        fill = value
        given = [*args, *([] if fill_value is None else [fill_value])]
        if value is None:
            if len(given) != 1:
                raise DSLError(f"{name}(x, fill_value) takes one fill value", user_loc())
            fill = given[0]
        elif given:
            raise DSLError(f"{name}: unexpected argument {_show_arg(given[0])}", user_loc())
        if not _is_number(fill):
            raise DSLError(f"{name}: the fill value is a number, got {_kind(fill)}", user_loc())
        if x.type.domain is Domain.PARAM:
            raise DSLError(f"{name} of a parameter: write the constant itself (a number "
                           f"broadcasts), or declare a parameter", user_loc())
        want = dtype if dtype is not None else x.type.dtype.to_torch()
        degree = degree_over(x.tracer, x.type.domain,
                             x.type.dtype if x.type.dtype.is_float else DType.F32)
        return ones_over_rows(degree, x.type.feat, float(fill), want, name)
    return record


def _new_filled(name: str, value: float | None):
    """``x.new_zeros(size)`` / ``new_ones`` / ``new_full``: over a row count
    (``x.new_zeros(x.shape)``, ``h.new_ones(h.shape[0], 1)``) a constant per row of that
    domain, in x's dtype unless ``dtype=`` is given; ``new_empty`` is refused."""
    def record(input, *args, **kwargs):
        x = _traced(input, f"Tensor.{name}")
        written = f"Tensor.{name}"
        if name == "new_empty":
            raise DSLError(f"{written}: its values are undefined; write new_zeros or "
                           f"new_full", user_loc())
        args = list(args)
        size = kwargs.pop("size", None)
        if size is None and args and isinstance(args[0], (tuple, list, torch.Size)):
            size = args.pop(0)
        elif size is None and value is not None:   # new_zeros(n, 4): the sizes as arguments
            size = tuple(args)
            args = []
        if size is None:
            raise DSLError(f"{written} needs a size (a tuple)", user_loc())
        fill = value
        if value is None:
            fill = args.pop(0) if args else kwargs.pop("fill_value", None)
            if not _is_number(fill):
                raise DSLError(f"{written}: the fill value is a number, got {_kind(fill)}",
                               user_loc())
        if args:
            raise DSLError(f"{written}: unexpected argument {_show_arg(args[0])}", user_loc())
        size = tuple(size) if isinstance(size, (tuple, list, torch.Size)) else (size,)
        kwargs.setdefault("dtype", x.type.dtype.to_torch())
        if not any(isinstance(d, RowCount) for d in size):
            raise DSLError(f"{written}{tuple(size)}: a tensor of fixed size made inside a layer "
                           f"is a constant; write the number itself (it broadcasts), or size "
                           f"it by a row count (x.shape[0]) for one per row", user_loc())
        return rows_filled(size, float(fill), kwargs, f"{written}{tuple(size)}")
    return record


for _name, _value in (("new_zeros", 0.0), ("new_ones", 1.0), ("new_full", None),
                      ("new_empty", 0.0)):
    traces(getattr(torch.Tensor, _name), name=f"Tensor.{_name}")(_new_filled(_name, _value))
    setattr(Proxy, _name, _method(getattr(torch.Tensor, _name)))


for _name, _value in (("ones_like", 1.0), ("zeros_like", 0.0), ("full_like", None)):
    traces(getattr(torch, _name), name=f"torch.{_name}")(_filled_like(f"torch.{_name}", _value))


# torch's own function, which PyG replaces by a wrapper of it when imported first
@traces(torch._C._VariableFunctions.index_select, torch.Tensor.index_select)
def _index_select(input, dim, index, *, out=Fixed(None)):
    """``torch.index_select(W, 0, edge.etype)``: a parameter table's rows picked per node or
    edge, as ``W[edge.etype]``; other dims and operands are refused."""
    if not isinstance(index, Proxy):
        raise DSLError("index_select: the index is an int64 node or edge value (edge.etype) "
                       "picking rows of a parameter table", user_loc())
    if isinstance(input, Proxy) and input.type.domain is not Domain.PARAM:
        raise DSLError(f"index_select of {input.type.domain.article} value: only a parameter "
                       f"table's rows are picked per node or edge (W[edge.etype])", user_loc())
    if dim != 0:
        raise DSLError(f"index_select(..., dim={dim!r}, ...): rows of a parameter table are "
                       f"picked along dim 0", user_loc())
    return _getitem(input, index)


@traces(F.embedding)
def _embedding(input, weight, padding_idx=None, max_norm=Fixed(None), norm_type=Fixed(2.0),
               scale_grad_by_freq=Fixed(False), sparse=Fixed(False)):
    """``F.embedding(edge.etype, W)`` (and ``nn.Embedding``): the rows of a parameter table
    picked per node or edge, ``W[edge.etype]``. A ``padding_idx`` row gets no gradient in
    torch, which the traced table does not model: refused."""
    if padding_idx is not None:
        raise DSLError("embedding(..., padding_idx=...): the padding row's gradient is not "
                       "modelled; write W[index] with a table whose row you keep fixed",
                       user_loc())
    if not isinstance(input, Proxy):
        raise DSLError("embedding: the index is an int64 node or edge value (edge.etype) "
                       "picking rows of a parameter table", user_loc())
    return _getitem(weight, input)


@traces(torch.bmm, torch.Tensor.bmm)
def _bmm(input, mat2, *, out=Fixed(None)):
    """``torch.bmm(x.unsqueeze(1), W[edge.etype])``: each row times its type's matrix, a
    typed linear (``[rows, 1, in] @ [rows, in, out]``, as R-GCN and RGAT write it); other
    batched products are refused."""
    hint = ("torch.bmm is traced as each row times its type's matrix: bmm(x.unsqueeze(1), "
            "W[edge.etype]) with W a parameter [types, in, out]; a matrix per row computed in "
            "the layer (NNConv's) is torch.einsum('ei,eio->eo', x, w)")
    if not (isinstance(input, Proxy) and isinstance(mat2, Proxy)):
        raise DSLError(hint, user_loc())
    tracer = input.tracer
    picked = tracer.builder.values[mat2.index]
    feat = input.type.feat
    if picked.op is not Op.INDEX or len(feat) != 2 or feat[0] != 1:
        raise DSLError(hint, user_loc())
    table, types = (tracer.proxy_type(tracer, i) for i in picked.inputs)
    if table.type.domain is not Domain.PARAM or len(table.type.feat) != 3 \
            or table.type.feat[1] != feat[1]:
        raise DSLError(hint, user_loc())
    rows = _emit(Op.RESHAPE, input, feat=(feat[1],))
    typed = tracer.emit(Op.TYPED_LINEAR, [rows, table, types])
    return _emit(Op.RESHAPE, typed, feat=(1, table.type.feat[2]))
