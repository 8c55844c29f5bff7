"""The audit's statistics: find the output event that best separates two samples of releases, then bound epsilon.

An event is chosen on one half of the draws (the one with the largest epsilon lower bound there) and its
probabilities are bounded on the other half, so the choice does not bias the bound (audit.py explains the claim
being tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks.attacks.stats import epsilon_lower_bound


@dataclass(frozen=True)
class Event:
    """A set of outputs: feature `feature` is absent or present, or at least / at most `threshold`."""

    feature: int
    kind: str  # "absent" | "present" | ">=" | "<="
    threshold: float = math.nan

    def hits(self, features: np.ndarray) -> int:
        column = features[:, self.feature]
        if self.kind in ("absent", "present"):
            absent = int(np.isnan(column).sum())
            return absent if self.kind == "absent" else len(column) - absent
        with np.errstate(invalid="ignore"):
            return int((column >= self.threshold).sum() if self.kind == ">=" else (column <= self.threshold).sum())

    def __str__(self) -> str:
        if self.kind in ("absent", "present"):
            return f"feature {self.feature} {self.kind}"
        return f"feature {self.feature} {self.kind} {self.threshold:.6g}"


def _events(pooled: np.ndarray) -> list[Event]:
    events = []
    for f in range(pooled.shape[1]):
        events += [Event(f, "absent"), Event(f, "present")]
        values = pooled[:, f][~np.isnan(pooled[:, f])]
        if len(values):
            for t in np.unique(np.quantile(values, np.linspace(0, 1, 201))):
                events += [Event(f, ">=", float(t)), Event(f, "<=", float(t))]
    return events


@dataclass(frozen=True)
class Witness:
    event: Event
    over: str  # "D'" if P[D' in S] is the larger side, else "D"
    epsilon: float  # the lower bound


def best_event(d: np.ndarray, d_prime: np.ndarray, delta: float) -> Witness:
    """The event (and direction) with the largest epsilon lower bound on these draws."""
    best = Witness(Event(0, "absent"), "D'", 0.0)
    for event in _events(np.vstack([d, d_prime])):
        hits_d, hits_p = event.hits(d), event.hits(d_prime)
        for over, (a, b) in (("D'", (hits_p, hits_d)), ("D", (hits_d, hits_p))):
            bound = epsilon_lower_bound(a, len(d), b, len(d_prime), delta)
            if bound > best.epsilon:
                best = Witness(event, over, bound)
    return best


def audit_draws(d: np.ndarray, d_prime: np.ndarray, delta: float) -> Witness:
    """Choose the event on the first half of the draws, bound epsilon with it on the second half."""
    half_d, half_p = len(d) // 2, len(d_prime) // 2
    chosen = best_event(d[:half_d], d_prime[:half_p], delta)
    test_d, test_p = d[half_d:], d_prime[half_p:]
    a, b = (test_p, test_d) if chosen.over == "D'" else (test_d, test_p)
    return Witness(chosen.event, chosen.over,
                   epsilon_lower_bound(chosen.event.hits(a), len(a), chosen.event.hits(b), len(b), delta))
