"""The PyTorch backend's graph kernels against their plain definitions (values and grads)."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

import sarc
from sarc.backends import torch_ops as K
from sarc.native import kernels as cpu_kernels
from difftest import check_layer


def _graph(n: int, e: int, seed: int = 0) -> sarc.Graph:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, max(1, n - 2), (e,), generator=gen)  # the last rows get no edges
    return sarc.Graph.from_edges(src, dst, n)


@pytest.mark.parametrize("n,e,types", [(40, 400, 3), (40, 60, 9), (5, 0, 2)],
                         ids=["per-node-table", "per-edge", "no-edges"])
@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_typed_spmm_equals_its_definition(n, e, types, kind, weighted):
    """Both strategies (node x type table, per-edge) equal sum_e w_e x_u W_{t_e}."""
    g = _graph(n, e)
    x = torch.randn(n, 5, requires_grad=True)
    table = torch.randn(types, 5, 3, requires_grad=True)
    t = torch.randint(0, types, (g.num_edges,))
    w = torch.rand(g.num_edges, requires_grad=True) if weighted else None
    got = K.typed_spmm(kind, g, x, table, t, w)
    rows = torch.bmm(x[g.src].unsqueeze(1), table[t]).squeeze(1)
    if w is not None:
        rows = rows * w.unsqueeze(-1)
    want = torch.zeros(n, 3).index_add(0, g.dst, rows)
    if kind == "mean":
        want = want / torch.bincount(g.dst, minlength=n).clamp(min=1).unsqueeze(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ct = torch.randn_like(want)
    wrt = [x, table] + ([w] if w is not None else [])
    for a, b in zip(torch.autograd.grad((got * ct).sum(), wrt),
                    torch.autograd.grad((want * ct).sum(), wrt)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_typed_spmm_rejects_out_of_range_types():
    g = _graph(4, 6)
    with pytest.raises(ValueError, match="type id out of range"):
        K.typed_spmm("sum", g, torch.randn(4, 2), torch.randn(2, 2, 2), torch.full((6,), 2))


@pytest.mark.parametrize("side", ["src", "edge"])
def test_weighted_spmm_with_multi_edges(side):
    """Duplicate (dst, src) pairs add up; the weight gradient is per edge, not per pair."""
    g = sarc.Graph.from_edges(torch.tensor([0, 0, 1, 1, 2]), torch.tensor([1, 1, 0, 2, 2]), 3)
    rows = g.num_src if side == "src" else g.num_edges
    x = torch.randn(rows, 4, requires_grad=True)
    w = torch.rand(g.num_edges, requires_grad=True)
    got = K.spmm("sum", g, x, w, side)
    xe = x[g.src] if side == "src" else x
    want = torch.zeros(3, 4).index_add(0, g.dst, xe * w.unsqueeze(-1))
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), [x, w]), torch.autograd.grad(want.sum(), [x, w])):
        torch.testing.assert_close(a, b)


def _multi_graph() -> sarc.Graph:
    """Repeated (src, dst) pairs, self loops, a node without in-edges (3) and one without
    out-edges (4): every case the cached transposed index and the SDDMM's distinct pairs meet."""
    src = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3, 0, 1])
    dst = torch.tensor([1, 1, 1, 2, 2, 2, 0, 0, 4, 4])
    return sarc.Graph.from_edges(src, dst, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("side", ["src", "edge"])
@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_spmm_with_a_weight_per_head(kind, side, dtype):
    """w [E, H] weighs x's heads [rows, H, D]: values and gradients equal the definition."""
    g = _multi_graph()
    rows = g.num_src if side == "src" else g.num_edges
    x = torch.randn(rows, 3, 4, dtype=dtype, requires_grad=True)
    w = torch.rand(g.num_edges, 3, dtype=dtype, requires_grad=True)
    got = K.spmm(kind, g, x, w, side)
    xe = x[g.src] if side == "src" else x
    want = torch.zeros(5, 3, 4, dtype=dtype).index_add(0, g.dst, xe * w.unsqueeze(-1))
    if kind == "mean":
        want = want / torch.bincount(g.dst, minlength=5).clamp(min=1).view(-1, 1, 1)
    torch.testing.assert_close(got, want)
    ct = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((got * ct).sum(), [x, w]),
                    torch.autograd.grad((want * ct).sum(), [x, w])):
        torch.testing.assert_close(a, b)


def test_a_graphs_layout_is_made_once_and_transposes_it():
    g = _multi_graph()
    lay = K.layout(g)
    assert K.layout(g) is lay
    ptr, rows, order = lay.transposed()
    assert torch.equal(g.src[order], torch.sort(g.src, stable=True).values)
    assert torch.equal(rows.long(), g.dst[order])
    assert torch.equal(ptr.long()[1:] - ptr.long()[:-1], torch.bincount(g.src, minlength=5))


@pytest.mark.parametrize("block", [None, 3])
@pytest.mark.parametrize("heads", [1, 2])
def test_softmax_spmm_equals_its_definition(heads, block, monkeypatch):
    """softmax over each destination's edges of s = a[src] + b[dst], weighing z[src]: values and
    gradients of a, b and z (multi-edges: each edge its own weight; node 3: no in-edges).
    ``block``: the score region's edge values a few at a time, recomputed in backward."""
    if block is not None:
        monkeypatch.setattr(K, "SPAN_ELEMS", block)
    g = _multi_graph()
    a = torch.randn(5, heads, requires_grad=True)
    b = torch.randn(5, heads, requires_grad=True)
    z = torch.randn(5, heads, 4, requires_grad=True)

    def score(gb, a0, a1, a2):
        assert a2 is None  # the score does not read z: z is not gathered per edge
        return a0 + a1
    got = K.softmax_spmm(score, ("src", "dst", "src"), 2, (0, 1), heads, g, a, b, z)
    s = a[g.src] + b[g.dst]
    want = torch.zeros(5, heads, 4)
    for v in range(5):
        into = g.dst == v
        if into.any():
            alpha = torch.softmax(s[into], 0)
            want[v] = (alpha.unsqueeze(-1) * z[g.src[into]]).sum(0)
    torch.testing.assert_close(got, want)
    ct = torch.randn_like(want)
    for p, q in zip(torch.autograd.grad((got * ct).sum(), [a, b, z]),
                    torch.autograd.grad((want * ct).sum(), [a, b, z])):
        torch.testing.assert_close(p, q)


class _SelfLinear(sarc.Layer):
    """sum of lin(src.h) plus lin(dst.h): the dst linear is lin(src.h)[:num_dst]."""

    def __init__(self):
        super().__init__(node={"h": 5})
        self.lin = torch.nn.Linear(5, 3, bias=False)

    def message(self, src, dst, edge):
        return {"m": self.lin(src.h)}

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg * self.lin(dst.h)


def test_a_dst_value_computed_like_a_src_value_is_its_rows():
    """lin(dst.h) is lin(src.h)[:num_dst]: the generated code computes the linear once and
    reads its rows (GAT's, too: its attention reads them, ``softmax_folds``)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
    from gat import GATLayer

    from sarc.compiler import compile_layer
    for layer, rows_read in ((_SelfLinear(), True), (GATLayer(5, 3, heads=2), False)):
        source = compile_layer(layer).kernel.source
        code = [line.strip() for line in source.splitlines() if not line.strip().startswith("#")]
        assert sum("torch.matmul(" in line for line in code) == 1, code
        assert any(line.startswith("v") and "= K.dst_rows(v" in line for line in code) == rows_read, code


class _SourcePool(sarc.Layer):
    """GraphSAGE-pool's aggregate: max (min) of relu(lin(h_u)), node work the passes push
    ahead of the gather, so the aggregate selects from a source feature as it is."""

    def __init__(self, kind: str, feat: bool = True):
        super().__init__(node={"h": 5})
        self.kind, self.feat = kind, feat
        self.lin = torch.nn.Linear(5, 3)

    def message(self, src, dst, edge):
        return {"m": torch.relu(self.lin(src.h)) if self.feat else self.lin(src.h) * dst.h[:, :3]}

    def reduce(self, msg):
        return sarc.max(msg.m) if self.kind == "max" else sarc.min(msg.m)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_the_extremum_of_a_source_feature_is_a_csr_extremum(kind):
    """Such an aggregate is ``K.extremum_spmm`` (no edge tensor); one whose message is a
    product with the destination's value stays a fused aggregate."""
    from sarc.compiler import compile_layer
    for feat, product in ((True, True), (False, False)):
        source = compile_layer(_SourcePool(kind, feat)).kernel.source
        code = [line.strip() for line in source.splitlines() if not line.strip().startswith("#")]
        assert any(f'K.extremum_spmm("{kind}", g, v' in line for line in code) == product, code
        assert any(f'K.aggregate("{kind}"' in line for line in code) != product, code


class _GaussianWeighted(sarc.Layer):
    """GMMConv's message: a source feature per kernel, ``[E, K, D]``, weighed by a Gaussian
    of the edge's pseudo-coordinates per kernel, ``[E, K, 1]``, computed from the edge
    feature and parameters alone."""

    def __init__(self, kind: str):
        super().__init__(node={"h": 4}, edge={"u": 2})
        self.kind = kind
        self.lin = torch.nn.Linear(4, 3 * 5, bias=False)
        self.mu = torch.nn.Parameter(torch.randn(3, 2))
        self.inv_sigma = torch.nn.Parameter(torch.rand(3, 2) + 0.5)

    def message(self, src, dst, edge):
        z = self.lin(src.h).view(-1, 3, 5)
        d = (edge.u.view(-1, 1, 2) - self.mu) * self.inv_sigma
        return {"m": z * torch.exp(-0.5 * (d * d).sum(-1, keepdim=True))}

    def reduce(self, msg):
        return sarc.sum(msg.m) if self.kind == "sum" else sarc.mean(msg.m)


@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_a_weight_per_edge_and_head_computed_from_edge_features_is_a_weighted_product(kind):
    """The weight is an edge tensor of its own (E x K), the aggregate a sparse product
    weighted per edge and head (no E x K x D message); values and gradients equal the
    interpreter's."""
    from sarc.compiler import compile_layer
    layer = _GaussianWeighted(kind)
    code = compile_layer(layer).kernel.source
    assert f'K.spmm("{kind}", g, v' in code and "K.aggregate(" not in code, code
    gen = torch.Generator().manual_seed(0)
    g = _multi_graph()
    check_layer(layer, g, {"h": torch.randn(5, 4, generator=gen),
                           "u": torch.randn(g.num_edges, 2, generator=gen)})


class _DotAttention(sarc.Layer):
    """A transformer's attention: the score per head is ``<q_v, k_u>`` scaled by a constant
    (``scale``: "div", "mul" or None), the value ``v_u``; ``heads`` 0 is one head of
    features [D] (no heads axis)."""

    def __init__(self, heads: int, scale):
        super().__init__(node={"h": 6})
        self.heads, self.scale = heads, scale
        width = 4 * max(heads, 1)
        self.q, self.k, self.v = (torch.nn.Linear(6, width) for _ in range(3))

    def _split(self, x):
        return x.view(-1, self.heads, 4) if self.heads else x

    def message(self, src, dst, edge):
        s = (self._split(self.q(dst.h)) * self._split(self.k(src.h))).sum(-1)
        s = s / 2.0 if self.scale == "div" else 0.5 * s if self.scale == "mul" else s
        return {"s": s, "v": self._split(self.v(src.h))}

    def reduce(self, msg):
        a = sarc.edge_softmax(msg.s)
        return sarc.sum(msg.v * a.unsqueeze(-1))


@pytest.mark.parametrize("heads, scale", [(3, "div"), (2, "mul"), (0, None)])
def test_a_dot_product_score_is_one_sddmm_of_the_rows(heads, scale):
    """The attention's scores are the SDDMM of the two ends' rows (``K.softmax_dot_spmm``, no
    gathered row); values and gradients equal the interpreter's on multi-edges and a node
    without in-edges."""
    from sarc.compiler import compile_layer
    layer = _DotAttention(heads, scale)
    code = compile_layer(layer).kernel.source
    assert "K.softmax_dot_spmm(" in code, code
    gen = torch.Generator().manual_seed(1)
    check_layer(layer, _multi_graph(), {"h": torch.randn(5, 6, generator=gen)})


class _LiftedPool(sarc.Layer):
    """A max / min of one source feature plus or minus the destination's own values and a
    parameter: ``form`` picks how the message writes it (the feature subtracted, negated,
    added last)."""

    def __init__(self, kind: str, form: int):
        super().__init__(node={"a": 3, "b": 3})
        self.kind, self.form = kind, form
        self.bias = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))

    def message(self, src, dst, edge):
        return {"m": (dst.a - src.b + self.bias, -src.b + torch.relu(dst.a) * 2.0,
                      dst.a - (src.b - self.bias * dst.b), (dst.b + src.a) - dst.a)[self.form]}

    def reduce(self, msg):
        return sarc.max(msg.m) if self.kind == "max" else sarc.min(msg.m)


@pytest.mark.parametrize("form", range(4))
@pytest.mark.parametrize("kind", ["max", "min"])
def test_an_extremum_of_a_source_feature_and_destination_terms_is_lifted(kind, form):
    """The message at the source feature's extremum (of the opposite kind where it is
    subtracted), once per destination: no edge tensor; values and gradients equal the
    interpreter's on multi-edges, ties (small integers) and a node without in-edges."""
    from sarc.compiler import compile_layer
    layer = _LiftedPool(kind, form)
    code = compile_layer(layer).kernel.source
    # subtracted in the message (forms 0, 2); negated alone, -b is computed per node (1)
    flipped = {"max": "min", "min": "max"}[kind] if form in (0, 2) else kind
    assert f'"{flipped}", g, v' in code and f"K.extremum_lifted(\"{kind}\"" in code, code
    assert "K.aggregate(" not in code, code
    gen = torch.Generator().manual_seed(form)
    feats = {k: torch.randint(-2, 3, (5, 3), generator=gen).float() for k in ("a", "b")}
    check_layer(layer, _multi_graph(), feats)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremum_spmm_splits_ties_evenly(kind, dtype):
    """max / min of x[src] on a graph with multi-edges and a node without in-edges: values
    and the gradient, tied edges (repeated ones too) sharing it evenly, as ``torch.amax``."""
    g = _multi_graph()
    x = torch.randint(-1, 2, (5, 3)).to(dtype).requires_grad_()
    got = K.extremum_spmm(kind, g, x)
    ct = torch.randn(5, 3, dtype=dtype)
    xo = x.detach().clone().requires_grad_()
    rows = []
    for v in range(5):
        xs = xo[g.src[g.dst == v]]
        rows.append(torch.zeros(3, dtype=dtype) if xs.numel() == 0
                    else xs.amax(0) if kind == "max" else xs.amin(0))
    want = torch.stack(rows)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad((got * ct).sum(), x)[0],
                               torch.autograd.grad((want * ct).sum(), xo)[0])


@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremum_spmm_keeps_its_output_and_tie_counts_for_backward(kind):
    """The backward reads the output and the forward's tie counts (one extremum kernel per
    step); where the output was written over in place after the call, the gradient is
    still the extremum's: backward computes it again from x."""
    if cpu_kernels.kernels() is None:
        pytest.skip("sarc's C kernels are not built here (no C compiler)")
    g = _multi_graph()
    x = torch.randint(-1, 2, (5, 3)).to(torch.float64).requires_grad_()
    ct = torch.randn(5, 3, dtype=torch.float64)
    want = torch.autograd.grad((K.extremum_spmm(kind, g, x) * ct).sum(), x)[0]
    calls = []
    real = type(cpu_kernels.kernels()).extremum

    def counted(self, *args):
        calls.append(args[0])
        return real(self, *args)
    with mock.patch.object(type(cpu_kernels.kernels()), "extremum", counted):
        y = K.extremum_spmm(kind, g, x)
        torch.testing.assert_close(torch.autograd.grad((y * ct).sum(), x)[0], want)
        assert calls == [kind]          # the forward's; backward read what it kept
        y = K.extremum_spmm(kind, g, x)
        z = y.detach()
        z += 100.0                      # the output written over (as a user may)
        torch.testing.assert_close(torch.autograd.grad((y * ct).sum(), x)[0], want)
        assert calls == [kind] * 3      # backward computed the extremum again


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_unweighted_spmm_on_the_graphs_own_weights(kind, dtype):
    """sum / mean of x[src] (the mean's 1 / in-degree in the graph's weights): values and the
    gradient, a node without in-edges getting 0."""
    g = _multi_graph()
    x = torch.randn(5, 3, dtype=dtype, requires_grad=True)
    got = K.spmm(kind, g, x)
    want = torch.zeros(5, 3, dtype=dtype).index_add(0, g.dst, x[g.src])
    if kind == "mean":
        want = want / torch.bincount(g.dst, minlength=5).clamp(min=1).unsqueeze(-1)
    torch.testing.assert_close(got, want)
    ct = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad((got * ct).sum(), x)[0],
                               torch.autograd.grad((want * ct).sum(), x)[0])


@pytest.mark.parametrize("side", ["src", "dst"])
def test_a_gathers_gradient_is_a_sum_over_each_nodes_edges(side):
    """gather_src / gather_dst under autograd: the gradient (a CSR product over the
    graph's index or its transpose) is index_select's, a second derivative too, on a
    graph with multi-edges, nodes without edges and an operand with more rows than the
    side has nodes (a block's source rows read at its destinations)."""
    g = sarc.Graph.from_edges(torch.tensor([0, 0, 0, 1, 1, 2, 3]),
                              torch.tensor([1, 1, 0, 2, 2, 2, 0]), num_src=5, num_dst=3)
    gather = K.gather_src if side == "src" else K.gather_dst
    index = g.src if side == "src" else g.dst
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    ct = torch.randn(g.num_edges, 2, 3, dtype=torch.float64)
    got = torch.autograd.grad((gather(x, g) * ct).sum(), x)[0]
    want = torch.autograd.grad((x.index_select(0, index) * ct).sum(), x)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert got[4].abs().sum() == 0 and got.abs().sum() > 0
    torch.autograd.gradgradcheck(lambda t: gather(t, g).pow(2), (x,))


def test_the_layout_cache_lets_its_graph_go():
    import gc
    import weakref
    g = _multi_graph()
    K.layout(g).transposed()
    ref = weakref.ref(g)
    del g
    gc.collect()
    assert ref() is None
