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
  h(p) is the two-sided half-width of D's noise at level 1 - 5%/c, c the cut points on p's side of the chosen
  candidate, so each end is moved by a wrong conclusion with probability at most 2.5% (Bonferroni).
  The interval runs from the highest cut point that is confidently at or below the quantile to the lowest that is
  confidently above it (the bounds when there is none), widened to hold the chosen candidate's bucket.

For MIN (q = 0) D(p) is the rows below p, and only the upper end can be confident; for MAX only the lower end.

h(p): the noise of D(p) is a weighted sum of k Laplace noises with weight 1 - q and R - k with weight q. Its
quantile is taken by the Cornish-Fisher expansion to the fourth cumulant (Laplace: kappa2 = 2 b^2, kappa4 = 12 b^4;
no skew), which is above the exact quantile for a single Laplace (2.17 sd against 2.12) and converges to it as
terms are added; the continuous Laplace's variance is above the discrete one's, so small scales err on the wide side.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import RandomSource

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
    """h with P(|(1 - q) * (sum of `below` Laplace(scale)) - q * (sum of `above` ones)| > h) ~= 1 - level."""
    weights = [float(1 - q)] * below + [float(q)] * above
    b = float(scale)
    kappa2 = sum(2 * (w * b) ** 2 for w in weights)
    if kappa2 == 0:
        return 0.0
    kappa4 = sum(12 * (w * b) ** 4 for w in weights)
    excess = kappa4 / kappa2**2
    z = NormalDist().inv_cdf((1 + level) / 2)
    return (z + (z**3 - 3 * z) * excess / 24) * kappa2**0.5


def interval(counts: Sequence[int], chosen: int, q: Fraction, noise: LaplaceMechanism,
             rng: RandomSource) -> CandidateInterval:
    """The interval's ends for one group, from its exact bucket counts (one noisy count per region is drawn)."""
    buckets = len(counts) - 1
    cuts = cut_points(chosen, buckets)
    noisy = [n + noise.sample(rng) for n in region_counts(counts, cuts)]
    regions = len(cuts)
    low, high = 0, buckets
    below = 0
    total = sum(noisy)
    # Each end may be moved by a false conclusion at any of the cut points on its side of the chosen candidate:
    # each side's 2.5% is shared among them (Bonferroni). Testing each cut at 2.5% covered 89-92% at small epsilons.
    lower_cuts = sum(1 for p in cuts[1:] if p <= chosen) or 1
    upper_cuts = (regions - 1 - sum(1 for p in cuts[1:] if p <= chosen)) or 1
    for k in range(1, regions):
        below += noisy[k - 1]
        estimate = (1 - q) * below - q * (total - below)
        side = lower_cuts if cuts[k] <= chosen else upper_cuts
        h = half_width(k, regions - k, q, noise.scale, 1 - (1 - LEVEL) / side)
        if estimate <= -h:
            low = max(low, cuts[k])
        elif estimate >= h:
            high = min(high, cuts[k])
    # Widened to hold the chosen bucket, whose values run up to the next candidate (the released value is inside).
    return CandidateInterval(min(low, chosen), max(high, min(chosen + 1, buckets)))
