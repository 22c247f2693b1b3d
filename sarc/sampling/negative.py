"""Negative edges for link prediction, the same whatever the number of workers.

A positive edge (u, v) gets ``k`` negatives (u, w_1) .. (u, w_k): its destination
corrupted, each w drawn from a distribution over all nodes by a counter-based
uniform (``sarc.sampling.draws``) keyed by the run's seed, the epoch (training) or
the split (evaluation), the positive edge's id and the draw's index. No key holds a
rank, so the negatives of an edge do not depend on which worker draws them or on
how many workers there are. Nodes are original ids here; a worker maps them to its
rows' global ids.

- ``UniformNegatives``: w uniform over the N nodes;
- ``DegreeNegatives``: P(w) proportional to deg(w) ** 0.75 (word2vec's, DistDGL's
  ``Unigram``), by inverse CDF over the nodes in original order. Every worker holds
  the CDF of all N nodes (float64, 8 bytes a node), so the draw is exact and no
  exchange is needed; the degrees are those of the message-passing graph.
"""
from __future__ import annotations

import torch

from .draws import EVAL_NEGATIVE, TRAIN_NEGATIVE, uniform
from .spec import SamplingError

NEGATIVE_SAMPLERS = ("uniform", "degree")
"""The negative distributions ``negative_sampler`` builds, by name."""

DEGREE_POWER = 0.75


class UniformNegatives:
    """w uniform over the ``num_nodes`` nodes."""

    name = "uniform"

    def __init__(self, num_nodes: int):
        if num_nodes < 1:
            raise SamplingError("uniform negatives need a graph with at least one node")
        self.num_nodes = int(num_nodes)

    def nodes(self, u: torch.Tensor) -> torch.Tensor:
        """The node (original id) of each uniform ``u`` in (0, 1)."""
        return (u * self.num_nodes).to(torch.int64).clamp_(max=self.num_nodes - 1)

    def probabilities(self) -> torch.Tensor:
        return torch.full((self.num_nodes,), 1.0 / self.num_nodes, dtype=torch.float64)


class DegreeNegatives:
    """P(w) proportional to ``degree[w] ** power`` (``degree``: per original id)."""

    name = "degree"

    def __init__(self, degree: torch.Tensor, power: float = DEGREE_POWER):
        weight = torch.as_tensor(degree).to(torch.float64).clamp(min=0) ** power
        self.num_nodes = int(weight.numel())
        self.cdf = torch.cumsum(weight, 0)
        if self.num_nodes == 0 or float(self.cdf[-1]) <= 0:
            raise SamplingError("degree-based negatives need a graph with at least one edge")
        self.total = float(self.cdf[-1])

    def nodes(self, u: torch.Tensor) -> torch.Tensor:
        """The node whose CDF interval holds ``u * total``: never a node of weight 0."""
        w = torch.searchsorted(self.cdf, u.to(torch.float64) * self.total, right=True)
        return w.clamp_(max=self.num_nodes - 1)

    def probabilities(self) -> torch.Tensor:
        return torch.diff(self.cdf, prepend=self.cdf.new_zeros(1)) / self.total


def negative_sampler(name: str, num_nodes: int, degree: torch.Tensor | None = None):
    """The sampler called ``name`` (``NEGATIVE_SAMPLERS``) over ``num_nodes`` nodes."""
    if name == "uniform":
        return UniformNegatives(num_nodes)
    if name == "degree":
        if degree is None or int(torch.as_tensor(degree).numel()) != num_nodes:
            raise SamplingError(f"degree-based negatives need the degree of each of the "
                                f"{num_nodes} nodes")
        return DegreeNegatives(degree)
    raise SamplingError(f"unknown negative sampler {name!r}; the samplers: "
                        f"{', '.join(NEGATIVE_SAMPLERS)}")


def train_negatives(sampler, edge_ids: torch.Tensor, k: int, *, seed: int,
                    epoch: int) -> torch.Tensor:
    """[E, k] negative destinations (original ids) of the training edges ``edge_ids``
    in ``epoch``: a new draw every epoch."""
    return _draw(sampler, edge_ids, k, seed, epoch, TRAIN_NEGATIVE)


def eval_negatives(sampler, edge_ids: torch.Tensor, k: int, *, seed: int,
                   split: int) -> torch.Tensor:
    """[E, k] negative destinations of the evaluation edges ``edge_ids`` of ``split``
    (a number per split): fixed by the seed, the same every epoch."""
    return _draw(sampler, edge_ids, k, seed, split, EVAL_NEGATIVE)


def _draw(sampler, edge_ids: torch.Tensor, k: int, seed: int, field: int, tag: int):
    edge_ids = torch.as_tensor(edge_ids, dtype=torch.int64).reshape(-1, 1)
    if edge_ids.numel() == 0 or k == 0:
        return torch.zeros((edge_ids.numel(), k), dtype=torch.int64)
    j = torch.arange(k, dtype=torch.int64).reshape(1, -1)
    u = uniform(seed, field, tag, edge_ids.numpy(), j.numpy())
    return sampler.nodes(u.reshape(edge_ids.numel(), k))
