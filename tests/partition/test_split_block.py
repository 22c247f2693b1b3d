"""Split blocks (``dst_in_src=False``): a shard's block of edges from another shard's nodes."""
from __future__ import annotations

import pytest
import torch

import sarc
from sarc import Graph
from sarc.errors import GraphError


def test_split_block():
    """A block whose dst nodes are not src nodes: any num_dst, kept apart from the src rows."""
    b = Graph.from_edges([0, 1, 1], [4, 0, 4], num_src=2, num_dst=5, dst_in_src=False)
    assert (b.num_src, b.num_dst, b.num_edges) == (2, 5, 3) and not b.dst_in_src
    assert b.in_degree.tolist() == [1, 0, 0, 0, 2] and b.out_degree.tolist() == [1, 2]
    assert "dst_in_src=False" in repr(b) and not b.to("cpu").dst_in_src
    assert Graph.from_edges([0], [0], num_src=1, num_dst=1).dst_in_src
    with pytest.raises(GraphError, match="dst_in_src=False"):
        Graph.from_edges([0, 1], [4, 0], num_src=2, num_dst=5)


def test_a_layer_does_not_run_on_a_split_block():
    class Sum(sarc.Layer):
        def __init__(self):
            super().__init__(node={"h": 3})

        def message(self, src, dst, edge):
            return src.h

        def reduce(self, msg):
            return sarc.sum(msg.m)

        def update(self, dst, agg):
            return agg.agg

    b = Graph.from_edges([0, 1], [2, 0], num_src=2, num_dst=3, dst_in_src=False)
    with pytest.raises(GraphError, match="split block"):
        Sum()(b, torch.randn(2, 3))
