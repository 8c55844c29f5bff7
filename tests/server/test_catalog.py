"""psql's catalog commands answered from the policy's declared schema alone: no data, no charge."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess

import psycopg
import pytest

from dpsql.frontends.server.catalog import Catalog, ConnectionFacts, CursorFacts
from dpsql.frontends.server.catalog.database import CatalogDatabase, CatalogQueryError
from dpsql.frontends.server.catalog.translate import catalog_query
from dpsql.policy import load_policy
from tests.server.conftest import PASSWORDS, charges, dsn, sample_policy

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


# ---- the catalog database on its own ------------------------------------------------------------------------------

FACTS = ConnectionFacts("clinic", "alice", 4242, datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
                        (("TimeZone", "UTC", ""), ("search_path", '"$user", public', "")))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Catalog:
    made = Catalog(load_policy(sample_policy(tmp_path_factory.mktemp("catalog"))), "PostgreSQL 16.0 (dpsql)")
    yield made
    made.close()


def _ask(catalog: Catalog, sql: str, parameters: list | None = None, facts: ConnectionFacts = FACTS) -> list:
    statement = catalog.statement(sql)
    assert statement is not None, f"not a catalog query: {sql}"
    return catalog.run(statement, facts, parameters or [])[1]


def test_the_catalog_database_holds_public_metadata_and_nothing_else(catalog) -> None:
    database = catalog.database()
    relations = database._con.execute("SELECT schema_name, table_name FROM duckdb_tables() "
                                      "WHERE NOT temporary").fetchall()
    # The generated catalog only: no declared table (not even empty), none of dpsql's internal relations.
    assert {schema for schema, _ in relations} == {"pg_rows"}
    assert not {"visits", "patients", "departments", "regions"} & {name for _, name in relations}
    assert _ask(catalog, "SELECT count(*) FROM pg_catalog.pg_class WHERE relname LIKE '\\_\\_%' ESCAPE '\\'") == [(0,)]


def test_translation_reads_postgres_spellings(catalog) -> None:
    (oid,), = _ask(catalog, "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) "
                            "'^(visits)$' COLLATE pg_catalog.default AND pg_catalog.pg_table_is_visible(c.oid)")
    assert _ask(catalog, "SELECT 'public.visits'::regclass::oid, 'visits'::regclass") == [(oid, oid)]
    assert _ask(catalog, f"SELECT {oid}::regclass, attrelid::regclass::text FROM pg_attribute WHERE attnum = 1 "
                         f"AND attrelid = {oid}") == [("visits", "visits")]
    assert _ask(catalog, "SELECT atttypid::regtype, format_type(atttypid, atttypmod) FROM pg_attribute "
                         "WHERE attrelid = 'visits'::regclass AND attname = 'region'") == [
        ("character varying", "character varying(1000)")]
    # Reserved words as aliases and names, as Metabase writes them; an untyped array parameter for = ANY($1).
    assert _ask(catalog, "SELECT t.tablename AS table, true AS select FROM pg_tables t WHERE t.tablename = 'visits'"
                ) == [("visits", True)]
    assert _ask(catalog, "SELECT relname FROM pg_class WHERE relkind = ANY($1) AND relnamespace = 2200 "
                         "ORDER BY 1", [["r"]]) == [("departments",), ("patients",), ("regions",), ("visits",)]
    assert _ask(catalog, "SELECT typreceive FROM pg_type WHERE typname = 'int8' AND typreceive != 0") == [
        ("int8recv",)]


def test_each_connection_sees_itself(catalog) -> None:
    other = ConnectionFacts("visits", "bob", 7, FACTS.started,
                            cursors=(CursorFacts("c1", "SELECT 1", True, False, False, FACTS.started),))
    query = ("SELECT current_database(), current_user, pg_backend_pid(), current_schemas(false), "
             "(SELECT count(*) FROM pg_cursors), (SELECT min(table_catalog) FROM information_schema.tables)")
    assert _ask(catalog, query) == [("clinic", "alice", 4242, ["public"], 0, "clinic")]
    assert _ask(catalog, query, facts=other) == [("visits", "bob", 7, ["public"], 1, "visits")]
    assert _ask(catalog, "SELECT datname FROM pg_database") == [("clinic",)]
    assert _ask(catalog, "SELECT current_setting('TimeZone')") == [("UTC",)]


def test_a_runaway_catalog_query_is_stopped(catalog) -> None:
    database = CatalogDatabase(catalog.policy, "PostgreSQL 16.0 (dpsql)", time_limit=0.2)
    try:
        statement = catalog.statement("SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute c, "
                                      "pg_attribute d WHERE a.attname || b.attname || c.attname <> d.attname")
        with pytest.raises(CatalogQueryError, match="ran longer than 0.2 s"):
            database.run(statement.translated.sql, FACTS, [])
        assert database.run(catalog.statement("SELECT 1").translated.sql, FACTS, [])[1] == [(1,)]
    finally:
        database.close()


@needs_psql
def test_psql_shows_the_policys_descriptions(served) -> None:
    done = _psql(served, "\\d+ visits")
    assert done.returncode == 0, done.stderr
    described = {cells[0]: cells[-1] for cells in ([c.strip() for c in line.split("|")]
                                                   for line in done.stdout.splitlines() if "|" in line)}
    assert described["patient_id"] == "the privacy unit" and described["age"] == "bounds [0, 100]"
    assert described["sex"] == "values: F, M"
    tables = _psql(served, "\\dt+")
    assert tables.returncode == 0, tables.stderr
    assert any(line.startswith("public|visits|table|dpsql|permanent|heap||private table: privacy unit patient_id")
               for line in tables.stdout.splitlines())
