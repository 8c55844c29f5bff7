"""Exact noise tails with mpmath, for checking the partition-selection thresholds the planner computes in floats.

Discrete Laplace: P(Z >= k) = alpha^k / (1 + alpha), alpha = exp(-1/b), with b the mechanism's exact rational scale.
Discrete Gaussian: P(Z >= k) = sum_{z >= k} exp(-z^2 / 2 s2) / N, N = sum_z exp(-z^2 / 2 s2), with s2 the exact
rational variance parameter. N is sqrt(2 pi s2) (1 + 2 sum_{n >= 1} exp(-2 pi^2 s2 n^2)) by Poisson summation (an
identity, not a bound), and the tail sum is added term by term, its remainder bounded by a geometric series, so
the value returned is an upper bound within 1e-40 relative of the exact tail.
"""

from __future__ import annotations

import mpmath

from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism, Mechanism

mpmath.mp.dps = 60
_NEGLIGIBLE = mpmath.mpf(10) ** -45


def _exact(value) -> mpmath.mpf:
    """A Fraction (or int) as an mpf, to 60 digits."""
    return mpmath.mpf(value.numerator) / value.denominator


def laplace_tail(mechanism: LaplaceMechanism, k: int) -> mpmath.mpf:
    alpha = mpmath.exp(-1 / _exact(mechanism.scale))
    return alpha**k / (1 + alpha)


def gaussian_tail(mechanism: GaussianMechanism, k: int) -> mpmath.mpf:
    if k < 0:
        raise ValueError("the tail is summed from k >= 0")
    s2 = _exact(mechanism.sigma2)
    normaliser = mpmath.sqrt(2 * mpmath.pi * s2) * (1 + 2 * mpmath.nsum(
        lambda n: mpmath.exp(-2 * mpmath.pi**2 * s2 * n**2), [1, mpmath.inf]))
    term = mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * s2))  # exp(-z^2 / 2 s2) at z = k
    ratio = mpmath.exp(-(2 * mpmath.mpf(k) + 1) / (2 * s2))  # term(z + 1) / term(z)
    step = mpmath.exp(-1 / s2)  # how the ratio shrinks from one z to the next
    total = mpmath.mpf(0)
    while term > total * _NEGLIGIBLE:
        total += term
        term *= ratio
        ratio *= step
    return (total + term / (1 - ratio)) / normaliser  # the terms left fall faster than a geometric series


def tail(mechanism: Mechanism, k: int) -> mpmath.mpf:
    return laplace_tail(mechanism, k) if isinstance(mechanism, LaplaceMechanism) else gaussian_tail(mechanism, k)


def worst_release(mechanism: Mechanism, m: int, threshold: int) -> mpmath.mpf:
    """The largest chance that a group only one unit supports is released (plan._threshold's two worst cases)."""
    return max(tail(mechanism, threshold - m), m * tail(mechanism, threshold - 1))
