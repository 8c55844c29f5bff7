"""The law of a weighted sum of independent integer noises: what a derived answer's interval is computed from.

A derived cell (planning/reuse.py) is a fixed linear combination of released noisy cells: sum_s d_s Y_s, each Y_s
the sum of n_s cells of one measurement, whose noises are independent draws of one mechanism (discrete Laplace of
scale b_s, or discrete Gaussian of variance sigma_s^2, in integer grid steps). Its noise is E = sum_s w_s N_s with
w_s = d_s * step_s in value units and N_s the sum of n_s independent integer noises: a `WeightedNoise` of
`NoiseTerm`s. Its 95% interval is +/- the half-width `h` with P(|E| > h) <= 5%, computed from that law:

- **On one lattice** (every |w_s| equal, no term too wide for its integers: a coarser grouping summed from finer
  cells, or the cells of one stored measurement again): E / |w| is a sum of independent integers whose pmf is the
  FFT convolution of each term's pmf (one noise's pmf raised to the power n_s). The half-width is |w| times the least
  integer t with P(|E / |w|| > t) within the level, exactly as dp/discrete_tail.py does for quantile intervals: the
  mass cut off beyond each noise's reach and the FFT's rounding are taken off the level first (GUARD), so the
  interval covers at least 95%, never about 95%.
- **Otherwise** (inverse-variance weights, GLS: no common lattice), conservatively: each term's values are rounded
  away from zero onto a grid of spacing g (|rounding| < g each), so the rounded sum U on that grid differs from E by
  less than K g for K terms, and P(|E| > t + K g) <= P(|U| > t). A noise whose scale is too wide for its integers to
  be listed (a sum's noise is about 2**30 steps wide) is first rounded away from zero to multiples c of a step
  (|rounding| <= c - 1 per noise, counted too). The slack is a few thousandths of the noise's deviation.

`inverse_cdf` gives the law's quantiles for the fiducial intervals of AVG, VAR and STDDEV over derived cells
(dp/confidence.py), read from the same pmf, jittered within its bins to a continuous law.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism

Mechanism = LaplaceMechanism | GaussianMechanism

REACH = 30  # a Laplace noise is listed to 30 scales (mass beyond: 2 exp(-30) / (1 + alpha) < 2e-13)
GAUSSIAN_REACH = 14  # a Gaussian to 14 sigma (mass beyond below 1e-40)
GUARD = 1e-9  # taken off the level for the FFT's rounding, beside the mass cut off
TRIM = 1e-15  # a partial sum's tails below this mass are cut (and counted as cut) to keep the listings small
# A term's sum of n noises is listed on about 2**16 n points (at most 2**21): what keeps its slack below 1e-3 of its
# deviation (`_spacing`).
_TERM_POINTS, _MOST_POINTS = 1 << 16, 1 << 21
_SUM_POINTS = 1 << 17  # the rounded sum's grid: its spacing is about 5e-4 of a deviation


@dataclass(frozen=True)
class NoiseTerm:
    """`count` independent draws of one mechanism's integer noise, summed, times `weight` value units per step."""

    mechanism: Mechanism
    weight: Fraction  # coefficient * grid step: value units per integer step of the noise (its sign does not matter)
    count: int = 1

    @property
    def variance(self) -> float:
        return self.count * float(self.weight) ** 2 * self.mechanism.variance


@dataclass(frozen=True)
class _Listed:
    """A term's law listed on a lattice: P(value = (start + i) * spacing) = pmf[i], `cut` the mass left out, and
    `slack` how far the listed values may be from the true ones (in value units)."""

    pmf: np.ndarray
    start: int
    spacing: float
    cut: float
    slack: float


class WeightedNoise:
    """The law of sum_s w_s N_s over independent terms (see the module's docstring)."""

    def __init__(self, terms: Sequence[NoiseTerm]) -> None:
        merged: dict[tuple[Mechanism, Fraction], int] = {}
        for term in terms:
            if term.weight != 0 and term.count > 0 and term.mechanism.sensitivity:
                key = (term.mechanism, abs(term.weight))
                merged[key] = merged.get(key, 0) + term.count
        self.terms = tuple(NoiseTerm(mechanism, weight, count) for (mechanism, weight), count in
                           sorted(merged.items(), key=lambda item: (item[0][1], repr(item[0][0]))))

    @property
    def variance(self) -> float:
        return sum(term.variance for term in self.terms)

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)

    @property
    def exact(self) -> bool:
        """Whether the interval is exact (one lattice) rather than conservative."""
        return _lattice(self.terms) is not None

    def half_width(self, level: float) -> float:
        """The smallest h found with P(|E| > h) <= 1 - level (exact on one lattice, else conservative)."""
        if not self.terms:
            return 0.0
        return _half_width(self.terms, level)

    def inverse_cdf(self, uniform: np.ndarray) -> np.ndarray:
        """The law's quantiles at `uniform` (values in (0, 1)), the pmf's bins spread evenly: for fiducial intervals."""
        if not self.terms:
            return np.zeros_like(uniform, dtype=float)
        values, cdf = _cdf(self.terms)
        return np.interp(uniform, cdf, values)


def _lattice(terms: tuple[NoiseTerm, ...]) -> Fraction | None:
    """The common |weight| when every term lies on one lattice listed exactly, else None."""
    weights = {term.weight for term in terms}
    if len(weights) != 1:
        return None
    if any(_spacing(term) > 1 for term in terms):
        return None
    return next(iter(weights))


@functools.lru_cache(maxsize=512)
def _half_width(terms: tuple[NoiseTerm, ...], level: float) -> float:
    tail = 1 - level
    if len(terms) == 1 and terms[0].count == 1:
        term = terms[0]  # one noise: the mechanism's own exact quantile, as a lone measurement's interval
        return float(term.weight) * term.mechanism.half_width(level)
    lattice = _lattice(terms)
    if lattice is not None:
        listed = [_term_on_integers(term) for term in terms]
        pmf = _convolve([item.pmf for item in listed])
        start = sum(item.start for item in listed)
        cut = sum(item.cut for item in listed)
        return float(lattice) * _least_symmetric(pmf, start, tail - cut - GUARD)
    listed = [_term_on_lattice(term) for term in terms]
    spread = sum(item.spacing * item.pmf.size for item in listed)
    grid = spread / _SUM_POINTS
    gridded = [_on_grid(item, grid) for item in listed]
    pmf = _convolve([item.pmf for item in gridded])
    start = sum(item.start for item in gridded)
    cut = sum(item.cut for item in listed)
    slack = sum(item.slack for item in listed) + len(listed) * grid * (1 + 1e-9)
    return grid * _least_symmetric(pmf, start, tail - cut - GUARD) + slack


@functools.lru_cache(maxsize=256)
def _cdf(terms: tuple[NoiseTerm, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(values, cdf) at the bins' edges: the law with each lattice point's mass spread evenly over its bin."""
    lattice = _lattice(terms)
    if lattice is not None:
        listed = [_term_on_integers(term) for term in terms]
        pmf, start, grid = _convolve([item.pmf for item in listed]), sum(item.start for item in listed), \
            float(lattice)
    else:
        listed = [_term_on_lattice(term) for term in terms]
        grid = sum(item.spacing * item.pmf.size for item in listed) / _SUM_POINTS
        gridded = [_on_grid(item, grid) for item in listed]
        pmf, start = _convolve([item.pmf for item in gridded]), sum(item.start for item in gridded)
    pmf = pmf / pmf.sum()
    edges = (np.arange(pmf.size + 1) + start - 0.5) * grid
    cdf = np.concatenate([[0.0], np.cumsum(pmf)])
    keep = np.concatenate([[True], np.diff(cdf) > 0])  # np.interp needs increasing x: drop empty bins
    return edges[keep], np.clip(cdf[keep], 0.0, 1.0)


def _spacing(term: NoiseTerm) -> int:
    """The multiple of a step each noise is rounded to so that the listing of the term's sum (whose width grows as
    the root of its count) fits its points; 1: listed exactly. Its slack, count (spacing - 1) steps, is then about
    42 count / points of the term's deviation: below 1e-3 up to 50 noises."""
    points = min(_TERM_POINTS * term.count, _MOST_POINTS)
    return max(1, math.ceil(2 * _reach(term.mechanism) * math.sqrt(term.count) / points))


def _reach(mechanism: Mechanism) -> int:
    """How far (in steps) one noise is listed."""
    if isinstance(mechanism, GaussianMechanism):
        return math.ceil(GAUSSIAN_REACH * mechanism.scale) + 2
    return math.ceil(REACH * float(mechanism.scale)) + 1


def _one_noise(mechanism: Mechanism, spacing: int) -> np.ndarray:
    """One noise rounded away from zero to multiples of `spacing` steps: its pmf on -K..K (times spacing), the mass
    beyond K spacings left out."""
    reach = _reach(mechanism)
    k = math.ceil(reach / spacing)
    if isinstance(mechanism, LaplaceMechanism):
        u = 1 / float(mechanism.scale)

        def at_least(j: np.ndarray) -> np.ndarray:  # P(Z >= j), j >= 1: alpha^j / (1 + alpha)
            return np.exp(-j * u) / (1 + math.exp(-u))

        bins = np.arange(1, k + 1, dtype=float)
        # the integers (spacing (i - 1), spacing i] round up to spacing i
        side = at_least(spacing * (bins - 1) + 1) - at_least(spacing * bins + 1)
        zero = -math.expm1(-u) / (1 + math.exp(-u))
    else:
        sigma = mechanism.scale
        if spacing == 1:
            values = np.arange(0, k + 1, dtype=float)
            weights = np.exp(-values**2 / (2 * float(mechanism.sigma2)))
            total = weights[0] + 2 * weights[1:].sum()
            zero, side = weights[0] / total, weights[1:] / total
        else:
            # Wide enough that the discrete Gaussian is the normal density on the integers (within exp(-2 pi^2
            # sigma^2)): a bin's mass is the normal's over its integers, each integer holding its half-step around it.
            edges = (spacing * np.arange(0, k + 1, dtype=float) + 0.5) / (sigma * math.sqrt(2))
            tail = 0.5 * np.vectorize(math.erfc)(edges)
            zero, side = 1 - 2 * tail[0], tail[:-1] - tail[1:]
    pmf = np.concatenate([side[::-1], [zero], side])
    return np.clip(pmf, 0.0, None)


def _term_on_integers(term: NoiseTerm) -> _Listed:
    """The term's sum of `count` noises on its integers (exactly: no rounding)."""
    pmf, start, missing = _listing(term.mechanism, term.count, 1)
    return _Listed(pmf, start, float(term.weight), missing, 0.0)


def _term_on_lattice(term: NoiseTerm) -> _Listed:
    """The term's sum on its own lattice of `spacing` steps (rounded away from zero per noise when spacing > 1)."""
    spacing = _spacing(term)
    pmf, start, missing = _listing(term.mechanism, term.count, spacing)
    weight = float(term.weight)
    return _Listed(pmf, start, weight * spacing, missing, term.count * (spacing - 1) * weight)


@functools.lru_cache(maxsize=128)
def _listing(mechanism: Mechanism, count: int, spacing: int) -> tuple[np.ndarray, int, float]:
    """The sum of `count` noises, each rounded away from zero to multiples of `spacing` steps: its pmf, the index of
    its first value (in spacings), and the mass left out. Whatever the weight: the searches of planning/spending.py
    weigh the same stored sums many ways."""
    one = _one_noise(mechanism, spacing)
    pmf, start = _power(one, -(one.size // 2), count)
    return pmf, start, _missing(pmf)


def _power(one: np.ndarray, start: int, count: int) -> tuple[np.ndarray, int]:
    """The pmf of the sum of `count` independent copies, by repeated squaring (FFT), each partial sum's tails below
    TRIM cut off so that its listing grows as the root of the count (what was cut shows in the pmf's sum)."""
    result: tuple[np.ndarray, int] | None = None
    power, power_start = one, start
    while True:
        if count & 1:
            result = (power, power_start) if result is None else \
                _trimmed(_convolve([result[0], power]), result[1] + power_start)
        count >>= 1
        if not count:
            break
        power, power_start = _trimmed(_convolve([power, power]), 2 * power_start)
    assert result is not None
    return result


def _trimmed(pmf: np.ndarray, start: int) -> tuple[np.ndarray, int]:
    cumulative = np.cumsum(pmf)
    low = min(int(np.searchsorted(cumulative, TRIM)), pmf.size // 2)
    high = max(int(np.searchsorted(cumulative, cumulative[-1] - TRIM)), pmf.size // 2)
    return pmf[low:high + 1], start + low


def _missing(pmf: np.ndarray) -> float:
    """The mass a listing leaves out (cut beyond the reach, trimmed tails): the sum falls short of 1 by it, up to the
    FFT's rounding, which GUARD covers."""
    return max(0.0, 1.0 - float(np.sum(pmf)))  # pairwise summation: its rounding is far below GUARD


def _on_grid(listed: _Listed, grid: float) -> _Listed:
    """A listed term moved onto the common grid, each value rounded away from zero (|rounding| < grid)."""
    values = (np.arange(listed.pmf.size) + listed.start) * listed.spacing / grid
    index = (np.sign(values) * np.ceil(np.abs(values) - 1e-12)).astype(np.int64)
    low = int(index.min())
    pmf = np.bincount(index - low, weights=listed.pmf)
    return _Listed(pmf, low, grid, listed.cut, listed.slack)


def _convolve(pmfs: Sequence[np.ndarray]) -> np.ndarray:
    if len(pmfs) == 1:
        return pmfs[0]
    size = sum(p.size for p in pmfs) - len(pmfs) + 1
    length = 1 << (size - 1).bit_length()
    spectrum = np.ones(length // 2 + 1, dtype=complex)
    for pmf in pmfs:
        spectrum *= np.fft.rfft(pmf, length)
    return np.clip(np.fft.irfft(spectrum, length)[:size], 0.0, None)


def _least_symmetric(pmf: np.ndarray, start: int, tail: float) -> int:
    """The least t >= 0 (in lattice units) with P(value < -t) + P(value > t) <= tail, for a pmf on start..."""
    if tail <= 0:
        raise ValueError("the level leaves no room for the mass cut off: widen the reach")
    values = np.arange(pmf.size) + start
    below = np.concatenate([[0.0], np.cumsum(pmf)])  # below[i]: mass of indices < i
    above = np.concatenate([np.cumsum(pmf[::-1])[::-1], [0.0]])  # above[i]: mass of indices >= i
    largest = int(max(abs(values[0]), abs(values[-1])))
    low, high = -1, largest  # outside(high) is 0
    while high - low > 1:
        middle = (low + high) // 2
        if _outside(below, above, start, pmf.size, middle) <= tail:
            high = middle
        else:
            low = middle
    return high


def _outside(below: np.ndarray, above: np.ndarray, start: int, size: int, t: int) -> float:
    """P(value < -t) + P(value > t)."""
    left = min(max(-t - start, 0), size)  # index of -t: indices below it have value < -t
    right = min(max(t + 1 - start, 0), size)  # index of t + 1: indices from it have value > t
    return float(below[left] + above[right])
