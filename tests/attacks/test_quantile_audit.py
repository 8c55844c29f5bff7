"""Empirical epsilon audit of the quantile mechanism (dp/quantile.py) on two neighbouring datasets.

D has bucket counts (1, 2, 0, 1) on a 4-candidate grid; D' adds one unit of m = 2 rows at the last candidate. Among
the pairs of this size this one brings the sampler's (report-noisy-max) ratio closest to e^epsilon (0.77 epsilon for
the median's bucket-rank score) at an output drawn often enough to measure (found by enumerating every pair with
counts below 4 with the exact probabilities of test_quantile.noisy_max_probabilities). Each dataset is released
DRAWS times at a fixed seed; for each output the Clopper-Pearson bounds give a lower confidence bound on the log
ratio of its frequencies, Bonferroni-corrected over the outputs and both directions. The claim holds when that lower
bound stays at or below epsilon; a sampler that forgets the factor 2 (ratio about 1.5 epsilon here) must be caught.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from scipy.stats import beta

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile import Grid, QuantileMechanism, QuantileScore, noisy_max
from dpsql.dp.quantile_interval import interval

DRAWS = 20000
SEED = 23
ALPHA = 1e-3
EPSILON = Fraction(1)
SCORE = QuantileScore(Fraction(1, 2), 2)
D = (1, 2, 0, 1)
D_PRIME = (1, 2, 0, 3)

Sampler = Callable[[tuple[int, ...], InsecureSeededRandomForTests], int]


def dpsql_sampler(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> int:
    return noisy_max(SCORE.utilities(counts), EPSILON, SCORE.sensitivity, rng)


def factor_two_forgotten(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> int:
    return noisy_max(SCORE.utilities(counts), EPSILON, SCORE.sensitivity / 2, rng)


def frequencies(sampler: Sampler, counts: tuple[int, ...], seed: int) -> list[int]:
    rng = InsecureSeededRandomForTests(seed)
    seen = [0] * len(counts)
    for _ in range(DRAWS):
        seen[sampler(counts, rng)] += 1
    return seen


def epsilon_lower_bound(sampler: Sampler) -> float:
    """A lower confidence bound (level 1 - ALPHA overall) on the largest |log ratio| of the two output laws."""
    first, second = frequencies(sampler, D, SEED), frequencies(sampler, D_PRIME, SEED + 1)
    return log_ratio_lower_bound(dict(enumerate(first)), dict(enumerate(second)), DRAWS)


def log_ratio_lower_bound(first: dict, second: dict, draws: int) -> float:
    """Over every output either law drew (counts out of `draws` each): Clopper-Pearson bounds, Bonferroni-corrected
    over the outputs and both directions, give a lower confidence bound on the largest |log ratio|."""
    outputs = first.keys() | second.keys()
    a = ALPHA / (2 * len(outputs))  # one-sided, per bound; two bounds per output and direction
    witness = 0.0
    for x, y in ((first, second), (second, first)):
        for output in outputs:
            kx, ky = x.get(output, 0), y.get(output, 0)
            low = beta.ppf(a / 2, kx, draws - kx + 1) if kx else 0.0
            high = beta.isf(a / 2, ky + 1, draws - ky) if ky < draws else 1.0
            if low > 0:
                witness = max(witness, math.log(low / high))
    return witness


def test_the_quantile_mechanism_stays_within_its_epsilon() -> None:
    assert epsilon_lower_bound(dpsql_sampler) <= float(EPSILON)


@pytest.mark.parametrize("sampler", [factor_two_forgotten])
def test_the_audit_catches_a_sampler_that_forgets_the_factor_two(sampler: Sampler) -> None:
    assert epsilon_lower_bound(sampler) > float(EPSILON)


# The whole release of one cell: the chosen candidate and its interval's ends (dp/quantile_interval.py), whose noisy
# region counts spend INTERVAL_SHARE of the epsilon. The mechanism is audited at its total epsilon on the same pair.
GRID = Grid(Fraction(0), Fraction(1), len(D) - 1, points=True)
WHOLE = QuantileMechanism(GRID, Fraction(1, 2), 2, float(EPSILON))


def whole_release(mechanism: QuantileMechanism) -> Callable[[tuple[int, ...], InsecureSeededRandomForTests], tuple]:
    def sample(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> tuple:
        released = mechanism.release(counts, rng)
        return released.value, released.low, released.high
    return sample


def factor_two_forgotten_in_the_whole(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> tuple:
    """The value sampled at the whole epsilon with half the sensitivity (about 1.5 epsilon on this pair), the
    interval as released. (Subtler faults, such as forgetting only the split, move this pair's ratio by less than
    the audit resolves: the interval's noisy counts are read through a threshold, which hides most of their ratio.)"""
    chosen = noisy_max(SCORE.utilities(counts), EPSILON, SCORE.sensitivity / 2, rng)
    ends = interval(counts, chosen, Fraction(1, 2), WHOLE.interval_noise, rng)
    return chosen, ends.low, ends.high


JOINT_DRAWS = 30000  # more outputs than the value alone: more draws for the same power


def joint_epsilon_lower_bound(sampler: Callable) -> float:
    """As epsilon_lower_bound, over every output seen (value, low, high), Bonferroni-corrected over them."""
    laws = []
    for counts, seed in ((D, SEED), (D_PRIME, SEED + 1)):
        rng = InsecureSeededRandomForTests(seed)
        seen: dict[tuple, int] = {}
        for _ in range(JOINT_DRAWS):
            output = sampler(counts, rng)
            seen[output] = seen.get(output, 0) + 1
        laws.append(seen)
    return log_ratio_lower_bound(laws[0], laws[1], JOINT_DRAWS)


def test_the_whole_quantile_release_stays_within_its_epsilon() -> None:
    assert joint_epsilon_lower_bound(whole_release(WHOLE)) <= float(EPSILON)


def test_the_joint_audit_catches_a_whole_release_that_forgets_the_factor_two() -> None:
    assert joint_epsilon_lower_bound(factor_two_forgotten_in_the_whole) > float(EPSILON)


def test_the_release_without_an_interval_stays_within_its_epsilon() -> None:
    """With no interval asked for the value has the whole epsilon (not 3/4 of it): the value alone, audited as the
    sampler is, and its ends are NaN (nothing else is released)."""
    mechanism = QuantileMechanism(GRID, Fraction(1, 2), 2, float(EPSILON), Fraction(0))
    assert mechanism.point_epsilon == EPSILON

    def value_only(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> int:
        released = mechanism.release(counts, rng)
        assert math.isnan(released.low) and math.isnan(released.high)
        return round(released.value)

    assert epsilon_lower_bound(value_only) <= float(EPSILON)
