"""Passes: each leaves the IR verifying, dce and cse are idempotent, and the optimizer
does not change what a layer computes (interpreter before == interpreter after,
values and gradients), on the model zoo and on random DSL programs.
"""
from __future__ import annotations

import pytest
import torch
from difftest import CANCEL_FLOOR, assert_close, one_torch_thread, random_block  # noqa: F401
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import features as program_features
from programs import graphs, make_layer, specs
from zoo import LAYERS, features

import sarc
from sarc.compiler import PIPELINE, optimize
from sarc.ir import interpreter
from sarc.ir.function import Builder
from sarc.ir.ops import Op
from sarc.ir.passes import cse, dce
from sarc.ir.printer import format_function
from sarc.ir.types import Domain, DType, TensorType
from sarc.ir.verifier import verify
from sarc.runtime.bind import bind_inputs

IDEMPOTENT = (dce, cse)


def _check_passes(fn):
    verify(fn)
    for p in PIPELINE:
        out = p(fn)
        verify(out)
        assert [k for k, _ in out.outputs] == [k for k, _ in fn.outputs], p.__name__
        for (_, i), (_, j) in zip(fn.outputs, out.outputs):
            assert out[j].type == fn[i].type, f"{p.__name__} changed an output's type"
    for p in IDEMPOTENT:
        once = p(fn)
        twice = p(once)
        assert twice == once, (f"{p.__name__} is not idempotent:\n{format_function(once)}\n"
                               f"--- then ---\n{format_function(twice)}")
    opt = optimize(fn)
    for p in IDEMPOTENT:
        assert p(opt) == opt, f"{p.__name__} still changes the optimized IR"


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_passes_on_models(model):
    _check_passes(LAYERS[model](7).trace())


@settings(max_examples=40, deadline=None)
@given(spec=specs(), seed=st.integers(0, 2**16))
def test_passes_on_random_programs(spec, seed):
    torch.manual_seed(seed)
    _check_passes(make_layer(spec).trace())


def _interpret(layer, fn, g, feats):
    """Outputs and gradients (params, float features) of ``fn`` under the interpreter."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in feats.items()}
    params = dict(layer.named_parameters())
    out = interpreter.run(fn, g, bind_inputs(layer, fn, g, (), leaves), params, layer.training,
                          seed=7)   # the same dropout masks before and after
    torch.manual_seed(1)
    loss = sum((o * torch.randn_like(o)).sum() for _, o in sorted(out.items()))
    wrt = list(params.values()) + [leaves[k] for k in sorted(leaves) if leaves[k].requires_grad]
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
    return out, [torch.zeros_like(w) if gr is None else gr for w, gr in zip(wrt, grads)]


def _same_meaning(layer, g, feats):
    fn = layer.trace()
    out_a, grads_a = _interpret(layer, fn, g, feats)
    out_b, grads_b = _interpret(layer, optimize(fn), g, feats)
    assert sorted(out_a) == sorted(out_b)
    tensors = [*out_a.values(), *grads_a]
    scale = max([t.abs().max().item() for t in tensors if t.numel()] + [0.0])
    for k in out_a:
        assert_close(out_b[k], out_a[k], what=f"output {k}")
    for i, (a, b) in enumerate(zip(grads_a, grads_b)):
        assert_close(b, a, what=f"gradient {i}", floor=CANCEL_FLOOR * scale)


@pytest.mark.parametrize("model", sorted(LAYERS))
def test_optimize_keeps_interpreter_results_on_models(model):
    g = random_block(torch.Generator().manual_seed(3), 10, 8, 40)
    layer = LAYERS[model](6)
    _same_meaning(layer, g, features(layer, g, 6))


@settings(max_examples=30, deadline=None)
@given(spec=specs(), g=graphs(max_nodes=15, max_edges=40), seed=st.integers(0, 2**16))
def test_optimize_keeps_interpreter_results_on_random_programs(spec, g, seed):
    torch.manual_seed(seed)
    layer = make_layer(spec)
    _same_meaning(layer, g, program_features(layer, g, seed))


# --- hand-written IR --------------------------------------------------------------------

F32 = DType.F32


def _t(domain: Domain, *feat: int, dtype: DType = F32) -> TensorType:
    return TensorType(domain, dtype, tuple(feat))


def test_dce_drops_exactly_the_dead_values():
    b = Builder("Dead")
    h = b.leaf(Op.INPUT, "h", _t(Domain.SRC, 3))
    w = b.leaf(Op.PARAM, "w", _t(Domain.PARAM, 4, 3))
    e = b.add(Op.GATHER_SRC, [h])
    b.add(Op.LINEAR, [e, w])                  # dead
    b.add(Op.RELU, [e])                       # dead
    r = b.add(Op.REDUCE, [e], {"kind": "sum"})
    fn = verify(b.finish([("h", r)]))
    out = verify(dce(fn))
    assert [v.op for v in out.values] == [Op.INPUT, Op.GATHER_SRC, Op.REDUCE]


def test_cse_merges_repeats_but_not_dropouts():
    b = Builder("Repeats")
    h = b.leaf(Op.INPUT, "h", _t(Domain.SRC, 3))
    e1 = b.add(Op.GATHER_SRC, [h])
    e2 = b.add(Op.GATHER_SRC, [h])
    d1 = b.add(Op.DROPOUT, [e1], {"p": 0.5, "key": 0})
    d2 = b.add(Op.DROPOUT, [e2], {"p": 0.5, "key": 0})
    s = b.add(Op.ADD, [d1, d2])
    fn = verify(b.finish([("h", b.add(Op.REDUCE, [s], {"kind": "sum"}))]))
    out = verify(cse(fn))
    counts = out.op_counts()
    assert counts["gather_src"] == 1
    assert counts["dropout"] == 2      # two draws of a mask are two values


def test_cse_keeps_constants_of_different_dtypes_apart():
    """``2.0`` as f32 and as f64 are different values (CSE once merged them)."""
    b = Builder("Dtypes")
    h = b.leaf(Op.INPUT, "h", _t(Domain.SRC, 3))
    x = b.leaf(Op.INPUT, "x", _t(Domain.SRC, 3, dtype=DType.F64))
    c32 = b.const(2.0, _t(Domain.PARAM, dtype=F32))
    c64 = b.const(2.0, _t(Domain.PARAM, dtype=DType.F64))
    a = b.add(Op.MUL, [b.add(Op.GATHER_SRC, [h]), c32])
    y = b.add(Op.MUL, [b.add(Op.GATHER_SRC, [x]), c64])
    fn = verify(b.finish([("a", b.add(Op.REDUCE, [a], {"kind": "sum"})),
                          ("b", b.add(Op.REDUCE, [y], {"kind": "sum"}))]))
    out = verify(cse(fn))
    assert out.op_counts()["const"] == 2


def test_cse_keeps_src_and_dst_reads_apart():
    b = Builder("Sides")
    hs = b.leaf(Op.INPUT, "h", _t(Domain.SRC, 3))
    hd = b.leaf(Op.INPUT, "h", _t(Domain.DST, 3))
    s = b.add(Op.ADD, [b.add(Op.GATHER_SRC, [hs]), b.add(Op.GATHER_DST, [hd])])
    fn = verify(b.finish([("h", b.add(Op.REDUCE, [s], {"kind": "max"}))]))
    assert cse(fn).op_counts()["input"] == 2


def test_mixed_dtype_layer_compiles_and_runs():
    """End to end: a layer with an f32 and an f64 feature, both scaled by 2.0."""

    class TwoDtypes(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": 3, "x": sarc.Feature((3,), "f64")})

        def message(self, src, dst, edge):
            return {"a": src.h * 2.0, "b": src.x * 2.0}

        def reduce(self, msg):
            return {"a": sarc.sum(msg.a), "b": sarc.sum(msg.b)}

    g = random_block(torch.Generator().manual_seed(0), 5, 5, 12)
    h, x = torch.randn(5, 3), torch.randn(5, 3, dtype=torch.float64)
    out = TwoDtypes()(g, h, x)
    assert out["b"].dtype == torch.float64
    assert_close(out["a"], torch.zeros(5, 3).index_add(0, g.dst, 2.0 * h[g.src]))
    assert_close(out["b"], torch.zeros(5, 3, dtype=torch.float64).index_add(0, g.dst, 2.0 * x[g.src]))


def test_fuse_typed_linear_moves_rgcn_projection_into_the_aggregate():
    """The per-relation product of source rows joins the aggregate that sums it."""
    from rgcn import RGCNLayer
    from sarc.compiler import optimize
    from sarc.ir.ops import Op
    from sarc.ir.passes import dce, fuse_typed_linear

    fn = optimize(RGCNLayer(6, 3, 4, num_bases=2).trace())
    assert any(v.op is Op.TYPED_LINEAR for v in fn.values)
    out = verify(dce(fuse_typed_linear(fn)))
    assert not any(v.op in (Op.TYPED_LINEAR, Op.GATHER_SRC) for v in out.values)
    (agg,) = [v for v in out.values if v.op is Op.AGGREGATE]
    assert any(r.op is Op.TYPED_LINEAR for r in agg.attr["body"].values)
    assert verify(dce(fuse_typed_linear(out))) == out  # idempotent


class _EdgeWeightedConv(sarc.Layer):
    """PyG GraphConv with edge weights: ``lin_rel(sum_u w_e h_u) + lin_root(h_v)``."""

    def __init__(self, d_in: int, d_out: int, scale: str = "mul"):
        super().__init__(node={"h": d_in}, edge={"w": ()})
        self.lin_rel = torch.nn.Linear(d_in, d_out)
        self.lin_root = torch.nn.Linear(d_in, d_out, bias=False)
        self.scale = scale

    def message(self, src, dst, edge):
        w = edge.w.unsqueeze(-1)
        return src.h * w if self.scale == "mul" else src.h / (1.0 + w)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.lin_rel(agg.agg) + self.lin_root(dst.h)


def _linear_at_the_nodes(layer, width: int) -> None:
    """No product on the edges' rows, nor an edge tensor of the input's ``width``."""
    fn = optimize(layer.trace())
    assert not any(v.op in (Op.LINEAR, Op.MATMUL) and v.type.domain is Domain.EDGE
                   for v in fn.values), format_function(fn)
    assert not any(v.type.domain is Domain.EDGE and v.type.feat[-1:] == (width,)
                   for v in fn.values), format_function(fn)


@pytest.mark.parametrize("scale", ["mul", "div"])
def test_a_narrowing_linear_moves_through_an_edge_scalar_to_the_nodes(scale):
    """``W sum_e w_e h_u`` is ``sum_e w_e (W h)_u``: the linear reaches the nodes (no
    product on the edges' rows, nor an edge tensor as wide as h); it never moves onto
    an edge value it cannot leave."""
    layer = _EdgeWeightedConv(12, 3, scale)
    _linear_at_the_nodes(layer, width=12)
    g = random_block(torch.Generator().manual_seed(3), 10, 8, 40)
    feats = {"h": torch.randn(10, 12), "w": torch.rand(40)}
    _same_meaning(layer, g, feats)


class _EdgeConv(sarc.Layer):
    """DGL's EdgeConv: ``max_u theta(h_u - h_v) + phi(h_v)``, ``theta`` over both ends."""

    def __init__(self, in_feats: int, out_feats: int, op: str):
        super().__init__(node={"h": in_feats})
        self.theta = torch.nn.Linear(in_feats, out_feats)
        self.phi = torch.nn.Linear(in_feats, out_feats)
        self.op = op

    def message(self, src, dst, edge):
        both = src.h - dst.h if self.op == "sub" else src.h + 2.0 * dst.h
        return self.theta(both) + self.phi(dst.h)

    def reduce(self, msg):
        return sarc.max(msg.m)


@pytest.mark.parametrize("op", ["sub", "add"])
def test_a_narrowing_linear_of_both_ends_is_computed_at_the_nodes(op):
    """``W (h_u - h_v)`` is ``(W h)_u - (W h)_v``: each end's product is per node, and the
    edges carry W's narrow output, not h (it was a product over the edges' rows of h's
    width)."""
    layer = _EdgeConv(12, 3, op)
    _linear_at_the_nodes(layer, width=12)
    g = random_block(torch.Generator().manual_seed(3), 10, 8, 40)
    _same_meaning(layer, g, {"h": torch.randn(10, 12)})


def test_a_widening_linear_of_both_ends_stays_on_the_edges():
    """Distributing a linear that widens would put its wider output on the edges."""
    layer = _EdgeConv(3, 12, "sub")
    fn = optimize(layer.trace())
    assert sum(v.op is Op.LINEAR and v.type.domain is Domain.EDGE for v in fn.values) == 1
    _same_meaning(layer, random_block(torch.Generator().manual_seed(3), 10, 8, 40),
                  {"h": torch.randn(10, 3)})


def test_a_linear_of_both_ends_that_keeps_the_width_is_computed_at_the_nodes():
    """``W (h_u - h_v)`` with W square: per node, N rows instead of E (DGL's EdgeConv at
    equal widths), and no edge tensor is a product."""
    layer = _EdgeConv(6, 6, "sub")
    fn = optimize(layer.trace())
    assert not any(v.op in (Op.LINEAR, Op.MATMUL) and v.type.domain is Domain.EDGE
                   for v in fn.values), format_function(fn)
    _same_meaning(layer, random_block(torch.Generator().manual_seed(3), 10, 8, 40),
                  {"h": torch.randn(10, 6)})


class _EdgeFeatureConv(sarc.Layer):
    """``max_u W (h_u + e_uv)``: one term of the sum is an edge feature."""

    def __init__(self, width: int):
        super().__init__(node={"h": width}, edge={"e": width})
        self.lin = torch.nn.Linear(width, width)

    def message(self, src, dst, edge):
        return self.lin(src.h + edge.e)

    def reduce(self, msg):
        return sarc.max(msg.m)


def test_a_linear_that_keeps_the_width_of_an_edge_feature_sum_stays_on_the_edges():
    """Split, its edge term's product would still be per edge, and the node term's added."""
    layer = _EdgeFeatureConv(5)
    fn = optimize(layer.trace())
    assert sum(v.op is Op.LINEAR and v.type.domain is Domain.EDGE for v in fn.values) == 1
    assert not any(v.op is Op.LINEAR and v.type.domain is not Domain.EDGE for v in fn.values)
    _same_meaning(layer, random_block(torch.Generator().manual_seed(3), 10, 8, 40),
                  {"h": torch.randn(10, 5), "e": torch.randn(40, 5)})
