"""Empty copies of the declared tables, each with its declared columns and types: where a column probe runs.

A probe's answer has no row whatever the data (analysis/probes.py), so it is computed here, in a sandboxed DuckDB
of its own that holds these empty tables and nothing else, under the engine's time limit: the columns and types
come out, and there is no row anywhere to be read.
"""

from __future__ import annotations

import threading

import duckdb

from dpsql.engines.watchdog import Watchdog
from dpsql.errors import QueryRejected, first_line
from dpsql.policy import Policy
from dpsql.sql import sandbox


class DeclaredTables:
    def __init__(self, policy: Policy) -> None:
        with sandbox.opened({"threads": "1"}) as con:
            for table in policy.tables.values():
                columns = ", ".join(f'"{c.name}" {c.sql_type}' for c in table.columns.values())
                con.execute(f'CREATE TABLE "{table.name}" ({columns})')
        self._con = con
        self._lock = threading.Lock()
        self._watchdog = Watchdog(con, policy.time_limit)

    def describe(self, sql: str) -> tuple[list[str], list[str]]:
        with self._lock:
            try:
                with self._watchdog.running():
                    cursor = self._con.execute(sql)
                    cursor.fetchall()
            except duckdb.Error as exc:
                raise QueryRejected(f"the query does not type-check: {first_line(exc)}") from None
            return [d[0] for d in cursor.description], [str(d[1]) for d in cursor.description]

    def close(self) -> None:
        with self._lock:
            self._watchdog.close()
            self._con.close()
