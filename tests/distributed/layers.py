"""Layers the distributed tests add to the zoo: max / min reductions (with ties)."""
from __future__ import annotations

import torch
from torch import nn

import sarc


class MaxLayer(sarc.Layer):
    """GraphSAGE-pool-like: max (or min) over incoming edges of relu(W h_u - 0.3)."""

    def __init__(self, in_feats: int, out_feats: int, kind: str = "max"):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)
        self.kind = kind

    def message(self, src, dst, edge):
        return torch.relu(self.lin(src.h) - 0.3)

    def reduce(self, msg):
        return sarc.max(msg.m) if self.kind == "max" else sarc.min(msg.m)

    def update(self, dst, agg):
        return agg.agg + dst.h.sum(-1, keepdim=True)


class TiedMaxLayer(sarc.Layer):
    """max over incoming edges of ``scale * h_u``: with integer-valued features, many edges
    tie for the maximum, across blocks too, and every tied edge's source gets a share of the
    gradient (ties split evenly)."""

    def __init__(self, in_feats: int):
        super().__init__(node={"h": in_feats})
        self.scale = nn.Parameter(torch.full((in_feats,), 1.5))

    def message(self, src, dst, edge):
        return src.h * self.scale

    def reduce(self, msg):
        return sarc.max(msg.m)


class FeatureAxesLayer(sarc.Layer):
    """Attention over transposed heads with a gated, normalized value: chunk, slices, new
    axes, transpose, layer norm, GELU, SiLU, softplus and clamp, across the exchange."""

    def __init__(self, in_feats: int, out_feats: int, heads: int = 2):
        super().__init__(node={"h": in_feats})
        self.heads, self.d = heads, out_feats
        self.lin = nn.Linear(in_feats, 2 * heads * out_feats)
        self.att = nn.Linear(in_feats, heads, bias=False)
        self.norm = nn.LayerNorm(out_feats)
        self.out = nn.Parameter(torch.randn(out_feats, out_feats) * 0.3)

    def message(self, src, dst, edge):
        value, gate = self.lin(src.h).chunk(2, dim=-1)
        z = (torch.nn.functional.gelu(value) * torch.sigmoid(gate)).view(-1, self.heads, self.d)
        z = z.transpose(1, 2)                                            # [E, d, H]
        score = torch.nn.functional.softplus(self.att(dst.h) + self.att(src.h)[:, :self.heads])
        return {"z": self.norm(z.transpose(1, 2)).transpose(1, 2), "s": score.clamp(0.1, 5.0)}

    def reduce(self, msg):
        return sarc.sum(msg.z * sarc.edge_softmax(msg.s)[:, None, :])

    def update(self, dst, agg):
        heads = agg.agg.unbind(-1)
        return torch.nn.functional.silu(sum(heads) @ self.out.T)


class DegreesLayer(sarc.Layer):
    """Both degrees at both ends of an edge (``src.in_degree``, ``dst.out_degree``: DGL's
    SGConv normalization and more): the in-degree of a remote source is its owner's."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)

    def message(self, src, dst, edge):
        scale = src.in_degree.clamp_min(1).rsqrt() * (dst.out_degree + 1).rsqrt()
        return self.lin(src.h) * scale.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg * dst.in_degree.clamp_min(1).rsqrt().unsqueeze(-1)


class SameNamesLayer(sarc.Layer):
    """A parameter and the node feature it multiplies share a name (``W``): each keeps its
    own gradient (a feature without one leaves the parameter's)."""

    def __init__(self, in_feats: int, out_feats: int):
        super().__init__(node={"W": in_feats})
        self.W = nn.Parameter(torch.randn(in_feats, out_feats) / in_feats ** 0.5)

    def message(self, src, dst, edge):
        return src.W @ self.W

    def reduce(self, msg):
        return sarc.sum(msg.m)

    def update(self, dst, agg):
        return agg.agg + dst.W @ self.W


class MaxSourceDegreeLayer(sarc.Layer):
    """``h`` with a last column: the largest out-degree among the node's in-neighbours (0
    without any): what ``MaskedAttentionLayer`` keeps."""

    def __init__(self, feats: int):
        super().__init__(node={"h": feats})

    def message(self, src, dst, edge):
        return src.out_degree.unsqueeze(-1)

    def reduce(self, msg):
        return sarc.max(msg.m)

    def update(self, dst, agg):
        return torch.cat([dst.h, agg.agg], -1)


class MaskedAttentionLayer(sarc.Layer):
    """Attention whose score is -inf (``masked_fill``) on the edges from sources of less than
    the largest out-degree among the destination's in-neighbours (``h``'s last column): every
    destination keeps an edge, while a block may hold only masked edges into one. With
    ``fill=-1e9, shift=1e5``: scores far from zero, which a softmax weighs as near it (the
    statistics of rows and blocks whose every edge is masked among them)."""

    def __init__(self, in_feats: int, out_feats: int, fill: float = float("-inf"),
                 shift: float = 0.0):
        super().__init__(node={"h": in_feats + 1})
        self.lin = nn.Linear(in_feats, out_feats)
        self.att = nn.Parameter(torch.randn(out_feats) / out_feats ** 0.5)
        self.fill, self.shift = fill, shift

    def message(self, src, dst, edge):
        z = self.lin(src.h[:, :-1])
        s = ((z * self.att).sum(-1) + self.shift).masked_fill(src.out_degree < dst.h[:, -1],
                                                              self.fill)
        return {"z": z, "s": s}

    def reduce(self, msg):
        return sarc.sum(msg.z * sarc.edge_softmax(msg.s).unsqueeze(-1))


class NestedSoftmaxLayer(sarc.Layer):
    """An edge_softmax of a value computed from another's weights: with ``sarc.mean`` neither
    fuses into a softmax aggregate, with ``sarc.sum`` the outer one does."""

    def __init__(self, in_feats: int, out_feats: int, aggregate: str = "mean"):
        super().__init__(node={"h": in_feats})
        self.lin = nn.Linear(in_feats, out_feats)
        self.att = nn.Parameter(torch.randn(out_feats) / out_feats ** 0.5)
        self.aggregate = {"mean": sarc.mean, "sum": sarc.sum}[aggregate]

    def message(self, src, dst, edge):
        z = self.lin(src.h)
        return {"z": z, "s": (z * self.att).sum(-1) + (self.lin(dst.h) * self.att).sum(-1)}

    def reduce(self, msg):
        inner = sarc.edge_softmax(msg.s)
        return self.aggregate(msg.z * sarc.edge_softmax(4.0 * inner).unsqueeze(-1))  # ERR:nested


class DotAttentionLayer(sarc.Layer):
    """A transformer's attention: scores ``<q_v, k_u> / sqrt(d)`` per head, one SDDMM of
    the two ends' rows (``patterns.dot_score``), weighing the source's values."""

    def __init__(self, in_feats: int, out_feats: int, heads: int = 2):
        super().__init__(node={"h": in_feats})
        self.heads, self.d = heads, out_feats
        self.q, self.v = (nn.Linear(in_feats, heads * out_feats) for _ in range(2))
        # no key bias: <q_v, b> is the same on every edge into v, its gradient 0 (rounding)
        self.k = nn.Linear(in_feats, heads * out_feats, bias=False)

    def message(self, src, dst, edge):
        q = self.q(dst.h).view(-1, self.heads, self.d)
        k = self.k(src.h).view(-1, self.heads, self.d)
        return {"s": (q * k).sum(-1) / self.d ** 0.5,
                "v": self.v(src.h).view(-1, self.heads, self.d)}

    def reduce(self, msg):
        return sarc.sum(sarc.edge_softmax(msg.s).unsqueeze(-1) * msg.v)

    def update(self, dst, agg):
        return agg.agg.mean(1)
