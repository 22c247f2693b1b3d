"""Relabeling: each part owns a contiguous id range, and the maps are inverse permutations."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarc.errors import GraphError
from sarc.partition import relabel


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(
    lambda p: st.tuples(st.just(p), st.lists(st.integers(0, p - 1), max_size=50))))
def test_parts_own_contiguous_ranges(case):
    num_parts, assignment = case
    part = torch.tensor(assignment, dtype=torch.int64)
    n = part.numel()
    r = relabel(part, num_parts)
    assert r.num_parts == num_parts and r.num_nodes == n
    assert torch.equal(torch.sort(r.new_to_orig).values, torch.arange(n))
    assert torch.equal(r.orig_to_new[r.new_to_orig], torch.arange(n))
    assert torch.equal(r.new_to_orig[r.orig_to_new], torch.arange(n))
    for p in range(num_parts):
        lo, hi = r.node_range(p)
        owned = r.new_to_orig[lo:hi]
        assert torch.equal(owned, torch.nonzero(part == p).flatten())  # original order kept
        assert torch.equal(r.part_of(torch.arange(lo, hi)), torch.full((hi - lo,), p))
    x = torch.randn(n, 3)
    assert torch.equal(r.to_orig(r.to_new(x)), x)
    assert torch.equal(r.part_of(r.orig_to_new), part)


def test_bad_assignment():
    with pytest.raises(GraphError, match="expected 0..1"):
        relabel(torch.tensor([0, 2]), 2)
    with pytest.raises(GraphError, match="integer tensor"):
        relabel(torch.tensor([0.0, 1.0]), 2)
