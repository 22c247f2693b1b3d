"""R-GCN (Schlichtkrull et al., ESWC 2018): a weight per relation, a parameterized message.

    h'_v = sum_{u -r-> v} norm_e W_r h_u + W_root h_v + b,
    W_r = sum_b comp[r, b] V_b   (with num_bases)

``norm`` is an edge feature: 1 / |N_r(v)| gives PyG's RGCNConv (mean per
relation), any per-edge weight gives DGL's RelGraphConv(norm=...). sarc finds
the per-relation weights inside the message; no annotation is needed.
"""
import torch
from torch import nn

import sarc


class RGCNLayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int, num_rels: int,
                 num_bases: int | None = None, bias: bool = True):
        super().__init__(node={"h": in_feats}, edge={"etype": sarc.INDEX, "norm": ()})
        self.rel = sarc.TypedLinear(in_feats, out_feats, num_rels, num_bases)
        self.root = nn.Linear(in_feats, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None

    def message(self, src, dst, edge):
        return self.rel(src.h, edge.etype) * edge.norm.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        h = agg.agg + self.root(dst.h)
        return h + self.bias if self.bias is not None else h
