"""SQL over a released answer: post-processing, as in BigQuery's model (DP aggregation in a subquery, anything after).

`SELECT COUNT(*) FROM (<q>) AS t`, `SELECT * FROM (<q>) AS t LIMIT 1000` (Superset's wrappers), `SELECT region, n,
RANK() OVER (ORDER BY n) FROM (<q>) AS t`, `WITH t AS (<q>) SELECT ... FROM t JOIN regions USING (region)`: when
<q> is a private query dpsql can answer on its own, the outer query is a function of its released rows and of
public tables only. It is answered in two steps: <q> is answered (and charged) as itself, then the outer query
runs on <q>'s released rows, in the database that holds only public tables (engines: run_public), where no
private row exists to be read. Post-processing of a DP answer costs nothing more.

This module only finds the candidates, from the SQL: the subqueries in FROM (at any depth) and the CTEs that read
a private table, outermost first. The session decides which is the private query (the first one it can answer)
and keeps the split only if the outer query then reads no private table: one private query per statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from dpsql.policy import Policy
from dpsql.sql.names import RELEASED
from dpsql.sql.parse import DIALECT


@dataclass(frozen=True)
class Split:
    inner: str  # the private query, parameters already bound (DuckDB's dialect)
    outer: exp.Expression  # the query with the private one read from the table RELEASED
    alias: str  # how the outer query names it


def candidates(tree: exp.Expression, policy: Policy) -> Iterator[Split]:
    """Each way of reading `tree` as an outer query over one private subquery or CTE, outermost first."""
    private = _private_names(policy)
    queue: list[exp.Expression] = [tree]
    while queue:
        query = queue.pop(0)
        for source in _sources(query):
            body = source.this
            if not _reads(body, private):
                continue
            yield _split(tree, source)
            queue.append(body)


def reads_private(tree: exp.Expression, policy: Policy) -> bool:
    return _reads(tree, _private_names(policy))


def _private_names(policy: Policy) -> frozenset[str]:
    return frozenset(name for name, table in policy.tables.items() if not table.public)


def _reads(tree: exp.Expression, private: frozenset[str]) -> bool:
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    return any(t.name.lower() in private and t.name.lower() not in ctes for t in tree.find_all(exp.Table))


def _sources(query: exp.Expression) -> Iterator[exp.Subquery | exp.CTE]:
    """The subqueries a query reads from (FROM, JOIN) and its CTEs, in the order written."""
    if isinstance(query, exp.Subquery):
        query = query.this
    with_ = query.args.get("with_") or query.args.get("with")
    if isinstance(with_, exp.With):
        yield from with_.expressions
    if isinstance(query, exp.SetOperation):
        yield from _sources(query.this)
        yield from _sources(query.expression)
        return
    if not isinstance(query, exp.Select):
        return
    clauses = [query.args.get("from_") or query.args.get("from"), *(query.args.get("joins") or [])]
    for clause in clauses:
        if clause is not None and isinstance(clause.this, exp.Subquery):
            yield clause.this


def _split(tree: exp.Expression, source: exp.Subquery | exp.CTE) -> Split:
    """`tree` with `source` read from the released table: a subquery is replaced in place; a CTE is dropped and each
    reference to it reads the released table under the name it was read by."""
    inner = source.this.sql(DIALECT)
    path = _path(tree, source)
    outer = tree.copy()
    copied = _at(outer, path)
    if isinstance(source, exp.CTE):
        name = source.alias_or_name
        copied.pop()
        for table in list(outer.find_all(exp.Table)):
            if table.name.lower() == name.lower() and not table.args.get("db"):
                alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
                table.replace(exp.Table(this=exp.to_identifier(RELEASED), alias=alias))
        with_ = outer.args.get("with_") or outer.args.get("with")
        if isinstance(with_, exp.With) and not with_.expressions:
            with_.pop()
        return Split(inner, outer, name)
    alias = copied.args.get("alias") or exp.TableAlias(this=exp.to_identifier("released"))
    copied.replace(exp.Table(this=exp.to_identifier(RELEASED), alias=alias.copy()))
    return Split(inner, outer, alias.name)


def _path(root: exp.Expression, node: exp.Expression) -> list[tuple[str, int | None]]:
    """How to reach `node` from `root`: (argument name, index in a list or None) at each step."""
    steps = []
    while node is not root:
        parent = node.parent
        assert parent is not None
        key, index = node.arg_key, node.index
        steps.append((key, index))
        node = parent
    return list(reversed(steps))


def _at(root: exp.Expression, path: list[tuple[str, int | None]]) -> exp.Expression:
    node = root
    for key, index in path:
        value = node.args[key]
        node = value[index] if isinstance(value, list) else value
    return node
