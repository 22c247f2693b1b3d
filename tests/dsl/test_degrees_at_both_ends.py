"""Both degrees at both ends of an edge: ``src.in_degree`` and ``dst.out_degree`` beside
``src.out_degree`` and ``dst.in_degree`` (DGL's SGConv, TAGConv and GCN2Conv scale source
features by in-degrees), against torch and the interpreter on every backend; a block whose
sources are not its destinations knows its sources' in-degrees only where it is built with
them (``src_in_degree``, as sarc's mini-batch blocks are), refused otherwise."""
from __future__ import annotations

import pytest
import torch
from difftest import BACKENDS, assert_close, check_layer, random_block
from torch import nn

import sarc
from sarc.errors import GraphError


class BothEnds(sarc.Layer):
    def __init__(self):
        super().__init__(node={"h": 4})
        self.lin = nn.Linear(4, 3)

    def message(self, src, dst, edge):
        scale = src.in_degree.clamp_min(1).rsqrt() * (1 + dst.out_degree)
        return self.lin(src.h) * scale.unsqueeze(-1) + src.out_degree.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg * dst.in_degree.unsqueeze(-1) + dst.out_degree.unsqueeze(-1)


class DestinationFirst(BothEnds):
    """Reads dst.in_degree before src.in_degree (the traced inputs' order, DGL's SGConv's)."""

    def message(self, src, dst, edge):
        scale = dst.in_degree.clamp_min(1).rsqrt() * src.in_degree.clamp_min(1).rsqrt()
        return self.lin(src.h) * scale.unsqueeze(-1)


def _graph():
    """Self loops, a hub (node 0), nodes 5 and 6 without in-edges, node 7 without any edge."""
    src = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 0, 2, 2, 1])
    dst = torch.tensor([1, 2, 3, 4, 0, 0, 0, 0, 3, 2, 1, 1])
    return src, dst, 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_degrees_at_both_ends_equal_torch(backend):
    src, dst, n = _graph()
    g = sarc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    layer = BothEnds().set_backend(backend)
    indeg = torch.bincount(dst, minlength=n).float()
    outdeg = torch.bincount(src, minlength=n).float()
    with torch.no_grad():
        scale = indeg[src].clamp_min(1).rsqrt() * (1 + outdeg[dst])
        m = layer.lin(x[src]) * scale[:, None] + outdeg[src][:, None]
        want = torch.zeros(n, 3).index_add(0, dst, m) * indeg[:, None] + outdeg[:, None]
    assert_close(layer(g, x), want, 1e-6, "output")
    check_layer(layer, g, {"h": x})


def test_source_in_degrees_on_a_block_with_other_sources_are_refused():
    g = random_block(torch.Generator().manual_seed(1), 9, 5, 30)
    with pytest.raises(GraphError, match=r"BothEnds reads the in-degree of source nodes .* "
                                         r"it has 9 sources for 5 destinations.*src_in_degree="):
        BothEnds()(g, torch.randn(9, 4))


@pytest.mark.parametrize("layer_class", [BothEnds, DestinationFirst])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_block_built_with_its_sources_in_degrees_is_the_whole_graphs_rows(backend, layer_class):
    """The block of the first nodes' in-edges, built with the whole graph's degrees, gives
    the whole graph's output rows of those nodes (an MFG block's exactness)."""
    src, dst, n = _graph()
    g = sarc.Graph.from_edges(src, dst, n)
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(2))
    layer = layer_class().set_backend(backend)
    num_dst = 4                                  # nodes 0..3, and every source of their edges
    into = dst < num_dst
    b = sarc.Graph.from_edges(src[into], dst[into], num_src=n, num_dst=num_dst,
                              in_degree=g.in_degree[:num_dst], out_degree=g.out_degree,
                              src_in_degree=g.in_degree)
    assert_close(layer(b, x), layer(g, x)[:num_dst], 1e-6, "output")
    check_layer(layer, b, {"h": x})
