"""GCN (Kipf & Welling, ICLR 2017): symmetric normalization.

    h'_v = sum_{u -> v} h_u W / sqrt(deg_out(u) * deg_in(v)) + b

Degrees count the graph's edges, self loops included when the graph has them
(the training script adds them), as DGL's GraphConv(norm="both") and, on
symmetric graphs, PyG's GCNConv.
"""
import torch
from torch import nn

import sarc


class GCNLayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int, bias: bool = True):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        nn.init.xavier_uniform_(self.lin.weight)

    def message(self, src, dst, edge):
        return self.lin(src.h) * src.out_degree.clamp_min(1).rsqrt().unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        h = agg.agg * dst.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)
        return h + self.bias if self.bias is not None else h
