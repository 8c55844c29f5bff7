"""Analyst SQL never reaches anything but the declared tables, and the data never escapes by an error.

Two layers, each tested on its own: the checker refuses the query from its text; and should the checker ever
miss one, DuckDB itself refuses (external access off, configuration locked, every query rolled back).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from benchmarks.support import seeded, write_csv, write_policy
from dpsql.analysis.vetting import ConstantChecker
from dpsql.errors import ExecutionFailed, ProgrammingError, QueryRejected
from dpsql.session import PrivateSession
from dpsql.sql import sandbox

SECRET = "/etc/hostname"

ESCAPES = [
    f"SELECT COUNT(*) FROM read_csv('{SECRET}')",
    f"SELECT COUNT(*) FROM READ_CSV_AUTO('{SECRET}')",
    f"SELECT COUNT(*) FROM \"read_csv\"('{SECRET}')",
    "SELECT COUNT(*) FROM read_parquet('/tmp/x.parquet')",
    "SELECT COUNT(*) FROM glob('/etc/*')",
    f"SELECT COUNT(*) FROM read_text('{SECRET}')",
    f"SELECT COUNT(*) FROM '{SECRET}'",
    "SELECT COUNT(*) FROM 'PUMS_pid.csv'",
    "SELECT COUNT(*) FROM duckdb_tables()",
    "SELECT COUNT(*) FROM information_schema.tables",
    "SELECT COUNT(*) FROM pragma_database_list()",
    "SELECT COUNT(*) FROM pg_catalog.pg_tables",
    "SELECT COUNT(*) FROM __dp_pums",  # the prepared table is not a declared table
    "SELECT COUNT(*) FROM pums WHERE current_setting('threads') = '2'",
    "ATTACH '/tmp/evil.db' AS evil",
    "COPY pums TO '/tmp/out.csv'",
    "EXPORT DATABASE '/tmp/dump'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "SELECT COUNT(*) FROM pums; COPY pums TO '/tmp/out.csv'",
    "SELECT COUNT(*) FROM pums /* ; */; ATTACH '/tmp/x.db'",
    "SELECT COUNT(*) FROM pums --\n; INSTALL httpfs",
    "SELECT COUNT(*) FROM \"pums; DROP TABLE pums\"",
    "SELECT COUNT(*) FROM рums",  # Cyrillic er: a look-alike of pums
    "SELECT COUNT(*) FROM pums WHERE ѕex = 1",  # Cyrillic dze: a look-alike of sex
    "SELECT COUNT(*) FROM pums WHERE sleep_ms(100) IS NULL",
    "SELECT COUNT(*) FROM pums WHERE error('boom') IS NULL",
    "CREATE TABLE leak AS SELECT * FROM pums",
    "DROP TABLE pums",
]


@pytest.mark.parametrize("sql", ESCAPES)
def test_the_checker_refuses_every_escape_at_no_cost(refusing_pums_session, sql: str) -> None:
    with pytest.raises((QueryRejected, ProgrammingError)):
        refusing_pums_session.execute(sql)
    assert refusing_pums_session.spending("tester").queries == 0


def test_mixed_case_names_are_the_same_declared_objects(pums_session) -> None:
    result = pums_session.execute('SELECT SeX, Count(*) FROM "pums" GROUP BY SEX')
    assert [row[0] for row in result.rows] == [0, 1]


ENGINE_REFUSES = [
    f"SELECT * FROM read_csv('{SECRET}')",
    f"SELECT * FROM read_text('{SECRET}')",
    "SELECT * FROM glob('/etc/*')",
    f"SELECT * FROM '{SECRET}'",
    "ATTACH '/tmp/evil.db' AS evil",
    "COPY (SELECT 1) TO '/tmp/out.csv'",
    "EXPORT DATABASE '/tmp/dump'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET enable_external_access",
    "SET threads = 1",
    "CREATE SECRET (TYPE S3)",
]


@pytest.mark.parametrize("sql", ENGINE_REFUSES)
def test_the_engine_refuses_on_its_own_if_the_checker_missed_one(pums_session, sql: str) -> None:
    """The second layer: the raw statement sent straight to the engine, past the checker."""
    with pytest.raises(ExecutionFailed):
        pums_session.engine.run(sql)


def test_nothing_a_query_writes_survives_it(pums_session) -> None:
    pums_session.engine.run("CREATE TABLE leak AS SELECT 1 AS x")
    pums_session.engine.run("DELETE FROM __dp_pums")
    assert pums_session.engine.run("SELECT COUNT(*) FROM __dp_pums") == [(1000,)]
    with pytest.raises(ExecutionFailed):
        pums_session.engine.run("SELECT * FROM leak")


def test_post_processing_runs_where_no_private_row_exists(pums_session) -> None:
    post = pums_session.post._con
    assert post.execute("SELECT COUNT(*) FROM duckdb_tables() WHERE table_name LIKE '%pums%'").fetchone() == (0,)
    with pytest.raises(duckdb.Error):
        post.execute(f"SELECT * FROM read_csv('{SECRET}')")


SANDBOX_REFUSES = [
    f"SELECT * FROM read_csv('{SECRET}')",
    "ATTACH '/tmp/evil.db' AS evil",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "SET autoload_known_extensions = true",
    "SET allow_community_extensions = true",
    "SET threads = 1",
]
# Each of the three DuckDB connections (sql/sandbox.py), as the session set it up.
CONNECTIONS = {
    "engine": lambda session: session.engine._con,
    "post-processing": lambda session: session.post._con,
    "constant checker": lambda session: ConstantChecker()._con,
}


@pytest.mark.parametrize("connection", CONNECTIONS)
@pytest.mark.parametrize("sql", SANDBOX_REFUSES)
def test_every_connection_refuses_files_databases_extensions_and_settings(refusing_pums_session, connection: str,
                                                                          sql: str) -> None:
    """The raw connection itself, not the engine's run (which would turn any error into ExecutionFailed)."""
    with pytest.raises(duckdb.Error):
        CONNECTIONS[connection](refusing_pums_session).execute(sql)


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_every_connection_has_every_safety_option(pums_session, connection: str) -> None:
    con = CONNECTIONS[connection](pums_session)
    settings = {name: con.execute(f"SELECT current_setting('{name}')").fetchone()[0]
                for name in sandbox.SAFETY_OPTIONS}
    assert settings == {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                        "allow_community_extensions": False, "enable_external_access": False,
                        "lock_configuration": True}


def test_the_sandbox_cannot_be_opened_weaker_and_closes_on_failure() -> None:
    with pytest.raises(ValueError, match="enable_external_access"):
        sandbox.connect({"enable_external_access": "true"})
    with pytest.raises(RuntimeError), sandbox.opened() as con:
        raise RuntimeError("loading failed")
    with pytest.raises(duckdb.ConnectionException):
        con.execute("SELECT 1")


@pytest.mark.parametrize("kind", ["csv_glob", "parquet", "duckdb"])
def test_every_source_kind_loads_and_then_is_closed_off(tmp_path: Path, kind: str) -> None:
    rows = [(i, i % 3) for i in range(1, 31)]
    write_csv(tmp_path / "part1.csv", ["pid", "g"], rows[:15])
    write_csv(tmp_path / "part2.csv", ["pid", "g"], rows[15:])
    con = duckdb.connect()
    source, extra = "part*.csv", {}
    if kind == "parquet":
        con.execute(f"COPY (SELECT * FROM read_csv('{tmp_path}/part*.csv')) TO '{tmp_path}/t.parquet'")
        source = "t.parquet"
    elif kind == "duckdb":
        con.execute(f"ATTACH '{tmp_path}/t.duckdb' AS db")
        con.execute(f"CREATE TABLE db.people AS SELECT * FROM read_csv('{tmp_path}/part*.csv')")
        con.execute("DETACH db")
        source, extra = "t.duckdb", {"table": "people"}
    con.close()
    policy = write_policy(tmp_path / "p.toml", {"t": {
        "source": source, **extra, "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "g": {"type": "int", "values": [0, 1, 2]}}}},
        {"epsilon": 1e9, "query_epsilon": 1e6})
    session = PrivateSession(policy, "s", rng=seeded(1), create_ledger=True)
    result = session.execute("SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY g")
    assert [row[1] for row in result.rows] == [10, 10, 10]
    databases = {row[0] for row in session.engine._con.execute("SELECT database_name FROM duckdb_databases()")
                 .fetchall()}
    assert not any(name.startswith("__dp_src") for name in databases)  # the steward's file is detached
    session.close()
