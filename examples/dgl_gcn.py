"""A sarc model file built from DGL's GraphConv: `sarc train examples/dgl_gcn.py` (one
process) or `--workers P` trains it; `sarc compile` prints its IR and plan."""
import torch.nn.functional as F
from dgl.nn.pytorch import GraphConv
from torch import nn

from sarc.frontends.dgl import from_dgl_module


class GCN(nn.Module):
    def __init__(self, in_feats, hidden, num_classes):
        super().__init__()
        self.conv1 = from_dgl_module(GraphConv(in_feats, hidden, activation=F.relu),
                                     node={"feat": in_feats})
        self.conv2 = from_dgl_module(GraphConv(hidden, num_classes), node={"feat": hidden})

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x))


HPARAMS = {"dataset": "cora", "hidden": 16, "lr": 0.01, "weight_decay": 5e-4, "epochs": 200,
           "self_loops": True, "norm_features": True}


def build_model(in_feats, num_classes, hidden=16, **_):
    return GCN(in_feats, hidden, num_classes)
