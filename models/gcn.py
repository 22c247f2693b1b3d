"""GCN (Kipf & Welling, ICLR 2017): symmetric normalization.

    h'_v = sum_{u -> v} h_u W / sqrt(deg_out(u) * deg_in(v)) + b

Degrees count the graph's edges, self loops included when the graph has them
(the training script adds them), as DGL's GraphConv(norm="both") and, on
symmetric graphs, PyG's GCNConv.
"""
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.modules import input_dropout


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


class GCN(nn.Module):
    """Kipf & Welling's node classifier: dropout -> GCN -> ReLU -> dropout -> GCN."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, dropout: float = 0.5):
        super().__init__()
        self.conv1 = GCNLayer(in_feats, hidden)
        self.conv2 = GCNLayer(hidden, num_classes)
        self.dropout = dropout

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)


# Kipf & Welling (ICLR 2017), Cora: 16 hidden units, dropout 0.5, Adam lr 0.01,
# L2 5e-4, 200 epochs, row-normalized features, A + I with symmetric normalization.
# Two departures: the paper puts the L2 penalty on the first layer only (here Adam's
# weight decay covers both, as in DGL's example), and it stops early on validation loss
# (window 10) where sarc.train selects the epoch of best validation accuracy.
HPARAMS = {
    "dataset": "cora",
    "hidden": 16,
    "dropout": 0.5,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "epochs": 200,
    "self_loops": True,
    "norm_features": True,
}


def build_model(in_feats: int, num_classes: int, hidden: int = 16, dropout: float = 0.5,
                **_) -> nn.Module:
    return GCN(in_feats, hidden, num_classes, dropout)


if __name__ == "__main__":
    from sarc.train import script_main
    script_main(globals())
