"""An add of a linear's result, ``other + x @ W.t()``, runs as one ``torch.addmm``, an add
of a product, ``other + a * b``, as one ``torch.addcmul`` (``sarc.ir.patterns.
accumulating_adds``): the generated code, which adds fuse and which stay two ops, and the
values and gradients of both against the interpreter."""
from __future__ import annotations

import pytest
import torch
from difftest import assert_close, check_layer, one_torch_thread, random_block  # noqa: F401
from sage import SAGELayer
from zoo import LAYERS, features

import sarc
from sarc.backends import torch_backend
from sarc.compiler import compile_layer, optimize
from sarc.ir import interpreter
from sarc.ir.function import Builder
from sarc.ir.ops import Op
from sarc.ir.patterns import accumulating_adds
from sarc.ir.split import format_split, split_layer
from sarc.ir.types import Domain, DType, TensorType

G = random_block(torch.Generator().manual_seed(5), 9, 6, 30)  # more src than dst rows


def linear_accumulates(fn) -> dict[int, tuple[int, int]]:
    """The adds of a linear."""
    return accumulating_adds(fn, ops=(Op.LINEAR,))


def _code(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if not line.strip().startswith("#")]


def test_sage_adds_its_bias_and_self_term_in_the_gemms():
    """SAGE with the linear after the mean: ``lin_neigh(agg) + b + lin_self(h)`` is two
    addmm, no add and no matmul of its own."""
    code = _code(compile_layer(SAGELayer(4, 8)).kernel.source)
    assert sum("torch.addmm(" in line for line in code) == 2, code
    assert not any(" + " in line or "torch.matmul(" in line for line in code), code


FUSED_LAYERS = ["gin", "gin_train_eps", "hetero_sage", "rgcn", "rgcn_bases", "rgcn_nobias",
                "sage", "sage_lp"]


@pytest.mark.parametrize("d", [3, 7])   # sage: linear after (3) and before (7) the mean
@pytest.mark.parametrize("model", FUSED_LAYERS)
def test_fused_layers_match_the_interpreter(model, d):
    layer = LAYERS[model](d)
    assert linear_accumulates(optimize(layer.trace()))
    assert "torch.addmm(" in compile_layer(layer).kernel.source
    check_layer(layer, G, features(layer, G, d))


# --- built IR: what fuses and what does not -------------------------------------------------

def _t(domain: Domain, *feat: int) -> TensorType:
    return TensorType(domain, DType.F32, feat)


def _check(fn, inputs: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> list[str]:
    """Compiled ``fn`` == interpreted ``fn``, outputs and the gradients of every input and
    param; the generated code's lines."""
    kernel = torch_backend.compile(fn)
    runs = []
    for run in (lambda i, p: kernel(G, i, p, False),
                lambda i, p: interpreter.run(fn, G, i, p)):
        leaves = {k: t.clone().requires_grad_() for k, t in {**inputs, **params}.items()}
        out = run({k: leaves[k] for k in inputs}, {k: leaves[k] for k in params})
        torch.manual_seed(0)
        loss = sum((out[k] * torch.randn_like(out[k])).sum() for k in sorted(out))
        runs.append((out, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))))
    (out_c, grads_c), (out_r, grads_r) = runs
    for k in out_r:
        assert_close(out_c[k], out_r[k], what=f"output {k}")
    for k in grads_r:
        assert_close(grads_c[k], grads_r[k], what=f"grad of {k}")
    return _code(kernel.source)


def _h(b: Builder, domain: Domain = Domain.DST, *feat: int):
    return b.leaf(Op.INPUT, "h", _t(domain, *(feat or (4,))))


def _w(b: Builder, name: str, out: int, inp: int = 4):
    return b.leaf(Op.PARAM, name, _t(Domain.PARAM, out, inp))


def _feeds(*feat: int, **params: tuple[int, ...]):
    """Random ``h`` (feature shape ``feat``, default [4]) and params of the given shapes."""
    return ({"h": torch.randn(G.num_src, *(feat or (4,)))},
            {k: torch.randn(*shape) for k, shape in params.items()})


def test_bias_and_chain_fuse_both_operands_linear_fuses_the_second():
    b = Builder("Chain")
    h = _h(b)
    l0 = b.add(Op.LINEAR, [h, _w(b, "w0", 5)])
    s0 = b.add(Op.ADD, [l0, b.leaf(Op.PARAM, "bias", _t(Domain.PARAM, 5))])
    l1 = b.add(Op.LINEAR, [h, _w(b, "w1", 5)])
    s1 = b.add(Op.ADD, [s0, l1])
    l2 = b.add(Op.LINEAR, [h, _w(b, "w2", 5)])
    l3 = b.add(Op.LINEAR, [h, _w(b, "w3", 5)])
    s2 = b.add(Op.ADD, [l2, l3])
    fn = b.finish([("a", s1), ("b", s2)])
    assert linear_accumulates(fn) == {s0: (fn.values[s0].inputs[1], l0), s1: (s0, l1),
                                      s2: (l2, l3)}
    code = _check(fn, *_feeds(w0=(5, 4), bias=(5,), w1=(5, 4), w2=(5, 4), w3=(5, 4)))
    assert sum("torch.addmm(" in line for line in code) == 3
    assert sum("torch.matmul(" in line for line in code) == 1  # l2, the add's other operand
    assert not any(" + " in line for line in code)


def test_broadcast_other_operands_fuse():
    """A scalar constant, a [1, out] param and a [N, 1] node value broadcast in the GEMM."""
    b = Builder("Broadcast")
    h = _h(b)
    a = b.add(Op.ADD, [b.add(Op.LINEAR, [h, _w(b, "w0", 3)]), b.const(0.5, _t(Domain.PARAM))])
    c = b.add(Op.ADD, [b.leaf(Op.PARAM, "row", _t(Domain.PARAM, 1, 3)),
                       b.add(Op.LINEAR, [h, _w(b, "w1", 3)])])
    column = b.add(Op.ADD, [b.add(Op.LINEAR, [h, _w(b, "w2", 1)]),
                            b.add(Op.LINEAR, [h, _w(b, "w3", 1)])])
    e = b.add(Op.ADD, [column, b.add(Op.LINEAR, [h, _w(b, "w4", 3)])])
    fn = b.finish([("h", b.add(Op.MUL, [b.add(Op.MUL, [a, c]), e]))])
    assert len(linear_accumulates(fn)) == 4
    code = _check(fn, *_feeds(w0=(3, 4), row=(1, 3), w1=(3, 4), w2=(1, 4), w3=(1, 4),
                              w4=(3, 4)))
    assert sum("torch.addmm(" in line for line in code) == 4, code


def _not_fused(fn, feeds) -> None:
    assert linear_accumulates(fn) == {}
    code = _check(fn, *feeds)
    assert not any("torch.addmm(" in line for line in code), code


def test_a_linear_read_twice_is_not_fused():
    b = Builder("Twice")
    h = _h(b)
    lin = b.add(Op.LINEAR, [h, _w(b, "w", 4)])
    out = b.add(Op.MUL, [b.add(Op.ADD, [lin, h]), lin])
    _not_fused(b.finish([("h", out)]), _feeds(w=(4, 4)))


def test_a_linear_added_to_itself_is_not_fused():
    b = Builder("Double")
    lin = b.add(Op.LINEAR, [_h(b), _w(b, "w", 4)])
    _not_fused(b.finish([("h", b.add(Op.ADD, [lin, lin]))]), _feeds(w=(4, 4)))


def test_a_linear_that_is_an_output_is_not_fused():
    b = Builder("Output")
    h = _h(b)
    lin = b.add(Op.LINEAR, [h, _w(b, "w", 4)])
    fn = b.finish([("lin", lin), ("sum", b.add(Op.ADD, [lin, h]))])
    _not_fused(fn, _feeds(w=(4, 4)))


def test_a_linear_broadcast_by_the_add_is_not_fused():
    """[N, 1] + [N, 4]: the linear's side would have to broadcast."""
    b = Builder("Broadcasting")
    h = _h(b)
    _not_fused(b.finish([("h", b.add(Op.ADD, [b.add(Op.LINEAR, [h, _w(b, "w", 1)]), h]))]),
               _feeds(w=(1, 4)))


def test_a_linear_of_head_features_is_not_fused():
    """x [N, H, C] is no matrix: addmm would need it flattened."""
    b = Builder("Heads")
    lin = b.add(Op.LINEAR, [_h(b, Domain.DST, 2, 4), _w(b, "w", 3)])
    out = b.add(Op.ADD, [lin, b.leaf(Op.PARAM, "bias", _t(Domain.PARAM, 3))])
    _not_fused(b.finish([("h", out)]), _feeds(2, 4, w=(3, 4), bias=(3,)))


def test_a_linear_of_a_param_is_not_fused():
    b = Builder("ParamLinear")
    h = _h(b)
    table = b.add(Op.LINEAR, [b.leaf(Op.PARAM, "p", _t(Domain.PARAM, 4)), _w(b, "w", 4)])
    table = b.add(Op.ADD, [table, b.leaf(Op.PARAM, "bias", _t(Domain.PARAM, 4))])
    _not_fused(b.finish([("h", b.add(Op.MUL, [h, table]))]),
               _feeds(p=(4,), w=(4, 4), bias=(4,)))


# --- with dst values computed as the rows of src values (patterns.dst_rows_of_src) -------------

def _message_layer(b: Builder, w: int, bias: int | None = None) -> int:
    """sum over edges of ``lin(src.h) [+ bias]``: the src value dst values can be rows of."""
    z = b.add(Op.LINEAR, [_h(b, Domain.SRC), w])
    if bias is not None:
        z = b.add(Op.ADD, [z, bias])
    return b.add(Op.REDUCE, [b.add(Op.GATHER_SRC, [z])], {"kind": "sum"})


def test_a_linear_computed_as_rows_of_a_src_linear_is_not_recomputed():
    """agg + lin(dst.h), lin(dst.h) being lin(src.h)'s rows: no addmm, one matmul."""
    b = Builder("Twin")
    w = _w(b, "w", 4)
    agg = _message_layer(b, w)
    fn = b.finish([("h", b.add(Op.ADD, [agg, b.add(Op.LINEAR, [_h(b), w])]))])
    assert linear_accumulates(fn)
    code = _check(fn, *_feeds(w=(4, 4)))
    assert not any("torch.addmm(" in line for line in code), code
    assert sum("torch.matmul(" in line for line in code) == 1
    assert any("= K.dst_rows(v" in line for line in code), code


def test_an_add_computed_as_rows_of_a_fused_src_add():
    """lin(src.h) + b in the message and lin(dst.h) + b in the update: the src add is an
    addmm, the dst add its rows."""
    b = Builder("TwinAdd")
    w = _w(b, "w", 4)
    bias = b.leaf(Op.PARAM, "bias", _t(Domain.PARAM, 4))
    agg = _message_layer(b, w, bias)
    own = b.add(Op.ADD, [b.add(Op.LINEAR, [_h(b), w]), bias])
    fn = b.finish([("h", b.add(Op.MUL, [agg, own]))])
    code = _check(fn, *_feeds(w=(4, 4), bias=(4,)))
    assert sum("torch.addmm(" in line for line in code) == 1, code
    assert not any("torch.matmul(" in line for line in code), code
    assert any("= K.dst_rows(v" in line for line in code), code


class _DstFirst(sarc.Layer):
    """``q(dst.h) * q(src.h)``: the dst linear is written (and traced) first."""

    def __init__(self, d: int = 4):
        super().__init__(node={"h": d})
        self.q = torch.nn.Linear(d, 3)

    def message(self, src, dst, edge):
        return self.q(dst.h) * self.q(src.h)

    def reduce(self, msg):
        return sarc.sum(msg.m)


@pytest.mark.parametrize("model", ["edgeconv", "dst_first"])
def test_a_dst_linear_traced_before_its_src_twin_is_its_rows(model):
    """EdgeConv's ``theta(dst.h - src.h)`` is ``theta(dst.h) - theta(src.h)`` through the
    aggregate, the dst linear first; ``q(dst.h) * q(src.h)`` is written so. The src linear
    is computed first (``passes.twins_first``) and the dst one is its rows: one product
    with each weight, on one process and in the distributed split's dst part."""
    layer = LAYERS["edgeconv"](5) if model == "edgeconv" else _DstFirst()
    weight, products = ("theta.weight", 2) if model == "edgeconv" else ("q.weight", 1)
    c = compile_layer(layer)
    fn = c.optimized
    code = [line for line in c.kernel.source.splitlines() if not line.lstrip().startswith("#")]
    assert sum(any(f in line for f in ("torch.matmul(", "torch.addmm(", "F.linear("))
               for line in code) == products, "\n".join(code)
    assert any("= K.dst_rows(v" in line for line in code)

    def reads_weight(f, v):
        return v.op is Op.LINEAR and f.values[v.inputs[1]].attr.get("name") == weight
    (src_linear,) = [i for i, v in enumerate(fn.values)
                     if reads_weight(fn, v) and v.type.domain is Domain.SRC]
    split = split_layer(fn, [src_linear])
    assert split.dst_pre is None or not any(reads_weight(split.dst_pre, v)
                                            for v in split.dst_pre.values), format_split(split)
    g = random_block(torch.Generator().manual_seed(3), 9, 6, 30)
    check_layer(layer, g, features(layer, g, 5) if model == "edgeconv"
                else {"h": torch.randn(g.num_src, 4)})


# --- adds of a product: torch.addcmul ---------------------------------------------------------

def test_gcn_scales_in_its_product_not_in_an_addcmul():
    """GCN's ``agg * in_degree^-1/2 + bias`` could be one addcmul, but the scale is the
    sparse product's (``patterns.scaled_products``: no pass over the nodes in backward
    either): the add stays an add; values and gradients as the interpreter's."""
    layer = LAYERS["gcn"](5)
    fn = optimize(layer.trace())
    assert any(fn.values[added].op is Op.MUL for _, added in accumulating_adds(fn).values())
    source = compile_layer(layer).kernel.source
    assert "torch.addcmul(" not in source and "dst_scale=" in source, source
    check_layer(layer, G, features(layer, G, 5))


def test_products_fuse_after_linears_and_only_as_themselves():
    """``lin + a * b`` fuses the linear; ``a * b + c`` the product; a product read twice,
    one that is an output and one the add broadcasts stay a mul and an add."""
    b = Builder("Products")
    h = _h(b)
    scale = b.leaf(Op.PARAM, "scale", _t(Domain.PARAM, 4))
    lin = b.add(Op.LINEAR, [h, _w(b, "w", 4)])
    both = b.add(Op.ADD, [lin, b.add(Op.MUL, [h, scale])])           # the linear fuses
    prod = b.add(Op.ADD, [b.add(Op.MUL, [both, h]), scale])          # the product fuses
    twice = b.add(Op.MUL, [prod, scale])
    reread = b.add(Op.ADD, [twice, twice])                           # read twice: no
    column = b.add(Op.MUL, [b.add(Op.LINEAR, [h, _w(b, "w1", 1)]), b.const(2.0, _t(Domain.PARAM))])
    broadcast = b.add(Op.ADD, [column, reread])                      # [N, 1] + [N, 4]: no
    out = b.add(Op.MUL, [h, scale])
    fn = b.finish([("h", broadcast), ("out", out), ("sum", b.add(Op.ADD, [out, h]))])
    fused = accumulating_adds(fn)
    assert {i: fn.values[added].op for i, (_, added) in fused.items()} == {
        both: Op.LINEAR, prod: Op.MUL}, fused
    code = _check(fn, *_feeds(scale=(4,), w=(4, 4), w1=(1, 4)))
    assert sum("torch.addcmul(" in line for line in code) == 1, code
    assert sum("torch.addmm(" in line for line in code) == 1, code
