"""GIN (Xu et al., ICLR 2019): sum aggregation and an MLP.

    h'_v = MLP((1 + eps) h_v + sum_{u -> v} h_u)

as PyG's GINConv and DGL's GINConv("sum"); eps fixed or learned.
"""
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.modules import input_dropout


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


class GIN(nn.Module):
    """Two GIN layers (each a 2-layer MLP) with ReLU and dropout, for node classification."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, dropout: float = 0.5,
                 eps: float = 0.0, train_eps: bool = False):
        super().__init__()
        self.conv1 = GINLayer(in_feats, hidden, hidden, eps, train_eps)
        self.conv2 = GINLayer(hidden, hidden, num_classes, eps, train_eps)
        self.dropout = dropout

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)


# GIN (Xu et al.) is a graph-classification model (hidden 64, dropout 0.5, lr 0.01 there);
# for full-batch node classification on Cora these follow it with GCN's L2 and epochs.
# Sum aggregation: no self loops ((1 + eps) h_v is the self term).
HPARAMS = {
    "dataset": "cora",
    "hidden": 64,
    "dropout": 0.5,
    "eps": 0.0,
    "train_eps": False,
    "lr": 0.01,
    "weight_decay": 5e-4,
    "epochs": 200,
    "self_loops": False,
    "norm_features": True,
}


def build_model(in_feats: int, num_classes: int, hidden: int = 64, dropout: float = 0.5,
                eps: float = 0.0, train_eps: bool = False, **_) -> nn.Module:
    return GIN(in_feats, hidden, num_classes, dropout, eps, train_eps)


if __name__ == "__main__":
    from sarc.train import script_main
    script_main(globals())
