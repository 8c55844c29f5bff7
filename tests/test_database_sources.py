"""Database sources (engines/database.py) against a real PostgreSQL server (tests/conftest.py's `postgres`: the
system's binaries on a free local port, password authentication) and SQLite files.

Each test loads its data into a database of its own, points a policy at it and checks what the steward and the
analyst see: the same answers as from the CSV files, the same checks of the declared types, credentials that never
show, a store that follows the data's version, and a source that fails mid-load.
"""

from __future__ import annotations

import re
import socket
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from benchmarks.postgres import PASSWORD, serve_from_postgres
from benchmarks.support import create_ledger, open_session, write_csv, write_policy
from dpsql.dp.fixedpoint import fixed_point
from dpsql.engines import database
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import PolicyError, ProgrammingError
from dpsql.policy import load_policy
from dpsql.sql import names
from tests.conftest import ROOT, SAMPLE, copy_visits_data

_COUNTER = iter(range(1_000_000))


def _database(server, encoding: str = "UTF8") -> str:
    """A fresh database on the server (the tests of one process share it)."""
    name = f"t{next(_COUNTER)}"
    server.create_database(name, encoding)
    return name


def _policy(folder: Path, uri: str, columns: dict, source: dict | None = None, store: bool = False,
            **table) -> Path:
    spec = {"source": {"uri": uri, "table": "t", **(source or {})}, "privacy_unit": "pid", "max_rows_per_unit": 2,
            "columns": columns, **table}
    path = write_policy(folder / "p.toml", {"t": spec})
    if store:
        path.write_text(path.read_text() + "\n[engine]\nstore = true\n")
    return path


def _units(engine: DuckDBEngine, table: str = "t") -> list[tuple]:
    """The prepared table's rows as loaded (declared columns), in a fixed order."""
    return engine.run(f"SELECT COLUMNS(lambda c: NOT starts_with(c, '__dp_')) FROM {names.prepared_table(table)} "
                      "ORDER BY ALL")


def _opened(policy: Path, query: str) -> tuple[bool, str, list[tuple]]:
    """An engine opened on `policy`: whether it built the store, its data version, and `query`'s rows (`{t}`: the
    prepared table t)."""
    engine = DuckDBEngine(load_policy(policy), bounding_seed=1)
    try:
        return engine.store_built, engine.data_version, engine.run(query.format(t=names.prepared_table("t")))
    finally:
        engine.close()


_LATE_ROW = "SELECT count(*) FROM {t} WHERE pid = 99"


# --- the documentation's sample, served from PostgreSQL ------------------------------------------------------

def _readme_queries() -> list[str]:
    """Every query the README and the documentation show: in quotes (commands, Python), in SQL blocks, and inline
    in backticks."""
    text = "\n".join(page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    found = [m.group(1) or m.group(2) for m in re.finditer(r'"(SELECT\b[^"]+)"|\'(SELECT\b[^\']+)\'', text)]
    found += re.findall(r"```sql\n(.*?)```", text, re.DOTALL)
    found += re.findall(r"`(SELECT\b[^`]+)`", text)
    return list(dict.fromkeys(" ".join(query.split()) for query in found))


def _outcome(policy: Path, query: str) -> tuple:
    session = open_session(policy, 11, bounding_seed=5)
    try:
        parameters = [30] if ("?" in query or "%s" in query) else None
        result = session.execute(query.replace("%s", "?"), parameters)
        return ("answer", [c.name for c in result.columns], result.rows, result.intervals)
    except Exception as exc:  # a refusal: the same one from either source
        return ("refused", type(exc).__name__, str(exc))
    finally:
        session.close()


@pytest.mark.slow  # about a minute: each documented query run twice, from the CSV files and from PostgreSQL
def test_every_readme_query_answers_the_same_from_postgresql_as_from_the_csv_files(pg_password, tmp_path) -> None:
    """The Done-when of issue 33: the sample data loaded into PostgreSQL (cost as NUMERIC(10, 2), read as text and
    cast as the CSV's is), the policy pointed at it, and every documented query gives the same answer, noise, intervals
    (same seeds) or the same refusal, as from the CSV files."""
    csv_folder, pg_folder = tmp_path / "csv", tmp_path / "pg"
    csv_folder.mkdir()
    pg_folder.mkdir()
    copy_visits_data(csv_folder)
    (csv_folder / "visits.toml").write_text((SAMPLE / "visits.toml").read_text())
    from_csv = create_ledger(csv_folder / "visits.toml")
    from_pg = create_ledger(serve_from_postgres(pg_password, f"t{next(_COUNTER)}", from_csv,
                                                pg_folder / "visits.toml", {"visits.cost": "numeric(10, 2)"}))
    assert "postgresql://" in from_pg.read_text() and PASSWORD not in from_pg.read_text()
    queries = _readme_queries()
    answered = 0
    for query in queries:
        expected = _outcome(from_csv, query)
        assert _outcome(from_pg, query) == expected, query
        answered += expected[0] == "answer"
    assert answered >= 10, f"only {answered} of {len(queries)} documented queries were answered"


# --- types from the source ----------------------------------------------------------------------------------------

_TYPES_TABLE = """CREATE TABLE t (pid int NOT NULL, whole numeric, money numeric(12, 2), seen timestamptz,
                                  day date, note text, flag boolean, score real, blob bytea)"""
_TYPES_ROWS = """INSERT INTO t VALUES
    (1, 10, 12.50, '2024-01-02 10:00:00+02', '2024-01-02', 'héllo', true, 1.5, '\\x00'),
    (1, 11, 'NaN', NULL, NULL, NULL, NULL, 'NaN', NULL),
    (2, 12, 99999.99, '2024-06-30 23:30:00-05', '2024-06-30', 'x', false, 'Infinity', NULL),
    (3, NULL, -5, '2024-03-01 00:00:00+00', '2024-03-01', 'y', NULL, -2, NULL)"""
_TYPES_COLUMNS = {"pid": {"type": "int"}, "whole": {"type": "int", "lower": 0, "upper": 20},
                  "money": {"type": "float", "lower": 0, "upper": 1000}, "seen": {"type": "timestamp"},
                  "day": {"type": "date"}, "note": {"type": "text"}, "flag": {"type": "bool"},
                  "score": {"type": "float", "lower": -1, "upper": 1}}


def _typed_table(server, statements: tuple[str, ...] = (_TYPES_TABLE, _TYPES_ROWS)) -> str:
    name = _database(server)
    with server.connect(name) as con:
        for statement in statements:
            con.execute(statement)
    return name


def test_postgresql_types_load_as_declared(pg_password, tmp_path) -> None:
    """NUMERIC (arriving as text) read as int when whole and as float (NaN: NULL, beyond the bounds: clamped at
    query time as any value), TIMESTAMPTZ as its UTC time, whatever the session's zone, NULLs kept."""
    name = _typed_table(pg_password)
    engine_policy = _policy(tmp_path, pg_password.uri(name), _TYPES_COLUMNS)
    engine = DuckDBEngine(load_policy(engine_policy), bounding_seed=1)
    try:
        assert _units(engine) == [  # dates and timestamps fetched as DuckDB's text (sql/lossless.py)
            (1, 10, 12.5, "2024-01-02 08:00:00", "2024-01-02", "héllo", True, 1.5),
            (1, 11, None, None, None, None, None, None),
            (2, 12, 99999.99, "2024-07-01 04:30:00", "2024-06-30", "x", False, float("inf")),
            (3, None, -5.0, "2024-03-01 00:00:00", "2024-03-01", "y", None, -2.0)]
        # Out-of-bounds values are clamped as a file's are: the fixed-point copy of `money` holds 1000, not 99999.99.
        grid = fixed_point(load_policy(engine_policy).tables["t"].columns["money"].interval)
        clamped = engine.run(f"SELECT max({names.quantized_column('money')}) FROM {names.prepared_table('t')}")
        assert clamped == [(round((1000 - grid.center_value) * 2**grid.exponent),)]
    finally:
        engine.close()


@pytest.mark.parametrize(("column", "declared", "row", "problem"), [
    ("whole", {"type": "int"}, 2, "a number that is not an integer"),  # NUMERIC 10.5 read as int
    ("whole", {"type": "int"}, 1, "not int"),  # NUMERIC beyond the 64-bit range
    ("day", {"type": "date"}, 2, "a time of day"),  # a timestamp declared date
])
def test_a_source_value_not_of_its_declared_type_fails_naming_column_and_row_never_the_value(
        pg_password, tmp_path, column, declared, row, problem) -> None:
    secret = {("whole", 2): "10.5", ("whole", 1): "123456789012345678901234"}.get((column, row), "2024-01-02 10:00")
    first = f"(1, {secret}, '2024-01-01')" if row == 1 else "(1, 1, '2024-01-01')"
    second = f"(2, {secret if column == 'whole' else 2}, '{secret if column == 'day' else '2024-01-01'}')"
    name = _typed_table(pg_password, ("CREATE TABLE t (pid int, whole numeric, day timestamp)",
                                      f"INSERT INTO t VALUES {first}, {second}"))
    policy = _policy(tmp_path, pg_password.uri(name), {"pid": {"type": "int"}, column: declared})
    with pytest.raises(PolicyError) as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    message = str(failure.value)
    assert "table 't', key '" in message and column in message and f"row {row}" in message, message
    assert problem in message, message
    assert secret not in message and secret.split(".")[0] not in message.replace(f"row {row}", ""), message


def test_a_column_type_the_declared_type_cannot_read_is_named(pg_password, tmp_path) -> None:
    name = _typed_table(pg_password)
    policy = _policy(tmp_path, pg_password.uri(name), {"pid": {"type": "int"}, "blob": {"type": "text"}})
    with pytest.raises(PolicyError, match=r"table 't', key 'columns.blob': is bytea in the source, which is not read "
                                          r"as text"):
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    # money arrives as an int64 of cents: read as float, 12.50 would have loaded as 1250.
    with pg_password.connect(name) as con:
        con.execute("ALTER TABLE t ADD COLUMN price money DEFAULT 12.50")
    policy = _policy(tmp_path, pg_password.uri(name), {"pid": {"type": "int"}, "price": {"type": "float"}})
    with pytest.raises(PolicyError, match=r"key 'columns.price': is money in the source, which is not read as float"):
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    policy = _policy(tmp_path, pg_password.uri(name), {"pid": {"type": "int"}, "gone": {"type": "text"}})
    with pytest.raises(PolicyError, match=r"key 'columns.gone': the source has no column 'gone' \(it has: blob, "):
        DuckDBEngine(load_policy(policy), bounding_seed=1)


def test_infinite_dates_and_times_load_as_a_csv_file_s_and_a_time_past_the_driver_s_range_fails(
        pg_password, tmp_path) -> None:
    """PostgreSQL's 'infinity' and '-infinity' reach Arrow wrapped round (the driver shifts them from 2000 to 1970
    without checking): they loaded as dates in the year 5,877,612 BC. Now they load as a CSV file's do; a finite
    timestamp after the year 294,246 wraps too, and fails naming the column and the row."""
    name = _typed_table(pg_password, (
        "CREATE TABLE t (pid int, d date, ts timestamp, tz timestamptz)",
        "INSERT INTO t VALUES (1, 'infinity', '-infinity', 'infinity'), (2, '-infinity', 'infinity', '-infinity'), "
        "(3, '2024-01-01', '2024-01-01 10:00', '2024-01-01 10:00+00')"))
    columns = {"pid": {"type": "int"}, "d": {"type": "date"}, "ts": {"type": "timestamp"},
               "tz": {"type": "timestamp"}}
    write_csv(tmp_path / "t.csv", ["pid", "d", "ts", "tz"], [(1, "infinity", "-infinity", "infinity"),
                                                           (2, "-infinity", "infinity", "-infinity"),
                                                           (3, "2024-01-01", "2024-01-01 10:00", "2024-01-01 10:00")])
    from_csv = write_policy(tmp_path / "csv.toml", {"t": {"source": "t.csv", "privacy_unit": "pid",
                                                          "max_rows_per_unit": 1, "columns": columns}})
    engines = [DuckDBEngine(load_policy(path), bounding_seed=1)
               for path in (from_csv, _policy(tmp_path, pg_password.uri(name), columns))]
    try:
        assert _units(engines[1]) == _units(engines[0])
        assert _units(engines[1])[0] == (1, "infinity", "-infinity", "infinity")
    finally:
        for engine in engines:
            engine.close()
    with pg_password.connect(name) as con:
        con.execute("INSERT INTO t VALUES (4, '2024-01-01', '294276-12-31 23:59:59', NULL)")
    with pytest.raises(PolicyError, match=r"key 'source': table t of postgresql://\S+: column 'ts' holds a time "
                                          r"beyond what its driver reads \(after the year 294,246\), the first in "
                                          r"row 4 as read$"):
        DuckDBEngine(load_policy(_policy(tmp_path, pg_password.uri(name), columns)), bounding_seed=1)


def test_text_that_is_not_utf8_fails_naming_column_and_row(pg_password, tmp_path) -> None:
    """A SQL_ASCII database holds any bytes; DuckDB would refuse the whole copy without saying where."""
    name = _database(pg_password, "SQL_ASCII")
    with pg_password.connect(name) as con:
        con.execute("CREATE TABLE t (pid int, note text)")
        con.execute("INSERT INTO t VALUES (1, 'fine'), (2, 'also fine'), (3, E'secret \\xff value')")
    policy = _policy(tmp_path, pg_password.uri(name), {"pid": {"type": "int"}, "note": {"type": "text"}})
    with pytest.raises(PolicyError) as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert re.search(r"table 't', key 'source': table t of postgresql://\S+: column 'note' holds text that is not "
                     r"valid UTF-8, the first in row 3 as read$", str(failure.value)), str(failure.value)
    assert "secret" not in str(failure.value)


def test_nulls_in_a_column_declared_not_nullable_drop_their_rows_as_from_a_file(pg_password, tmp_path) -> None:
    name = _typed_table(pg_password)
    columns = {"pid": {"type": "int"}, "whole": {"type": "int", "nullable": False}}
    engine = DuckDBEngine(load_policy(_policy(tmp_path, pg_password.uri(name), columns)), bounding_seed=1)
    try:
        assert _units(engine) == [(1, 10), (1, 11), (2, 12)]
    finally:
        engine.close()


def test_init_writes_a_policy_skeleton_from_a_database_table(pg_password, tmp_path) -> None:
    """`dpsql init postgresql://... --table t`: the table's columns, each with the type its database type is read
    as (a bytea left out, named in a comment); the skeleton loads as written and reads the table. SQLite too, its
    file named relative to the policy. A URI with a password is refused without being shown."""
    from click.testing import CliRunner

    from dpsql.frontends import cli

    name = _typed_table(pg_password)
    written = tmp_path / "t.toml"
    result = CliRunner().invoke(cli.main, ["init", pg_password.uri(name), "--table", "t", "--unit", "pid", "-o",
                                           str(written)])
    assert result.exit_code == 0, result.output
    parsed = tomllib.loads(written.read_text())["tables"]["t"]
    assert parsed["source"] == {"uri": pg_password.uri(name), "table": "t"} and parsed["privacy_unit"] == "pid"
    assert {column: spec["type"] for column, spec in parsed["columns"].items()} == {
        "pid": "int", "whole": "float", "money": "float", "seen": "timestamp", "day": "date", "note": "text",
        "flag": "bool", "score": "float"}
    assert "# blob: bytea in the database, which dpsql does not read" in written.read_text()
    engine = DuckDBEngine(load_policy(written), bounding_seed=1)
    try:
        assert [row[:2] for row in _units(engine)] == [(1, 10.0), (1, 11.0), (2, 12.0), (3, None)]
    finally:
        engine.close()
    refused = CliRunner().invoke(cli.main, ["init", pg_password.uri(name, password=True), "--table", "t"])
    assert refused.exit_code != 0 and "holds a password" in refused.output and PASSWORD not in refused.output
    _sqlite_write(tmp_path / "s.sqlite", "CREATE TABLE visits (pid INTEGER, cost REAL, day DATE, flag BOOLEAN, "
                                         "note VARCHAR(20), raw BLOB)", "INSERT INTO visits VALUES "
                                         "(1, 2.5, '2024-01-01', 1, 'a', x'00')")
    result = CliRunner().invoke(cli.main, ["init", f"sqlite://{tmp_path / 's.sqlite'}", "--table", "visits",
                                           "--row-privacy", "-o", str(tmp_path / "s.toml")])
    assert result.exit_code == 0, result.output
    parsed = tomllib.loads((tmp_path / "s.toml").read_text())["tables"]["visits"]
    assert parsed["source"] == {"uri": "sqlite:s.sqlite", "table": "visits"}
    assert {column: spec["type"] for column, spec in parsed["columns"].items()} == {
        "pid": "int", "cost": "float", "day": "date", "flag": "bool", "note": "text"}
    engine = DuckDBEngine(load_policy(tmp_path / "s.toml"), bounding_seed=1)
    try:
        assert _units(engine, "visits") == [(1, 2.5, "2024-01-01", True, "a")]
    finally:
        engine.close()


# --- credentials ----------------------------------------------------------------------------------------------------

def test_a_password_in_the_policy_is_refused_without_being_shown(postgres, tmp_path, monkeypatch) -> None:
    for uri in (postgres.uri(password=True), f"{postgres.uri()}?password={PASSWORD}"):
        with pytest.raises(PolicyError) as failure:
            load_policy(_policy(tmp_path, uri, {"pid": {"type": "int"}}))
        assert "holds a password" in str(failure.value) and PASSWORD not in str(failure.value)
    # A password holding '/' not percent-encoded: libpq would read 'Pa55' as the port and quote it in its message.
    # Refused in the policy, and in uri_env, before any connection, without repeating any of it.
    slashed = postgres.uri().replace("steward@", "steward:Pa55/w0rd@")
    with pytest.raises(PolicyError, match="has an '@' past its host") as failure:
        load_policy(_policy(tmp_path, slashed, {"pid": {"type": "int"}}))
    assert "Pa55" not in str(failure.value) and "w0rd" not in str(failure.value)
    monkeypatch.setenv("VISITS_DSN", slashed)
    policy = write_policy(tmp_path / "env.toml", {"t": {"source": {"uri_env": "VISITS_DSN", "table": "t"},
                                                        "privacy_unit": "pid", "max_rows_per_unit": 1,
                                                        "columns": {"pid": {"type": "int"}}}})
    with pytest.raises(PolicyError, match="the URI in VISITS_DSN has an '@' past its host") as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert "Pa55" not in str(failure.value) and "w0rd" not in str(failure.value)


def test_a_wrong_or_missing_password_fails_without_showing_any_secret(postgres, tmp_path, monkeypatch) -> None:
    name = _typed_table(postgres)
    policy = _policy(tmp_path, postgres.uri(name), {"pid": {"type": "int"}})
    monkeypatch.setenv("PGPASSWORD", "not-the-Pa55word")
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(PolicyError, match="table t of postgresql://steward@127.0.0.1:[0-9]+/t[0-9]+: cannot connect: "
                                          "Failed to connect: .*password authentication failed") as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert "not-the-Pa55word" not in str(failure.value) and PASSWORD not in str(failure.value)
    # The whole URI, password included, from the environment: a wrong one is scrubbed from the message.
    monkeypatch.delenv("PGPASSWORD")
    monkeypatch.setenv("VISITS_DSN", postgres.uri(name).replace("steward@", "steward:Wrong-Pa55@"))
    policy = write_policy(tmp_path / "env.toml", {"t": {"source": {"uri_env": "VISITS_DSN", "table": "t"},
                                                        "privacy_unit": "pid", "max_rows_per_unit": 1,
                                                        "columns": {"pid": {"type": "int"}}}})
    with pytest.raises(PolicyError, match=r"source': table t of \$VISITS_DSN: cannot connect to "
                                          r"postgresql://steward:\*\*\*@") as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert "Wrong-Pa55" not in str(failure.value)
    monkeypatch.setenv("VISITS_DSN", postgres.uri(name, password=True))
    engine = DuckDBEngine(load_policy(policy), bounding_seed=1)
    try:
        assert _units(engine) == [(1,), (1,), (2,), (3,)]
    finally:
        engine.close()


@pytest.mark.slow  # about 25 s: every command run as a steward would, each a process
def test_the_password_never_appears_in_any_command_output(pg_password, tmp_path) -> None:
    """The steward's and the analyst's commands, with the password in the environment (PGPASSWORD, and a URI in
    uri_env), on success and on failure: no output holds it."""
    name = _typed_table(pg_password)
    policy = _policy(tmp_path, pg_password.uri(name), _TYPES_COLUMNS, store=True)
    (tmp_path / "broken").mkdir()
    broken = _policy(tmp_path / "broken", pg_password.uri(name).replace("/" + name, "/nosuchdb"),
                     {"pid": {"type": "int"}}, store=True)
    env = {"PATH": str(Path(sys.executable).parent), "PGPASSWORD": PASSWORD, "HOME": str(tmp_path),
           "VISITS_DSN": pg_password.uri(name, password=True)}
    commands = [["budget", "--init", "--policy", str(policy)], ["policy", "check", str(policy)],
                ["prepare", "--policy", str(policy)],
                ["query", "SELECT COUNT(*) FROM t", "--policy", str(policy), "--ci"],
                ["explain", "SELECT AVG(money) FROM t", "--policy", str(policy)],
                ["policy", "check", str(broken)], ["prepare", "--policy", str(broken)]]
    outputs = []
    for command in commands:
        done = subprocess.run([sys.executable, "-m", "dpsql", *command], capture_output=True, text=True, env=env,
                              cwd=tmp_path)
        outputs.append((done.returncode, done.stdout + done.stderr))
    assert [code for code, _ in outputs] == [0, 0, 0, 0, 0, 1, 1], outputs
    assert 'database "nosuchdb" does not exist' in outputs[-1][1]
    for _, text in outputs:
        assert PASSWORD not in text


def _prepare(policy: Path, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """`dpsql prepare` as the steward runs it: its return code and everything it printed."""
    done = subprocess.run([sys.executable, "-m", "dpsql", "prepare", "--policy", str(policy)], capture_output=True,
                          text=True, env={"PATH": str(Path(sys.executable).parent), "HOME": str(cwd), **env}, cwd=cwd)
    return done.returncode, done.stdout + done.stderr


def test_credentials_come_from_pgpass_or_a_service_file(postgres, tmp_path, monkeypatch) -> None:
    """No PGPASSWORD: libpq finds the password in ~/.pgpass (PGPASSFILE) or in a service file (PGSERVICEFILE, the
    policy's URI naming only the service)."""
    name = _typed_table(postgres)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{postgres.port}:*:steward:{PASSWORD}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    engine = DuckDBEngine(load_policy(_policy(tmp_path, postgres.uri(name), {"pid": {"type": "int"}})), bounding_seed=1)
    try:
        assert _units(engine) == [(1,), (1,), (2,), (3,)]
    finally:
        engine.close()
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    services = tmp_path / "services"
    services.write_text(f"[visits]\nhost=127.0.0.1\nport={postgres.port}\ndbname={name}\nuser=steward\n"
                        f"password={PASSWORD}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    engine = DuckDBEngine(load_policy(_policy(tmp_path, "postgresql:///?service=visits", {"pid": {"type": "int"}})),
                          bounding_seed=1)
    try:
        assert _units(engine) == [(1,), (1,), (2,), (3,)]
    finally:
        engine.close()


# Each way a prepare can fail, the secret the steward's environment holds, and what the message must say instead.
_FAILURES = {
    "wrong PGPASSWORD": ({"PGPASSWORD": "Wrong-Pa55word-1"}, "{uri}", "password authentication failed"),
    "wrong password in uri_env": ({"DSN": "{uri_with:Wrong-Pa55word-2}"}, "$DSN",
                                  "cannot connect to postgresql://steward:***@"),
    "wrong password in .pgpass": ({"PGPASSFILE": "{pgpass:Wrong-Pa55word-3}"}, "{uri}",
                                  "password authentication failed"),
    "wrong password in a service file": ({"PGSERVICEFILE": "{services:Wrong-Pa55word-4}"},
                                         "postgresql:///?service=visits", "password authentication failed"),
    "host down": ({"DSN": "{down_with:" + PASSWORD + "}"}, "$DSN", "cannot connect to postgresql://steward:***@"),
    "no such table": ({"PGPASSWORD": PASSWORD}, "{uri}#nosuch", 'relation "nosuch" does not exist'),
    "a version query that fails": ({"PGPASSWORD": PASSWORD}, "{uri}#version",
                                   "the database failed while its version was read (SQLSTATE 42703"),
}


# Each case is a `dpsql prepare` process (about 1 s): the fast loop runs two, the full suite all.
_FAST_FAILURES = ("wrong PGPASSWORD", "no such table")


@pytest.mark.parametrize("failure", [failure if failure in _FAST_FAILURES
                                     else pytest.param(failure, marks=pytest.mark.slow) for failure in _FAILURES])
def test_every_failure_to_read_a_source_names_its_cause_and_never_a_secret(postgres, tmp_path, failure) -> None:
    """Each failing `dpsql prepare`: a clear message naming the table and the cause, no traceback, and neither the
    wrong password the steward gave nor the server's real one anywhere in its output."""
    name = _typed_table(postgres)
    environment, uri, expected = _FAILURES[failure]
    secret = re.search(r"(Wrong-Pa55word-\d|" + re.escape(PASSWORD) + ")", str(environment))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        down = probe.getsockname()[1]
    (tmp_path / "pgpass").write_text(f"127.0.0.1:{postgres.port}:*:steward:Wrong-Pa55word-3\n")
    (tmp_path / "pgpass").chmod(0o600)
    (tmp_path / "services").write_text(f"[visits]\nhost=127.0.0.1\nport={postgres.port}\ndbname={name}\n"
                                       "user=steward\npassword=Wrong-Pa55word-4\n")
    values = {"{uri_with:Wrong-Pa55word-2}": postgres.uri(name).replace("steward@", "steward:Wrong-Pa55word-2@"),
              "{pgpass:Wrong-Pa55word-3}": str(tmp_path / "pgpass"),
              "{services:Wrong-Pa55word-4}": str(tmp_path / "services"),
              "{down_with:" + PASSWORD + "}": postgres.uri(name, password=True).replace(f":{postgres.port}/",
                                                                                     f":{down}/")}
    env = {key: values.get(value, value) for key, value in environment.items()}
    source: dict = {"table": "t"}
    base = uri.split("#")[0].replace("{uri}", postgres.uri(name))
    if uri.endswith("#nosuch"):
        source["table"] = "nosuch"
    if uri.endswith("#version"):
        source["version"] = "SELECT max(no_such_column) FROM t"
    source.update({"uri_env": base[1:]} if base.startswith("$") else {"uri": base})
    policy = write_policy(tmp_path / "p.toml", {"t": {"source": source, "privacy_unit": "pid", "max_rows_per_unit": 2,
                                                      "columns": {"pid": {"type": "int"}}}})
    policy.write_text(policy.read_text() + "\n[engine]\nstore = true\n")
    code, output = _prepare(policy, env, tmp_path)
    print(output)  # the report's examples: `pytest -s -k every_failure`
    assert code == 1 and expected in output and "key 'source'" in output, output
    assert "Traceback" not in output and secret is not None
    assert secret.group(1) not in output and PASSWORD not in output, output


# --- freshness --------------------------------------------------------------------------------------------------------

def _visits_table(server, rows: int = 50) -> str:
    name = _database(server)
    with server.connect(name) as con:
        con.execute("CREATE TABLE t (id bigserial, pid int, v int, updated_at timestamptz DEFAULT now())")
        con.execute(f"INSERT INTO t (pid, v) SELECT g % 17, g % 10 FROM generate_series(1, {rows}) g")
    return name


_VISITS = {"id": {"type": "int"}, "pid": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 9}}


@pytest.mark.parametrize("version", [None, "SELECT max(updated_at), count(*) FROM t"])
def test_a_store_is_rebuilt_when_the_table_changes_and_cached_answers_are_not_returned(
        pg_password, tmp_path, version) -> None:
    """By default the version is the rows' count and checksum; a steward may declare a version query. Either way
    the store built for the old rows is not used for the new ones, nor the answer released about them."""
    name = _visits_table(pg_password)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, {"version": version} if version else None, store=True)
    create_ledger(policy)
    first = DuckDBEngine(load_policy(policy), bounding_seed=1)
    again = DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert first.store_built and not again.store_built and first.data_version == again.data_version
    first.close()
    again.close()
    with pg_password.connect(name) as con:
        con.execute("UPDATE t SET v = 9, updated_at = now() WHERE id = 3")  # one value: the row count is the same
    built, version, changed = _opened(policy, "SELECT v FROM {t} WHERE id = 3")
    assert built and version != first.data_version and changed == [(9,)]


@pytest.mark.slow  # about 2 s: a PostgreSQL table appended to and a store refreshed twice
def test_an_append_only_table_is_refreshed_from_the_rows_past_those_the_store_holds(pg_password, tmp_path,
                                                                                    monkeypatch) -> None:
    """With `append_key`, a store's refresh reads only the rows past the largest key it holds, once the rows up to
    it show the count and checksum the store holds; a row updated, deleted, or appended with a smaller key shows
    there, and every row is read again. Either way the store holds exactly the table's rows."""
    name = _visits_table(pg_password, rows=300)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, {"append_key": "id"}, store=True)
    (tmp_path / "memory").mkdir()
    in_memory = _policy(tmp_path / "memory", pg_password.uri(name), _VISITS)
    read_rows = database.DatabaseTable.rows
    reads: list[str | None] = []
    monkeypatch.setattr(database.DatabaseTable, "rows",
                        lambda self, columns, after=None: (reads.append(after), read_rows(self, columns, after))[1])

    def refreshed(change: str | None) -> tuple[bool, str | None]:
        """After `change`: whether the store was built, from which key it read, and that it holds every row."""
        if change is not None:
            with pg_password.connect(name) as con:
                con.execute(change)
        reads.clear()
        every = DuckDBEngine(load_policy(in_memory), bounding_seed=1)
        engine = DuckDBEngine(load_policy(policy), bounding_seed=1)
        try:
            assert _units(engine) == _units(every)
            return engine.store_built, reads[-1] if engine.store_built else None
        finally:
            engine.close()
            every.close()

    assert refreshed(None) == (True, None)  # no store yet: every row
    assert refreshed(None) == (False, None)  # unchanged: the store as it is
    assert refreshed("INSERT INTO t (pid, v) SELECT g % 17, 1 FROM generate_series(1, 40) g") == (True, "300")
    assert refreshed("UPDATE t SET v = 9 WHERE id = 5") == (True, None)  # an old row changed: every row again
    assert refreshed("INSERT INTO t (pid, v) VALUES (3, 2)") == (True, "340")
    assert refreshed("DELETE FROM t WHERE id = 7") == (True, None)
    assert refreshed("INSERT INTO t (id, pid, v) VALUES (8, 3, 2)") == (True, None)  # a key below the largest
    assert refreshed(None) == (False, None)
    session = open_session(policy, 1, bounding_seed=1)  # the rows kept in the store are no table of the analyst's
    try:
        for kept in (names.staged_source("t"), names.APPENDED):
            with pytest.raises(ProgrammingError, match=f"unknown table '{kept}'"):
                session.execute(f"SELECT COUNT(*) FROM {kept}")
    finally:
        session.close()


@pytest.mark.parametrize(("source", "columns", "problem"), [
    ({"append_key": "nope"}, {}, "key 'source.append_key': must name a column declared as int, date, timestamp"),
    ({"append_key": "note"}, {"note": {"type": "text"}}, "must name a column declared as int, date, timestamp"),
    ({"append_key": "pid", "table": None, "query": "SELECT * FROM t"}, {}, "applies to a table source"),
    ({"append_key": "pid", "uri": "sqlite:t.sqlite"}, {}, "needs a PostgreSQL source"),
])
def test_an_append_key_is_a_declared_ordered_column_of_a_postgresql_table(tmp_path, source, columns, problem) -> None:
    (tmp_path / "t.sqlite").touch()
    spec = {"source": {key: value for key, value in {"uri": "postgresql://h/db", "table": "t", **source}.items()
                       if value is not None},
            "privacy_unit": "pid", "max_rows_per_unit": 1, "columns": {"pid": {"type": "int"}, **columns}}
    with pytest.raises(PolicyError, match=re.escape(problem)):
        load_policy(write_policy(tmp_path / "p.toml", {"t": spec}))


def test_a_column_dropped_from_a_table_its_store_was_built_from_is_named(pg_password, tmp_path) -> None:
    """The version is asked of the declared columns; the append key's column lost by the table fails the store's
    check as the build does, naming it (it was reported as a connection lost while the version was read)."""
    name = _visits_table(pg_password)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, {"append_key": "id"}, store=True)
    assert _opened(policy, "SELECT count(*) FROM {t}")[0]
    with pg_password.connect(name) as con:
        con.execute("ALTER TABLE t DROP COLUMN id")
    with pytest.raises(PolicyError, match=r"table 't', key 'columns.id': the source has no column 'id'"):
        DuckDBEngine(load_policy(policy), bounding_seed=1)


def test_the_version_and_the_rows_come_from_one_snapshot(pg_password, tmp_path, monkeypatch) -> None:
    """A row committed between the build's version read and its rows read is not in the rows: the store's label
    (and its engine's data version, which answers are kept under) is the version of the very rows it holds
    (REPEATABLE READ). Without the snapshot the rows held the new row under the old version."""
    name = _visits_table(pg_password)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, store=True)
    read_version = database.DatabaseTable.version
    calls = []

    def version_then_insert(self, *arguments):
        found = read_version(self, *arguments)
        calls.append(found)
        if len(calls) == 1:  # the build's own read (no store yet: nothing to compare a version with before)
            with pg_password.connect(name) as con:
                con.execute("INSERT INTO t (pid, v) VALUES (99, 1)")
        return found

    monkeypatch.setattr(database.DatabaseTable, "version", version_then_insert)
    built, version, late = _opened(policy, _LATE_ROW)
    assert built and len(calls) == 1 and late == [(0,)]
    monkeypatch.setattr(database.DatabaseTable, "version", read_version)
    rebuilt, later, late = _opened(policy, _LATE_ROW)
    assert rebuilt and later != version and late == [(1,)]


def test_a_source_that_goes_away_mid_load_fails_and_leaves_no_store(pg_password, tmp_path, monkeypatch) -> None:
    name = _visits_table(pg_password, rows=200_000)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, store=True)
    monkeypatch.setattr(database, "BATCH_BYTES", 64 << 10)  # many batches: the connection dies between two
    batches = database.RowStream._batches

    def dying(self):
        for number, batch in enumerate(batches(self)):
            if number == 1:
                with pg_password.connect(name) as con:
                    con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND "
                                "pid <> pg_backend_pid()", [name])
            yield batch

    monkeypatch.setattr(database.RowStream, "_batches", dying)
    with pytest.raises(PolicyError, match=r"table 't', key 'source': table t of postgresql://\S+: the database "
                                          r"failed while the rows were read") as failure:
        DuckDBEngine(load_policy(policy), bounding_seed=1)
    assert PASSWORD not in str(failure.value)
    assert sorted(p.name for p in tmp_path.iterdir() if ".store" in p.name) == []


def test_an_answer_released_about_older_rows_is_never_returned_for_newer_rows(pg_password, tmp_path) -> None:
    """The server's kept answers (store/answers.py) and the measurements answers are derived from (store/
    measurements.py) are keyed on the data's version: asked again on the same rows the answer is free; once the
    table changed, the same question is a new one, answered from the new rows (nothing derived) and charged."""
    from dpsql.dp.noise import InsecureSeededRandomForTests
    from dpsql.session import PrivateSession
    from dpsql.store.answers import AnswerStore

    name = _visits_table(pg_password)
    policy = create_ledger(_policy(tmp_path, pg_password.uri(name), _VISITS, store=True))

    def ask(seed: int):
        loaded = load_policy(policy)
        session = PrivateSession(loaded, "alice", rng=InsecureSeededRandomForTests(seed),
                                 answers=AnswerStore(loaded.answers), reuse=True)
        try:
            return session.execute("SELECT COUNT(*) FROM t"), session.engine.store_built
        finally:
            session.close()

    first, built = ask(1)
    again, rebuilt = ask(2)
    assert built and not rebuilt and again.cached_at is not None and again.rows == first.rows
    with pg_password.connect(name) as con:
        con.execute("INSERT INTO t (pid, v) SELECT 1000 + g, 1 FROM generate_series(1, 5000) g")
    fresh, built = ask(3)
    assert built and fresh.cached_at is None and fresh.cost.epsilon > 0 and not fresh.derived_from
    # 50 rows before, 5,050 now: the noise (its 95% interval) is far smaller than the 5,000 rows added.
    assert fresh.rows[0][0] - first.rows[0][0] > 5000 - 2 * (fresh.intervals[0][0][1] - fresh.rows[0][0])


# --- SQLite ------------------------------------------------------------------------------------------------------

def test_a_sqlite_table_loads_as_its_csv_twin_and_its_file_versions_it(tmp_path) -> None:
    rows = [(pid, pid % 5, f"n{pid % 3}") for pid in range(1, 40)]
    columns = {"pid": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 4}, "note": {"type": "text"}}
    write_csv(tmp_path / "t.csv", ["pid", "v", "note"], rows)
    from_csv = write_policy(tmp_path / "csv.toml", {"t": {"source": "t.csv", "privacy_unit": "pid",
                                                          "max_rows_per_unit": 1, "columns": columns}})
    with sqlite3.connect(tmp_path / "t.sqlite") as con:
        con.execute("CREATE TABLE t (pid INTEGER, v INTEGER, note TEXT)")
        con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    from_sqlite = _policy(tmp_path, "sqlite:t.sqlite", columns, max_rows_per_unit=1)
    csv_engine = DuckDBEngine(load_policy(from_csv), bounding_seed=2)
    sqlite_engine = DuckDBEngine(load_policy(from_sqlite), bounding_seed=2)
    try:
        assert _units(sqlite_engine) == _units(csv_engine)
        assert "sqlite://" + str(tmp_path / "t.sqlite") == load_policy(from_sqlite).tables["t"].source.pattern
    finally:
        csv_engine.close()
        sqlite_engine.close()
    with sqlite3.connect(tmp_path / "t.sqlite") as con:
        con.execute("UPDATE t SET v = 4 WHERE pid = 1")
    changed = DuckDBEngine(load_policy(from_sqlite), bounding_seed=2)
    try:
        assert changed.data_version != sqlite_engine.data_version
    finally:
        changed.close()


def _sqlite_write(path: Path, *statements: str) -> None:
    """Statements run on a SQLite file by another process, as a steward's application would: in this one Python's
    sqlite3 and the ADBC driver's own SQLite would share the process's file locks, and a close by one drops the
    other's (SQLite's documented hazard of two copies in one process)."""
    script = "import sqlite3, sys\ncon = sqlite3.connect(sys.argv[1])\nfor s in sys.argv[2:]:\n    con.execute(s)\n" \
             "con.commit()\ncon.close()\n"
    subprocess.run([sys.executable, "-c", script, str(path), *statements], check=True)


def test_a_sqlite_file_changed_as_it_is_read_is_read_again_next_time(tmp_path, monkeypatch) -> None:
    """A SQLite source is versioned by its file's fingerprint, taken before its snapshot begins: a write that lands
    after the snapshot began (in WAL mode readers do not block it) gives a new version next time, and the store
    built from the older rows is not used for it. Taken after, the older rows were labelled with the newer version."""
    path = tmp_path / "t.sqlite"
    _sqlite_write(path, "PRAGMA journal_mode = WAL", "CREATE TABLE t (pid INTEGER, v INTEGER)",
                  "INSERT INTO t SELECT value, value % 3 FROM generate_series(1, 29)"
                  if sqlite3.sqlite_version_info >= (3, 46) else
                  "INSERT INTO t WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < 29) "
                  "SELECT x, x % 3 FROM g")
    policy = _policy(tmp_path, "sqlite:t.sqlite", {"pid": {"type": "int"}, "v": {"type": "int", "lower": 0,
                                                                                 "upper": 2}}, store=True)
    read_columns = database.DatabaseTable.columns
    calls = []

    def columns_then_write(self):
        found = read_columns(self)
        calls.append(1)
        if len(calls) == 1:  # the build's read (no store yet): its snapshot has begun
            _sqlite_write(path, "INSERT INTO t VALUES (99, 1)")
        return found

    monkeypatch.setattr(database.DatabaseTable, "columns", columns_then_write)
    # The steward's application keeps its connection open, as a live one does: the driver's close is then not the
    # last one, which would checkpoint the WAL into the file (and so change the fingerprint anyway).
    application = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys\ncon = sqlite3.connect(sys.argv[1])\n"
                                    "con.execute('SELECT count(*) FROM t').fetchall()\nprint('open', flush=True)\n"
                                    "sys.stdin.read()\n", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
    try:
        assert application.stdout.readline() == "open\n"
        built, version, late = _opened(policy, _LATE_ROW)
        assert built and late == [(0,)]  # the snapshot: the row written after it began is not in the rows
        monkeypatch.setattr(database.DatabaseTable, "columns", read_columns)
        rebuilt, later, late = _opened(policy, _LATE_ROW)
        assert rebuilt and later != version and late == [(1,)]
    finally:
        application.communicate("")



def test_sqlite_values_of_any_type_load_as_declared_as_a_csv_file_s_would(tmp_path) -> None:
    """SQLite's values carry their own types, and its ADBC driver types a column from its first 1,024 rows: a
    column of NULLs, then reals, failed the read, and 0.1 + 0.2 kept only 15 digits if cast to text by SQLite. Every
    value travels as text (a real in its exact form) and DuckDB checks and casts it as it does a CSV file's."""
    path = tmp_path / "t.sqlite"
    rows = 1500
    _sqlite_write(path, "CREATE TABLE t (pid INTEGER, x, flag BOOLEAN, day DATE, whole INTEGER)",
                  f"INSERT INTO t WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {rows}) "
                  "SELECT n, NULL, n % 2, '2024-01-02', n FROM g",
                  "INSERT INTO t VALUES (2000, 0.1 + 0.2, 1, '2024-02-03', 3.0)")
    columns = {"pid": {"type": "int"}, "x": {"type": "float", "lower": 0, "upper": 1}, "flag": {"type": "bool"},
               "day": {"type": "date"}, "whole": {"type": "int"}}
    engine = DuckDBEngine(load_policy(_policy(tmp_path, "sqlite:t.sqlite", columns)), bounding_seed=1)
    try:
        loaded = _units(engine)
        assert len(loaded) == rows + 1 and loaded[0] == (1, None, True, "2024-01-02", 1)
        assert loaded[-1] == (2000, 0.1 + 0.2, True, "2024-02-03", 3)
    finally:
        engine.close()
    _sqlite_write(path, "INSERT INTO t VALUES (2001, 0.5, 0, '2024-02-03', 'not a secret number')")
    with pytest.raises(PolicyError) as failure:
        DuckDBEngine(load_policy(_policy(tmp_path, "sqlite:t.sqlite", columns)), bounding_seed=1)
    assert "column 'whole' has values that are not int" in str(failure.value), failure.value
    assert f"the first in row {rows + 2} as read" in str(failure.value), failure.value
    assert "secret" not in str(failure.value)

@pytest.mark.slow  # about 10 s: a server of its own, and four processes timed
def test_the_load_benchmark_runs_and_writes_its_table(postgres, tmp_path, monkeypatch) -> None:
    """benchmarks/db_load.py at a small size: every way of reading the table runs, and its ratios are to COPY's."""
    from benchmarks.db_load import run, table

    monkeypatch.setenv("PGPASSWORD", "")  # the benchmark sets it for its own server: restored after this test
    results = run(2_000, 1, tmp_path)
    assert len(results) == 4 and results[0]["what"] == "psycopg COPY to a CSV file"
    assert results[0]["x_copy"] == 1.0 and all(r["seconds"] > 0 and r["rss_mib"] > 0 for r in results)
    assert "| dpsql prepare (read, check, rank, store) |" in table(results, 2_000, 1)


# --- a million rows ---------------------------------------------------------------------------------------------------

@pytest.mark.slow  # about 10 s: a million rows into PostgreSQL, then through ADBC into the store
def test_a_million_rows_are_prepared_from_postgresql(pg_password, tmp_path) -> None:
    name = _visits_table(pg_password, rows=1_000_000)
    policy = _policy(tmp_path, pg_password.uri(name), _VISITS, store=True)
    create_ledger(policy)
    session = open_session(policy, 3, bounding_seed=4)
    try:
        assert session.engine.store_built
        assert session.engine.run(f"SELECT count(*), count(DISTINCT pid) FROM {names.prepared_table('t')}") == \
            [(1_000_000, 17)]
        result = session.execute("SELECT COUNT(*) FROM t")
        assert result.rows[0][0] == pytest.approx(34, abs=result.intervals[0][0][1] - result.rows[0][0])
    finally:
        session.close()
