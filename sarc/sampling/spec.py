"""What a sampled (or MFG) minibatch is made of: fanouts per layer, replacement, edge
probabilities and the run's seed, checked once before any worker communicates.

Every worker checks the same spec against the same schema of edge data, so a bad
spec fails on all of them before the first collective (no worker waits for a peer
that has given up).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import SarcError

ALL = -1
"""A fanout of -1 takes every in-edge (the layer's block is the MFG's)."""


class SamplingError(SarcError, ValueError):
    """A sampling or seed-loading request that cannot be met (bad fanouts, batch size,
    edge probabilities), or a peer that did not deliver its part of an exchange."""


@dataclass(frozen=True)
class SamplingSpec:
    fanouts: tuple[int, ...]   # [K]: fanouts[k-1] in-edges per dst node at layer k (input layer first)
    replace: bool = False      # draw with replacement (exactly ``fanout`` draws per node)
    prob: str | None = None    # edge data name: unnormalized per-edge sampling weights
    seed: int = 0

    def __post_init__(self):
        fanouts = self.fanouts
        if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence):
            raise SamplingError(f"fanouts must be a list of integers, one per layer, got "
                                f"{fanouts!r}")
        for k, f in enumerate(fanouts, 1):
            if isinstance(f, bool) or not isinstance(f, numbers.Integral):
                raise SamplingError(f"the fanout of layer {k} must be an integer, got {f!r}")
            if f < ALL:
                raise SamplingError(f"the fanout of layer {k} is {f}: a fanout is a number of "
                                    f"neighbours >= 0, or -1 for all of them")
        if not fanouts:
            raise SamplingError("fanouts is empty: give one fanout per graph layer")
        if self.prob is not None and not (isinstance(self.prob, str) and self.prob):
            raise SamplingError(f"prob must name edge data, got {self.prob!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SamplingError(f"the sampling seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "fanouts", tuple(int(f) for f in fanouts))
        object.__setattr__(self, "replace", bool(self.replace))

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    @staticmethod
    def mfg(num_layers: int, seed: int = 0) -> "SamplingSpec":
        """Every in-edge at every layer: the K-hop message flow graph."""
        return SamplingSpec.of([ALL] * num_layers, layers=num_layers, seed=seed)

    @staticmethod
    def of(fanouts: Sequence[int], *, layers: int | None = None, replace: bool = False,
           prob: str | None = None, seed: int = 0) -> "SamplingSpec":
        """A spec for a model of ``layers`` graph layers, which the fanouts must match."""
        spec = SamplingSpec(fanouts, replace, prob, seed)
        n = spec.num_layers
        if layers is not None and layers != n:
            raise SamplingError(f"{n} fanout{'s' * (n != 1)} ({', '.join(map(str, spec.fanouts))}) "
                                f"for a model of {layers} graph layer{'s' * (layers != 1)}: "
                                f"give one fanout per layer")
        return spec

    def check_edge_data(self, edge_names: Sequence[str]) -> None:
        """Raise unless the probability edge data (if any) is among ``edge_names``."""
        check_prob(self.prob, edge_names)


EDGE_DATA_NAMING = ("a dataset file's edge data are its numeric arrays named edge_*, such "
                    "as edge_weight, besides edge_src and edge_dst")


def check_prob(prob: str | None, edge_names: Iterable[str], holder: str = "the graph") -> None:
    """Raise unless the sampling probabilities ``prob`` (if any) are among the edge data
    ``edge_names`` that ``holder`` has (a dataset's, or a shard's of one)."""
    names = sorted(edge_names)
    if prob is not None and prob not in names:
        raise SamplingError(f"no edge data {prob!r} for the sampling probabilities "
                            f"({holder} has: {', '.join(names) or 'none'}; "
                            f"{EDGE_DATA_NAMING})")
