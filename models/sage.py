"""GraphSAGE with mean aggregation (Hamilton et al., NeurIPS 2017).

    h'_v = W_neigh mean_{u -> v} h_u + b + W_self h_v

as PyG's SAGEConv(aggr="mean") and DGL's SAGEConv("mean").
"""
from torch import nn

import sarc


class SAGELayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int):
        super().__init__(node={"h": in_feats})
        self.lin_neigh = nn.Linear(in_feats, out_feats, bias=True)
        self.lin_self = nn.Linear(in_feats, out_feats, bias=False)

    def message(self, src, dst, edge):
        return src.h

    def reduce(self, msg):
        return sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.lin_neigh(agg.agg) + self.lin_self(dst.h)
