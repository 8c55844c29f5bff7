"""The exact upper tail of (1 - q) A - q B, A and B sums of independent discrete Laplace noises: what a quantile
interval's test (quantile_interval.py) compares with its half-width.

At small scales the continuous Laplace's tail is too light for discrete noise: P(Z >= h) = alpha^ceil(h) /
(1 + alpha), alpha = exp(-1 / b), is up to 2 / (1 + alpha) times 0.5 exp(-h / b), so a test on a single region's
count set at 2.5% erred 4.4% at b = 0.33 (red team 9); and a Cornish-Fisher quantile of the sum erred 2.6% at
b = 8.25 (issue 29). So the half-width is computed from the discrete law itself. With q = n / d the statistic is
X / d, X = (d - n) A - n B an integer: the test passes when X >= ceil(d h), exactly as the interval decides it
(its estimates are exact fractions). The law of each sum is computed by FFT (the pmf of one noise raised to the
power of the count), P(X >= t) = sum over a of P(A = a) P(B <= floor(((d - n) a - t) / n)) in integers, and the
least integer t whose tail is within the level is found by bisection.

Floats carry the probabilities: the FFT's rounding (about 1e-15 per value) and the mass cut off beyond REACH scales
(under 3e-11 per noise) are taken off the level before the search (GUARD), so the tail at the half-width is at
most the level, not about it.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from dpsql.dp.mechanisms import smallest

REACH = 25  # one noise is cut at 25 b: the mass beyond, 2 exp(-25) / (1 + alpha), is below 3e-11
GUARD = 1e-9  # taken off the level for the FFT's rounding, beside the mass cut off (far below any effect on h)


@functools.lru_cache(maxsize=256)
def _sum_pmf(count: int, alpha: float, reach: int) -> np.ndarray:
    """The pmf of the sum of `count` discrete Laplace noises on -count*reach .. count*reach (index i: i - count
    reach)."""
    if count == 0:
        return np.ones(1)
    values = np.arange(-reach, reach + 1)
    one = (1 - alpha) / (1 + alpha) * alpha ** np.abs(values)
    size = 2 * count * reach + 1
    length = 1 << (size - 1).bit_length()
    pmf = np.fft.irfft(np.fft.rfft(one, length) ** count, length)[:size]
    return np.clip(pmf, 0.0, None)


@functools.lru_cache(maxsize=4096)
def upper_half_width(below: int, above: int, q: Fraction, scale: float, tail: float) -> Fraction:
    """The least value h of (1 - q) A - q B with P((1 - q) A - q B >= h) <= tail, A the sum of `below` and B of
    `above` discrete Laplace noises of scale `scale` (P(Z = z) proportional to exp(-|z| / scale)): a multiple of
    1 / q's denominator, exact. The law is symmetric, so h also bounds the lower tail."""
    q = Fraction(q)
    n, d = q.numerator, q.denominator
    alpha = math.exp(-1 / scale)
    reach = math.ceil(REACH * scale) + 1
    cut_off = 2 * alpha ** (reach + 1) / (1 + alpha)  # one noise's mass beyond the reach
    level = tail - (below + above) * cut_off - GUARD
    first, second = _sum_pmf(below, alpha, reach), _sum_pmf(above, alpha, reach)
    values = np.arange(-below * reach, below * reach + 1, dtype=np.int64)
    second_cdf = np.concatenate([[0.0], np.cumsum(second)])  # index i + 1: P(B <= i - above reach)
    spread = (d - n) * below * reach + n * above * reach  # |X| is at most this
    if d * spread >= 2**62:
        return _fine_half_width(first, second_cdf, values, above * reach, q, level)
    scaled = values * (d - n)  # (d - n) a for each value a of A

    def exceed(t: int) -> float:
        """P(X >= t) = sum over a of P(A = a) P(n B <= (d - n) a - t)."""
        if n == 0:  # X = A
            return float(first[values >= t].sum())
        limit = (scaled - t) // n + above * reach  # the index of the largest B allowed
        inside = np.clip(limit, -1, second.size - 1).astype(np.int64)
        return float((first * second_cdf[inside + 1]).sum())

    # The law is symmetric and the level below 1/2, so the least t is positive: galloped to, then bisected.
    return Fraction(smallest(lambda t: exceed(t) <= level), d)


def _fine_half_width(first: np.ndarray, second_cdf: np.ndarray, values: np.ndarray, offset: int, q: Fraction,
                     level: float) -> Fraction:
    """upper_half_width for a q whose denominator is too large for X in 64 bits (0.3333333333333333): searched in
    floats, then raised by a margin (1e-6 (1 + |h|)) far above their rounding (about 1e-16 of values below 1e6), so
    that every value of the statistic at or above the result was counted at the h found: its tail is within the
    level."""
    ratio, share = float((1 - q) / q), float(q)

    def exceed(h: float) -> float:  # P((1 - q) A - q B >= h) = sum over a of P(A = a) P(B <= ((1 - q) a - h) / q)
        limit = np.floor(ratio * values - h / share).astype(np.int64) + offset
        return float((first * second_cdf[np.clip(limit, -1, second_cdf.size - 2) + 1]).sum())

    low, high = -float(np.abs(values).max()) - offset - 1.0, float(np.abs(values).max()) + offset + 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if exceed(middle) <= level:
            high = middle
        else:
            low = middle
    return Fraction(high) + Fraction(1, 10**6) * (1 + abs(Fraction(high)))
