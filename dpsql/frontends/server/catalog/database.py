"""The catalog database: a sandboxed, in-memory DuckDB holding PostgreSQL's catalog for the policy, and nothing else.

Built once per server from the policy (tables.py): the catalog's rows in one schema, and the two schemas clients
name as views over them (pg_catalog and information_schema, under DuckDB names of their own: DuckDB keeps its own
pg_catalog, which never answers here since every relation a query names is rewritten to ours). It holds no private
row, no public table's row and none of dpsql's internal relations: a catalog query can show nothing else, whatever
it is. It is opened through the one sandbox factory (sql/sandbox.py: no files, no network, no extensions, locked
configuration), with a memory limit and a time limit of its own (a catalog query that runs too long is
interrupted and fails).

Catalog queries of different connections run at the same time, each on a DuckDB cursor of its own with its own
time limit (engines/cursors.py): one that runs to its limit holds no other. Each query sees its connection: the
database name it connected with, its login, its settings and cursors are set as the cursor's DuckDB variables and
temporary tables before the query runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import duckdb
from sqlglot import exp

from dpsql.engines.cursors import CursorPool
from dpsql.engines.watchdog import Watchdog
from dpsql.errors import ProgrammingError, first_line
from dpsql.frontends.server.catalog import functions
from dpsql.frontends.server.catalog.functions import DUCKDB_SCHEMA, ROWS
from dpsql.frontends.server.catalog.relations import RELATIONS, Relation
from dpsql.frontends.server.catalog.tables import (
    HERE,
    USER_OID,
    ConnectionFacts,
    catalog_rows,
    column_definitions,
    connection_rows,
    type_names,
)
from dpsql.policy import Policy
from dpsql.sql.sandbox import opened

TIME_LIMIT = 5.0  # seconds: a catalog query reads a few thousand rows at most; longer is a runaway join
_STARTUP = {"memory_limit": "256MB", "threads": "1"}
_BATCH = 200  # rows per INSERT while the catalog is built


class CatalogQueryError(ProgrammingError):
    sqlstate = "0A000"


class CatalogDatabase:
    def __init__(self, policy: Policy, version: str, time_limit: float = TIME_LIMIT) -> None:
        with opened(_STARTUP) as con:
            for schema in (ROWS, *DUCKDB_SCHEMA.values()):
                con.execute(f"CREATE SCHEMA {schema}")
            rows = catalog_rows(policy)
            # Per connection: temporary, so the views below read the asking cursor's own rows.
            per_connection = [f"CREATE TEMP TABLE {relation.name} ({column_definitions(relation.columns)})"
                              for relation in RELATIONS if relation.per_connection]
            for statement in per_connection:
                con.execute(statement)
            for relation in RELATIONS:
                if not relation.per_connection:
                    con.execute(f"CREATE TABLE {ROWS}.{relation.name} ({column_definitions(relation.columns)})")
                    _insert(con, f"{ROWS}.{relation.name}", rows[relation.name])
            con.execute(f"CREATE TABLE {ROWS}.type_names (oid BIGINT, typname VARCHAR, shown VARCHAR)")
            _insert(con, f"{ROWS}.type_names", type_names(policy))
            for relation in RELATIONS:
                con.execute(f"CREATE VIEW {DUCKDB_SCHEMA[relation.schema]}.{relation.name} AS {_view(relation)}")
            for statement in (*functions.HELPERS, *functions.macros(version)):
                con.execute(statement)
        self._con = con
        self._time_limit = time_limit
        self._cursors = CursorPool(con, time_limit, per_connection)
        self._seen: dict[int, ConnectionFacts] = {}  # id of a cursor -> the connection it shows

    def columns(self, sql: str, facts: ConnectionFacts, parameters: int) -> list[tuple[str, str]]:
        """The output columns (name, DuckDB type) of a translated query, from binding it (its parameters NULL):
        nothing runs."""
        with self._seeing(facts) as (cursor, _):
            try:
                relation = cursor.sql(sql, params=[None] * parameters or None)
                return [(name, str(kind)) for name, kind in zip(relation.columns, relation.types, strict=True)]
            except duckdb.Error as exc:
                raise CatalogQueryError(f"dpsql cannot answer this catalog query: {first_line(exc)}") from None

    def run(self, sql: str, facts: ConnectionFacts, parameters: list[Any]) -> tuple[list[tuple[str, str]],
                                                                                    list[tuple[Any, ...]]]:
        """The columns and rows of a translated query, under the time limit."""
        with self._seeing(facts) as (cursor, watchdog):
            try:
                with watchdog.running():
                    result = cursor.execute(sql, parameters or None)
                    rows = result.fetchall()
                columns = [(d[0], str(d[1])) for d in result.description or ()]
                return columns, rows
            except duckdb.InterruptException:
                raise CatalogQueryError(f"the catalog query ran longer than {self._time_limit:g} s (or was "
                                        "cancelled) and was stopped") from None
            except duckdb.Error as exc:
                raise CatalogQueryError(f"dpsql cannot answer this catalog query: {first_line(exc)}") from None

    def interrupt(self, owner: int) -> None:
        """Stop the catalog query the thread `owner` runs (a client's cancel)."""
        self._cursors.interrupt(owner)

    @contextlib.contextmanager
    def _seeing(self, facts: ConnectionFacts) -> Iterator[tuple[duckdb.DuckDBPyConnection, Watchdog]]:
        """A cursor that shows `facts`' connection."""
        with self._cursors.taken() as (cursor, watchdog):
            if self._seen.get(id(cursor)) != facts:
                self._seen.pop(id(cursor), None)  # should this fail half-way, the next query sets everything again
                values = {functions.DATABASE: facts.database, functions.USER: facts.user,
                          functions.USER_OID: USER_OID, functions.PID: facts.pid, functions.STARTED: facts.started,
                          functions.SEARCH_PATH: list(facts.search_path)}
                for name, value in values.items():
                    cursor.execute(f"SET VARIABLE {name} = {_literal(value)}")
                for name, rows in connection_rows(facts).items():
                    cursor.execute(f"DELETE FROM temp.main.{name}")
                    _insert(cursor, f"temp.main.{name}", rows)
                self._seen[id(cursor)] = facts
            yield cursor, watchdog

    def close(self) -> None:
        self._cursors.close()
        with contextlib.suppress(duckdb.Error):
            self._con.close()


def _view(relation: Relation) -> str:
    source = f"temp.main.{relation.name}" if relation.per_connection else f"{ROWS}.{relation.name}"
    named = [c for c in relation.database_columns if not relation.per_connection]
    if not named:
        return f"SELECT * FROM {source}"
    here = exp.Literal.string(HERE).sql("duckdb")
    replaced = ", ".join(f"CASE WHEN {c} = {here} THEN getvariable('{functions.DATABASE}') ELSE {c} END AS {c}"
                         for c in named)
    return f"SELECT * REPLACE ({replaced}) FROM {source}"


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple[Any, ...]]) -> None:
    for start in range(0, len(rows), _BATCH):
        batch = rows[start:start + _BATCH]
        width = len(batch[0])
        values = ", ".join("(" + ", ".join("?" * width) + ")" for _ in batch)
        con.execute(f"INSERT INTO {table} VALUES {values}", [value for row in batch for value in row])


def _literal(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]::VARCHAR[]"
    if isinstance(value, int):
        return str(value)
    if hasattr(value, "isoformat"):
        return f"TIMESTAMPTZ {exp.Literal.string(value.isoformat()).sql('duckdb')}"
    return exp.Literal.string(str(value)).sql("duckdb")
