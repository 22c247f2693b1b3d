"""A model's inputs as the trainer's hyperparameters ask, for a whole graph
(``sarc.train.prepare``) and for a worker's shard (``sarc.distributed.prepare``) alike:

- ``self_loops``: refused on a graph with edge data (``check_self_loops``); the edges
  themselves get theirs from ``sarc.datasets.add_self_loops``;
- ``norm_features``: each node's features divided by their sum (``node_features``);
- the labeled train / val / test masks (``labeled_masks``);
- ``embedding_dim``: a learned input for featureless graphs (``EmbeddingInput``).
"""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ..errors import SarcError

SPLITS = ("train", "val", "test")


class TrainError(SarcError):
    """The dataset and the model's hyperparameters do not fit together."""


def check_self_loops(edge_data: Iterable[str], graph: str) -> None:
    """Refuse ``self_loops=True`` on ``graph`` if its edges carry data (``edge_data``: its
    names): a self loop would have no edge type or weight."""
    names = sorted(set(edge_data))
    if names:
        raise TrainError(f"self_loops=True on {graph}, whose edges carry {', '.join(names)}: a "
                         f"self loop has no edge type or weight; model the self connection in "
                         f"the layer (R-GCN's root weight) instead")


def node_features(feat: torch.Tensor, hparams: dict[str, Any]) -> torch.Tensor:
    """The nodes' input rows: ``feat`` as a float32 matrix, each row divided by its sum
    when ``norm_features`` asks (a graph without features has ``[N, 0]``)."""
    x = feat if feat.dim() == 2 else feat.reshape(feat.shape[0], -1)
    x = x.to(torch.float32)
    if hparams["norm_features"] and x.shape[1] > 0:
        x = x / x.sum(1, keepdim=True).clamp_min(1e-12)
    return x


def labeled_masks(label: torch.Tensor, train: torch.Tensor, val: torch.Tensor,
                  test: torch.Tensor) -> dict[str, torch.Tensor]:
    """The train / val / test masks, of labeled nodes only (a label < 0 is none)."""
    labeled = label >= 0
    return {k: m.to(torch.bool) & labeled for k, m in zip(SPLITS, (train, val, test))}


class EmbeddingInput(nn.Module):
    """A learned ``[num_nodes, dim]`` input for graphs without node features."""

    def __init__(self, model: nn.Module, num_nodes: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(num_nodes, dim)
        self.model = model

    def forward(self, g, x, **edge_inputs):
        return self.model(g, self.embedding.weight, **edge_inputs)

    def on_rows(self, g, node_ids: torch.Tensor, **edge_inputs):
        """The model on the embedding's rows of ``node_ids`` (a shard's nodes, a step's
        input nodes)."""
        return self.model(g, self.embedding.weight.index_select(0, node_ids), **edge_inputs)
