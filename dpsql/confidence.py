"""Half-widths of confidence intervals for outputs that combine several noisy measurements.

An output such as SUM = S' + mid*N' carries the noise a1*Z1 + a2*Z2 of independent measurements. For Laplace
noise the tail of such a sum has a closed form: the characteristic function prod_i 1/(1 + b_i^2 t^2) splits into
partial fractions sum_i c_i/(1 + b_i^2 t^2) with c_i = prod_{j != i} b_i^2/(b_i^2 - b_j^2), so
P(|X| > t) = sum_i c_i exp(-t/b_i). The half-width solves P(|X| > t) = 1 - level, by bisection over all cells at
once. Scales closer than 0.1% are pulled apart (upwards, so the interval only widens) to keep the partial
fractions well conditioned. Discrete noise is treated as continuous here, which is accurate once scales exceed a
few grid steps; a lone measurement uses its exact discrete quantile instead (mechanisms.py). For Gaussian noise
the sum is Gaussian.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

_SEPARATION = 1e-3
_ITERATIONS = 45  # halvings: the relative precision is 2**-45, far below the MC noise of any check


def laplace_sum_half_width(scales: np.ndarray, level: float) -> np.ndarray:
    """Per row of `scales` (cells x terms, each term's Laplace scale b_i >= 0): the half-width t with
    P(|sum of the terms| <= t) = level."""
    scales = np.atleast_2d(np.asarray(scales, dtype=float))
    b = np.sort(np.abs(scales), axis=1)
    floor = np.maximum(b.max(axis=1, keepdims=True), 1e-300) * 1e-9
    b = np.maximum(b, floor)  # a zero term contributes nothing; a tiny scale stands in for it
    for i in range(1, b.shape[1]):
        b[:, i] = np.maximum(b[:, i], b[:, i - 1] * (1 + _SEPARATION))
    b2 = b**2
    coefficients = np.ones_like(b)
    for i in range(b.shape[1]):
        for j in range(b.shape[1]):
            if i != j:
                coefficients[:, i] *= b2[:, i] / (b2[:, i] - b2[:, j])
    tail = 1 - level
    lo = np.zeros(b.shape[0])
    hi = b.sum(axis=1) * np.log(b.shape[1] / tail)  # a union bound: the tail there is below 1 - level
    for _ in range(_ITERATIONS):
        mid = (lo + hi) / 2
        excess = (coefficients * np.exp(-mid[:, None] / b)).sum(axis=1) > tail
        lo = np.where(excess, mid, lo)
        hi = np.where(excess, hi, mid)
    return hi


def gaussian_sum_half_width(stds: np.ndarray, level: float) -> np.ndarray:
    stds = np.atleast_2d(np.asarray(stds, dtype=float))
    return NormalDist().inv_cdf((1 + level) / 2) * np.sqrt((stds**2).sum(axis=1))
