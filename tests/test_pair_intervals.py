"""The interval of a sum of two counts that share a mechanism (COUNT(*) from disjoint counts) is the exact smallest
integer half-width of the sum of two independent discrete noises: checked against the convolution, computed here
independently of dpsql's closed form (Laplace) and of its own convolution (Gaussian, above the exact range)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism

LEVEL = 0.95


def _pair_coverage(weights: np.ndarray, reach: int, t: int) -> float:
    """P(|Z1 + Z2| <= t) for Z drawn from `weights` over -reach..reach."""
    one = weights / weights.sum()
    pair = np.convolve(one, one)
    middle = 2 * reach
    return float(pair[middle - t: middle + t + 1].sum()) if t >= 0 else 0.0


@pytest.mark.parametrize("scale", [0.3, 0.7, 1.0, 2.5, 5.0, 13.0, 40.0])
def test_laplace_pair_half_width_is_the_exact_smallest(scale: float) -> None:
    mechanism = LaplaceMechanism(1, 1 / scale)
    reach = int(60 * scale) + 30
    values = np.arange(-reach, reach + 1)
    weights = np.exp(-np.abs(values) / float(mechanism.scale))
    t = mechanism.pair_half_width(LEVEL)
    assert _pair_coverage(weights, reach, t) >= LEVEL > _pair_coverage(weights, reach, t - 1)


@pytest.mark.parametrize("sigma", [0.4, 1.0, 2.2, 7.0, 30.0, 99.0, 150.0, 400.0])
def test_gaussian_pair_half_width_covers_and_is_at_most_one_step_wide(sigma: float) -> None:
    """Exact at sigma <= 100; above, the normal approximation's ceiling covers and exceeds the smallest by <= 1."""
    rho = Fraction(1) / (2 * Fraction(sigma) ** 2)
    mechanism = GaussianMechanism(1, float(rho))
    reach = int(14 * sigma) + 5
    values = np.arange(-reach, reach + 1, dtype=float)
    weights = np.exp(-(values**2) / (2 * float(mechanism.sigma2)))
    t = mechanism.pair_half_width(LEVEL)
    assert _pair_coverage(weights, reach, t) >= LEVEL
    slack = 0 if sigma <= 100 else 1
    assert _pair_coverage(weights, reach, t - 1 - slack) < LEVEL


def test_a_huge_laplace_scale_keeps_its_precision() -> None:
    """At b = 2^50 alpha rounds to 1: the half-width is the continuous sum's, x b with exp(-x) (2 + x) / 2 = 0.05
    (the sum of two Laplace(b) has density (1 + |s|/b) exp(-|s|/b) / 4b)."""
    low, high = 0.0, 50.0
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if math.exp(-middle) * (2 + middle) / 2 > 1 - LEVEL else (low, middle)
    t = LaplaceMechanism(2**50, 1.0).pair_half_width(LEVEL)
    assert math.isclose(t / 2**50, low, rel_tol=1e-9)
