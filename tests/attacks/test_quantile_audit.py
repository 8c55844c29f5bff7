"""Empirical epsilon audit of the quantile mechanism (dp/quantile.py) on two neighbouring datasets.

D has bucket counts (1, 3, 3, 3) on a 4-candidate grid; D' adds one unit of m = 2 rows at the first candidate.
Among the pairs of this size this one brings permute-and-flip's ratio closest to e^epsilon (0.97 epsilon) at an
output drawn often enough to measure (found by enumerating every pair with the exact probabilities of
test_quantile.pf_probabilities). Each dataset is released DRAWS times at a fixed seed; for each output the
Clopper-Pearson bounds give a lower confidence bound on the log ratio of its frequencies, Bonferroni-corrected over
the outputs and both directions. The claim holds when that lower bound stays at or below epsilon; a sampler that
forgets permute-and-flip's factor 2 (ratio 1.99 epsilon here) must be caught.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from scipy.stats import beta

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile import QuantileScore, permute_and_flip

DRAWS = 20000
SEED = 23
ALPHA = 1e-3
EPSILON = Fraction(1)
SCORE = QuantileScore(Fraction(1, 2), 2)
D = (1, 3, 3, 3)
D_PRIME = (3, 3, 3, 3)

Sampler = Callable[[tuple[int, ...], InsecureSeededRandomForTests], int]


def dpsql_sampler(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> int:
    return permute_and_flip(SCORE.utilities(counts), EPSILON, SCORE.sensitivity, rng)


def factor_two_forgotten(counts: tuple[int, ...], rng: InsecureSeededRandomForTests) -> int:
    return permute_and_flip(SCORE.utilities(counts), EPSILON, SCORE.sensitivity / 2, rng)


def frequencies(sampler: Sampler, counts: tuple[int, ...], seed: int) -> list[int]:
    rng = InsecureSeededRandomForTests(seed)
    seen = [0] * len(counts)
    for _ in range(DRAWS):
        seen[sampler(counts, rng)] += 1
    return seen


def epsilon_lower_bound(sampler: Sampler) -> float:
    """A lower confidence bound (level 1 - ALPHA overall) on the largest |log ratio| of the two output laws."""
    first, second = frequencies(sampler, D, SEED), frequencies(sampler, D_PRIME, SEED + 1)
    tests = 2 * len(D)
    a = ALPHA / tests  # one-sided, per bound; two bounds per test
    witness = 0.0
    for x, y in ((first, second), (second, first)):
        for kx, ky in zip(x, y, strict=True):
            low = beta.ppf(a / 2, kx, DRAWS - kx + 1) if kx else 0.0
            high = beta.isf(a / 2, ky + 1, DRAWS - ky) if ky < DRAWS else 1.0
            if low > 0:
                witness = max(witness, math.log(low / high))
    return witness


def test_the_quantile_mechanism_stays_within_its_epsilon() -> None:
    assert epsilon_lower_bound(dpsql_sampler) <= float(EPSILON)


@pytest.mark.parametrize("sampler", [factor_two_forgotten])
def test_the_audit_catches_a_sampler_that_forgets_the_factor_two(sampler: Sampler) -> None:
    assert epsilon_lower_bound(sampler) > float(EPSILON)
