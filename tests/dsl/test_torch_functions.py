"""The torch functions a layer may call equal torch on real tensors, output and gradient.

Each case is a function ``f`` of a per-node value, traced inside a layer's ``update``
(``f(dst.h)``, after a sum over self loops that hands each node its own features): the
compiled layer on every backend, and the reference interpreter, give ``f`` of the tensor
as torch computes it, and the gradient torch's autograd gives. The activations sarc
composes from its ops (GELU, SiLU, softplus, layer norm, clamp's max) are held to
torch's own; new axes (``x[..., None]``) and ``squeeze`` are reshapes.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.errors import DSLError
from sarc.ir.ops import Op
from sarc.ir.types import Domain
from difftest import BACKENDS, Apply, assert_close, check_layer

N, W = 12, 8


CASES = {
    "gelu": lambda s, x: F.gelu(x),
    "gelu-tanh": lambda s, x: F.gelu(x, approximate="tanh"),
    "gelu-module": lambda s, x: s.mod(x),
    "silu": lambda s, x: F.silu(x),
    "silu-module": lambda s, x: s.mod(x),
    "softplus": lambda s, x: F.softplus(x),
    "softplus-beta-threshold": lambda s, x: F.softplus(x, beta=2.0, threshold=3.0),
    "softplus-module": lambda s, x: s.mod(x),
    "erf": lambda s, x: torch.erf(x) + x.erf(),
    "var-std": lambda s, x: (x.var(-1, keepdim=True) + torch.std(x, dim=-1, keepdim=True)
                             + x.view(-1, 2, 4).var(dim=(1, 2), unbiased=False)[:, None]
                             + torch.var(x, -1, correction=0)[:, None] + 0 * x),
    "maximum-minimum": lambda s, x: (torch.maximum(x, x[:, :1])
                                     + torch.minimum(x.relu(), 0.5 * x.relu())
                                     + x.maximum(torch.tensor(0.0)) - torch.minimum(x, x)),
    "relu6-hardtanh": lambda s, x: F.relu6(x) + F.hardtanh(x, -2.0, 3.0) + nn.ReLU6()(x),
    "hardsigmoid-softsign": lambda s, x: F.hardsigmoid(x) + F.softsign(x),
    "logsigmoid-mish": lambda s, x: F.logsigmoid(x) + F.mish(x) + nn.Mish()(x),
    "selu-celu": lambda s, x: F.selu(x) + F.celu(x, alpha=0.7) + torch.selu(x),
    "glu": lambda s, x: torch.cat([F.glu(x), nn.GLU(dim=-1)(x)], dim=-1),
    "prelu-module": lambda s, x: s.mod(x),
    "prelu-shared": lambda s, x: s.mod(x),
    "cos-sin": lambda s, x: torch.cos(x) * torch.sin(x) + x.cos() - x.sin(),
    "cosine-cutoff": lambda s, x: 0.5 * (torch.cos(x.abs().clamp(max=5.0) * math.pi / 5.0) + 1),
    "log1p": lambda s, x: torch.log1p(x.abs()) + (x * 1e-9).abs().log1p() * 1e9
                          + torch.special.log1p(x.square()),
    "layer-norm-module": lambda s, x: s.mod(x),
    "layer-norm-2-axes": lambda s, x: F.layer_norm(x.view(-1, 2, 4), (2, 4), eps=1e-3).flatten(1),
    "layer-norm-no-affine": lambda s, x: s.mod(x),
    "clamp-both": lambda s, x: torch.clamp(x, -0.5, 0.75),
    "clamp-max": lambda s, x: x.clamp(max=0.5) + torch.clamp_max(x, 1.0),
    "clip": lambda s, x: x.clip(min=-1.0, max=1.0),
    "new-axes": lambda s, x: (x[..., None] * x[:, None, :]).sum(-1),
    "filled-like": lambda s, x: (x * torch.full_like(x, 0.5) + torch.ones_like(x)
                                 - torch.zeros_like(x.view(-1, 2, 4)).flatten(1)
                                 + torch.full_like(x, fill_value=-2.0, dtype=x.dtype)),
    "squeeze": lambda s, x: (x.view(-1, 1, 2, 4, 1).squeeze().sum(-1).sum(-1, keepdim=True)
                             * x.view(-1, 8, 1).squeeze(-1) + x.view(-1, 1, 8).squeeze(1)),
    "cat-empty-piece": lambda s, x: (torch.cat([x, x.new_zeros((x.shape[0], 0))], -1)
                                     + torch.concat((torch.zeros(x.size(0), 0), x), dim=1)),
    # recurrent cells (a GGNN's or an MPNN's update): torch.gru_cell, lstm_cell, rnn_*_cell
    "gru-cell": lambda s, x: s.mod(x, x.tanh()),
    "gru-cell-no-state": lambda s, x: s.mod(x),
    "gru-cell-no-bias": lambda s, x: s.mod(x.relu(), x),
    "lstm-cell": lambda s, x: torch.cat(s.mod(x, (x.tanh(), 0.5 * x)), -1),
    "lstm-cell-no-state": lambda s, x: s.mod(x)[1],
    "rnn-tanh-cell": lambda s, x: s.mod(x, x.sin()),
    "rnn-relu-cell": lambda s, x: s.mod(x),
}
MODULES = {"gelu-module": lambda: nn.GELU(), "silu-module": lambda: nn.SiLU(),
           "gru-cell": lambda: nn.GRUCell(W, W), "gru-cell-no-state": lambda: nn.GRUCell(W, 5),
           "gru-cell-no-bias": lambda: nn.GRUCell(W, W, bias=False),
           "lstm-cell": lambda: nn.LSTMCell(W, W), "lstm-cell-no-state": lambda: nn.LSTMCell(W, 3),
           "rnn-tanh-cell": lambda: nn.RNNCell(W, W),
           "rnn-relu-cell": lambda: nn.RNNCell(W, 6, nonlinearity="relu"),
           "prelu-module": lambda: nn.PReLU(W, init=0.1),
           "prelu-shared": lambda: nn.PReLU(init=-0.3),
           "softplus-module": lambda: nn.Softplus(beta=0.5),
           "layer-norm-module": lambda: nn.LayerNorm(W),
           "layer-norm-no-affine": lambda: nn.LayerNorm(W, elementwise_affine=False)}


def _features():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, W, generator=gen) * 3
    x[0] = torch.tensor([-0.5, 0.75, 0.5, 1.0, -1.0, 0.0, 30.0, -30.0])  # the kinks, saturation
    return x


def _seeded(cls, fn):
    torch.manual_seed(1)
    return cls(fn)


def _layer(name):
    torch.manual_seed(1)
    module = MODULES[name]() if name in MODULES else None
    if isinstance(module, nn.LayerNorm) and module.weight is not None:
        with torch.no_grad():
            module.weight.normal_()
            module.bias.normal_()
    return Apply(CASES[name], module=module)


LOOPS = sarc.Graph.from_edges(torch.arange(N), torch.arange(N), N)


def _equals_torch(make, fn, backend: str) -> None:
    """``make()``'s layer (``update`` returning ``fn(layer, h)``) on ``backend`` equals ``fn``
    run by torch on the same tensor: output, the input's and every parameter's gradient;
    and a fresh one equals the interpreter."""
    layer = make()
    layer.set_backend(backend)
    x = _features().requires_grad_()
    out = layer(LOOPS, x)
    xr = _features().requires_grad_()
    want = fn(layer, xr)
    assert out.shape == want.shape
    assert_close(out, want, 1e-5, "output")
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    leaves = [*layer.parameters()]
    got = torch.autograd.grad((out * cot).sum(), [x, *leaves], allow_unused=True)
    ref = torch.autograd.grad((want * cot).sum(), [xr, *leaves], allow_unused=True)
    for a, b in zip(got, ref):
        if b is None:
            assert a is None or not a.any()
            continue
        assert_close(a, b, 1e-5, "gradient", 1e-6)
    check_layer(make(), LOOPS, {"h": _features()})  # the interpreter agrees too


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(set(CASES) - {"squeeze"}) + ["squeeze"])
def test_equals_torch(name, backend):
    _equals_torch(lambda: _layer(name), CASES[name], backend)


@pytest.mark.parametrize("key, message", [
    (lambda x: x[1:3], "taken whole"),
    (lambda x: x[:, ::2], "step 2"),
    (lambda x: x[:, 5:2], "is empty"),
    (lambda x: x.split([3, 3], -1), "adding up to the axis' 8"),
    (lambda x: x.chunk(2), "row axis"),
    (lambda x: x.t(), "would move its row axis"),
    (lambda x: x.max(-1).indices, "are not traced; use .values"),
    (lambda x: (lambda v, i: v * i)(*x.max(-1)), "are not traced; use .values"),
    (lambda x: x[0:, ::1][:, 1:3] * x.view(-1, 4, 2).permute(0, 5, 1).flatten(1), "out of range"),
    (lambda x: x.view(-1, 2, 4).squeeze(4), "squeeze: dim 4 is out of range"),
    (lambda x: x.max(), "max over all axes is not supported"),
    (lambda x: F.softmax(x), "softmax needs dim="),
    (lambda x: x.view(-1, 2, 4).permute(1, 0, 2), "moves the row axis"),
    (lambda x: x[None], "before the row axis"),
    (lambda x: F.gelu(x, approximate="erf"), "approximate must be 'none' or 'tanh'"),
    (lambda x: F.layer_norm(x, (3,)), r"layer_norm over \[3\]"),
    (lambda x: torch.clamp(x), "clamp needs min=... or max=..."),
    (lambda x: x + x.new_zeros(x.shape[0], 0), r"new_zeros\(N_dst, 0\).*only as a piece of "
                                                 r"torch.cat"),
    (lambda x: torch.cat([x, x.new_zeros(x.shape[0], 0, 2)], -1), "the sizes differ off"),
    (lambda x: x * (x.device == torch.device("cpu")), "device of a traced value is not known"),
    (lambda x: x * (x.device.type == "cuda"), "device of a traced value is not known"),
    (lambda x: x + torch.zeros(8, device=x.device), "tensor of shape \\[8\\] that is not a"),
    (lambda x: x + torch.arange(8, device=x.device), r"arange\(\) received .*device= is the "
                                                    r"device of a traced value"),
])
def test_what_is_not_modelled_is_refused(key, message):
    _refused_with(lambda s, x: key(x), message)


def _refused_with(fn, message, layer=Apply):
    """Tracing ``layer(fn)`` raises ``message`` (a regex) at the test's line. Matched against
    the problem, not the quoted source line, which holds the pattern itself."""
    import re
    with pytest.raises(sarc.DSLError) as err:
        layer(fn).trace()
    problem = str(err.value).splitlines()[0]
    assert re.search(message, problem) and "test_torch_functions.py:" in problem, problem


# --- ranges of feature axes: slicing, split, chunk, narrow, unbind -----------------------------

SLICES = {
    "slice-last": lambda s, x: x[:, 2:6] * x[..., :4],
    "slice-negative": lambda s, x: x[:, -3:] + x[:, 1:-4],
    "int-index": lambda s, x: x.view(-1, 2, 4)[:, 1] * x[:, 0:1] + x[..., 5, None],
    "heads": lambda s, x: x.view(-1, 2, 4)[:, :, 1:3].flatten(1),
    "chunk": lambda s, x: (lambda a, b: a * torch.sigmoid(b))(*x.chunk(2, dim=-1)),
    "chunk-uneven": lambda s, x: torch.cat([p.sum(-1, keepdim=True) for p in x.chunk(3, -1)], -1),
    "split": lambda s, x: (lambda a, b, c: a * c + b.sum(-1, keepdim=True))(*x.split([3, 2, 3], -1)),
    "split-int": lambda s, x: torch.cat(torch.split(x, 3, dim=1)[::-1], -1),
    "narrow": lambda s, x: x.narrow(-1, 2, 3) - torch.narrow(x, 1, 0, 3),
    "unbind": lambda s, x: sum(x.view(-1, 4, 2).unbind(1)),
    "param-slice": lambda s, x: x[:, :4] * s.w[:4] + x[:, 4:] @ s.m[2:, :4],
}


class ApplyWithParams(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.w = nn.Parameter(torch.randn(W))
        self.m = nn.Parameter(torch.randn(6, 5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SLICES))
def test_ranges_equal_torch(name, backend):
    _equals_torch(lambda: _seeded(ApplyWithParams, SLICES[name]), SLICES[name], backend)


class SliceInMessage(sarc.Layer):
    """Ranges of an edge value inside the message (fused on the torch backend; Triton
    leaves a sliced region to PyTorch) and of an aggregate in update."""

    def __init__(self):
        super().__init__(node={"h": W})
        self.lin = nn.Linear(W, 8)

    def message(self, src, dst, edge):
        z = self.lin(src.h)
        gate, value = z.chunk(2, dim=-1)
        return {"m": torch.sigmoid(gate + dst.h[:, :4]) * value}

    def reduce(self, msg):
        return {"s": sarc.sum(msg.m), "x": sarc.max(msg.m[:, 1:3])}

    def update(self, dst, agg):
        return torch.cat([agg.s[:, :2], agg.x], -1)


# --- axes reordered: transpose, permute, a parameter's .T -------------------------------------

AXES = {
    "transpose": lambda s, x: x.view(-1, 2, 4).transpose(1, 2).reshape(-1, 8) * x,
    "transpose-negative": lambda s, x: torch.transpose(x.view(-1, 2, 4), -1, -2).flatten(1),
    "swapaxes": lambda s, x: x.view(-1, 2, 2, 2).swapaxes(1, 3).flatten(1),
    "permute": lambda s, x: x.view(-1, 2, 2, 2).permute(0, 3, 1, 2).flatten(1)
    + torch.permute(x.view(-1, 4, 2), (0, 2, 1)).flatten(1),
    "param-T": lambda s, x: x @ s.m8.T + x @ s.m8.t() + x @ s.m8.mT,
    "param-permute": lambda s, x: (x.view(-1, 2, 4) * s.w3.permute(1, 0, 2)[0]).flatten(1),
    "unflatten": lambda s, x: (x.unflatten(-1, (2, 4))
                               * torch.unflatten(x, 1, (4, -1)).transpose(1, 2)).flatten(1),
    "mm": lambda s, x: torch.mm(x, s.m8.T) @ s.m8 + x.mm(s.m8.t()).sum(-1, keepdim=True),
    # a matrix product per row of two values of the layer (NNConv's per-edge weight)
    "row-matmul": lambda s, x: (x.view(-1, 2, 4) @ x.view(-1, 4, 2)).flatten(1)
    + torch.matmul(x.unsqueeze(1), (x @ s.m8.T)[:, :4].unsqueeze(1).expand(-1, 8, 4)).flatten(1)
    + x.view(-1, 2, 2, 2).matmul(x.view(-1, 2, 2, 2).transpose(-1, -2)).flatten(1)[:, :1],
}


class ApplyWithMatrices(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.m8 = nn.Parameter(torch.randn(5, W))
        self.w3 = nn.Parameter(torch.randn(2, 1, 4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(AXES))
def test_axes_reordered_equal_torch(name, backend):
    _equals_torch(lambda: _seeded(ApplyWithMatrices, AXES[name]), AXES[name], backend)


@pytest.mark.parametrize("fn, message", [
    (lambda s, x: x.unflatten(0, (2, -1)), "row axis"),
    (lambda s, x: x.unflatten(-1, (3, -1)), r"cannot unflatten features \[8\] into \[3, -1\]"),
    (lambda s, x: torch.mm(x.view(-1, 2, 4), s.m8[:, :4].T), "mm takes two matrices"),
    (lambda s, x: x @ x.view(-1, 8, 1), r"x.unsqueeze\(1\) @ w \(as many axes on both sides\)"),
])
def test_unflatten_and_mm_refuse_what_torch_refuses(fn, message):
    _refused_with(fn, message, ApplyWithMatrices)


class HeadsTransposed(sarc.Layer):
    """Heads as [E, C, H] inside the message (the transpose of a per-edge value)."""

    def __init__(self):
        super().__init__(node={"h": W})
        self.lin = nn.Linear(W, 6)

    def message(self, src, dst, edge):
        z = self.lin(src.h).view(-1, 2, 3).transpose(1, 2)          # [E, 3, 2]
        score = (z * dst.h[:, None, :2]).sum(1)                      # [E, 2]
        return {"z": z, "s": score}

    def reduce(self, msg):
        w = sarc.edge_softmax(msg.s)                                  # [E, 2]
        return sarc.sum(msg.z * w[:, None, :])

    def update(self, dst, agg):
        return agg.agg.transpose(1, 2).flatten(1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("make", [SliceInMessage, HeadsTransposed], ids=lambda c: c.__name__)
def test_per_edge_ranges_and_transposes_equal_the_interpreter(make, backend):
    """On a random graph: in messages (fused or hoisted), the reduce and the update."""
    torch.manual_seed(0)
    g = sarc.Graph.from_edges(torch.randint(0, 20, (70,)), torch.randint(0, 20, (70,)), 20)
    layer = make()
    layer.set_backend(backend)
    check_layer(layer, g, {"h": torch.randn(20, W)})


# --- extrema and softmax over a feature axis ---------------------------------------------------

EXTREMA = {
    "amax": lambda s, x: x.view(-1, 2, 4).amax(-1) * 1.0 + torch.amin(x, dim=1, keepdim=True),
    "amax-axes": lambda s, x: x.view(-1, 2, 2, 2).amax(dim=(1, 3)),
    "max-values": lambda s, x: x.view(-1, 2, 4).max(-1).values + torch.min(x.view(-1, 4, 2), 1)[0].sum(-1, keepdim=True),
    "max-keepdim": lambda s, x: x - x.max(dim=-1, keepdim=True).values,
    "max-unpacked": lambda s, x: (lambda v, _: v)(*x.view(-1, 2, 4).max(-1)),
    "softmax": lambda s, x: F.softmax(x.view(-1, 2, 4), dim=-1).flatten(1) + x.softmax(1),
    "softmax-heads": lambda s, x: torch.softmax(x.view(-1, 4, 2), 1).flatten(1),
    "log-softmax": lambda s, x: F.log_softmax(x, dim=-1) + x.log_softmax(-1),
    # every entry ties (x * 0 + 1), and the clamped rows tie at 0: amax's gradient is shared
    "ties": lambda s, x: (x * 0.0 + 1.0).amax(-1, keepdim=True) * x
    + x.clamp(max=0.0).amax(-1, keepdim=True),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(EXTREMA))
def test_extrema_and_softmax_equal_torch(name, backend):
    _equals_torch(lambda: Apply(EXTREMA[name]), EXTREMA[name], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_layer_norm_of_a_constant_row_has_finite_gradients(backend):
    """A row whose features are all equal (variance 0): the rsqrt's derivative,
    (var + eps)^-1.5, overflows float16; the layer norm divides by the square root instead,
    whose gradient is finite, as torch's LayerNorm's is."""
    torch.manual_seed(0)
    layer = Apply(CASES["layer-norm-module"], module=nn.LayerNorm(W)).half()
    layer.set_backend(backend)
    x = _features()
    x[3] = 0.25  # a constant row
    xh = x.half().requires_grad_()
    out = layer(LOOPS, xh)
    (out.float() * torch.linspace(-1, 1, W)).sum().backward()
    assert torch.isfinite(xh.grad).all() and torch.isfinite(layer.mod.weight.grad).all()
    xf = x.half().float().requires_grad_()
    ref = F.layer_norm(xf, (W,), layer.mod.weight.float(), layer.mod.bias.float())
    (ref * torch.linspace(-1, 1, W)).sum().backward()
    assert_close(out.float(), ref, 2e-2, "output")
    assert_close(xh.grad.float(), xf.grad, 5e-2, "gradient", 1e-2)


class WithTensorParams(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.p3 = nn.Parameter(torch.randn(2, 4, 3))
        self.s = nn.Parameter(torch.tensor(2.0))


PARAM_AXES = {
    "T-reverses-every-axis": lambda s, x: (x.view(-1, 4, 2) * s.p3.T[0]).flatten(1),
    "mT-swaps-the-last-two": lambda s, x: (x.view(-1, 2, 4) * s.p3.mT[:, 0]).flatten(1),
    "squeeze-0d": lambda s, x: x * s.s.squeeze(0) + x * s.s.squeeze(),
}


@pytest.mark.filterwarnings("ignore:The use of `x.T` on tensors")
@pytest.mark.parametrize("name", sorted(PARAM_AXES))
def test_parameter_axes_equal_torch(name):
    _equals_torch(lambda: _seeded(WithTensorParams, PARAM_AXES[name]), PARAM_AXES[name], "torch")


@pytest.mark.parametrize("fn, message", [
    (lambda s, x: x * s.p3.t()[0, 0, 0], r"t\(\) takes a parameter of at most 2 axes"),
    (lambda s, x: x * s.s.mT, r"\.mT takes a parameter of at least 2 axes"),
])
def test_transposes_torch_refuses_are_refused(fn, message):
    with pytest.raises(sarc.DSLError, match=message):
        WithTensorParams(fn).trace()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_low_precision_softplus_does_not_overflow(dtype):
    """Past 11, half precision's exp overflows: softplus is built of exp(-|z|) only."""
    layer = Apply(lambda s, x: F.softplus(x), module=nn.Linear(1, 1)).to(dtype)  # its dtype
    x = torch.tensor([[12.0, 15.0, 19.5, 25.0, -30.0, 0.0, 3.0, -3.0]]).repeat(N, 1).to(dtype)
    x.requires_grad_()
    out = layer(LOOPS, x)
    (out.float().sum()).backward()
    want = F.softplus(x.detach().float())
    assert torch.isfinite(out.float()).all() and torch.isfinite(x.grad.float()).all()
    assert_close(out.float(), want, 1e-2, "output")
    assert_close(x.grad.float(), torch.sigmoid(x.detach().float()) * (x.detach().float() <= 20)
                 + (x.detach().float() > 20), 1e-2, "gradient")


# --- norms, squares, stacking and repeats over feature axes -----------------------------------

NORMS = {
    "normalize": lambda s, x: F.normalize(x, dim=-1)
    + F.normalize(x.view(-1, 2, 4), p=2, dim=1, eps=1e-3).flatten(1),
    "normalize-p1": lambda s, x: F.normalize(x, p=1.0, dim=-1) * x,
    # row 0's feature 5 is 0: a zero vector, whose norm is clamped to eps
    "normalize-zero": lambda s, x: F.normalize(x[:, 5:7], dim=-1) + F.normalize(x[:, 5:6], dim=1),
    "norm": lambda s, x: torch.norm(x, dim=-1, keepdim=True) * x
    + x.norm(p=1, dim=1, keepdim=True) + x.norm(2, -1).unsqueeze(-1)
    + torch.linalg.vector_norm(x.view(-1, 2, 4), dim=-1).sum(-1, keepdim=True),
    "linalg-norm": lambda s, x: torch.linalg.norm(x, dim=-1, keepdim=True) * x
    + torch.linalg.norm(x.view(-1, 2, 4), ord=1, dim=2).sum(-1, keepdim=True)
    + torch.linalg.norm(x.view(-1, 2, 4), dim=(1, 2)).unsqueeze(-1)
    + torch.linalg.norm(x.view(-1, 2, 4), "fro", (-1, -2), True).flatten(1),
    # torch's gradient of a 2-norm is 0 where the norm is 0 (the root's derivative is not)
    "norm-zero": lambda s, x: torch.linalg.vector_norm(x[:, 5:6], dim=-1, keepdim=True) * x,
    "square": lambda s, x: torch.square(x) + x.square(),
    "stack": lambda s, x: torch.stack([x, x * 2.0], dim=1).flatten(1)
    + torch.stack(x.view(-1, 2, 4).unbind(1), -1).flatten(1).repeat(1, 2),
    "tile": lambda s, x: x.view(-1, 1, 8).tile(1, 2, 1).flatten(1) + x.tile(2) + x.tile((1, 2)),
    "repeat": lambda s, x: x.view(-1, 2, 4).repeat(1, 1, 2).flatten(1) + x.repeat((1, 2)),
    "expand": lambda s, x: (x.view(-1, 2, 1, 4).expand(-1, 2, 3, 4).flatten(1)
                            + x[:, :1].expand(x.shape[0], 24) + x[:, :1].expand_as(x.repeat(1, 3))),
    # DGL GATConv's edge weight: [E].tile(1, H, 1) is [1, H, E], transposed back to [E, H, 1]
    "tile-rows-moved-back": lambda s, x: x[:, 0].tile(1, 3, 1).transpose(0, 2).flatten(1)
    + x[:, 1].repeat(3, 1).permute(1, 0),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norms_stacks_and_repeats_equal_torch(name, backend):
    _equals_torch(lambda: Apply(NORMS[name]), NORMS[name], backend)


@pytest.mark.parametrize("key, message", [
    (lambda x: F.normalize(x, p=3), r"the 3-norm is not traced; sarc traces the 1-norm"),
    (lambda x: torch.norm(x, p="nuc", dim=-1), r"the 'nuc'-norm is not traced"),
    (lambda x: torch.norm(x), "a norm over all axes is not supported"),
    (lambda x: torch.linalg.norm(x), "a norm over all axes is not supported"),
    (lambda x: torch.linalg.norm(x.view(-1, 2, 4), 2, (1, 2)),
     r"linalg.norm\(ord=2, dim=\(1, 2\)\): sarc traces a vector norm"),
    (lambda x: torch.linalg.norm(x, "fro", -1), "the 'fro' norm is of a matrix"),
    (lambda x: torch.stack([x, x]), r"stacks along the row axis .*torch.stack\(xs, dim=1\)"),
    (lambda x: x.repeat(2, 1), "repeats the rows of a dst value"),
    (lambda x: x.repeat(2), "give a count for each of the value's 2 axes"),
    (lambda x: x[:, 0].tile(1, 2, 1) * 2.0, r"row axis is not its first .*x.transpose\(0, 2\)"),
    (lambda x: x * x[:, 0].tile(1, 8, 1), r"arithmetic of a value whose row axis is not its"),
    (lambda x: torch.sigmoid(x[:, 0].tile(2, 1)), r"torch.sigmoid of a value whose row axis"),
    (lambda x: x.expand(4, 8), "the row axis of a dst value is kept"),
    (lambda x: x.expand(-1, 16), "an axis of size 8 cannot be expanded to 16"),
    (lambda x: x.tile(1, 0), "a repeat count is a positive int"),
])
def test_norm_stack_and_repeat_refusals_say_what_to_write(key, message):
    _refused_with(lambda s, x: key(x), message)


def test_a_batch_norm_is_refused_by_name_with_what_to_do():
    """nn.BatchNorm1d reads self.training (batch statistics while training): the refusal names
    it, not only the mode."""
    layer = Apply(lambda s, x: s.mod(x), module=nn.BatchNorm1d(W))
    with pytest.raises(sarc.DSLError) as err:
        layer.trace()
    problem = str(err.value).splitlines()[0]
    assert "nn.BatchNorm1d reads self.training" in problem, problem
    assert "apply the batch norm to the layer's output" in problem, problem
    assert "nn.LayerNorm" in problem and "test_torch_functions.py:" in problem, problem


class FilledPerEdge(sarc.Layer):
    """Constants over an edge value's rows and a source value's rows (degrees read per edge
    and per source, compared with themselves) inside a message."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        m = dst.h - src.h
        return m * torch.full_like(m, 0.5) + torch.ones_like(src.h) - torch.zeros_like(m)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_filled_like_per_edge_equals_torch(backend):
    """``torch.ones_like`` / ``zeros_like`` / ``full_like`` of per-edge and per-source values
    (on a graph whose nodes 4 and 5 have no edges): torch's value, and no gradient through
    the constants."""
    src, dst = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1, 2, 3, 0, 2])
    g = sarc.Graph.from_edges(src, dst, 6)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    layer = FilledPerEdge().set_backend(backend)
    out = layer(g, x)
    xr = x.detach().clone().requires_grad_()
    m = xr[dst] - xr[src]
    want = torch.zeros(6, 4).index_add(0, dst, m * 0.5 + 1.0)
    assert_close(out, want, 1e-6, "output")
    cot = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    (got,) = torch.autograd.grad((out * cot).sum(), [x])
    (ref,) = torch.autograd.grad((want * cot).sum(), [xr])
    assert_close(got, ref, 1e-6, "gradient", 1e-7)
    check_layer(FilledPerEdge(), g, {"h": x.detach()})


class FilledOverRows(sarc.Layer):
    """Constants sized by a value's row count, as torch code writes them: ``torch.ones(
    m.shape[0], 4)``, ``torch.zeros((dst.h.shape[0], 1))``, ``torch.full``, and
    ``torch.reshape`` to a shape naming the rows."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        m = dst.h - src.h
        return m * torch.full((m.shape[0], 1), 0.5) + torch.ones(m.shape[0], 4)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        rows = dst.h.shape[0]
        return torch.reshape(agg.agg, (rows, 2, 2)).flatten(1) - torch.zeros((rows, 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ones_zeros_full_and_reshape_over_a_row_count_equal_torch(backend):
    src, dst = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1, 2, 3, 0, 2])
    g = sarc.Graph.from_edges(src, dst, 6)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    out = FilledOverRows().set_backend(backend)(g, x)
    xr = x.detach().clone().requires_grad_()
    want = torch.zeros(6, 4).index_add(0, dst, (xr[dst] - xr[src]) * 0.5 + 1.0)
    assert_close(out, want, 1e-6, "output")
    cot = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    (got,) = torch.autograd.grad((out * cot).sum(), [x])
    (ref,) = torch.autograd.grad((want * cot).sum(), [xr])
    assert_close(got, ref, 1e-6, "gradient", 1e-7)
    check_layer(FilledOverRows(), g, {"h": x.detach()})


class RowCountsCompared(sarc.Layer):
    """Two row counts of one set of rows compared (``min(x_src.size(0), x_dst.size(0))``,
    as PyG's GATConv writes it): the same count, so the order is known."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        a, b = src.h.shape[0], dst.h.shape[0]   # both the edge count
        assert a <= b and a >= b and not (a < b or a > b or a != b)
        return src.h * torch.ones(min(a, b), 1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_row_count_compared_with_itself_is_ordered_and_with_another_refused():
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    assert_close(RowCountsCompared()(g, x), x[[2, 0, 1]], 1e-6, "output")

    class AgainstANumber(RowCountsCompared):
        def message(self, src, dst, edge):
            return src.h * torch.ones(min(src.h.shape[0], 5), 1)

    with pytest.raises(DSLError, match="the row count E of a traced value is not known"):
        AgainstANumber().trace()


class SizeMethod(sarc.Layer):
    """``x.size(0)``, ``x.size(-1)`` and ``x.size()`` as torch code writes them."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        h = src.h
        return h.view(h.size(0), 2, h.size(-1) // 2).sum(-1) * torch.ones(h.size()[0], 1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_size_method_equals_torch():
    src, dst = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1, 2, 3, 0, 2])
    g = sarc.Graph.from_edges(src, dst, 6)
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    want = torch.zeros(6, 2).index_add(0, dst, x[src].view(-1, 2, 2).sum(-1))
    assert_close(SizeMethod()(g, x), want, 1e-6, "output")


class TypedEmbeddings(sarc.Layer):
    """``nn.Embedding`` and ``F.embedding`` of an edge type, ``contiguous``, ``view_as`` and
    ``reciprocal`` as torch code writes them."""

    def __init__(self):
        super().__init__(node={"h": 4}, edge={"t": sarc.INDEX})
        self.rel = nn.Embedding(3, 4)
        self.scale = nn.Parameter(torch.rand(3, 1) + 0.5)

    def message(self, src, dst, edge):
        m = (src.h * self.rel(edge.t)).view(-1, 2, 2).transpose(1, 2).contiguous()
        return m.view_as(src.h) * F.embedding(edge.t, self.scale).reciprocal()

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_contiguous_view_as_and_reciprocal_equal_torch(backend):
    src, dst = torch.tensor([0, 1, 2, 3, 0]), torch.tensor([1, 2, 3, 0, 2])
    t = torch.tensor([0, 2, 1, 2, 0])
    g = sarc.Graph.from_edges(src, dst, 5)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    layer = TypedEmbeddings().set_backend(backend)
    with torch.no_grad():
        m = (x[src] * layer.rel.weight[t]).view(-1, 2, 2).transpose(1, 2).reshape(-1, 4)
        want = torch.zeros(5, 4).index_add(0, dst, m / layer.scale[t])
    assert_close(layer(g, x, t), want, 1e-6, "output")
    check_layer(layer, g, {"h": x, "t": t})


class PaddedEmbedding(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4}, edge={"t": sarc.INDEX})
        self.rel = nn.Embedding(3, 4, padding_idx=0)

    def message(self, src, dst, edge):
        return src.h * self.rel(edge.t)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_an_embedding_with_a_padding_row_is_refused():
    g = sarc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(DSLError, match=r"embedding\(\.\.\., padding_idx=\.\.\.\): the padding "
                                       r"row's gradient is not modelled"):
        PaddedEmbedding()(g, torch.randn(2, 4), torch.tensor([0, 1]))


class OnesOverRowsWithAWrongFill(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return src.h * torch.full((src.h.shape[0], 4), src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_a_tensor_fill_over_a_row_count_is_refused_at_its_line():
    g = sarc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    with pytest.raises(DSLError, match=r"test_torch_functions.py:\d+ \(in message\): "
                                       r"torch.full\(E, 4\): the fill value of a tensor "
                                       r"over a graph's rows is a number"):
        OnesOverRowsWithAWrongFill()(g, torch.randn(2, 4))


class PerTypeProduct(sarc.Layer):
    """R-GCN's and RGAT's per-edge product as PyG writes it: the type's matrix picked with
    ``torch.index_select`` (or indexing), times the source row with ``torch.bmm``."""

    def __init__(self, select):
        super().__init__(node={"h": 4}, edge={"etype": sarc.INDEX})
        self.W = nn.Parameter(torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3)))
        self.select = select

    def message(self, src, dst, edge):
        w = (torch.index_select(self.W, 0, edge.etype) if self.select
             else self.W[edge.etype])
        return torch.bmm(src.h.unsqueeze(1), w).squeeze(-2)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("select", [True, False], ids=["index_select", "indexing"])
def test_per_type_batched_product_equals_torch(backend, select):
    src, dst = torch.tensor([0, 1, 2, 3, 0, 2]), torch.tensor([1, 2, 3, 0, 2, 2])
    etype = torch.tensor([0, 2, 1, 2, 0, 1])
    g = sarc.Graph.from_edges(src, dst, 5)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0)).requires_grad_()
    layer = PerTypeProduct(select).set_backend(backend)
    out = layer(g, x, etype)
    xr = x.detach().clone().requires_grad_()
    want = torch.zeros(5, 5).index_add(0, dst, torch.bmm(xr[src].unsqueeze(1),
                                                         layer.W[etype]).squeeze(-2))
    assert_close(out, want, 1e-5, "output")
    cot = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad((out * cot).sum(), [x, layer.W])
    ref = torch.autograd.grad((want * cot).sum(), [xr, layer.W])
    for a, b in zip(got, ref):
        assert_close(a, b, 1e-5, "gradient", 1e-6)
    check_layer(PerTypeProduct(select), g, {"h": x.detach(), "etype": etype})


def test_batched_products_other_than_per_type_are_refused():
    class Other(PerTypeProduct):
        def message(self, src, dst, edge):
            return torch.bmm(src.h.view(-1, 2, 2), dst.h.view(-1, 2, 2)).flatten(1)
    g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)
    with pytest.raises(sarc.DSLError, match="each row times its type's matrix"):
        Other(True)(g, torch.randn(2, 4), torch.zeros(1, dtype=torch.int64))


def test_index_select_traces_after_pyg_replaced_it():
    """PyG replaces ``torch.index_select`` by a wrapper when imported first (its HashTensor),
    which calls torch's own: the tracer knows torch's, whichever was imported first."""
    import subprocess
    import sys
    pytest.importorskip("torch_geometric")
    code = ("import torch, torch_geometric.nn, sarc\n"
            "class L(sarc.Layer):\n"
            "    def __init__(self):\n"
            "        super().__init__(node={'h': 2}, edge={'t': sarc.INDEX})\n"
            "        self.W = torch.nn.Parameter(torch.ones(3, 2))\n"
            "    def message(self, src, dst, edge):\n"
            "        return src.h * torch.index_select(self.W, 0, edge.t)\n"
            "    def reduce(self, msg):\n"
            "        return sarc.sum(msg.m)\n"
            "g = sarc.Graph.from_edges(torch.tensor([0]), torch.tensor([1]), 2)\n"
            "print(L()(g, torch.ones(2, 2), torch.tensor([2])).sum().item())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]


class SlowOnes(sarc.Layer):
    """Sleeps while traced, so that two traces in two threads overlap."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        import time
        time.sleep(0.2)
        return src.h * torch.ones(src.h.shape[0], 1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_layers_traced_in_two_threads_at_once_both_trace():
    """The routes of a trace are module globals: a trace ending in one thread must not take
    them from a trace running in another (traces run one at a time)."""
    import threading
    original = torch.ones
    g = sarc.Graph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    x = torch.randn(2, 4)
    errors: list = []

    def run():
        try:
            SlowOnes().trace()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert torch.ones is original   # given back
    assert_close(SlowOnes()(g, x), torch.stack([x[1], x[0]]), 1e-6, "output")


def test_std_of_a_constant_row_has_torch_gradient():
    """std's gradient is 0 where the variance is 0 (a node whose features are all equal),
    as torch's; the root's derivative is infinite there."""
    def fn(s, x):
        return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-5)
    layer = Apply(fn)
    x = _features()
    x[1] = 0.5   # a constant row
    x.requires_grad_()
    out = layer(LOOPS, x)
    xr = x.detach().clone().requires_grad_()
    want = fn(layer, xr)
    assert_close(out, want, 1e-5, "output")
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2))
    (got,) = torch.autograd.grad((out * cot).sum(), [x])
    (ref,) = torch.autograd.grad((want * cot).sum(), [xr])
    assert torch.isfinite(got).all()
    assert_close(got, ref, 1e-4, "gradient", 1e-6)


@pytest.mark.parametrize("fn", [F.relu6, F.hardtanh, F.hardsigmoid],
                         ids=["relu6", "hardtanh", "hardsigmoid"])
def test_bounded_activations_keep_a_nan(fn):
    x = torch.tensor([[float("nan"), 9.0, -9.0, 0.5]] * N).repeat(1, 2)
    out = Apply(lambda s, h: fn(h))(LOOPS, x)
    torch.testing.assert_close(out, fn(x), equal_nan=True)


NAN_OPERANDS = {
    "clamp-traced-min": lambda s, x: torch.clamp(x[:, :4], min=x[:, 4:]),
    "clamp-traced-max": lambda s, x: x[:, :4].clamp(max=x[:, 4:]) + x[:, 4:].clamp_min(x[:, :4]),
    "clamp-traced-both": lambda s, x: torch.clamp(x[:, :2], min=x[:, 2:4], max=x[:, 4:6] + 2),
    "maximum-minimum": lambda s, x: torch.maximum(x[:, :4], x[:, 4:]) + 3 * x[:, 4:].minimum(x[:, :4]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(NAN_OPERANDS))
def test_a_nan_operand_of_two_value_ops_gives_torchs_value_and_gradient(name, backend):
    """A NaN on either side: clamp by a traced bound is NaN there, and passes no gradient
    (torch's masks compare false with NaN); maximum / minimum are NaN and pass the whole
    gradient to both operands (torch halves it only where they are equal)."""
    fn = NAN_OPERANDS[name]
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(N, W, generator=gen)
    x0[torch.rand(N, W, generator=gen) < 0.25] = float("nan")
    x0[1] = torch.tensor([float("inf"), 1.0, float("-inf"), 2.0, float("inf"), 1.0, 3.0, 2.0])
    layer = Apply(fn)
    layer.set_backend(backend)
    x = x0.clone().requires_grad_()
    out = layer(LOOPS, x)
    xr = x0.clone().requires_grad_()
    want = fn(layer, xr)
    torch.testing.assert_close(out, want, equal_nan=True)
    cot = torch.randn(want.shape, generator=gen)
    (got,) = torch.autograd.grad((out * cot).sum(), [x])
    (ref,) = torch.autograd.grad((want * cot).sum(), [xr])
    torch.testing.assert_close(got, ref, equal_nan=True)


def test_celu_with_alpha_0_is_refused():
    with pytest.raises(DSLError, match=r"celu: alpha cannot be 0"):
        Apply(lambda s, h: F.celu(h, alpha=0.0))(LOOPS, _features())


# --- einsum ------------------------------------------------------------------------------------

class WithEinsumParams(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.w = nn.Parameter(torch.randn(W, 5))
        self.a = nn.Parameter(torch.randn(2, 4))
        self.t = nn.Parameter(torch.randn(2, 4, 3))


EINSUMS = {
    "dot": lambda s, x: torch.einsum("nd,nd->n", x, x)[:, None] + 0 * x,
    "matmul": lambda s, x: torch.einsum("nd,do->no", x, s.w),
    "matmul-transposed": lambda s, x: torch.einsum("nd,od->no", x, s.w.t()),
    "matmul-per-head": lambda s, x: torch.einsum("nhi,io->nho", x.view(-1, 4, 2), s.w[:2]).flatten(1),
    "heads": lambda s, x: torch.einsum("nhd,hd->nh", x.view(-1, 2, 4), s.a),
    "weights-per-head": lambda s, x: torch.einsum("nhi,hio->nho", x.view(-1, 2, 4), s.t).flatten(1),
    "ellipsis": lambda s, x: torch.einsum("...d,d->...", x, s.w[:, 0])[:, None],
    "implicit-output": lambda s, x: torch.einsum("nhd,hd", x.view(-1, 2, 4), s.a)[:, None],
    "sublists": lambda s, x: torch.einsum(x.view(-1, 2, 4), [0, 1, 2], s.a, [1, 2], [0, 1]),
    "sublist-one-operand": lambda s, x: torch.einsum(x.view(-1, 2, 4), [0, 1, 2], [0, 2, 1]).flatten(1),
    "sublist-implicit-order": lambda s, x: torch.einsum(x.view(-1, 2, 4), [0, 26, 1], s.a[0], [1]),
    "outer": lambda s, x: torch.einsum("ni,nj->nij", x[:, :3], x[:, 5:]).flatten(1),
    "transpose": lambda s, x: torch.einsum("n i j -> n j i", x.view(-1, 2, 4)).flatten(1),
    "three-operands": lambda s, x: torch.einsum("ni,io,o->n", x, s.w, s.w[0])[:, None],
    "size-1-broadcast": lambda s, x: torch.einsum("nhd,hd->nhd", x.view(-1, 2, 4),
                                                  s.a[:1]).flatten(1),
    "operand-list": lambda s, x: torch.einsum("nd,do->no", [x, s.w]),
    "parameters-only": lambda s, x: x[:, :3] * torch.einsum("hd,hdo->o", s.a, s.t),
    "bilinear": lambda s, x: torch.einsum("ni,io,n...o->n", x, s.w, x[:, :5])[:, None],
    "parameter-first": lambda s, x: torch.einsum("hd,nhd->nh", s.a, x.view(-1, 2, 4)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(EINSUMS))
def test_einsum_equals_torch(name, backend):
    """Every calling form of ``torch.einsum`` (equations with spaces, ``...``, an implicit
    output; an operand list; sublists), contractions against parameters (a matmul, per-head
    weights), outer products, transposes and three operands: torch's values and gradients."""
    _equals_torch(lambda: _seeded(WithEinsumParams, EINSUMS[name]), EINSUMS[name], backend)


def test_einsum_with_per_head_weights_is_a_matmul_per_head():
    """``'nhi,hio->nho'`` is a matmul for each of the 2 heads, stacked: no [rows, h, i, o]
    (nor any 3-axis) product of the value and the weights."""
    f = _seeded(WithEinsumParams, EINSUMS["weights-per-head"]).trace()
    assert f.op_counts().get(Op.MATMUL.value) == 2, f.op_counts()
    graph = [v.type for v in f.values if v.type.domain is not Domain.PARAM]
    assert all(len(t.feat) <= 2 for t in graph), graph


def test_einsum_contracts_early_and_multiplies_by_a_parameter_as_a_matmul():
    """A bilinear form ``x W x`` is a matmul and a product of [rows, 5] values, never the
    [rows, 8, 5] broadcast product of the three operands."""
    fn = EINSUMS["bilinear"]
    f = _seeded(WithEinsumParams, fn).trace()
    assert f.op_counts().get(Op.MATMUL.value) == 1, f.op_counts()
    graph = [v.type for v in f.values if v.type.domain is not Domain.PARAM]
    assert all(len(t.feat) <= 1 for t in graph), graph


class EinsumScores(sarc.Layer):
    """Per-edge attention scores of multi-head features, written as einsum."""

    def __init__(self):
        super().__init__(node={"h": 8})

    def message(self, src, dst, edge):
        q, k = dst.h.view(-1, 2, 4), src.h.view(-1, 2, 4)
        return torch.einsum("ehd,ehd->eh", q, k).sigmoid()

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_einsum_of_two_per_edge_values_equals_torch(backend):
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    _per_edge_equals_torch(EinsumScores, backend, x, lambda hs, hd: (
        hd.view(-1, 2, 4) * hs.view(-1, 2, 4)).sum(-1).sigmoid())


EDGES = torch.tensor([0, 1, 2, 3, 0, 4]), torch.tensor([1, 2, 3, 0, 2, 2])


def _per_edge_equals_torch(make, backend: str, x: torch.Tensor, message) -> None:
    """``make()``'s layer (a sum of per-edge messages) on 5 nodes equals the sum of
    ``message(x[src], x[dst])`` computed by torch, output and gradient, and the
    interpreter."""
    src, dst = EDGES
    g = sarc.Graph.from_edges(src, dst, 5)
    x = x.clone().requires_grad_()
    out = make().set_backend(backend)(g, x)
    xr = x.detach().clone().requires_grad_()
    m = message(xr[src], xr[dst])
    want = torch.zeros(5, *m.shape[1:]).index_add(0, dst, m)
    assert_close(out, want, 1e-6, "output")
    (got,) = torch.autograd.grad(out.square().sum(), [x])
    (ref,) = torch.autograd.grad(want.square().sum(), [xr])
    assert_close(got, ref, 1e-6, "gradient", 1e-7)
    check_layer(make(), g, {"h": x.detach()})


@pytest.mark.parametrize("key, message", [
    (lambda s, x: torch.einsum("nd,md->nm", x, x), r"first subscripts \['m', 'n'\] are their "
                                                   r"row axes"),
    (lambda s, x: torch.einsum("nd->d", x), "the output drops subscript n, the row axis"),
    (lambda s, x: torch.einsum("nd->dn", x), r"the row axis \(subscript n\) is the output's "
                                             r"first axis"),
    (lambda s, x: torch.einsum("nd,nd->n", x), "2 operand subscripts for 1 operands"),
    (lambda s, x: torch.einsum("ndd->nd", x.view(-1, 2, 4)), "subscript d twice in one "
                                                             "operand takes a diagonal"),
    (lambda s, x: torch.einsum("nd->nz", x), "the output's subscript z is in no operand"),
    (lambda s, x: torch.einsum("nhd->nd", x), "'nhd' names 3 axes of a value of shape"),
    (lambda s, x: torch.einsum("nd,d->n", x, s.a[0]), "subscript d is of size 8 in one "
                                                      "operand and 4 in another"),
    (lambda s, x: torch.einsum("nd,nk->n", x, s.w), "names a parameter's axis too"),
    (lambda s, x: torch.einsum("n1,n1->n", x, x), "a subscript is a letter"),
    (lambda s, x: torch.einsum("n...d...->n", x), "has more than one ellipsis"),
    (lambda s, x: torch.einsum("nd,de->ne", x, torch.eye(8)), r"an operand is a torch tensor "
                                                              r"of shape \[8, 8\] .*register_buffer"),
    (lambda s, x: torch.inner(x, x), r"torch.inner: the node / edge operands' first"),
])
def test_einsums_sarc_cannot_trace_are_refused_at_their_line(key, message):
    _refused_with(key, message, WithEinsumParams)


# --- conditions: comparisons, torch.where, masked_fill ------------------------------------------

class WithSlopes(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.w = nn.Parameter(torch.randn(W))


CONDITIONS = {
    "where": lambda s, x: torch.where(x > 0, x, 0.1 * x),
    "where-numbers": lambda s, x: torch.where(x >= 0.5, x, 0.0) + torch.where(x < -0.5, -1.0, x),
    "masked-fill": lambda s, x: x.masked_fill(x <= 0, -2.0) + x.masked_fill(x == 0.5, 3.0),
    "masked-softmax": lambda s, x: torch.softmax(x.masked_fill(x[:, :1] < x, -1e9), -1),
    "mask-as-float": lambda s, x: (x > 0).float() * x + (x != 0).to(x.dtype) + (x > 1) * x,
    "logic": lambda s, x: torch.where((x > -1) & (x < 1) | ~(x != 0.5), x, x * x)
                          + torch.where(torch.logical_xor(x > 0, x > 1), x, 0.0),
    "against-a-parameter": lambda s, x: torch.where(x.abs() > s.w.abs(), x, s.w),
    "where-method": lambda s, x: x.where(x.gt(0), torch.zeros_like(x)),
    "row-mask": lambda s, x: torch.where((x.sum(-1) > 0).unsqueeze(-1), x, -x),
    "any-all": lambda s, x: (torch.where(x.view(-1, 2, 4).gt(0).any(-1, keepdim=True),
                                         x.view(-1, 2, 4), 0.0).flatten(1)
                             + (x.view(-1, 2, 4) > -1).all(-1).float().sum(-1, keepdim=True)),
    "nan-and-inf": lambda s, x: (torch.where(torch.isnan(x.log()), 0.0, x)
                                 + torch.isfinite(x.log()).float()
                                 + torch.isinf(1.0 / x.abs().clamp(max=0.5).sub(0.5)).float()),
    "shaped-as": lambda s, x: (torch.where((x.view(-1, 2, 4) > 0).view_as(x), x, 0.0)
                               + torch.where((x > 0).reshape_as(x), 0.0, x)
                               + torch.where((x[:, :1] > 0).expand_as(x), x, -x)),
    "where-of-ints": lambda s, x: torch.where(x > 0, 1, 0) * x + torch.where(x < 0, 2, -1),
    "counts": lambda s, x: x + (x > 0).sum(-1, keepdim=True) + (x > 0).float().mean(-1, keepdim=True),
    "ints-made-floats": lambda s, x: (x + torch.where(x > 0, 1, 0).float() + (x < 0).to(x.dtype)
                                      + (x > 1).sum(-1, keepdim=True).to(x.dtype) * 2),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CONDITIONS))
def test_conditions_equal_torch(name, backend):
    """Comparisons (NaN never compares but !=), their logic, and selections by them
    (torch.where, Tensor.where, masked_fill, a mask read as 0 / 1): torch's values, and
    its gradient, which goes to the chosen side only (x = 0.5, 0, 1 hit the bounds)."""
    _equals_torch(lambda: _seeded(WithSlopes, CONDITIONS[name]), CONDITIONS[name], backend)


class WhereOnEdges(sarc.Layer):
    """The larger of each edge's two ends, feature by feature, and a masked attention."""

    def __init__(self):
        super().__init__(node={"h": 4})

    def message(self, src, dst, edge):
        return torch.where(src.h > dst.h, src.h, dst.h).masked_fill(src.h.isnan(), 0.0)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_between_the_ends_of_an_edge_equals_torch(backend):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    x[1, 2] = x[2, 2]   # a tie: torch's where takes dst's
    _per_edge_equals_torch(WhereOnEdges, backend, x,
                           lambda hs, hd: torch.where(hs > hd, hs, hd))


@pytest.mark.parametrize("key, message", [
    (lambda s, x: (x > 0) + (x < 1), "arithmetic of two conditions"),
    (lambda s, x: torch.where(x, x, 0.0), "torch.where takes conditions"),
    (lambda s, x: x.masked_fill(x > 0, x), "the fill value is a number"),
    (lambda s, x: (x > 0) > 0, r"comparing \(>\) a condition"),
    (lambda s, x: x.bool(), r"Tensor.bool: a sarc layer converts values to float .*a condition "
                            r"is a comparison"),
    (lambda s, x: (x > 0).any(), r"any\(\) over all axes"),
    (lambda s, x: x & x, "& takes conditions"),
    (lambda s, x: x.masked_fill(x > 0, 1e39), r"the fill value 1e\+39 does not fit f32"),
    (lambda s, x: torch.isclose(x, 2 * x), r"torch.isclose is not traced: write the condition "
                                           r"itself, \(a - b\).abs\(\) <= atol"),
    (lambda s, x: x + x.new_zeros(3), r"a tensor of fixed size made inside a layer"),
    (lambda s, x: x + x.new_empty(x.shape), "its values are undefined"),
    # torch's bool and int64 results, which sarc computes as floats, returned as they are
    (lambda s, x: x > 0, "update result 'h' is a bool tensor in torch .* return it as floats"),
    (lambda s, x: torch.where(x > 0, 1, 0), "update result 'h' is an int64 tensor in torch"),
    (lambda s, x: (x > 0).sum(-1, keepdim=True) * 2 - 1, "is an int64 tensor in torch"),
    (lambda s, x: torch.where(x > 0, 1, 0).view(-1, 2, 4).flatten(1).long(),
     "is an int64 tensor in torch"),
])
def test_conditions_sarc_cannot_trace_are_refused_at_their_line(key, message):
    _refused_with(key, message)


# --- more of torch, composed ---------------------------------------------------------------------

class WithMatrices(Apply):
    def __init__(self, fn):
        super().__init__(fn)
        self.w = nn.Parameter(torch.randn(W, 5))
        self.b = nn.Parameter(torch.randn(W))
        self.t = nn.Parameter(torch.randn(3, W, W))


COMPOSED = {
    "sign": lambda s, x: torch.sign(x) * x + x.sign(),
    "new-filled": lambda s, x: (x + x.new_zeros(x.shape) + x * x.new_ones(x.shape[0], 1)
                                + x.new_full((x.shape[0], 8), 2.5)
                                + x.new_full(x.shape, fill_value=-1.0, dtype=torch.float32)),
    "detach-clone": lambda s, x: (x - x.amax(-1, keepdim=True).detach() + x.clone() * x.detach()
                                  + torch.detach(x).sigmoid() * s.b.detach() + s.b.clone()),
    "hardswish": lambda s, x: F.hardswish(x) + nn.Hardswish()(x * 0.5),
    "shrinks-threshold": lambda s, x: (F.tanhshrink(x * 0.3) + F.softshrink(x)
                                       + F.hardshrink(x, 0.75) + F.threshold(x, 0.5, -1.0)),
    "trigonometric-hyperbolic": lambda s, x: (torch.tan(x * 0.1) + torch.sinh(x * 0.2)
                                              + torch.cosh(x * 0.2)),
    "exp-log-variants": lambda s, x: (torch.exp2(x * 0.3) + torch.expm1(x * 0.3)
                                      + torch.log2(x.abs() + 1) + torch.log10(x.abs() + 1)
                                      + torch.erfc(x) + torch.logit(torch.sigmoid(x * 0.1))
                                      + torch.logit(torch.sigmoid(x), eps=0.1)),
    "nan-to-num": lambda s, x: torch.nan_to_num((x - 0.25).log(), nan=-1.0) + x.nan_to_num(),
    "lerp-addc": lambda s, x: (torch.lerp(x, 2 * x + 1, 0.3) + torch.lerp(x, -x, 0.75)
                               + torch.addcmul(x, x, x, value=0.5)
                               + torch.addcdiv(x, x, x.abs() + 1, value=2)),
    "addmm-rsub": lambda s, x: (torch.addmm(s.b[:5], x, s.w, beta=0.5, alpha=2)
                                + torch.rsub(x[:, :5], 1.0)),
    "logsumexp-softmin": lambda s, x: (torch.logsumexp(x, -1, keepdim=True)
                                       + torch.logsumexp(x.view(-1, 2, 4), dim=(1, 2))[:, None]
                                       + F.softmin(x, -1)),
    "std-var-mean": lambda s, x: (torch.std_mean(x, -1, keepdim=True)[0]
                                  + torch.var_mean(x, -1, keepdim=True)[1] + 0 * x),
    "two-value-max-min-clamp": lambda s, x: (torch.max(x, s.b) + torch.min(x, 0.5 * x)
                                             + torch.clamp(x, min=-s.b.abs(), max=s.b.abs())
                                             + torch.clamp_min(x, s.b) + x.clamp_max(s.b)),
    "products-with-parameters": lambda s, x: (torch.inner(x, s.w.t()) + torch.mv(s.w.t(), s.b)
                                              + torch.dot(s.b, s.b) * x[:, :5]
                                              + torch.tensordot(x, s.w, dims=([1], [0]))
                                              + torch.linalg.matmul(x, s.w)
                                              + x[:, :5] @ torch.outer(s.b[:5], s.b[:5])),
    "cosine-similarity-pairwise-distance": lambda s, x: (
        F.cosine_similarity(x, x.tanh() + s.b, dim=-1)[:, None]
        + nn.CosineSimilarity(dim=2)(x.view(-1, 2, 4), x.view(-1, 2, 4).sigmoid())
        + F.pairwise_distance(x, s.b, keepdim=True) + nn.PairwiseDistance(p=1)(x, 2 * x)[:, None]),
    "parameter-rows": lambda s, x: (F.cosine_similarity(x, s.b[None, :])[:, None]
                                    + F.cosine_similarity(s.b[None, :], x, dim=-1)[:, None]
                                    + torch.linalg.vecdot(s.b[None, :], x)[:, None]
                                    + torch.linalg.vecdot(s.t[:1, :2, :2],
                                                          x.view(-1, 2, 4)[:, :, :2], dim=-2)),
    "vecdot-bilinear": lambda s, x: (torch.linalg.vecdot(x, x * 2)[:, None]
                                     + F.bilinear(x, x.tanh(), s.t, s.b[:3]).sum(-1, keepdim=True)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(COMPOSED))
def test_composed_functions_equal_torch(name, backend):
    """Functions sarc composes of its ops (where_pos for the piecewise ones, exp / log for
    the others, einsum for products with parameters): torch's values and gradients,
    the kinks of x's first row included."""
    _equals_torch(lambda: _seeded(WithMatrices, COMPOSED[name]), COMPOSED[name], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_heaviside_and_nan_to_num_defaults_equal_torch(backend):
    """Forward only: torch has no gradient for heaviside, nor a finite one where
    nan_to_num replaces an infinity (its defaults: the dtype's extremes, and posinf=,
    neginf=)."""
    fn = lambda s, x: (torch.heaviside(x, torch.tensor(0.5))
                       + torch.nan_to_num(torch.cat([x.log(), -x.log()], -1)).view(-1, 2, 8).sum(1)
                       + torch.nan_to_num(1.0 / x, posinf=5.0, neginf=-5.0))
    layer = Apply(fn).set_backend(backend)
    x = _features()
    assert torch.equal(layer(LOOPS, x), fn(layer, x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_is_kept_as_torch_keeps_it(backend):
    """A NaN entry stays NaN through the piecewise functions and the norms, as torch's (they
    gave 0, or the threshold's value); -inf through hardswish too (torch's x * 0). (The
    softshrink of a NaN is NaN in torch since 2.3, 0 before: sarc follows the newer.)"""
    fn = lambda s, x: torch.cat([  # noqa: E731
        F.hardswish(x), F.hardshrink(x), F.threshold(x, 0.1, 20.0),
        x.std(-1, keepdim=True), x.norm(dim=-1, keepdim=True),
        F.pairwise_distance(x, x * 0.5, keepdim=True)], -1)
    layer = Apply(fn).set_backend(backend)
    x = _features()
    x[1, :3] = torch.tensor([float("nan"), float("-inf"), float("inf")])
    assert torch.equal(layer(LOOPS, x).isnan(), fn(layer, x).isnan())
    torch.testing.assert_close(layer(LOOPS, x), fn(layer, x), equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_comparisons_and_selections_promote_dtypes_as_torch(backend):
    """A float16 value against a float32 one compares and selects in float32, and two numbers
    selected give torch's default dtype (they were computed in the first operand's, or the
    condition's, dtype)."""
    fn = lambda s, x: torch.cat([  # noqa: E731
        torch.where(x > 0, x.half(), x * 1.0001),
        torch.where(x.half() > x + 1e-3, 1.0, 0.0)], -1)
    layer = Apply(fn).set_backend(backend)
    x = _features()
    got, want = layer(LOOPS, x), fn(layer, x)
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)


def test_where_of_ints_follows_a_half_layers_dtype():
    """torch.where(c, 1, 0) is int64 in torch, and times a float16 value float16: it was
    float32, and its product with the value a dtype mismatch."""
    fn = lambda s, x: torch.where(x > 0, 1, 0) * x + x  # noqa: E731
    layer = Apply(fn).to(torch.float16)
    x = _features().half()
    got = layer(LOOPS, x)
    assert got.dtype == torch.float16 and torch.equal(got, fn(layer, x))


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "edge_softmax", "dropout",
                                  "leaky_relu", "elu", "concat", "linear"])
def test_every_dsl_function_is_traced(name):
    """A helper written between ``@traces`` and the function it decorated made
    ``sarc.edge_softmax`` a plain function (the decorator took the helper)."""
    from sarc.trace import Traced
    f = getattr(sarc, name)
    assert isinstance(f, Traced) and repr(f).startswith(f"<traced sarc.{name}("), repr(f)


def test_a_traced_function_shows_its_name_and_signature():
    """``repr`` of a DSL function (a ``sarc.trace.Traced``): what it records, as called."""
    assert repr(sarc.linear) == "<traced sarc.linear(input, weight, bias=None) -> 'Proxy'>"


def test_a_recurrent_cell_of_other_sizes_is_refused():
    """nn.GRUCell(4, 8) given rows of 8 features: refused at the call, naming both sizes."""
    for module in (nn.GRUCell(4, 8), nn.LSTMCell(4, 8), nn.RNNCell(4, 8)):
        with pytest.raises(sarc.DSLError, match=r"test_torch_functions.py:\d+.*input has 8 "
                                                r"features but the weight expects 4"):
            Apply(lambda s, x: s.mod(x), module=module).trace()


class DetachedScore(sarc.Layer):
    """An attention whose score is detached: its parameter ``att`` is read under detach()
    only. Fused with the sum, it was an operand of the fused kernel, whose gradient for it
    was zeros, where torch gives None (weight decay then moves it: a divergence from torch
    over steps)."""

    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 4)
        self.att = nn.Parameter(torch.randn(4))

    def message(self, src, dst, edge):
        z = self.lin(src.h)
        return {"z": z, "w": sarc.edge_softmax(((z * dst.h) * self.att).sum(-1).detach())}

    def reduce(self, msg):
        return sarc.sum(msg.z * msg.w.unsqueeze(-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_read_only_under_detach_has_no_gradient(backend):
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2, 0, 3]), torch.tensor([1, 2, 0, 0, 0]), 4)
    layer = DetachedScore().set_backend(backend)
    layer(g, torch.randn(4, 4)).square().sum().backward()
    assert layer.att.grad is None and layer.lin.weight.grad is not None
