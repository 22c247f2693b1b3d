"""A DGL user's script: GCN on Cora with DGL's GraphConv. The three lines commented "sarc"
run it through sarc's compiler; without them it is the plain DGL script."""
import sys

import dgl
import torch
import torch.nn.functional as F
from dgl.nn.pytorch import GraphConv
from torch import nn

import sarc.frontends.dgl                                   # sarc
from sarc.datasets import load_dataset


class GCN(nn.Module):
    def __init__(self, in_feats, hidden, num_classes):
        super().__init__()
        self.conv1 = GraphConv(in_feats, hidden, activation=F.relu)
        self.conv2 = GraphConv(hidden, num_classes)
        self.dropout = nn.Dropout(0.5)

    def forward(self, g, x):
        return self.conv2(g, self.dropout(self.conv1(g, self.dropout(x))))


def main(epochs=200, seed=0):
    torch.manual_seed(seed)
    data = load_dataset("cora")     # Cora as embedded in sarc; any DGL graph does
    g = dgl.add_self_loop(dgl.graph((data.edge_src, data.edge_dst), num_nodes=data.num_nodes))
    sarc.frontends.dgl.patch()                              # sarc
    g = sarc.frontends.dgl.from_dgl(g)                      # sarc
    x, y = data.feat, data.label
    model = GCN(x.shape[1], 16, data.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    losses = []
    for epoch in range(epochs):
        model.train()
        loss = F.cross_entropy(model(g, x)[data.train_mask], y[data.train_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        pred = model(g, x).argmax(1)
    acc = (pred[data.test_mask] == y[data.test_mask]).float().mean().item()
    print(f"test accuracy {acc:.3f}")
    return losses, acc


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
