"""The statistics the attacks and the audit report: binomial intervals and what differential privacy allows.

A balanced guessing game (a secret bit, prior 1/2, the attacker sees the output of an (epsilon, delta)-DP
mechanism) is a hypothesis test, so its success probability is at most (e^epsilon + delta) / (1 + e^epsilon)
(Kairouz, Oh, Viswanath 2015). A measured success rate whose lower confidence bound exceeds that figure proves
the mechanism is *not* (epsilon, delta)-DP; one at or below it is consistent with the claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.stats import beta, chi2_contingency

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Proportion:
    """k successes out of n independent trials, with an exact (Clopper-Pearson) interval."""

    successes: int
    trials: int

    @property
    def rate(self) -> float:
        return self.successes / self.trials if self.trials else math.nan

    def lower(self, confidence: float = CONFIDENCE) -> float:
        """One-sided lower bound: P(true rate < lower) <= 1 - confidence."""
        if self.successes == 0:
            return 0.0
        return float(beta.ppf(1 - confidence, self.successes, self.trials - self.successes + 1))

    def upper(self, confidence: float = CONFIDENCE) -> float:
        """One-sided upper bound: P(true rate > upper) <= 1 - confidence."""
        if self.successes == self.trials:
            return 1.0
        return float(beta.ppf(confidence, self.successes + 1, self.trials - self.successes))

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Two-sided: each side at half the error."""
        tail = (1 + confidence) / 2
        return self.lower(tail), self.upper(tail)

    def __str__(self) -> str:
        lo, hi = self.interval()
        return f"{self.rate:.4f} (95% CI {lo:.4f}..{hi:.4f}, n={self.trials})"


def success_bound(epsilon: float, delta: float = 0.0) -> float:
    """The best success probability of any guess of a balanced secret bit from an (epsilon, delta)-DP output."""
    return min(1.0, (math.exp(epsilon) + delta) / (1 + math.exp(epsilon)))


def epsilon_lower_bound(hits_a: int, n_a: int, hits_b: int, n_b: int, delta: float = 0.0,
                        confidence: float = CONFIDENCE) -> float:
    """A lower bound on epsilon, at the given confidence, from one event's counts under two neighbours.

    If P[M(A) in S] > e^eps P[M(B) in S] + delta the mechanism is not (eps, delta)-DP. With p_a >= lo_a and
    p_b <= hi_b (each one-sided at half the error, so both hold with the stated confidence), eps is at least
    ln((lo_a - delta) / hi_b).
    """
    tail = (1 + confidence) / 2
    lo_a = Proportion(hits_a, n_a).lower(tail)
    hi_b = Proportion(hits_b, n_b).upper(tail)
    if lo_a <= delta or hi_b <= 0:
        return 0.0
    return max(0.0, math.log((lo_a - delta) / hi_b))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The epsilon that rho-zCDP implies at this delta, by the conversion of Canonne, Kamath and Steinke (2020,
    proposition 12 applied to Renyi order alpha): the smallest over alpha > 1 of
    alpha*rho + (alpha*ln(1 - 1/alpha) - ln(alpha - 1) - ln(delta)) / (alpha - 1).
    It is never above the textbook rho + 2*sqrt(rho*ln(1/delta)) (Bun and Steinke 2016), which the ledger uses."""
    def epsilon(alpha: float) -> float:
        return alpha * rho + (alpha * math.log1p(-1 / alpha) - math.log(alpha - 1) - math.log(delta)) / (alpha - 1)

    textbook = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    best = minimize_scalar(epsilon, bounds=(1 + 1e-9, 1e6), method="bounded")
    return min(textbook, float(best.fun))


def hoeffding_lower(mean: float, samples: int, confidence: float = CONFIDENCE) -> float:
    """A distribution-free lower bound on the expectation of a [0, 1] variable from the mean of i.i.d. draws."""
    return mean - math.sqrt(math.log(1 / (1 - confidence)) / (2 * samples))


def same_distribution_pvalue(a: np.ndarray, b: np.ndarray, bins: int = 10) -> float:
    """A chi-square test of homogeneity between two samples, binned at the pooled quantiles.

    Kolmogorov-Smirnov assumes continuous data and is very conservative on integers (ties); dpsql's outputs are
    integers or grid points, so they are binned instead (a value on an edge goes to the upper bin in both)."""
    pooled = np.concatenate([a, b])
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)[1:-1]))
    counts = np.array([np.bincount(np.searchsorted(edges, s, side="right"), minlength=len(edges) + 1)
                       for s in (a, b)])
    counts = counts[:, counts.sum(axis=0) > 0]
    return float(chi2_contingency(counts).pvalue) if counts.shape[1] > 1 else 1.0
