"""The exact upper tail of (1 - q) A - q B, A and B sums of independent discrete Laplace noises: what a quantile
interval's test (quantile_interval.py) compares with its half-width when the noise scale is small.

At small scales the continuous Laplace's tail is too light for discrete noise: P(Z >= h) = alpha^ceil(h) /
(1 + alpha), alpha = exp(-1 / b), is up to 2 / (1 + alpha) times 0.5 exp(-h / b), so a test on a single region's
count set at 2.5% erred 4.4% at b = 0.33 (red team 9). Here the law of each sum is computed by FFT (the pmf of
one noise raised to the power of the count), then P((1 - q) A - q B >= h) = sum over a of P(A = a) P(B <= ((1 - q)
a - h) / q), and the half-width is found by bisection. Floats serve here: this sets the width of an interval (its
coverage), not a probability of the mechanism, and the error of the FFT (about 1e-15) is far below the 2.5% level.
"""

from __future__ import annotations

import functools
import math

import numpy as np

REACH = 25  # one noise is cut at 25 b: the mass beyond, 2 exp(-25) / (1 + alpha), is below 3e-11


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
def upper_half_width(below: int, above: int, q: float, scale: float, tail: float) -> float:
    """The least h with P((1 - q) A - q B >= h) <= tail, A the sum of `below` and B of `above` discrete Laplace
    noises of scale `scale` (P(Z = z) proportional to exp(-|z| / scale)). The law is symmetric, so h also bounds
    the lower tail."""
    alpha = math.exp(-1 / scale)
    reach = math.ceil(REACH * scale) + 1
    first, second = _sum_pmf(below, alpha, reach), _sum_pmf(above, alpha, reach)
    a = np.arange(first.size) - below * reach
    second_cdf = np.cumsum(second)
    offset = above * reach

    def exceed(h: float) -> float:
        if q == 0:
            return float(first[a >= h].sum())
        if q == 1:  # -B >= h: as likely as B >= h (the law is symmetric)
            return float(second[np.arange(second.size) - offset >= h].sum())
        limit = np.floor(((1 - q) * a - h) / q).astype(np.int64) + offset  # B <= limit
        below_limit = np.where(limit < 0, 0.0, second_cdf[np.clip(limit, 0, second.size - 1)])
        return float((first * below_limit).sum())

    low, high = 0.0, (1 - q) * below * reach + q * above * reach + 1.0
    for _ in range(40):  # to within 2**-40 of the range above the least h (every h kept satisfies the tail)
        middle = (low + high) / 2
        if exceed(middle) <= tail:
            high = middle
        else:
            low = middle
    return high
