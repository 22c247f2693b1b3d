"""Layers the distributed tests add to the zoo: max / min reductions (with ties)."""
from __future__ import annotations

import torch
from torch import nn

import sarc


class MaxLayer(sarc.Layer):
    """GraphSAGE-pool-like: max (or min) over incoming edges of relu(W h_u - 0.3)."""

    def __init__(self, in_feats: int, out_feats: int, kind: str = "max"):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)
        self.kind = kind

    def message(self, src, dst, edge):
        return torch.relu(self.lin(src.h) - 0.3)

    def reduce(self, msg):
        return sarc.max(msg.m) if self.kind == "max" else sarc.min(msg.m)

    def update(self, dst, agg):
        return agg.agg + dst.h.sum(-1, keepdim=True)


class TiedMaxLayer(sarc.Layer):
    """max over incoming edges of ``scale * h_u``: with integer-valued features, many edges
    tie for the maximum, across blocks too, and every tied edge's source gets a share of the
    gradient (ties split evenly)."""

    def __init__(self, in_feats: int):
        super().__init__(node={"h": in_feats})
        self.scale = nn.Parameter(torch.full((in_feats,), 1.5))

    def message(self, src, dst, edge):
        return src.h * self.scale

    def reduce(self, msg):
        return sarc.max(msg.m)
