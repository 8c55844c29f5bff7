"""DP quantiles, MIN and MAX: the exponential mechanism's rank utility over a candidate grid, sampled exactly by
report-noisy-max with geometric noise.

The engine never hands rows to Python: it counts the (clamped, contribution-bounded) rows per candidate bucket,
and everything here works from those counts, at most `Grid.candidates` integers per group.

Grid. The bounds [low, high] are cut into K buckets of equal width w; candidate j is low + j*w, j = 0..K, and a
value x falls in bucket floor((clamp(x) - low) / w). Rounding every row down to its candidate is a function of one
row, so it changes no sensitivity; the released value is the quantile of the rounded data, at most w below the
quantile of the data. K: integer columns whose range has at most MAX_INTEGER_CANDIDATES values get every integer
(w = 1, no rounding at all); otherwise K = 2**GRID_BITS. Why 2**12: the rank error grows only with ln(K+1)
(6.9 at K = 1024, 8.3 at 4096) while the rounding error falls with w = (high - low)/K. Measured against Tumult and
OpenDP (benchmarks/quantile_accuracy.py), 2**10 left dpsql's value error at a quarter of a bucket from epsilon 1 up
on dense data (4.9 wide on visits' cost: 1.7 against Tumult's 0.36 at epsilon 10); 2**12 cut that to 0.15 with
the errors at small epsilons unchanged within noise. The cost is time: the sampler draws one exact noise value per
candidate, about 6 ms per released cell at 4097 candidates (dp/noise_vector.py; 24 ms one at a time). Finer
grids were simulated on the benchmark data: 2**16 would cut the PUMS median's value error at epsilon 10 from 76 to
27 but raise it at small epsilons where the data have point masses (visits' median at epsilon 0.01: 185 -> 236).

Utility (the rank utility of Smith 2011 and OpenDP's discrete_quantile_score, on buckets): with lt(c) rows in the
buckets below candidate c's and eq(c) rows in its own, u(c) = -(the distance from q n to [lt(c), lt(c) + eq(c)]),
0 on the bucket that holds the row of rank q n. Adding or removing one row moves n by 1 and lt(c) or eq(c) by at
most 1, so each end of the distance, and u(c), by at most max(q, 1 - q); one unit adds or removes at most m rows
(the contribution bound), so the sensitivity is Delta = m * max(q, 1 - q) <= m, for add/remove neighbours, the only
ones dpsql uses (dp-notes 1). OpenDP's -|(1 - q) lt(c) - q gt(c)| has the same sensitivity but treats a bucket's
rows as sitting at c, which biases it away from point masses (130 zero incomes with q n = 100 score -87 at 0 and
-30 at the next bucket). The value released for bucket j is its middle (Grid.estimate; an end for q = 0, 1).

MIN and MAX are the 0 and 1 quantiles, as in Tumult and OpenDP: every bucket from the lower bound up to the one
holding the minimum scores 0, so MIN lands among them uniformly, between the bound and the minimum (exactly on it
when the data reach the bound), plus the mechanism's rank error. An earlier design aimed at a public rank k inside
the data (the 95% rank tail): robust to loose bounds, but with k near n it put MAX below the median.

Sampling (noisy_max_scaled): each candidate's utility gets an independent geometric noise, P(G = k) proportional to
exp(-k epsilon / (2 Delta)) in the utility's units, and the largest noisy utility wins (ties: uniformly). It is
epsilon-DP (the utility need not be monotone), report-noisy-max with exponential noise rounded down, which Ding et
al. (2021) showed to be permute-and-flip (McKenna and Sheldon 2020; never less accurate than the exponential
mechanism). With epsilon and q exact rationals the noise is CKS's exact geometric: no float enters a probability, so
Mironov-style gaps cannot arise; and the draws it makes do not depend on the data, so neither does its time
(permute-and-flip's coins did: see noisy_max_scaled).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate

import numpy as np

from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import RandomSource, geometric_exp
from dpsql.dp.noise_vector import MAX_DENOMINATOR, geometric_exp_many
from dpsql.dp.quantile_interval import INTERVAL_SHARE, interval

GRID_BITS = 12
_INT64_SAFE = 1 << 61  # utilities within this add to a noise below 2**62 without leaving int64
# The numpy argmax is taken when the utilities' scale (q's denominator) is at most this: a public choice, so the
# path, and its time, never depends on the data (utilities reach 2**61 only past 2**41 rows). Choosing it from the
# utilities' size instead let one row switch paths (QUANTILE_CONT(x, 0.000000000001): 7.5 against 8.4 ms).
_NUMPY_SCALE = 1 << 20
VECTOR_FROM = 64  # candidates from which the noises are drawn all at once (dp/noise_vector.py)
_MIN_ROUNDED_STEPS = 1 << 10  # a rate rounded onto k / 2**40 with k at least this loses less than 2**-10 of it
MAX_INTEGER_CANDIDATES = 1 << 12
LEVEL = Fraction(95, 100)


@dataclass(frozen=True)
class Grid:
    """Candidates low + j * width for j = 0..buckets; exact rationals, so the grid is the same on every run."""

    low: Fraction
    width: Fraction
    buckets: int  # K: candidates = K + 1
    # Whether every bucket holds one value only, its candidate (the integer grid, a single point). Otherwise a
    # bucket holds the values in [c_j, c_j + width), and the released value is its middle (below).
    points: bool = False

    @property
    def candidates(self) -> int:
        return self.buckets + 1

    @property
    def high(self) -> Fraction:
        return self.low + self.width * self.buckets

    def value(self, index: int) -> float:
        """Candidate `index` as a number (within the bounds by construction)."""
        if not 0 <= index <= self.buckets:
            raise IndexError("no such candidate")
        return float(self.low + self.width * index)

    def estimate(self, index: int, q: Fraction | None) -> float:
        """What the choice of bucket `index` says of the q-quantile's value (post-processing of the choice): the
        bucket's middle, which halves the largest rounding error against its low end; for q = 0 its low end and for
        q = 1 its high end, where the smallest and the largest row of the bucket are (clamped values pile up at the
        bounds: the lowest candidate is the lower bound itself). The top bucket holds the upper bound only, and a
        points grid's buckets hold their candidate only."""
        if self.points or index == self.buckets or q == 0:
            return self.value(index)
        if q == 1:
            return self.value(index + 1)
        return float(self.low + self.width * index + self.width / 2)

    def bucket(self, x: float) -> int:
        """The candidate a value is rounded down to (what the engine computes per row, clamped to the bounds)."""
        clamped = min(max(Fraction(x), self.low), self.high)
        return min(math.floor((clamped - self.low) / self.width), self.buckets)


def grid_for(low: float, high: float, integer: bool) -> Grid:
    """The candidate grid of a bounded argument (see the module docstring for the choice of K)."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError("a quantile needs finite bounds low <= high")
    lo, hi = Fraction(low), Fraction(high)
    if lo == hi:
        return Grid(lo, Fraction(1), 0, points=True)
    if integer and lo.denominator == 1 and hi.denominator == 1 and hi - lo < MAX_INTEGER_CANDIDATES:
        return Grid(lo, Fraction(1), int(hi - lo), points=True)
    buckets = 1 << GRID_BITS
    return Grid(lo, (hi - lo) / buckets, buckets)


@dataclass(frozen=True)
class QuantileScore:
    """u(c) = -(the distance from q n to [lt(c), lt(c) + eq(c)]), eq(c) the rows of candidate c's bucket: 0 where
    the bucket holds the row of rank q n. Adding a row moves n by one and, below c, lt(c) by one, at c eq(c): each
    end of the distance moves by q or 1 - q, so Delta = m max(q, 1 - q) (as for OpenDP's discrete_quantile_score).
    Unlike -|(1 - q) lt - q gt|, this is 0 on the bucket that holds the quantile whatever the rows in it: that score
    would prefer the bucket above a point mass (130 zero incomes, q n = 100: -87 at 0, -30 at the next bucket)."""

    q: Fraction
    max_rows: int

    def __post_init__(self) -> None:
        if not 0 <= self.q <= 1:
            raise ValueError("a quantile's q must be between 0 and 1")
        if self.max_rows < 1:
            raise ValueError("the contribution bound must be at least 1")

    @property
    def sensitivity(self) -> Fraction:
        return self.max_rows * max(self.q, 1 - self.q)

    def utilities(self, counts: Sequence[int]) -> list[Fraction]:
        scaled, scale = self.scaled_utilities(counts)
        return [Fraction(u, scale) for u in scaled]

    def scaled_utilities(self, counts: Sequence[int]) -> tuple[list[int], int]:
        """The utilities times the denominator of q, as integers (exact, and no Fraction per candidate)."""
        below, _ = _below_above(counts)
        a, b = self.q.numerator, self.q.denominator
        target = a * sum(counts)  # q n, times b
        return [-max(0, b * lt - target, target - b * (lt + at)) for lt, at in zip(below, counts, strict=True)], b




def _below_above(counts: Sequence[int]) -> tuple[list[int], list[int]]:
    """lt(c_j) and gt(c_j) for every candidate, from the rows rounded to each candidate."""
    if any(c < 0 for c in counts):
        raise ValueError("bucket counts are never negative")
    below = [0, *accumulate(counts)][:-1]
    n = sum(counts)
    return below, [n - lt - c for lt, c in zip(below, counts, strict=True)]


def noisy_max(utilities: Sequence[Fraction], epsilon: Fraction, sensitivity: Fraction, rng: RandomSource) -> int:
    """The index of the chosen candidate: epsilon-DP when one unit moves every utility by at most `sensitivity`."""
    scale = math.lcm(*(Fraction(u).denominator for u in utilities))
    return noisy_max_scaled([int(u * scale) for u in utilities], scale, epsilon, sensitivity, rng)


def noisy_max_scaled(utilities: Sequence[int], scale: int, epsilon: Fraction, sensitivity: Fraction,
                     rng: RandomSource) -> int:
    """noisy_max of the utilities u / scale, in integers: each u_c gets its own geometric noise G_c with
    P(G = k) proportional to exp(-k a), a = epsilon / (2 sensitivity scale), and the largest u_c + G_c wins (a
    uniformly random one among equals).

    Why epsilon-DP: with a continuous tie-breaker U_c uniform in [0, 1), X = G + U has P(X > x + j) = exp(-a j)
    P(X > x) for every integer j >= 0 and x >= 0, and P(X > y) >= exp(-a j) for y < j. Candidate c wins when X_c
    exceeds the others' best minus u_c; a neighbour moves that threshold by at most 2 sensitivity scale (an
    integer), so the probability of every output changes by a factor of at most exp(2 a sensitivity scale) =
    exp(epsilon); a uniform choice among the tied largest is that tie-breaker. It is report-noisy-max with
    exponential noise rounded down, which is permute-and-flip (Ding et al. 2021) up to that rounding.

    Why not permute-and-flip itself (the earlier sampler): its coin for candidate c costs draws that depend on
    u* - u_c, so the running time of a release depended on the data (one row below everyone else's minimum changed
    thousands of coins' cost: 9.3 against 11.4 ms per MIN cell, found by the red team). Here every draw is either
    a noise value's own, whose law is fixed by epsilon, the sensitivity and the scale, or the one choice among ties:
    the number of draws, and the time they take, no longer depend on the data (but for that last draw)."""
    if epsilon <= 0 or sensitivity <= 0:
        raise ValueError("epsilon and the sensitivity must be positive")
    rate = Fraction(epsilon) / (2 * Fraction(sensitivity) * scale)
    # All at once only for grids large enough to gain from it (numpy's overhead per call is about that of 60
    # scalar draws); the number of candidates is public (the grid's), so is the choice.
    words = getattr(rng, "words", None) if len(utilities) >= VECTOR_FROM else None
    if words is not None and rate.denominator > MAX_DENOMINATOR:
        # Rounded down onto the vectorised sampler's denominators: a smaller rate is more noise, so still
        # epsilon-DP. Only when that loses less than 2**-10 of it (the rate is at least 2**-30): below, rounding
        # could halve it (rate 1.99 * 2**-40 -> 2**-40: QUANTILE_CONT(x, 0.000000000001) at epsilon 3.6 spent
        # half its epsilon's worth of accuracy), and the exact scalar sampler runs instead (a public choice).
        steps = math.floor(rate * MAX_DENOMINATOR)
        if steps >= _MIN_ROUNDED_STEPS:
            rate = Fraction(steps, MAX_DENOMINATOR)
    num, den = rate.numerator, rate.denominator
    if words is not None and den <= MAX_DENOMINATOR:
        noise = geometric_exp_many(num, den, len(utilities), words)
        if scale <= _NUMPY_SCALE and utilities and min(utilities) > -_INT64_SAFE and max(utilities) < _INT64_SAFE:
            summed = np.asarray(utilities, dtype=np.int64) + noise  # noise < 2**62 as well: no overflow
            tied_at = np.flatnonzero(summed == summed.max())
            return int(tied_at[rng.randbelow(tied_at.size)])
        noisy = [u + int(g) for u, g in zip(utilities, noise, strict=True)]
    else:  # the exact rate, not rounded: the scalar sampler takes any denominator
        noisy = [u + geometric_exp(num, den, rng) for u in utilities]
    best = max(noisy)
    tied = [index for index, value in enumerate(noisy) if value == best]
    return tied[rng.randbelow(len(tied))]  # one draw more or less with the ties: not thousands, as the coins were


def release(counts: Sequence[int], score: QuantileScore, epsilon: Fraction, rng: RandomSource) -> int:
    """One group's DP quantile (or MIN/MAX): the index of a candidate, from its bucket counts."""
    utilities, scale = score.scaled_utilities(counts)
    return noisy_max_scaled(utilities, scale, epsilon, score.sensitivity, rng)


def utility_tail(epsilon: Fraction, sensitivity: Fraction, candidates: int, level: Fraction = LEVEL) -> float:
    """t with P(u* - u(released) >= t) <= 1 - level: (2 Delta / epsilon) ln(candidates / (1 - level)).

    The released c has u_c + G_c >= u* + G_* >= u*, so u* - u_c <= G_c: a rank error of t or more needs some
    candidate with u* - u_c >= t whose noise is at least t, at most `candidates` times P(G >= t) =
    exp(-epsilon t / (2 Delta)) (noisy_max_scaled; the same bound as the exponential mechanism's). Utility is
    in rows: -u(c) = |lt(c) - q (n - eq(c))|, eq(c) the rows at c, so t is the rank error in rows beyond the
    best candidate's (which is at most one bucket's rows)."""
    return float(2 * sensitivity / epsilon) * math.log(candidates / float(1 - level))


def describe(grid: Grid, score: QuantileScore, epsilon: Fraction, interval_share: Fraction = INTERVAL_SHARE) -> str:
    """What `dpsql explain` should say of a quantile cell: the mechanism, the grid and the expected rank error."""
    tail = utility_tail(epsilon, score.sensitivity, grid.candidates)
    target = {0: "the 0 quantile (MIN)", 1: "the 1 quantile (MAX)"}.get(score.q, f"the {float(score.q):g} quantile")
    return (f"report-noisy-max (geometric noise) exponential mechanism for {target}, sensitivity "
            f"{float(score.sensitivity):g} rows; "
            f"{grid.candidates} candidates from {float(grid.low):g} to {float(grid.high):g} in steps of "
            f"{float(grid.width):g}; rank error at most {tail:.1f} rows beyond the best candidate's with 95% "
            f"probability (epsilon {float(epsilon):.4g}); "
            + (f"the 95% interval from noisy counts of the rows around the chosen value, with "
               f"{float(interval_share):g} of its epsilon" if interval_share else
               "no interval (not asked for: the value has the whole budget)"))


@dataclass(frozen=True)
class QuantileRelease:
    """One released cell: the chosen candidate's value and its 95% interval (see quantile_interval.py)."""

    value: float
    low: float
    high: float


def zcdp_epsilon(rho: float, interval_share: Fraction) -> float:
    """The epsilon a quantile's zCDP share rho buys: its value (1 - s of it) and interval (s) are pure DP, and
    epsilon-DP implies (epsilon^2 / 2)-zCDP, so together they cost ((1 - s)^2 + s^2) epsilon^2 / 2 = rho."""
    return math.sqrt(2 * rho / float((1 - interval_share) ** 2 + interval_share**2))


@dataclass(frozen=True)
class QuantileMechanism:
    """What one quantile (or MIN/MAX) measurement gets: report-noisy-max with 1 - interval_share of its epsilon,
    noisy region counts for the interval with the rest (none when the interval is not asked for: then the value
    gets the whole epsilon and the cell has no interval). Epsilon-DP over all groups together: a unit with c_g of
    its at most m rows in group g moves that group's utilities by c_g max(q, 1 - q), a fraction c_g / m of the
    sensitivity every group is calibrated to, so the groups' losses add up to at most epsilon."""

    grid: Grid
    fraction: Fraction  # q: 0 for MIN, 1 for MAX
    max_rows: int
    epsilon: float  # the measurement's whole share
    interval_share: Fraction = INTERVAL_SHARE  # 0: no interval, all of epsilon on the value

    name = "report-noisy-max"

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("a quantile needs a positive, finite epsilon")
        if not 0 <= self.interval_share < 1:
            raise ValueError("a quantile's interval share must be in [0, 1)")

    @property
    def point_epsilon(self) -> Fraction:
        return Fraction(self.epsilon) * (1 - self.interval_share)

    @property
    def score(self) -> QuantileScore:
        return QuantileScore(self.fraction, self.max_rows)

    @property
    def interval_noise(self) -> LaplaceMechanism:
        """Discrete Laplace for the region counts: all regions of all groups move by at most m in L1 together."""
        return LaplaceMechanism(self.max_rows, float(Fraction(self.epsilon) * self.interval_share))

    @property
    def sensitivity(self) -> float:
        """In rows of utility, as explain shows it."""
        return float(self.score.sensitivity)

    @property
    def scale(self) -> float:
        """2 Delta / epsilon: the utility (in rows) that makes a candidate e times less likely."""
        return float(2 * self.score.sensitivity / self.point_epsilon)

    @property
    def variance(self) -> float:
        return math.nan  # not additive noise: explain and the outputs say what the error is instead

    def half_width(self, level: float) -> float:
        """The rank error, in rows beyond the best candidate's, that the chosen candidate exceeds with probability
        at most 1 - level."""
        return utility_tail(self.point_epsilon, self.score.sensitivity, self.grid.candidates, Fraction(level))

    def release(self, counts: Sequence[int], rng: RandomSource) -> QuantileRelease:
        """One group's value and interval (NaN ends when none was asked for), from its exact bucket counts."""
        chosen = release(counts, self.score, self.point_epsilon, rng)
        value = self.grid.estimate(chosen, self.fraction)
        if not self.interval_share:
            return QuantileRelease(value, math.nan, math.nan)
        ends = interval(counts, chosen, self.fraction, self.interval_noise, rng)
        return QuantileRelease(value, self.grid.value(ends.low), self.grid.value(ends.high))

    def describe(self) -> str:
        return describe(self.grid, self.score, self.point_epsilon, self.interval_share)
