"""A quantile's interval on request: with it, a quarter of the quantile's epsilon measures the 95% interval; without
it, the value gets the whole epsilon and the cell has no interval (dp/quantile.QuantileMechanism.interval_share,
planning/plan.Budget.quantile_intervals). The CLI measures it with --ci, the server with dpsql.intervals = on, the
DB-API unless connect(quantile_intervals=False)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from benchmarks.support import seeded
from dpsql.dp.quantile import Grid, QuantileMechanism
from dpsql.dp.quantile_interval import INTERVAL_SHARE
from dpsql.frontends.explain import explain
from dpsql.planning.measurements import MeasurementKind
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.store.answers import AnswerStore
from tests.test_cli import run

MIXED = "SELECT department, MEDIAN(cost), MAX(cost), COUNT(*) FROM visits GROUP BY department"


def _quantile_mechanisms(session: PrivateSession, sql: str, **options) -> list[QuantileMechanism]:
    plan = session.prepare(sql, epsilon=1, **options).plan
    return [m.mechanism for m in plan.measurements if m.spec.kind is MeasurementKind.QUANTILE]


def test_without_an_interval_the_value_has_the_whole_epsilon_and_no_ends() -> None:
    grid = Grid(Fraction(0), Fraction(1), 10, points=True)
    with_interval = QuantileMechanism(grid, Fraction(1, 2), 2, 0.8)
    without = QuantileMechanism(grid, Fraction(1, 2), 2, 0.8, Fraction(0))
    assert with_interval.point_epsilon == Fraction(0.8) * (1 - INTERVAL_SHARE)
    assert without.point_epsilon == Fraction(0.8)
    counts = [3, 0, 5, 1, 0, 0, 2, 0, 0, 0, 4]
    released = without.release(counts, seeded(1))
    assert math.isnan(released.low) and math.isnan(released.high) and 0 <= released.value <= 10
    ends = with_interval.release(counts, seeded(1))
    assert ends.low <= ends.value <= ends.high
    assert "no interval" in without.describe() and "no interval" not in with_interval.describe()
    with pytest.raises(ValueError, match="interval share"):
        QuantileMechanism(grid, Fraction(1, 2), 2, 0.8, Fraction(1))


def test_the_session_measures_the_interval_unless_told_not_to(visits_policy: Path) -> None:
    session = PrivateSession(visits_policy, "tester", rng=seeded(4), bounding_seed=1)
    try:
        assert [m.interval_share for m in _quantile_mechanisms(session, MIXED)] == [INTERVAL_SHARE] * 2
        assert [m.interval_share for m in _quantile_mechanisms(session, MIXED, quantile_intervals=False)] == [0, 0]
        on = session.execute(MIXED, epsilon=1)
        off = session.execute(MIXED, epsilon=1, quantile_intervals=False)
        for row in on.intervals:
            assert all(interval is not None for interval in row[1:])
        for row in off.intervals:
            assert row[0] is None and row[1] is None and row[2] is None and row[3] is not None  # COUNT keeps its
        assert off.cost == on.cost
    finally:
        session.close()
    default_off = PrivateSession(visits_policy, "tester", rng=seeded(4), bounding_seed=1, quantile_intervals=False)
    try:
        assert [m.interval_share for m in _quantile_mechanisms(default_off, MIXED)] == [0, 0]
        assert [m.interval_share for m in _quantile_mechanisms(default_off, MIXED, quantile_intervals=True)] == \
            [INTERVAL_SHARE] * 2
    finally:
        default_off.close()


def test_post_processed_quantiles_without_an_interval_have_none(visits_policy: Path) -> None:
    session = PrivateSession(visits_policy, "tester", rng=seeded(5), bounding_seed=1)
    try:
        result = session.execute("SELECT department, MEDIAN(cost) * 2 AS m, COUNT(*) AS n FROM visits "
                                 "GROUP BY department ORDER BY m", quantile_intervals=False)
        assert all(row[1] is None and row[2] is not None for row in result.intervals)
    finally:
        session.close()


def test_a_stored_answer_is_another_answer_only_when_the_option_changes_a_quantile(visits_policy: Path) -> None:
    loaded = load_policy(visits_policy)
    session = PrivateSession(loaded, "alice", rng=seeded(6), answers=AnswerStore(loaded.answers))
    try:
        counts = "SELECT department, COUNT(*) FROM visits GROUP BY department"
        first = session.execute(counts)
        assert session.execute(counts, quantile_intervals=False).cached_at is not None  # nothing to decide
        median = session.execute("SELECT MEDIAN(cost) FROM visits")
        assert session.execute("SELECT MEDIAN(cost) FROM visits").cached_at is not None
        without = session.execute("SELECT MEDIAN(cost) FROM visits", quantile_intervals=False)
        assert without.cached_at is None and without.intervals == [(None,)]  # not the answer with an interval
        assert median.intervals[0][0] is not None and first.cached_at is None
        assert len(session.history("alice")) == 3
    finally:
        session.close()


def test_the_dbapi_connection_option(visits_policy: Path) -> None:
    with dpsql.connect(visits_policy, "tester", rng=seeded(7), quantile_intervals=False) as conn:
        cur = conn.cursor()
        cur.execute("SELECT MEDIAN(cost), COUNT(*) FROM visits")
        assert cur.intervals[0][0] is None and cur.intervals[0][1] is not None
    with dpsql.connect(visits_policy, "tester", rng=seeded(7)) as conn:
        cur = conn.cursor()
        cur.execute("SELECT MEDIAN(cost), COUNT(*) FROM visits")
        assert cur.intervals[0][0] is not None


def test_the_cli_measures_a_quantile_interval_when_ci_shows_it(visits_policy: Path) -> None:
    sql = "SELECT MEDIAN(cost) AS m FROM visits"
    code, out, err = run("explain", sql, "--policy", str(visits_policy))
    assert code == 0, err
    assert "no interval (not asked for: the value has the whole budget)" in out
    code, out, err = run("explain", sql, "--policy", str(visits_policy), "--ci")
    assert code == 0, err
    assert f"with {float(INTERVAL_SHARE):g} of its epsilon" in out and "no interval" not in out
    code, out, err = run("query", sql, "--policy", str(visits_policy), "--format", "csv", "--ci")
    assert code == 0, err
    low, value, high = (float(out.splitlines()[1].split(",")[i]) for i in (1, 0, 2))
    assert low <= value <= high


def test_explain_says_which(visits_policy: Path) -> None:
    session = PrivateSession(visits_policy, "tester")
    try:
        without = explain(session.prepare(MIXED, quantile_intervals=False).plan)
        assert "no interval" in without and "noisy counts of the rows around the chosen value" not in without
        assert "no interval" not in explain(session.prepare(MIXED).plan)
    finally:
        session.close()
