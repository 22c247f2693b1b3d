"""GIN (Xu et al., ICLR 2019): sum aggregation and an MLP.

    h'_v = MLP((1 + eps) h_v + sum_{u -> v} h_u)

as PyG's GINConv and DGL's GINConv("sum"); eps fixed or learned.
"""
import torch
from torch import nn

import sarc


class GINLayer(sarc.Layer):
    def __init__(self, in_feats: int, hidden: int, out_feats: int, eps: float = 0.0,
                 train_eps: bool = False):
        super().__init__(node={"h": in_feats})
        self.mlp = nn.Sequential(nn.Linear(in_feats, hidden), nn.ReLU(), nn.Linear(hidden, out_feats))
        if train_eps:
            self.eps = nn.Parameter(torch.tensor([eps]))
        else:
            self.eps = eps

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return self.mlp((1 + self.eps) * dst.h + agg.agg)
