"""dtype conversions in a layer equal torch's, and half precision computes as torch does.

``x.float()``, ``.double()``, ``.half()``, ``.bfloat16()``, ``.to(dtype)``, ``.to(other)``,
``.type(dtype)``, ``.type_as(other)`` and the ``dtype=`` of sum / mean / softmax trace to
the IR's cast (none where the dtype is the value's already): each equals torch on real
tensors, output and gradient, on every backend and the interpreter. A float16 / bfloat16
layer norm, softmax and GELU compute in float32 and round once, as torch's own: rows of
magnitude 1000 stay finite where squares in float16 would not. Conversions to integers and
device moves are refused at the user's line.
"""
from __future__ import annotations

import linecache

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from difftest import BACKENDS, Apply, assert_close, check_layer, reference
from sarc.ir.ops import Op

N, W = 12, 8
LOOPS = sarc.Graph.from_edges(torch.arange(N), torch.arange(N), N)


def _features(scale: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(N, W, generator=gen) * scale


def _casts(layer: sarc.Layer) -> list:
    return [v for v in layer.trace().values if v.op is Op.CAST]


# --- each conversion against torch, float32 layers --------------------------------------------

CONVERSIONS = {
    "double": lambda s, x: (x.double() * 1.25).exp().float() * x,
    "half": lambda s, x: x.half().float() * x,
    "bfloat16": lambda s, x: x.bfloat16().float() + x,
    "to-dtype": lambda s, x: x.to(torch.float16).to(torch.float32) - x.to(torch.float64).float(),
    "to-dtype-keyword": lambda s, x: x.to(dtype=torch.float64).sigmoid().to(dtype=torch.float32),
    "to-other": lambda s, x: x.double().tanh().to(x) + x.half().to(s.w) * s.w,
    "type": lambda s, x: x.type(torch.float64).relu().type(torch.float32)
    + x.type("torch.HalfTensor").type(torch.float32),
    "type-as": lambda s, x: x.double().exp().type_as(x) + x.bfloat16().type_as(s.w),
    "sum-dtype": lambda s, x: torch.sum(x, -1, keepdim=True, dtype=torch.float64).float() * x
    + x.sum(dim=1, dtype=torch.float16).float()[:, None],
    "mean-dtype": lambda s, x: x.mean(-1, keepdim=True, dtype=torch.float64).float() * x,
    "softmax-dtype": lambda s, x: F.softmax(x, -1, dtype=torch.float64).float()
    + torch.log_softmax(x, -1, dtype=torch.float64).float()
    + x.softmax(1, dtype=torch.float64).float(),
    "copy-and-non-blocking": lambda s, x: x.to(torch.float64, non_blocking=True).to(
        torch.float32, copy=True),
}


class WithWeight(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.w = nn.Parameter(torch.randn(W))


def _equals_torch(make, fn, backend: str, features=_features, rtol: float = 1e-5,
                  grad_rtol: float = 1e-5) -> None:
    """``make()``'s layer on ``backend`` equals ``fn`` run by torch: the output, the input's
    and every parameter's gradient; and a fresh one equals the interpreter."""
    layer = make()
    layer.set_backend(backend)
    dtype = layer.precision().to_torch()
    x = features().to(dtype).requires_grad_()
    out = layer(LOOPS, x)
    xr = features().to(dtype).requires_grad_()
    want = fn(layer, xr)
    assert out.dtype == want.dtype
    assert_close(out.float(), want.float(), rtol, "output")
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    leaves = [*layer.parameters()]
    got = torch.autograd.grad((out * cot).sum(), [x, *leaves], allow_unused=True)
    ref = torch.autograd.grad((want * cot).sum(), [xr, *leaves], allow_unused=True)
    for a, b in zip(got, ref):
        if b is None:
            assert a is None or not a.any()
            continue
        assert a.dtype == b.dtype
        assert_close(a.float(), b.float(), grad_rtol, "gradient", 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversions_equal_torch(name, backend):
    def make():
        torch.manual_seed(1)
        return WithWeight(CONVERSIONS[name])
    _equals_torch(make, CONVERSIONS[name], backend)
    assert _casts(make())
    check_layer(make(), LOOPS, {"h": _features()})


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversions_with_gradients_from_the_backward_ir_equal_torch(name):
    """``autodiff="ir"``: the cast's VJP (the cotangent cast back) gives torch's gradient."""
    def make():
        torch.manual_seed(1)
        return WithWeight(CONVERSIONS[name]).set_autodiff("ir")
    _equals_torch(make, CONVERSIONS[name], "torch")


def test_a_conversion_to_the_values_own_dtype_is_no_cast():
    layer = Apply(lambda s, x: x.float() + x.to(torch.float32) + x.type_as(x)
                  + x.type(torch.float32) + x.to(x.dtype)
                  + x.sum(-1, keepdim=True, dtype=torch.float32))
    assert _casts(layer) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_layer_converts_to_float32_and_back(backend):
    """In a float16 layer ``.float()`` computes in float32 and ``.to(h.dtype)`` returns:
    the same as torch on the half tensors."""
    fn = lambda s, x: ((x.float() * 1.5).exp() / 1e3).to(x.dtype) * s.w  # noqa: E731
    make = lambda: WithWeight(fn).half()  # noqa: E731
    _equals_torch(make, fn, backend, rtol=1e-3, grad_rtol=1e-3)
    casts = _casts(make())
    assert [c.attr["dtype"].value for c in casts] == ["f32", "f16"]


# --- half precision: layer norm, softmax, GELU in float32, as torch's ------------------------

def _big_rows() -> torch.Tensor:
    """Rows of magnitude ~1000 (their squares pass float16's 65504), one of them constant."""
    x = _features(1000.0)
    x[3] = 250.0
    return x


def _layer_norm_layer():
    torch.manual_seed(1)
    ln = nn.LayerNorm(W)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    return Apply(lambda s, x: s.mod(x), module=ln)


HALF = [torch.float16, torch.bfloat16]


def _torch_layer_norm(s, x):
    """torch's layer norm of ``s.mod``'s parameters on half tensors; where its CPU kernels
    have none for the dtype (torch 2.2's float16), what they compute: the float32 one,
    rounded once."""
    try:
        return F.layer_norm(x, (W,), s.mod.weight, s.mod.bias)
    except RuntimeError as e:
        if "not implemented for" not in str(e):
            raise
    return _layer_norm_in_float32(s, x)


def _layer_norm_in_float32(s, x):
    """What torch's half layer norm computes (torch 2.13's CPU kernels to the bit, forward
    and backward): the float32 one of the widened tensors, rounded once. (torch 2.2's
    bfloat16 backward is off by 8% of the largest gradient of these rows.)"""
    return F.layer_norm(x.float(), (W,), s.mod.weight.float(), s.mod.bias.float()).to(x.dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_layer_norm_of_large_rows_equals_torch(dtype, backend):
    """torch's F.layer_norm on half tensors accumulates in float32 and rounds once; in
    float16 the squares of the variance would be inf."""
    make = lambda: _layer_norm_layer().to(dtype)  # noqa: E731
    # one rounding of the output in both; the gradients: torch's half backward rounds too
    _equals_torch(make, _layer_norm_in_float32, backend, _big_rows, rtol=1e-2, grad_rtol=5e-2)
    layer = make()
    layer.set_backend(backend)
    x = _big_rows().to(dtype)
    assert_close(layer(LOOPS, x).float(), _torch_layer_norm(layer, x).float(), 2 * _ULP[dtype],
                 "output against torch's half layer norm")


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_layer_norm_with_gradients_from_the_backward_ir_equals_torch(dtype):
    make = lambda: _layer_norm_layer().to(dtype).set_autodiff("ir")  # noqa: E731
    _equals_torch(make, _layer_norm_in_float32, "torch", _big_rows, rtol=1e-2, grad_rtol=5e-2)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_layer_norm_on_the_interpreter(dtype):
    layer = _layer_norm_layer().to(dtype)
    x = _big_rows().to(dtype)
    out = reference(layer, LOOPS, {"h": x})["h"]
    want = _torch_layer_norm(layer, x)
    assert out.dtype == dtype
    assert_close(out.float(), want.float(), 1e-2, "output")


SOFTMAXES = {
    "softmax-heads": lambda s, x: torch.softmax(x.view(-1, 4, 2), 1).flatten(1),
    "softmax": lambda s, x: F.softmax(x, dim=-1),
    "log-softmax": lambda s, x: F.log_softmax(x.view(-1, 2, 4), -1).flatten(1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", sorted(SOFTMAXES))
def test_half_softmax_of_large_logits_equals_torch(name, dtype, backend):
    """torch's softmax of half tensors computes in float32: one rounding of the result.
    (Its CPU kernel of a half log_softmax rounds on the way, which a log-probability near 0
    shows: there sarc's is torch's float32 one rounded, and near torch's half one at the
    scale of the logits.)"""
    fn = SOFTMAXES[name]
    x = _features(300.0).to(dtype)
    xs = x.clone().requires_grad_()
    got = _half_layer(fn, dtype, backend)(LOOPS, xs)
    xr = x.clone().requires_grad_()
    want = fn(None, xr)
    assert got.dtype == want.dtype == dtype
    _within_an_ulp(got, fn(None, x.float()).to(dtype))
    ulp = _ULP[dtype]
    if name == "log-softmax":
        assert_close(got.float(), want.float(), ulp, "output", x.float().abs().max().item())
    else:
        _within_an_ulp(got, want)
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    (g,) = torch.autograd.grad((got * cot).sum(), [xs])
    (r,) = torch.autograd.grad((want * cot).sum(), [xr])
    assert_close(g.float(), r.float(), 8 * ulp, "gradient", 1.0)


_ULP = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}   # relative, of a normal value
_TINY = {torch.float16: 2.0 ** -14, torch.bfloat16: 2.0 ** -126}  # the smallest normal one


def _within_an_ulp(got: torch.Tensor, want: torch.Tensor, cancels: torch.Tensor | None = None
                   ) -> None:
    """Each entry at most one unit in the last place from torch's: both round a float32
    result once (the same float32 result rounded alike, or a tie broken the other way).
    Computed in the half dtype step by step, entries are off by 5 to 40 units.

    ``cancels``: where the float32 formula itself loses digits, the size of what cancels
    (GELU's ``x * (1 + erf(x / sqrt 2))`` at x = -5: ``1 + erf`` is 3e-7, known to float32's
    2^-24 of 1, so its result to |x| 2^-24, a fifth of itself). Two float32 erfs (torch's
    vectorized GELU on AVX-512, and on AVX2, and sarc's formula) differ there by that much,
    several units of a float16 subnormal: allowed on top of the unit."""
    ulp, tiny = _ULP[want.dtype], _TINY[want.dtype]
    a, b = got.detach().double(), want.detach().double()
    assert torch.isfinite(a).all()
    allowed = ulp * b.abs().clamp_min(tiny)
    if cancels is not None:
        allowed = allowed + 2.0 ** -23 * cancels.detach().double().abs()
    err = ((a - b).abs() / allowed).max().item()
    assert err <= 1.0, f"{err:.2f} units in the last place from torch's"


def _half_layer(fn, dtype, backend):
    """A layer without parameters whose feature is declared in ``dtype``."""
    declared = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    layer = Apply(fn, width=sarc.Feature((W,), declared))
    layer.set_backend(backend)
    return layer


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_half_gelu_of_large_values_equals_torch(approximate, backend):
    """The tanh form cubes its input: past 113 its term 0.044715 x^3 is inf in float16."""
    fn = lambda s, x: F.gelu(x, approximate=approximate)  # noqa: E731
    x = _features(30.0).half()
    x[0] = torch.tensor([-200.0, -120.0, -5.0, -0.5, 0.0, 0.5, 120.0, 200.0])
    xs = x.clone().requires_grad_()
    got = _half_layer(fn, torch.float16, backend)(LOOPS, xs)
    xr = x.clone().requires_grad_()
    want = fn(None, xr)
    _within_an_ulp(got, want, cancels=x.clamp(max=0))  # 1 + erf(x / sqrt 2) for x < 0
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).half()
    (g,) = torch.autograd.grad((got * cot).sum(), [xs])
    (r,) = torch.autograd.grad((want * cot).sum(), [xr])
    assert_close(g.float(), r.float(), 1e-2, "gradient", 1.0)


# --- integer features converted ------------------------------------------------------------

class Weighted(sarc.Layer):
    """Each source's features scaled by its integer count, converted with ``.float()``."""

    def __init__(self):
        super().__init__(node={"h": W, "count": sarc.INDEX})

    def message(self, src, dst, edge):
        return src.h * src.count.float().unsqueeze(-1) + src.count.to(src.h.dtype)[:, None]

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_integer_feature_converted_is_an_arithmetic_operand(backend):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 9, (40,)), torch.randint(0, 9, (40,)), 9)
    h, count = torch.randn(9, W), torch.randint(0, 5, (9,))
    layer = Weighted()
    layer.set_backend(backend)
    hs = h.clone().requires_grad_()
    out = layer(g, h=hs, count=count)
    hr = h.clone().requires_grad_()
    msg = hr[g.src] * count[g.src].float()[:, None] + count[g.src].float()[:, None]
    want = torch.zeros(9, W).index_add(0, g.dst, msg)
    assert_close(out, want, 1e-5, "output")
    cot = torch.randn(9, W)
    (a,) = torch.autograd.grad((out * cot).sum(), [hs])
    (b,) = torch.autograd.grad((want * cot).sum(), [hr])
    assert_close(a, b, 1e-5, "gradient")
    check_layer(Weighted(), g, {"h": h, "count": count})


class CastPerEdge(sarc.Layer):
    """Casts of values of both sides of an edge: they stay in the fused region of the sum
    (a Triton kernel rounds its tile to float16 there), where casts of one side's values
    move ahead of the gather."""

    def __init__(self):
        super().__init__(node={"h": W, "count": sarc.INDEX})

    def message(self, src, dst, edge):
        return ((src.h * dst.h).half().float() + src.h * dst.count.float()[:, None]
                + (src.h.double() * dst.h.double()).float())

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg


@pytest.mark.parametrize("backend", BACKENDS)
def test_casts_inside_fused_edge_regions_equal_the_interpreter(backend):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 9, (40,)), torch.randint(0, 9, (40,)), 9)
    layer = CastPerEdge()
    layer.set_backend(backend)
    h, count = torch.randn(9, W), torch.randint(0, 5, (9,))
    check_layer(layer, g, {"h": h, "count": count})
    fused = [v for v in layer.compiled().function.values if v.op is Op.AGGREGATE]
    assert any(u.op is Op.CAST for v in fused for u in v.attr["body"].values)
    if backend == "triton":
        assert any(".to(tl.float16)" in k.source for k in layer.compiled().kernels)


class Bf16PerEdge(sarc.Layer):
    """A bfloat16 round trip of a product of both ends of an edge in a float32 or float64
    layer: the cast stays in the fused region of the sum, where a Triton kernel rounds to
    nearest even as torch does (float64 through float32)."""

    def __init__(self):
        super().__init__(node={"h": W})
        self.w = nn.Parameter(torch.linspace(0.5, 2.0, W))

    def message(self, src, dst, edge):
        return (src.h * dst.h * self.w).bfloat16().to(src.h.dtype) + src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bf16_cast_inside_a_fused_edge_region_rounds_as_torch(backend, dtype):
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 9, (40,)), torch.randint(0, 9, (40,)), 9)
    layer = Bf16PerEdge().to(dtype).set_backend(backend)
    h = torch.randn(9, W, dtype=dtype) * 3
    out = check_layer(layer, g, {"h": h})["h"]
    m = (h[g.src] * h[g.dst] * layer.w.detach()).bfloat16().to(dtype) + h[g.src]
    assert_close(out.detach(), torch.zeros_like(h).index_add_(0, g.dst, m), 1e-6, "output")
    fused = [v for v in layer.compiled().function.values if v.op is Op.AGGREGATE]
    assert any(u.op is Op.CAST for v in fused for u in v.attr["body"].values)
    if backend == "triton":
        assert any("_bf16_round(" in k.source for k in layer.compiled().kernels)


def test_an_integer_feature_unconverted_is_still_refused_with_the_conversion_named():
    class Raw(Weighted):
        def message(self, src, dst, edge):
            return src.h * src.count.unsqueeze(-1)

    with pytest.raises(sarc.DSLError, match=r"src\.count is an integer feature.*x\.float\(\)"):
        Raw().trace()


def test_an_integer_value_long_is_no_cast():
    class Long(Weighted):
        def message(self, src, dst, edge):
            return src.h * src.count.long().to(torch.int64).float()[:, None]

    casts = [v for v in Long().trace().values if v.op is Op.CAST]
    assert [c.attr["dtype"].value for c in casts] == ["f32"]


# --- refusals, at the user's line -------------------------------------------------------------

@pytest.mark.parametrize("key, snippet, message", [
    (lambda x: x.long(), "x.long()", r"Tensor\.long to torch\.int64: a sarc layer converts "
                                     r"values to float dtypes only"),
    (lambda x: x.int(), "x.int()", r"Tensor\.int: a sarc layer converts values to float"),
    (lambda x: x.bool(), "x.bool()", r"Tensor\.bool: a sarc layer converts values to float"),
    (lambda x: x.to(torch.int32), "torch.int32", "to float dtypes only"),
    (lambda x: x.type(torch.int64), "x.type(torch.int64)", "to float dtypes only"),
    (lambda x: x.sum(-1, dtype=torch.int64), "dtype=torch.int64", "to float dtypes only"),
    (lambda x: x.to("cuda"), 'x.to("cuda")', r"Tensor\.to\('cuda'\): a sarc layer runs on "
                                             r"the device of the tensors it is given"),
    (lambda x: x.to("cpu", torch.float64), 'x.to("cpu"', "runs on the device"),
    (lambda x: x.to(device="cuda", dtype=torch.float64), 'device="cuda"', "runs on the device"),
    (lambda x: x.type("torch.cuda.FloatTensor"), "torch.cuda.FloatTensor", "runs on the device"),
    (lambda x: x.to(memory_format=torch.channels_last), "channels_last", "no memory format"),
    (lambda x: x.to(torch.complex64), "complex64", "not torch.complex64"),
    (lambda x: x.to(), "x.to()", "Tensor.to needs a dtype"),
    (lambda x: x.type(), "x.type()", r"read x\.dtype"),
    (lambda x: x.float(memory_format=torch.channels_last), "channels_last",
     "only memory_format=torch.preserve_format"),
])
def test_conversions_not_modelled_are_refused_at_the_users_line(key, snippet, message):
    layer = Apply(lambda s, x: key(x))
    with pytest.raises(sarc.DSLError, match=message) as info:
        layer.trace()
    loc = info.value.loc
    assert loc is not None and loc.file == __file__
    assert snippet in linecache.getline(loc.file, loc.line)


@pytest.mark.parametrize("key, snippet", [
    (lambda s, x: x.float() * x, "x.float() * x"),
    (lambda s, x: x.float() @ s.m, "x.float() @ s.m"),
])
def test_mixed_dtypes_are_refused_with_the_conversion_to_write(key, snippet):
    """torch would promote: sarc asks for the conversion that says which dtype is meant."""
    class Mixed(Apply):
        def __init__(self):
            super().__init__(key)
            self.m = nn.Parameter(torch.randn(W, W))

    with pytest.raises(sarc.DSLError, match=r"dtype mismatch: f32 and f64: convert one "
                                            r"operand.*\.to\(.*\.dtype\).*\.type_as\(") as info:
        Mixed().double().trace()
    loc = info.value.loc
    assert loc is not None and loc.file == __file__
    assert snippet in linecache.getline(loc.file, loc.line)
