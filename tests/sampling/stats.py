"""Chi-square goodness of fit without scipy."""
from __future__ import annotations

import math

import torch

Z_999 = 3.090232  # the standard normal's 0.999 quantile


def chi2_critical(dof: int, z: float = Z_999) -> float:
    """The chi-square distribution's quantile (0.999 by default), Wilson-Hilferty's
    approximation (within a percent or two from 3 degrees of freedom up)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, expected: torch.Tensor) -> float:
    counts, expected = counts.to(torch.float64), expected.to(torch.float64)
    return float(((counts - expected) ** 2 / expected).sum())


def assert_fits(counts: torch.Tensor, probs: torch.Tensor, draws: int, what: str = "") -> None:
    """``counts`` (one per category with probability ``probs``, ``draws`` draws) fit the
    distribution at the 0.999 level (categories of probability 0 must be 0)."""
    probs = probs.to(torch.float64)
    zero = probs == 0
    assert (counts[zero] == 0).all(), f"{what}: drawn with probability 0"
    live = ~zero
    stat = chi2(counts[live], probs[live] * draws)
    dof = int(live.sum()) - 1
    assert stat < chi2_critical(dof), f"{what}: chi-square {stat:.1f} over {dof} dof"
