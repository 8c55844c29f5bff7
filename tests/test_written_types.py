"""Every released cell has the type plain DuckDB gives the same SQL (issue 29, item 1): a SUM of integers is a HUGEINT
whole number, not a DOUBLE, so `SUM(age) // 7` and `CAST(SUM(stay) AS VARCHAR)` answer as in DuckDB.

At negligible noise (epsilon 1e12) on data where no bound binds (benchmarks/exactness.py's), the values are
DuckDB's too; tests/test_exactness.py runs generated queries the same way. At ordinary noise, a sum of integers is
still a whole number, with an interval of whole numbers that holds it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
import sqlglot

import dpsql
from benchmarks.exactness import plain_duckdb, write_data
from benchmarks.support import open_session, seeded
from dpsql.analysis.written_types import released_range, written_type
from dpsql.errors import QueryRejected
from dpsql.planning.aggregates.base import Estimate, in_type
from dpsql.policy import ColumnPolicy, ColumnType
from dpsql.session import PrivateSession


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateSession, duckdb.DuckDBPyConnection]]:
    folder = tmp_path_factory.mktemp("types")
    session = open_session(write_data(folder, 29), 3, "analyst")
    con = plain_duckdb(folder)
    yield session, con
    session.close()
    con.close()


EXACT = [  # one row each; every cell exact at negligible noise
    "SELECT SUM(age) // 7, CAST(SUM(stay) AS VARCHAR), SUM(age), SUM(age) / COUNT(*) FROM visits",
    "SELECT SUM(age * 2), SUM(CASE WHEN age > 60 THEN 1 ELSE 0 END), SUM(smoker), CAST(SUM(smoker) AS VARCHAR) "
    "FROM visits",
    "SELECT SUM(cost), SUM(age * 1.5), AVG(age), VAR_SAMP(stay), COUNT(*), COUNT(DISTINCT pid), COUNT(cost) "
    "FROM visits",
    "SELECT SUM(total), CAST(SUM(total) AS VARCHAR), AVG(total) FROM (SELECT pid, SUM(stay) AS total FROM visits "
    "GROUP BY pid) AS u",
    "SELECT SUM(v.age) // 3, SUM(p.birth_year) FROM visits v JOIN patients p ON v.pid = p.pid",
]
TYPED = [  # a grid's value, not DuckDB's (docs: quantiles, MIN and MAX): the types are DuckDB's all the same
    "SELECT MIN(age), MAX(stay), QUANTILE_DISC(age, 0.5), MEDIAN(age), QUANTILE_CONT(cost, 0.5), MAX(cost) "
    "FROM visits",
    "SELECT MIN(smoker), MAX(smoker), MAX(total) FROM (SELECT pid, SUM(stay) AS total, MAX(smoker) AS smoker "
    "FROM visits GROUP BY pid) AS u",
]


def _answers(worlds, sql: str) -> tuple[list[str], tuple, list[str], tuple]:
    session, con = worlds
    result = session.execute(sql)
    relation = con.sql(sql)
    ((ours,), (theirs,)) = result.rows, relation.fetchall()
    return [c.type for c in result.columns], ours, [str(t) for t in relation.types], theirs


@pytest.mark.parametrize("sql", EXACT)
def test_each_cell_is_duckdbs_value_and_type(worlds, sql: str) -> None:
    our_types, ours, their_types, theirs = _answers(worlds, sql)
    assert our_types == their_types
    for mine, expected in zip(ours, theirs, strict=True):
        assert type(mine) is type(expected), (mine, expected)
        assert mine == pytest.approx(expected, rel=1e-12) if isinstance(expected, float) else mine == expected


@pytest.mark.parametrize("sql", TYPED)
def test_quantiles_min_and_max_have_duckdbs_types(worlds, sql: str) -> None:
    our_types, ours, their_types, theirs = _answers(worlds, sql)
    assert our_types == their_types
    assert [type(v) for v in ours] == [type(v) for v in theirs]


def test_a_noisy_sum_of_integers_is_a_whole_number_in_a_whole_interval(visits_policy: Path) -> None:
    """At epsilon 1, measured alone (one plain sum) and beside COUNT(*) (a pair, or a centered sum and a count)."""
    session = PrivateSession(visits_policy, "tester", rng=seeded(4), bounding_seed=2)
    try:
        for sql in ("SELECT department, SUM(age), SUM(length_of_stay) FROM visits GROUP BY department",
                    "SELECT department, SUM(age), COUNT(*), AVG(age) FROM visits GROUP BY department"):
            result = session.execute(sql)
            assert result.columns[1].type == "HUGEINT"
            for row, intervals in zip(result.rows, result.intervals, strict=True):
                low, high = intervals[1]
                assert isinstance(row[1], int) and low == math.floor(low) and high == math.floor(high)
                assert low <= row[1] <= high
    finally:
        session.close()


def test_the_db_api_describes_a_sum_of_integers_as_duckdb_does(visits_policy: Path) -> None:
    with dpsql.connect(policy=visits_policy, analyst="dbapi", rng=seeded(2), bounding_seed=2) as con:
        cursor = con.cursor().execute("SELECT SUM(age) AS total, SUM(age) // 7 AS sevenths, AVG(age) AS mean "
                                      "FROM visits")
        assert [d[1] for d in cursor.description] == ["HUGEINT", "HUGEINT", "DOUBLE"]
        assert cursor.description[0][1] == dpsql.NUMBER
        total, sevenths, _ = cursor.fetchone()
        assert isinstance(total, int) and sevenths == total // 7


@pytest.mark.parametrize(("kind", "value", "expected"), [
    ("HUGEINT", 1e40, 2**127 - 2**(127 - 53)),  # beyond the type: the largest double within it
    ("BIGINT", -1e19, -2**63),
    ("BIGINT", 2.5, 2),  # half to even, as numpy rounds
    ("DECIMAL(38,1)", 1e40, None),
    ("BOOLEAN", 0.7, True),
    ("INTEGER", 3.4e9, 2**31 - 1),
])
def test_a_value_is_kept_within_its_type_so_the_cast_cannot_fail_after_the_charge(kind: str, value: float,
                                                                                  expected: object) -> None:
    one = np.array([value])
    released = in_type(Estimate(one, one - 1, one + 1, one), kind)
    lowest, highest, _ = released_range(kind)
    assert lowest <= released.value[0] <= highest
    ((cast,),) = duckdb.sql(f"SELECT CAST({float(released.value[0])!r} AS {kind})").fetchall()
    if expected is not None:
        assert cast == expected


def test_a_call_duckdb_has_no_function_for_is_answered_as_a_double(worlds) -> None:
    """DuckDB has no AVG of a boolean; dpsql answers it as it always has, as the DOUBLE an average is (MEDIAN of a
    boolean is DuckDB's BOOLEAN, as above)."""
    session, con = worlds
    result = session.execute("SELECT AVG(smoker), SUM(smoker) FROM visits")
    assert [c.type for c in result.columns] == ["DOUBLE", "HUGEINT"]
    ((share, count),) = result.rows
    ((rows,),) = con.sql("SELECT COUNT(*) FROM visits").fetchall()
    assert share == pytest.approx(count / rows, rel=1e-12)


def test_an_aggregate_of_a_type_that_is_no_number_is_refused() -> None:
    """The checker admits only numbers and booleans as arguments, so this cannot be met through a query; should a
    call ever type as anything else, it is refused before the charge, not released."""
    with pytest.raises(QueryRejected, match=r"MIN\(d\): DuckDB makes it a DATE, and only numbers and booleans"):
        written_type(sqlglot.parse_one("MIN(d)"), {"d": ColumnPolicy("d", ColumnType.DATE)}, "MIN(d)")
