"""GraphSAGE with mean aggregation (Hamilton et al., NeurIPS 2017).

    h'_v = W_neigh mean_{u -> v} h_u + b + W_self h_v

as PyG's SAGEConv(aggr="mean") and DGL's SAGEConv("mean"). The layer's pooling
aggregator (``aggregator="pool"``),

    h'_v = W_neigh max_{u -> v} relu(W_pool h_u + b_pool) + b + W_self h_v,

is PyG's SAGEConv(aggr="max", project=True) and DGL's SAGEConv("pool").
"""
import torch
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.modules import input_dropout


class SAGELayer(sarc.Layer):
    def __init__(self, in_feats: int, out_feats: int, aggregator: str = "mean"):
        super().__init__(node={"h": in_feats})
        if aggregator not in ("mean", "pool"):
            raise ValueError(f"SAGELayer: aggregator {aggregator!r}: 'mean' or 'pool'")
        self.aggregator = aggregator
        if aggregator == "pool":
            self.fc_pool = nn.Linear(in_feats, in_feats)
        self.lin_neigh = nn.Linear(in_feats, out_feats, bias=True)
        self.lin_self = nn.Linear(in_feats, out_feats, bias=False)

    def message(self, src, dst, edge):
        if self.aggregator == "pool":
            return torch.relu(self.fc_pool(src.h))
        return src.h

    def reduce(self, msg):
        return sarc.max(msg.m) if self.aggregator == "pool" else sarc.mean(msg.m)

    def update(self, dst, agg):
        return self.lin_neigh(agg.agg) + self.lin_self(dst.h)


class SAGE(nn.Module):
    """Two GraphSAGE layers with ReLU and dropout (full-batch, transductive)."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, dropout: float = 0.5,
                 aggregator: str = "mean"):
        super().__init__()
        self.conv1 = SAGELayer(in_feats, hidden, aggregator)
        self.conv2 = SAGELayer(hidden, num_classes, aggregator)
        self.dropout = dropout

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)


# The GraphSAGE paper has no Cora experiment (it is inductive: Reddit, PPI, citations);
# these are the common full-batch Cora settings of the DGL and PyG examples, matching
# GCN's. No self loops: SAGE keeps the node's own features in W_self.
HPARAMS = {
    "dataset": "cora",
    "hidden": 16,
    "dropout": 0.5,
    "aggregator": "mean",
    "lr": 0.01,
    "weight_decay": 5e-4,
    "epochs": 200,
    "self_loops": False,
    "norm_features": True,
}


def build_model(in_feats: int, num_classes: int, hidden: int = 16, dropout: float = 0.5,
                aggregator: str = "mean", **_) -> nn.Module:
    return SAGE(in_feats, hidden, num_classes, dropout, aggregator)


if __name__ == "__main__":
    from sarc.train import script_main
    script_main(globals())
