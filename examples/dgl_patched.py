"""A sarc model file of DGL's convs as a DGL script writes them: after
``sarc.frontends.dgl.patch()`` each conv runs through sarc by itself when called on a sarc
graph. `sarc compile` and `sarc train` (any mode, one process or `--workers P`) treat it as
examples/dgl_gcn.py, which wraps each conv with ``from_dgl_module``."""
import torch.nn.functional as F
from dgl.nn.pytorch import GraphConv
from torch import nn

import sarc.frontends.dgl

sarc.frontends.dgl.patch()


class GCN(nn.Module):
    def __init__(self, in_feats, hidden, num_classes):
        super().__init__()
        self.conv1 = GraphConv(in_feats, hidden, activation=F.relu)
        self.conv2 = GraphConv(hidden, num_classes)

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x))


HPARAMS = {"dataset": "cora", "hidden": 16, "lr": 0.01, "weight_decay": 5e-4, "epochs": 200,
           "self_loops": True, "norm_features": True}


def build_model(in_feats, num_classes, hidden=16, **_):
    return GCN(in_feats, hidden, num_classes)
