"""METIS and random partitioners: valid, seeded, balanced on every constraint."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sarc.errors import GraphError
from sarc.partition import PARTITIONERS, metis_partition, random_partition

from partition_graphs import MASKS, cora  # noqa: F401  (a fixture)


def counts(part, num_parts, mask=None):
    return torch.bincount(part if mask is None else part[mask], minlength=num_parts)


def imbalance(c):
    return float(c.max()) / float(c.float().mean())


@st.composite
def graphs(draw):
    n = draw(st.integers(0, 40))
    e = draw(st.integers(0, 120)) if n else 0
    ids = st.lists(st.integers(0, max(n - 1, 0)), min_size=e, max_size=e)
    src, dst = torch.tensor(draw(ids), dtype=torch.int64), torch.tensor(draw(ids), dtype=torch.int64)
    train = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool)
    return src, dst, n, {"train_mask": train}


@settings(max_examples=60, deadline=None)
@given(graphs(), st.integers(1, 5), st.sampled_from(sorted(PARTITIONERS)), st.integers(0, 3))
def test_assignment_is_valid_and_seeded(g, num_parts, method, seed):
    src, dst, n, masks = g
    part = PARTITIONERS[method](src, dst, n, num_parts, masks=masks, seed=seed)
    assert part.dtype == torch.int64 and part.shape == (n,)
    if n:
        assert 0 <= int(part.min()) and int(part.max()) < num_parts
    assert torch.equal(part, PARTITIONERS[method](src, dst, n, num_parts, masks=masks, seed=seed))


@settings(max_examples=40, deadline=None)
@given(graphs(), st.integers(1, 5), st.integers(0, 3))
def test_random_deals_nodes_and_every_mask_evenly(g, num_parts, seed):
    src, dst, n, masks = g
    part = random_partition(src, dst, n, num_parts, masks=masks, seed=seed)
    for c in (counts(part, num_parts), counts(part, num_parts, masks["train_mask"])):
        assert int(c.max() - c.min()) <= 1


def test_random_depends_on_seed(cora):
    src, dst, n, _, _ = cora
    assert not torch.equal(random_partition(src, dst, n, 4, seed=0),
                           random_partition(src, dst, n, 4, seed=1))


@pytest.mark.parametrize("num_parts", [2, 4, 5])
def test_metis_on_cora_cuts_few_edges_and_balances_every_constraint(cora, num_parts):
    src, dst, n, nd, _ = cora
    masks = {k: nd[k] for k in MASKS}
    part = metis_partition(src, dst, n, num_parts, masks=masks)
    cut = int((part[src] != part[dst]).sum())
    rand = random_partition(src, dst, n, num_parts)
    assert cut < 0.25 * int((rand[src] != rand[dst]).sum())
    assert imbalance(counts(part, num_parts)) < 1.04            # nodes
    assert imbalance(counts(part[dst], num_parts)) < 1.04       # edges: in-degree
    for k in MASKS:                                             # train / val / test spread out
        c = counts(part, num_parts, masks[k])
        assert imbalance(c) < 1.1, (k, c)


def test_metis_constraints_take_effect():
    """A path whose left half is all train nodes: balancing nodes alone cuts it in the middle
    (all train nodes in one part); balancing train nodes too must split them evenly."""
    n = 40
    src = torch.cat([torch.arange(n - 1), torch.arange(1, n)])
    dst = torch.cat([torch.arange(1, n), torch.arange(n - 1)])
    train = torch.arange(n) < n // 2
    no_masks = metis_partition(src, dst, n, 2)
    assert sorted(counts(no_masks, 2, train).tolist()) == [0, 20]
    part = metis_partition(src, dst, n, 2, masks={"train_mask": train})
    assert counts(part, 2).tolist() == [20, 20]
    assert counts(part, 2, train).tolist() == [10, 10]


def test_bad_input_is_a_clear_error():
    src, dst = torch.tensor([0, 1]), torch.tensor([1, 2])
    with pytest.raises(GraphError, match="num_parts"):
        metis_partition(src, dst, 3, 0)
    with pytest.raises(GraphError, match="dst node id 2 is out of range"):
        random_partition(src, dst, 2, 2)
    with pytest.raises(GraphError, match="mask 'train_mask'"):
        metis_partition(src, dst, 3, 2, masks={"train_mask": torch.ones(2, dtype=torch.bool)})
    with pytest.raises(GraphError, match="integer node ids"):
        metis_partition(src.float(), dst, 3, 2)
