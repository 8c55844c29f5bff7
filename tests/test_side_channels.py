"""No row can change how a query behaves other than through its noisy answer.

Each query below would raise an engine error on exactly one target row (division by zero, a failed cast,
overflow). dpsql must answer it the same way in the world with that row and the world without it: the failing
expression becomes NULL for that row, never an error that would reveal the row.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import open_session, write_csv, write_policy
from dpsql.errors import ExecutionFailed, QueryRejected
from dpsql.session import PrivateSession

TARGET = 7

TRIGGERS = [
    "SELECT COUNT(*) FROM t WHERE 10 / (x - 5) > 0",  # x = 5 only for the target: division by zero
    "SELECT COUNT(*) FROM t WHERE CAST(code AS INT) > 3",  # code = 'oops' only for the target
    "SELECT COUNT(*) FROM t WHERE CASE WHEN pid = 7 THEN CAST(code AS INT) = 1 ELSE true END",
    "SELECT COUNT(*) FROM t WHERE x * 9223372036854775807 > 0",  # overflows for x >= 2
    "SELECT COUNT(*) FROM t WHERE ln(x - 5) > 0",  # -inf / NaN rather than an error in DuckDB
    "SELECT CAST(code AS INT) AS k, COUNT(*) FROM t WHERE pid < 20 GROUP BY CAST(code AS INT)",  # as a key
    "SELECT SUM(CASE WHEN CAST(code AS INT) > 0 THEN y ELSE 0 END) FROM t",  # inside an aggregate
    "SELECT AVG(y * 9223372036854) FROM t",
]

# Triggers whose operation has no total form: refused from the text (dpsql/analysis/typecheck.py), the same in both
# worlds.
REFUSED_TRIGGERS = [
    "SELECT COUNT(*) FROM t WHERE 10 // (x - 5) > 0",  # integer division by zero
    "SELECT COUNT(*) FROM t WHERE 10 % (x - 5) = 0",
    "SELECT COUNT(*) FROM t WHERE pid = 7 AND pid IN (1, 'x')",  # an implicit cast hidden in a comparison
    "SELECT COUNT(*) FROM t WHERE substring(code, x - 5, 1) = 'o'",  # an offset out of DuckDB's range fails
]


def _world(folder: Path, with_target: bool) -> PrivateSession:
    folder.mkdir()
    rows = [(pid, 10 + pid, str(pid % 4), pid % 9) for pid in range(1, 41) if pid != TARGET]
    if with_target:
        rows.append((TARGET, 5, "oops", 3))
    write_csv(folder / "t.csv", ["pid", "x", "code", "y"], rows)
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "x": {"type": "int"}, "code": {"type": "text"},
                    "y": {"type": "int", "lower": 0, "upper": 8}}}}, {"epsilon": 1e9, "delta": 1e-3})
    return open_session(policy, 2, "attacker", bounding_seed=5)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    base = tmp_path_factory.mktemp("worlds")
    sessions = [_world(base / "with", True), _world(base / "without", False)]
    yield sessions
    for session in sessions:
        session.close()


@pytest.mark.parametrize("sql", TRIGGERS)
def test_a_row_that_would_fail_makes_no_error(worlds, sql: str) -> None:
    outcomes = []
    for session in worlds:
        before = session.spending().queries
        result = session.execute(sql, epsilon=1.0)  # would raise ExecutionFailed if the row broke the query
        assert session.spending().queries == before + 1
        outcomes.append(len(result.columns))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("sql", REFUSED_TRIGGERS)
def test_a_row_that_would_fail_is_refused_from_the_text_at_no_cost(worlds, sql: str) -> None:
    messages = []
    for session in worlds:
        before = session.spending().queries
        with pytest.raises(QueryRejected) as caught:
            session.execute(sql, epsilon=1.0)
        assert session.spending().queries == before
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE random() < 0.5",
    "SELECT COUNT(*) FROM t WHERE setseed(0.5) IS NULL",
    "SELECT COUNT(*) FROM t WHERE now() > DATE '2020-01-01'",
    "SELECT COUNT(*) FROM t WHERE current_timestamp > DATE '2020-01-01'",
    "SELECT COUNT(*) FROM t WHERE sleep_ms(x) IS NULL",
    "SELECT COUNT(*) FROM t WHERE error(code) IS NULL",
    "SELECT COUNT(*) FROM t WHERE regexp_matches(code, '(')",
    "SELECT COUNT(*) FROM t WHERE code LIKE code",
    "SELECT COUNT(*) FROM t WHERE uuid() IS NOT NULL",
])
def test_volatile_timing_and_erroring_functions_are_refused(worlds, sql: str) -> None:
    with pytest.raises(QueryRejected):
        worlds[0].execute(sql)


def test_an_engine_failure_is_generic_and_charged(worlds, monkeypatch) -> None:
    """Should the engine fail anyway, the analyst sees the same message whatever the data (here the engine's own
    message names a private value), and the query is paid for: it ran on the data, so whether it failed is itself
    something about the data."""
    session = worlds[0]
    cursors = session.engine._data  # each query on the data runs on a cursor of this pool's
    real = cursors.taken

    @contextlib.contextmanager
    def failing():
        with real() as (cursor, watchdog):
            yield _FailingConnection(cursor), watchdog
    monkeypatch.setattr(cursors, "taken", failing)
    before = session.spending().queries
    with pytest.raises(ExecutionFailed) as caught:
        session.execute("SELECT COUNT(*) FROM t", epsilon=1.0)
    assert session.spending().queries == before + 1
    assert "oops" not in str(caught.value) and "charged" in str(caught.value)


class _FailingConnection:
    """A DuckDB connection whose queries fail with an error that quotes a private value."""

    def __init__(self, real) -> None:
        self.real = real

    def execute(self, sql: str, *args):
        if sql.startswith(("BEGIN", "ROLLBACK")):  # transactions work (the dry run has its own client)
            return self.real.execute(sql, *args)
        raise duckdb.ConversionException("Could not convert string 'oops' to INT32 (row of pid 7)")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE pid = 7 AND 0 IN ('NULL', 0.5)",
    "SELECT COUNT(*) FROM t WHERE x = 5 AND 0.5 IN ('x')",
    "SELECT COUNT(*) FROM t WHERE CASE WHEN pid = 7 THEN CAST('oops' AS INT) = 1 ELSE true END",
])
def test_a_constant_that_cannot_be_evaluated_is_refused_from_the_text(worlds, sql: str) -> None:
    """DuckDB folds constants while planning and TRY does not catch a failing one; whether the planner reaches
    it can depend on the table's statistics (min/max pruning), so it could tell the two worlds apart. It is
    evaluated on its own at check time and refused, the same way in both worlds, at no cost."""
    messages = []
    for session in worlds:
        before = session.spending().queries
        with pytest.raises(QueryRejected, match="cannot be evaluated|mixes decimal and text") as caught:
            session.execute(sql, epsilon=1.0)
        assert session.spending().queries == before
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
