"""IR autodiff: the backward function of a layer against torch autograd.

The reference is torch autograd through the interpreter on the traced layer;
the backward function (``sarc.ir.autodiff.grad``) runs in the interpreter too
and must give the gradient of every parameter and every float input feature:

- for every model layer of the zoo (GAT with attention dropout active, the same
  seed on both sides) on graphs with nodes without in-edges, self loops,
  multi-edges and blocks, float32, relative error <= 1e-5;
- for random DSL layers (hypothesis: ``random_layers``, float64, and the
  backends' ``tests/programs.py``, float32, where the two may differ by their
  float32 rounding: at most a running error bound of the backward function
  each, which allows for cancellation, see ``_rounding_bounds``);
- compiled by the torch backend after the optimizing passes, against the
  interpreter.

Also: every op has a VJP rule or a stated reason, the backward verifies and
prints stably (a golden file of GAT's backward; ``SARC_UPDATE_GOLDEN=1``
rewrites it), dropout masks depend on (seed, key) only.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
import torch
from gat import GATLayer
from gcn import GCNLayer
from gin import GINLayer
import programs
from difftest import BACKENDS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from random_layers import cases
from rgcn import RGCNLayer
from sage import SAGELayer

import sarc
from sarc.backends import torch_backend
from sarc.backends.torch_backend import LOWERING
from sarc.compiler import optimize
from sarc.errors import DSLError
from sarc.ir import interpreter, rng
from sarc.ir.autodiff import GRAD_PREFIX, NOT_DIFFERENTIABLE, VJP_RULES, AutodiffError, grad
from sarc.ir.function import Builder
from sarc.ir.interpreter import IMPLS
from sarc.ir.ops import ARITY, BACKWARD_OPS, LEAVES, TYPE_RULES, Op
from sarc.ir.printer import format_function
from sarc.ir.types import Domain, DType, TensorType
from sarc.ir.verifier import verify
from sarc.runtime.bind import bind_inputs

# a folder of its own: tests/golden/ir/*.ir are the layers' (test_golden_ir.py)
GOLDEN_BACKWARD = Path(__file__).resolve().parent.parent / "golden" / "ir" / "backward"
NUM_RELS = 3
SEED = 1234

LAYERS = {
    "gcn": lambda d: GCNLayer(d, 5),
    "sage": lambda d: SAGELayer(d, 5),
    "gat_1head": lambda d: GATLayer(d, 5, heads=1),
    "gat_4heads_concat": lambda d: GATLayer(d, 3, heads=4),
    "gat_4heads_mean": lambda d: GATLayer(d, 3, heads=4, concat=False),
    "gat_1head_drop": lambda d: GATLayer(d, 5, heads=1, attn_drop=0.4),
    "gat_4heads_concat_drop": lambda d: GATLayer(d, 3, heads=4, attn_drop=0.5),
    "gat_4heads_mean_drop": lambda d: GATLayer(d, 3, heads=4, concat=False, attn_drop=0.5),
    "gin_train_eps": lambda d: GINLayer(d, 6, 5, eps=0.3, train_eps=True),
    "rgcn": lambda d: RGCNLayer(d, 5, NUM_RELS),
    "rgcn_bases": lambda d: RGCNLayer(d, 5, NUM_RELS, num_bases=2),
}


# A gradient that cancels to (nearly) zero -- GAT's att_dst where all of a node's
# scores fall on one side of the leaky_relu, softmax being shift invariant -- is
# float32 rounding noise on both sides: it is compared at this fraction of the
# largest gradient of the layer (as tests/difftest.py does for the backends).
CANCEL_FLOOR = 1e-2


def assert_close(actual, expected, rtol: float, what: str = "", floor: float = 0.0) -> None:
    """``max|actual - expected| <= rtol * max(max|expected|, floor)`` over the whole tensor."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.numel() == 0:
        return
    a, b = actual.detach().double(), expected.detach().double()
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), f"{what}: non-finite entries"
    diff = (a - b).abs().max().item()
    scale = max(b.abs().max().item(), floor)
    assert diff <= rtol * scale, f"{what}: max abs diff {diff:.3e} > {rtol:g} * {scale:.3e}"


def block(src, dst, num_src: int, num_dst: int | None = None) -> sarc.Graph:
    src, dst = torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
    if num_dst is None:
        return sarc.Graph.from_edges(src, dst, num_src)
    return sarc.Graph.from_edges(src, dst, num_src=num_src, num_dst=num_dst)


def _graphs() -> dict[str, sarc.Graph]:
    gen = torch.Generator().manual_seed(1)
    return {
        "random": block(torch.randint(0, 9, (30,), generator=gen).tolist(),
                        torch.randint(0, 9, (30,), generator=gen).tolist(), 9),
        # nodes 0, 4, 5 have no in-edges; 5 has no edges at all
        "zero_in_degree": block([0, 0, 1, 2, 4], [1, 2, 3, 3, 1], 6),
        "self_loops": block([0, 1, 2, 3, 0, 2], [0, 1, 2, 3, 1, 0], 4),
        "multi_edges": block([0, 0, 0, 1, 1, 2, 3, 3], [1, 1, 1, 2, 2, 2, 0, 0], 4),
        "block": block([0, 3, 4, 5, 6, 6, 2, 1, 6], [0, 0, 1, 1, 1, 2, 2, 0, 0], 7, 3),
        "no_edges": block([], [], 3),
    }


GRAPHS = _graphs()


def _features(layer: sarc.Layer, g: sarc.Graph, d: int) -> dict[str, torch.Tensor]:
    feats = {"h": torch.randn(g.num_src, d)}
    if isinstance(layer, RGCNLayer):
        feats["etype"] = torch.randint(0, NUM_RELS, (g.num_edges,))
        feats["norm"] = torch.rand(g.num_edges)
    return feats


def _autograd_and_ir(fn, layer, g, feats, seed, bounds: bool = False):
    """(torch autograd grads, backward-IR grads), each {'param x' | 'input x': tensor};
    with ``bounds``, also the IR's rounding error bounds (``_rounding_bounds``), same keys."""
    inputs = bind_inputs(layer, fn, g, (), feats)
    wrt_inputs = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()
                  if v.is_floating_point() and k not in ("in_degree", "out_degree")}
    inputs = {**inputs, **wrt_inputs}
    params = {k: p.detach().clone().requires_grad_() for k, p in layer.named_parameters()}
    out = interpreter.run(fn, g, inputs, params, training=True, seed=seed)
    cot = {k: torch.randn_like(v) for k, v in out.items()}
    leaves = {**{f"param {k}": p for k, p in params.items()},
              **{f"input {k}": x for k, x in wrt_inputs.items()}}
    loss = sum((out[k] * cot[k]).sum() for k in out)
    ref = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)))

    bwd = grad(fn)
    with torch.no_grad():
        pg, ig = interpreter.run_backward(bwd, g, inputs, params, cot, training=True, seed=seed)
    mine = {**{f"param {k}": v for k, v in pg.items()}, **{f"input {k}": v for k, v in ig.items()}}
    if not bounds:
        return ref, mine
    return ref, mine, _rounding_bounds(fn, bwd, g, inputs, params, cot, seed)


def _compare(ref, mine, rtol, floor_frac=0.0):
    assert set(mine) <= set(ref), f"gradients of unknown leaves: {set(mine) - set(ref)}"
    scale = max([r.abs().max().item() for r in ref.values() if r is not None and r.numel()],
                default=0.0)
    for name, r in ref.items():
        if name not in mine:
            assert r is None or not r.any(), f"{name}: no gradient from the IR, autograd has one"
            continue
        expected = torch.zeros_like(mine[name]) if r is None else r
        assert_close(mine[name], expected, rtol, f"grad of {name}", floor_frac * scale)


# --- float32 rounding: a running error bound of the backward function ------------------
#
# The IR backward and torch autograd evaluate the same derivative formulas (the rules
# follow torch's), but in float32, in different orders and fused differently: torch's
# tanh_backward computes 1 - y*y with one rounding, the IR rule (sub(1, mul(y, y))) with
# two. Neither is wrong; each differs from the exact value by its rounding, which is
# small next to the magnitudes of the terms, not next to the result: through a
# saturated tanh (y = 0.9997) the gradient is cot * (1 - y*y) ~ 6e-4 * cot, while the
# rounding of y*y is 2**-25 * cot, a relative 5e-5 -- more than a bound relative to the
# gradient's own size (1e-5) allows.
#
# So the float32 programs are compared within Wilkinson's running error bound of the
# backward function's evaluation (Higham, Accuracy and Stability of Numerical
# Algorithms, 3.3): the interpreter evaluates it as it does for the test, carrying
# beside each value v a bound E(v) with |fl(v) - v| <= u E(v) to first order, where
# u = 2**-24 is float32's unit roundoff. An op's bound is its operands' bounds through
# its Jacobian in absolute value, plus its own rounding: a correctly rounded op |v|,
# an elementary function ELEMENTARY_ROUNDING |v|, a sum of n terms (a reduce, a dot
# product of length n) n times the sum of the terms' absolute values -- the bound of
# recursive summation, which holds for any order of the terms, so for torch's kernels
# too. Exact: the inputs, params and cotangents, and the forward's values, which the
# backward function recomputes with the same ops on the same tensors as the autograd
# side, to the same bits (the rules' constants: their rounding to float32). Autograd
# evaluates the same formulas, terms of the same magnitudes, so the two differ by at
# most 2 u E, entry by entry. The bound follows the size of the terms, not of the
# result: about 40 u |gradient| for a typical entry of these programs (the relative
# bound it replaces allowed 1e-5, 170 u, of the tensor's largest entry), far more where
# the gradient cancels. A wrong rule is off by the size of the gradient, far above
# 2 u E unless the gradient is itself cancellation noise (E >> |gradient|).

U32 = 2.0 ** -24
"""float32's unit roundoff: a correctly rounded op's relative error is at most this."""

ELEMENTARY_ROUNDING = 4
"""exp, log, tanh, sigmoid, elu, pow (the backward's are the rules' exp and pow): error at
most this many u; torch's float32 kernels measure within 2 u (1 ulp)."""

UNDERFLOW = torch.finfo(torch.float32).tiny
"""Absolute allowance for gradual underflow (each op's absolute error below the normal range
is at most 2**-150)."""


def _rowwise(counts: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A count per row as a factor of ``like``'s rows."""
    return counts.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def _bilinear(n):
    """Bound of a sum of n products per entry (``n(v, g, xs)``: a number or rowwise)."""
    def rule(v, g, ctx, y, xs, es):
        run = lambda *ops: IMPLS[v.op](v, g, ctx, *ops)  # noqa: E731
        a, b, *rest = xs
        ea, eb = es[0], es[1]
        return (run(ea, b.abs(), *rest) + run(a.abs(), eb, *rest)
                + n(v, g, xs) * run(a.abs(), b.abs(), *rest))
    return rule


def _summing(n):
    """Bound of a linear op that sums n terms per entry (``n(v, g, xs)``; 0: no rounding)."""
    def rule(v, g, ctx, y, xs, es):
        run = lambda x: IMPLS[v.op](v, g, ctx, x, *xs[1:])  # noqa: E731
        carried = run(es[0])
        k = n(v, g, xs)
        return carried if isinstance(k, int) and k == 0 else carried + k * run(xs[0].abs())
    return rule


def _elementwise(ulps: int):
    """|f'(x)| E(x) + ulps |f(x)| for a unary elementwise op (f' by autograd in float64)."""
    def rule(v, g, ctx, y, xs, es):
        x = xs[0].detach().double().requires_grad_()
        with torch.enable_grad():
            (slope,) = torch.autograd.grad(IMPLS[v.op](v, g, ctx, x).sum(), x)
        carried = torch.where(es[0] > 0, slope.abs().to(y.dtype) * es[0], 0.0)  # f'(x) may be inf
        return carried + ulps * y.abs()
    return rule


def _cast_rounding(x: torch.Tensor, y: torch.Tensor) -> float:
    """A cast's own rounding in units of u: none to a dtype that holds every value of the
    operand's (wider, or from an integer), else the target's unit roundoff."""
    if not x.is_floating_point() or torch.finfo(y.dtype).eps <= torch.finfo(x.dtype).eps:
        return 0.0
    return torch.finfo(y.dtype).eps / 2 / U32


def _reduce_bound(v, g, ctx, y, xs, es):
    kind = v.attr["kind"]
    x, e = xs[0], es[0]
    if kind in ("max", "min"):   # the bound of the entry picked (at most the largest)
        return interpreter.ROW_REDUCE["max"](g, e)
    assert kind in ("sum", "mean"), kind
    deg = _rowwise(torch.bincount(g.dst, minlength=g.num_dst), y)
    extra = 1 if kind == "mean" else 0   # mean: the division by the degree
    return IMPLS[v.op](v, g, ctx, e) + (deg + extra) * IMPLS[v.op](v, g, ctx, x.abs())


def _edge_softmax_bound(v, g, ctx, p, xs, es):
    """p = exp(x - m) / s, m the row's max, s the row's sum: relative bounds add up."""
    x, e = xs[0], es[0]
    at_edges = lambda t: interpreter.ROW_REDUCE["max"](g, t)[g.dst]  # noqa: E731  row max
    # exp(x - m): the error of its argument (x's, m's, the subtraction's) becomes relative
    rel = e + at_edges(e) + (x - at_edges(x)).abs() + ELEMENTARY_ROUNDING
    deg = _rowwise(torch.bincount(g.dst, minlength=g.num_dst), p)[g.dst]
    return p * (rel + at_edges(rel) + deg + 1)   # s: n positive terms; the division


def _counts(index):
    """Terms summed into each row of an index_add / scatter: ``index(v, g, xs)`` -> (idx, rows)."""
    def n(v, g, xs):
        idx, rows = index(v, g, xs)
        return _rowwise(torch.bincount(idx, minlength=rows), xs[0])
    return n


_EXACT = _summing(lambda v, g, xs: 0)
_ROUNDED = lambda v, g, ctx, y, xs, es: _EXACT(v, g, ctx, y, xs, es) + y.abs()  # noqa: E731

ROUNDING_RULES = {
    Op.GATHER_SRC: _EXACT, Op.GATHER_DST: _EXACT, Op.RESHAPE: _EXACT, Op.SLICE: _EXACT,
    Op.TRANSPOSE: _EXACT, Op.EXPAND: _EXACT, Op.PAD: _EXACT, Op.PERMUTE: _EXACT,
    Op.MAX_AXIS: _EXACT, Op.DST_TO_SRC: _EXACT, Op.INDEX: _EXACT,
    Op.NEG: lambda v, g, ctx, y, xs, es: es[0],
    Op.CONCAT: lambda v, g, ctx, y, xs, es: IMPLS[v.op](v, g, ctx, *es),
    Op.WHERE_POS: lambda v, g, ctx, y, xs, es: IMPLS[v.op](v, g, ctx, xs[0], *es[1:]),
    Op.EQ_MASK: lambda v, g, ctx, y, xs, es: torch.zeros_like(y),
    # x * keep / (1 - p): two roundings
    Op.DROPOUT: lambda v, g, ctx, y, xs, es: _EXACT(v, g, ctx, y, xs, es) + 2 * y.abs(),
    Op.DIV_EDGE_COUNT: _ROUNDED,
    Op.ADD: lambda v, g, ctx, y, xs, es: es[0] + es[1] + y.abs(),
    Op.SUB: lambda v, g, ctx, y, xs, es: es[0] + es[1] + y.abs(),
    Op.MUL: lambda v, g, ctx, y, xs, es: es[0] * xs[1].abs() + xs[0].abs() * es[1] + y.abs(),
    Op.DIV: lambda v, g, ctx, y, xs, es: (es[0] + y.abs() * es[1]) / xs[1].abs() + y.abs(),
    Op.RELU: _elementwise(0), Op.CLAMP_MIN: _elementwise(0), Op.LEAKY_RELU: _elementwise(1),
    Op.EXP: _elementwise(ELEMENTARY_ROUNDING), Op.LOG: _elementwise(ELEMENTARY_ROUNDING),
    Op.SIGMOID: _elementwise(ELEMENTARY_ROUNDING), Op.TANH: _elementwise(ELEMENTARY_ROUNDING),
    Op.ERF: _elementwise(ELEMENTARY_ROUNDING),
    Op.CAST: lambda v, g, ctx, y, xs, es: es[0].to(y.dtype) + _cast_rounding(xs[0], y) * y.abs(),
    Op.POW: _elementwise(ELEMENTARY_ROUNDING), Op.ELU: _elementwise(ELEMENTARY_ROUNDING),
    Op.SOFTPLUS: _elementwise(ELEMENTARY_ROUNDING),
    Op.REDUCE: _reduce_bound,
    Op.EDGE_SOFTMAX: _edge_softmax_bound,
    Op.SUM_AXIS: _summing(lambda v, g, xs: xs[0].shape[interpreter._graph_axis(v, v.attr["axis"])]),
    Op.SUM_ROWS: _summing(lambda v, g, xs: xs[0].shape[0]),
    Op.SCATTER_SRC: _summing(_counts(lambda v, g, xs: (g.src, g.num_src))),
    Op.INDEX_ADD: _summing(_counts(lambda v, g, xs: (xs[1], v.attr["num_rows"]))),
    # dot products: n products and their sum
    Op.LINEAR: _bilinear(lambda v, g, xs: xs[0].shape[-1]),
    Op.MATMUL: _bilinear(lambda v, g, xs: xs[0].shape[-1]),
    Op.TYPED_LINEAR: _bilinear(lambda v, g, xs: xs[0].shape[-1]),
    Op.ROW_OUTER: _bilinear(lambda v, g, xs: xs[0].reshape(-1, xs[0].shape[-1]).shape[0]),
    Op.TYPED_OUTER: _bilinear(lambda v, g, xs: torch.bincount(
        xs[2], minlength=v.attr["num_types"]).to(xs[0].dtype).view(-1, 1, 1)),
}
"""Per op: (value, graph, ctx, result, operands, operands' bounds) -> the result's bound E
(in units of u; see above). The fused ops of the passes have none: autodiff runs before them."""


def _forward_copies(fn, bwd) -> list[bool]:
    """Which values of ``bwd`` compute a value of ``fn`` (the same op, attributes and type
    of the same operands, recursively): the copy of the forward it starts with."""
    ids: dict[tuple, int] = {}
    fwd: list[int] = []
    for v in fn.values:
        fwd.append(ids.setdefault((v.op, v.attrs, v.type, tuple(fwd[j] for j in v.inputs)),
                                  len(ids)))
    copies: list[bool] = []
    bwd_ids: list[int] = []
    for v in bwd.values:
        i = ids.get((v.op, v.attrs, v.type, tuple(bwd_ids[j] for j in v.inputs)), -1 - len(bwd_ids))
        copies.append(i >= 0)
        bwd_ids.append(i)
    return copies


def _rounding_bounds(fn, bwd, g, inputs, params, cot, seed) -> dict[str, torch.Tensor]:
    """E of every gradient output of ``bwd`` (keys as ``_autograd_and_ir``'s): the
    backward evaluated as ``interpreter.run_backward`` does, with the bounds beside (in
    float32 too, as the interpreter's ops take; a bound's own rounding is immaterial).

    The values of the forward (of ``fn``) count as exact: the autograd side evaluates the
    same ops on the same tensors, so their rounding is the same bits on both sides."""
    copies = _forward_copies(fn, bwd)
    feeds = {**{k: x.detach() for k, x in inputs.items()},
             **{GRAD_PREFIX + k: c for k, c in cot.items()}}
    params = {k: p.detach() for k, p in params.items()}
    ctx = {"training": True, "seed": seed}
    vals: list[torch.Tensor] = []
    errs: list[torch.Tensor] = []
    for v, copy in zip(bwd.values, copies):
        if v.op in LEAVES:
            y = interpreter._leaf(v, g, feeds, params)
            e = torch.zeros(y.shape)   # exact, but a constant of the rules rounded to float32
            if v.op is Op.CONST and not copy and y.is_floating_point():
                e = e + abs(v.attr["value"] - y.item()) / U32
        else:
            xs = [vals[j] for j in v.inputs]
            y = IMPLS[v.op](v, g, ctx, *xs)
            if copy or not y.is_floating_point():
                e = torch.zeros(y.shape)
            else:
                assert v.op in ROUNDING_RULES, f"no rounding bound for {v.op.value}"
                e = ROUNDING_RULES[v.op](v, g, ctx, y, xs, [errs[j] for j in v.inputs])
        assert e.shape == y.shape, f"{v.op.value}: bound shaped {e.shape}, value {y.shape}"
        vals.append(y)
        errs.append(e.to(torch.float32))
    return {("param " if bwd.values[i].type.domain is Domain.PARAM else "input ")
            + name[len(GRAD_PREFIX):]: errs[i].double() for name, i in bwd.outputs}


def _compare_within_rounding(ref, mine, bounds) -> None:
    """Every entry: |IR - autograd| <= 2 u E (both float32 evaluations of the same terms)."""
    assert set(mine) <= set(ref), f"gradients of unknown leaves: {set(mine) - set(ref)}"
    for name, r in ref.items():
        if name not in mine:
            assert r is None or not r.any(), f"{name}: no gradient from the IR, autograd has one"
            continue
        got, want = mine[name], torch.zeros_like(mine[name]) if r is None else r
        what = f"grad of {name}"
        assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        a, b = got.detach().double(), want.detach().double()
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), f"{what}: non-finite entries"
        allowed = 2 * U32 * bounds[name] + UNDERFLOW
        assert torch.isfinite(allowed).all(), f"{what}: non-finite rounding bound"
        excess = (a - b).abs() - allowed
        if excess.numel() and excess.max() > 0:
            i = int(excess.argmax())
            raise AssertionError(
                f"{what}: entry {i}: IR {a.flatten()[i].item():.9e}, autograd "
                f"{b.flatten()[i].item():.9e}: |diff| {(a - b).abs().flatten()[i].item():.3e} > "
                f"2 u E = {allowed.flatten()[i].item():.3e}")


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_model_backward_matches_autograd(model, graph):
    g = GRAPHS[graph]
    layer = LAYERS[model](6)
    ref, mine = _autograd_and_ir(layer.trace(), layer, g, _features(layer, g, 6), SEED)
    # every param, and h; RGCN's edge weight norm too
    assert {n for n in mine if n.startswith("param")} == {f"param {n}" for n, _ in
                                                          layer.named_parameters()}
    assert "input h" in mine
    _compare(ref, mine, 1e-5, CANCEL_FLOOR)


def test_message_parameters_need_no_annotation():
    """RGCN's W[etype] inside the message, and a table indexed by edge type."""

    class EdgeMLP(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": 4}, edge={"etype": sarc.INDEX, "w": 2})
            self.emb = torch.nn.Parameter(torch.randn(NUM_RELS, 4))
            self.mlp = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(),
                                           torch.nn.Linear(8, 4))

        def message(self, src, dst, edge):
            return src.h * self.emb[edge.etype] * self.mlp(edge.w)

        def reduce(self, msg):
            return sarc.max(msg.m)

    layer = EdgeMLP()
    g = GRAPHS["multi_edges"]
    feats = {"h": torch.randn(4, 4), "etype": torch.randint(0, NUM_RELS, (g.num_edges,)),
             "w": torch.randn(g.num_edges, 2)}
    ref, mine = _autograd_and_ir(layer.trace(), layer, g, feats, SEED)
    assert {"param emb", "param mlp.0.weight", "param mlp.2.bias", "input w"} <= set(mine)
    _compare(ref, mine, 1e-5)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_random_layers_backward_matches_autograd(case):
    layer, g, feats, seed = case
    fn = layer.trace()
    ref, mine = _autograd_and_ir(fn, layer, g, feats, seed)
    # values that cancel to ~0 are compared at 1e-4 of the gradients' scale
    _compare(ref, mine, 1e-9, floor_frac=1e-4)


# Once flaky under a bound relative to the gradient (1e-5 of it, at least 1e-2 of the
# layer's largest): one node with two self loops, tanh(sum 3 rowsum(lins[0](h)) + sum
# lins[1](h)) saturates (y = 0.9997), and lins.0.weight's gradient through 1 - y*y
# differs by 1.6e-7 (a relative 3.4e-5) between the IR and torch's tanh_backward.
SATURATED_TANH = programs.Spec(
    din=1, d=1, use_x=False, use_w=False, use_t=False, lins=((1, 1, False), (1, 1, False)),
    params=(), typed=(), messages=(("scale", 3.0, ("rowsum", ("src_lin", 0))), ("src_lin", 1)),
    reduces=(("sum", 1), ("sum", 1)), update_self=None, update_act="tanh", concat=None,
    update_norm=False)
TWO_SELF_LOOPS = block([0, 0], [0, 0], 1)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs.specs(), programs.graphs(max_nodes=12, max_edges=24), st.integers(0, 2**16))
@example(SATURATED_TANH, TWO_SELF_LOOPS, 157)
def test_shared_random_programs_backward_matches_autograd(spec, g, seed):
    """The backends' random programs (tests/programs.py), float32: equal up to the
    rounding of each, entry by entry (``_rounding_bounds``)."""
    torch.manual_seed(seed)
    layer = programs.make_layer(spec)
    ref, mine, bounds = _autograd_and_ir(layer.trace(), layer, g,
                                         programs.features(layer, g, seed), seed, bounds=True)
    _compare_within_rounding(ref, mine, bounds)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases())
def test_random_layers_compiled_backward_matches_interpreter(case):
    """The backward, optimized by the pass pipeline and compiled, against the interpreter."""
    layer, g, feats, seed = case
    fn = layer.trace()
    bwd = grad(fn)
    inputs = bind_inputs(layer, fn, g, (), feats)
    params = {k: p.detach() for k, p in layer.named_parameters()}
    out = interpreter.run(fn, g, inputs, params, training=True, seed=seed)
    cot = {k: torch.randn_like(v) for k, v in out.items()}
    pg, ig = interpreter.run_backward(bwd, g, inputs, params, cot, training=True, seed=seed)
    kernel = torch_backend.compile(verify(optimize(bwd)))
    got = kernel(g, {**inputs, **{f"grad:{k}": v for k, v in cot.items()}}, params, True, seed)
    for name, want in {**pg, **ig}.items():
        assert_close(got[f"grad:{name}"], want, 1e-9, f"grad of {name}",
                     1e-4 * max(1.0, want.abs().max().item() if want.numel() else 0.0))


@pytest.mark.parametrize("model", ["gcn", "sage", "gat_4heads_concat_drop", "gin_train_eps",
                                   "rgcn_bases"])
def test_compiled_backward_matches_interpreter(model):
    g = GRAPHS["block"]
    layer = LAYERS[model](6)
    fn = layer.trace()
    bwd = grad(fn)
    inputs = bind_inputs(layer, fn, g, (), _features(layer, g, 6))
    params = {k: p.detach() for k, p in layer.named_parameters()}
    cot = {k: torch.randn_like(v) for k, v in interpreter.run(fn, g, inputs, params).items()}
    pg, ig = interpreter.run_backward(bwd, g, inputs, params, cot, training=True, seed=SEED)
    optimized = verify(optimize(bwd))
    assert optimized.role == "backward"
    kernel = torch_backend.compile(optimized)
    got = kernel(g, {**inputs, **{f"grad:{k}": v for k, v in cot.items()}}, params, True, SEED)
    for name, want in {**pg, **ig}.items():
        assert_close(got[f"grad:{name}"], want, 1e-5, f"grad of {name}")


# --- the backward function's form ------------------------------------------------------

def test_backward_leaves_and_outputs():
    layer = GATLayer(6, 3, heads=2, attn_drop=0.5)
    fn = layer.trace()
    bwd = grad(fn)
    assert bwd.role == "backward" and bwd.name == "GATLayer_grad"
    leaves = {(v.op, v.attr["name"], v.type) for v in bwd.values if v.op in (Op.INPUT, Op.PARAM)}
    forward = {(v.op, v.attr["name"], v.type) for v in fn.values if v.op in (Op.INPUT, Op.PARAM)}
    cot = TensorType(Domain.DST, DType.F32, (6,))
    # the forward's leaves (the bias, whose gradient is a sum of the cotangent, is
    # not needed and dropped) and the cotangent
    assert leaves == forward - {(Op.PARAM, "bias", fn.params()["bias"])} | {
        (Op.INPUT, "grad:h", cot)}
    outs = {k: bwd.values[i].type for k, i in bwd.outputs}
    assert outs == {**{f"grad:{k}": t for k, t in fn.params().items()},
                    "grad:h": TensorType(Domain.SRC, DType.F32, (6,))}


def test_builtin_degrees_and_int_inputs_get_no_gradient():
    bwd = grad(GCNLayer(4, 3).trace())
    assert {k for k, _ in bwd.outputs} == {"grad:lin.weight", "grad:bias", "grad:h"}
    bwd = grad(RGCNLayer(4, 3, NUM_RELS).trace())
    assert "grad:etype" not in dict(bwd.outputs) and "grad:norm" in dict(bwd.outputs)
    bwd = grad(RGCNLayer(4, 3, NUM_RELS).trace(), wrt_inputs=["h"])
    assert "grad:norm" not in dict(bwd.outputs)


def _render_gat_backward() -> str:
    torch.manual_seed(0)
    bwd = grad(GATLayer(6, 3, heads=2, attn_drop=0.5).trace())
    return ("# GATLayer(6, 3, heads=2, attn_drop=0.5): sarc.ir.autodiff.grad of the traced "
            "layer, then after sarc.compiler.optimize.\n"
            "# Generated by tests/ir/test_autodiff.py; rewrite with SARC_UPDATE_GOLDEN=1.\n"
            "# Source locations are left out: they would churn with every edit of gat.py.\n"
            f"\n# --- backward ---\n{format_function(verify(bwd), with_loc=False)}"
            f"\n# --- optimized ---\n{format_function(verify(optimize(bwd)), with_loc=False)}")


def test_backward_verifies_and_prints_stably():
    text = _render_gat_backward()
    assert text == _render_gat_backward()
    assert "def GATLayer_grad(src, dst, edge, params):  # backward\n" in text
    path = GOLDEN_BACKWARD / "gat.ir"
    if os.environ.get("SARC_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; create it with SARC_UPDATE_GOLDEN=1"
    if text != path.read_text():
        diff = "".join(difflib.unified_diff(path.read_text().splitlines(True),
                                            text.splitlines(True), "golden", "now"))
        pytest.fail(f"the printed backward of GAT changed (SARC_UPDATE_GOLDEN=1 rewrites "
                    f"{path} if that is intended):\n{diff}")


def test_layers_print_without_a_role_marker():
    text = format_function(GATLayer(6, 3).trace())
    assert text.startswith("def GATLayer(src, dst, edge, params):\n")


def test_verifier_checks_outputs_by_role():
    b = Builder("f")
    x = b.add(Op.PARAM, (), {"name": "w"}, type=TensorType(Domain.PARAM, DType.F32, (2,)))
    layer = b.finish([("w", x)])
    with pytest.raises(DSLError, match="must be a dst value"):
        verify(layer)
    b.role = "backward"
    assert verify(b.finish([("grad:w", x)])).role == "backward"
    b.role = "forward"
    with pytest.raises(DSLError, match="role"):
        verify(b.finish([("w", x)]))


def test_grad_rejects_fused_ir_with_a_reason():
    fn = optimize(SAGELayer(4, 3).trace())
    assert any(v.op in (Op.AGGREGATE, Op.SDDMM, Op.SOFTMAX_AGGREGATE) for v in fn.values)
    with pytest.raises(AutodiffError, match="differentiate the traced layer"):
        grad(fn)


def test_grad_rejects_a_feature_and_a_param_of_one_name():
    class Clash(sarc.Layer):
        def __init__(self):
            super().__init__(node={"bias": 3})
            self.bias = torch.nn.Parameter(torch.zeros(3))

        def message(self, src, dst, edge):
            return src.bias + self.bias

        def reduce(self, msg):
            return sarc.sum(msg.m)

    with pytest.raises(AutodiffError, match="rename one"):
        grad(Clash().trace())


# --- tables -----------------------------------------------------------------------------

def test_every_op_has_a_vjp_rule_or_a_reason():
    for op in Op:
        assert (op in VJP_RULES) != (op in NOT_DIFFERENTIABLE), op


def test_backward_ops_have_every_table_entry():
    for op in BACKWARD_OPS:
        assert op in TYPE_RULES and op in ARITY and op in IMPLS and op in LOWERING, op


# --- dropout ----------------------------------------------------------------------------

def test_dropout_mask_is_a_function_of_seed_and_key():
    x = torch.ones(50, 8)
    a = rng.dropout(x, 0.5, seed=7, key=0, training=True)
    assert torch.equal(a, rng.dropout(x, 0.5, seed=7, key=0, training=True))
    assert not torch.equal(a, rng.dropout(x, 0.5, seed=7, key=1, training=True))
    assert not torch.equal(a, rng.dropout(x, 0.5, seed=8, key=0, training=True))
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert 0.35 < (a == 0).float().mean().item() < 0.65
    assert torch.equal(rng.dropout(x, 0.5, seed=None, key=0, training=False), x)


def test_dropout_is_identical_in_interpreter_and_backend():
    layer = GATLayer(6, 3, heads=4, attn_drop=0.5)
    g = GRAPHS["random"]
    feats = {"h": torch.randn(g.num_src, 6)}
    fn = layer.trace()
    assert [v.attr["key"] for v in fn.values if v.op is Op.DROPOUT] == [0]
    inputs = bind_inputs(layer, fn, g, (), feats)
    params = dict(layer.named_parameters())
    kernel = torch_backend.compile(optimize(fn))
    ref = interpreter.run(fn, g, inputs, params, training=True, seed=SEED)["h"]
    assert_close(kernel(g, inputs, params, True, SEED)["h"], ref, 1e-5)
    other = kernel(g, inputs, params, True, SEED + 1)["h"]
    assert not torch.allclose(other, ref), "the seed does not reach the masks"
    evaluated = interpreter.run(fn, g, inputs, params, training=False)["h"]
    assert not torch.allclose(evaluated, ref), "dropout is not active in training"


def test_a_training_call_draws_its_seed_from_torch():
    layer = GATLayer(6, 3, heads=4, attn_drop=0.5).train()
    g = GRAPHS["random"]
    h = torch.randn(g.num_src, 6)
    torch.manual_seed(5)
    a = layer(g, h)
    torch.manual_seed(5)
    assert torch.equal(layer(g, h), a)
    assert not torch.equal(layer(g, h), a)


def test_dropout_needs_a_key():
    b = Builder("f")
    x = b.add(Op.INPUT, (), {"name": "h"}, type=TensorType(Domain.DST, DType.F32, (2,)))
    with pytest.raises(DSLError, match="key"):
        b.add(Op.DROPOUT, [x], {"p": 0.5})


def test_cast_sends_the_cotangent_back_in_the_operands_dtype():
    """``cast`` to float64 and back to float32 (and of an int64 input, which has no
    gradient): the backward casts each cotangent to its operand's dtype, as torch's ``.to``."""
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3]), 5)
    b = Builder("cast")
    x = b.leaf(Op.INPUT, "x", TensorType(Domain.DST, DType.F32, (3,)))
    k = b.leaf(Op.INPUT, "k", TensorType(Domain.DST, DType.I64, ()))
    w = b.leaf(Op.PARAM, "w", TensorType(Domain.PARAM, DType.F64, (3,)))
    wide = b.add(Op.TANH, [b.add(Op.MUL, [b.add(Op.CAST, [x], {"dtype": DType.F64}), w])])
    kf = b.add(Op.RESHAPE, [b.add(Op.CAST, [k], {"dtype": DType.F32})], {"feat": (1,)})
    y = b.add(Op.MUL, [b.add(Op.CAST, [wide], {"dtype": DType.F32}), kf])
    fn = verify(b.finish([("y", y)]))
    bwd = grad(fn, wrt_inputs=["x"])
    casts = [v.attr["dtype"] for v in bwd.values[len(fn.values):] if v.op is Op.CAST]
    assert casts == [DType.F64, DType.F32]   # the cotangent of y's cast, then of x's
    inputs = {"x": torch.randn(5, 3, requires_grad=True), "k": torch.arange(5)}
    params = {"w": torch.randn(3, dtype=torch.float64, requires_grad=True)}
    out = interpreter.run(fn, g, inputs, params, training=False, seed=0)
    assert out["y"].dtype == torch.float32
    cot = {"y": torch.randn(5, 3)}
    want = torch.autograd.grad((out["y"] * cot["y"]).sum(), [inputs["x"], params["w"]])
    with torch.no_grad():
        pg, ig = interpreter.run_backward(bwd, g, inputs, params, cot, training=False, seed=0)
    assert ig["x"].dtype == torch.float32 and pg["w"].dtype == torch.float64
    assert_close(ig["x"], want[0], 1e-6, "grad of x")
    assert_close(pg["w"], want[1], 1e-6, "grad of w")


# --- the torch backend with gradients from the backward IR ------------------------------

@pytest.mark.parametrize("graph", ["block", "multi_edges", "zero_in_degree"])
@pytest.mark.parametrize("model", sorted(LAYERS))
def test_layer_with_ir_autodiff_matches_torch_autograd(model, graph):
    """``autodiff="ir"``: a training step's gradients come from the compiled backward IR."""
    g = GRAPHS[graph]
    torch.manual_seed(3)
    layer = LAYERS[model](6).train()
    feats = _features(layer, g, 6)
    results = []
    for mode in ("torch", "ir"):
        layer.set_autodiff(mode)
        h = feats["h"].clone().requires_grad_()
        extra = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in feats.items()
                 if k != "h"}
        layer.zero_grad()
        torch.manual_seed(11)  # the call's dropout seed
        out = layer(g, h, **extra)
        out.backward(torch.ones_like(out) + torch.arange(out.numel()).view_as(out) % 3)
        grads = {f"param {k}": p.grad.clone() for k, p in layer.named_parameters()}
        grads["input h"] = h.grad
        if "norm" in extra:
            grads["input norm"] = extra["norm"].grad
        results.append((out.detach(), grads))
    (out_t, ref), (out_ir, mine) = results
    assert layer.compiled().backward is not None
    assert_close(out_ir, out_t, 1e-6, "output")
    assert set(mine) == set(ref)
    _compare(ref, mine, 1e-5, CANCEL_FLOOR)


def test_ir_autodiff_without_gradients_runs_the_forward_only():
    layer = GCNLayer(4, 3).set_autodiff("ir")
    g = GRAPHS["random"]
    with torch.no_grad():
        out = layer(g, torch.randn(g.num_src, 4))
    assert out.grad_fn is None
    with pytest.raises(ValueError, match="unknown autodiff"):
        layer.set_autodiff("jax")


class _NoGradientPath(sarc.Layer):
    """A layer whose output no float input or parameter reaches differentiably: a count of
    larger neighbours, or a detached source value; ``lin`` is declared and not read."""

    def __init__(self, how):
        super().__init__(node={"h": 3})
        self.how, self.lin = how, torch.nn.Linear(3, 3)

    def message(self, src, dst, edge):
        return (src.h > dst.h).float() if self.how == "compare" else src.h.detach()

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["compare", "detach"])
def test_ir_autodiff_of_a_layer_without_a_gradient_path_runs_as_torch_autodiff(how, backend):
    """No output needs a gradient: there is no backward to build (it had no outputs, and the
    verifier refused it at the first call)."""
    g = GRAPHS["multi_edges"]
    h = torch.randn(g.num_src, 3, requires_grad=True)
    outs = [_NoGradientPath(how).set_backend(backend).set_autodiff(mode)(g, h)
            for mode in ("torch", "ir")]
    assert outs[1].grad_fn is None and outs[0].grad_fn is None
    assert torch.equal(outs[0], outs[1])


# --- a select in the forward ------------------------------------------------------------

def test_where_pos_sends_the_cotangent_to_the_operand_each_row_took():
    """``where_pos(c, a, b)`` (the DGL front end masks a reduce UDF's result with it): the
    cotangent reaches ``a`` where c > 0 and ``b`` elsewhere, with ``c`` [N, 1] and a
    parameter ``b`` broadcast; an inf in the operand not taken never reaches the output."""
    g = sarc.Graph.from_edges(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3]), 5)
    b = Builder("select")
    x = b.leaf(Op.INPUT, "x", TensorType(Domain.DST, DType.F64, (3,)))
    c = b.leaf(Op.INPUT, "c", TensorType(Domain.DST, DType.F64, (1,)))
    d = b.leaf(Op.INPUT, "d", TensorType(Domain.DST, DType.F64, (3,)))
    w = b.leaf(Op.PARAM, "w", TensorType(Domain.PARAM, DType.F64, (3,)))
    a = b.add(Op.TANH, [b.add(Op.MUL, [x, w])])
    other = b.add(Op.ADD, [b.add(Op.NEG, [x]), w])
    y = b.add(Op.WHERE_POS, [c, a, other])
    scalar = TensorType(Domain.PARAM, DType.F64, ())
    z = b.add(Op.WHERE_POS, [c, b.add(Op.DIV, [b.const(1.0, scalar), d]), b.const(0.0, scalar)])
    fn = verify(b.finish([("y", y), ("z", z)]))
    cs = torch.tensor([[1.0], [-1.0], [0.0], [2.0], [-0.5]], dtype=torch.float64)
    ds = torch.rand(5, 3, dtype=torch.float64) + 0.5
    ds[cs[:, 0] <= 0] = 0.0  # 1 / d is inf on the rows where z takes 0
    inputs = {"x": torch.randn(5, 3, dtype=torch.float64, requires_grad=True), "c": cs, "d": ds}
    params = {"w": torch.randn(3, dtype=torch.float64, requires_grad=True)}
    out = interpreter.run(fn, g, inputs, params, training=False, seed=0)
    taken = cs[:, 0] > 0
    assert torch.equal(out["z"][~taken], torch.zeros(3, 3, dtype=torch.float64))
    assert torch.equal(out["z"][taken], 1.0 / ds[taken])
    cot = {k: torch.randn(5, 3, dtype=torch.float64) for k in out}
    want = torch.autograd.grad((out["y"] * cot["y"]).sum(), [inputs["x"], params["w"]])
    with torch.no_grad():
        pg, ig = interpreter.run_backward(grad(fn, wrt_inputs=["x"]), g, inputs, params, cot,
                                          training=False, seed=0)
    assert_close(ig["x"], want[0], 1e-12, "grad of x")
    assert_close(pg["w"], want[1], 1e-12, "grad of w")


class _ReadByAComparison(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3})
        self.lin, self.root = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
        self.thr = torch.nn.Parameter(torch.zeros(3))
        self.det = torch.nn.Parameter(torch.ones(3))

    def message(self, src, dst, edge):
        return self.lin(src.h) * (src.h > self.thr).float() + self.det.detach()

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + self.root(dst.h)


class _FeaturesReadFourWays(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 3}, edge={"w": 2, "d": 2, "e": 2})
        self.lin = torch.nn.Linear(3, 2)

    def message(self, src, dst, edge):
        return self.lin(src.h) * edge.w * (edge.d > 0).float() + edge.e.detach()

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_differentiated_features_are_those_torch_gives_a_gradient():
    """The features a distributed step gives a zero (an edge feature's: empty) gradient
    where no piece of a block ran: those the layer's kernel gives one on one process."""
    from sarc.ir.autodiff import differentiated_leaves
    layer = _FeaturesReadFourWays()
    assert differentiated_leaves(layer.trace()) == ({"lin.weight", "lin.bias"}, {"h", "w"})
    for edges in (0, 2):
        g = sarc.Graph.from_edges(torch.tensor([0, 1][:edges], dtype=torch.long),
                                  torch.tensor([1, 0][:edges], dtype=torch.long), 2)
        feats = {"h": torch.randn(2, 3, requires_grad=True),
                 **{k: torch.randn(edges, 2, requires_grad=True) for k in "wde"}}
        layer(g, **feats).sum().backward()
        assert {k for k, t in feats.items() if t.grad is not None} == {"h", "w"}


def test_differentiated_params_are_those_torch_gives_a_gradient():
    """What a distributed step gives a zero gradient where no piece of a block ran (a block
    without edges): the params the layer's kernel gives one on one process, on any graph."""
    from sarc.ir.autodiff import differentiated_params
    layer = _ReadByAComparison()
    want = {"lin.weight", "lin.bias", "root.weight", "root.bias"}
    assert differentiated_params(layer.trace()) == want
    for edges in (0, 2):
        g = sarc.Graph.from_edges(torch.tensor([0, 1][:edges], dtype=torch.long),
                                  torch.tensor([1, 0][:edges], dtype=torch.long), 2)
        layer.zero_grad(set_to_none=True)
        layer(g, torch.randn(2, 3)).sum().backward()
        assert {n for n, p in layer.named_parameters() if p.grad is not None} == want
