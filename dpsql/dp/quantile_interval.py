"""The 95% interval of a DP quantile (or MIN/MAX): noisy ranks of a few cut points around the released candidate.

The exponential mechanism says how far the released candidate's rank is from the target, but not how far its
value is: that depends on how dense the data are there, which only the data know. So part of the quantile's budget
(INTERVAL_SHARE) measures that density, after the candidate is chosen, from the same bucket counts:

- cut points at 1, 2, 4, 8, ... buckets below and above the chosen candidate (and the grid's ends) split the
  candidates into about 2 log2(K) regions, fine near the candidate and coarse far from it;
- the rows of every region are counted with discrete Laplace noise of scale m / epsilon_interval. The regions of
  one group are disjoint and one unit has at most m rows in the whole query, so the noisy counts of all regions of
  all groups move by at most m in L1 together: epsilon_interval for all of them (parallel composition). The cut
  points depend on the data only through the released candidate, so choosing them is post-processing of a DP
  output (adaptive composition);
- at a cut point p the noisy D(p) = (1 - q) * (rows below p) - q * (rows at or above p) estimates lt(p) - q n.
  If it is below -h(p), fewer than q n rows are below p, so the quantile is at least p; above +h(p), it is below p.
  h(p) is the two-sided 95% half-width of D's noise, so each test errs with probability at most 2.5%.
  The lower end climbs from the lowest cut point while each is confidently below the quantile, and the upper end
  comes down from the highest while each is confidently above it (fixed-sequence testing: the order is set before
  the counts are seen, so an end is wrong only if the first cut point past the quantile is passed, at most 2.5%);
  the bounds when none is; widened to hold the chosen candidate's bucket.

For MIN (q = 0) D(p) is the rows below p, and only the upper end can be confident; for MAX only the lower end.

h(p): the noise of D(p) is a weighted sum of k discrete Laplace noises with weight 1 - q and R - k with weight q.
Its exact law is computed (dp/discrete_tail.py) up to noise scale EXACT_SCALE, and h(p) is the least half-width
whose tail is within 2.5%: the continuous law's tail is too light for discrete noise at small scales (a single
region's test erred 4.4% at b = 0.33, red team 9), and the Cornish-Fisher quantile used before erred up to 2.6%
at b = 8.25 (issue 29). Above EXACT_SCALE, a bound proven from the exact half-width at EXACT_SCALE (`half_width`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate

from dpsql.dp.discrete_tail import upper_half_width
from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import RandomSource

# Noise scales (in rows) up to which the half-width is the discrete noise's exact one: its cost grows with the scale
# (FFT of 2 R 25 b points for R regions; 1-30 ms per region count at 64, once per scale and query). Above it, a
# bound proven from the exact one at this scale.
EXACT_SCALE = 64
INTERVAL_SHARE = Fraction(1, 4)  # of a quantile's epsilon: the rest chooses the value
LEVEL = 0.95


@dataclass(frozen=True)
class CandidateInterval:
    """Candidate indices of the interval's ends, the released candidate between them."""

    low: int
    high: int


def cut_points(chosen: int, buckets: int) -> list[int]:
    """Where regions start (candidate indices, increasing, 0 first): the chosen candidate, the one after it, and
    those 2, 4, 8, ... below and above it, within the grid (index K + 1 would be past the last candidate)."""
    cuts = {0}
    step = 1
    while step <= buckets + 1:
        cuts.update(p for p in (chosen + 1 - step, chosen + step) if 0 < p <= buckets)
        step *= 2
    return sorted(cuts)


def region_counts(counts: Sequence[int], cuts: Sequence[int]) -> list[int]:
    """The rows in each region [cuts[i], cuts[i + 1]), the last up to the top candidate."""
    ends = [*cuts[1:], len(counts)]
    return [sum(counts[start:end]) for start, end in zip(cuts, ends, strict=True)]


@functools.lru_cache(maxsize=4096)
def half_width(below: int, above: int, q: Fraction, scale: Fraction, level: float = LEVEL) -> float:
    """h with P((1 - q) * (sum of `below` discrete Laplace(scale)) - q * (sum of `above` ones) >= h) <= (1 - level)
    / 2: the discrete law's exact half-width up to EXACT_SCALE (dp/discrete_tail.py), and above it a bound proven
    from the exact one at EXACT_SCALE.

    The bound: a discrete Laplace noise is floor(E1) - floor(E2) for E1, E2 exponential of mean b (floor(E) is
    geometric with ratio exp(-1 / b)), and E1 - E2 is a continuous Laplace(b): so each discrete noise lies within 1 of
    a continuous one, and the statistic D within W = (1 - q) below + q above of its continuous twin D_c. The
    continuous law scales: D_c at scale b is b / B times D_c at scale B. So P(D_b >= h) <= P(D_c,b > h - W) =
    P(D_c,B > (h - W) B / b) <= P(D_B > (h - W) B / b - W), which is within the level when (h - W) B / b - W is at
    least the exact half-width h_B at B: h = (h_B + W) b / B + W. It is wider than the exact one by about 2 W just
    above B (W is at most the number of regions) and by W / h_B of itself far above it (2-5%)."""
    tail, scale = (1 - level) / 2, Fraction(scale)
    if not below + above:
        return 0.0
    if scale <= EXACT_SCALE:
        # The statistic takes values 1 / d apart (q = n / d), and the test compares its exact value with h: any h
        # above the value just under the least passing one decides alike. The middle of that step, as a float.
        least, step = upper_half_width(below, above, q, float(scale), tail), Fraction(1, q.denominator)
        h = float(least - step / 2)
        while Fraction(h) <= least - step:  # rounded onto a value that fails (only with huge denominators)
            h = math.nextafter(h, math.inf)
        return h
    margin = (1 - q) * below + q * above
    reference = upper_half_width(below, above, q, float(EXACT_SCALE), tail)
    bound = (reference + margin) * scale / EXACT_SCALE + margin  # exact rationals: no rounding below the bound
    h = float(bound)
    return h if Fraction(h) >= bound else math.nextafter(h, math.inf)


def interval(counts: Sequence[int], chosen: int, q: Fraction, noise: LaplaceMechanism,
             rng: RandomSource) -> CandidateInterval:
    """The interval's ends for one group, from its exact bucket counts (one noisy count per region is drawn)."""
    buckets = len(counts) - 1
    cuts = cut_points(chosen, buckets)
    noisy = [n + noise.sample(rng) for n in region_counts(counts, cuts)]
    regions = len(cuts)
    total = sum(noisy)
    below = list(accumulate(noisy))  # below[k - 1]: the noisy rows below cut k
    estimates = {k: (1 - q) * below[k - 1] - q * (total - below[k - 1]) for k in range(1, regions)}
    lower = [k for k in range(1, regions) if cuts[k] <= chosen]
    upper = [k for k in range(regions - 1, 0, -1) if cuts[k] > chosen]
    # Fixed-sequence tests, each at 2.5%: the lower end climbs from the bottom cut towards the chosen candidate
    # while each cut is confidently below the quantile, the upper end comes down from the top while each is
    # confidently above. The order is fixed before the noisy counts are seen, so an end is wrong only if the first
    # cut on the far side of the quantile is wrongly passed: at most 2.5% (no share among the cuts is needed, as
    # Bonferroni's was: it covered 98-100% where this covers 96.5-99.8%, with intervals 1.3-2x narrower).
    low, high = 0, buckets  # the bounds when no cut point is confidently on that side
    for k in lower:
        if estimates[k] > -half_width(k, regions - k, q, noise.scale):
            break
        low = cuts[k]
    for k in upper:
        if estimates[k] < half_width(k, regions - k, q, noise.scale):
            break
        high = cuts[k]
    # Widened to hold the chosen bucket, whose values run up to the next candidate (the released value is inside).
    return CandidateInterval(min(low, chosen), max(high, min(chosen + 1, buckets)))
