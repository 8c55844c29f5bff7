"""Column probes: queries whose answer has no row whatever the data, which tools send to learn a query's columns.

`SELECT * FROM visits WHERE 1=0`, `SELECT * FROM (<query>) AS t LIMIT 0`: the answer is empty on every database,
so only its columns and their types can be told, and those follow from the declared schema alone. Such a query
is answered on empty copies of the declared tables (engines/declared.py): no data is touched, nothing is charged,
and a row-level read that returns rows is still refused by the checker, since it is not a probe.

A query is a probe when its outermost SELECT reads declared tables only (or its own CTEs and subqueries of them)
and has `LIMIT 0`, or a WHERE that is false or NULL whatever the row (a condition over constants only, evaluated
in the constant checker's empty sandbox) and no aggregate without GROUP BY (which would make one row). Every node
is on the allowlist of queries of public tables: nothing here can call what a private query could not.
"""

from __future__ import annotations

import duckdb
from sqlglot import exp

from dpsql.analysis.flatten import has_aggregate
from dpsql.analysis.public_query import vet_query
from dpsql.analysis.vetting import CONSTANTS, ROW_NODES, constant_parts
from dpsql.policy import Policy
from dpsql.sql.parse import DIALECT


def is_probe(tree: exp.Expression, policy: Policy) -> bool:
    """Whether `tree` (a parsed, unqualified query) returns no row on any data: answered from the schema alone."""
    if not isinstance(tree, exp.Select) or not _reads_declared_tables(tree, policy):
        return False
    if _limit_zero(tree.args.get("limit")):
        pass
    elif not _false_filter(tree.args.get("where")) or _one_row(tree):
        return False
    vet_query(tree, "a column probe (a query that returns no row)")
    return True


def _reads_declared_tables(tree: exp.Select, policy: Policy) -> bool:
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = list(tree.find_all(exp.Table))
    if not tables:
        return False
    for table in tables:
        if not isinstance(table.this, exp.Identifier) or table.args.get("db") or table.args.get("catalog"):
            return False
        if table.name.lower() not in ctes and policy.table(table.name) is None:
            return False
    return not any(isinstance(node, exp.With) and node.args.get("recursive") for node in tree.walk())


def _limit_zero(limit: exp.Expression | None) -> bool:
    value = limit.expression if isinstance(limit, exp.Limit) else None
    return isinstance(value, exp.Literal) and not value.is_string and value.this.strip() == "0"


def _false_filter(where: exp.Expression | None) -> bool:
    """Whether the WHERE keeps no row: one of its AND-ed conditions is a constant that is not TRUE."""
    if where is None:
        return False
    return any(_constant_not_true(part) for part in where.this.flatten() if isinstance(where.this, exp.And)) or \
        _constant_not_true(where.this)


def _constant_not_true(condition: exp.Expression) -> bool:
    constant = isinstance(condition, exp.Boolean | exp.Null | exp.Literal) or constant_parts(condition) == [condition]
    if not constant or any(type(n) not in ROW_NODES for n in condition.walk()):
        return False
    try:
        (value,), = CONSTANTS.evaluate(f"SELECT coalesce(TRY_CAST(({condition.sql(DIALECT)}) AS BOOLEAN), false)")
    except duckdb.Error:  # a constant DuckDB cannot evaluate: not a probe (the checker says why)
        return False
    return value is False


def _one_row(tree: exp.Select) -> bool:
    """An aggregate without GROUP BY answers one row even over no rows (COUNT(*) is 0): not an empty answer."""
    if tree.args.get("group"):
        return False
    return any(has_aggregate(item) for item in tree.expressions) or tree.args.get("having") is not None
