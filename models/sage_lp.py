"""GraphSAGE link prediction: a 2-layer GraphSAGE-mean encoder and an edge scorer.

    h = SAGE(g, x)                  # every node's embedding, on the message graph
    logit(u, v) = score(h_u, h_v)   # dot product, or an MLP over h_u * h_v

``sarc train models/sage_lp.py --task link`` trains it on the graph's edges
(``sarc.training.link``): binary cross-entropy of the training edges against
negatives, MRR and Hits@K of the held-out edges.
"""
import torch.nn.functional as F
from torch import nn

import sarc
from sarc.modules import edge_scorer, input_dropout


class SAGELayer(sarc.Layer):
    """h'_v = W_neigh mean_{u -> v} h_u + b + W_self h_v (as models/sage.py)."""

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


class SAGEEncoder(nn.Module):
    """Two GraphSAGE-mean layers with ReLU between, and an edge scorer."""

    def __init__(self, in_feats: int, hidden: int, out: int, dropout: float, scorer: str):
        super().__init__()
        self.conv1 = SAGELayer(in_feats, hidden)
        self.conv2 = SAGELayer(hidden, out)
        self.dropout = dropout
        self.scorer = edge_scorer(scorer, out)

    def forward(self, g, x):
        x = input_dropout(x, self.dropout, self.training)
        x = F.relu(self.conv1(g, x))
        x = F.dropout(x, self.dropout, self.training)
        return self.conv2(g, x)

    def score(self, h_u, h_v):
        return self.scorer(h_u, h_v)


# lr 0.003 on the raw bag-of-words features: at lr 0.01 the ReLU units die within a few
# epochs and every edge scores the same (the loss stays at ln 2).
HPARAMS = {
    "dataset": "cora",
    "hidden": 64,
    "out": 64,
    "dropout": 0.0,
    "scorer": "dot",
    "lr": 0.003,
    "weight_decay": 0.0,
    "epochs": 100,
    "self_loops": False,
    "norm_features": False,
    "negatives": "uniform",
    "negatives_per_edge": 1,
    "eval_negatives": 1000,
}


def build_model(in_feats: int, num_classes: int, hidden: int = 64, out: int = 64,
                dropout: float = 0.0, scorer: str = "dot", **_) -> nn.Module:
    return SAGEEncoder(in_feats, hidden, out, dropout, scorer)
