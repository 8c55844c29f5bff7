"""Mironov's floating-point attack (CCS 2012) on textbook Laplace noise, and the same attack on dpsql.

Textbook Laplace adds a double drawn as b*ln(uniform) to the true value in floating point. NumPy's
`Generator.laplace` draws U = k/2^53 and returns -b*ln(2 - 2U) or b*ln(2U): the noise can only be one of the
doubles +-fl(b * ln(j / 2^53)), 1 <= j <= 2^53 (a superset of the exact set, so the test below errs towards
"possible"). Those values are sparser than the doubles around them, and x + noise rounds differently for x = 0
and x = 1, so most outputs could have come from only one of the two true values: the low bits give the secret
away, whatever epsilon the noise was calibrated to.

The distinguisher asks, for an output y and each candidate x, whether some possible noise value v has
fl(x + v) == y (binary search on j, then an exact check of the neighbours); it answers the one candidate that
fits, or flips a coin when both or neither do. Against dpsql the same question has the same answer for 0 and 1:
its noise is an integer (discrete Laplace, every integer possible) added to an exact integer count, and its
outputs are those integers clamped at 0, so every output is possible under both: the support is identical and
the distinguisher is reduced to the coin.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.sampling import measure, scalar_outputs
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import Table, column, open_session, seeded, write_dataset

_GRID = 2**53  # NumPy's uniform doubles are k / 2^53
_WINDOW = 3  # libm's log is within an ulp, so monotone up to its immediate neighbours


def _noise_magnitude(scale: float, j: int) -> float:
    """fl(b * ln(j / 2^53)) <= 0: what NumPy adds (or subtracts) for the uniform that gives j."""
    return scale * math.log(j / _GRID)


def textbook_possible(y: float, x: float, scale: float) -> bool:
    """Could textbook float Laplace with this scale output y for the true value x?"""
    for sign in (1.0, -1.0):
        target = (y - x) * sign  # the noise magnitude (signed as _noise_magnitude) that would be needed
        if target > 0:
            continue
        lo, hi = 1, _GRID  # the smallest j whose magnitude reaches the target (magnitudes increase with j)
        while lo < hi:
            mid = (lo + hi) // 2
            if _noise_magnitude(scale, mid) < target:
                lo = mid + 1
            else:
                hi = mid
        for j in range(max(1, lo - _WINDOW), min(_GRID, lo + _WINDOW) + 1):
            if x + sign * _noise_magnitude(scale, j) == y:
                return True
    return False


def dpsql_possible(y: float, x: float) -> bool:
    """Could dpsql's count release output y for the true count x? Integer noise of full support, clamped at 0."""
    return float(y - x).is_integer() and y >= 0


@dataclass(frozen=True)
class Distinguisher:
    outputs: int
    in_own_support: int  # outputs that the support test accepts for the true value (must be all)
    distinguishable: int  # outputs possible under exactly one of 0 and 1
    success: Proportion


def distinguish(samples: dict[int, np.ndarray], possible: Callable[[float, float], bool],
                seed: int) -> Distinguisher:
    """Run the support test on every output of both worlds: samples[x] are outputs with true value x."""
    coin = random.Random(seed)
    own = unique = wins = 0
    for truth, outputs in samples.items():
        for y in outputs:
            fits = [possible(float(y), x) for x in (0, 1)]
            own += fits[truth]
            unique += fits[0] != fits[1]
            guess = fits.index(True) if fits[0] != fits[1] else coin.randrange(2)
            wins += guess == truth
    total = sum(len(v) for v in samples.values())
    return Distinguisher(total, own, unique, Proportion(wins, total))


def textbook_samples(epsilon: float, per_value: int, seed: int) -> dict[int, np.ndarray]:
    """x + NumPy Laplace(1/epsilon) in doubles: the textbook mechanism for a count of sensitivity 1."""
    rng = np.random.default_rng(seed)
    return {x: x + rng.laplace(0.0, 1 / epsilon, size=per_value) for x in (0, 1)}


FLAGS = Table("flags", "pid", (column("pid", "int"), column("flag", "bool")))
COUNT_FLAGGED = "SELECT COUNT(*) FROM flags WHERE flag"


def dpsql_samples(folder: Path, epsilon: float, per_value: int, seed: int) -> dict[int, np.ndarray]:
    """dpsql's released COUNT for a table whose true count is 0 and one whose true count is 1."""
    samples = {}
    rng = seeded(seed)
    for x in (0, 1):
        session = open_session(write_dataset(folder / f"count{x}", FLAGS, [(1, bool(x)), (2, False)]), seed)
        try:
            measured = measure(session, COUNT_FLAGGED, epsilon=epsilon)
        finally:
            session.close()
        samples[x] = scalar_outputs(measured.plan, measured.rows, rng, per_value)
    return samples


@dataclass(frozen=True)
class FloatingPointReport:
    epsilon: float
    textbook: Distinguisher
    dpsql: Distinguisher

    def lines(self) -> list[str]:
        bound = success_bound(self.epsilon)
        return [
            f"floating-point attack (Mironov 2012): true value 0 or 1, noise for epsilon {self.epsilon:g} "
            f"(DP bound on success {bound:.4f})",
            *(f"  {name}: {d.outputs} outputs, {d.distinguishable} possible under only one value "
              f"({d.distinguishable / d.outputs:.1%}), {d.in_own_support} possible under the true one; "
              f"success {d.success}" for name, d in (("textbook float Laplace (NumPy)", self.textbook),
                                                      ("dpsql", self.dpsql))),
        ]


def attack(folder: Path, epsilon: float, per_value: int, seed: int) -> FloatingPointReport:
    scale = 1 / epsilon
    return FloatingPointReport(
        epsilon,
        distinguish(textbook_samples(epsilon, per_value, seed), lambda y, x: textbook_possible(y, x, scale), seed),
        distinguish(dpsql_samples(folder, epsilon, per_value, seed), dpsql_possible, seed),
    )


def main() -> None:
    args = options(__doc__, epsilon=0.1, samples=20000, seed=2012)  # samples: per true value
    with scratch() as folder:
        print("\n".join(attack(folder, args.epsilon, args.samples, args.seed).lines()))


if __name__ == "__main__":
    main()
