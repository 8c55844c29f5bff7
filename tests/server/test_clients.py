"""Real clients against the server: psycopg 3, pg8000 and psql log in with SCRAM-SHA-256, ask private queries with
parameters, get dpsql's refusals as SQLSTATEs, and describe queries without spending budget."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import threading

import pg8000.dbapi
import pg8000.native
import psycopg
import pytest
from psycopg.generators import execute

from tests.server.conftest import PASSWORDS, charges, dsn


def test_psycopg_runs_a_query_with_parameters_and_reports_its_cost(served) -> None:
    notices = []
    with psycopg.connect(dsn(served)) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        before = len(charges(served.policy))
        rows = conn.execute("SELECT region, COUNT(*), AVG(age) FROM visits WHERE age > %s AND sex = %s "
                            "GROUP BY region ORDER BY region", (40, "F")).fetchall()
        assert [r[0] for r in rows] == sorted(["north", "south", "east", "west", "central"])
        assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in rows)
        assert len(charges(served.policy)) == before + 1
        assert charges(served.policy)[-1].analyst == "alice"
    assert len(notices) == 1 and "cost epsilon 1" in notices[0] and "alice has epsilon" in notices[0]


@pytest.mark.parametrize("value", [datetime.date(2020, 1, 1), "2020-01-01"])
def test_psycopg_binds_dates_typed_and_untyped(served, value) -> None:
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM visits WHERE visit_date >= %s", (value,)).fetchone()
        assert isinstance(count, int)


def test_psycopg_binary_parameters_and_results(served) -> None:
    with psycopg.connect(dsn(served), autocommit=True) as conn, conn.cursor(binary=True) as cur:
        cur.execute("SELECT sex, COUNT(*), AVG(cost) FROM visits WHERE age < %b AND smoker = %b GROUP BY sex",
                    (50, True))
        rows = cur.fetchall()
        assert sorted(r[0] for r in rows) == ["F", "M"]
        assert [d.type_code for d in cur.description] == [25, 20, 701]


@pytest.mark.parametrize("binary", [False, True])
def test_a_sum_of_integers_is_announced_and_sent_as_numeric(served, binary: bool) -> None:
    """HUGEINT, as DuckDB types SUM(age): numeric (OID 1700) in RowDescription, a whole number in text and in
    binary (pgjdbc asks for numeric in binary once a statement is prepared), and integer division stays integer."""
    with psycopg.connect(dsn(served), autocommit=True) as conn, conn.cursor(binary=binary) as cur:
        cur.execute("SELECT SUM(age), SUM(age) // 7, CAST(SUM(length_of_stay) AS VARCHAR), AVG(age) FROM visits")
        assert [d.type_code for d in cur.description] == [1700, 1700, 25, 701]
        total, sevenths, text, _ = cur.fetchone()
        assert total == int(total) and sevenths == total // 7 and text == str(int(text))


def test_rejected_query_gives_0A000_and_the_connection_stays_usable(served) -> None:
    with psycopg.connect(dsn(served)) as conn:
        before = len(charges(served.policy))
        with pytest.raises(psycopg.errors.FeatureNotSupported) as caught:
            conn.execute("SELECT * FROM visits")
        assert caught.value.sqlstate == "0A000"
        assert "individual rows" in str(caught.value)
        assert len(charges(served.policy)) == before
        conn.rollback()
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0


def test_budget_exhausted_gives_53000(served) -> None:
    with psycopg.connect(dsn(served, "carol"), autocommit=True) as conn:
        conn.execute("SELECT COUNT(*) FROM visits")  # carol's budget is 1.5, a query costs 1
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT COUNT(*) FROM visits WHERE age > 1")  # another question: not in the answer cache
        assert caught.value.sqlstate == "53000"
        row = conn.execute("SHOW dpsql.budget").fetchone()
        assert row[0] == "carol" and row[1:3] == (1.0, 0.5)


def test_set_epsilon_sets_the_cost_of_the_next_queries(served) -> None:
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.25")
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("0.25",)
        conn.execute("SELECT COUNT(*) FROM visits")
        assert charges(served.policy)[-1].epsilon == pytest.approx(0.25)
        conn.execute("RESET dpsql.epsilon")
        conn.execute("SELECT COUNT(*) FROM visits WHERE age >= 0")  # other rows: nothing released to derive from
        assert charges(served.policy)[-1].epsilon == 1
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SET dpsql.epsilon = 'lots'")
        assert caught.value.sqlstate == "22023"


def test_startup_statements_are_answered_without_a_charge(served) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        conn.execute("SET application_name = 'dashboard'")
        assert conn.info.parameter_status("application_name") == "dashboard"
        conn.execute("SET extra_float_digits = 3")
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("3",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
        assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 16.0 (dpsql")
        assert conn.execute("select current_user").fetchone() == ("alice",)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SET DateStyle = 'German'")
        assert caught.value.sqlstate == "22023"
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SHOW no_such_setting")
        assert caught.value.sqlstate == "42704"
        conn.execute("SET dpsql.epsilon = 2")
        conn.execute("DISCARD ALL")
        assert conn.info.parameter_status("application_name") == ""
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("default",)
        explained = conn.execute("EXPLAIN SELECT COUNT(*) FROM visits WHERE length_of_stay > 28").fetchone()[0]
        assert explained.startswith("Cost: epsilon 1")
        conn.execute("BEGIN")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("COMMIT")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert len(charges(served.policy)) == before


def test_empty_query_and_several_statements(served) -> None:
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        assert conn.pgconn.exec_(b" ; -- nothing").status == psycopg.pq.ExecStatus.EMPTY_QUERY
        before = len(charges(served.policy))
        result = conn.pgconn.exec_(b"SET dpsql.epsilon = 0.5; SELECT COUNT(*) FROM visits; SHOW dpsql.epsilon")
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK and result.get_value(0, 0) == b"0.5"
        assert len(charges(served.policy)) == before + 1


def test_describe_never_runs_or_charges_a_query(served) -> None:
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        before = charges(served.policy)
        pgconn = conn.pgconn
        sql = b"SELECT region, COUNT(*) AS n, AVG(cost) FROM visits WHERE age > $1 AND visit_date < $2 GROUP BY region"
        # libpq's blocking calls may hold the GIL, which the in-process server needs: send, then wait as psycopg does
        pgconn.send_prepare(b"q1", sql)
        assert conn.wait(execute(pgconn))[0].status == psycopg.pq.ExecStatus.COMMAND_OK
        pgconn.send_describe_prepared(b"q1")
        (described,) = conn.wait(execute(pgconn))
        assert [described.fname(i) for i in range(described.nfields)] == [b"region", b"n", b"avg(cost)"]
        assert [described.ftype(i) for i in range(described.nfields)] == [25, 20, 701]
        assert [described.param_type(i) for i in range(described.nparams)] == [20, 1082]
        assert charges(served.policy) == before
        pgconn.send_query_prepared(b"q1", [b"30", b"2021-01-01"])
        (result,) = conn.wait(execute(pgconn))
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK and result.ntuples == 5
        assert len(charges(served.policy)) == len(before) + 1


def test_pg8000_dbapi_and_native(served) -> None:
    con = pg8000.dbapi.connect(host="127.0.0.1", port=served.port, user="bob", password=PASSWORDS["bob"],
                               database="visits")
    try:
        cur = con.cursor()
        cur.execute("SELECT region, COUNT(*) FROM visits WHERE age > %s GROUP BY region", (30,))
        assert len(cur.fetchall()) == 5
        assert [d[1] for d in cur.description] == [25, 20]
        with pytest.raises(pg8000.dbapi.DatabaseError) as caught:
            cur.execute("SELECT * FROM visits")
        assert caught.value.args[0]["C"] == "0A000"
        con.rollback()
    finally:
        con.close()
    native = pg8000.native.Connection("bob", host="127.0.0.1", port=served.port, password=PASSWORDS["bob"])
    try:
        before = len(charges(served.policy))
        statement = native.prepare("SELECT COUNT(*) FROM visits WHERE region = :r")  # Parse + Describe only
        assert len(charges(served.policy)) == before
        assert statement.run(r="south")[0][0] >= 0
        assert len(charges(served.policy)) == before + 1
        statement.close()
    finally:
        native.close()


def test_cancel_reaches_a_query_waiting_for_the_engine(served) -> None:
    """A query waiting for its turn at the engine is cancelled before it is charged."""
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        before = len(charges(served.policy))
        served.call(served.server.engine_turn.acquire())  # another query holds the engine
        failure: list[BaseException] = []

        def ask() -> None:
            try:
                conn.execute("SELECT COUNT(*) FROM visits")
            except BaseException as exc:
                failure.append(exc)

        asker = threading.Thread(target=ask)
        asker.start()
        try:
            while not any(c._busy for c in served.server._connections.values()):
                threading.Event().wait(0.01)
            conn.cancel_safe()  # the non-blocking cancel: the blocking one holds the GIL the server needs
            asker.join()
        finally:
            served.loop.call_soon_threadsafe(served.server.engine_turn.release)
        assert failure and getattr(failure[0], "sqlstate", None) == "57014"
        assert len(charges(served.policy)) == before
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (.ci/run installs it)")
def test_psql_runs_a_query(served) -> None:
    env = {**os.environ, "PGPASSWORD": PASSWORDS["alice"], "PGSSLMODE": "disable"}
    done = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(served.port), "-U", "alice", "-d", "visits",
                           "-X", "-A", "-t", "-c", "SELECT sex, COUNT(*) FROM visits GROUP BY sex ORDER BY sex"],
                          env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert [line.split("|")[0] for line in done.stdout.split()] == ["F", "M"]
    assert "NOTICE:  dpsql: this query cost epsilon 1" in done.stderr
    refused = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(served.port), "-U", "alice", "-X",
                              "-v", "VERBOSITY=verbose", "-c", "SELECT * FROM visits"],
                             env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "ERROR:  0A000:" in refused.stderr


def test_a_refreshing_dashboard_pays_once(served) -> None:
    """The same question again, from another connection and spelled differently: the answer already released, at
    no cost, and the NOTICE says so."""
    sql = "SELECT department, COUNT(*), AVG(cost) FROM visits WHERE age > 50 GROUP BY department ORDER BY 1"
    notices: list[str] = []
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        first = conn.execute(sql).fetchall()
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        again = conn.execute(sql.lower().replace(" from", "\n  from")).fetchall()
    assert again == first and len(charges(served.policy)) == before
    assert len(notices) == 1 and "at no cost" in notices[0] and "bob has epsilon" in notices[0]


def test_intervals_on_adds_each_noisy_columns_interval_in_the_answer_and_in_describe(served) -> None:
    sql = "SELECT region, COUNT(*) AS n, AVG(cost) AS c FROM visits WHERE age > %s GROUP BY region ORDER BY region"
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        assert conn.execute("SHOW dpsql.intervals").fetchone()[0] == "off"
        conn.execute("SET dpsql.intervals = on")
        assert conn.execute("SHOW dpsql.intervals").fetchone()[0] == "on"
        cursor = conn.execute(sql, (60,), prepare=True)  # Parse, Describe, Bind, Execute
        names = [c.name for c in cursor.description]
        assert names == ["region", "n", "n_ci_low", "n_ci_high", "c", "c_ci_low", "c_ci_high"]
        rows = cursor.fetchall()
        assert len(rows) == 5
        for _, n, n_low, n_high, c, c_low, c_high in rows:
            assert n_low <= n <= n_high and c_low <= c <= c_high
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SET dpsql.intervals = maybe")
        assert caught.value.sqlstate == "22023"
        conn.execute("RESET dpsql.intervals")
        assert [c.name for c in conn.execute(sql, (61,)).description] == ["region", "n", "c"]


def test_a_quantile_measures_its_interval_only_when_intervals_are_on(served) -> None:
    """With dpsql.intervals off a MEDIAN's whole epsilon goes to its value (explain says there is no interval);
    on, a quarter measures the interval, which the answer then carries."""
    sql = "SELECT MEDIAN(cost) AS m FROM visits"
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {sql}").fetchall())
        assert "no interval (not asked for: the value has the whole budget)" in plan
        conn.execute("SET dpsql.intervals = on")
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {sql}").fetchall())
        assert "no interval" not in plan and "the 95% interval from noisy counts" in plan
        ((m, low, high),) = conn.execute(sql).fetchall()
        assert low <= m <= high


def test_a_public_table_is_read_row_by_row_with_parameters_and_described_without_charge(served) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        cursor = conn.execute("SELECT region, population FROM regions WHERE population > %s ORDER BY region",
                              (900000,), prepare=True)  # Parse, Describe, Bind, Execute
        assert [c.name for c in cursor.description] == ["region", "population"]
        rows = cursor.fetchall()
    assert rows and all(population > 900000 for _, population in rows)
    assert len(charges(served.policy)) == before


def test_set_accuracy_charges_the_smallest_epsilon_that_meets_it(served) -> None:
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.25")
        conn.execute("SET dpsql.accuracy = 40")  # replaces the epsilon
        assert conn.execute("SHOW dpsql.epsilon").fetchone() == ("default",)
        assert conn.execute("SHOW dpsql.accuracy").fetchone() == ("40",)
        conn.execute("SET dpsql.intervals = on")
        row = conn.execute("SELECT region, COUNT(*) AS n FROM visits WHERE age > 2 GROUP BY region").fetchone()
        assert (row[3] - row[2]) / 2 <= 40
        assert 0.2 < charges(served.policy)[-1].epsilon < 0.5  # count of sensitivity 5 at +/-40: about 0.37
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT MEDIAN(cost) FROM visits")
        assert "follows the rows around its value" in caught.value.diag.message_primary
