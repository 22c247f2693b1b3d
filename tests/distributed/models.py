"""The models of the distributed tests: the zoo's (models/*.py build_model, dropout off) and
two-layer max / min nets."""
from __future__ import annotations

import torch.nn.functional as F
from attention_layers import ScoreShapes
from edgeconv import build_model as edgeconv
from gat import build_model as gat
from gcn import build_model as gcn
from gin import build_model as gin
from rgcn import build_model as rgcn
from sage import SAGELayer
from sage import build_model as sage
from torch import nn

from .layers import (DegreesLayer, DotAttentionLayer, FeatureAxesLayer, MaskedAttentionLayer,
                     MaxLayer, MaxSourceDegreeLayer, NestedSoftmaxLayer, SameNamesLayer,
                     TiedMaxLayer)


class MaxNet(nn.Module):
    """max over relu messages, then min: both extremum merges, ties at 0 across blocks."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = MaxLayer(in_feats, hidden, "max")
        self.conv2 = MaxLayer(hidden, num_classes, "min")

    def forward(self, g, x):
        return self.conv2(g, F.elu(self.conv1(g, x)))


class TiedMaxNet(nn.Module):
    """max of scale * h_u over integer features (ties everywhere), then GraphSAGE's mean."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = TiedMaxLayer(in_feats)
        self.conv2 = SAGELayer(in_feats, num_classes)

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x))


class ScoreShapesNet(nn.Module):
    """Dot-product attention with a score per channel shared by two heads (an unfused edge
    softmax), then one kept as [1, 1] (fused, the score reshaped to a scalar per edge)."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = ScoreShapes(in_feats, 2, hidden, "channel")
        self.conv2 = ScoreShapes(2 * hidden, 1, num_classes, "keepdim")

    def forward(self, g, x):
        return self.conv2(g, F.elu(self.conv1(g, x)))


class FeatureAxesNet(nn.Module):
    """Two ``FeatureAxesLayer``s: ranges, reorderings and composed activations."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = FeatureAxesLayer(in_feats, hidden)
        self.conv2 = FeatureAxesLayer(hidden, num_classes)

    def forward(self, g, x):
        return self.conv2(g, self.conv1(g, x))


class TwoLayers(nn.Module):
    """Two layers of class ``layer``, ELU between: ``DegreesLayer``s (every degree at both
    ends, across the exchange), ``SameNamesLayer``s (the first's feature needs no gradient,
    the second's does)."""

    def __init__(self, layer, in_feats: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = layer(in_feats, hidden)
        self.conv2 = layer(hidden, num_classes)

    def forward(self, g, x):
        return self.conv2(g, F.elu(self.conv1(g, x)))


class MaskedAttentionNet(nn.Module):
    """``MaskedAttentionLayer`` after the column it masks by."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, backend: str = "torch",
                 **far):
        super().__init__()
        self.degrees = MaxSourceDegreeLayer(in_feats)
        self.conv = MaskedAttentionLayer(in_feats, num_classes, **far)
        self.conv.set_backend(backend)

    def forward(self, g, x):
        return self.conv(g, self.degrees(g, x))


MODELS = {
    "gcn": lambda f, c, **_: gcn(f, c, hidden=8, dropout=0.0),
    "sage": lambda f, c, **_: sage(f, c, hidden=8, dropout=0.0),
    "gat": lambda f, c, **_: gat(f, c, hidden=4, heads=3, out_heads=2, dropout=0.0, attn_drop=0.0),
    # attention dropout keeps edge_softmax unfused (a normalizer pass); eval mode turns it off
    "gat_attn_drop": lambda f, c, **_: gat(f, c, hidden=4, heads=2, dropout=0.0, attn_drop=0.5),
    "gin": lambda f, c, **_: gin(f, c, hidden=8, dropout=0.0, train_eps=True, eps=0.1),
    "rgcn": lambda f, c, num_etypes=3: rgcn(f, c, num_etypes=num_etypes, hidden=8),
    "rgcn_bases": lambda f, c, num_etypes=3: rgcn(f, c, num_etypes=num_etypes, hidden=8,
                                                         num_bases=2),
    "max": lambda f, c, **_: MaxNet(f, 6, c),
    "edgeconv": lambda f, c, **_: edgeconv(f, c, hidden=8, dropout=0.0),  # both ends, a max
    "tied_max": lambda f, c, **_: TiedMaxNet(f, 6, c),
    "score_shapes": lambda f, c, **_: ScoreShapesNet(f, 4, c),
    "feature_axes": lambda f, c, **_: FeatureAxesNet(f, 6, c),
    "degrees": lambda f, c, **_: TwoLayers(DegreesLayer, f, 6, c),
    "same_names": lambda f, c, **_: TwoLayers(SameNamesLayer, f, 6, c),
    "masked": lambda f, c, **_: MaskedAttentionNet(f, 6, c),
    "masked_triton": lambda f, c, **_: MaskedAttentionNet(f, 6, c, "triton"),
    "masked_far_triton": lambda f, c, **_: MaskedAttentionNet(f, 6, c, "triton", fill=-1e9,
                                                              shift=1e5),
    "dot": lambda f, c, **_: TwoLayers(DotAttentionLayer, f, 6, c),
    "nested_sum": lambda f, c, **_: TwoLayers(lambda i, o: NestedSoftmaxLayer(i, o, "sum"),
                                              f, 6, c),
}
