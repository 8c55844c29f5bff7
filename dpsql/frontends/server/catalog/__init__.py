"""PostgreSQL's catalog for the policy's tables, answered from public metadata only (never the data, never a charge).

The parts, one job each:
- relations.py: which pg_catalog and information_schema relations exist, with PostgreSQL's columns and OIDs;
- builtin_types.py: PostgreSQL's types and the type of each declared column;
- tables.py: their rows, generated from the policy (and from the asking connection for its own relations);
- functions.py: PostgreSQL's functions tools call, as DuckDB macros;
- translate.py: is a statement a catalog query, and its DuckDB SQL (sqlglot, from PostgreSQL's dialect);
- database.py: the sandboxed DuckDB that holds the catalog and runs the translated queries under a time limit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from dpsql.frontends.server.catalog.database import CatalogDatabase, CatalogQueryError
from dpsql.frontends.server.catalog.tables import ConnectionFacts, CursorFacts
from dpsql.frontends.server.catalog.translate import Translated, catalog_query, translate
from dpsql.policy import Policy

_CACHE = 512  # translated statements kept (drivers repeat their introspection queries)


@dataclass(frozen=True)
class CatalogStatement:
    """A catalog query, translated once."""

    sql: str  # as the client wrote it
    translated: Translated

    @property
    def parameters(self) -> int:
        return self.translated.parameters


class Catalog:
    """The server's catalog: decides which statements are catalog queries and answers them."""

    def __init__(self, policy: Policy, version: str) -> None:
        self.policy = policy
        self._version = version
        self._database: CatalogDatabase | None = None
        self._opening = threading.Lock()
        self._statements: OrderedDict[str, CatalogStatement | None] = OrderedDict()

    def statement(self, sql: str) -> CatalogStatement | None:
        """The catalog query `sql` is, or None if it is not one."""
        if sql in self._statements:
            self._statements.move_to_end(sql)
            return self._statements[sql]
        tree = catalog_query(sql)
        found = CatalogStatement(sql, translate(tree)) if tree is not None else None
        self._statements[sql] = found
        if len(self._statements) > _CACHE:
            self._statements.popitem(last=False)
        return found

    def columns(self, statement: CatalogStatement, facts: ConnectionFacts) -> list[tuple[str, str]]:
        return self.database().columns(statement.translated.sql, facts, statement.parameters)

    def run(self, statement: CatalogStatement, facts: ConnectionFacts,
            parameters: list[Any]) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
        return self.database().run(statement.translated.sql, facts, parameters)

    def interrupt(self, owner: int) -> None:
        """Stop the catalog query the thread `owner` runs, if any."""
        if self._database is not None:
            self._database.interrupt(owner)

    def database(self) -> CatalogDatabase:
        """Built on first use (in a worker thread: it takes a fraction of a second)."""
        with self._opening:
            if self._database is None:
                self._database = CatalogDatabase(self.policy, self._version)
            return self._database

    def close(self) -> None:
        if self._database is not None:
            self._database.close()


__all__ = ["Catalog", "CatalogQueryError", "CatalogStatement", "ConnectionFacts", "CursorFacts"]
