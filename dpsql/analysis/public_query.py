"""Queries that read only public tables: they run as written (row by row, joins, aggregates), free and exact.

Public data need no privacy, so the only questions are what the SQL may touch and do. It may name declared public
tables only (and its own CTEs): each becomes the loaded copy of that table, and nothing else can be reached, so
no private row is ever read by this path. Every node of the SQL is on an allowlist (the row functions vetted for
private queries, plain aggregates, and the parts of a SELECT), so no function can read files, settings or other
tables. A query naming any private or unknown table is not public and goes the private way.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.vetting import ROW_NODES, describe
from dpsql.errors import QueryRejected
from dpsql.policy import Policy
from dpsql.sql.names import RESERVED_PREFIX, is_reserved, prepared_table
from dpsql.sql.parse import DIALECT

_QUERY_NODES = frozenset((
    exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Offset, exp.Subquery, exp.Table, exp.TableAlias, exp.Union, exp.Intersect, exp.Except, exp.Distinct,
    exp.With, exp.CTE, exp.Star, exp.Alias, exp.Exists,
))
_AGGREGATES = frozenset((exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max))
# Window functions over public rows (and over released answers: post-processing) are as public as the rows.
_WINDOWS = frozenset((exp.Window, exp.WindowSpec, exp.RowNumber, exp.Rank, exp.DenseRank, exp.NthValue,
                      exp.FirstValue, exp.LastValue, exp.Lag, exp.Lead, exp.Ntile, exp.PercentRank, exp.CumeDist))
_ALLOWED = ROW_NODES | _QUERY_NODES | _AGGREGATES | _WINDOWS


def public_sql(tree: exp.Expression, policy: Policy) -> str | None:
    """The SQL to run if the query (a tree: the stages ask of their subqueries, which have no text of their own to
    generate just for this) reads only public tables; None if it reads anything else."""
    if not isinstance(tree, exp.Query):
        return None
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    # A CTE's name is skipped below only because it is the query's own; but a CTE is visible in its scope only, so
    # one named like a loaded table (__dp_visits) in an inner scope would let an outer reference of that name
    # through to the private table. dpsql's own names are never a CTE's.
    if any(is_reserved(name) for name in ctes):
        raise QueryRejected(f"names starting with '{RESERVED_PREFIX}' are reserved for dpsql's own")
    if any(policy.table(name) is not None for name in ctes):
        return None  # a CTE named like a declared table: the normaliser refuses it, with its reason
    tables = list(tree.find_all(exp.Table))
    if not any(t.name.lower() not in ctes for t in tables):
        return None  # no declared table at all: not a query of public tables
    for table in tables:
        if not isinstance(table.this, exp.Identifier) or table.args.get("db") or table.args.get("catalog"):
            return None
        if table.name.lower() in ctes:
            continue
        declared = policy.table(table.name)
        if declared is None or not declared.public:
            return None
    vet_query(tree, "a query of public tables")
    return resolved_sql(tree, policy)


def vet_query(tree: exp.Expression, what: str) -> None:
    """Refuse any node off the allowlist: the vetted row functions, plain aggregates, windows, a SELECT's parts."""
    for node in tree.walk():
        if type(node) not in _ALLOWED:
            raise QueryRejected(f"{describe(node)} is not in the list of vetted SQL functions ({what} runs as "
                                "written, with the functions allowed in private queries, COUNT, SUM, AVG, MIN, MAX "
                                "and window functions)")


def resolved_sql(tree: exp.Expression, policy: Policy, own: frozenset[str] = frozenset()) -> str:
    """The SQL with each declared public table read from its loaded copy; the query's CTEs and the names in `own`
    (released answers, engines/base.ReleasedTable) stay as written."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    resolved = tree.copy()
    for table in list(resolved.find_all(exp.Table)):
        if table.name.lower() in ctes or table.name in own:
            continue
        alias = table.args.get("alias")
        loaded = exp.to_table(prepared_table(policy.table(table.name).name))
        loaded.set("alias", alias.copy() if alias is not None else exp.TableAlias(
            this=exp.to_identifier(table.name)))
        table.replace(loaded)
    return resolved.sql(DIALECT)
