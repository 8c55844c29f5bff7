"""Subqueries and CTEs that read only public tables, anywhere a table or a value may stand: read at check time.

A query of public tables reads public data, so running it at check time leaks nothing (as the IN lists of
normalize.py do). Two forms are replaced by what they return, before the checker sees the query:

- a *public relation*: a subquery (an inlined CTE) in FROM or JOIN that reads only declared public tables, such as
  `WITH big AS (SELECT department FROM departments WHERE beds > 20) SELECT ... FROM visits v JOIN big ON ...`,
  becomes its rows, written out as a VALUES list with each value cast to its column's type (`materialize`). Its
  facts are read from those very rows: the rows per join key (k, relation.py), each column's range and distinct
  values (a public domain of group keys), as for a public table. The rows are written into the SQL rather than
  the subquery run again with the query, so the facts hold for exactly the rows the query joins, whatever the
  subquery does (a LIMIT without ORDER BY could return other rows a second time, and another k);
- a *public constant*: a scalar subquery of public tables (`WHERE cost > (SELECT AVG(beds) FROM departments)`)
  becomes the one value it returns, as a literal of DuckDB's type for it (NULL for no row); an EXISTS of public
  tables that reads nothing of the outer query becomes TRUE or FALSE.

A subquery that returns more than MAX_PUBLIC_ROWS rows, fails on its own (a correlated one: it reads the outer
query), or returns a type dpsql's columns do not have, is left as written, for the checker to refuse; a scalar
subquery with more than one row is refused, as DuckDB would fail on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from dpsql.analysis.bounds import MAX_MAGNITUDE
from dpsql.analysis.public_facts import PublicFacts, PublicRows
from dpsql.analysis.public_query import public_sql
from dpsql.dp.fixedpoint import double
from dpsql.errors import QueryRejected
from dpsql.policy import ColumnPolicy, ColumnType, ContributionBound, Policy, Source, TablePolicy
from dpsql.sql.parse import DIALECT

# The most rows a public relation may have once written into the query (as many as an IN list read from a table).
MAX_PUBLIC_ROWS = 10_000
# The most distinct values of a column that make a public domain of group keys (as for a public table's columns).
MAX_DOMAIN = 10_000
_MARK = "dpsql_public_relation"  # meta key: the PublicRelation a materialized subquery stands for

_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
             "UHUGEINT"}
_KINDS = {"DOUBLE": ColumnType.FLOAT, "FLOAT": ColumnType.FLOAT, "VARCHAR": ColumnType.TEXT,
          "BOOLEAN": ColumnType.BOOL, "DATE": ColumnType.DATE, "TIMESTAMP": ColumnType.TIMESTAMP}


@dataclass(frozen=True)
class PublicRelation:
    """A public relation written into the query: its schema (a public TablePolicy) and its rows, by column name."""

    schema: TablePolicy
    rows: tuple[tuple[Any, ...], ...]

    def max_rows_per_key(self, columns: tuple[str, ...]) -> int:
        """The most rows sharing one value of `columns` (none NULL): Python's equality of the values DuckDB returned
        is DuckDB's for these types (integers, text, booleans, dates and timestamps as their text; never floats,
        which the join rules refuse as keys)."""
        order = list(self.schema.columns)
        positions = [order.index(column) for column in columns]
        keys = Counter(tuple(row[i] for i in positions) for row in self.rows
                       if all(row[i] is not None for i in positions))
        return max(keys.values(), default=0)


def public_relation(node: exp.Expression) -> PublicRelation | None:
    """The public relation a subquery was materialized from, or None (a value forged in the analyst's text, as a
    sqlglot meta comment, is not a PublicRelation and is ignored)."""
    value = node.meta.get(_MARK) if isinstance(node, exp.Subquery) else None
    return value if isinstance(value, PublicRelation) else None


def materialize(tree: exp.Select, policy: Policy, facts: PublicFacts) -> None:
    """Replace, in place, every public subquery in FROM or JOIN by its rows, and every scalar public subquery by its
    value; subqueries that read private tables are searched for more. An IN (SELECT ...) of public tables is left
    whole: normalize.py makes it a list of its values."""
    for select in list(tree.find_all(exp.Select)):
        if select.root() is not tree or (select is not tree and _inside_public_query(select, policy)):
            continue
        sources = [select.args.get("from_"), *(select.args.get("joins") or [])]
        for holder in sources:
            source = holder.this if holder is not None else None
            if isinstance(source, exp.Subquery) and public_relation(source) is None:
                rows = _read(source.this, policy, facts)
                if rows is not None:
                    source.replace(_relation_node(source, rows))
    for subquery in list(tree.find_all(exp.Subquery)):
        if subquery.root() is tree and _scalar(subquery) and public_relation(subquery) is None:
            rows = _read(subquery.this, policy, facts)
            if rows is not None:
                subquery.replace(_constant(subquery, rows))
    for exists in list(tree.find_all(exp.Exists)):
        # EXISTS over public tables alone, not correlated: a constant of public data.
        if exists.root() is tree and isinstance(exists.this, exp.Query):
            rows = _read(exp.select(exp.alias_(exp.Exists(this=exists.this.copy()), "e")), policy, facts)
            if rows is not None:
                exists.replace(exp.Boolean(this=bool(rows.rows[0][0])))


def _inside_public_query(select: exp.Select, policy: Policy) -> bool:
    """Whether the SELECT is part of a larger query of public tables only (an IN's, a scalar's, a materialized one):
    that query is read whole."""
    node: exp.Expression | None = select.parent
    while node is not None:
        if isinstance(node, exp.Subquery) and public_relation(node) is not None:
            return True
        if isinstance(node, exp.Query) and node.parent is not None and _public(node, policy):
            return True
        node = node.parent
    return False


def _public(query: exp.Expression, policy: Policy) -> bool:
    try:
        return public_sql(query, policy) is not None
    except QueryRejected:
        return False


def _scalar(subquery: exp.Subquery) -> bool:
    """A subquery in a value's place: not a FROM or JOIN source, not the query of an IN or an EXISTS."""
    parent = subquery.parent
    return not isinstance(parent, exp.From | exp.Join | exp.In | exp.Exists) and subquery.arg_key not in ("from_",
                                                                                                      "joins")


def _read(query: exp.Expression, policy: Policy, facts: PublicFacts) -> PublicRows | None:
    if not isinstance(query, exp.Query):
        return None
    try:
        resolved = public_sql(query, policy)
    except QueryRejected:
        return None
    return facts.rows(resolved, MAX_PUBLIC_ROWS) if resolved is not None else None


def _relation_node(subquery: exp.Subquery, rows: PublicRows) -> exp.Subquery:
    """The subquery as a VALUES list of its rows, each value cast to its column's type, marked with its facts."""
    alias = subquery.args.get("alias")
    renames = [c.name for c in alias.args.get("columns") or ()] if alias is not None else []
    what = f"the public subquery {subquery.alias_or_name or ''}".rstrip()
    if len(renames) > len(rows.names):
        raise QueryRejected(f"{what} has {len(rows.names)} columns but {len(renames)} column aliases were given")
    names = [renames[i] if i < len(renames) else name for i, name in enumerate(rows.names)]
    if len({name.lower() for name in names}) != len(names):
        raise QueryRejected(f"{what} has two columns of one name ({', '.join(names)}): name them apart (AS ...)")
    kinds = [_kind(kind, name, what) for name, kind in zip(names, rows.types, strict=True)]
    values = [tuple(_value(v, kind, what) for v, kind in zip(row, kinds, strict=True)) for row in rows.rows]
    placeholders = [exp.to_identifier(f"c{i}") for i in range(len(names))]
    projection = [exp.alias_(exp.column(p.copy()), exp.to_identifier(n.lower(), quoted=True)) for p, n in
                  zip(placeholders, names, strict=True)]
    if values:
        listed = exp.Values(expressions=[exp.tuple_(*[_literal(v, kind) for v, kind in zip(row, kinds, strict=True)])
                                         for row in values],
                            alias=exp.TableAlias(this=exp.to_identifier("__dp_rows"), columns=placeholders))
        query = exp.select(*projection).from_(listed)
    else:
        query = exp.select(*[exp.alias_(_literal(None, kind), exp.to_identifier(n.lower(), quoted=True))
                             for n, kind in zip(names, kinds, strict=True)]).where(exp.false())
    name = subquery.alias_or_name or "__dp_public"
    node = query.subquery(exp.TableAlias(this=exp.to_identifier(name)))
    columns = {n.lower(): _column(n.lower(), kind, [row[i] for row in values]) for i, (n, kind) in
               enumerate(zip(names, kinds, strict=True))}
    schema = TablePolicy(name.lower(), Source("query", ""), columns, ContributionBound(1), None, public=True)
    node.meta[_MARK] = PublicRelation(schema, tuple(values))
    return node


def _constant(subquery: exp.Subquery, rows: PublicRows) -> exp.Expression:
    """The scalar subquery's one value, as a literal of the type DuckDB gives it (NULL for no row)."""
    text = subquery.sql(DIALECT)
    if len(rows.names) != 1:
        raise QueryRejected(f"{text}: a subquery in a value's place must return one column, not {len(rows.names)}")
    if len(rows.rows) > 1:
        raise QueryRejected(f"{text}: the subquery returns {len(rows.rows)} rows of public data where one value is "
                            "expected (DuckDB fails on it); aggregate it, or use IN (SELECT ...)")
    value, kind = rows.rows[0][0] if rows.rows else None, rows.types[0]
    if not (kind in _INTEGERS or kind.startswith("DECIMAL") or kind in _KINDS):
        raise QueryRejected(f"{text}: its value is a {kind}, which a query cannot compare with its columns here; "
                            "cast it to a number, text, boolean, date or timestamp")
    sql_type = exp.DataType.build(kind, dialect=DIALECT)
    if value is None:
        return exp.cast(exp.null(), sql_type)
    if kind in _INTEGERS:
        number = exp.Literal.number(abs(value))
        return exp.cast(exp.Neg(this=number) if value < 0 else number, sql_type)
    if kind.startswith("DECIMAL") or kind == "FLOAT":
        return exp.cast(exp.Literal.string(str(value)), sql_type)
    return _literal(_value(value, _KINDS[kind], text), _KINDS[kind])


def _kind(kind: str, name: str, what: str) -> ColumnType:
    if kind in _INTEGERS:
        return ColumnType.INT
    if kind.startswith("DECIMAL"):
        return ColumnType.FLOAT  # read as DOUBLE, as a column declared float is
    if kind in _KINDS:
        return _KINDS[kind]
    raise QueryRejected(f"{what}: its column '{name}' is a {kind}; a public relation joined to private tables holds "
                        "integers, numbers, text, booleans, dates and timestamps only (cast it)")


def _value(value: Any, kind: ColumnType, what: str) -> Any:
    """A value as the relation holds it: integers within BIGINT, decimals as doubles, text without NUL."""
    if value is None:
        return None
    if kind is ColumnType.INT:
        if not -2**63 <= int(value) < 2**63:
            raise QueryRejected(f"{what}: the integer {value} does not fit a BIGINT")
        return int(value)
    if kind is ColumnType.FLOAT:
        return float(value) if isinstance(value, decimal.Decimal | int | float) else float(str(value))
    if kind is ColumnType.TEXT and "\x00" in value:
        raise QueryRejected(f"{what}: a text value holds a NUL character, which SQL text cannot")
    return value


def _literal(value: Any, kind: ColumnType) -> exp.Expression:
    """A literal of exactly `value`, of the column's type."""
    sql_type = kind.duckdb
    if value is None:
        return exp.cast(exp.null(), sql_type)
    if kind is ColumnType.INT:
        number = exp.Literal.number(abs(value))
        return exp.cast(exp.Neg(this=number) if value < 0 else number, sql_type)
    if kind is ColumnType.FLOAT:
        return double(value) if math.isfinite(value) else exp.cast(exp.Literal.string(repr(value)), sql_type)
    if kind is ColumnType.BOOL:
        return exp.Boolean(this=bool(value))
    if kind is ColumnType.TEXT:
        return exp.Literal.string(value)
    text = value if isinstance(value, str) else value.isoformat(sep=" ") if isinstance(
        value, datetime.datetime) else value.isoformat()
    return exp.cast(exp.Literal.string(text), sql_type)


def _column(name: str, kind: ColumnType, values: list[Any]) -> ColumnPolicy:
    """A column of a public relation: nullable, its range and distinct values from its rows (as a public table's
    from its data), its text no longer than its longest value."""
    present = [v for v in values if v is not None]
    column = ColumnPolicy(name, kind, nullable=True)
    if kind.numeric and present:
        lo, hi = min(present), max(present)
        if all(math.isfinite(v) and abs(v) <= MAX_MAGNITUDE for v in (lo, hi)):
            column = dataclasses.replace(column, lower=float(lo), upper=float(hi))
    if kind in (ColumnType.TEXT, ColumnType.INT):
        distinct = tuple(sorted(set(present)))
        if 0 < len(distinct) <= MAX_DOMAIN:
            column = dataclasses.replace(column, values=distinct)
    if kind is ColumnType.TEXT:
        column = dataclasses.replace(column, max_length=max((len(v) for v in present), default=1) or 1)
    return column


__all__ = ["MAX_PUBLIC_ROWS", "PublicRelation", "materialize", "public_relation"]
