"""The model zoo in the configurations the core tests use, and features for them."""
from __future__ import annotations

import torch
from edgeconv import EdgeConvLayer
from gat import GATLayer
from gcn import GCNLayer
from gin import GINLayer
from hetero_sage import SAGELayer as HeteroSAGELayer
from rgcn import RGCNLayer
from sage import SAGELayer
from sage_lp import SAGELayer as LinkSAGELayer

import sarc

NUM_RELS = 3

# name -> (in_feats -> layer); out sizes deliberately not powers of two.
LAYERS = {
    "gcn": lambda d: GCNLayer(d, 5),
    "gcn_nobias": lambda d: GCNLayer(d, 3, bias=False),
    "sage": lambda d: SAGELayer(d, 5),
    "sage_lp": lambda d: LinkSAGELayer(d, 4),  # link prediction's encoder layer
    "hetero_sage": lambda d: HeteroSAGELayer(d, 5),  # a relation's layer of HeteroConv
    "gat_1head": lambda d: GATLayer(d, 5, heads=1),
    "gat_4heads_concat": lambda d: GATLayer(d, 3, heads=4),
    "gat_4heads_mean": lambda d: GATLayer(d, 3, heads=4, concat=False),
    "gat_1head_mean": lambda d: GATLayer(d, 6, heads=1, concat=False),
    "gat_4heads_dropout": lambda d: GATLayer(d, 3, heads=4, attn_drop=0.3),
    "gin": lambda d: GINLayer(d, 6, 5),
    "gin_train_eps": lambda d: GINLayer(d, 6, 5, eps=0.3, train_eps=True),
    "rgcn": lambda d: RGCNLayer(d, 5, NUM_RELS),
    "rgcn_bases": lambda d: RGCNLayer(d, 5, NUM_RELS, num_bases=2),
    "rgcn_nobias": lambda d: RGCNLayer(d, 5, NUM_RELS, bias=False),
    "edgeconv": lambda d: EdgeConvLayer(d, 5),   # a message of both ends, a max
}


def features(layer: sarc.Layer, g: sarc.Graph, d: int) -> dict[str, torch.Tensor]:
    """Random node features ``h`` [num_src, d], and RGCN's edge type and norm."""
    feats = {"h": torch.randn(g.num_src, d)}
    if "etype" in layer._sarc_edge:
        feats["etype"] = torch.randint(0, NUM_RELS, (g.num_edges,))
        feats["norm"] = torch.rand(g.num_edges) + 0.1
    return feats
