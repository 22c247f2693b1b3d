"""Relabeling: new node ids under which every part owns a contiguous id range.

Part p owns the new ids ``offsets[p] .. offsets[p+1]-1``; within a part,
nodes keep their original order (a stable sort by part). ``new_to_orig`` and
``orig_to_new`` are inverse permutations of ``0..N-1``:

    new id i  is original node  new_to_orig[i]
    original node v  has new id  orig_to_new[v]

so node data moves to the new order with ``x[new_to_orig]`` (``to_new``) and
back with ``y[orig_to_new]`` (``to_orig``), and an edge (u, v) becomes
(orig_to_new[u], orig_to_new[v]).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import GraphError


@dataclass(frozen=True, eq=False)
class Relabeling:
    offsets: torch.Tensor      # [P + 1] int64: part p owns new ids offsets[p] .. offsets[p+1]-1
    new_to_orig: torch.Tensor  # [N] int64
    orig_to_new: torch.Tensor  # [N] int64

    @property
    def num_parts(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def num_nodes(self) -> int:
        return int(self.new_to_orig.numel())

    def node_range(self, part: int) -> tuple[int, int]:
        """The new ids part ``part`` owns: ``range(*node_range(part))``."""
        return int(self.offsets[part]), int(self.offsets[part + 1])

    def part_of(self, new_ids: torch.Tensor) -> torch.Tensor:
        """The part that owns each new id (empty parts own nothing)."""
        return torch.searchsorted(self.offsets, new_ids, right=True) - 1

    def to_new(self, node_data: torch.Tensor) -> torch.Tensor:
        """Rows of per-node data (original order) in the new order."""
        return node_data.index_select(0, self.new_to_orig.to(node_data.device))

    def to_orig(self, node_data: torch.Tensor) -> torch.Tensor:
        """Rows of per-node data (new order) back in the original order."""
        return node_data.index_select(0, self.orig_to_new.to(node_data.device))


def relabel(part: torch.Tensor, num_parts: int) -> Relabeling:
    """The relabeling that makes the nodes of each part contiguous, in part order."""
    part = torch.as_tensor(part)
    if part.dim() != 1 or part.dtype.is_floating_point or part.dtype == torch.bool:
        raise GraphError(f"a partition assignment is a 1-d integer tensor, got {part.dtype} "
                         f"{list(part.shape)}")
    part = part.to(torch.int64)
    if part.numel() and (int(part.min()) < 0 or int(part.max()) >= num_parts):
        raise GraphError(f"partition assignment has part ids in [{int(part.min())}, "
                         f"{int(part.max())}], expected 0..{num_parts - 1}")
    new_to_orig = torch.argsort(part, stable=True)
    orig_to_new = torch.empty_like(new_to_orig)
    orig_to_new[new_to_orig] = torch.arange(part.numel())
    offsets = torch.zeros(num_parts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.bincount(part, minlength=num_parts), 0)
    return Relabeling(offsets, new_to_orig, orig_to_new)
