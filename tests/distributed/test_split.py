"""Splitting a layer at the exchange (sarc.ir.split) and the merge rules (sarc.distributed.merge).

In-process, no workers: the parts are run by the reference interpreter on the
blocks of real shards and merged, and must give the interpreter's result on the
whole graph; the merge rules are checked against whole-set reductions.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import features as program_features
from programs import make_layer, specs
from gat import GATLayer
from zoo import LAYERS, NUM_RELS, features

import sarc
from sarc.compiler import optimize
from sarc.backends import torch_blocks as DK
from sarc.distributed.merge import ExtremumMerge, NormalizerMerge, SoftmaxMerge, SumMerge
from sarc.ir.split import SplitError, format_split, split_layer
from sarc.ir import interpreter
from sarc.ir.ops import Op
from sarc.ir.types import Domain
from sarc.partition import partition_graph
from sarc.planner.cost import exchange_candidates
from sarc.runtime.sharded import ShardedGraph

from . import layers
from .layers import MaxLayer, NestedSoftmaxLayer

D = 6


def _layers():
    out = {k: LAYERS[k] for k in ("gcn", "sage", "gat_4heads_concat", "gin_train_eps", "rgcn")}
    out["max"] = lambda d: MaxLayer(d, 4)
    out["min"] = lambda d: MaxLayer(d, 4, kind="min")
    out["gat_attn_drop"] = lambda d: GATLayer(d, 3, heads=2, attn_drop=0.5)
    return out


@pytest.mark.parametrize("name", sorted(_layers()))
def test_every_exchange_candidate_splits_into_verified_parts(name):
    fn = optimize(_layers()[name](D).trace())
    cands = exchange_candidates(fn)
    assert cands
    for ex in cands:
        split = split_layer(fn, ex.values)
        # X crosses: the src part computes exactly the exchanged values, in order
        assert [k for k, _ in split.src.outputs] == [s.name for s in split.exchanged]
        assert all(v.type.domain is not Domain.SRC for v in split.src.values)
        # the edge part reads X, dst values and edge inputs only; outputs one partial per aggregate
        leaves = {v.attr["name"] for v in split.edge.values if v.op is Op.INPUT}
        edge_inputs = {k for k, t in fn.inputs().items() if t.domain is Domain.EDGE}
        assert leaves <= {s.name for s in split.exchanged} | {s.name for s in split.dst_values} | edge_inputs
        assert [k for k, _ in split.edge.outputs] == [a.name for a in split.aggregates]
        assert not any(v.op in (Op.REDUCE, Op.AGGREGATE) and v.attr["kind"] == "mean"
                       for v in split.edge.values)
        # the post part ends in the layer's outputs
        assert [k for k, _ in split.dst_post.outputs] == [k for k, _ in fn.outputs]
        assert "$x0" in format_split(split)


class _Float64Score(sarc.Layer):
    """A float32 layer whose per-edge score is computed in float64 from both ends."""

    def __init__(self, d):
        super().__init__(node={"h": d})
        self.a, self.b = torch.nn.Linear(d, 3), torch.nn.Linear(d, 2)

    def message(self, src, dst, edge):
        s = torch.tanh((self.b(src.h).double() + self.b(dst.h).double()).sum(-1, keepdim=True))
        return self.a(src.h) * s.float()

    def reduce(self, msg):
        return sarc.sum(msg.m)


class _Float64Input(sarc.Layer):
    """A float64 source feature beside a float32 one: every exchange mixes them."""

    def __init__(self, d):
        super().__init__(node={"h": d, "k": sarc.Feature((d,), "f64")})
        self.a = torch.nn.Linear(d, 3)

    def message(self, src, dst, edge):
        s = src.k.sum(-1, keepdim=True) - dst.k.sum(-1, keepdim=True)
        return self.a(src.h) * torch.tanh(s).float()

    def reduce(self, msg):
        return sarc.sum(msg.m)


def test_an_exchange_of_one_dtype_is_chosen_where_the_operands_mix_them():
    """The operands (``a(h)`` float32, ``b(h)`` float64) were the only candidates split:
    refused, where the float32 input they come from crosses as one row."""
    fn = optimize(_Float64Score(D).trace())
    cands = exchange_candidates(fn)
    assert cands and all(len({fn.values[j].type.dtype for j in c.values}) == 1 for c in cands)
    split_layer(fn, cands[0].values)


def test_an_exchange_that_must_mix_dtypes_is_refused_saying_where():
    fn = optimize(_Float64Input(D).trace())
    with pytest.raises(SplitError, match=r"mix dtypes \(f32, f64: .*test_split.py:\d+.*\), "
                                         r"and so do the inputs .* a row of the exchange packs "
                                         r"one dtype"):
        split_layer(fn, exchange_candidates(fn)[0].values)


def test_kinds_and_softmax_sites():
    fn = optimize(GATLayer(D, 3, heads=2).trace())
    split = split_layer(fn, exchange_candidates(fn)[0].values)
    assert [a.kind for a in split.aggregates] == ["softmax"] and not split.softmax_sites
    assert split.aggregates[0].score_feat == (2,)
    assert [s.name for s in split.dst_values] == ["$d0"]  # er, read at the destinations
    fn = optimize(GATLayer(D, 3, heads=2, attn_drop=0.5).trace())
    split = split_layer(fn, exchange_candidates(fn)[0].values)
    assert [a.kind for a in split.aggregates] == ["sum"] and len(split.softmax_sites) == 1
    assert split.fetch_passes() == 2
    fn = optimize(LAYERS["sage"](D).trace())
    assert [a.kind for a in split_layer(fn, exchange_candidates(fn)[0].values).aggregates] == ["mean"]


def test_pushdown_exchange_sends_projected_values_baseline_sends_inputs():
    fn = optimize(GATLayer(32, 3, heads=2).trace())
    pushed, narrow, raw = exchange_candidates(fn)
    assert pushed.width == 2 + 6 and narrow.width == 6 and raw.width == 32
    s_pushed, s_narrow, s_raw = (split_layer(fn, c.values) for c in (pushed, narrow, raw))
    assert s_pushed.row_width == 8 and s_narrow.row_width == 6 and s_raw.row_width == 32
    # baseline: the receiver recomputes W h on the rows it got (a linear in the edge part)
    assert any(v.op is Op.LINEAR for v in s_raw.edge.values)
    assert not any(v.op is Op.LINEAR for v in s_pushed.edge.values)
    # the narrow exchange sends W h only: the receiver computes el = <W h, a_l> itself
    assert set(narrow.recompute) and not any(v.op is Op.LINEAR for v in s_narrow.edge.values)
    assert any(v.op is Op.SUM_AXIS and v.type.domain is Domain.SRC for v in s_narrow.edge.values)
    assert any(v.op is Op.SUM_AXIS for v in s_pushed.src.values)
    assert not any(v.op is Op.SUM_AXIS for v in s_narrow.src.values)


def test_a_dst_value_equal_to_an_exchanged_values_rows_is_read_from_them():
    """GAT's ``lin(dst.h)`` is ``lin(src.h)``'s first rows: where ``lin(src.h)`` crosses,
    the dst parts read it from the worker's own rows (``$x0``) instead of a second linear;
    where the raw ``h`` crosses, they compute it."""
    fn = optimize(GATLayer(32, 3, heads=2).trace())
    pushed, narrow, raw = exchange_candidates(fn)
    for c in (pushed, narrow):
        split = split_layer(fn, c.values)
        pre = split.dst_pre.values
        assert not any(v.op is Op.LINEAR for v in pre)
        reads = [v.attr["name"] for v in pre if v.op is Op.INPUT]
        assert reads == ["$x0"] and split.exchanged[0].type.feat == (2, 3)
    split = split_layer(fn, raw.values)
    assert any(v.op is Op.LINEAR for v in split.dst_pre.values)
    assert [v.attr["name"] for v in split.dst_pre.values if v.op is Op.INPUT] == ["h"]


def test_split_rejects_an_exchange_that_misses_a_source_input():
    fn = optimize(LAYERS["gcn"](D).trace())
    pushed, raw = exchange_candidates(fn)
    narrow = type(raw)(raw.values[:1], raw.names[:1], D, 4, True, ())
    with pytest.raises(SplitError, match="does not carry"):
        split_layer(fn, narrow.values)


@pytest.mark.parametrize("aggregate, baseline", [("mean", False), ("sum", True)])
def test_a_softmax_of_another_softmaxs_weights_is_refused_at_the_line(aggregate, baseline):
    """The normalizer pass computes every normalizer at once, an unfused site's weights
    block-local there: an unfused softmax (or, in the baseline, a fused one's normalizer) of
    them would be wrong on workers, so it is refused at the user's line."""
    from sarc.backends import dist_backend
    from sarc.planner.plan import plan_layer
    from sarc.planner.stats import ShardStats

    fn = optimize(NestedSoftmaxLayer(D, 4, aggregate).trace())
    lp = plan_layer("nested", fn, workers=2, baseline=baseline,
                    stats=ShardStats(2, (20, 20), (90, 90), ((0, 5), (5, 0))))
    with pytest.raises(sarc.DSLError, match="computed from another edge_softmax's weights") as e:
        dist_backend.generate(split_layer(fn, lp.exchange.values), lp, baseline=baseline)
    line = next(n for n, text in enumerate(Path(layers.__file__).read_text().splitlines(), 1)
                if "# ERR:nested" in text)
    assert (Path(e.value.loc.file).name, e.value.loc.line) == ("layers.py", line), e.value


def test_a_fused_softmax_of_another_softmaxs_weights_is_split():
    """Outside the baseline a fused softmax's normalizers are merged online from the main
    pass, which reads the unfused site's global weights: the layer is split, not refused
    (its exactness on workers: ``test_exactness``'s masked and nested cases)."""
    fn = optimize(NestedSoftmaxLayer(D, 4, "sum").trace())
    split = split_layer(fn, exchange_candidates(fn)[0].values)
    assert len(split.softmax_sites) == 1
    assert [a.kind for a in split.aggregates] == ["softmax"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A random graph (with isolated nodes and multi-edges) cut into 3 shards."""
    n, e = 40, 220
    gen = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, n - 4, (e,), generator=gen), torch.randint(0, n - 4, (e,), generator=gen)
    edata = {"etype": torch.randint(0, NUM_RELS, (e,), generator=gen),
             "norm": torch.rand(e, generator=gen) + 0.1}
    pset = partition_graph(src, dst, n, 3, tmp_path_factory.mktemp("p") / "parts",
                           method="random", edge_data=edata)
    return src, dst, n, edata, [ShardedGraph.from_partitions(pset, r) for r in range(3)]


@pytest.mark.parametrize("name", ["gcn", "sage", "gin_train_eps", "rgcn"])
@pytest.mark.parametrize("which", [0, -1])
def test_parts_on_shard_blocks_merge_to_the_whole_graph_result(shards, name, which):
    """Interpreter on the parts, block by block, summed (mean: / whole-graph in-degree),
    equals the interpreter on the whole graph, for sum and mean layers."""
    src, dst, n, edata, parts = shards
    layer = LAYERS[name](D)
    fn = optimize(layer.trace())
    split = split_layer(fn, exchange_candidates(fn)[which].values)
    g = sarc.Graph.from_edges(src, dst, n)
    feats = features(layer, g, D)
    feats.update({k: v for k, v in edata.items() if k in feats})
    params = dict(layer.named_parameters())
    ref_inputs = {**feats, "in_degree": g.in_degree, "out_degree": g.out_degree}
    ref_inputs.update({k: v.index_select(0, g.perm) for k, v in edata.items() if k in feats})
    want = interpreter.run(fn, g, ref_inputs, params)["h"]
    got = _run_split(split, parts, {"h": feats["h"]}, params, want.shape[1:])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(spec=specs(max_depth=2, reduce_kinds=("sum", "mean")),
       edges=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), min_size=1, max_size=40),
       num_parts=st.integers(1, 3), which=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_random_programs_on_shard_blocks_merge_to_the_whole_graph_result(spec, edges, num_parts,
                                                                        which, seed):
    """Random sum / mean layers (``programs.specs``; a projection of h may be read at both
    ends, so dst parts read exchanged rows) cut at any exchange candidate: the parts run by
    the interpreter on the shards of a random partition, merged, equal the interpreter on
    the whole graph."""
    torch.manual_seed(seed)
    layer = make_layer(spec).eval()  # dropout: the identity
    fn = optimize(layer.trace())
    candidates = exchange_candidates(fn)
    split = split_layer(fn, candidates[which % len(candidates)].values if candidates else None)
    n = 12
    src = torch.tensor([u for u, _ in edges])
    dst = torch.tensor([v for _, v in edges])
    g = sarc.Graph.from_edges(src, dst, n)
    feats = program_features(layer, g, seed)  # edge features in the order of `edges`
    edata = {k: feats.pop(k) for k in ("w", "t") if k in feats}
    params = dict(layer.named_parameters())
    ref = {**feats, **{k: v.index_select(0, g.perm) for k, v in edata.items()},
           "in_degree": g.in_degree, "out_degree": g.out_degree}
    want = interpreter.run(fn, g, ref, params)["h"]
    with tempfile.TemporaryDirectory() as tmp:
        pset = partition_graph(src, dst, n, num_parts, Path(tmp) / "parts", method="random",
                               edge_data=edata, seed=seed)
        shards = [ShardedGraph.from_partitions(pset, r) for r in range(num_parts)]
    got = _run_split(split, shards, feats, params, want.shape[1:])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _run_split(split, shards, feats: dict, params: dict, feat: tuple) -> torch.Tensor:
    """The split's parts on each shard by the interpreter, blocks summed by ``SumMerge``
    (mean: divided by the whole-graph in-degree); the output in original node order."""
    def node_inputs(sh):
        return {**{k: v[sh.orig_node_ids] for k, v in feats.items()},
                "in_degree": sh.in_degree, "out_degree": sh.out_degree}

    none = torch.zeros(0, dtype=torch.int64)
    own = [sarc.Graph.from_edges(none, none, sh.num_local) for sh in shards]
    xs = [interpreter.run(split.src, own[r], node_inputs(sh), params) if split.src else {}
          for r, sh in enumerate(shards)]
    got = torch.zeros(sum(sh.num_local for sh in shards), *feat)
    for r, sh in enumerate(shards):
        mine = {**node_inputs(sh), **xs[r]}  # a dst value may be an exchanged value's rows
        d = interpreter.run(split.dst_pre, own[r], mine, params) if split.dst_pre else {}
        merge = {a.name: SumMerge(sh.in_degree if a.kind == "mean" else None)
                 for a in split.aggregates}
        for j, block in enumerate(sh.blocks):
            rows = {k: v.index_select(0, sh.needed_rows[j]) for k, v in xs[j].items()}
            block_edges = {k: t.index_select(0, block.perm) for k, t in sh.edata[j].items()}
            partial = interpreter.run(split.edge, block, {**rows, **d, **block_edges}, params)
            for k, v in partial.items():
                merge[k].add(v)
        aggs = {a.name: merge[a.name].finish(
                    torch.zeros(sh.num_local, *split.layer.values[a.index].type.feat))
                for a in split.aggregates}
        out = interpreter.run(split.dst_post, own[r], {**mine, **d, **aggs}, params)
        got[sh.orig_node_ids] = out["h"]
    return got


# --- merge rules ------------------------------------------------------------------------

def _segments(num_dst, e, gen):
    dst = torch.sort(torch.randint(0, num_dst - 2, (e,), generator=gen)).values  # 2 empty rows
    return sarc.Graph.from_edges(torch.zeros(e, dtype=torch.int64), dst, num_src=1,
                                 num_dst=num_dst, dst_in_src=False)


def _split_edges(g: sarc.Graph, k: int, gen):
    """g's edges dealt at random into k blocks (split blocks over the same destinations)."""
    owner = torch.randint(0, k, (g.num_edges,), generator=gen)
    return [(owner == b).nonzero().squeeze(1) for b in range(k)]


def _block(g, idx):
    return sarc.Graph.from_edges(torch.zeros(idx.numel(), dtype=torch.int64), g.dst[idx],
                                 num_src=1, num_dst=g.num_dst, dst_in_src=False)


def test_online_softmax_merge_equals_softmax_over_all_edges():
    gen = torch.Generator().manual_seed(0)
    g = _segments(12, 80, gen)
    score, value = torch.randn(g.num_edges, 3, generator=gen) * 4, torch.randn(g.num_edges, 3, 5, generator=gen)
    m = torch.full((12, 3), float("-inf")).index_reduce(0, g.dst, score, "amax")
    ex = torch.exp(score - m[g.dst])
    want = torch.zeros(12, 3, 5).index_add(0, g.dst, ex[..., None] * value) / \
        torch.zeros(12, 3).index_add(0, g.dst, ex).clamp(min=1e-30)[..., None]
    merge = SoftmaxMerge(2, g.in_degree)
    for idx in _split_edges(g, 4, gen):
        b = _block(g, idx)
        sc, val = score[idx], value[idx]
        part = DK.softmax_partial(lambda gb, a, c: a, lambda gb, a, c: c, ("edge", "edge"), 15, b,
                                  None, sc, val)
        merge.add(part)
    got = merge.finish(torch.zeros(12, 3, 5))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    assert torch.equal(got[10:], torch.zeros(2, 3, 5))  # no incoming edges: 0
    mm, ss, gg, dd = merge.cotangent(torch.ones(12, 3, 5))
    assert dd.dtype == ss.dtype == torch.float64  # the softmax's statistics (DK.STATS)
    torch.testing.assert_close(dd, got.double().sum(-1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("blocks", [1, 3])
def test_a_destination_whose_every_score_is_minus_inf_is_nan_as_on_one_process(blocks):
    """A destination with edges, all scored -inf (``masked_fill``), softmaxes to NaN on one
    process (exp(-inf - -inf)), as in torch, PyG and DGL: merged over blocks it is NaN too,
    whichever blocks hold its edges; a destination without edges stays 0."""
    gen = torch.Generator().manual_seed(5)
    g = _segments(8, 40, gen)
    score, value = torch.randn(g.num_edges, 2, generator=gen), torch.randn(g.num_edges, 2, 3, generator=gen)
    masked = g.dst == g.dst[0]
    score[masked] = float("-inf")
    m = torch.full((8, 2), float("-inf")).index_reduce(0, g.dst, score, "amax")
    ex = torch.exp(score - m[g.dst])  # NaN on the masked destination's edges
    want = torch.zeros(8, 2, 3).index_add(0, g.dst, ex[..., None] * value) / \
        torch.zeros(8, 2).index_add(0, g.dst, ex).clamp(min=1e-30)[..., None]
    merge = SoftmaxMerge(2, g.in_degree)
    normalizer = NormalizerMerge(g.in_degree)
    for idx in _split_edges(g, blocks, gen):
        b = _block(g, idx)
        merge.add(DK.softmax_partial(lambda gb, a, c: a, lambda gb, a, c: c, ("edge", "edge"), 15,
                                     b, None, score[idx], value[idx]))
        normalizer.add(DK.score_normalizer(score[idx], b))
    got = merge.finish(torch.zeros(8, 2, 3))
    row = int(g.dst[0])
    assert torch.isnan(got[row]).all() and torch.isnan(got).sum() == got[row].numel()
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(got[6:], torch.zeros(2, 2, 3))  # no incoming edges: 0
    m = merge.cotangent(torch.zeros(8, 2, 3))[0]  # the backward weighs the row's edges NaN
    assert torch.isnan(m[row]).all() and torch.equal(m[6:], torch.zeros(2, 2))
    alpha = DK.edge_softmax_global(score, g, normalizer.finish((8, 2), torch.float32, "cpu"))
    assert torch.isnan(alpha[masked]).all() and not torch.isnan(alpha[~masked]).any()


@pytest.fixture(params=["kernels", "torch"])
def cpu_kernels(request, monkeypatch):
    """sarc's C kernels on, or torch's ops in their place (``SARC_CPU_KERNELS=0``)."""
    monkeypatch.setenv("SARC_CPU_KERNELS", "1" if request.param == "kernels" else "0")
    return request.param


@pytest.mark.parametrize("width", [8, 10_000_000])  # many row blocks, one
def test_softmax_blocks_weigh_a_source_value_as_they_weigh_it_per_edge(width, cpu_kernels):
    """A softmax whose value is a source feature z its score does not read
    (``value_index``): the partial's weighted sum and the surrogate's <g_v, z_u> as sparse
    products equal the per-edge forms: the partials' values, the surrogates' gradients (score
    operands and z)."""
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 9, (60,), generator=gen), torch.randint(0, 7, (60,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, num_src=9, num_dst=7, dst_in_src=False)
    el, er = torch.randn(9, 3, generator=gen), torch.randn(7, 3, generator=gen)
    z = torch.randn(9, 3, 4, generator=gen)
    sides = ("src", "dst", "src")

    def score(gb, a, b, c):
        return torch.nn.functional.leaky_relu(a + b, 0.2)

    def value(gb, a, b, c):
        return c
    merge = SoftmaxMerge(2, g.in_degree)
    merge.add(DK.softmax_partial(score, value, sides, width, g, None, el, er, z))
    want_out = merge.finish(torch.zeros(7, 3, 4))
    state = merge.cotangent(torch.randn(7, 3, 4, generator=gen))
    runs = []
    for value_index in (None, 2):
        merge = SoftmaxMerge(2, g.in_degree)
        merge.add(DK.softmax_partial(score, value, sides, width, g, value_index, el, er, z))
        out = merge.finish(torch.zeros(7, 3, 4))
        leaves = [t.clone().requires_grad_() for t in (el, er, z)]
        sur = DK.softmax_surrogate(score, value, sides, width, g, value_index, state, *leaves)
        runs.append((out, torch.autograd.grad(sur, leaves)))  # a surrogate: its gradient
    (out0, grads0), (out1, grads1) = runs
    torch.testing.assert_close(out0, want_out)
    torch.testing.assert_close(out1, out0)
    for a, b in zip(grads1, grads0):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("value_index", [None, 2])
def test_softmax_block_score_gradients_cancel_as_in_float64(value_index, cpu_kernels):
    """At large scores one edge holds nearly all of a row's weight and the row's score
    gradients nearly cancel: a float32 dot (error ~ eps |g| |z|) would swamp them. Split over
    blocks and merged, the float32 layer's score-operand gradients equal float64's to
    float32's rounding of the terms themselves (``torch_blocks``' note), the dst operand's
    (the row sums of the gradients) included."""
    gen = torch.Generator().manual_seed(3)
    n, e = 12, 90
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n - 2, (e,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, num_src=n, num_dst=n, dst_in_src=False)
    # multiples of 2^-10: the scores el + er are exact in float32, as in float64
    el, er = ((torch.randn(n, 2, generator=gen) * k * 1024).round() / 1024 for k in (10, 1))
    z = torch.randn(n, 2, 3, generator=gen) + 1.0
    cot = torch.randn(n, 2, 3, generator=gen)
    sides = ("src", "dst", "src")

    def score(gb, a, b, c):
        return a + b  # linear: a row's dst-operand gradient is the sum of its score gradients

    def value(gb, a, b, c):
        return c

    def layer(dtype, blocks):
        """sum over the blocks' surrogates' gradients, the blocks merged as the runtime does."""
        leaves = [t.to(dtype) for t in (el, er, z)]
        merge = SoftmaxMerge(2, g.in_degree)
        for idx in blocks:
            merge.add(DK.softmax_partial(score, value, sides, 8, _edges(g, idx), value_index,
                                         *leaves))
        merge.finish(torch.zeros(n, 2, 3, dtype=dtype))
        state = merge.cotangent(cot.to(dtype))
        grads = [torch.zeros_like(t) for t in leaves]
        for idx in blocks:
            xs = [t.clone().requires_grad_() for t in leaves]
            sur = DK.softmax_surrogate(score, value, sides, 8, _edges(g, idx), value_index,
                                       state, *xs)
            for acc, grad in zip(grads, torch.autograd.grad(sur.sum(), xs)):
                acc += grad
        return grads

    blocks = _split_edges(g, 3, gen)
    want = layer(torch.float64, blocks)
    got = layer(torch.float32, blocks)
    # the gradient's terms in float64, ds_e = alpha_e (<cot_v, z_u> - D_v): a score operand's
    # gradient may round as much as the sum of its terms' magnitudes
    sc = (el[src] + er[dst]).double()
    m = torch.full((n, 2), float("-inf"), dtype=torch.float64).index_reduce(0, dst, sc, "amax")
    ex = torch.exp(sc - m[dst])
    alpha = ex / torch.zeros(n, 2, dtype=torch.float64).index_add(0, dst, ex)[dst]
    dot = (cot.double()[dst] * z.double()[src]).sum(-1)
    d = torch.zeros(n, 2, dtype=torch.float64).index_add(0, dst, alpha * dot)
    ds = (alpha * (dot - d[dst])).abs()
    bounds = [torch.zeros(n, 2, dtype=torch.float64).index_add(0, i, ds) for i in (src, dst)]
    has = bounds[1][:n - 2] > 0
    # most rows: the terms far below float32's error of a dot (~1e-7 |cot| |z|)
    assert (bounds[1][:n - 2][has] < 1e-4).sum() >= 5
    for a, b, bound in zip(got[:2], want[:2], bounds):
        bad = (a.double() - b).abs() > 1e-6 * bound + 1e-30
        assert not bad.any(), (a[bad], b[bad], bound[bad])
    torch.testing.assert_close(got[2].double(), want[2], rtol=1e-5, atol=1e-6)


def _edges(g: sarc.Graph, idx: torch.Tensor) -> sarc.Graph:
    """The block of g's edges ``idx`` (all of g's sources and destinations)."""
    return sarc.Graph.from_edges(g.src[idx], g.dst[idx], num_src=g.num_src,
                                 num_dst=g.num_dst, dst_in_src=False)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremum_merge_counts_ties_across_blocks(kind):
    gen = torch.Generator().manual_seed(1)
    g = _segments(10, 70, gen)
    x = torch.randint(-2, 3, (g.num_edges, 2), generator=gen).float()  # many ties
    want = torch.zeros(10, 2)
    reduce = "amax" if kind == "max" else "amin"
    init = float("-inf") if kind == "max" else float("inf")
    full = torch.full((10, 2), init).index_reduce(0, g.dst, x, reduce)
    has = torch.bincount(g.dst, minlength=10) > 0
    want[has] = full[has]
    ties = torch.zeros(10, 2).index_add(0, g.dst, (x == full[g.dst]).float())
    merge = ExtremumMerge(kind)
    for idx in _split_edges(g, 3, gen):
        merge.add(DK.reduce_extremum_partial(kind, x[idx], _block(g, idx)))
    got = merge.finish(torch.zeros(10, 2))
    assert torch.equal(got, want)
    y, share = merge.cotangent(torch.ones(10, 2))
    torch.testing.assert_close(share[has], 1.0 / ties[has])


@pytest.mark.parametrize("kind", ["max", "min"])
def test_extremum_merge_keeps_a_nan_of_any_block(kind):
    """A NaN among a row's edges makes the row's max / min NaN, as on one process, whichever
    block holds it (no edge attains it: it counts no tie); the other rows are unchanged."""
    gen = torch.Generator().manual_seed(3)
    g = _segments(10, 70, gen)
    x = torch.randn(g.num_edges, 2, generator=gen)
    x[5, 1] = float("nan")
    reduce = "amax" if kind == "max" else "amin"
    init = float("-inf") if kind == "max" else float("inf")
    want = torch.full((10, 2), init).index_reduce(0, g.dst, x, reduce)
    want[torch.bincount(g.dst, minlength=10) == 0] = 0.0
    for blocks in (1, 3):
        merge = ExtremumMerge(kind)
        for idx in _split_edges(g, blocks, gen):
            merge.add(DK.reduce_extremum_partial(kind, x[idx], _block(g, idx)))
        got = merge.finish(torch.zeros(10, 2))
        assert torch.isnan(got[g.dst[5], 1]) and torch.isnan(got).sum() == 1
        torch.testing.assert_close(got, want, equal_nan=True)


def test_normalizer_merge_gives_global_max_and_sum():
    gen = torch.Generator().manual_seed(2)
    g = _segments(8, 50, gen)
    s = torch.randn(g.num_edges, 2, generator=gen) * 3
    merge = NormalizerMerge(g.in_degree)
    for idx in _split_edges(g, 3, gen):
        merge.add(DK.score_normalizer(s[idx], _block(g, idx)))
    big_m, big_s = merge.finish((8, 2), torch.float32, "cpu")
    alpha = DK.edge_softmax_global(s, g, (big_m, big_s))
    sums = torch.zeros(8, 2).index_add(0, g.dst, alpha)
    has = torch.bincount(g.dst, minlength=8) > 0
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))
    assert torch.equal(big_s[~has], torch.ones_like(big_s[~has]))


def test_mean_merge_divides_by_the_whole_graph_in_degree():
    merge = SumMerge(torch.tensor([0.0, 2.0, 4.0]))
    merge.add(torch.tensor([[0.0], [1.0], [2.0]]))
    merge.add(torch.tensor([[0.0], [3.0], [6.0]]))
    assert torch.equal(merge.finish(torch.zeros(3, 1)), torch.tensor([[0.0], [2.0], [2.0]]))


def _merged_extremum(kind, body, sides, g, blocks, operands, cot):
    """The merged output of ``body``'s max / min over the blocks ``blocks`` and the summed
    gradients of the blocks' surrogates (the runtime's two passes)."""
    merge = ExtremumMerge(kind)
    for idx in blocks:
        merge.add(DK.extremum_partial(kind, body, sides, 4, _edges(g, idx), *operands))
    out = merge.finish(torch.zeros(g.num_dst, *operands[0].shape[1:]))
    y, share = merge.cotangent(cot)
    grads = [torch.zeros_like(t) for t in operands]
    for idx in blocks:
        xs = [t.clone().requires_grad_() for t in operands]
        sur = DK.extremum_select(kind, body, sides, 4, _edges(g, idx), y, share, *xs)
        for acc, grad in zip(grads, torch.autograd.grad(sur, xs, allow_unused=True)):
            acc += 0 if grad is None else grad
    return out, grads


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("sign", [1, -1])
def test_lifted_extremum_blocks_equal_the_per_edge_form(kind, sign, cpu_kernels):
    """A max / min of a source feature plus or minus destination terms (EdgeConv's, its
    linear at the nodes: ``patterns.lifted_extremum``) taken at the feature's extremum per
    block (``DK.LiftedRow``) merges to the per-edge form's output, ties (integer features)
    and rows without edges in a block included, and its surrogates give the same gradients
    to the feature, the destination term and the parameter."""
    gen = torch.Generator().manual_seed(5 + sign)
    n, e = 11, 70
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, n - 2, (e,), generator=gen)   # 2 rows without edges
    g = sarc.Graph.from_edges(src, dst, num_src=n, num_dst=n, dst_in_src=False)
    x, h = (torch.randint(-3, 4, (n, 2), generator=gen).float() for _ in range(2))
    w = torch.tensor([0.5, -1.0])
    sides = ("src", "dst", "param")

    def body(gb, a, b, c):
        return sign * a + b - c
    extremum = kind if sign > 0 else {"max": "min", "min": "max"}[kind]
    cot = torch.randn(n, 2, generator=gen)
    blocks = _split_edges(g, 3, gen)
    want = _merged_extremum(kind, body, sides, g, blocks, (x, h, w), cot)
    got = _merged_extremum(kind, DK.LiftedRow(0, extremum, body), sides, g, blocks, (x, h, w), cot)
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)
    assert float(want[1][0].abs().sum()) > 0 and float(want[1][1].abs().sum()) > 0


@pytest.mark.parametrize("value_index", [None, 2])
def test_dot_score_blocks_equal_the_per_edge_form(value_index, cpu_kernels):
    """An attention whose score is a dot product of a destination and a source row per head,
    scaled (``patterns.dot_score``), its scores one SDDMM per block (``DK.DotScore``):
    the merged output and the surrogates' gradients equal the per-edge score's."""
    gen = torch.Generator().manual_seed(4)
    n, e, heads, d = 10, 60, 2, 3
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, n - 1, (e,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, num_src=n, num_dst=n, dst_in_src=False)
    q, k, z = (torch.randn(n, heads, d, generator=gen) for _ in range(3))
    sides = ("dst", "src", "src")

    def score(gb, a, b, c):
        return (a * b).sum(-1) / 2.0

    def value(gb, a, b, c):
        return c
    cot = torch.randn(n, heads, d, generator=gen)
    blocks = _split_edges(g, 3, gen)
    runs = []
    for sc in (score, DK.DotScore(score, (1, 0, "div", 2.0), (heads,))):
        merge = SoftmaxMerge(2, g.in_degree)
        for idx in blocks:
            merge.add(DK.softmax_partial(sc, value, sides, 8, _edges(g, idx), value_index,
                                         q, k, z))
        out = merge.finish(torch.zeros(n, heads, d))
        state = merge.cotangent(cot)
        grads = [torch.zeros_like(t) for t in (q, k, z)]
        for idx in blocks:
            xs = [t.clone().requires_grad_() for t in (q, k, z)]
            sur = DK.softmax_surrogate(sc, value, sides, 8, _edges(g, idx), value_index,
                                       state, *xs)
            for acc, grad in zip(grads, torch.autograd.grad(sur.sum(), xs)):
                acc += grad
        runs.append((out, grads))
    (want, want_grads), (got, got_grads) = runs
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["sum", "max", "softmax", "normalizer"])
def test_a_merge_takes_a_whole_first_part_as_it_is_and_never_writes_into_it(kind):
    """A merge keeps a block's whole partial as its state, not a copy (one block then costs
    no pass over the rows); a later part at some rows, or the finish and cotangent, must not
    write into that partial: the merged values equal those of merging copies."""
    gen = torch.Generator().manual_seed(7)
    n = 6
    rows = torch.tensor([1, 4])

    def parts(k):
        x = torch.randn(k, 3, generator=gen)
        if kind == "sum":
            return x
        if kind == "max":
            return x, torch.ones(k, 3)
        if kind == "softmax":
            return x, torch.rand(k, 3, generator=gen, dtype=torch.float64) + 0.5, \
                torch.randn(k, 3, generator=gen, dtype=torch.float64)
        return x, torch.rand(k, 3, generator=gen, dtype=torch.float64) + 0.5

    def make():
        return {"sum": lambda: SumMerge(), "max": lambda: ExtremumMerge("max"),
                "softmax": lambda: SoftmaxMerge(2, torch.ones(n)),
                "normalizer": lambda: NormalizerMerge(torch.ones(n))}[kind]()

    def clone(p):
        return tuple(t.clone() for t in p) if isinstance(p, tuple) else p.clone()

    first, second = parts(n), parts(2)
    kept = clone(first)
    merged, copied = make(), make()
    merged.add(first)
    merged.add(second, rows, n)
    copied.add(clone(kept))
    copied.add(clone(second), rows, n)
    if kind == "normalizer":
        got, want = merged.finish((n, 3), torch.float32, "cpu"), copied.finish((n, 3), torch.float32, "cpu")
    else:
        got, want = merged.finish(torch.zeros(n, 3)), copied.finish(torch.zeros(n, 3))
        cot = torch.randn(n, 3, generator=gen)
        got = (got, merged.cotangent(cot))
        want = (want, copied.cotangent(cot))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(first if isinstance(first, tuple) else (first,),
                    kept if isinstance(kept, tuple) else (kept,)):
        assert torch.equal(a, b)  # the block's partial as the block gave it


def test_the_softmax_merge_gives_the_same_numbers_span_by_span(monkeypatch):
    """The merge's float64 arithmetic runs span of rows by span of rows on the CPU
    (``merge.ROW_SPAN_ELEMS``): spans of a few rows, rows without edges and rows whose
    scores are all -inf among them, give the numbers of one span, bit for bit."""
    from sarc.distributed import merge as merge_module
    gen = torch.Generator().manual_seed(11)
    g = _segments(40, 300, gen)
    score, value = torch.randn(g.num_edges, 3, generator=gen), torch.randn(g.num_edges, 3, 5, generator=gen)
    score[g.dst == g.dst[0]] = float("-inf")
    cot = torch.randn(40, 3, 5, generator=gen)
    results = []
    for elems in (1 << 18, 7, 1):
        monkeypatch.setattr(merge_module, "ROW_SPAN_ELEMS", elems)
        merge = SoftmaxMerge(2, g.in_degree)
        for idx in _split_edges(g, 2, torch.Generator().manual_seed(3)):
            merge.add(DK.softmax_partial(lambda gb, a, c: a, lambda gb, a, c: c, ("edge", "edge"),
                                         15, _block(g, idx), None, score[idx], value[idx]))
        results.append((merge.finish(torch.zeros(40, 3, 5)), *merge.cotangent(cot)))
    assert torch.isnan(results[0][0]).any() and (results[0][0][38:] == 0).all()
    for got in results[1:]:
        torch.testing.assert_close(got, results[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_the_extremum_merge_gives_the_same_numbers_span_by_span(monkeypatch, kind):
    """As the softmax merge: an extremum merge's finish, span of rows by span of rows, gives
    one span's numbers (rows without edges 0, a NaN kept, ties counted)."""
    from sarc.distributed import merge as merge_module
    gen = torch.Generator().manual_seed(13)
    g = _segments(40, 300, gen)
    x = torch.randint(-2, 3, (g.num_edges, 3), generator=gen).float()
    x[7, 2] = float("nan")
    results = []
    for elems in (1 << 18, 5, 1):
        monkeypatch.setattr(merge_module, "ROW_SPAN_ELEMS", elems)
        merge = ExtremumMerge(kind)
        # a block without edges first: its identity everywhere, which no edge attains
        merge.add((torch.full((40, 3), float("-inf") if kind == "max" else float("inf")),
                   torch.zeros(40, 3)))
        for idx in _split_edges(g, 3, torch.Generator().manual_seed(4)):
            merge.add(DK.reduce_extremum_partial(kind, x[idx], _block(g, idx)))
        results.append((merge.finish(torch.zeros(40, 3)), *merge.cotangent(torch.ones(40, 3))))
    assert torch.isnan(results[0][0]).sum() == 1 and (results[0][0][38:] == 0).all()
    for got in results[1:]:
        torch.testing.assert_close(got, results[0], rtol=0, atol=0, equal_nan=True)


def test_the_softmax_merges_row_dots_sum_in_the_whole_tensors_order_on_threads():
    """``D = <g, y>`` span by span equals the whole tensor's sum bit for bit with torch's
    intra-op threads on: a span of one row and one score element would be a reduction to
    one number, which torch splits across its threads in another order of additions (wide
    rows; a process of its own: the suite keeps one thread)."""
    import subprocess
    import sys
    code = (
        "import torch\n"
        "from sarc.distributed import merge\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "for n, s, t in ((7, (), (40000,)), (3, (), (300000,)), (2, (1,), (300000,)), "
        "(5, (2,), (3, 7))):\n"
        "    y = torch.randn(n, *s, *t, generator=g, dtype=torch.float64)\n"
        "    c = torch.randn(n, *s, *t, generator=g)\n"
        "    whole = (c.to(y.dtype) * y).reshape(n, *s, -1).sum(-1)\n"
        "    assert torch.equal(merge._row_dots(c, y, (n, *s)), whole), (n, s, t)\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_source_value_surrogates_gradient_by_a_constant_cotangent_is_the_per_row_ones():
    """The surrogate's sum gives ``_SourceValueShares`` one number for every row (a tensor of
    stride 0): its backward skips the per-edge gather and, for 1, the product; the gradients
    equal those of the same cotangent given row by row, bit for bit."""
    from sarc.backends.torch_blocks import _SourceValueShares
    gen = torch.Generator().manual_seed(17)
    n, e = 10, 70
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n - 2, (e,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, num_src=n, num_dst=n, dst_in_src=False)
    sc = torch.randn(e, 2, generator=gen)
    z = torch.randn(n, 2, 3, generator=gen)
    big_m = torch.full((n, 2), float("-inf")).index_reduce(0, dst, sc, "amax")
    big_m[n - 2:] = 0.0
    big_s = torch.zeros(n, 2, dtype=torch.float64).index_add(0, dst, torch.exp(sc - big_m[dst]).double())
    big_s[n - 2:] = 1.0
    grad, d = torch.randn(n, 2, 3, generator=gen), torch.randn(n, 2, dtype=torch.float64, generator=gen)

    def grads(cot):
        leaves = [sc.clone().requires_grad_(), z.clone().requires_grad_()]
        out = _SourceValueShares.apply(*leaves, big_m, big_s, grad, d, g)
        return torch.autograd.grad(out, leaves, cot)

    for value in (1.0, 2.5):
        constant = torch.full((), value, dtype=torch.float64).expand(n, 2)
        rows = torch.full((n, 2), value, dtype=torch.float64)
        assert not any(constant.stride()) and any(rows.stride())
        for a, b in zip(grads(constant), grads(rows)):
            assert torch.equal(a, b)
    varying = torch.randn(n, 2, dtype=torch.float64, generator=gen)
    assert not torch.equal(grads(varying)[1], grads(torch.ones(n, 2, dtype=torch.float64))[1])
