"""Relation layers of the heterogeneous-model tests (``tests/dsl/test_hetero.py``,
``tests/distributed/test_hetero.py``, ``tests/sampling/test_hetero.py``): a mean, a
degree-normed weighted sum, a max and a sum by the sources' in-degrees, each reading what
a relation's sub-graph changes (its edges, its degrees); a typed model of them and a
random typed graph."""
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


class InDegreeLayer(sarc.Layer):
    """A sum weighted by the source's in-degree in the relation (``src.in_degree``)."""

    def __init__(self, i, o):
        super().__init__(node={"h": i})
        self.lin = nn.Linear(i, o)

    def message(self, src, dst, edge):
        return self.lin(src.h) / (1.0 + src.in_degree).unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)


class TypedNet(nn.Module):
    """A ``TypedInput``, then a ``HeteroConv`` (sum) of the relation layers ``kinds`` (one
    per relation; an edge weight ``w`` to those that read it) and one (mean) of means.
    ``typed=False``: the convs without node types (every relation counts for every node);
    ``dst_types``: the convs' (a relation without edges)."""

    def __init__(self, kinds, widths: dict, hidden: int, classes: int, typed: bool = True,
                 dst_types: dict | None = None):
        super().__init__()
        self.typed = typed
        self.input = sarc.TypedInput(widths, hidden)
        self.conv1 = sarc.HeteroConv({r: k(hidden, hidden) for r, k in enumerate(kinds)}, "sum",
                                     dst_types=dst_types)
        self.conv2 = sarc.HeteroConv({r: MeanLayer(hidden, classes) for r in range(len(kinds))},
                                     "mean", dst_types=dst_types)

    def forward(self, g, x, etype, ntype, w):
        types = ntype if self.typed else None
        h = torch.relu(self.input(x, ntype))
        h = torch.relu(self.conv1(g, h, etype=etype, ntype=types, w=w))
        return self.conv2(g, h, etype=etype, ntype=types)


def typed_graph(n: int, e: int, relations: int, widths: dict, classes: int, *, seed: int,
                isolated: int, train: float) -> dict:
    """A random graph of two node types whose relation r goes into node type r % 2; type t's
    features in its first ``widths[t]`` columns; the last ``isolated`` nodes have no edges;
    an edge weight ``w``, labels and a training mask of about ``train`` of the nodes."""
    gen = torch.Generator().manual_seed(seed)
    ntype = torch.randint(0, 2, (n,), generator=gen)
    etype = torch.randint(0, relations, (e,), generator=gen)
    src = torch.randint(0, n - isolated, (e,), generator=gen)
    dst = torch.empty(e, dtype=torch.int64)
    for t in (0, 1):
        into = torch.nonzero(ntype[:n - isolated] == t).squeeze(1)
        rows = torch.nonzero(etype % 2 == t).squeeze(1)
        dst[rows] = into[torch.randint(0, into.numel(), (rows.numel(),), generator=gen)]
    feat = torch.randn(n, max(widths.values()), generator=gen)
    for t, w in widths.items():
        feat[ntype == t, w:] = 0.0
    return {"src": src, "dst": dst, "etype": etype, "w": torch.rand(e, generator=gen),
            "ntype": ntype, "feat": feat,
            "label": torch.randint(0, classes, (n,), generator=gen),
            "train_mask": torch.rand(n, generator=gen) < train}
