"""The noise mechanisms: what one measurement gets, in integer grid steps.

`LaplaceMechanism` gives pure epsilon-DP for an integer measurement of L1 sensitivity `sensitivity`: discrete
Laplace noise with scale sensitivity/epsilon (Ghosh, Roughgarden, Sundararajan 2009; the same guarantee as the
continuous Laplace). `GaussianMechanism` gives rho-zCDP for L2 sensitivity `sensitivity`: discrete Gaussian noise
with variance sensitivity**2 / (2 rho) (Canonne, Kamath, Steinke 2020, theorem 14).

Scales are exact rationals built from the float epsilon or rho, so the noise drawn is exactly the noise claimed.
A mechanism is frozen, so its scale is worked out once (cached_property writes the instance's __dict__, which a
frozen dataclass allows; equality and hashing still look at the fields only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np

from dpsql.dp.noise import RandomSource, discrete_gaussian, discrete_laplace

_SQRT2 = math.sqrt(2)
_SQRT_2PI = math.sqrt(2 * math.pi)


@dataclass(frozen=True)
class LaplaceMechanism:
    sensitivity: int  # L1, in grid steps
    epsilon: float

    name = "discrete Laplace"

    def __post_init__(self) -> None:
        if self.sensitivity > 0 and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("a Laplace mechanism needs a positive, finite epsilon")

    @functools.cached_property  # read per sample and per interval: a division of two Fractions of floats
    def scale(self) -> Fraction:
        """b: P(Z = z) is proportional to exp(-|z| / b)."""
        return Fraction(self.sensitivity) / Fraction(self.epsilon) if self.sensitivity else Fraction(0)

    def sample(self, rng: RandomSource) -> int:
        return discrete_laplace(self.scale, rng) if self.sensitivity else 0

    # The noise is discrete Laplace with alpha = exp(-1/b). For a sum far from zero b can be 2**60 grid steps,
    # where alpha rounds to 1.0: everything below works with 1/b and expm1, never with 1 - alpha.

    @functools.cached_property
    def _inverse_scale(self) -> float:
        return 1 / float(self.scale)

    @property
    def variance(self) -> float:
        """2 alpha / (1 - alpha)^2, exactly the variance of the discrete Laplace."""
        if not self.sensitivity:
            return 0.0
        u = self._inverse_scale
        return 2 * math.exp(-u) / math.expm1(-u) ** 2

    def upper_tail(self, k: int) -> float:
        """P(Z >= k) = alpha^k / (1 + alpha), for k >= 1."""
        u = self._inverse_scale
        return math.exp(-k * u) / (1 + math.exp(-u))

    def half_width(self, level: float) -> int:
        """The smallest integer t with P(|Z| <= t) >= level: an exact interval for a lone measurement.

        P(|Z| > t) = 2 alpha^(t+1) / (1 + alpha) <= 1 - level  <=>  (t + 1) / b >= log(2 / ((1 - level)(1 + alpha)))
        """
        if not self.sensitivity:
            return 0
        u = self._inverse_scale
        needed = math.log(2 / ((1 - level) * (1 + math.exp(-u))))
        t = max(0, math.ceil(needed / u) - 1)
        while t > 0 and t * u >= needed:
            t -= 1
        while (t + 1) * u < needed:
            t += 1
        return t

    def pair_half_width(self, level: float) -> int:
        """The smallest integer t with P(|Z1 + Z2| <= t) >= level, Z1, Z2 independent draws of this noise: the
        exact interval of a sum of two measurements that share this mechanism (COUNT(*) from disjoint counts).

        With alpha = exp(-1/b) and w = 1 - alpha, the convolution gives
        P(Z1 + Z2 = k) = ((1 - alpha)/(1 + alpha))^2 alpha^|k| (|k| + 1 + 2 alpha^2 / (1 - alpha^2)), and summing the
        geometric series, P(|Z1 + Z2| > t) = 2 alpha^(t+1) / (1 + alpha)^2 * (1 + (t + 1) w + 2 alpha^2 / (1 + alpha)),
        written without 1 - alpha's cancellation (w = -expm1(-1/b)).
        """
        if not self.sensitivity:
            return 0
        u = self._inverse_scale
        alpha, w = math.exp(-u), -math.expm1(-u)

        def outside(t: int) -> float:
            return 2 * math.exp(-(t + 1) * u) / (1 + alpha) ** 2 * (1 + (t + 1) * w + 2 * alpha**2 / (1 + alpha))

        return smallest(lambda t: outside(t) <= 1 - level)


@dataclass(frozen=True)
class GaussianMechanism:
    sensitivity: int  # L2, in grid steps (rounded up when it is the root of `squared`)
    rho: float
    squared: int | None = None  # the exact squared L2 sensitivity, when it is not the square of `sensitivity`

    name = "discrete Gaussian"

    def __post_init__(self) -> None:
        if self.sensitivity > 0 and not (self.rho > 0 and math.isfinite(self.rho)):
            raise ValueError("a Gaussian mechanism needs a positive, finite rho")

    @functools.cached_property
    def sigma2(self) -> Fraction:
        squared = self.squared if self.squared is not None else self.sensitivity**2
        return Fraction(squared) / (2 * Fraction(self.rho)) if self.sensitivity else Fraction(0)

    @functools.cached_property
    def scale(self) -> float:
        return math.sqrt(self.sigma2)

    def sample(self, rng: RandomSource) -> int:
        return discrete_gaussian(self.sigma2, rng) if self.sensitivity else 0

    @property
    def variance(self) -> float:
        return float(self.sigma2)  # the discrete Gaussian's variance is at most sigma^2 (CKS, corollary 9)

    def upper_tail(self, k: int) -> float:
        """An upper bound on P(Z >= k), k >= 0.

        The tail sum of exp(-z^2/2s^2) over z >= k is at most its first term plus the integral from k, and the
        normalising sum over all z is at least sqrt(2 pi) s (Poisson summation), so
        P(Z >= k) <= Q(k/s) + phi(k/s)/s, with Q and phi the standard normal tail and density.
        """
        if not self.sensitivity:
            return 0.0 if k > 0 else 1.0
        s = self.scale
        x = k / s
        # Q(x) as erfc, never as 1 - cdf(x): that difference rounds to 0 beyond x = 8.3, where thresholds for
        # deltas below 1e-16 are searched. erfc keeps full relative precision down to 1e-300.
        return 0.5 * math.erfc(x / _SQRT2) + math.exp(-x * x / 2) / (_SQRT_2PI * s)

    def half_width(self, level: float) -> int:
        if not self.sensitivity:
            return 0
        return math.ceil(NormalDist().inv_cdf((1 + level) / 2) * self.scale)

    def pair_half_width(self, level: float) -> int:
        """The smallest integer t with P(|Z1 + Z2| <= t) >= level for two independent draws (see Laplace's).

        Below _EXACT_SIGMA the distribution of the sum is computed exactly, by convolving the two probability
        vectors over +/- 14 sigma (what lies beyond is below 1e-40). Above it, the discrete Gaussian differs from the
        sampled normal density by a relative exp(-2 pi^2 sigma^2), nothing at that size, so the sum is the normal
        with variance 2 sigma^2 on the integers: P(|S| <= t) is P(|N| <= t + 1/2) up to that error, and the ceiling
        of the continuous half-width leaves at least that half step to spare.
        """
        if not self.sensitivity:
            return 0
        if self.scale > _EXACT_SIGMA:
            return math.ceil(NormalDist().inv_cdf((1 + level) / 2) * self.scale * math.sqrt(2))
        reach = math.ceil(14 * self.scale) + 2
        values = np.arange(-reach, reach + 1, dtype=float)
        one = np.exp(-values**2 / (2 * float(self.sigma2)))
        one /= one.sum()
        pair = np.convolve(one, one)  # P(S = k) for k in -2 reach .. 2 reach
        middle = 2 * reach

        def inside(t: int) -> bool:
            return math.fsum(pair[middle - t: middle + t + 1]) >= level

        return smallest(inside)


Mechanism = LaplaceMechanism | GaussianMechanism

_EXACT_SIGMA = 100.0


def smallest(holds: Callable[[int], bool]) -> int:
    """The smallest t >= 0 for which `holds` (monotone: false, then true for ever) is true: gallop, then bisect.
    Interval half-widths and the partition-selection threshold are all found this way."""
    if holds(0):
        return 0
    high = 1
    while not holds(high):
        high *= 2
    low = high // 2  # holds(low) is false
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return high

