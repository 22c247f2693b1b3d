"""The quality of a partition: edge cut and balance.

- ``edge_cut``: directed edges whose endpoints lie in different parts (each
  needs its source row from another worker);
- per part: ``nodes`` owned, ``edges`` stored (the edges into its nodes),
  ``halo`` (distinct remote source nodes it reads, the rows it receives per
  layer), and the count of each mask (``train_mask``, ...);
- balance of each per-part count: max, mean and max / mean (1.0 = perfect).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from .parts import halo_pairs
from .relabel import Relabeling


@dataclass(frozen=True)
class PartitionStats:
    num_edges: int
    edge_cut: int
    counts: dict[str, list[int]] = field(default_factory=dict)  # name -> one count per part

    @property
    def num_parts(self) -> int:
        return len(self.counts["nodes"])

    def balance(self, name: str) -> dict[str, float]:
        """max, mean and max / mean of the per-part counts ``name`` (ratio 1.0 when all are 0)."""
        c = self.counts[name]
        mx, mean = max(c), sum(c) / len(c)
        return {"max": mx, "mean": mean, "ratio": mx / mean if mean else 1.0}

    def to_json(self) -> dict:
        return {"num_edges": self.num_edges, "edge_cut": self.edge_cut,
                "counts": self.counts,
                "balance": {name: self.balance(name) for name in self.counts}}

    @staticmethod
    def from_json(d: Mapping) -> "PartitionStats":
        return PartitionStats(int(d["num_edges"]), int(d["edge_cut"]),
                              {k: [int(x) for x in v] for k, v in d["counts"].items()})

    def format(self) -> str:
        """A table: one row per part, then max and mean, and the balance ratio."""
        names = list(self.counts)
        cut = self.edge_cut / self.num_edges if self.num_edges else 0.0
        lines = [f"edge cut: {self.edge_cut} of {self.num_edges} edges ({100 * cut:.1f}%)",
                 f"{'part':<9}" + "".join(f"{n:>12}" for n in names)]
        for p in range(self.num_parts):
            lines.append(f"{p:<9}" + "".join(f"{self.counts[n][p]:>12}" for n in names))
        for key, label, fmt in (("max", "max", "{:>12}"), ("mean", "mean", "{:>12.1f}"),
                                ("ratio", "max/mean", "{:>12.3f}")):
            lines.append(f"{label:<9}" + "".join(fmt.format(self.balance(n)[key]) for n in names))
        return "\n".join(lines)


def partition_stats(src: torch.Tensor, dst: torch.Tensor, relabeling: Relabeling,
                    masks: Mapping[str, torch.Tensor] | None = None) -> PartitionStats:
    """Edge cut and per-part counts of the graph (original ids) under ``relabeling``.

    ``masks`` are bool per-node masks in the original order.
    """
    num_parts, n = relabeling.num_parts, relabeling.num_nodes
    part = relabeling.part_of(relabeling.orig_to_new)  # part of each original node
    readers, _ = halo_pairs(src, dst, part, n)
    counts = {
        "nodes": torch.bincount(part, minlength=num_parts).tolist(),
        "edges": torch.bincount(part[dst], minlength=num_parts).tolist(),
        "halo": torch.bincount(readers, minlength=num_parts).tolist(),
    }
    for name, m in (masks or {}).items():
        counts[name] = torch.bincount(part[m], minlength=num_parts).tolist()
    return PartitionStats(int(src.numel()), int((part[src] != part[dst]).sum()), counts)
