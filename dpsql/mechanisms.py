"""The noise mechanisms: what one measurement gets, in integer grid steps.

`LaplaceMechanism` gives pure epsilon-DP for an integer measurement of L1 sensitivity `sensitivity`: discrete
Laplace noise with scale sensitivity/epsilon (Ghosh, Roughgarden, Sundararajan 2009; the same guarantee as the
continuous Laplace). `GaussianMechanism` gives rho-zCDP for L2 sensitivity `sensitivity`: discrete Gaussian noise
with variance sensitivity**2 / (2 rho) (Canonne, Kamath, Steinke 2020, theorem 14).

Scales are exact rationals built from the float epsilon or rho, so the noise drawn is exactly the noise claimed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

from dpsql.noise import RandomSource, discrete_gaussian, discrete_laplace


@dataclass(frozen=True)
class LaplaceMechanism:
    sensitivity: int  # L1, in grid steps
    epsilon: float

    name = "discrete Laplace"

    def __post_init__(self) -> None:
        if self.sensitivity > 0 and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("a Laplace mechanism needs a positive, finite epsilon")

    @property
    def scale(self) -> Fraction:
        """b: P(Z = z) is proportional to exp(-|z| / b)."""
        return Fraction(self.sensitivity) / Fraction(self.epsilon) if self.sensitivity else Fraction(0)

    @property
    def _alpha(self) -> float:
        return math.exp(-1 / float(self.scale)) if self.sensitivity else 0.0

    def sample(self, rng: RandomSource) -> int:
        return discrete_laplace(self.scale, rng) if self.sensitivity else 0

    @property
    def variance(self) -> float:
        a = self._alpha
        return 2 * a / (1 - a) ** 2

    @property
    def continuous_scale(self) -> float:
        return float(self.scale)

    def upper_tail(self, k: int) -> float:
        """P(Z >= k) for k >= 1."""
        a = self._alpha
        return a**k / (1 + a)

    def half_width(self, level: float) -> int:
        """The smallest integer t with P(|Z| <= t) >= level: an exact interval for a lone measurement."""
        a = self._alpha
        if not self.sensitivity or 2 * a / (1 + a) <= 1 - level:
            return 0  # also when the noise is so small that a is 0 in floating point
        # P(|Z| > t) = 2 a^(t+1) / (1 + a)
        t = max(0, math.ceil(math.log((1 - level) * (1 + a) / 2) / math.log(a) - 1))
        while t > 0 and 2 * a**t / (1 + a) <= 1 - level:
            t -= 1
        while 2 * a ** (t + 1) / (1 + a) > 1 - level:
            t += 1
        return t


@dataclass(frozen=True)
class GaussianMechanism:
    sensitivity: int  # L2, in grid steps
    rho: float

    name = "discrete Gaussian"

    def __post_init__(self) -> None:
        if self.sensitivity > 0 and not (self.rho > 0 and math.isfinite(self.rho)):
            raise ValueError("a Gaussian mechanism needs a positive, finite rho")

    @property
    def sigma2(self) -> Fraction:
        return Fraction(self.sensitivity) ** 2 / (2 * Fraction(self.rho)) if self.sensitivity else Fraction(0)

    @property
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
        standard = NormalDist()
        return (1 - standard.cdf(k / s)) + standard.pdf(k / s) / s

    def half_width(self, level: float) -> int:
        if not self.sensitivity:
            return 0
        return math.ceil(NormalDist().inv_cdf((1 + level) / 2) * self.scale)


Mechanism = LaplaceMechanism | GaussianMechanism
