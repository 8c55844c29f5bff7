"""Facts of the public tables (analysis/public_facts.py), read from the loaded copies: public data, so free."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp

from dpsql.analysis.public_facts import ColumnFacts, PublicRows
from dpsql.policy import Policy
from dpsql.sql.names import prepared_table
from dpsql.sql.parse import DIALECT

# A text or integer column with at most this many distinct values is a public domain of group keys (the policy's
# own limit on declared values).
MAX_DOMAIN = 10_000
# The DuckDB types whose values Python holds exactly as DuckDB has them; any other is read as DuckDB's text of it
# (a DATE 'infinity' would become Python's date.max, the same as 9999-12-31: sql/lossless.py).
_EXACT_IN_PYTHON = frozenset({"BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                              "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "VARCHAR"})


class DuckDBPublicFacts:
    """Answers from the engine's connection, under its lock; each fact is read once."""

    def __init__(self, policy: Policy, query: Callable[[str], list[tuple[Any, ...]]], lock: threading.Lock,
                 analyst_query: Callable[[str], list[tuple[Any, ...]]]) -> None:
        self._policy = policy
        # The facts that bound joins are read from the very tables the joins read (`query`); a query the analyst
        # wrote (`values`) runs in the database that holds the public tables only (`analyst_query`).
        self._query = query
        self._lock = lock
        self._analyst_query = analyst_query  # safe to call from several threads at once
        self._cache: dict[tuple, Any] = {}

    def _public(self, table: str) -> str:
        policy = self._policy.table(table)
        if policy is None or not policy.public:  # never a fact of private data, whoever asks
            raise ValueError(f"'{table}' is not a public table")
        return prepared_table(policy.name)

    def _cached(self, key: tuple, sql: exp.Expression) -> list[tuple[Any, ...]]:
        if key not in self._cache:
            with self._lock:
                self._cache[key] = self._query(sql.sql(DIALECT))
        return self._cache[key]

    def max_rows_per_key(self, table: str, columns: tuple[str, ...]) -> int:
        key = ("k", table, columns)
        if key not in self._cache:  # the query's tree is built only when it runs: the check asks on every query
            keys = [exp.column(exp.to_identifier(c, quoted=True)) for c in columns]
            counts = exp.select(exp.alias_(exp.Count(this=exp.Star()), "n")).from_(self._public(table)) \
                .where(exp.and_(*[k.is_(exp.null()).not_() for k in keys])).group_by(*[k.copy() for k in keys])
            self._cached(key, exp.select(exp.func("COALESCE", exp.Max(this=exp.column("n")), exp.Literal.number(0)))
                         .from_(counts.subquery("c")))
        return int(self._cache[key][0][0])

    def column(self, table: str, column: str) -> ColumnFacts:
        # Kept whole, not only the rows it is made of: the check asks for every public column of a join's tables on
        # each query, and building the two queries' trees cost more than the rest of the lookup.
        key = ("column", table, column)
        if key not in self._cache:
            self._cache[key] = self._column(table, column)
        return self._cache[key]

    def _column(self, table: str, column: str) -> ColumnFacts:
        policy = self._policy.table(table)
        name = self._public(table)
        value = exp.column(exp.to_identifier(column, quoted=True))
        lower = upper = None
        if policy.columns[column].type.numeric:
            row = self._cached(("range", table, column), exp.select(
                exp.Min(this=value.copy()), exp.Max(this=value.copy())).from_(name))[0]
            lower, upper = (float(row[0]), float(row[1])) if row[0] is not None else (None, None)
        distinct = exp.select(value.copy()).distinct().from_(name).where(value.copy().is_(exp.null()).not_()) \
            .order_by(value.copy()).limit(MAX_DOMAIN + 1)
        rows = self._cached(("values", table, column), distinct)
        values = tuple(r[0] for r in rows) if 0 < len(rows) <= MAX_DOMAIN else None
        return ColumnFacts(lower, upper, values)

    def values(self, sql: str, limit: int) -> tuple[Any, ...] | None:
        # `sql` came from analysis/public_query.py: every table in it is a declared public table's loaded copy.
        # In order (NULL last), so the same values always give the same SQL text: one plan, one cache entry.
        key = ("query", sql, limit)
        if key not in self._cache:
            distinct = exp.select("*").distinct().from_(sqlglot.parse_one(sql, read=DIALECT).subquery("v")) \
                .order_by(exp.Ordered(this=exp.Literal.number(1), nulls_first=False)).limit(limit + 1)
            try:
                self._cache[key] = self._analyst_query(distinct.sql(DIALECT))
            except duckdb.Error:
                return None
        rows = self._cache[key]
        if len(rows) > limit or any(len(row) != 1 for row in rows):
            return None
        return tuple(row[0] for row in rows)

    def rows(self, sql: str, limit: int) -> PublicRows | None:
        # `sql` came from analysis/public_query.py, as for `values`. Sorted, so the same result is the same rows.
        key = ("rows", sql, limit)
        if key not in self._cache:
            try:
                described = self._analyst_query(f"DESCRIBE {sql}")
                names = tuple(str(row[0]) for row in described)
                types = tuple(str(row[1]) for row in described)
                read = [exp.column(exp.to_identifier(f"c{i}", quoted=True)) for i in range(len(names))]
                read = [c if kind in _EXACT_IN_PYTHON or kind.startswith("DECIMAL") else exp.cast(c, "VARCHAR")
                        for c, kind in zip(read, types, strict=True)]
                alias = exp.TableAlias(this=exp.to_identifier("r"),
                                       columns=[exp.to_identifier(f"c{i}", quoted=True) for i in range(len(names))])
                query = exp.select(*read).from_(sqlglot.parse_one(sql, read=DIALECT).subquery(alias)) \
                    .order_by(exp.Ordered(this=exp.var("ALL"), nulls_first=True)).limit(limit + 1)
                found = self._analyst_query(query.sql(DIALECT))
            except duckdb.Error:
                self._cache[key] = None
            else:
                self._cache[key] = PublicRows(names, types, tuple(found)) if len(found) <= limit else None
        return self._cache[key]
