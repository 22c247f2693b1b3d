"""The typed product (``sum_e w_e x[src e] @ W[t_e]``, R-GCN's message) on the Triton backend:
``triton_runtime.TypedAggregateOp`` runs it over a node x type table where nodes x types are
no more than edges, per edge otherwise; both against the PyTorch backend (values and every
gradient), sum and mean, with and without edge weights and bases, half precision; what the
op keeps for the backward pass; type ids out of range; type ids changed in place."""
from __future__ import annotations

import pytest
import torch
from triton_check import compare, set_backend

import sarc
from sarc.backends import triton_runtime

REDUCE = {"sum": sarc.sum, "mean": sarc.mean}


class Typed(sarc.Layer):
    """``kind_e (x[src e] @ W[t_e]) [* w_e]``, W maybe from bases."""

    def __init__(self, kind: str, d: int, out: int, types: int, bases: int | None = None,
                 weighted: bool = True, dtype: str = "f32"):
        edge = {"etype": sarc.INDEX, **({"w": sarc.Feature((), dtype)} if weighted else {})}
        super().__init__(node={"h": sarc.Feature((d,), dtype)}, edge=edge)
        self.kind, self.weighted = kind, weighted
        self.rel = sarc.TypedLinear(d, out, types, bases)

    def message(self, src, dst, edge):
        m = self.rel(src.h, edge.etype)
        return m * edge.w.unsqueeze(-1) if self.weighted else m

    def reduce(self, msg):
        return REDUCE[self.kind](msg.m)


def _graph(nodes: int, edges: int, seed: int = 0) -> sarc.Graph:
    gen = torch.Generator().manual_seed(seed)
    return sarc.Graph.from_edges(torch.randint(0, nodes, (edges,), generator=gen),
                                 torch.randint(0, nodes, (edges,), generator=gen), nodes)


# (nodes, edges, types): the table has nodes x types rows
SIZES = {"table": (20, 150, 4), "edges": (40, 60, 5)}


def _feats(g, d, types, dtype=torch.float32, weighted=True, seed=1):
    gen = torch.Generator().manual_seed(seed)
    feats = {"h": torch.randn(g.num_src, d, generator=gen).to(dtype),
             "etype": torch.randint(0, types, (g.num_edges,), generator=gen)}
    if weighted:
        feats["w"] = (torch.rand(g.num_edges, generator=gen) + 0.1).to(dtype)
    return feats


@pytest.fixture
def ways(monkeypatch):
    """Which way each call of the op took: "table" or "edges"."""
    taken: list[str] = []
    table, rows = triton_runtime.typed_graph, triton_runtime.typed_rows

    def by_table(*a, **k):
        taken.append("table")
        return table(*a, **k)

    def by_edge(*a, **k):
        taken.append("edges")
        return rows(*a, **k)

    monkeypatch.setattr(triton_runtime, "typed_graph", by_table)
    monkeypatch.setattr(triton_runtime, "typed_rows", by_edge)
    return taken


@pytest.mark.parametrize("way", sorted(SIZES))
@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("bases", [None, 2])
@pytest.mark.parametrize("weighted", [True, False])
def test_typed_product_both_ways_equal_the_torch_backend(way, kind, bases, weighted, ways):
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    compare(Typed(kind, 6, 5, types, bases, weighted), g, _feats(g, 6, types, weighted=weighted))
    assert ways and set(ways) == {way}  # forward and, for the weights' gradient, backward


@pytest.mark.parametrize("way", sorted(SIZES))
def test_typed_product_on_a_block_and_rows_without_edges(way, ways):
    """A block (fewer dst than src rows) whose last dst rows have no in-edges."""
    nodes, edges, types = SIZES[way]
    gen = torch.Generator().manual_seed(2)
    src = torch.randint(0, nodes, (edges,), generator=gen)
    dst = torch.randint(0, nodes // 2 - 3, (edges,), generator=gen)
    g = sarc.Graph.from_edges(src, dst, num_src=nodes, num_dst=nodes // 2)
    compare(Typed("mean", 7, 3, types), g, _feats(g, 7, types))
    assert set(ways) == {way}


HALF = {"f16": (torch.float16, 5e-3), "bf16": (torch.bfloat16, 3e-2)}


@pytest.mark.parametrize("way", sorted(SIZES))
@pytest.mark.parametrize("dtype", sorted(HALF))
def test_typed_product_in_half_precision(way, dtype, ways):
    """Parameters and features in the low precision; the product is summed in float32
    (the table kept in float32) and rounded once: within the precision's error of the float32
    layer on the same rounded inputs."""
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    torch_dtype, rtol = HALF[dtype]
    half = Typed("sum", 16, 8, types, dtype=dtype).to(torch_dtype)
    ref = Typed("sum", 16, 8, types)
    ref.load_state_dict({k: v.float() for k, v in half.state_dict().items()})
    feats = _feats(g, 16, types, torch_dtype)
    tri = compare(half, g, feats, rtol=rtol, reference=ref,
                  ref_feats={k: v.float() if v.is_floating_point() else v
                             for k, v in feats.items()})
    assert set(ways) == {way}
    assert tri(g, **feats).dtype == torch_dtype


@pytest.mark.parametrize("way", sorted(SIZES))
def test_the_op_keeps_its_operands_only(way):
    """No node x type table and no E x D rows are kept for the backward pass: what the
    op's autograd node saves is its operands (x, w, W, the type ids)."""
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    layer = set_backend(Typed("sum", 6, 5, types), "triton")
    feats = {k: v.requires_grad_(v.is_floating_point()) for k, v in _feats(g, 6, types).items()}
    y = layer(g, **feats)
    node = y.grad_fn
    while type(node).__name__ != "_TypedAggregateFunctionBackward":
        node = node.next_functions[0][0]
    saved = sorted(tuple(t.shape) for t in node.saved_tensors)
    assert saved == sorted([(nodes, 6), (edges,), (types, 6, 5), (edges,)])


@pytest.mark.parametrize("way", sorted(SIZES))
@pytest.mark.parametrize("bad", [-1, "types"])
def test_type_ids_out_of_range_are_an_error_either_way(way, bad):
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    layer = set_backend(Typed("sum", 6, 5, types), "triton")
    feats = _feats(g, 6, types)
    feats["etype"][edges // 2] = types if bad == "types" else bad
    with pytest.raises(ValueError, match=r"feature 'etype' holds type ids in \[-?\d+, \d+\], "
                                         rf"but it indexes parameter '[\w.]+' of {types} rows"):
        layer(g, **feats)


def test_type_ids_changed_in_place_are_read_again():
    """The node x type graph is cached per graph and type-id tensor; writing the ids in
    place (a new tensor version) builds it again."""
    nodes, edges, types = SIZES["table"]
    g = _graph(nodes, edges)
    tri = set_backend(Typed("sum", 6, 5, types), "triton")
    ref = set_backend(Typed("sum", 6, 5, types), "torch")
    ref.load_state_dict(tri.state_dict())
    feats = _feats(g, 6, types)
    torch.testing.assert_close(tri(g, **feats), ref(g, **feats))
    feats["etype"].copy_(torch.randint(0, types, (edges,), generator=torch.Generator()
                                       .manual_seed(9)))
    torch.testing.assert_close(tri(g, **feats), ref(g, **feats))


@pytest.mark.parametrize("way", sorted(SIZES))
def test_what_the_type_ids_give_is_built_once_for_a_graph_and_its_type_ids(way, monkeypatch):
    """Steps on one graph with the same type-id tensor build the node x type graph (and its
    views) or the rows' type groups once: the layer's binding hands the op the same
    permuted ids each call (``graph.derived``)."""
    nodes, edges, types = SIZES[way]
    g = _graph(nodes, edges)
    layer = set_backend(Typed("sum", 6, 5, types), "triton")
    feats = _feats(g, 6, types)
    built = []
    real = triton_runtime.check_types  # called when the graph or the groups are built
    monkeypatch.setattr(triton_runtime, "check_types", lambda *a: built.append(1) or real(*a))
    for _ in range(3):
        layer(g, **feats).sum().backward()
    assert len(built) == 1
    feats["etype"] = feats["etype"].clone()  # another tensor: built again
    layer(g, **feats)
    assert len(built) == 2
