"""Group keys: public values are all released (empty ones too); other keys pass DP partition selection."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.plan import _threshold
from dpsql.release import release
from dpsql.session import PrivateSession
from tests.conftest import seeded, write_csv, write_policy


def test_every_public_group_is_released_even_if_empty(pums_session) -> None:
    """The codebook lists race 1..9; the sample has only 1..6: 7, 8 and 9 come back as noisy counts of 0."""
    result = pums_session.execute("SELECT race, COUNT(*) FROM pums GROUP BY race ORDER BY race")
    assert [row[0] for row in result.rows] == list(range(1, 10))
    result = pums_session.execute("SELECT sex, married, COUNT(*) FROM pums WHERE age > 90 GROUP BY sex, married")
    assert sorted((r[0], r[1]) for r in result.rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.fixture
def cities(tmp_path: Path):
    """200 people in 'big' (one row each), one person in 'rare' with three rows; city has no public values."""
    rows = [(pid, "big") for pid in range(1, 201)] + [(999, "rare")] * 3
    write_csv(tmp_path / "t.csv", ["pid", "city"], rows)
    policy = write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 3,
        "columns": {"pid": {"type": "int"}, "city": {"type": "text"}}}},
        {"epsilon": 1e6, "delta": 1e-3, "query_delta": 1e-8})
    session = PrivateSession(policy, "t", rng=seeded(2), bounding_seed=3, create_ledger=True)
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


@pytest.mark.parametrize("mechanism", [LaplaceMechanism(3, 0.7), LaplaceMechanism(1, 2.0),
                                       GaussianMechanism(3, 0.3)])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_the_threshold_bounds_the_release_chance_by_delta(mechanism, delta) -> None:
    """Worst cases for a unit with m = sensitivity rows: all in one new group, or one row in each of m groups."""
    m = mechanism.sensitivity
    tau = _threshold(mechanism, m, delta)
    assert mechanism.upper_tail(tau - m) <= delta and m * mechanism.upper_tail(tau - 1) <= delta
    # and it is the smallest such threshold
    assert max(mechanism.upper_tail(tau - 1 - m), m * mechanism.upper_tail(tau - 2)) > delta or tau == m + 1


def test_discrete_laplace_tail_is_exact() -> None:
    """P(Z >= k) = alpha^k / (1 + alpha): checked against the pmf summed directly."""
    mechanism = LaplaceMechanism(2, 0.9)
    a = math.exp(-1 / float(mechanism.scale))
    pmf = [(1 - a) / (1 + a) * a**z for z in range(0, 400)]
    for k in (1, 3, 10):
        assert mechanism.upper_tail(k) == pytest.approx(sum(pmf[k:]), rel=1e-12)
