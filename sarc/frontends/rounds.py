"""What the converters of K-round convs share (``pyg_rounds``, ``dgl_rounds``).

A conv of K rounds is K sarc layers, one per round, and torch code between them on the
node rows. In a mini-batch step each round's output has the rows of the next block's
sources, which are the first rows of the round's input (a block's destinations are its
first sources), so a value of an earlier round is cut to a later round's rows
(``later_rows``); on a whole graph that is every row.
"""
from __future__ import annotations

import torch


def later_rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t``'s first rows, as many as ``like`` has."""
    return t if t.size(0) == like.size(0) else t[:like.size(0)]
