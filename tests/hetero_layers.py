"""Relation layers of the heterogeneous-model tests (``tests/dsl/test_hetero.py``,
``tests/distributed/test_hetero.py``): a mean, a degree-normed weighted sum and a max,
each reading what a relation's sub-graph changes (its edges, its degrees)."""
from __future__ import annotations

import torch
from torch import nn

import sarc


class MeanLayer(sarc.Layer):
    """GraphSAGE-mean: W_n mean(h_u) + b + W_s h_v."""

    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.neigh, self.root = nn.Linear(i, o), nn.Linear(i, o, bias=False)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.neigh(agg.agg) + self.root(dst.h)


class NormSumLayer(sarc.Layer):
    """GCN's symmetric norm with the relation's degrees: sum W h_u / sqrt(d_u d_v), an
    edge weight w on each edge."""

    def __init__(self, i, o):
        super().__init__(node={"h": i}, edge={"w": ()})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        norm = (src.out_degree.clamp(min=1) * dst.in_degree.clamp(min=1)) ** -0.5
        return self.lin(src.h) * (norm * edge.w).unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class MaxLayer(sarc.Layer):
    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return torch.tanh(self.lin(src.h))

    def reduce(self, msg):
        return sarc.max(msg.m)
