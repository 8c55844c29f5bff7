"""Empty groups (issue 29, item 2): an aggregate over no values is NULL in SQL, and dpsql reads "no values" off the
noisy count the aggregate divides by. AVG, VAR_POP and STDDEV_POP are NULL where that count rounds to 0 (where
COUNT(x) of the same query is 0), VAR_SAMP and STDDEV_SAMP where it rounds below 2; a NULL cell has no interval.
COUNT and SUM stay noisy numbers (a noisy 0), and arithmetic on the cells is DuckDB's but for a division by a
noisy 0, which is NULL (docs/explanation/aggregates.md, "Empty groups").

The groups: 'a' with three values of x, 'b' with one, 'c' with rows whose x is NULL, 'e' declared and without a
row. At negligible noise (epsilon 1e12) each cell must be what DuckDB answers for the same SQL over that group's
rows (for 'e', over no rows), but for the documented SUM.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import Budget, Table, column, open_session, write_dataset
from dpsql.session import PrivateSession

TABLE = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b", "c", "e"), nullable=False),
                           column("x", "float", 0.0, 10.0)), max_rows=1)
ROWS = [(1, "a", 1.0), (2, "a", 2.5), (3, "a", 6.0), (4, "b", 4.0), (5, "c", None), (6, "c", None)]
OUTPUTS = ("COUNT(*)", "COUNT(x)", "AVG(x)", "VAR_SAMP(x)", "VAR_POP(x)", "STDDEV_SAMP(x)", "STDDEV_POP(x)",
           "SUM(x)", "SUM(x) / COUNT(*)", "AVG(x) * 2")


@pytest.fixture
def data(tmp_path: Path) -> Iterator[tuple[Path, duckdb.DuckDBPyConnection]]:
    policy = write_dataset(tmp_path, TABLE, ROWS, Budget(epsilon=1e15, query_epsilon=1e12))
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_csv('{tmp_path / 't.csv'}', header = true, "
                "columns = {'uid': 'BIGINT', 'g': 'VARCHAR', 'x': 'DOUBLE'})")
    yield policy, con
    con.close()


def _sql(order: str) -> str:
    return f"SELECT g, {', '.join(OUTPUTS)} FROM t GROUP BY g{order}"


@pytest.mark.parametrize("order", ["", " ORDER BY g"])  # the answer assembled directly, and through DuckDB
def test_each_cell_is_sqls_answer_for_the_groups_rows(data, order: str) -> None:
    policy, con = data
    session = open_session(policy, 1)
    try:
        result = session.execute(_sql(order))
    finally:
        session.close()
    for row, intervals in zip(result.rows, result.intervals, strict=True):
        group = row[0]
        ((*expected,),) = con.sql(f"SELECT {', '.join(OUTPUTS)} FROM t WHERE g = '{group}'").fetchall()
        # Documented: over no value of x ('c', 'e') SUM is a noisy 0, not NULL, and the cells' arithmetic computes on
        # that 0, but a division by a noisy 0 is NULL (SUM(x) / COUNT(*) where COUNT(*) is 0).
        zeroed = [o.replace("SUM(x)", "0.0::DOUBLE").replace("/ COUNT(*)", "/ NULLIF(COUNT(*), 0)") for o in OUTPUTS]
        ((*summed,),) = con.sql(f"SELECT {', '.join(zeroed)} FROM t WHERE g = '{group}'").fetchall()
        for name, mine, theirs, zero, interval in zip(OUTPUTS, row[1:], expected, summed, intervals[1:],
                                                      strict=True):
            if "SUM" in name and theirs is None:
                assert mine == zero, (group, name, mine, zero)
                continue
            assert (mine is None) == (theirs is None), (group, name, mine, theirs)
            if theirs is None:
                assert interval is None, (group, name)
            else:
                assert mine == pytest.approx(theirs, rel=1e-9), (group, name, mine, theirs)


def test_at_ordinary_noise_a_cell_is_null_exactly_where_the_released_count_says_too_few(tmp_path: Path) -> None:
    """At epsilon 1 the noisy count of 'b' (one value) and 'e' (none) is sometimes 0, 1 or more: AVG is NULL exactly
    when COUNT(x) is 0, VAR_SAMP when it is at most 1, and a NULL cell has no interval; both happen."""
    policy = write_dataset(tmp_path, TABLE, ROWS, Budget(epsilon=1e6))
    session: PrivateSession = open_session(policy, 8)
    seen = set()
    try:
        for _ in range(60):
            result = session.execute("SELECT g, COUNT(x), AVG(x), VAR_SAMP(x), STDDEV_POP(x) FROM t GROUP BY g")
            for (_, count, average, variance, deviation), intervals in zip(result.rows, result.intervals,
                                                                           strict=True):
                assert (average is None) == (count == 0) == (deviation is None), (count, average, deviation)
                assert (variance is None) == (count <= 1), (count, variance)
                for value, interval in zip((average, variance, deviation), intervals[2:], strict=True):
                    assert (value is None) == (interval is None)
                seen.add((average is None, variance is None))
    finally:
        session.close()
    assert seen == {(True, True), (False, True), (False, False)}
