"""Half-widths of confidence intervals for outputs that combine several noisy measurements.

An output such as SUM = S' + mid*N' carries the noise a1*Z1 + a2*Z2 of independent measurements. For Laplace
noise the tail of such a sum has a closed form: the characteristic function prod_i 1/(1 + b_i^2 t^2) splits into
partial fractions sum_i c_i/(1 + b_i^2 t^2) with c_i = prod_{j != i} b_i^2/(b_i^2 - b_j^2), so
P(|X| > t) = sum_i c_i exp(-t/b_i). The half-width solves P(|X| > t) = 1 - level, by bisection over all cells at
once. Scales closer than 0.1% are pulled apart (upwards, so the interval only widens) to keep the partial
fractions well conditioned. Discrete noise is treated as continuous here, which is accurate once scales exceed a
few grid steps; a lone measurement uses its exact discrete quantile instead (mechanisms.py). For Gaussian noise
the sum is Gaussian.

Outputs that are not linear in the measurements (AVG = mid + S/N, VAR, STDDEV) get a fiducial interval: the
output is recomputed from observed - noise for a deterministic, evenly spread set of noise values (the R_d
low-discrepancy sequence of Roberts 2018, pushed through each mechanism's inverse CDF), and the interval is the
central 95% of those candidates. Unlike the delta method it stays close to 95% when the noise is large against
the count (the delta method fell to 85% there). No random generator is involved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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


_FIDUCIAL_POINTS = 2048  # 1024 made the 2.5% tails too coarse: STDDEV coverage fell to 93.8%
_CHUNK = 256  # cells per batch, to keep memory at points x chunk


@functools.lru_cache(maxsize=8)
def _low_discrepancy(points: int, dimensions: int) -> np.ndarray:
    """The R_d sequence: frac((i + 1/2) * alpha_d), alpha the powers of the inverse of the generalised golden
    ratio of dimension d (the root of x^(d+1) = x + 1)."""
    phi = 2.0
    for _ in range(64):
        phi = (1 + phi) ** (1 / (dimensions + 1))
    alpha = phi ** -np.arange(1, dimensions + 1)
    return ((np.arange(points)[:, None] + 0.5) * alpha[None, :]) % 1.0


@functools.lru_cache(maxsize=8)
def _standard_noise(dimensions: int, gaussian: bool) -> np.ndarray:
    """Evenly spread draws of unit Laplace (or standard normal) noise, one row per measurement (measurements x
    points, each row contiguous: the candidates are laid out cells x points so that every per-cell pass below
    reads contiguous memory)."""
    uniform = _low_discrepancy(_FIDUCIAL_POINTS, dimensions)
    if gaussian:
        noise = np.vectorize(NormalDist().inv_cdf)(uniform)
    else:
        centered = uniform - 0.5
        noise = -np.sign(centered) * np.log1p(-2 * np.abs(centered))  # the inverse CDF of the unit Laplace
    return np.ascontiguousarray(noise.T)


@functools.lru_cache(maxsize=8)
def _ranks(points: int, tail: float) -> tuple[tuple[int, int, float], tuple[int, int, float], list[int]]:
    """For the `tail` and 1 - `tail` quantiles of `points` values, numpy's default ("linear") rule: the order
    statistics below and above the virtual index (points - 1) q, and the weight of the upper one; then every rank
    to partition at (the last, to find a NaN, which sorts last)."""
    bounds = []
    for q in np.array([tail, 1 - tail]):
        virtual = (points - 1) * q
        below = int(np.floor(virtual))
        bounds.append((below, min(below + 1, points - 1), float(virtual - below)))
    kth = sorted({rank for low, high, _ in bounds for rank in (low, high)} | {points - 1})
    return bounds[0], bounds[1], kth


def _quantiles(candidates: np.ndarray, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """np.quantile(candidates, [tail, 1 - tail], axis=1), value for value: one partition at the four order
    statistics instead of np.quantile's general path, and numpy's interpolation written out (tested equal)."""
    lower, upper, kth = _ranks(candidates.shape[1], tail)
    ordered = np.partition(candidates, kth, axis=1)
    missing = np.isnan(ordered[:, -1])  # a NaN among a cell's candidates makes both its quantiles NaN, as in numpy
    result = []
    for below, above, weight in (lower, upper):
        a, b = ordered[:, below], ordered[:, above]
        step = b - a
        value = a + step * weight
        if weight >= 0.5:  # numpy's lerp counts from the nearer end
            value = b - step * (1 - weight)
        value[missing] = np.nan
        result.append(value)
    return result[0], result[1]


def fiducial_interval(observed: Sequence[np.ndarray], scales: Sequence[float], gaussian: bool, level: float,
                      output: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, std) per cell of output(*truths), over candidate truths observed_i - scale_i * Z_i."""
    noise = _standard_noise(len(observed), gaussian)
    return _fiducial(observed, [scale * noise[i] for i, scale in enumerate(scales)], level, output)


def fiducial_interval_joint(observed: Sequence[np.ndarray], sources: Sequence[Callable[[np.ndarray], np.ndarray]],
                            loadings: np.ndarray, level: float,
                            output: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fiducial_interval for measurements whose noises are combinations of independent sources (derived cells,
    planning/reuse.py): truth_i = observed_i - sum_s loadings[i, s] N_s, each source's N_s drawn evenly from its law
    through its inverse CDF (`sources`), jointly over the sources, so that two measurements reading one source
    move together."""
    uniform = _low_discrepancy(_FIDUCIAL_POINTS, len(sources))
    noise = np.array([inverse(uniform[:, s]) for s, inverse in enumerate(sources)])  # sources x points
    deviations = [loadings[i] @ noise for i in range(len(observed))]
    return _fiducial(observed, deviations, level, output)


def _fiducial(observed: Sequence[np.ndarray], deviations: Sequence[np.ndarray], level: float,
              output: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, std) per cell of output(*truths) over the candidate truths observed_i - deviations_i (each a
    vector over the same points)."""
    cells = len(observed[0])
    low, high, std = (np.empty(cells) for _ in range(3))
    tail = (1 - level) / 2
    for start in range(0, cells, _CHUNK):
        part = slice(start, min(start + _CHUNK, cells))
        truths = [obs[part][:, None] - deviation[None, :] for obs, deviation in zip(observed, deviations, strict=True)]
        candidates = output(*truths)  # cells x points
        low[part], high[part] = _quantiles(candidates, tail)
        std[part] = candidates.std(axis=1)
    return low, high, std
