"""Attention layers whose softmax weights meet the value in other shapes than GAT's
``[H] -> [H, 1]``: a score kept with a size-1 axis (``keepdim=True``), a per-channel score,
a per-edge scalar score; the tests of fusion and of every backend use them."""
from __future__ import annotations

import torch
from torch import nn

import sarc


SCORES = {
    # name: (the score from the query-key product qk [E, H, C], whether it fuses)
    "head": (lambda qk: qk.sum(-1).unsqueeze(-1), True),           # GAT's [H] -> [H, 1]
    "keepdim": (lambda qk: qk.sum(-1, keepdim=True), True),        # [H, 1]: score [H]
    "edge": (lambda qk: qk.sum((1, 2), keepdim=True), True),       # [1, 1]: score []
    "edge_unsqueezed": (lambda qk: qk.sum((1, 2)).unsqueeze(-1).unsqueeze(-1), True),
    "element": (lambda qk: qk, True),                              # [H, C]
    "channel": (lambda qk: qk.sum(1, keepdim=True), False),        # [1, C]: across heads
}
"""The scores ``ScoreShapes`` makes. A channel's score is shared by every head: its
weights broadcast along the value's leading axis, which a softmax aggregate (scores a
prefix of the value's features) does not model, so the product stays unfused."""


class ScoreShapes(sarc.Layer):
    """Dot-product attention over ``heads`` x ``channels`` values with score ``score``
    (a key of ``SCORES``), softmax-normalized over each node's in-edges."""

    def __init__(self, d: int, heads: int, channels: int, score: str):
        super().__init__(node={"h": d})
        self.heads, self.channels, self.score = heads, channels, score
        self.q = nn.Linear(d, heads * channels, bias=False)
        self.k = nn.Linear(d, heads * channels, bias=False)
        self.v = nn.Linear(d, heads * channels, bias=False)

    def message(self, src, dst, edge):
        qk = (self.q(dst.h) * self.k(src.h)).view(-1, self.heads, self.channels)
        s = SCORES[self.score][0](qk) * self.channels ** -0.5
        return {"s": s, "v": self.v(src.h).view(-1, self.heads, self.channels)}

    def reduce(self, msg):
        return sarc.sum(sarc.edge_softmax(msg.s) * msg.v)

    def update(self, dst, agg):
        return agg.agg.flatten(1)


def reference(layer: ScoreShapes, src: torch.Tensor, dst: torch.Tensor, num_nodes: int,
              h: torch.Tensor) -> torch.Tensor:
    """The layer's math in plain torch, node by node (no sarc)."""
    out = torch.zeros(num_nodes, layer.heads, layer.channels, dtype=h.dtype)
    q, k = layer.q(h), layer.k(h)
    v = layer.v(h).view(-1, layer.heads, layer.channels)
    for node in range(num_nodes):
        e = (dst == node).nonzero().flatten()
        if len(e):
            qk = (q[node] * k[src[e]]).view(-1, layer.heads, layer.channels)
            s = SCORES[layer.score][0](qk) * layer.channels ** -0.5
            out[node] = (torch.softmax(s, 0) * v[src[e]]).sum(0)
    return out.flatten(1)


class MaskedAttention(sarc.Layer):
    """Dot-product attention whose masked edges score ``fill`` (``masked_fill(mask, -1e9)``,
    the usual attention mask) and whose scores are shifted by ``shift``: a softmax weighs
    them as without the shift."""

    def __init__(self, width: int, fill: float, shift: float = 0.0):
        super().__init__(node={"h": 4}, edge={"w": ()})
        self.lin, self.fill, self.shift = nn.Linear(4, width), fill, shift

    def message(self, src, dst, edge):
        score = ((src.h * dst.h).sum(-1) + self.shift).masked_fill(edge.w < 0, self.fill)
        return {"z": self.lin(src.h), "s": score}

    def reduce(self, msg):
        return sarc.sum(msg.z * sarc.edge_softmax(msg.s).unsqueeze(-1))


def masked_attention_feats(g: sarc.Graph, seed: int = 5) -> dict[str, torch.Tensor]:
    """``MaskedAttention``'s inputs on ``g``: a third of the edges masked, and every edge
    into a destination whose id is a multiple of 4 (rows of several edges, all masked)."""
    gen = torch.Generator().manual_seed(seed)
    masked = (torch.rand(g.num_edges, generator=gen) < 0.3) | (g.dst.cpu() % 4 == 0)
    return {"h": torch.randn(g.num_src, 4, generator=gen),
            "w": torch.where(masked, -1.0, 1.0)}
