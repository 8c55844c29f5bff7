"""The quantile mechanism (dp/quantile.py): grid, utility sensitivity, exact report-noisy-max, accuracy, refusals."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from scipy.stats import binom

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile import (
    QuantileScore,
    describe,
    grid_for,
    noisy_max,
    release,
    utility_tail,
)
from tests.sizes import cases

SEED = 10


def noisy_max_probabilities(utilities: list[Fraction], epsilon: Fraction, sensitivity: Fraction) -> list[float]:
    """noisy_max's exact output distribution (up to a 1e-15 tail), from the law of its geometric noise: candidate i
    wins with noise k when every other noisy utility is at most u_i + k, sharing equally with those equal to it."""
    scale = math.lcm(*(u.denominator for u in utilities))
    scaled = [int(u * scale) for u in utilities]
    r = math.exp(-float(epsilon / (2 * sensitivity * scale)))
    top = int(math.log(1e-15) / math.log(r)) + 1
    below = lambda j, s: 1 - r ** (s - scaled[j]) if s > scaled[j] else 0.0  # noqa: E731 - P(u_j + G_j < s)
    equal = lambda j, s: (1 - r) * r ** (s - scaled[j]) if s >= scaled[j] else 0.0  # noqa: E731
    out = []
    for i, u in enumerate(scaled):
        total = 0.0
        for k in range(top):
            ties = [1.0]  # ties[t]: probability that exactly t others equal u + k and the rest are below it
            for j in range(len(scaled)):
                if j != i:
                    lt, eq = below(j, u + k), equal(j, u + k)
                    ties = [a * lt + b * eq for a, b in zip([*ties, 0.0], [0.0, *ties], strict=True)]
            total += (1 - r) * r ** k * sum(p / (t + 1) for t, p in enumerate(ties))
        out.append(total)
    return out


def test_the_grid_takes_every_integer_of_a_small_range_and_2_to_the_12_buckets_otherwise() -> None:
    small = grid_for(1, 1001, integer=True)
    assert (small.candidates, small.value(0), small.value(1000), small.bucket(17)) == (1001, 1.0, 1001.0, 16)
    wide = grid_for(0.0, 1e6, integer=True)
    assert wide.buckets == 4096 and wide.value(4096) == 1e6
    real = grid_for(-1.5, 2.5, integer=False)
    assert (real.bucket(-99), real.bucket(2.5), real.bucket(99), real.bucket(0.0)) == (0, 4096, 4096, 1536)
    assert grid_for(3, 3, integer=True).candidates == 1


@pytest.mark.parametrize("q", [Fraction(0), Fraction(1, 10), Fraction(1, 2), Fraction(9, 10), Fraction(1)])
@pytest.mark.parametrize("m", [1, 3])
def test_one_unit_moves_every_utility_by_at_most_the_sensitivity(q: Fraction, m: int) -> None:
    """Removing one unit (up to m rows, anywhere on the grid, ties included) from random data."""
    rng = random.Random(SEED)
    scores = [QuantileScore(q, m)]
    worst = {score: Fraction(0) for score in scores}
    for _ in range(300):
        counts = [rng.choice([0, 0, 1, 2, 5]) for _ in range(rng.randint(1, 12))]
        removed = list(counts)
        for _ in range(rng.randint(1, m)):
            occupied = [j for j, c in enumerate(removed) if c]
            if occupied:
                removed[rng.choice(occupied)] -= 1
        for score in scores:
            moved = max(abs(a - b) for a, b in zip(score.utilities(counts), score.utilities(removed), strict=True))
            assert moved <= score.sensitivity, (score, counts, removed)
            worst[score] = max(worst[score], moved)
    # The bound is tight (a test that could not fail would prove nothing).
    assert all(worst[score] == score.sensitivity for score in scores), worst


def test_noisy_max_is_epsilon_dp_exactly_on_neighbours() -> None:
    """Exact output probabilities on D and D' = D plus one unit of m rows: every ratio within e^epsilon."""
    epsilon, m, q = Fraction(1), 2, Fraction(1, 2)
    d = [1, 0, 2, 1, 0]
    worst = 0.0
    for a in range(5):
        for b in range(5):
            neighbour = list(d)
            neighbour[a] += 1
            neighbour[b] += 1
            score = QuantileScore(q, m)
            p = noisy_max_probabilities(score.utilities(d), epsilon, score.sensitivity)
            r = noisy_max_probabilities(score.utilities(neighbour), epsilon, score.sensitivity)
            worst = max(worst, *(abs(math.log(x / y)) for x, y in zip(p, r, strict=True)))
    assert worst <= float(epsilon) + 1e-12
    assert worst > 0.3 * float(epsilon)  # the neighbours are far enough apart for the check to mean something


@pytest.mark.parametrize("vector_from", [64, 0])  # the scalar draws and the vectorised ones (dp/noise_vector.py)
def test_the_sampler_draws_noisy_maxs_distribution(vector_from: int, monkeypatch) -> None:
    monkeypatch.setattr("dpsql.dp.quantile.VECTOR_FROM", vector_from)
    utilities = [Fraction(0), Fraction(-1), Fraction(-3), Fraction(-1, 2)]
    expected = noisy_max_probabilities(utilities, Fraction(1), Fraction(1))
    rng = InsecureSeededRandomForTests(SEED)
    draws = cases(20000, floor=5000)
    seen = [0] * 4
    for _ in range(draws):
        seen[noisy_max(utilities, Fraction(1), Fraction(1), rng)] += 1
    for count, p in zip(seen, expected, strict=True):
        # Each count within its two-sided binomial 1e-4 quantiles (Bonferroni over 4 cells stays below 1e-3).
        assert binom.ppf(1e-4, draws, p) <= count <= binom.isf(1e-4, draws, p), (seen, expected)


def test_the_median_of_1_to_1001_at_epsilon_10_lands_near_501() -> None:
    grid = grid_for(1, 1001, integer=True)
    counts = [1] * grid.candidates
    rng = InsecureSeededRandomForTests(SEED)
    medians = [grid.value(release(counts, QuantileScore(Fraction(1, 2), 1), Fraction(10), rng)) for _ in range(50)]
    assert all(abs(v - 501) <= 4 for v in medians), medians


def test_min_and_max_are_the_ends_lands_between_the_bound_and_the_extreme() -> None:
    """q = 0 and q = 1: every bucket from a bound to the extreme's scores 0, so the answer is there (uniformly), up
    to the mechanism's rank error; at a large epsilon never inside the data by more than a few rows."""
    grid = grid_for(0, 4000, integer=True)
    counts = [0] * grid.candidates
    for x in range(1000, 3001):
        counts[grid.bucket(x)] += 1
    rng = InsecureSeededRandomForTests(SEED)
    lows = [grid.value(release(counts, QuantileScore(Fraction(0), 1), Fraction(50), rng)) for _ in range(40)]
    highs = [grid.value(release(counts, QuantileScore(Fraction(1), 1), Fraction(50), rng)) for _ in range(40)]
    assert all(0 <= v <= 1001 for v in lows) and all(2999 <= v <= 4000 for v in highs)
    assert min(lows) < 500 and max(highs) > 3500  # spread over the tie, not stuck at the extreme


def test_the_rank_error_stays_within_the_95_percent_tail() -> None:
    """Coverage of the rank interval [q n - t, q n + t]: at least 95% up to a binomial tolerance."""
    grid = grid_for(0, 999, integer=True)
    rng_data = random.Random(SEED)
    counts = [0] * grid.candidates
    values = [min(999, int(rng_data.expovariate(1 / 150))) for _ in range(400)]
    for x in values:
        counts[grid.bucket(x)] += 1
    q, epsilon = Fraction(1, 4), Fraction(1, 2)
    score = QuantileScore(q, 1)
    utilities = score.utilities(counts)
    t = utility_tail(epsilon, score.sensitivity, grid.candidates)
    rng = InsecureSeededRandomForTests(SEED)
    trials = 400
    misses = sum(max(utilities) - utilities[release(counts, score, epsilon, rng)] > t for _ in range(trials))
    # Misses ~ Binomial(trials, p <= 0.05): fail only when P(X >= misses | p = 0.05) < 1e-3.
    assert binom.sf(misses - 1, trials, 0.05) >= 1e-3, misses


@pytest.mark.parametrize("q", [Fraction(-1, 10), Fraction(11, 10)])
def test_q_outside_0_1_is_refused(q: Fraction) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        QuantileScore(q, 1)


def test_unbounded_or_inverted_bounds_are_refused() -> None:
    for low, high in ((0.0, math.inf), (-math.inf, 0.0), (math.nan, 1.0), (2.0, 1.0)):
        with pytest.raises(ValueError, match="finite bounds"):
            grid_for(low, high, integer=False)


def test_explain_names_the_mechanism_the_grid_and_the_rank_error() -> None:
    grid = grid_for(1, 1001, integer=True)
    text = describe(grid, QuantileScore(Fraction(1, 2), 1), Fraction(10))
    assert "report-noisy-max" in text and "1001 candidates from 1 to 1001 in steps of 1" in text
    assert "rank error at most 1.0 rows" in text
    assert "the 0 quantile (MIN)" in describe(grid, QuantileScore(Fraction(0), 1), Fraction(1))


def _low_end_misses(sequential: bool, draws: int = 4000) -> int:
    """How often the interval's lower end lands above the quantile when the cut points between the quantile and
    the chosen candidate are all on a tie (D(p) = 0: no rows between them, half the rows below): the worst case of
    each test, repeated at every cut. Rows: 100 in bucket 5 and 100 in bucket 60 of 64; the median's value
    (quantile_cont) is their middle, bucket 32.5; the chosen candidate 50 overshoots it."""
    from dpsql.dp.mechanisms import LaplaceMechanism
    from dpsql.dp.quantile_interval import cut_points, half_width, interval, region_counts
    counts = [0] * 65
    counts[5] = counts[60] = 100
    chosen, q, noise = 50, Fraction(1, 2), LaplaceMechanism(1, 0.25)
    rng = InsecureSeededRandomForTests(SEED)
    misses = 0
    for _ in range(draws):
        if sequential:
            low = interval(counts, chosen, q, noise, rng).low
        else:  # each cut tested at 2.5% and no stop: what the fixed sequence replaces must be caught
            cuts = cut_points(chosen, 64)
            noisy = [n + noise.sample(rng) for n in region_counts(counts, cuts)]
            total, low = sum(noisy), 0
            for k in range(1, len(cuts)):
                below = sum(noisy[:k])
                if cuts[k] <= chosen and below - q * total <= -half_width(k, len(cuts) - k, q, noise.scale):
                    low = max(low, cuts[k])
        misses += low > 32
    return misses


def test_the_interval_s_fixed_sequence_keeps_each_end_within_2_5_percent_at_its_worst() -> None:
    """Each end may be wrong with probability at most 2.5% (one-sided): the count of misses over 4,000 draws must
    not exceed Binomial(4000, 0.025)'s 1 - 1e-4 quantile; testing every cut at 2.5% without stopping exceeds it."""
    limit = binom.ppf(1 - 1e-4, 4000, 0.025)
    assert _low_end_misses(sequential=True) <= limit
    assert _low_end_misses(sequential=False) > limit
