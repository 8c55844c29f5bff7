"""The quantile sampler's cost must not depend on the data. Permute-and-flip, the earlier sampler, flipped every
candidate's coin so that the running time did not say where in the random order the accepted candidate was; but
each coin's own cost, in random draws, depended on its gamma, i.e. on the data (found by the red team; the sampler
is now report-noisy-max with geometric noise, dp/quantile.noisy_max_scaled, whose draws do not depend on the data).
For MIN (q = 0) every candidate from the lower bound up to the minimum's
bucket has utility 0 (gamma 0: one draw) and the others a positive gamma (more draws on average), so one person's
row below everyone else's moves thousands of coins from one cost to the other: measured at 4097 candidates, one
release takes about 11.4 ms against 9.3 ms (SecureRandom, one group), a difference far above the jitter of a
single query, and it tells whether that person's value is below the others' minimum whatever the epsilon.

The test counts draws (a deterministic proxy for time, no clock): the expected number of draws of one release must
not depend on the data. Means over RUNS seeded releases of two neighbouring count vectors must agree within
Z standard errors of their difference."""

from __future__ import annotations

import math
from fractions import Fraction

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile import QuantileScore, release

CANDIDATES = 257
RUNS = 60
Z = 6.0  # a data-independent draw count fails this once in about 5e8 seeds


class Counting(InsecureSeededRandomForTests):
    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws = 0

    def randbelow(self, n: int) -> int:
        self.draws += 1
        return super().randbelow(n)

    def words(self, n: int):  # the vectorised sampler's draws (dp/noise_vector.py)
        self.draws += n
        return super().words(n)


def _draws(counts: list[int], seed: int) -> list[int]:
    score = QuantileScore(Fraction(0), 1)
    out = []
    for run in range(RUNS):
        rng = Counting(seed * 1000 + run)
        release(counts, score, Fraction(1), rng)
        out.append(rng.draws)
    return out


def test_the_cost_of_a_min_release_does_not_depend_on_one_row() -> None:
    others = [0] * CANDIDATES
    others[CANDIDATES - 10] = 50  # everyone else near the top: candidates below all score 0
    neighbour = list(others)
    neighbour[0] += 1  # one person's row at the lower bound: every candidate above it now scores -1
    a, b = _draws(others, 1), _draws(neighbour, 2)
    mean_a, mean_b = sum(a) / RUNS, sum(b) / RUNS
    var_a = sum((x - mean_a) ** 2 for x in a) / (RUNS - 1)
    var_b = sum((x - mean_b) ** 2 for x in b) / (RUNS - 1)
    assert abs(mean_a - mean_b) <= Z * math.sqrt((var_a + var_b) / RUNS)


def test_the_sampler_s_code_path_does_not_depend_on_one_row(monkeypatch) -> None:
    """Red team 9: noisy_max_scaled took the numpy argmax when every utility was within 2**61 and Python integers
    otherwise, a test on the data's size: with q = 1e-12 (written in the query, denominator 10**12) the utilities
    reach n (10**12 - 1), past 2**61 from n = 2,305,844 rows: one more row switched paths (7.5 against 8.4 ms per
    cell with SecureRandom). The path must be the same for n and n + 1 rows."""
    import dpsql.dp.quantile as quantile

    took_numpy: list[bool] = []
    original = quantile.np.asarray

    def spy(*args, **kwargs):
        took_numpy.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(quantile.np, "asarray", spy)
    score = QuantileScore(Fraction(1, 10**12), 1)
    paths = []
    for n in (2_305_843, 2_305_844):  # (10**12 - 1) n crosses 2**61 between them
        took_numpy.clear()
        release([n] + [0] * (CANDIDATES - 1), score, Fraction(10), InsecureSeededRandomForTests(3))
        paths.append(bool(took_numpy))
    assert paths[0] == paths[1]
