"""The DB-API 2.0 (PEP 249) surface, with dpsql's extensions for intervals and noise."""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path

import pytest

import dpsql
from benchmarks.support import seeded

GROUPED = "SELECT sex, COUNT(*) AS n, AVG(income) AS avg_income FROM pums GROUP BY sex ORDER BY sex"


@pytest.fixture
def con(pums_policy: Path):
    connection = dpsql.connect(policy=pums_policy, analyst="dbapi", epsilon=0.5, rng=seeded(6), bounding_seed=2)
    yield connection
    connection.close()


def test_module_globals_follow_pep_249() -> None:
    assert dpsql.apilevel == "2.0" and dpsql.threadsafety == 1 and dpsql.paramstyle == "qmark"
    hierarchy = [(dpsql.Warning, Exception), (dpsql.Error, Exception), (dpsql.InterfaceError, dpsql.Error),
                 (dpsql.DatabaseError, dpsql.Error), (dpsql.DataError, dpsql.DatabaseError),
                 (dpsql.OperationalError, dpsql.DatabaseError), (dpsql.IntegrityError, dpsql.DatabaseError),
                 (dpsql.InternalError, dpsql.DatabaseError), (dpsql.ProgrammingError, dpsql.DatabaseError),
                 (dpsql.NotSupportedError, dpsql.DatabaseError),
                 (dpsql.QueryRejected, dpsql.NotSupportedError), (dpsql.BudgetExhausted, dpsql.OperationalError)]
    for child, parent in hierarchy:
        assert issubclass(child, parent), (child, parent)
    assert dpsql.Date(2024, 1, 2) == datetime.date(2024, 1, 2)
    assert dpsql.TimestampFromTicks(0).year >= 1969 and dpsql.Binary(b"x") == b"x"
    assert dpsql.NUMBER == "BIGINT" and dpsql.STRING == "VARCHAR" and dpsql.DATETIME == "DATE"


def test_cursor_execute_fetch_and_describe(con) -> None:
    cur = con.cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    assert cur.execute(GROUPED) is cur
    assert [d[0] for d in cur.description] == ["sex", "n", "avg_income"] and len(cur.description[0]) == 7
    assert cur.description[1][1] == dpsql.NUMBER
    assert cur.rowcount == 2
    first = cur.fetchone()
    assert first[0] == 0 and isinstance(first[1], int)
    assert cur.fetchmany(5) == [cur.result.rows[1]]
    assert cur.fetchone() is None and cur.fetchall() == []
    cur.execute(GROUPED)
    assert list(cur) == cur.result.rows
    cur.arraysize = 2
    cur.execute(GROUPED)
    assert len(cur.fetchmany()) == 2


def test_intervals_and_noise_are_reachable_from_the_cursor(con) -> None:
    cur = con.cursor().execute(GROUPED)
    rows, intervals, stds = cur.fetchall(), cur.intervals, cur.noise_std
    for row, interval, std in zip(rows, intervals, stds, strict=True):
        assert interval[0] is None and std[0] is None  # the group key carries no noise
        for value, (low, high), sd in zip(row[1:], interval[1:], std[1:], strict=True):
            assert low <= value <= high and sd > 0
    assert float(cur.cost.epsilon) == 0.5  # the connection's default epsilon


def test_parameters_are_bound_safely_in_every_style(con) -> None:
    cur = con.cursor()
    cur.execute("SELECT COUNT(*) FROM pums WHERE age > ? AND sex = ?", (30, 1))
    assert cur.rowcount == 1
    cur.execute("SELECT COUNT(*) FROM pums WHERE age > :age", {"age": 30})
    cur.execute("SELECT COUNT(*) FROM pums WHERE age > $1 AND age < $1 + 40", [30])
    # A value is a value, never SQL: the injection attempt is compared as a string and changes nothing.
    cur.execute("SELECT COUNT(*) FROM pums WHERE CAST(sex AS VARCHAR) = ?", ("1' OR '1'='1",))
    assert cur.result.plan.query.where.sql().count("'1'' OR ''1''=''1'") == 1
    with pytest.raises(dpsql.ProgrammingError, match="2 placeholders but 1"):
        cur.execute("SELECT COUNT(*) FROM pums WHERE age > ? AND sex = ?", (30,))
    with pytest.raises(dpsql.DataError, match="not a finite number"):
        cur.execute("SELECT COUNT(*) FROM pums WHERE age > ?", (float("nan"),))


@pytest.mark.parametrize(("epsilon", "problem"), [
    ("0.5", "epsilon must be a number, got str"), (True, "epsilon must be a number, got bool"),
    (float("inf"), "finite number > 0"), (0, "finite number > 0"), (1e-12, "below 1e-09"),
])
def test_epsilon_must_be_a_usable_number_and_a_refusal_costs_nothing(con, epsilon, problem) -> None:
    before = con.budget().queries
    with pytest.raises(dpsql.DataError, match=problem):
        con.cursor().execute("SELECT COUNT(*) FROM pums", epsilon=epsilon)
    assert con.budget().queries == before


def test_executemany_charges_each_run(con) -> None:
    before = con.budget().queries
    cur = con.cursor().executemany("SELECT COUNT(*) FROM pums WHERE sex = ?", [(0,), (1,)], epsilon=0.1)
    assert con.budget().queries == before + 2 and cur.rowcount == 1


def test_connection_extensions_explain_budget_history(con) -> None:
    text = con.explain(GROUPED)
    assert "discrete Laplace" in text and "Rewritten SQL" in text
    assert con.budget().queries == 0  # explaining spends nothing
    con.cursor().execute(GROUPED, epsilon=0.25)
    spent = con.budget()
    assert spent.epsilon_spent == 0.25 and spent.queries == 1 and con.history()[0].query == GROUPED
    con.commit()
    con.rollback()  # read-only: both do nothing


def test_closed_objects_refuse_clearly(con) -> None:
    cur = con.cursor()
    with pytest.raises(dpsql.ProgrammingError, match="no query has been run"):
        cur.fetchall()
    cur.close()
    with pytest.raises(dpsql.InterfaceError, match="cursor is closed"):
        cur.execute(GROUPED)
    other = con.cursor()
    con.close()
    with pytest.raises(dpsql.InterfaceError, match="connection is closed"):
        other.execute(GROUPED)
    with pytest.raises(dpsql.InterfaceError):
        con.commit()
    con.close()  # closing twice is harmless


def test_errors_reach_the_caller_as_pep_249_classes(con) -> None:
    cur = con.cursor()
    with pytest.raises(dpsql.NotSupportedError):  # QueryRejected
        cur.execute("SELECT MODE(income) FROM pums")
    with pytest.raises(dpsql.ProgrammingError):
        cur.execute("SELEKT 1")
    cur.execute("SELECT COUNT(*) FROM pums", epsilon=1.0)
    with pytest.raises(dpsql.OperationalError):  # BudgetExhausted: 99.5 asked, 99 left
        cur.execute("SELECT COUNT(*) FROM pums", epsilon=99.5)
    with pytest.raises(dpsql.NotSupportedError):
        cur.nextset()


def test_pandas_read_sql_works_on_the_connection(con) -> None:
    pandas = pytest.importorskip("pandas")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pandas notes it was not given SQLAlchemy
        frame = pandas.read_sql(GROUPED, con)
    assert list(frame.columns) == ["sex", "n", "avg_income"] and len(frame) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        frame = pandas.read_sql("SELECT COUNT(*) AS n FROM pums WHERE age > ?", con, params=(50,))
    assert frame["n"].iloc[0] > 0


def test_a_context_manager_closes_the_connection(pums_policy: Path) -> None:
    with dpsql.connect(pums_policy, "ctx", rng=seeded(1)) as connection, connection.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM pums")
    with pytest.raises(dpsql.InterfaceError):
        connection.cursor().execute("SELECT COUNT(*) FROM pums")


def test_an_analyst_sees_only_their_own_charges_and_the_totals(pums_policy: Path, con) -> None:
    other = dpsql.connect(policy=pums_policy, analyst="bob", epsilon=0.25, rng=seeded(7))
    secret = "SELECT COUNT(*) FROM pums WHERE income > 123456"
    other.cursor().execute(secret)
    con.cursor().execute(GROUPED)
    assert [c.query for c in con.history()] == [GROUPED] and {c.analyst for c in con.history()} == {"dbapi"}
    assert [c.query for c in other.history()] == [secret]
    assert con.budget().queries == 1 and con.budget(everyone=True).queries == 2
    assert con.budget(everyone=True).epsilon_spent == 0.75
    for peek in (lambda: con.history("bob"), lambda: con.budget("bob")):
        with pytest.raises(dpsql.ProgrammingError, match="only their own"):
            peek()
    assert con.history("dbapi") == con.history()
    other.close()


def test_every_error_class_carries_an_exit_code_and_a_sqlstate() -> None:
    import dpsql.errors as errors

    classes = [getattr(errors, name) for name in errors.__all__ if not issubclass(getattr(errors, name), Warning)]
    for cls in classes:
        assert len(cls.sqlstate) == 5 and cls.sqlstate.isalnum() and cls.sqlstate.upper() == cls.sqlstate, cls
        assert cls.exit_code in (1, 3, 4, 66, 69, 78) and cls.label in ("error", "rejected", "refused"), cls
    assert (errors.QueryRejected.exit_code, errors.QueryRejected.sqlstate) == (4, "0A000")
    assert (errors.BudgetExhausted.exit_code, errors.BudgetExhausted.sqlstate) == (3, "53000")
    assert (errors.PolicyError.exit_code, errors.LedgerError.exit_code) == (1, 1)
    assert errors.DataError.sqlstate == "22023" and errors.ProgrammingError.sqlstate == "42000"
    # sysexits for what is neither the query's nor the policy's fault (cli.py's docstring)
    assert (errors.NoTerminal.exit_code, errors.CannotListen.exit_code, errors.ServerSetupError.exit_code) == (
        66, 69, 78)
