"""psql's catalog commands answered from the policy's declared schema alone: no data, no charge."""

from __future__ import annotations

import os
import shutil
import subprocess

import psycopg
import pytest

from dpsql.frontends.server.catalog.translate import catalog_query
from tests.server.conftest import PASSWORDS, charges, dsn

needs_psql = pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed (.ci/run installs it)")


def _psql(served, command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PGPASSWORD": PASSWORDS["alice"], "PGSSLMODE": "disable"}
    return subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(served.port), "-U", "alice", "-d", "visits", "-X",
                           "-A", "-t", "-c", command], env=env, capture_output=True, text=True, check=False)


@needs_psql
@pytest.mark.parametrize(("command", "expected"), [
    ("\\dt", "public|visits|table|dpsql"),
    ("\\dn", "public|dpsql"),
    ("\\l", "visits|dpsql|UTF8|C|C||libc|"),  # the database as the client named it
])
def test_psql_catalog_commands_answer_from_the_policy_without_a_charge(served, command, expected) -> None:
    before = charges(served.policy)
    done = _psql(served, command)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout.splitlines()
    assert charges(served.policy) == before


@needs_psql
def test_psql_describes_a_table_with_its_declared_columns(served) -> None:
    before = charges(served.policy)
    done = _psql(served, "\\d visits")
    assert done.returncode == 0, done.stderr
    # Name, type (PostgreSQL's names), collation, nullable (from the policy's nullable = false), default.
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")] for line in done.stdout.splitlines()
                                              if "|" in line)}
    assert rows["region"][0] == "character varying(1000)" and rows["age"][0] == "bigint"
    assert rows["cost"][0] == "double precision" and rows["visit_date"][0] == "date"
    assert rows["age"][2] == "not null" and rows["region"][2] == ""
    assert charges(served.policy) == before


def test_declared_columns_and_types_without_row_counts(served) -> None:
    before = charges(served.policy)
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        (oid, reltuples), = conn.execute("SELECT c.oid, c.reltuples FROM pg_catalog.pg_class c "
                                         "WHERE c.relname OPERATOR(pg_catalog.~) '^(visits)$' "
                                         "COLLATE pg_catalog.default").fetchall()
        # The same query psql's \d sends for the columns.
        columns = conn.execute("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) "
                               f"FROM pg_catalog.pg_attribute a WHERE a.attrelid = '{oid}' AND a.attnum > 0 "
                               "ORDER BY a.attnum").fetchall()
    assert reltuples == -1  # unknown: the catalog never tells how many rows there are
    names = [name for name, _ in columns]
    assert "age" in names and "region" in names
    assert dict(columns)["region"] == "character varying(1000)"  # the policy's max_length: longer values are cut
    assert charges(served.policy) == before


def test_a_catalog_relation_mixed_with_a_private_table_is_refused(served) -> None:
    before = charges(served.policy)
    with psycopg.connect(dsn(served), autocommit=True) as conn, pytest.raises(psycopg.Error):
        conn.execute("SELECT COUNT(*) FROM visits, pg_catalog.pg_class")
    assert charges(served.policy) == before


@pytest.mark.parametrize(("sql", "catalog"), [
    ("SELECT relname FROM pg_catalog.pg_class", True),
    ("SELECT * FROM information_schema.tables", True),
    ("WITH t AS (SELECT oid FROM pg_catalog.pg_class) SELECT * FROM t", True),
    ("SELECT COUNT(*) FROM visits", False),
    ("SELECT * FROM visits JOIN pg_catalog.pg_class ON true", False),
    ("SELECT * FROM main.visits", False),
    ("SELECT 1 + 1", True),  # no relation at all: nothing to read but constants
    ("SELECT (SELECT COUNT(*) FROM visits)", False),
    ("SELECT * FROM pg_catalog.pg_class, regions", False),
    ("SELECT * FROM read_csv('visits.csv')", False),
    ("SELECT * FROM duckdb_tables()", False),
    ("SELECT * FROM memory.pg_catalog.pg_class", False),
])
def test_what_is_a_catalog_query(sql, catalog) -> None:
    assert (catalog_query(sql) is not None) is catalog
