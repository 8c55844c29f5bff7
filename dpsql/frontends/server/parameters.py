"""The types of a statement's `$n` parameters, inferred at Parse from the SQL and the policy alone.

Drivers that describe a statement before binding it (asyncpg, JDBC, psycopg's prepared statements) encode each
value as the type the server reports. A parameter compared with a declared column gets that column's type, one in
LIMIT or OFFSET a bigint; any other stays text, which the checker types by its context once bound
(dpsql.analysis.text_parameters). A type the client declared itself always wins.
"""

from __future__ import annotations

import datetime
import decimal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql.frontends.server import types
from dpsql.policy import Policy
from dpsql.sql.comparisons import compared_column, enclosing
from dpsql.sql.parse import DIALECT, TextParameter


def parameter_types(sql: str, declared: list[int], policy: Policy) -> list[int]:
    """One OID per parameter: as many as the highest $n (or as the client declared, if more)."""
    inferred: dict[int, int] = {}
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except (ParseError, TokenError, RecursionError, ValueError):
        tree = None
    if tree is not None:
        columns = _declared_columns(tree, policy)
        for node in tree.find_all(exp.Parameter, exp.Placeholder):
            number = _number(node)
            if number is not None:
                oid = _context_type(node, columns)
                if oid is not None:
                    inferred.setdefault(number, oid)
    count = max([len(declared), *inferred])
    return [declared[i] if i < len(declared) and declared[i] else inferred.get(i + 1, types.TEXT)
            for i in range(count)]


def dummy_value(oid: int) -> object:
    """A value of the parameter's type, for describing a statement before it is bound: the columns of a query do
    not depend on its parameters' values, only on their types."""
    return {types.BOOL: True, types.INT2: 1, types.INT4: 1, types.INT8: 1, types.FLOAT4: 1.0, types.FLOAT8: 1.0,
            types.NUMERIC: decimal.Decimal(1), types.DATE: datetime.date(2000, 1, 1),
            types.TIMESTAMP: datetime.datetime(2000, 1, 1),
            types.TIMESTAMPTZ: datetime.datetime(2000, 1, 1)}.get(oid, TextParameter("1", stand_in=True))


def _number(node: exp.Expression) -> int | None:
    name = node.this if isinstance(node, exp.Placeholder) else node.name
    if isinstance(name, exp.Expression):
        name = name.name
    text = str(name or "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def _declared_columns(tree: exp.Expression, policy: Policy) -> dict[str, int]:
    """Column name -> OID, over the tables the query names; a name two of them give different types is left out."""
    found: dict[str, int] = {}
    clashes = set()
    for table_node in tree.find_all(exp.Table):
        table = policy.table(table_node.name)
        if table is None:
            continue
        for column in table.columns.values():
            oid = types.COLUMN_OIDS[column.type]
            if found.setdefault(column.name, oid) != oid:
                clashes.add(column.name)
    return {name: oid for name, oid in found.items() if name not in clashes}


def _context_type(node: exp.Expression, columns: dict[str, int]) -> int | None:
    parent = enclosing(node)
    if isinstance(parent, exp.Limit | exp.Offset):
        return types.INT8
    column = compared_column(node)
    return columns.get(column.name.lower()) if column is not None else None
