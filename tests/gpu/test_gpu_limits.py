"""Sizes where a GPU launch breaks and an interpreter run does not: more than 65535 row
blocks of one relation in RGCN's per-edge typed product, and more than 65535 relations (grid
axes 1 and 2 stop at 65535; see tests/backends/triton/test_triton_grids.py), an 8M-row node x
relation table, a column-major input whose offsets pass 2^31 elements, a hub of 100k
in-edges, and many rows without in-edges. Each against the PyTorch backend on the same GPU,
outputs and every gradient."""
from __future__ import annotations

import copy

import pytest
import torch
from difftest import assert_close
from gpu_check import (CUDA, LONG_SUM_RTOL, compare, graph, kernel_modules, needs_gpu, on_backend,
                       on_gpu)
from rgcn import RGCNLayer
from zoo import LAYERS, features

import sarc

pytestmark = [pytest.mark.gpu, needs_gpu]

CUDA_OTHER_AXES = 65535
TYPED_PRODUCT_RTOL = 1e-3
"""The weight gradient sums 8M products per relation (~1e-4 of float32 rounding in either
order); a row block launched wrong, or a 32-bit offset that wraps, is off by O(1)."""
MODELS = ["gcn", "sage", "gat_4heads_concat", "gin", "rgcn"]
HUB = 100_000
"""In-edges of the hub node."""
ZERO_IN = (50_000, 10_000, 200_000)
"""(nodes, nodes with in-edges, edges) of the graph whose other rows have none."""


def _typed_linear_modules(layer: sarc.Layer) -> list:
    """The per-edge typed product's generated modules (those with a launch ``grid``)."""
    op = next(o for o in layer.compiled().ops if type(o).__name__ == "TypedAggregateOp")
    return [m for m in kernel_modules(op.linear) if hasattr(m, "grid")]


def test_rgcn_typed_product_over_65535_row_blocks_of_one_relation():
    """One relation holds more rows than 65535 blocks of the largest BLOCK_M: every config
    the autotuner may pick launches more than 65535 programs on the row axis. Nodes x
    relations exceed the edges, so the product runs per edge (the segment GEMM)."""
    feats = 8
    layer = RGCNLayer(feats, 8, num_rels=2).to(CUDA).set_backend("triton")
    modules = _typed_linear_modules(layer)
    assert modules
    block_m = max(c.kwargs["BLOCK_M"] for m in modules for c in m.CONFIGS)
    rows = CUDA_OTHER_AXES * block_m + 4096
    gen = torch.Generator().manual_seed(0)
    other = rows // 100  # the second relation's rows
    e = rows + other
    n = e  # 2 n > e: per edge
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    etype = torch.cat([torch.zeros(rows, dtype=torch.long), torch.ones(other, dtype=torch.long)])
    etype = etype[torch.randperm(e, generator=gen)]
    g = graph(src, dst, n)
    from sarc.backends.triton_runtime import type_groups
    groups = type_groups(etype.to(CUDA), 2)
    assert groups.max_count == rows
    for m in modules:
        for c in m.CONFIGS:
            assert m.grid(groups, 8, c.kwargs)[0] > CUDA_OTHER_AXES
    feats = {"h": torch.randn(n, feats, generator=gen), "etype": etype,
             "norm": torch.rand(e, generator=gen) + 0.1}
    compare(layer, g, on_gpu(feats), rtol=TYPED_PRODUCT_RTOL)


def test_rgcn_node_by_relation_table_of_8m_rows():
    """1M nodes x 8 relations, 8.4M edges: the product runs over the node x relation table
    (8M rows, the size whose typed product once failed to launch), aggregated per
    destination and, in the backward pass, per table row (the typed graph's CSC view)."""
    n, rels, e = 1_000_000, 8, 8_400_000
    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    g = graph(src, dst, n)
    assert n * rels <= e
    layer = RGCNLayer(8, 8, num_rels=rels).to(CUDA)
    feats = {"h": torch.randn(n, 8, generator=gen),
             "etype": torch.randint(0, rels, (e,), generator=gen),
             "norm": torch.rand(e, generator=gen) + 0.1}
    compare(layer, g, on_gpu(feats), rtol=TYPED_PRODUCT_RTOL)


def _hub_graph(hub: int, seed: int = 0) -> sarc.Graph:
    """Node 0 has ``hub`` in-edges from distinct nodes, the others ~2 random in-edges each,
    and the last 10% of the nodes none."""
    gen = torch.Generator().manual_seed(seed)
    n, rest = hub + hub // 2, 3 * hub
    src = torch.cat([torch.arange(1, hub + 1), torch.randint(0, n, (rest,), generator=gen)])
    dst = torch.cat([torch.zeros(hub, dtype=torch.long),
                     torch.randint(0, n - n // 10, (rest,), generator=gen)])
    return graph(src, dst, n)


@pytest.mark.parametrize("model", MODELS)
def test_a_hub_of_100k_in_edges(model):
    g = _hub_graph(HUB)
    assert int(g.in_degree[0]) >= HUB
    layer = LAYERS[model](16).to(CUDA)
    compare(layer, g, on_gpu(features(layer, g, 16)), rtol=LONG_SUM_RTOL)


@pytest.mark.parametrize("model", MODELS)
def test_rows_without_in_edges(model):
    """40k of 50k nodes have no in-edges: their aggregates are 0, and GCN's and GAT's
    outputs there are the bias alone."""
    n, receivers, e = ZERO_IN
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, receivers, (e,), generator=gen)
    g = graph(src, dst, n)
    layer = LAYERS[model](16).to(CUDA)
    feats = on_gpu(features(layer, g, 16))
    tri = compare(layer, g, feats)
    if model in ("gcn", "gat_4heads_concat"):
        with torch.no_grad():
            out = tri(g, **feats)
        bias = tri.bias.detach().expand(n - receivers, -1)
        assert torch.equal(out[receivers:], bias)


def test_rgcn_of_more_types_than_grid_axis_1_holds():
    """70000 relations (a knowledge graph's): the typed product's types share grid axis 0
    with its row blocks (axes 1 and 2 stop at 65535)."""
    rels, n, e = 70_000, 2_000, 300_000
    gen = torch.Generator().manual_seed(2)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    layer = RGCNLayer(4, 4, num_rels=rels).to(CUDA)
    feats = {"h": torch.randn(n, 4, generator=gen),
             "etype": torch.randint(0, rels, (e,), generator=gen),
             "norm": torch.rand(e, generator=gen) + 0.1}
    compare(layer, graph(src, dst, n), on_gpu(feats), rtol=TYPED_PRODUCT_RTOL)


@pytest.mark.parametrize("model", ["gcn", "gat_4heads_concat", "rgcn"])
def test_a_column_major_input_whose_columns_lie_past_2_31_elements(model):
    """A feature matrix in column-major order (``torch.from_numpy`` of a Fortran-order
    array, ``X.t()``), its columns 2^31 - 8 elements apart: column 2 starts past 2^31
    elements, where an int32 index times the stride wraps (17 GB of GPU memory)."""
    stride, n, f = 2**31 - 8, 3000, 3
    gen = torch.Generator().manual_seed(3)
    base = torch.full((2 * stride + n + 64,), 999.0, device=CUDA)
    x = base.as_strided((n, f), (1, stride), storage_offset=32)
    x.copy_(torch.randn(n, f, generator=gen))
    e = 4 * n
    g = graph(torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen), n)
    feats = {**features(LAYERS[model](f), g.to("cpu"), f), "h": x}
    feats = {k: v if k == "h" else v.to(CUDA) for k, v in feats.items()}
    layer = LAYERS[model](f).to(CUDA)
    tri, ref = on_backend(copy.deepcopy(layer), "triton"), on_backend(copy.deepcopy(layer), "torch")
    out_t, out_r = tri(g, **feats), ref(g, **feats)
    assert_close(out_t, out_r, 1e-5, "output")
    out_t.square().sum().backward()
    out_r.square().sum().backward()
    for (name, p_t), p_r in zip(tri.named_parameters(), ref.parameters()):
        assert_close(p_t.grad, p_r.grad, LONG_SUM_RTOL, f"grad of {name}")
    del base
