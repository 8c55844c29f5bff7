"""What a statement is, decided from its text once, at Parse: where the server sends it.

- a session command (SET, SHOW, BEGIN, DISCARD ...: commands.py), answered from the connection's settings;
- a cursor command (DECLARE, FETCH, MOVE, CLOSE: cursors.py) or `COPY (query) TO STDOUT` (copy.py), whose query
  is routed in turn;
- `EXPLAIN query`: dpsql's explanation, spending nothing;
- a catalog query (catalog/): every relation it names is PostgreSQL's catalog, or it names none (`SELECT
  version()`); answered by the catalog database, never the data, at no cost;
- anything else goes to the analyst's private session, which tells a query of public tables, a column probe
  (`WHERE 1=0`, `LIMIT 0`), a private query and post-processing over one, and refuses the rest. Probes and
  post-processing are decided there, not here, so that the DB-API and the command line behave the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dpsql.frontends.server.catalog import Catalog, CatalogStatement
from dpsql.frontends.server.commands import LocalCommand, local_command
from dpsql.frontends.server.copy import CopyStatement, copy_statement
from dpsql.frontends.server.cursors import Close, Declare, Fetch, cursor_command


@dataclass(frozen=True)
class Explain:
    query: str


@dataclass(frozen=True)
class Private:
    sql: str


Route = LocalCommand | CatalogStatement | Declare | Fetch | Close | CopyStatement | Explain | Private


def route(sql: str, catalog: Catalog) -> Route:
    """Where `sql` (one statement) goes."""
    command = local_command(sql)
    if command is not None:
        return command
    cursor = cursor_command(sql)
    if cursor is not None:
        return cursor
    copy = copy_statement(sql)
    if copy is not None:
        return copy
    explained = re.fullmatch(r"\s*explain\s+(.+?)[\s;]*", sql, re.IGNORECASE | re.DOTALL)
    if explained is not None:
        return Explain(explained.group(1))
    return query_route(sql, catalog)


def query_route(sql: str, catalog: Catalog) -> CatalogStatement | Private:
    """Where a query goes: the catalog, or the private session."""
    statement = catalog.statement(sql)
    return statement if statement is not None else Private(sql)
