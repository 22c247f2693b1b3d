"""Small torch helpers the model zoo shares (plain PyTorch, outside the compiled layers):
input dropout, and the edge scorers of link prediction."""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

SPARSE_DENSITY = 0.1
"""Below this fraction of nonzeros, ``input_dropout`` draws random numbers for the nonzeros only."""


def input_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout on a (mostly zero) input feature matrix: ``F.dropout`` in distribution.

    Dropout leaves a zero entry zero, so on sparse features such as Cora's
    bag-of-words (1.3% nonzero) only the nonzeros need a random draw, as in
    Kipf & Welling's ``sparse_dropout``: ~100x less work than a dense mask,
    which dominated a training epoch on Cora (2708 x 1433 Bernoulli draws).
    Inputs that need a gradient (a learned embedding) take ``F.dropout``:
    there the zeros' gradient would differ.
    """
    if not training or p == 0.0 or x.requires_grad or x.dim() != 2:
        return F.dropout(x, p, training)
    flat = x.reshape(-1)
    nz = _nonzeros(x, flat)
    if nz.numel() > SPARSE_DENSITY * flat.numel():
        return F.dropout(x, p, training)
    vals = flat.index_select(0, nz)
    keep = torch.rand(vals.shape, dtype=vals.dtype, device=vals.device) >= p
    dropped = torch.where(keep, vals / (1.0 - p), torch.zeros((), dtype=vals.dtype, device=vals.device))
    return torch.zeros_like(flat).index_copy_(0, nz, dropped).view_as(x)


_last_nonzeros: tuple = (None, -1, None)


def _nonzeros(x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The positions of ``flat``'s (x's) nonzeros, kept for the last tensor asked while it
    is unchanged: a training run drops its one input matrix every epoch."""
    global _last_nonzeros
    ref, version, nz = _last_nonzeros
    if ref is None or ref() is not x or version != x._version:
        nz = flat.nonzero().squeeze(1)
        _last_nonzeros = (weakref.ref(x), x._version, nz)
    return nz


class DotScorer(torch.nn.Module):
    """An edge's logit: the dot product of its endpoints' embeddings."""

    def forward(self, h_u: torch.Tensor, h_v: torch.Tensor) -> torch.Tensor:
        return (h_u * h_v).sum(-1)


class MLPScorer(torch.nn.Module):
    """An edge's logit: a 2-layer MLP over the endpoints' elementwise product (symmetric
    in u and v, as the graph's edges are)."""

    def __init__(self, dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or dim
        self.lin1 = torch.nn.Linear(dim, hidden)
        self.lin2 = torch.nn.Linear(hidden, 1)

    def forward(self, h_u: torch.Tensor, h_v: torch.Tensor) -> torch.Tensor:
        return self.lin2(F.relu(self.lin1(h_u * h_v))).squeeze(-1)


SCORERS = {"dot": DotScorer, "mlp": MLPScorer}
"""Edge scorers of link prediction, by the name a model file's ``scorer`` takes."""


def edge_scorer(name: str, dim: int) -> torch.nn.Module:
    """The scorer called ``name`` (``SCORERS``) over ``dim``-wide embeddings."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; the scorers: {', '.join(SCORERS)}")
    return DotScorer() if name == "dot" else MLPScorer(dim)
