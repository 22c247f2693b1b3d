"""A compiled layer is an ordinary torch.nn.Module: its parameters are plain
``nn.Parameter`` objects that state_dict, optimizers, freezing, deep copies and
torch.save see as usual, and the compiled code always reads their current values.
"""
from __future__ import annotations

import copy
import io
import logging
import types
from fractions import Fraction

import numpy as np
import pytest
import torch
from difftest import assert_close, one_torch_thread, random_block, reference  # noqa: F401
from shared_layers import TwoOutputs
from torch import nn
from zoo import LAYERS, features

import sarc
from sarc.ir.types import DType

D = 6


@pytest.fixture
def g() -> sarc.Graph:
    return random_block(torch.Generator().manual_seed(5), 8, 8, 24)


def _run(layer, g, feats):
    return layer(g, **feats)


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_parameters_stay_ordinary_after_compiling(model, g):
    layer = LAYERS[model](D)
    before = {n: p for n, p in layer.named_parameters()}
    _run(layer, g, features(layer, g, D))
    after = dict(layer.named_parameters())
    assert after.keys() == before.keys()
    for n, p in after.items():
        assert p is before[n], f"{n} was replaced while tracing"
        assert type(p) is nn.Parameter
    assert set(layer.state_dict()) == set(before)


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_state_dict_round_trip(model, g):
    torch.manual_seed(1)
    a = LAYERS[model](D).eval()      # eval: no dropout masks to tell the runs apart
    torch.manual_seed(2)
    b = LAYERS[model](D).eval()
    feats = features(a, g, D)
    out_a = _run(a, g, feats)
    out_b_before = _run(b, g, feats)        # compiled before the load
    if next(a.parameters(), None) is not None and out_a.abs().max() > 0:
        assert not torch.equal(out_a, out_b_before)
    b.load_state_dict(a.state_dict())
    assert torch.equal(_run(b, g, feats), out_a)


@pytest.mark.parametrize("model", ["gcn", "gat_4heads_concat", "rgcn_bases", "gin_train_eps"])
def test_optimizer_step_updates_what_the_kernel_reads(model, g):
    layer = LAYERS[model](D)
    feats = features(layer, g, D)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in layer.named_parameters()}

    loss = _run(layer, g, feats).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    for n, p in layer.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
    opt.step()

    changed = [n for n, p in layer.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the step changed no parameter"
    # The compiled kernel must see the new values, exactly as the interpreter does.
    with torch.no_grad():
        assert_close(_run(layer, g, feats), reference(layer, g, feats)["h"])
        stale = copy.deepcopy(layer)
        stale.load_state_dict(before)
        assert not torch.equal(_run(layer, g, feats), _run(stale, g, feats))


def test_training_reduces_the_loss(g):
    torch.manual_seed(0)
    layer = LAYERS["gat_4heads_concat"](D)
    feats = features(layer, g, D)
    target = torch.randn(g.num_dst, 12)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        loss = (_run(layer, g, feats) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_frozen_parameter_gets_no_gradient(g):
    layer = LAYERS["sage"](D)
    layer.lin_self.weight.requires_grad_(False)
    feats = features(layer, g, D)
    _run(layer, g, feats).sum().backward()
    assert layer.lin_self.weight.grad is None
    assert layer.lin_neigh.weight.grad is not None


def test_deepcopy_of_a_compiled_layer(g):
    layer = LAYERS["gat_4heads_concat"](D)
    feats = features(layer, g, D)
    out = _run(layer, g, feats)
    twin = copy.deepcopy(layer)
    assert torch.equal(_run(twin, g, feats), out)
    with torch.no_grad():
        twin.bias.add_(1.0)
    assert torch.equal(_run(layer, g, feats), out), "the copy shares parameters with the original"
    assert not torch.equal(_run(twin, g, feats), out)


def test_torch_save_and_load_of_a_compiled_layer(g):
    layer = LAYERS["rgcn_bases"](D)
    feats = features(layer, g, D)
    out = _run(layer, g, feats)
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(_run(loaded, g, feats), out)


def test_layers_in_a_model():
    """Two sarc layers inside an nn.Sequential-like model train end to end."""
    from gcn import GCNLayer

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = GCNLayer(D, 7), GCNLayer(7, 3)

        def forward(self, g, x):
            return self.l2(g, torch.relu(self.l1(g, x)))

    g = random_block(torch.Generator().manual_seed(9), 10, 10, 30)
    net = Net()
    x = torch.randn(10, D)
    assert [n for n, _ in net.named_parameters()] == ["l1.bias", "l1.lin.weight", "l2.bias",
                                                       "l2.lin.weight"]
    net(g, x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


# --- state the trace reads besides the parameters: buffers, numbers on the layer ----------

class Scaled(sarc.Layer):
    """Reads a float buffer (a temperature), a float vector buffer, an int buffer, a number
    attribute and an optional parameter."""

    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin = nn.Linear(3, 3)
        self.register_buffer("temp", torch.tensor(1.0))
        self.register_buffer("mask", torch.tensor([1.0, 0.5, 2.0]))
        self.register_buffer("shift", torch.tensor(0))
        self.alpha = 0.5
        self.bias = nn.Parameter(torch.zeros(3))

    def message(self, src, dst, edge):
        return self.lin(src.h) / self.temp * self.mask + self.shift

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        h = self.alpha * agg.agg
        return h + self.bias if self.bias is not None else h


def _plain_scaled(layer: Scaled, g: sarc.Graph, h: torch.Tensor) -> torch.Tensor:
    m = layer.lin(h[g.src]) / layer.temp * layer.mask + layer.shift
    out = layer.alpha * torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)
    return out + layer.bias if layer.bias is not None else out


def test_state_read_by_the_trace_is_followed(g):
    torch.manual_seed(0)
    layer, h = Scaled(), torch.randn(g.num_src, 3)
    assert_close(layer(g, h), _plain_scaled(layer, g, h).detach())
    kernel = layer.compiled()
    # buffers' values are the kernel's inputs: changed in place or loaded, no new trace
    layer.temp.fill_(4.0)
    layer.load_state_dict({"mask": torch.tensor([3.0, -1.0, 0.25])}, strict=False)
    assert_close(layer(g, h), _plain_scaled(layer, g, h).detach())
    assert layer.compiled() is kernel
    # what the trace read as constants: traced again when changed
    for change in (lambda: setattr(layer, "alpha", 2.0), lambda: layer.shift.add_(3),
                   lambda: setattr(layer, "bias", None)):
        change()
        assert_close(layer(g, h), _plain_scaled(layer, g, h).detach())
        assert layer.compiled() is not kernel
        kernel = layer.compiled()
    assert layer.compiled() is kernel  # nothing changed: the same kernel


class Configured(sarc.Layer):
    """Reads a function attribute, a configuration record and a list holding a function and
    a number."""

    def __init__(self):
        super().__init__(node={"h": 3})
        self.act = torch.relu
        # a record holding what no key can watch (a logger) and a record of its own
        self.cfg = types.SimpleNamespace(scale=1.0, log=logging.getLogger("sarc.test"),
                                         inner=types.SimpleNamespace(shift=0.0))
        self.steps = [torch.sigmoid, 2.0]

    def message(self, src, dst, edge):
        return (self.act(src.h) * self.cfg.scale + self.steps[0](src.h) * self.steps[1]
                + self.cfg.inner.shift)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def _plain_configured(layer: Configured, g: sarc.Graph, h: torch.Tensor) -> torch.Tensor:
    hs = h[g.src]
    m = layer.act(hs) * layer.cfg.scale + layer.steps[0](hs) * layer.steps[1] \
        + layer.cfg.inner.shift
    return torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)


def test_functions_and_configuration_read_by_the_trace_are_followed(g):
    layer, h = Configured(), torch.randn(g.num_src, 3)
    assert_close(layer(g, h), _plain_configured(layer, g, h))
    kernel = layer.compiled()
    assert layer(g, h) is not None and layer.compiled() is kernel   # no new trace per call
    for change in (lambda: setattr(layer, "act", torch.tanh),
                   lambda: setattr(layer.cfg, "scale", 3.0),
                   lambda: setattr(layer.cfg.inner, "shift", 0.5),
                   lambda: layer.steps.__setitem__(1, 7.0),
                   lambda: layer.steps.__setitem__(0, torch.exp)):
        change()
        assert_close(layer(g, h), _plain_configured(layer, g, h))
        assert layer.compiled() is not kernel
        kernel = layer.compiled()
    assert layer.compiled() is kernel


def test_buffers_are_leaves_in_the_layers_precision(g):
    torch.manual_seed(0)
    layer = Scaled()
    layer.temp = torch.tensor(2.0, dtype=torch.float64)  # read in the layer's float32
    fn = layer.trace()
    leaves = {v.attr["name"]: v.type for v in fn.values if v.op.value == "param"}
    assert leaves["temp"].dtype is DType.F32 and leaves["mask"].feat == (3,)
    assert "shift" not in leaves  # an integer buffer is read as a constant
    assert layer.leaf_tensors()["temp"].dtype == torch.float32
    h = torch.randn(g.num_src, 3)
    assert_close(layer(g, h), reference(layer, g, {"h": h})["h"])


class Tempered(sarc.Layer):
    """A buffer read as a Python number (``math.sqrt``), a 0-d tensor attribute (a constant)."""

    def __init__(self):
        super().__init__(node={"h": 3})
        self.register_buffer("temperature", torch.tensor(4.0))
        self.scale = torch.tensor(2.0)

    def message(self, src, dst, edge):
        import math
        return src.h * self.scale / math.sqrt(self.temperature)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_buffers_and_tensors_read_as_numbers_are_watched(g):
    layer, h = Tempered(), torch.randn(g.num_src, 3)

    def plain():
        m = h[g.src] * float(layer.scale) / float(layer.temperature) ** 0.5
        return torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)

    assert_close(layer(g, h), plain())
    layer.temperature.fill_(9.0)   # read as a number: a constant, traced again
    assert_close(layer(g, h), plain())
    for step in range(30):
        # two new tensors between calls, the first freed by the second: the key holds the
        # tensor it was made at, so a new one at a freed one's address is never taken for it
        layer.scale = torch.tensor(-1.0)
        layer.scale = torch.tensor(float(step))
        assert_close(layer(g, h), plain(), what=f"step {step}")


# Read by ConstantsElsewhere's code: a global, and a helper function's global.
SHIFT = 0.0
STEP_COUNTER = 0   # a global the layer's code does not read: never a reason to trace again


def _helper_scale() -> float:
    return HELPER_SCALE


HELPER_SCALE = 1.0


class Settings:
    """A configuration object of the user's own class (not a record type)."""

    def __init__(self):
        self.alpha = 1.0


class ConstantsElsewhere(sarc.Layer):
    """Reads numbers that are not plain Python numbers on the layer: numpy's and a Fraction
    on it, a class attribute, a configuration object's field, a module global and a global
    a helper function reads."""

    FACTOR = 1.0

    def __init__(self):
        super().__init__(node={"h": 3})
        self.t = np.float32(1.0)
        self.n = np.int64(1)
        self.fr = Fraction(1, 2)
        self.on = np.bool_(True)
        self.cfg = Settings()

    def message(self, src, dst, edge):
        scale = self.t * int(self.n) * float(self.fr) * self.FACTOR * self.cfg.alpha
        return src.h * scale * _helper_scale() + SHIFT + (1.0 if self.on else 0.0)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_constants_read_from_numpy_class_objects_and_globals_are_followed(g):
    """Each change below was baked into the first kernel (a silent stale result); each is
    now traced again, and a global the layer's code does not name is not followed."""
    global SHIFT, HELPER_SCALE, STEP_COUNTER
    layer, h = ConstantsElsewhere(), torch.randn(g.num_src, 3)

    def plain():
        scale = float(layer.t) * int(layer.n) * float(layer.fr) * layer.FACTOR * layer.cfg.alpha
        m = h[g.src] * scale * HELPER_SCALE + SHIFT + (1.0 if layer.on else 0.0)
        return torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)

    def set_global(name, value):
        globals()[name] = value

    assert_close(layer(g, h), plain())
    kernel = layer.compiled()
    STEP_COUNTER += 1
    layer(g, h)
    assert layer.compiled() is kernel
    try:
        for change in (lambda: setattr(layer, "t", np.float32(3.0)),
                       lambda: setattr(layer, "n", np.int64(2)),
                       lambda: setattr(layer, "fr", Fraction(1, 4)),
                       lambda: setattr(layer, "on", np.bool_(False)),
                       lambda: setattr(ConstantsElsewhere, "FACTOR", 0.5),
                       lambda: setattr(layer.cfg, "alpha", 10.0),
                       lambda: set_global("SHIFT", 2.0),
                       lambda: set_global("HELPER_SCALE", -1.0)):
            change()
            assert_close(layer(g, h), plain())
            assert layer.compiled() is not kernel
            kernel = layer.compiled()
    finally:
        ConstantsElsewhere.FACTOR, SHIFT, HELPER_SCALE = 1.0, 0.0, 1.0


class NumpyScalarsOnTheLeft(sarc.Layer):
    """APPNP's teleport with alpha a numpy scalar (from ``np.linspace`` or a config), on the
    left of operators with traced values, as users write it; and a 0-d numpy array."""

    def __init__(self, alpha):
        super().__init__(node={"h": 3, "h0": 3})
        self.alpha = alpha
        self.scale = np.array(2.0)

    def message(self, src, dst, edge):
        return np.sqrt(2.0) * src.h * self.scale

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return (1 - self.alpha) * agg.agg + self.alpha * dst.h0 - self.scale * dst.h0


@pytest.mark.parametrize("alpha", [np.float64(0.1), np.float32(0.1), np.array(0.1)],
                         ids=["float64", "float32", "0-d array"])
def test_numpy_scalars_on_the_left_of_a_traced_value_are_constants(g, alpha):
    """``np.float32(a) * x`` was refused as "a traced tensor converted to a numpy array":
    numpy's operator tried to make the traced value an array instead of deferring to it
    as it defers to a torch tensor. A changed alpha is traced again."""
    h, h0 = torch.randn(g.num_src, 3), torch.randn(g.num_dst, 3)
    layer = NumpyScalarsOnTheLeft(alpha)

    def plain():
        a = float(layer.alpha)
        m = h[g.src] * (2.0 ** 0.5) * 2.0
        agg = torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)
        return (1 - a) * agg + a * h0 - 2.0 * h0

    assert_close(layer(g, h, h0=h0), plain())
    layer.alpha = type(alpha)(0.7) if not isinstance(alpha, np.ndarray) else np.array(0.7)
    assert_close(layer(g, h, h0=h0), plain())


CONFIG = types.SimpleNamespace(temp=1.0)   # a global record the layer reads
t = 0   # a global named as an attribute the layer reads (self.lin.t), not a global it reads


def _scaled_by_global(method):
    """A user's decorator (functools.wraps): the layer's code is the wrapped function's."""
    import functools

    @functools.wraps(method)
    def run(self, *args):
        return method(self, *args)
    return run


class ReadsThroughDecoratorAndRecord(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin = nn.Linear(3, 3)

    @_scaled_by_global
    def message(self, src, dst, edge):
        return src.h @ self.lin.weight.t() / CONFIG.temp * SHIFT_TWO

    def reduce(self, msg):
        return sarc.sum(msg.m)


SHIFT_TWO = 2.0


def test_a_global_record_and_a_decorated_methods_globals_are_followed(g):
    """A global SimpleNamespace's field and a global read by a decorated message were baked
    in; a global whose name the layer only uses as an attribute (a loop's `t`, `.t()`) is
    not followed (it traced the layer again at every epoch)."""
    global t, SHIFT_TWO
    layer, h = ReadsThroughDecoratorAndRecord(), torch.randn(g.num_src, 3)

    def plain():
        m = h[g.src] @ layer.lin.weight.t() / CONFIG.temp * SHIFT_TWO
        return torch.zeros(g.num_dst, 3).index_add_(0, g.dst, m)

    assert_close(layer(g, h), plain().detach())
    kernel = layer.compiled()
    for t in range(3):
        layer(g, h)
    assert layer.compiled() is kernel
    try:
        for change in (lambda: setattr(CONFIG, "temp", 0.5),
                       lambda: globals().__setitem__("SHIFT_TWO", -1.0)):
            change()
            assert_close(layer(g, h), plain().detach())
            assert layer.compiled() is not kernel
            kernel = layer.compiled()
    finally:
        CONFIG.temp, SHIFT_TWO = 1.0, 2.0


class _SlotsConfig:
    __slots__ = ("alpha",)

    def __init__(self):
        self.alpha = 2.0


class ReadsEveryKindOfConstant(sarc.Layer):
    """Constants in a ``__slots__`` object, a numpy array, a deep dict, a long list and a
    float buffer read as a number."""

    def __init__(self):
        super().__init__(node={"h": 3})
        self.cfg = _SlotsConfig()
        self.arr = np.array([1.0, 2.0])
        self.nested = {"a": {"b": {"c": {"d": {"k": 1.0}}}}}
        self.table = [1.0] * 1000
        self.register_buffer("tau", torch.tensor(1.0))

    def message(self, src, dst, edge):
        return src.h * (self.cfg.alpha * float(self.arr[0])
                        * self.nested["a"]["b"]["c"]["d"]["k"] * self.table[0] * float(self.tau))

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("change", ["slots", "numpy", "nested", "table", "data"])
def test_constants_changed_anywhere_the_trace_reads_them_are_followed(g, change):
    def changed(layer):
        {"slots": lambda: setattr(layer.cfg, "alpha", 3.0),
         "numpy": lambda: layer.arr.__setitem__(0, 5.0),
         "nested": lambda: layer.nested["a"]["b"]["c"]["d"].__setitem__("k", 7.0),
         "table": lambda: layer.table.__setitem__(0, 11.0),
         "data": lambda: setattr(layer.tau, "data", torch.tensor(13.0))}[change]()
        return layer
    h = torch.randn(g.num_src, 3)
    layer = ReadsEveryKindOfConstant()
    before = layer(g, h)
    want = changed(ReadsEveryKindOfConstant())(g, h)
    assert not torch.allclose(want, before)
    torch.testing.assert_close(changed(layer)(g, h), want)


class Stashes(sarc.Layer):
    """Keeps its last message on itself (``self.last = m``), and counts its calls."""

    def __init__(self):
        super().__init__(node={"h": D})
        self.lin = nn.Linear(D, D)
        self.calls = 0

    def message(self, src, dst, edge):
        m = self.lin(src.h)
        self.last = m
        self.calls += 1
        return m

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_what_the_code_stores_on_the_layer_while_traced_is_put_back(g):
    """A value stored on the module while traced was left there as a traced value (its next
    use broke, and a counter changed by the trace recompiled the layer at every call)."""
    layer = Stashes()
    x = torch.randn(g.num_src, D)
    want = torch.zeros(g.num_dst, D).index_add_(0, g.dst, layer.lin(x)[g.src]).detach()
    assert_close(layer(g, h=x), want)
    kernel = layer.compiled()
    assert_close(layer(g, h=x), want)
    assert layer.compiled() is kernel   # not traced again
    assert not hasattr(layer, "last") and layer.calls == 0



def _scaled(x):
    return x * 2.0


class _CallsAHelper(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})

    def message(self, src, dst, edge):
        return _scaled(src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_code_defined_again_is_traced_again(g):
    """A helper the layer calls defined again (a notebook's cell run again), or a method
    replaced on the class: the kernel was the old code's, silently."""
    layer, h = _CallsAHelper(), torch.randn(g.num_src, 3)
    plain = torch.zeros(g.num_dst, 3).index_add_(0, g.dst, h[g.src])
    assert_close(layer(g, h), 2.0 * plain)
    kernel = layer.compiled()
    assert layer.compiled() is kernel
    saved = globals()["_scaled"]
    try:
        exec("def _scaled(x):\n    return x * 3.0\n", globals())
        assert_close(layer(g, h), 3.0 * plain)
    finally:
        globals()["_scaled"] = saved
    assert_close(layer(g, h), 2.0 * plain)

    class Replaced(_CallsAHelper):
        pass
    other = Replaced()
    assert_close(other(g, h), 2.0 * plain)
    Replaced.reduce = lambda self, msg: sarc.max(msg.m)
    want = torch.full((g.num_dst, 3), -torch.inf).index_reduce_(0, g.dst, 2.0 * h[g.src], "amax")
    want[torch.isinf(want)] = 0.0
    assert_close(other(g, h), want)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
def test_a_layers_output_can_be_written_in_place(g, autodiff):
    """A residual ``h += x`` or an in-place activation on a layer's output, as on any
    module's: under the IR's autodiff GAT's output (its heads flattened, a view) was a view
    out of a custom Function, which torch forbids writing in place."""
    from gat import GATLayer
    torch.manual_seed(0)
    layer = GATLayer(4, 2, heads=2).set_autodiff(autodiff)
    x = torch.randn(g.num_src, 4, requires_grad=True)
    h = layer(g, x)
    want = torch.relu(h.detach() + x.detach()[: g.num_dst])
    h += x[: g.num_dst]
    torch.relu_(h)
    assert_close(h.detach(), want)
    h.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_model_of_layers_under_torch_compile_runs_them_as_sarc_compiles_them(g):
    """dynamo traced into the first call's trace, and sarc's guard against random draws
    blamed the user's line for sympy's (torch's symbolic shapes): a sarc layer is opaque
    to dynamo, which runs it as a call of its own."""
    from gcn import GCN
    torch.manual_seed(0)
    model = GCN(3, 4, 2).eval()
    eager = copy.deepcopy(model)
    x = torch.randn(g.num_src, 3)
    compiled = torch.compile(model, backend="eager")
    assert_close(compiled(g, x), eager(g, x))
    compiled(g, x).sum().backward()
    eager(g, x).sum().backward()
    for (k, p), q in zip(model.named_parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, what=k)


def test_a_training_call_draws_from_torchs_rng_only_for_its_dropout(g):
    """A layer without dropout drew a seed at every training call, which moved the script's
    random stream (its own dropout between layers) away from the library layers' script."""
    from gat import GATLayer
    x = torch.randn(g.num_src, 3)
    for layer, draws in ((GATLayer(3, 2, heads=2), False),
                         (GATLayer(3, 2, heads=2, attn_drop=0.5), True)):
        layer.train()
        torch.manual_seed(7)
        layer(g, x)
        after = torch.rand(1)
        torch.manual_seed(7)
        assert torch.equal(after, torch.rand(1)) is not draws


@pytest.mark.parametrize("transform", ["vmap", "grad", "jvp"])
def test_a_layer_under_a_torch_func_transform_is_refused_at_the_call(g, transform):
    """It failed inside torch (a kernel's autograd Function without setup_context / jvp)."""
    from gcn import GCNLayer
    layer = GCNLayer(3, 2)
    x = torch.randn(g.num_src, 3)
    run = {"vmap": lambda: torch.func.vmap(lambda x: layer(g, x))(x[None]),
           "grad": lambda: torch.func.grad(lambda x: layer(g, x).sum())(x),
           "jvp": lambda: torch.func.jvp(lambda x: layer(g, x), (x,), (x,))}[transform]
    with pytest.raises(sarc.SarcError, match="called under a torch.func transform") as info:
        run()
    assert "test_module.py" in str(info.value)


def test_a_per_edge_weight_from_g_indexes_the_edges_in_their_given_order():
    """``g.dst`` is in CSR order, an edge input in the order the edges were given:
    ``1 / g.in_degree[g.input_dst]`` weights each edge by its own destination's in-degree
    (a mean), where ``g.dst`` put the weights on other edges."""
    class Weighted(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": 1}, edge={"w": ()})

        def message(self, src, dst, edge):
            return edge.w.unsqueeze(-1) * src.h

        def reduce(self, msg):
            return sarc.sum(msg.m)

    src, dst = torch.tensor([0, 1, 2, 0]), torch.tensor([2, 0, 0, 1])   # not sorted by dst
    g = sarc.Graph.from_edges(src, dst, 3)
    assert torch.equal(g.input_dst, dst) and not torch.equal(g.dst, dst)
    h = torch.tensor([[1.0], [10.0], [100.0]])
    mean = torch.zeros(3, 1).index_add(0, dst, h[src]) / torch.bincount(dst).unsqueeze(1)
    torch.testing.assert_close(Weighted()(g, h, w=1.0 / g.in_degree[g.input_dst]), mean)
    assert not torch.allclose(Weighted()(g, h, w=1.0 / g.in_degree[g.dst]), mean)


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
def test_gradients_only_where_the_loss_reaches_as_torch_gives_them(g, autodiff):
    """Either autodiff gives the leaves torch's autograd would: a parameter only an output
    the loss does not read reaches gets no gradient (None, not zeros an optimizer's weight
    decay or momentum would act on), and an output no leaf needing a gradient reaches has
    no grad_fn."""
    torch.manual_seed(0)
    layer = TwoOutputs().set_autodiff(autodiff)
    h = torch.randn(g.num_src, 3, requires_grad=True)
    out = layer(g, h)
    out["o2"].sum().backward()
    assert layer.lin.weight.grad is None and layer.lin.bias.grad is None
    assert h.grad is not None and h.grad.any()
    out = layer(g, h.detach())
    assert not out["o2"].requires_grad and out["o1"].requires_grad
    out["o1"].sum().backward()
    assert layer.lin.weight.grad is not None and layer.lin.weight.grad.any()


class _Max(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin = nn.Linear(3, 2)

    def message(self, src, dst, edge):
        return self.lin(src.h)

    def reduce(self, msg):
        return sarc.max(msg.m)


def test_a_max_over_edges_runs_under_inference_mode(g):
    """Under ``torch.inference_mode()`` as under ``no_grad`` (it read its output's version
    counter, which an inference tensor has not)."""
    torch.manual_seed(0)
    layer = _Max()
    h = torch.randn(g.num_src, 3)
    with torch.no_grad():
        want = layer(g, h)
    with torch.inference_mode():
        got = layer(g, h)
    assert_close(got, want)
