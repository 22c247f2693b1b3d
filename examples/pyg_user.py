"""A PyG training script running its convs through sarc: README's "For PyG users" (three lines
differ from the PyG script; tests/frontends/test_pyg.py checks that README shows this file)."""

import torch
import torch.nn.functional as F
from torch_geometric.datasets import FakeDataset
from torch_geometric.nn import GATConv, GCNConv
from sarc.frontends.pyg import as_conv                        # sarc: added


class Net(torch.nn.Module):
    def __init__(self, in_channels, hidden, num_classes, heads=4):
        super().__init__()
        self.conv1 = as_conv(GATConv(in_channels, hidden, heads))  # sarc: was GATConv(...)
        self.conv2 = as_conv(GCNConv(hidden * heads, num_classes))  # sarc: was GCNConv(...)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        return self.conv2(x, edge_index)


def train(data, epochs=100):
    model = Net(data.num_features, 8, int(data.y.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    losses = []
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    data = FakeDataset(num_graphs=1, avg_num_nodes=500, num_channels=32, num_classes=4)[0]
    losses = train(data)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
