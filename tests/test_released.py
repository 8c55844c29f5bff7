"""SQL over a released answer is post-processing (dpsql/analysis/released.py): an outer query over a private query
that dpsql answers on its own costs what that query costs, once, and computes on its released rows (and public
tables) only. Two sessions seeded alike release the same noise, so the outer query's answer can be checked
against the same computation done by hand on the inner query's own answer."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from benchmarks.support import seeded
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.session import PrivateSession

INNER = "SELECT region, COUNT(*) AS n, AVG(cost) AS c FROM visits WHERE age > 30 GROUP BY region"


@pytest.fixture
def sessions(visits_policy: Path):
    """Two sessions on one ledger whose noise is the same: one asks the inner query, the other the outer."""
    made = [PrivateSession(visits_policy, "tester", rng=seeded(5), bounding_seed=3) for _ in range(2)]
    yield made
    for session in made:
        session.close()


def _inner_rows(session: PrivateSession) -> dict[str, tuple[int, float]]:
    return {region: (n, c) for region, n, c in session.execute(INNER).rows}


def test_window_functions_over_the_released_cells(sessions) -> None:
    alone, wrapped = sessions
    released = _inner_rows(alone)
    result = wrapped.execute(f"SELECT region, n, SUM(n) OVER () AS total, RANK() OVER (ORDER BY n DESC) AS r "
                             f"FROM ({INNER}) AS t ORDER BY region")
    total = sum(n for n, _ in released.values())
    ranks = {region: 1 + sum(m > n for m, _ in released.values()) for region, (n, _) in released.items()}
    assert result.rows == [(region, released[region][0], total, ranks[region]) for region in sorted(released)]
    assert [c.name for c in result.columns] == ["region", "n", "total", "r"]
    assert result.cost.epsilon == Fraction(1)  # the inner query's cost: post-processing is free


def test_superset_wrappers_count_and_limit_the_released_rows(sessions) -> None:
    alone, wrapped = sessions
    first, second = alone.execute(INNER).rows, alone.execute(INNER).rows  # each asking draws new noise
    assert wrapped.execute(f"SELECT COUNT(*) AS rowcount FROM ({INNER}) AS t").rows == [(len(first),)]
    assert wrapped.execute(f"SELECT * FROM ({INNER}) AS t LIMIT 1000").rows == second


def test_a_join_with_a_public_table_and_filters_on_noisy_values(sessions) -> None:
    alone, wrapped = sessions
    released = _inner_rows(alone)
    population = dict(alone.execute("SELECT region, population FROM regions").rows)  # public: free, no noise
    result = wrapped.execute(f"WITH t AS ({INNER}) SELECT t.region, t.n * 1000000.0 / r.population AS rate "
                             "FROM t JOIN regions AS r ON r.region = t.region WHERE t.c > 0 ORDER BY 1")
    assert [(region, pytest.approx(rate)) for region, rate in result.rows] == [
        (region, n * 1_000_000.0 / population[region]) for region, (n, c) in sorted(released.items()) if c > 0]


def test_the_ledger_holds_one_charge_the_inner_query(visits_policy: Path) -> None:
    session = PrivateSession(visits_policy, "tester", rng=seeded(2), bounding_seed=3)
    try:
        before = len(session.history())
        result = session.execute(f"WITH t AS ({INNER}) SELECT a.region, a.n - b.n AS d FROM t AS a "
                                 "JOIN t AS b ON a.region < b.region")  # read twice, answered once
        assert len(result.rows) == 10
        (charge,) = session.history()[before:]
        assert charge.query == INNER and charge.epsilon == result.cost.epsilon == 1
    finally:
        session.close()


def test_parameters_bind_in_the_inner_and_the_outer_query(sessions) -> None:
    alone, wrapped = sessions
    inner = "SELECT region, COUNT(*) AS n FROM visits WHERE age > ? GROUP BY region"
    released = dict(alone.execute(inner, (40,)).rows)
    rows = wrapped.execute(f"SELECT region FROM ({inner}) AS t WHERE n > ? ORDER BY region", (40, 600)).rows
    assert [r for (r,) in rows] == sorted(region for region, n in released.items() if n > 600)


@pytest.mark.parametrize(("sql", "message"), [
    # The outer query may read one private query's answer and public tables only.
    (f"SELECT * FROM ({INNER}) AS t JOIN visits AS v ON v.region = t.region", "one private query's answer"),
    (f"SELECT * FROM ({INNER}) AS t, (SELECT sex, COUNT(*) AS m FROM visits GROUP BY sex) AS s",
     "one private query's answer"),
    # Checked on an empty answer before anything is charged: an unknown column, an unvetted function.
    (f"SELECT nope FROM ({INNER}) AS t", "nope"),
    (f"SELECT random() FROM ({INNER}) AS t", "not in the list of vetted"),
    (f"SELECT * FROM ({INNER}) AS t, __dp_released", "unknown table|reserved"),
    # The inner query must be answerable on its own.
    ("SELECT COUNT(*) FROM (SELECT region, MODE(age) AS m FROM visits GROUP BY region) AS t", "per-unit|MODE"),
])
def test_refused_from_the_text_at_no_cost(refusing_visits_session, sql, message) -> None:
    before = len(refusing_visits_session.history())
    with pytest.raises((QueryRejected, ProgrammingError), match=message):
        refusing_visits_session.execute(sql)
    assert len(refusing_visits_session.history()) == before


def test_nothing_of_a_released_answer_stays_in_the_public_database(sessions) -> None:
    _, session = sessions
    session.execute(f"SELECT COUNT(*) FROM ({INNER}) AS t")
    with pytest.raises(QueryRejected, match="failed"):
        session.engine.run_public("SELECT * FROM __dp_released")  # the temporary table was rolled back
