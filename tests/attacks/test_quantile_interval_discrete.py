"""Red team 9: the interval's tests compare an INTEGER-valued noisy statistic (discrete Laplace region counts) with
a half-width h(p) taken from the CONTINUOUS Laplace's law (Cornish-Fisher). For a discrete Laplace Z,
P(Z >= h) = alpha^ceil(h) / (1 + alpha), alpha = exp(-1/b), while the continuous one has 0.5 exp(-h / b): up to
2 / (1 + alpha) times more. When the first null cut's statistic holds a single region's noise (MAX: chosen = K,
the max in bucket K - 1, the last cut K tested with one region above it; MIN symmetric), the test errs with
probability alpha / (1 + alpha) ~ 4.4% when h is just below 1 (epsilon 12.3, m = 1), 3.4-3.8% at epsilon 4-6:
not the 2.5% each test claims (quantile_interval.py: "each test errs with probability at most 2.5%"). Fixed: up to
scale 8 the half-width is the discrete law's exact one (dp/discrete_tail.py)."""

from fractions import Fraction

from scipy.stats import binom

from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile_interval import half_width, interval

SEED = 9


def test_max_lower_end_misses_at_most_2_5_percent_given_the_chosen_candidate() -> None:
    buckets = 64
    counts = [0] * (buckets + 1)
    counts[buckets - 1] = 100  # MAX is candidate 63; MAX's utility ties 63 and 64, so chosen = 64 half the time
    noise = LaplaceMechanism(1, 12.3 / 4)  # the interval's quarter of epsilon 12.3: b = 0.325, h(last cut) = 0.996
    # The continuous law's half-width was 0.996: the test passed on a noisy count of 1 (P ~ 4.4%). The discrete
    # law's exact one needs 2 (P ~ 0.2%).
    assert 1 < half_width(7, 1, Fraction(1), noise.scale) <= 2
    rng = InsecureSeededRandomForTests(SEED)
    draws = 4000
    misses = sum(interval(counts, buckets, Fraction(1), noise, rng).low > buckets - 1 for _ in range(draws))
    assert misses <= binom.ppf(1 - 1e-4, draws, 0.025)  # 139; observed ~175
