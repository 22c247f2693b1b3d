"""The torch backend's ops that write no more memory than their results: the contraction
``K.contract`` ((a * b).sum without the product), the add written over its operand
(``K.add_``), and the softmax product over recomputed scores whose only edge tensor is
the weights. Each against its plain definition (values and gradients); what each keeps
or writes, from autograd's saved tensors and the profiler's allocations."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sarc
from sarc.backends import torch_ops as K
from sarc.compiler import compile_layer
from sarc.backends.torch_backend import softmax_folds
from sarc.ir.patterns import contractions, dst_rows_of_src, inplace_adds
from sarc.native import kernels as native

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
from gat import GATLayer  # noqa: E402


@pytest.fixture(params=["kernels", "torch"])
def cpu_kernels(request, monkeypatch):
    """With sarc's CPU kernels and with torch's products."""
    monkeypatch.setenv("SARC_CPU_KERNELS", "1" if request.param == "kernels" else "0")
    return request.param


def _graph(seed: int = 0) -> sarc.Graph:
    """Repeated pairs, a hub, nodes without in-edges."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.randint(0, 30, (150,), generator=gen), torch.arange(30)])
    dst = torch.cat([torch.randint(0, 26, (150,), generator=gen), torch.full((30,), 5)])
    return sarc.Graph.from_edges(src, dst, 30)


# --- contract ------------------------------------------------------------------------------

@st.composite
def _factors(draw):
    """Two broadcastable shapes of 1-3 axes (a size 1 where the other is larger), an axis."""
    nd = draw(st.integers(1, 3))
    full = [draw(st.integers(1, 9)) for _ in range(nd)]
    shapes = []
    for _ in range(2):
        keep = draw(st.integers(0, nd))  # the leading axes dropped
        shapes.append(tuple(d if draw(st.booleans()) else 1 for d in full[nd - keep:]))
    dim = draw(st.integers(-nd, nd - 1))
    return shapes[0], shapes[1], dim


@settings(max_examples=80, deadline=None)
@given(_factors(), st.sampled_from([torch.float32, torch.float64]), st.integers(1, 40))
def test_contract_is_the_sum_of_the_product(factors, dtype, block):
    """Values and both gradients, row blocks of ``block`` elements, against (a * b).sum."""
    sa, sb, dim = factors
    shape = torch.broadcast_shapes(sa, sb)
    assume(-len(shape) <= dim < len(shape))
    old, K.ROW_BLOCK_ELEMS = K.ROW_BLOCK_ELEMS, block
    try:
        gen = torch.Generator().manual_seed(len(sa) * 7 + sum(sb))
        a = torch.randn(sa, generator=gen, dtype=dtype, requires_grad=True)
        b = torch.randn(sb, generator=gen, dtype=dtype, requires_grad=True)
        got, want = K.contract(a, b, dim), (a * b).sum(dim)
        torch.testing.assert_close(got, want)
        for ct in (torch.randn(want.shape, generator=gen, dtype=dtype),
                   torch.ones((), dtype=dtype).expand(want.shape)):  # as a sum's gradient
            for p, q in zip(torch.autograd.grad(got, (a, b), ct, retain_graph=True),
                            torch.autograd.grad(want, (a, b), ct, retain_graph=True)):
                torch.testing.assert_close(p, q)
                assert p.shape == q.shape
    finally:
        K.ROW_BLOCK_ELEMS = old


def test_contract_never_writes_the_product():
    """Forward and backward of z [N, H, D] with a vector per head: no allocation of z's
    size but z's gradient."""
    z = torch.randn(20000, 4, 32, requires_grad=True)
    att = torch.randn(1, 4, 32, requires_grad=True)
    sizes = _allocations(lambda: K.contract(z, att, 2).sum().backward())
    assert sorted(s for s in sizes if s >= z.numel() * 4) == [z.numel() * 4]


def _allocations(run) -> list[int]:
    """The sizes (bytes) of the CPU allocations ``run()`` makes."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return [e.nbytes() for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.nbytes() > 0]


# --- add_ ------------------------------------------------------------------------------

def test_an_add_over_a_products_result_writes_over_it():
    """The result of a sparse product (its backward reads no result), reshaped: the add
    is written over it, and the gradients are the out-of-place add's."""
    g = _graph()
    x = torch.randn(30, 2, 3, requires_grad=True)
    bias = torch.randn(6, requires_grad=True)
    y = K.spmm("sum", g, x)
    flat = y.reshape(30, 6)
    out = K.add_(flat, bias)
    assert out.data_ptr() == y.data_ptr()
    want = K.spmm("sum", g, x).reshape(30, 6) + bias
    torch.testing.assert_close(out, want)
    ct = torch.randn(30, 6)
    for p, q in zip(torch.autograd.grad(out, (x, bias), ct),
                    torch.autograd.grad(want, (x, bias), ct)):
        torch.testing.assert_close(p, q)


@pytest.mark.parametrize("case", ["saved-result", "leaf", "broadcast-operand", "wider-dtype",
                                  "internal-view"])
def test_an_add_whose_operand_autograd_needs_is_a_new_tensor(case):
    """Where writing over the operand could change a gradient (exp keeps its result; a
    leaf; a Function's output that is a view of its own memory) or cannot hold the sum
    (it broadcasts, or its dtype is narrower): a + b, the operand untouched."""
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    a = {"saved-result": lambda: x.exp(), "leaf": lambda: x,
         "broadcast-operand": lambda: (x * 2)[:1], "wider-dtype": lambda: (x * 2).float(),
         "internal-view": lambda: _ViewOfItsOwn.apply(x)}[case]()
    before = a.detach().clone()
    out = K.add_(a, b)
    assert torch.equal(a.detach(), before) and out.data_ptr() != a.data_ptr()
    torch.testing.assert_close(out, a + b)
    # the gradient through a still is a's (exp's backward reads its intact result)
    (gx,) = torch.autograd.grad(out.sum(), x, retain_graph=True)
    (wx,) = torch.autograd.grad((a + b).sum(), x)
    torch.testing.assert_close(gx, wx)


class _ViewOfItsOwn(torch.autograd.Function):
    """A Function whose output is a reshape of a tensor it made (autograd sees no view)."""

    @staticmethod
    def forward(ctx, x):
        return (x * 3).reshape(x.shape)

    @staticmethod
    def backward(ctx, dy):
        return dy * 3


# --- the softmax product over recomputed scores -----------------------------------------------

def _score(gb, a0, a1, a2, a3):
    assert a2 is None  # the value is not gathered per edge
    s = a0 + a1 if a3 is None else a0 + a1 + a3
    return torch.nn.functional.leaky_relu(s, 0.2)


def _softmax_product(g, a, b, z, w=None):
    """The definition: per destination, the softmax of its edges' scores weighs z[src]."""
    s = _score(None, a[g.src], b[g.dst], None, w)
    heads = s.shape[1]
    want = torch.zeros(g.num_dst, heads, z.shape[2], dtype=z.dtype)
    for v in range(g.num_dst):
        into = g.dst == v
        if into.any():
            want[v] = (torch.softmax(s[into], 0).unsqueeze(-1) * z[g.src[into]]).sum(0)
    return want


@pytest.mark.parametrize("span", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_recomputed_softmax_product_is_its_definition(span, dtype, cpu_kernels, monkeypatch):
    """Values and the gradients of the score's operands (src, dst, edge) and the value,
    with the scores in spans of ``span`` elements; a second backward of the same graph
    (retain_graph: the first wrote over the weights) gives the same gradients."""
    if span is not None:
        monkeypatch.setattr(K, "SPAN_ELEMS", span)
    g = _graph(1)
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randn(30, 3, generator=gen, dtype=dtype, requires_grad=True) for _ in range(2))
    w = torch.randn(g.num_edges, 3, generator=gen, dtype=dtype, requires_grad=True)
    z = torch.randn(30, 3, 4, generator=gen, dtype=dtype, requires_grad=True)
    got = K.softmax_spmm(_score, ("src", "dst", "src", "edge"), 2, (0, 1, 3), 3, g, a, b, z, w)
    assert type(got.grad_fn).__name__ == "_RecomputedSoftmaxProductBackward"
    want = _softmax_product(g, a, b, z, w)
    torch.testing.assert_close(got, want)
    ct = torch.randn(want.shape, generator=gen, dtype=dtype)
    wanted = torch.autograd.grad(want, (a, b, z, w), ct)
    for _ in range(2):
        for p, q in zip(torch.autograd.grad(got, (a, b, z, w), ct, retain_graph=True), wanted):
            torch.testing.assert_close(p, q)


def test_scores_that_are_an_edge_operand_are_not_written_over(cpu_kernels):
    """A region that returns its edge operand as it is: the softmax is taken of a copy."""
    g = _graph(3)
    s = torch.randn(g.num_edges, 2, requires_grad=True)
    z = torch.randn(30, 2, 5, requires_grad=True)
    before = s.detach().clone()
    got = K.softmax_spmm(lambda gb, a0, a1: a0, ("edge", "src"), 1, (0,), 2, g, s, z)
    assert torch.equal(s.detach(), before)
    alpha = K.edge_softmax(before, g)
    torch.testing.assert_close(got, K.spmm("sum", g, z.detach(), alpha))


@pytest.mark.skipif(native.kernels() is None, reason="no C compiler builds the CPU kernels here")
def test_gat_keeps_no_edge_tensor_but_its_weights(monkeypatch):
    """GAT's layer on the torch backend: its forward keeps one [E, H] tensor (the
    weights, over which backward writes the scores' gradient), and neither pass writes
    another [E, H] tensor whole (the scores' region runs in spans)."""
    monkeypatch.setattr(K, "SPAN_ELEMS", 1 << 14)
    g = sarc.Graph.from_edges(*torch.randint(0, 3000, (2, 60000), generator=torch.Generator()
                                             .manual_seed(0)), 3000)
    layer = GATLayer(16, 8, heads=4).set_backend("torch")
    x = torch.randn(3000, 16, requires_grad=True)
    edge_bytes = g.num_edges * 4 * 4
    sizes = _allocations(lambda: layer(g, h=x).sum().backward())
    assert sum(s >= edge_bytes for s in sizes) == 1, sorted(sizes)[-6:]


def test_gats_code_folds_its_logits_into_the_attention_and_adds_in_place():
    """The attention logits (z * att).sum(-1) are the attention's folds (computed from z
    and att inside it), the bias add is written over the product: one matmul, one
    attention, one add, no multiply."""
    source = compile_layer(GATLayer(5, 3, heads=2)).kernel.source
    code = [line.strip() for line in source.splitlines() if not line.strip().startswith("#")]
    (attention,) = [line for line in code if "K.softmax_spmm(" in line]
    assert attention.endswith("folds=((0, 2), (1, 2)))"), attention
    assert not any("K.contract(" in line or " * " in line for line in code), code
    assert sum("K.add_(" in line for line in code) == 1, code


@pytest.mark.parametrize("span", [None, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_attention_with_folded_logits_is_its_definition(span, dtype, cpu_kernels, monkeypatch):
    """``folds``: operands 0 and 1 given as their factors, the operands being (z * p).sum
    over z's rows (src) and its dst rows; values and the gradients of z and both factors,
    twice (retain_graph), against the same attention of the contractions written out."""
    if span is not None:
        monkeypatch.setattr(K, "SPAN_ELEMS", span)
    g = sarc.Graph.from_edges(torch.randint(0, 30, (200,), generator=torch.Generator().manual_seed(5)),
                              torch.randint(0, 20, (200,), generator=torch.Generator().manual_seed(6)),
                              num_src=30, num_dst=20)
    gen = torch.Generator().manual_seed(7)
    z = torch.randn(30, 3, 4, generator=gen, dtype=dtype, requires_grad=True)
    p_src, p_dst = (torch.randn(1, 3, 4, generator=gen, dtype=dtype, requires_grad=True)
                    for _ in range(2))
    sides = ("src", "dst", "src", "edge")
    got = K.softmax_spmm(_score, sides, 2, (0, 1), 3, g, p_src, p_dst, z, None,
                         folds=((0, 2), (1, 2)))
    assert type(got.grad_fn).__name__ == "_RecomputedSoftmaxProductBackward"
    want = K.softmax_spmm(_score, sides, 2, (0, 1), 3, g, (z * p_src).sum(2),
                          (z[:20] * p_dst).sum(2), z, None)
    torch.testing.assert_close(got, want)
    ct = torch.randn(want.shape, generator=gen, dtype=dtype)
    wanted = torch.autograd.grad(want, (z, p_src, p_dst), ct)
    for _ in range(2):
        for a, b in zip(torch.autograd.grad(got, (z, p_src, p_dst), ct, retain_graph=True), wanted):
            torch.testing.assert_close(a, b)
    with torch.no_grad():  # no autograd: the contractions computed, then the attention
        torch.testing.assert_close(K.softmax_spmm(_score, sides, 2, (0, 1), 3, g, p_src, p_dst,
                                                  z, None, folds=((0, 2), (1, 2))), want)


class _SelfTerm(sarc.Layer):
    """lin(src.h) + 1 summed, plus lin(dst.h): the dst linear is the src one's rows."""

    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = torch.nn.Linear(4, 4)

    def message(self, src, dst, edge):
        return {"m": self.lin(src.h) + 1.0}

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + self.lin(dst.h)


def test_no_add_is_written_over_a_value_whose_rows_a_dst_value_reads():
    """lin(src.h) is read by a dst value as its rows (a view of its memory): its add of 1
    is a new tensor; the update's add is written over the product. Against the
    interpreter."""
    layer = _SelfTerm()
    code = [line.strip() for line in compile_layer(layer).kernel.source.splitlines()
            if not line.strip().startswith("#")]
    (rows,) = [line for line in code if "K.dst_rows(" in line]
    source = rows.split("K.dst_rows(")[1].split(",")[0]
    assert not any(f"K.add_({source}," in line for line in code), code
    assert sum("K.add_(" in line for line in code) == 1, code
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from difftest import check_layer
    check_layer(layer, _graph(4), {"h": torch.randn(30, 4)})


def test_the_patterns_name_what_they_fold():
    """GAT's two logits are contractions of z (src) and of its dst rows with a param;
    its bias add is written over the product's reshape."""
    fn = compile_layer(GATLayer(5, 3, heads=2)).kernel.function
    twins = dst_rows_of_src(fn)
    contracted = contractions(fn)
    assert len(contracted) == 2
    ((i, fold),) = softmax_folds(fn, contracted, twins).items()
    assert sorted(fold) == [0, 1] and all(fn.values[p].op.name == "PARAM" for p, _ in fold.values())
    assert any(fn.values[j].op.name == "RESHAPE" for _, chain in inplace_adds(fn).values()
               for j in chain)
