"""Group keys: public values are all released (empty ones too); other keys pass DP partition selection."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest

from benchmarks.support import open_session, seeded, write_csv, write_policy
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.planning.contribution import Contribution
from dpsql.planning.plan import _TAIL_MARGIN, _threshold
from dpsql.release.cells import release
from tests.exact_tails import gaussian_tail, worst_release


def test_every_public_group_is_released_even_if_empty(pums_session) -> None:
    """The codebook lists race 1..9; the sample has only 1..6: 7, 8 and 9 come back as noisy counts of 0."""
    result = pums_session.execute("SELECT race, COUNT(*) FROM pums GROUP BY race ORDER BY race")
    assert [row[0] for row in result.rows] == list(range(1, 10))
    result = pums_session.execute("SELECT sex, married, COUNT(*) FROM pums WHERE age > 90 GROUP BY sex, married")
    assert sorted((r[0], r[1]) for r in result.rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_a_key_grouped_twice_is_one_key(pums_session) -> None:
    """`GROUP BY sex, sex` groups as `GROUP BY sex`: one row per value, not a grid of pairs whose off-diagonal
    cells showed a sex's label with a count of 0."""
    for sql in ("SELECT sex, sex, COUNT(*) FROM pums GROUP BY sex, sex", "SELECT sex, sex FROM pums GROUP BY sex, 1",
                "SELECT DISTINCT sex, sex FROM pums"):
        rows = pums_session.execute(sql).rows
        assert sorted((r[0], r[1]) for r in rows) == [(0, 0), (1, 1)], sql


@pytest.fixture
def cities(tmp_path: Path):
    """200 people in 'big' (one row each), one person in 'rare' with three rows; city has no public values."""
    rows = [(pid, "big") for pid in range(1, 201)] + [(999, "rare")] * 3
    write_csv(tmp_path / "t.csv", ["pid", "city"], rows)
    policy = write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 3,
        "columns": {"pid": {"type": "int"}, "city": {"type": "text"}}}},
        {"epsilon": 1e6, "delta": 1e-3, "query_delta": 1e-8})
    session = open_session(policy, 2, "t", bounding_seed=3)
    yield session
    session.close()


def test_a_group_only_one_person_supports_is_dropped(cities) -> None:
    prepared = cities.prepare("SELECT city, COUNT(*) FROM t GROUP BY city", epsilon=1.0)
    selection = prepared.plan.selection
    assert selection is not None and selection.delta == 1e-8
    rows = cities.engine.run(prepared.bounded.sql)
    rng = seeded(8)
    releases = [release(prepared.plan, rows, rng) for _ in range(5000)]
    rare = sum(("rare",) in r.keys for r in releases)
    big = sum(("big",) in r.keys for r in releases)
    # Each release shows 'rare' with probability <= delta = 1e-8: in 5000 releases, P(any) <= 5e-5.
    assert rare == 0
    assert big == 5000  # 200 people are far above the threshold
    answer = cities.execute("SELECT city, COUNT(*) FROM t GROUP BY city", epsilon=1.0)
    assert [r[0] for r in answer.rows] == ["big"] and answer.cost.delta == Fraction(1, 10**8)


# Count mechanisms as plans make them: Laplace under pure DP and under zCDP (epsilon = sqrt(2 rho)), Gaussian with
# little noise, and Gaussian for a count at epsilon 0.03 (rho 4.5e-4; sigma 33, and 662 with m = 10 and a 1/4 share).
THRESHOLD_MECHANISMS = [LaplaceMechanism(3, 0.7), LaplaceMechanism(1, 2.0), LaplaceMechanism(1, 0.03),
                        GaussianMechanism(3, 0.3), GaussianMechanism(1, 2.0), GaussianMechanism(1, 4.5e-4),
                        GaussianMechanism(10, 4.5e-4 / 4)]
THRESHOLD_DELTAS = [1e-5, 1e-9, 1e-15, 1e-17, 1e-20, 1e-25, 1e-30]


@pytest.mark.parametrize("mechanism", THRESHOLD_MECHANISMS,
                         ids=lambda m: f"{m.name}-{m.sensitivity}-{float(m.scale):.3g}")
def test_the_threshold_bounds_the_exact_release_chance_by_delta(mechanism) -> None:
    """Worst cases for a unit with m = sensitivity rows: all in one new group, or one row in each of m groups.

    The chance is computed exactly (mpmath, 60 digits), not with the floats the planner uses: at deltas below
    1e-16 a tail computed as 1 - cdf rounds to 0, and the threshold came out up to 76x too permissive."""
    m = mechanism.sensitivity
    for delta in THRESHOLD_DELTAS:
        tau = _threshold(mechanism, Contribution(m, m, m, False), delta)
        assert worst_release(mechanism, m, tau) <= mpmath.mpf(delta), (delta, tau)
        # and it is the smallest threshold the planner's own (float) bound allows
        below = max(mechanism.upper_tail(tau - 1 - m), m * mechanism.upper_tail(tau - 2))
        assert tau == m + 1 or below > delta * (1 - _TAIL_MARGIN), (delta, tau)
        if isinstance(mechanism, LaplaceMechanism):  # its float tail is exact up to rounding: tau is exactly minimal
            assert tau == m + 1 or worst_release(mechanism, m, tau - 1) > mpmath.mpf(delta), (delta, tau)


@pytest.mark.parametrize("mechanism", [GaussianMechanism(1, 4.5e-4), GaussianMechanism(3, 0.3)],
                         ids=lambda m: f"sigma{float(m.scale):.3g}")
def test_the_gaussian_tail_bound_holds_and_is_close_far_out(mechanism) -> None:
    """Q(x) + phi(x)/s bounds the exact discrete tail, and stays within a factor 2 of it out to 1e-40: a tail that
    loses precision (1 - cdf rounds to 0 beyond 8.3 sigma) fails the first check, a crude bound the second."""
    k = 1
    while True:
        exact = gaussian_tail(mechanism, k)
        if exact < mpmath.mpf(10) ** -40:
            break
        bound = mechanism.upper_tail(k)
        assert exact <= bound <= 2 * exact, (k, bound, exact)
        k += max(1, int(mechanism.scale) // 4)


def test_discrete_laplace_tail_is_exact() -> None:
    """P(Z >= k) = alpha^k / (1 + alpha): checked against the pmf summed directly."""
    mechanism = LaplaceMechanism(2, 0.9)
    a = math.exp(-1 / float(mechanism.scale))
    pmf = [(1 - a) / (1 + a) * a**z for z in range(0, 400)]
    for k in (1, 3, 10):
        assert mechanism.upper_tail(k) == pytest.approx(sum(pmf[k:]), rel=1e-12)
