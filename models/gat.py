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
from sarc.modules import input_dropout


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


class GAT(nn.Module):
    """Velickovic et al.'s transductive model: dropout -> GAT (heads concatenated) -> ELU
    -> dropout -> GAT (output heads averaged); attention coefficients dropped too."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, heads: int = 8,
                 out_heads: int = 1, dropout: float = 0.6, attn_drop: float = 0.6,
                 negative_slope: float = 0.2):
        super().__init__()
        self.conv1 = GATLayer(in_feats, hidden, heads, negative_slope, attn_drop, concat=True)
        self.conv2 = GATLayer(hidden * heads, num_classes, out_heads, negative_slope, attn_drop,
                              concat=False)
        self.dropout = dropout

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.elu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)


# Velickovic et al. (ICLR 2018), Cora: 8 heads x 8 hidden units, ELU, one output head,
# dropout 0.6 on both layers' inputs and on the attention coefficients, Adam lr 0.005,
# L2 5e-4, row-normalized features, self loops, early stopping with patience 100 on
# validation loss and accuracy (the paper trains up to 100k epochs; it stops within a
# few hundred), model selected on validation.
HPARAMS = {
    "dataset": "cora",
    "hidden": 8,
    "heads": 8,
    "out_heads": 1,
    "dropout": 0.6,
    "attn_drop": 0.6,
    "lr": 0.005,
    "weight_decay": 5e-4,
    "epochs": 1000,
    "patience": 100,
    "self_loops": True,
    "norm_features": True,
}


def build_model(in_feats: int, num_classes: int, hidden: int = 8, heads: int = 8,
                out_heads: int = 1, dropout: float = 0.6, attn_drop: float = 0.6, **_) -> nn.Module:
    return GAT(in_feats, hidden, num_classes, heads, out_heads, dropout, attn_drop)


if __name__ == "__main__":
    from sarc.train import script_main
    script_main(globals())
