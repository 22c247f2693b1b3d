"""Negative edges of link prediction: drawn by key, so the same on any number of
workers, and from the distribution they claim (uniform; degree ** 0.75, a chi-square
test on a small graph)."""
from __future__ import annotations

import pytest
import torch

from sarc.sampling import SamplingError
from sarc.sampling.negative import (DegreeNegatives, eval_negatives, negative_sampler,
                                    train_negatives)

DEGREE = torch.tensor([0, 1, 2, 3, 5, 8, 13, 1, 0, 4])


def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile of ``df`` degrees of freedom at the normal quantile ``z``
    (3.09: 0.999), by Wilson and Hilferty's approximation."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * a ** 0.5) ** 3


@pytest.mark.parametrize("name", ["uniform", "degree"])
def test_negatives_do_not_depend_on_who_draws_them(name):
    sampler = negative_sampler(name, DEGREE.numel(), DEGREE)
    edges = torch.arange(50)
    whole = train_negatives(sampler, edges, 3, seed=4, epoch=2)
    for p in (2, 3):  # each worker its own edges, in its own order
        parts = [train_negatives(sampler, edges[r::p].flip(0), 3, seed=4, epoch=2).flip(0)
                 for r in range(p)]
        merged = torch.empty_like(whole)
        for r in range(p):
            merged[r::p] = parts[r]
        assert torch.equal(merged, whole)
    assert not torch.equal(whole, train_negatives(sampler, edges, 3, seed=4, epoch=3))
    assert not torch.equal(whole, train_negatives(sampler, edges, 3, seed=5, epoch=2))
    fixed = eval_negatives(sampler, edges, 3, seed=4, split=0)
    assert torch.equal(fixed, eval_negatives(sampler, edges, 3, seed=4, split=0))
    assert not torch.equal(fixed, eval_negatives(sampler, edges, 3, seed=4, split=1))


@pytest.mark.parametrize("name", ["uniform", "degree"])
def test_negatives_follow_their_distribution(name):
    sampler = negative_sampler(name, DEGREE.numel(), DEGREE)
    draws = train_negatives(sampler, torch.arange(4000), 5, seed=1, epoch=1).reshape(-1)
    want = (DEGREE.double() ** 0.75 / (DEGREE.double() ** 0.75).sum() if name == "degree"
            else torch.full((DEGREE.numel(),), 0.1, dtype=torch.float64))
    assert torch.allclose(sampler.probabilities(), want)
    counts = torch.bincount(draws, minlength=DEGREE.numel()).double()
    if name == "degree":
        assert counts[DEGREE == 0].sum() == 0  # a node of no edge is never a negative
    support = want > 0
    expected = want[support] * draws.numel()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(int(support.sum()) - 1), stat


def test_degree_negatives_are_not_uniform():
    sampler = DegreeNegatives(DEGREE)
    draws = train_negatives(sampler, torch.arange(2000), 5, seed=1, epoch=1).reshape(-1)
    counts = torch.bincount(draws, minlength=DEGREE.numel())
    assert counts[6] > 5 * counts[1]  # degree 13 against degree 1: 6.8 times as likely


def test_bad_samplers():
    with pytest.raises(SamplingError, match="unknown negative sampler 'zipf'"):
        negative_sampler("zipf", 10)
    with pytest.raises(SamplingError, match="at least one edge"):
        negative_sampler("degree", 3, torch.zeros(3))
