"""The exact half-width of a quantile interval's test at small noise scales (dp/discrete_tail.py), against the
discrete Laplace law written out: the least h whose tail is at most the level, and no smaller one."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from dpsql.dp.discrete_tail import upper_half_width


def _pmf(z: int, scale: float) -> float:
    alpha = math.exp(-1 / scale)
    return (1 - alpha) / (1 + alpha) * alpha ** abs(z)


def _tail(below: int, above: int, q: Fraction, scale: float, h: float) -> float:
    """P((1 - q) A - q B >= h) by enumeration (each noise within +-30 scales), the comparison exact as the
    interval's (its estimates are fractions)."""
    reach = range(-int(30 * scale) - 2, int(30 * scale) + 3)
    total = 0.0
    for noises in itertools.product(reach, repeat=below + above):
        value = (1 - q) * sum(noises[:below]) - q * sum(noises[below:])
        if value >= h:
            total += math.prod(_pmf(z, scale) for z in noises)
    return total


@pytest.mark.parametrize(("below", "above", "q", "scale"),
                         [(0, 1, Fraction(1), 0.325), (1, 0, Fraction(0), 1.0), (1, 1, Fraction(1, 2), 0.5),
                          # Three noises: the brute-force tail sums about a million terms (seconds each).
                          pytest.param(2, 1, Fraction(1, 10), 0.8, marks=pytest.mark.slow),
                          pytest.param(1, 2, Fraction(9, 10), 1.3, marks=pytest.mark.slow)])
def test_the_half_width_is_the_least_h_whose_tail_is_within_the_level(below: int, above: int, q: Fraction,
                                                                      scale: float) -> None:
    h = upper_half_width(below, above, q, scale, 0.025)
    assert _tail(below, above, q, scale, h) <= 0.025
    # The statistic takes values on a grid of 1 / q's denominator: from the one below h, the tail is above the level.
    assert _tail(below, above, q, scale, h - Fraction(1, q.denominator)) > 0.025
