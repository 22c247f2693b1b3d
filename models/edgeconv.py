"""EdgeConv (Wang et al., "Dynamic Graph CNN", 2019), as DGL's EdgeConv computes it:

    h'_v = max_{u -> v} theta(h_v - h_u) + phi(h_v)

(the paper's theta(h_u - h_v) up to theta's sign). The message reads both ends; ``theta``
is linear, so the compiler computes it at the nodes, ``(theta h)_v - (theta h)_u``
(``sarc.ir.passes.linear_through_aggregate``), and the edges carry its output, not h.
"""
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.modules import input_dropout


class EdgeConvLayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int):
        super().__init__(node={"h": in_feats})
        self.theta = nn.Linear(in_feats, out_feats)
        self.phi = nn.Linear(in_feats, out_feats)

    def message(self, src, dst, edge):
        return self.theta(dst.h - src.h) + self.phi(dst.h)

    def reduce(self, msg):
        return sarc.max(msg.m)


class EdgeConvNet(nn.Module):
    """Two EdgeConv layers with ReLU and dropout, for node classification."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, dropout: float = 0.5):
        super().__init__()
        self.conv1 = EdgeConvLayer(in_feats, hidden)
        self.conv2 = EdgeConvLayer(hidden, num_classes)
        self.dropout = dropout

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)


# DGCNN classifies point clouds on k-nearest-neighbour graphs; for full-batch node
# classification on Cora these follow GCN's (Kipf & Welling) training settings. Self loops:
# a node's own term, phi(h_v), stands in every max (theta of a loop is theta's bias).
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
    return EdgeConvNet(in_feats, hidden, num_classes, dropout)


if __name__ == "__main__":
    from sarc.train import script_main
    script_main(globals())
