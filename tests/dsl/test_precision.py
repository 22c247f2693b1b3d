"""Half and bfloat16 layers: ``layer.half()`` / ``layer.to(torch.bfloat16)`` makes a layer
that computes in that dtype (its float features declared without a dtype follow its
parameters), the gradients come back in it, and the result is the float32 layer's on the
same rounded weights and features, to the low precision's rounding. ``torch.autocast``
runs an float32 layer with low-precision matmuls. Mixed parameter dtypes and features of
another precision are errors that say what to convert.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from difftest import BACKENDS, random_block
from zoo import LAYERS, features

import sarc
from sarc.compiler import compile_layer
from sarc.errors import DSLError
from sarc.graph import GraphError
from sarc.ir.ops import Op

D = 6
LOW = {"f16": (torch.float16, 2e-2), "bf16": (torch.bfloat16, 8e-2)}
"""dtype -> (torch dtype, tolerance relative to the output's scale)."""


@pytest.fixture
def g() -> sarc.Graph:
    return random_block(torch.Generator().manual_seed(3), 12, 12, 48)


def _low(feats: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in feats.items()}


def _scaled_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / (b.abs().max() + 1e-6))


@pytest.mark.parametrize("precision", sorted(LOW))
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_low_precision_layer_matches_float32_on_the_same_weights(model, precision, g):
    dtype, tol = LOW[precision]
    low = LAYERS[model](D).to(dtype).eval()
    feats = _low(features(low, g, D), dtype)
    ref = LAYERS[model](D).eval()
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})

    out = low(g, **feats)
    assert out.dtype == dtype
    expect = ref(g, **_low(feats, torch.float32))
    assert _scaled_err(out, expect) < tol

    out.float().square().sum().backward()
    expect.square().sum().backward()
    for (name, p), (_, q) in zip(low.named_parameters(), ref.named_parameters()):
        if q.grad is None:
            continue
        assert p.grad is not None and p.grad.dtype == dtype, name
        assert _scaled_err(p.grad, q.grad) < 4 * tol, name


def test_layer_recompiles_when_its_precision_changes(g):
    layer = LAYERS["gat_4heads_concat"](D).eval()
    feats = features(layer, g, D)
    assert layer(g, **feats).dtype == torch.float32
    layer.half()
    assert layer.precision() is sarc.ir.types.DType.F16
    assert layer(g, **_low(feats, torch.float16)).dtype == torch.float16
    layer.float()
    assert layer(g, **feats).dtype == torch.float32


def test_autocast_runs_a_float32_layer_in_bfloat16(g):
    layer = LAYERS["sage"](D).eval()
    feats = features(layer, g, D)
    expect = layer(g, **feats)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(g, **feats)
    assert _scaled_err(out, expect) < LOW["bf16"][1]


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_autocast_runs_every_layer_within_bfloat16s_rounding(g, name, autodiff):
    """Every zoo layer under autocast (bfloat16) runs, its output and input gradient within
    bfloat16's rounding of the float32 layer's: R-GCN's node x relation products too,
    in bfloat16 under autocast, whose sparse sum crashed on them (float32 weights). The
    IR's backward runs under the forward's autocast (it ran without it: a bfloat16
    cotangent met a float32 weight in a matmul)."""
    layer = LAYERS[name](D).eval().set_autodiff(autodiff)
    feats = {k: v.requires_grad_(v.is_floating_point()) for k, v in features(layer, g, D).items()}
    x = next(k for k, v in feats.items() if v.is_floating_point())
    expect = layer(g, **feats)
    (want,) = torch.autograd.grad(expect.sum(), feats[x])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(g, **feats)
    (got,) = torch.autograd.grad(out.float().sum(), feats[x])
    assert _scaled_err(out, expect) < LOW["bf16"][1]
    assert _scaled_err(got, want) < 4 * LOW["bf16"][1]


def test_under_autocast_a_layer_takes_the_previous_layers_low_precision_output(g):
    """A layer ending in a matmul returns bfloat16 under autocast (as torch's Linear does);
    the next float32 layer takes it, as autocast's own float32 ops do."""
    first = LAYERS["sage"](D).eval()
    feats = features(first, g, D)
    hidden = first(g, **feats)
    second = LAYERS["sage"](hidden.shape[1]).eval()
    expect = second(g, hidden)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mid = first(g, **feats)
        assert mid.dtype == torch.bfloat16
        out = second(g, mid)
    assert _scaled_err(out, expect) < LOW["bf16"][1]
    with pytest.raises(GraphError, match="is torch.bfloat16, the layer computes in torch.float32"):
        second(g, mid)  # without autocast, a low-precision feature is still an error


class _ProjectedAttention(sarc.Layer):
    """Attention whose value is a linear of src.h (no heads): under autocast the linears
    are bfloat16, the softmax weights float32, and their weighted sum float32."""

    def __init__(self):
        super().__init__(node={"h": D})
        self.q, self.k, self.v = (torch.nn.Linear(D, D) for _ in range(3))

    def message(self, src, dst, edge):
        return {"v": self.v(src.h), "s": (self.q(dst.h) * self.k(src.h)).sum(-1)}

    def reduce(self, msg):
        return sarc.sum(msg.v * sarc.edge_softmax(msg.s).unsqueeze(-1))


@pytest.mark.parametrize("name", ["gat_1head", "gat_4heads_dropout", "attention"])
def test_under_autocast_an_attentions_dtype_is_the_interpreters(g, name):
    """A softmax's weights are float32 under autocast (torch.softmax's, the interpreter's),
    so an attention's output is float32 on every backend, whatever the value's dtype."""
    from difftest import reference
    layer = (_ProjectedAttention() if name == "attention" else LAYERS[name](D)).eval()
    feats = features(layer, g, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(g, **feats)
        want = reference(layer, g, feats)["h"]
    assert out.dtype == want.dtype == torch.float32
    assert _scaled_err(out, want) < LOW["bf16"][1]


def test_mixed_parameter_dtypes_are_an_error_naming_both(g):
    layer = LAYERS["gat_1head"](D)
    layer.lin.half()
    with pytest.raises(DSLError, match=r"mixes parameter dtypes: .*lin\.weight.*float16"):
        layer(g, **features(layer, g, D))


def test_float32_features_for_a_half_layer_say_what_to_convert(g):
    layer = LAYERS["gcn"](D).half()
    with pytest.raises(GraphError, match=r"feature 'h' is torch\.float32, the layer computes "
                                         r"in torch\.float16 .*\(h\.to\(torch\.float16\)\)"):
        layer(g, **features(layer, g, D))
    # an edge feature of another dtype is named in the conversion too (it said x.to)
    weighted = _ScaledThenLinear("mul").half()
    feats = {"h": torch.randn(g.num_src, D).half(), "w": torch.rand(g.num_edges)}
    with pytest.raises(GraphError, match=r"feature 'w' is torch\.float32.*\(w\.to\("
                                         r"torch\.float16\)\)"):
        weighted(g, **feats)


def test_a_declared_dtype_stays_fixed_in_a_half_layer(g):
    class Weighted(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": D}, edge={"w": sarc.Feature((), "f32")})
            self.lin = torch.nn.Linear(D, 4)

        def message(self, src, dst, edge):
            return self.lin(src.h) * edge.w.unsqueeze(-1)

        def reduce(self, msg):
            return sarc.sum(msg.m)

    layer = Weighted().half()
    with pytest.raises(DSLError, match="dtype mismatch: f16 and f32"):
        layer(g, h=torch.randn(g.num_src, D, dtype=torch.float16), w=torch.rand(g.num_edges))


HUB = {"f16": 5e-3, "bf16": 4e-2}
"""Relative error (norm of the hub's output row) of a low-precision layer, summed in float32."""


@pytest.mark.parametrize("precision", sorted(HUB))
@pytest.mark.parametrize("model", ["gcn", "sage", "gat_4heads_concat", "gin", "rgcn"])
def test_a_hub_of_thousands_of_in_edges_is_summed_in_float32(model, precision):
    """Summed in the low precision, a node of 3000 in-edges loses most of its digits
    (f16: ~4e-2, bf16: ~1 relative error); summed in float32 and rounded once, it keeps
    the precision's own."""
    dtype = LOW[precision][0]
    n = 3000
    src = torch.cat([torch.arange(1, n), torch.randint(0, n, (3000,))])
    dst = torch.cat([torch.zeros(n - 1, dtype=torch.long), torch.randint(0, n, (3000,))])
    g = sarc.Graph.from_edges(src, dst, n)
    low = LAYERS[model](D).to(dtype).eval()
    feats = _low(features(low, g, D), dtype)
    ref = LAYERS[model](D).eval()
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    with torch.no_grad():
        hub, want = low(g, **feats)[0].float(), ref(g, **_low(feats, torch.float32))[0]
    assert float((hub - want).norm() / want.norm()) < HUB[precision]


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gin", "rgcn"])
def test_the_model_files_run_in_bfloat16(g, name):
    """models/*.py converted whole (``model.to(torch.bfloat16)``) compute in it: what their
    forward makes besides the layers (R-GCN's relation norm) follows the features' dtype."""
    from sarc.loader import load_model_file
    from sarc.train import DEFAULTS
    spec = load_model_file(Path(__file__).resolve().parents[2] / "models" / f"{name}.py")
    hp = {**DEFAULTS, **spec.hparams}
    torch.manual_seed(0)
    model = spec.build_model(D, 3, num_nodes=g.num_src, num_etypes=3, **hp).to(torch.bfloat16)
    model.eval()
    extra = {"etype": torch.randint(0, 3, (g.num_edges,))} if name == "rgcn" else {}
    out = model(g, torch.randn(g.num_src, D).to(torch.bfloat16), **extra)
    assert out.dtype == torch.bfloat16 and out.shape == (g.num_dst, 3)
    assert torch.isfinite(out.float()).all()


class _ScoreInFloat32(sarc.Layer):
    """A half layer whose attention score is computed in float32 and whose weights are
    cast back (``sarc.edge_softmax(s).to(z.dtype)``) or whose score is cast before the
    softmax, as the README's half-precision pattern writes it. The torch backend gave
    float32 (weights and value fused past the cast) or failed in its sparse product."""

    def __init__(self, cast_score: bool):
        super().__init__(node={"h": D})
        self.cast_score = cast_score
        self.lin = torch.nn.Linear(D, 5, bias=False)
        self.a = torch.nn.Parameter(torch.randn(5))

    def message(self, src, dst, edge):
        z, zd = self.lin(src.h), self.lin(dst.h)
        s = torch.nn.functional.leaky_relu((z.float() * self.a.float()).sum(-1)
                                           + (zd.float() * self.a.float()).sum(-1), 0.2)
        return {"z": z, "s": s}

    def reduce(self, msg):
        if self.cast_score:
            w = sarc.edge_softmax(msg.s.to(msg.z.dtype))
        else:
            w = sarc.edge_softmax(msg.s).to(msg.z.dtype)
        return sarc.sum(msg.z * w.unsqueeze(-1)) + sarc.max(msg.z * w.unsqueeze(-1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cast_score", [False, True], ids=["weights-cast", "score-cast"])
@pytest.mark.parametrize("precision", sorted(LOW))
def test_a_score_computed_in_float32_gives_the_layers_dtype(precision, cast_score, backend, g):
    dtype, tol = LOW[precision]
    torch.manual_seed(0)
    low = _ScoreInFloat32(cast_score).to(dtype).set_backend(backend)
    ref = _ScoreInFloat32(cast_score)
    ref.load_state_dict({k: v.float() for k, v in low.state_dict().items()})
    x = torch.randn(g.num_src, D).to(dtype)
    for grad in (False, True):
        xs = x.clone().requires_grad_(grad)
        out = low(g, h=xs)
        assert out.dtype == dtype
        assert _scaled_err(out, ref(g, h=x.float())) < tol
        if grad:
            out.float().sum().backward()
            assert xs.grad.dtype == dtype


class _BiasedLinears(sarc.Layer):
    """Linears with a bias where sarc's passes move the bias: ``lin(src.h - dst.h)`` (the
    linear distributed over the difference, its bias into the edge sum: EdgeConv's theta)
    and a linear in ``update``. Under autocast torch's linear casts its bias too, so each
    result is bfloat16; sarc added the float32 bias after the linear and gave float32."""

    def __init__(self):
        super().__init__(node={"h": D})
        self.msg, self.upd = torch.nn.Linear(D, 5), torch.nn.Linear(5 + D, 4)

    def message(self, src, dst, edge):
        return self.msg(src.h - dst.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, node, agg):
        return {"h": agg.agg, "o": self.upd(torch.cat([agg.agg, node.h], -1))}

    def torch_reference(self, g: sarc.Graph, h: torch.Tensor) -> dict:
        src, dst = g.src, g.dst
        m = self.msg(h[src] - h[dst])
        agg = torch.zeros(g.num_dst, 5, dtype=m.dtype).index_add(0, dst, m)
        return {"h": agg, "o": self.upd(torch.cat([agg, h[:g.num_dst]], -1))}


@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_under_autocast_a_linears_bias_is_in_the_low_dtype_as_torch_casts_it(backend, autodiff,
                                                                              g):
    layer = _BiasedLinears().eval().set_backend(backend).set_autodiff(autodiff)
    x = torch.randn(g.num_src, D, generator=torch.Generator().manual_seed(1))
    grads = []
    for run in (layer, layer.torch_reference):
        xs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(g, xs) if run is layer.torch_reference else run(g, h=xs)
        (out["o"].float().sum() + out["h"].float().square().sum()).backward()
        grads.append((out, xs.grad, layer.msg.bias.grad, layer.upd.bias.grad))
        layer.zero_grad(set_to_none=True)
    (got, *got_grads), (want, *want_grads) = grads
    for name in ("h", "o"):
        assert got[name].dtype == want[name].dtype == torch.bfloat16, name
        assert _scaled_err(got[name], want[name]) < LOW["bf16"][1], name
    for a, b in zip(got_grads, want_grads):
        assert a.dtype == b.dtype == torch.float32
        assert _scaled_err(a, b) < 4 * LOW["bf16"][1]


class _ScaledThenLinear(sarc.Layer):
    """An edge-weighted sum (GraphConv's ``w_e h_u``; ``form``: ``h_u * w_e``,
    ``h_u / (1 + w_e)``, or ``h_u * w_e`` summed with a plain sum of ``h_u``), then a
    narrowing linear in ``update``: sarc's passes move the linear ahead of the gather and
    the weights after it (``linear_through_aggregate``), where a float32 weight times the
    linear's low-precision rows made the result float32 under autocast; torch's linear of
    the sum gives bfloat16."""

    def __init__(self, form: str):
        super().__init__(node={"h": D}, edge={"w": ()})
        self.lin = torch.nn.Linear(D, 4)
        self.form = form

    def _scaled(self, h, w):
        return h / (1 + w.unsqueeze(-1)) if self.form == "div" else h * w.unsqueeze(-1)

    def message(self, src, dst, edge):
        return {"a": self._scaled(src.h, edge.w), **({"b": src.h} if self.form == "two" else {})}

    def reduce(self, msg):
        return sarc.sum(msg.a) + sarc.sum(msg.b) if self.form == "two" else sarc.sum(msg.a)

    def update(self, dst, agg):
        return self.lin(agg.agg)

    def torch_reference(self, g: sarc.Graph, h: torch.Tensor, w: torch.Tensor):
        src, dst = g.input_edges()
        m = self._scaled(h[src], w) + (h[src] if self.form == "two" else 0)
        return self.lin(torch.zeros(g.num_dst, D, dtype=m.dtype).index_add(0, dst, m))


@pytest.mark.parametrize("form", ["mul", "div", "two"])
@pytest.mark.parametrize("autodiff", ["torch", "ir"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_under_autocast_a_linear_moved_ahead_of_a_weighted_sum_keeps_its_dtype(backend, autodiff,
                                                                               form, g):
    layer = _ScaledThenLinear(form).set_backend(backend).set_autodiff(autodiff)
    # the case: the linear runs ahead of the aggregate, a cast by autocast after it
    ops = [(v.op, v.attr.get("autocast")) for v in
           compile_layer(layer, backend, through="optimize").optimized.values]
    linear, aggregate = ops.index((Op.LINEAR, None)), ops.index((Op.AGGREGATE, None))
    assert linear < aggregate < ops.index((Op.CAST, True), aggregate)
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(g.num_src, D, generator=gen), torch.rand(g.num_edges, generator=gen)
    grads = []
    for run in (layer, layer.torch_reference):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(g, xs, ws) if run is layer.torch_reference else run(g, h=xs, w=ws)
        out.float().square().sum().backward()
        grads.append((out, xs.grad, ws.grad, layer.lin.weight.grad))
        layer.zero_grad(set_to_none=True)
    (got, *got_grads), (want, *want_grads) = grads
    assert got.dtype == want.dtype == torch.bfloat16
    assert _scaled_err(got, want) < LOW["bf16"][1]
    for a, b in zip(got_grads, want_grads):
        assert a.dtype == b.dtype == torch.float32
        assert _scaled_err(a, b) < 4 * LOW["bf16"][1]
