"""Graph kernels the generated PyTorch code calls: CSR segment reductions.

Edges are sorted by destination (``Graph`` guarantees it), so every
aggregation is a ``torch.segment_reduce`` over ``g.rowptr``: no atomics, no
scatter, and autograd support on CPU and GPU. Nothing here loops over nodes or
edges in Python; ``typed_linear`` loops over edge *types* only.
"""
from __future__ import annotations

import torch

from ..graph import Graph


def _rowwise(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))


def gather_src(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[e] = x[src(e)]"""
    return x.index_select(0, g.src)


def gather_dst(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[e] = x[dst(e)]"""
    return x.index_select(0, g.dst)


def segment_reduce(kind: str, x: torch.Tensor, g: Graph) -> torch.Tensor:
    """y[v] = kind over the edges into v of x[e]; 0 where v has no edges."""
    if kind == "mean":
        s = torch.segment_reduce(x, "sum", offsets=g.rowptr, axis=0)
        deg = (g.rowptr[1:] - g.rowptr[:-1]).clamp(min=1).to(x.dtype)
        return s / _rowwise(deg, s)
    y = torch.segment_reduce(x, kind, offsets=g.rowptr, axis=0)
    if kind == "sum":
        return y
    nonempty = _rowwise(g.rowptr[1:] > g.rowptr[:-1], y)
    return torch.where(nonempty, y, torch.zeros((), dtype=y.dtype, device=y.device))


def edge_softmax(x: torch.Tensor, g: Graph) -> torch.Tensor:
    """softmax of x over the edges into each destination (max-shifted)."""
    with torch.no_grad():
        m = torch.segment_reduce(x, "max", offsets=g.rowptr, axis=0)
    ex = torch.exp(x - m.index_select(0, g.dst))
    s = torch.segment_reduce(ex, "sum", offsets=g.rowptr, axis=0)
    return ex / s.index_select(0, g.dst)


def typed_linear(x: torch.Tensor, w: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    """y[i] = x[i] @ w[types[i]]: rows grouped by type, one matmul per type."""
    num_types = w.shape[0]
    if types.numel() and (int(types.min()) < 0 or int(types.max()) >= num_types):
        raise ValueError(f"type id out of range: the weight table has {num_types} types "
                         f"(ids 0..{num_types - 1}), got ids in "
                         f"[{int(types.min())}, {int(types.max())}]")
    order = torch.argsort(types, stable=True)
    counts = torch.bincount(types, minlength=num_types).tolist()
    parts = torch.split(x.index_select(0, order), counts)
    out = torch.cat([p @ w[r] for r, p in enumerate(parts)], 0) if parts else x.new_zeros(0, w.shape[2])
    return torch.empty_like(out).index_copy(0, order, out)
