"""GAT (Velickovic et al., ICLR 2018): multi-head attention over incoming edges.

    z_u = W h_u  (per head)
    a_uv = softmax_{u -> v} leaky_relu(att_src . z_u + att_dst . z_v)
    h'_v = concat_heads sum_{u -> v} a_uv z_u + b

as PyG's GATConv and DGL's GATConv (heads concatenated, or averaged).
"""
import torch
import torch.nn.functional as F
from torch import nn

import sarc


class GATLayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int, heads: int = 1,
                 negative_slope: float = 0.2, attn_drop: float = 0.0, concat: bool = True):
        super().__init__(node={"h": in_feats})
        self.heads, self.out_feats, self.concat = heads, out_feats, concat
        self.negative_slope, self.attn_drop = negative_slope, attn_drop
        self.lin = nn.Linear(in_feats, heads * out_feats, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_feats))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_feats))
        self.bias = nn.Parameter(torch.zeros(heads * out_feats if concat else out_feats))
        nn.init.xavier_uniform_(self.lin.weight)
        sarc.glorot_(self.att_src)
        sarc.glorot_(self.att_dst)

    def message(self, src, dst, edge):
        z_u = self.lin(src.h).view(-1, self.heads, self.out_feats)
        z_v = self.lin(dst.h).view(-1, self.heads, self.out_feats)
        score = (z_u * self.att_src).sum(-1) + (z_v * self.att_dst).sum(-1)
        return {"z": z_u, "score": F.leaky_relu(score, self.negative_slope)}

    def reduce(self, msg):
        alpha = sarc.dropout(sarc.edge_softmax(msg.score), self.attn_drop)
        return sarc.sum(msg.z * alpha.unsqueeze(-1))

    def update(self, dst, agg):
        h = agg.agg.flatten(1) if self.concat else agg.agg.mean(1)
        return h + self.bias
