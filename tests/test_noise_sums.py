"""The law of a weighted sum of released noises (dp/noise_sums.py): exact on one lattice, conservative and tight
otherwise, checked against the law computed by brute force (every combination of the noises' values)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.dp.noise_sums import NoiseTerm, WeightedNoise

LEVEL = 0.95


def _pmf(mechanism, reach: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.arange(-reach, reach + 1)
    if isinstance(mechanism, LaplaceMechanism):
        alpha = math.exp(-1 / float(mechanism.scale))
        weights = alpha ** np.abs(values)
    else:
        weights = np.exp(-values.astype(float) ** 2 / (2 * float(mechanism.sigma2)))
    return values, weights / weights.sum()


def _brute(terms: list[tuple[object, float, int]], reach: int) -> tuple[np.ndarray, np.ndarray]:
    """Every value of sum w_s N_s with its probability (independent noises, each listed to `reach`)."""
    values, probabilities = np.zeros(1), np.ones(1)
    for mechanism, weight, count in terms:
        one_values, one_p = _pmf(mechanism, reach)
        for _ in range(count):
            values = (values[:, None] + weight * one_values[None, :]).ravel()
            probabilities = (probabilities[:, None] * one_p[None, :]).ravel()
            order = np.argsort(values, kind="stable")
            values, probabilities = values[order], probabilities[order]
            keep = np.concatenate([[True], np.diff(values) > 1e-9])
            group = np.cumsum(keep) - 1
            values, probabilities = values[keep], np.bincount(group, weights=probabilities)
    return values, probabilities


def _outside(values: np.ndarray, probabilities: np.ndarray, t: float) -> float:
    return float(probabilities[np.abs(values) > t + 1e-9].sum())


@pytest.mark.parametrize(("scale", "count"), [(0.4, 1), (0.4, 5), (2.5, 3), (5.0, 6), (12.0, 2)])
def test_on_one_lattice_the_interval_is_exact(scale: float, count: int) -> None:
    """A sum of n cells of one measurement: the least whole t with P(|S| > t) <= 5%, as the law computed apart."""
    mechanism = LaplaceMechanism(1, 1 / scale)
    law = WeightedNoise([NoiseTerm(mechanism, Fraction(1), count)])
    assert law.exact
    values, probabilities = _brute([(mechanism, 1.0, count)], int(40 * scale) + 2)
    t = law.half_width(LEVEL)
    assert t == int(t) and _outside(values, probabilities, t) <= 1 - LEVEL < _outside(values, probabilities, t - 1)


def test_two_measurements_of_one_step_are_one_lattice() -> None:
    first, second = LaplaceMechanism(2, 1.0), LaplaceMechanism(3, 0.7)
    law = WeightedNoise([NoiseTerm(first, Fraction(1), 2), NoiseTerm(second, Fraction(-1), 1)])
    assert law.exact
    values, probabilities = _brute([(first, 1.0, 2), (second, 1.0, 1)], 60)
    t = law.half_width(LEVEL)
    assert _outside(values, probabilities, t) <= 1 - LEVEL < _outside(values, probabilities, t - 1)


@pytest.mark.parametrize("terms", [
    [(LaplaceMechanism(1, 0.5), 0.3, 1), (LaplaceMechanism(1, 0.4), 0.7, 2)],
    [(LaplaceMechanism(3, 1.0), 0.25, 2), (LaplaceMechanism(1, 0.9), 0.55, 1), (LaplaceMechanism(2, 2.0), 1.3, 1)],
    [(GaussianMechanism(1, 0.05), 0.6, 2), (GaussianMechanism(1, 0.2), 0.4, 1)],
])
def test_weighted_intervals_cover_and_are_tight(terms: list[tuple[object, float, int]]) -> None:
    """Without a common lattice the half-width is conservative: P(|E| > h) <= 5% under the exact law, and h exceeds
    the exact 95% quantile by less than 1% of the deviation."""
    law = WeightedNoise([NoiseTerm(m, Fraction(w), n) for m, w, n in terms])
    assert not law.exact
    values, probabilities = _brute(terms, 45)
    h = law.half_width(LEVEL)
    assert _outside(values, probabilities, h) <= 1 - LEVEL
    order = np.argsort(np.abs(values))
    cumulative = np.cumsum(probabilities[order])
    quantile = float(np.abs(values)[order][np.searchsorted(cumulative, LEVEL - 1e-12)])
    assert h - quantile < 0.01 * law.std
    # (the brute force lists each noise to 45 steps: its variance falls short by its tails, under 1e-4)
    assert law.variance == pytest.approx(float((probabilities * values**2).sum()), rel=1e-4)


def test_wide_noises_are_rounded_conservatively() -> None:
    """Sums of noises far too wide to list (a SUM's noise is about 2**30 steps): rounded per noise, with that slack
    counted; the interval still covers (against the continuous law the discrete one is within a step of) and is
    within 0.5% of the normal-free law's quantile, found by Monte Carlo."""
    wide, other = LaplaceMechanism(5 * 2**30, 0.5), LaplaceMechanism(5 * 2**30, 0.3)
    step = Fraction(1, 2**29)
    law = WeightedNoise([NoiseTerm(wide, step * Fraction(2, 5), 54), NoiseTerm(other, step * Fraction(3, 5), 1)])
    rng = np.random.default_rng(3)
    draws = 400_000
    scale_wide, scale_other = float(wide.scale * step), float(other.scale * step)
    sample = 0.4 * rng.laplace(0, scale_wide, (draws, 54)).sum(axis=1) + 0.6 * rng.laplace(0, scale_other, draws)
    h = law.half_width(LEVEL)
    inside = float((np.abs(sample) <= h).mean())
    # binomial standard error of the coverage estimate: about 3.4e-4; allow 4 of them
    assert inside >= LEVEL - 4 * math.sqrt(LEVEL * (1 - LEVEL) / draws)
    assert h <= np.quantile(np.abs(sample), LEVEL) * 1.005


def test_the_quantile_function_is_the_laws() -> None:
    mechanism = LaplaceMechanism(1, 0.25)
    law = WeightedNoise([NoiseTerm(mechanism, Fraction(1), 3)])
    uniform = np.array([0.025, 0.5, 0.975])
    low, middle, high = law.inverse_cdf(uniform)
    assert middle == pytest.approx(0, abs=0.5) and low == pytest.approx(-high, rel=1e-9)
    assert abs(high) <= law.half_width(LEVEL) + 0.5
