"""Merge row-level subqueries in FROM into the SELECT that reads them, so the checker sees one SELECT over a table.

`SELECT COUNT(*) FROM (SELECT age + 1 AS a, region FROM visits WHERE sex = 'F') AS s WHERE a > 30 GROUP BY region`
becomes `SELECT COUNT(*) FROM visits WHERE visits.sex = 'F' AND (visits.age + 1) > 30 GROUP BY visits.region`.

Why this is exact. A subquery that only filters and projects (no aggregate, DISTINCT, GROUP BY, LIMIT, window,
set operation or join) yields, for each row r of its table that passes its WHERE, one row whose columns are its
projections evaluated on r. Every reference in the outer query to one of those columns is therefore the projection
evaluated on r, and the outer WHERE keeps r exactly when both WHEREs are TRUE, which is `inner AND outer` (AND is
TRUE exactly when both sides are TRUE, whatever NULLs they give). So the outer query over the subquery and the
merged query see the same multiset of rows with the same values. What has to be right is name resolution, done
here by hand rather than by sqlglot's merge_subqueries (which resolves through qualify() and does not apply
DuckDB's rules for select aliases): every column of both SELECTs is resolved as DuckDB resolves it, and the
merged tree holds only columns qualified by the table, so nothing can resolve differently afterwards:
- inside the subquery, a name is a column of its table first, then (DuckDB's lateral aliases) an earlier select
  alias; in its WHERE any of its aliases;
- in the outer query, a name is a column of the subquery first, then an output alias of the outer SELECT (in
  SELECT an earlier one, in WHERE, GROUP BY, HAVING any); a bare ORDER BY name is an output alias first (and stays
  one: the merged SELECT keeps the output names);
- a name found nowhere, or ambiguous (two subquery columns of that name), is an error, as in DuckDB.
A subquery's `SELECT *` is expanded from the policy's columns, which are the table's columns in the engine in the
declared order (engines/duckdb_engine.py loads exactly those, in that order). A table's column aliases
`FROM visits AS v(a, b)` rename its first columns by position: the same as the subquery
`(SELECT patient_id AS a, age AS b, <the rest> FROM visits) AS v`, merged the same way.

Anything this cannot merge exactly (a subquery grouped by the unit, one with a join, a replacement that would put a
constant where DuckDB reads a position, an outer query with subqueries of its own) is left as written: the checker
refuses it or handles it. Privacy: the merged SELECT is an ordinary one-table query, checked, bounded and noised
as any other; the merge never adds a row or a column the written query did not read.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import duckdb
from sqlglot import exp

from dpsql.analysis.written_joins import columns_of
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.policy import Policy
from dpsql.sql.parse import DIALECT

# The clauses a merged subquery may have (ORDER BY without LIMIT does not change a multiset and is dropped).
_INNER_CLAUSES = {"expressions", "from_", "where", "order"}
# The outer clauses whose names are resolved here; any other clause (joins, named windows, ...) stops the merge.
_OUTER_CLAUSES = {"expressions", "from_", "where", "group", "having", "qualify", "order", "limit", "offset",
                  "distinct"}
# Where a substituted expression needs no parentheses: it is a whole clause item or a whole function argument.
_WHOLE = (exp.Alias, exp.Select, exp.Where, exp.Group, exp.Having, exp.Qualify, exp.Ordered, exp.AggFunc,
          exp.Distinct, exp.Case, exp.If)
# Calls whose value differs on each evaluation: substituting them in two places would draw twice.
_VOLATILE = {"random", "rand", "randn", "uuid", "gen_random_uuid", "setseed", "nextval"}


@functools.cache
def _duckdb_aggregates() -> frozenset[str]:
    """Every aggregate function DuckDB has, by name: sqlglot reads some (histogram, arbitrary, VAR) as anonymous
    calls, which must not be mistaken for row-level functions. Read from DuckDB's catalogue, no data involved;
    on first need, not at import: the catalogue costs a DuckDB instance of its own (about 45 ms and 35 MB), which
    most queries, naming no anonymous call, never need."""
    with duckdb.connect() as con:
        rows = con.execute("SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
                           "WHERE function_type = 'aggregate'").fetchall()
    return frozenset(row[0] for row in rows) | {"var"}  # VAR(x): dpsql reads it as the sample variance (check.py)


def is_aggregate(node: exp.Expression) -> bool:
    return isinstance(node, exp.AggFunc) or (isinstance(node, exp.Anonymous)
                                             and node.name.lower() in _duckdb_aggregates())


def has_aggregate(node: exp.Expression) -> bool:
    return any(is_aggregate(part) for part in node.walk())


# Substitution copies an expression into each place that names it, so nesting can double a query's size at each
# level (`SELECT a + a AS b FROM (SELECT x + x AS a ...)`): the size is bounded before anything is built from it.
MAX_PARTS = 20_000


def refuse_oversized(parts: int, what: str) -> None:
    if parts > MAX_PARTS:
        raise QueryRejected(f"{what} would have more than {MAX_PARTS} parts once written out in full: write it "
                            "with fewer repetitions")


class _CannotMerge(Exception):
    """The subquery is not a row-level one this stage merges exactly: left as written."""


@dataclass
class _Names:
    """The columns a FROM source exposes (lower-case name -> expression, None when ambiguous), in order."""

    qualifier: str | None  # the name that qualifies its columns (an alias or the table's name)
    columns: dict[str, exp.Expression | None]
    order: list[tuple[str, exp.Expression]]  # (name as written, expression), for SELECT *

    def find(self, column: exp.Column, where: str) -> exp.Expression | None:
        """The expression a column stands for, or None if it is not one of this source's (unqualified only)."""
        name = column.name.lower()
        if column.table:
            if self.qualifier is None or column.table.lower() != self.qualifier:
                raise ProgrammingError(f"{where}: column {column.sql(DIALECT)} does not name a table in FROM")
            if name not in self.columns:
                raise ProgrammingError(f"{where}: {self.qualifier} has no column '{column.name}' (it has: "
                                       f"{', '.join(n for n, _ in self.order)})")
        elif name not in self.columns:
            return None
        found = self.columns[name]
        if found is None:
            raise ProgrammingError(f"{where}: column '{column.name}' is ambiguous: the subquery has two of that name")
        return found


def _names(qualifier: str | None, order: list[tuple[str, exp.Expression]]) -> _Names:
    columns: dict[str, exp.Expression | None] = {}
    for name, expression in order:
        columns[name.lower()] = None if name.lower() in columns else expression
    return _Names(qualifier, columns, order)


def _renamed(order: list[tuple[str, exp.Expression]], alias: exp.TableAlias | None,
             what: str) -> list[tuple[str, exp.Expression]]:
    """Column aliases `AS t(a, b)` rename the first columns by position; more aliases than columns is an error."""
    renames = [c.name for c in alias.args.get("columns") or ()] if alias is not None else []
    if len(renames) > len(order):
        raise QueryRejected(f"{what} has {len(order)} columns but {len(renames)} column aliases were given")
    return [(renames[i] if i < len(renames) else name, e) for i, (name, e) in enumerate(order)]


def flatten(tree: exp.Select, policy: Policy) -> exp.Select:
    """Merge every mergeable subquery in FROM, deepest first, in place."""
    for select in reversed(list(tree.find_all(exp.Select))):  # breadth-first, reversed: inner before outer
        source = select.args.get("from_").this if select.args.get("from_") is not None else None
        try:
            if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select) and not any(
                    value for key, value in source.args.items() if key not in ("this", "alias")):
                _merge(select, source.this, source.args.get("alias"), policy, "the subquery")
            elif isinstance(source, exp.Table) and source.args.get("alias") is not None \
                    and source.args["alias"].args.get("columns"):
                _merge(select, exp.select("*").from_(_without_column_aliases(source)), source.args["alias"], policy,
                       f"FROM {source.sql(DIALECT)}: table {source.name}")
        except _CannotMerge:
            continue
        except ProgrammingError:
            if _in_expression(select):
                continue  # its names may be an enclosing query's (correlated): left for the checker to refuse
            raise
    return tree


def _in_expression(select: exp.Select) -> bool:
    """Whether the SELECT sits in an expression of another (IN, EXISTS, a scalar subquery), not in FROM or WITH."""
    node: exp.Expression = select
    while node.parent is not None:
        if isinstance(node.parent, exp.Select) and node.arg_key not in ("from_", "with_"):
            return True
        node = node.parent
    return False


def _without_column_aliases(table: exp.Table) -> exp.Table:
    bare = table.copy()
    bare.set("alias", None)
    return bare


def _table_names(table: exp.Table, policy: Policy) -> tuple[_Names, exp.Table]:
    """The columns of a declared table read in FROM (after its column aliases), and the table node to keep."""
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier) or any(
            table.args.get(k) for k in ("db", "catalog", "joins", "laterals", "pivots", "sample", "version")):
        raise _CannotMerge()
    declared = policy.table(table.name)
    if declared is None:
        raise _CannotMerge()  # the checker names the unknown table
    alias = table.args.get("alias")
    qualifier = (alias.name if alias is not None and alias.name else table.name)
    order = [(name, exp.column(name, table=qualifier)) for name in declared.columns]
    order = _renamed(order, alias, f"FROM {table.sql(DIALECT)}: table {table.name}")
    kept = table.copy()
    if alias is not None and alias.args.get("columns"):
        kept.set("alias", exp.TableAlias(this=exp.to_identifier(qualifier)))
    return _names(qualifier.lower(), order), kept


def _refuse_unsafe(node: exp.Expression) -> None:
    """Stop the merge where resolving names by hand would not be exact."""
    for part in node.walk():
        if isinstance(part, exp.Lambda | exp.Query | exp.Subquery | exp.Window | exp.Placeholder):
            raise _CannotMerge()  # lambda parameters, correlated names, OVER: not plain column references
        if isinstance(part, exp.Column) and (part.args.get("db") or part.args.get("catalog")):
            raise _CannotMerge()  # struct field access a.b.c
        if isinstance(part, exp.Func) and (part.name if isinstance(part, exp.Anonymous)
                                           else part.sql_name()).lower() in _VOLATILE:
            raise _CannotMerge()


def _substitute(node: exp.Expression, resolve) -> exp.Expression:
    """A copy of `node` with every column replaced by what `resolve` gives for it (parenthesised when inside an
    operator, so `a * 2` with a = x + 1 is (x + 1) * 2)."""
    node = node.copy()
    if isinstance(node, exp.Column):
        return resolve(node).copy()
    for column in list(node.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            raise _CannotMerge()
        replacement = resolve(column).copy()
        if not isinstance(replacement, exp.Column | exp.Literal | exp.Paren | exp.Func | exp.Boolean | exp.Null) \
                and not isinstance(column.parent, _WHOLE):
            replacement = exp.Paren(this=replacement)
        column.replace(replacement)
    refuse_oversized(sum(1 for _ in node.walk()), "the query's nested subqueries")
    return node


def _resolver(sources: list[_Names | dict[str, exp.Expression]], where: str):
    """Resolve a column against the sources in order: a source's columns, then alias maps (unqualified only)."""
    def resolve(column: exp.Column) -> exp.Expression:
        for source in sources:
            if isinstance(source, _Names):
                found = source.find(column, where)
            else:
                found = None if column.table else source.get(column.name.lower())
            if found is not None:
                return found
        known = [n for source in sources if isinstance(source, _Names) for n, _ in source.order]
        raise ProgrammingError(f"{where}: column '{column.sql(DIALECT)}' not found (FROM has: {', '.join(known)})")
    return resolve


def _inner_outputs(inner: exp.Select, policy: Policy) -> tuple[list[tuple[str, exp.Expression]],
                                                                  exp.Expression | None, exp.Table]:
    """The subquery's output columns (name, expression over its table) and its WHERE, resolved."""
    for clause, value in inner.args.items():
        if value and clause not in _INNER_CLAUSES:
            raise _CannotMerge()
    if has_aggregate(inner) or inner.args.get("from_") is None:  # no FROM: nothing to merge into
        raise _CannotMerge()
    table_names, table = _table_names(inner.args["from_"].this, policy)
    items = inner.expressions
    for item in items:
        _refuse_unsafe(item)
    outputs: list[tuple[str, exp.Expression]] = []
    aliases: dict[str, exp.Expression] = {}
    for item in items:
        star = _star(item)
        if star is not None:
            if any(star.args.get(k) for k in star.args if k != "this") or (
                    isinstance(item, exp.Column) and (item.table or "").lower() != table_names.qualifier):
                raise _CannotMerge()  # * EXCLUDE / REPLACE, or another table's star
            outputs += table_names.order
            continue
        value = _substitute(item.this if isinstance(item, exp.Alias) else item,
                            _resolver([table_names, dict(aliases)], "subquery SELECT"))
        if isinstance(item, exp.Alias):
            outputs.append((item.alias, value))
            aliases.setdefault(item.alias.lower(), value)
        elif isinstance(item, exp.Column):
            outputs.append((item.name, value))
        else:
            outputs.append(("", value))  # DuckDB names it after its text; not referable here
    where = inner.args.get("where")
    if where is not None:
        _refuse_unsafe(where)
        where = _substitute(where.this, _resolver([table_names, aliases], "subquery WHERE"))
    return outputs, where, table


def _merge(outer: exp.Select, inner: exp.Select, alias: exp.TableAlias | None, policy: Policy, what: str) -> None:
    for clause, value in outer.args.items():
        if value and clause not in _OUTER_CLAUSES:
            raise _CannotMerge()
    for clause, value in outer.args.items():
        if clause != "from_" and value:
            for node in value if isinstance(value, list) else [value]:
                if isinstance(node, exp.Expression) and any(
                        isinstance(p, exp.Lambda | exp.Placeholder | exp.Query | exp.Subquery) for p in node.walk()):
                    raise _CannotMerge()  # subqueries in expressions: the checker refuses them (or the core owns)
    outputs, inner_where, table = _inner_outputs(inner, policy)
    qualifier = alias.name.lower() if alias is not None and alias.name else None
    renamed = _renamed(outputs, alias, what)
    source = _names(qualifier, [(n, e) for n, e in renamed if n])
    items = _expand_stars(outer, source, all(n for n, _ in renamed))
    new_items: list[exp.Expression] = []
    aliases: dict[str, exp.Expression] = {}
    for item in items:
        value = _substitute(item.this if isinstance(item, exp.Alias) else item,
                            _resolver([source, dict(aliases)], "SELECT"))
        if isinstance(item, exp.Alias):
            new_items.append(exp.alias_(value, item.args["alias"].copy()))
            aliases.setdefault(item.alias.lower(), value)
        elif isinstance(item, exp.Column) and value != item:
            # keeps the output's name, and lets a bare ORDER BY name still find it as an alias
            new_items.append(exp.alias_(value, item.this.copy()))
        else:
            new_items.append(value)
    output_names = {i.alias_or_name.lower() for i in new_items if isinstance(i, exp.Alias | exp.Column)}
    resolve = _resolver([source, aliases], "the query over the subquery")
    resolved: dict[str, exp.Expression] = {}
    for clause in ("where", "having", "qualify"):
        node = outer.args.get(clause)
        if node is not None:
            if clause != "where" and any(not c.table and c.name.lower() in aliases and c.name.lower() in
                                         source.columns for c in node.find_all(exp.Column)):
                raise _CannotMerge()  # DuckDB reads such a name as the column only if it is a group key
            resolved[clause] = node.__class__(this=_substitute(node.this, resolve))
    group = outer.args.get("group")
    if group is not None:
        if any(v for k, v in group.args.items() if k != "expressions" and k != "all"):
            raise _CannotMerge()
        keys = [_positional_safe(_substitute(e, resolve), e) for e in group.expressions]
        resolved["group"] = exp.Group(expressions=keys, all=group.args.get("all"))
    distinct = outer.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        raise _CannotMerge()
    order = outer.args.get("order")
    if order is not None:
        ordered = []
        for item in order.expressions:
            target = item.this
            if not (isinstance(target, exp.Column) and not target.table and target.name.lower() in output_names):
                target = _positional_safe(_substitute(target, resolve), target)
            rewritten = item.copy()
            rewritten.set("this", target)
            ordered.append(rewritten)
        resolved["order"] = exp.Order(expressions=ordered)
    conditions = [c for c in (inner_where, resolved["where"].this if "where" in resolved else None) if c is not None]
    # Everything resolved: now change the tree, so a _CannotMerge above leaves it as written.
    outer.set("expressions", new_items)
    outer.set("from_", exp.From(this=table))
    outer.set("where", exp.Where(this=exp.and_(*conditions)) if conditions else None)
    for clause in ("having", "qualify", "group", "order"):
        if clause in resolved:
            outer.set(clause, resolved[clause])


def _star(item: exp.Expression) -> exp.Star | None:
    if isinstance(item, exp.Star):
        return item
    return item.this if isinstance(item, exp.Column) and isinstance(item.this, exp.Star) else None


def _expand_stars(outer: exp.Select, source: _Names, all_named: bool) -> list[exp.Expression]:
    """The outer select items with `*` spelt out as the subquery's columns, by name (a nested SELECT * reads
    every column of the one below). The outermost SELECT * is left for the checker to refuse as written."""
    items: list[exp.Expression] = []
    for item in outer.expressions:
        star = _star(item)
        if star is None:
            items.append(item)
            continue
        if outer.parent is None or any(star.args.get(k) for k in star.args if k != "this") or (
                isinstance(item, exp.Column) and item.table.lower() != source.qualifier):
            raise _CannotMerge()  # the query's own SELECT *, * EXCLUDE / REPLACE, or another table's star
        if not all_named or len(source.order) != len(source.columns):
            raise _CannotMerge()  # a star over a column without a name, or two columns of one name
        items += [exp.alias_(exp.column(name, table=source.qualifier) if source.qualifier else exp.column(name),
                             exp.to_identifier(name)) for name, _ in source.order]
    return items


def _positional_safe(replacement: exp.Expression, written: exp.Expression) -> exp.Expression:
    """GROUP BY and ORDER BY read a bare integer as a position: a name replaced by a constant cannot be merged."""
    if replacement is not written and not any(True for _ in replacement.find_all(exp.Column)) \
            and any(True for _ in written.find_all(exp.Column)):
        raise _CannotMerge()
    return replacement


def merge_join_members(tree: exp.Select, policy: Policy) -> None:
    """A row-level subquery joined to other tables (a CTE of a private table joined on the unit: `WITH p AS (SELECT
    patient_id, insurance FROM patients WHERE birth_year > 1950) ... JOIN p ON v.patient_id = p.patient_id`) is the
    table it reads, under the subquery's alias, with its WHERE where that table is joined: the outer WHERE for the
    first table in FROM (and for a comma join), the join's ON otherwise. Exact: `a JOIN (SELECT ... FROM t WHERE f)
    AS s ON c` keeps the pairs where c and f hold, which is `a JOIN t AS s ON c AND f`, also for the optional side
    of a LEFT join (a row of the kept side meeting no row of t that passes f keeps its NULLs either way); for the
    first table, and the kept side of a LEFT join, f only drops its own rows, which WHERE does too. Every reference
    to the subquery's columns becomes the expression it stands for (resolved as in `flatten`). A subquery this
    cannot merge exactly (aggregates, an unqualified name that another source may also have) is left as written."""
    for select in reversed(list(tree.find_all(exp.Select))):
        joins = select.args.get("joins")
        if not joins or select.args.get("from_") is None:
            continue
        for index in range(len(joins) + 1):
            source = ([select.args["from_"].this] + [j.this for j in select.args["joins"]])[index]
            if not isinstance(source, exp.Subquery) or not isinstance(source.this, exp.Select) or any(
                    value for key, value in source.args.items() if key not in ("this", "alias")):
                continue
            try:
                _merge_member(select, index, policy)
            except _CannotMerge:
                continue


# The clauses of a SELECT whose column references may name a joined source (its FROM sources aside).
_REFERRING = ("expressions", "where", "group", "having", "qualify", "order")


def _merge_member(select: exp.Select, index: int, policy: Policy) -> None:
    sources = [select.args["from_"].this] + [j.this for j in select.args["joins"]]
    source = sources[index]
    alias_node = source.args.get("alias")
    if alias_node is None or not alias_node.name:
        raise _CannotMerge()
    alias = alias_node.name
    outputs, where, table = _inner_outputs(source.this, policy)
    outputs = _renamed(outputs, alias_node, "the joined subquery")
    inner = table.alias_or_name.lower()

    def requalified(node: exp.Expression) -> exp.Expression:
        return node.transform(lambda n: exp.column(n.name, alias) if isinstance(n, exp.Column) and (
            n.table or "").lower() == inner else n)

    named = _names(alias.lower(), [(n, requalified(e)) for n, e in outputs if n])
    others = [columns_of(s, policy) for i, s in enumerate(sources) if i != index]
    join = select.args["joins"][index - 1] if index else None
    inner_join = join is not None and not join.args.get("side") and (join.args.get("kind") or "").upper() in (
        "", "INNER", "CROSS")
    # Where the subquery's WHERE goes: the outer WHERE for the first table and an inner join without ON (a comma or
    # USING join), the join's ON otherwise.
    in_where = join is None or (join.args.get("on") is None and inner_join)
    if join is not None and join.args.get("using"):
        for name in join.args["using"]:
            found = named.columns.get(name.name.lower())
            if not (isinstance(found, exp.Column) and found.name.lower() == name.name.lower()):
                raise _CannotMerge()  # USING names a column the table has under another name, or an expression
    if not in_where and join.args.get("on") is None:
        raise _CannotMerge()  # an outer join without ON: nowhere exact to put the filter

    def replace(column: exp.Column, nested: bool) -> exp.Expression | None:
        if column.table:
            return named.find(column, "the joined subquery") if column.table.lower() == alias.lower() else None
        name = column.name.lower()
        if nested or name not in named.columns:
            return None
        if any(names is None for names in others):
            raise _CannotMerge()  # another source's columns are not known here: the name might be its
        if any(name in names for names in others):
            return None  # ambiguous: DuckDB refuses it, and so will the checker
        return named.find(column, "the joined subquery")

    rewritten: dict[str, exp.Expression] = {}
    for key in _REFERRING:
        value = select.args.get(key)
        if value:
            rewritten[key] = [_replaced(v, replace) for v in value] if isinstance(value, list) else \
                _replaced(value, replace)
    ons = [_replaced(j.args["on"], replace) if j.args.get("on") is not None else None for j in select.args["joins"]]
    # Everything resolved: now change the tree.
    for key, value in rewritten.items():
        select.set(key, value)
    for j, on in zip(select.args["joins"], ons, strict=True):
        if on is not None:
            j.set("on", on)
    kept = table.copy()
    kept.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    source.replace(kept)
    if where is None:
        return
    condition = requalified(where)
    if in_where:
        current = select.args.get("where")
        select.set("where", exp.Where(this=exp.and_(condition, current.this) if current is not None else condition))
    else:
        join.set("on", exp.and_(join.args["on"], condition))


def _replaced(node: exp.Expression, replace) -> exp.Expression:
    """A copy of `node` with each column `replace` gives an expression for replaced by it (parenthesised inside an
    operator); `replace` is told whether the column sits in a nested query (where only qualified names are ours)."""
    node = node.copy()
    for column in list(node.find_all(exp.Column)):
        if isinstance(column.this, exp.Star):
            continue
        nested = False
        parent = column.parent
        while parent is not None and parent is not node:
            if isinstance(parent, exp.Query | exp.Subquery):
                nested = True
                break
            parent = parent.parent
        found = replace(column, nested)
        if found is None:
            continue
        found = found.copy()
        if not isinstance(found, exp.Column | exp.Literal | exp.Paren | exp.Func | exp.Boolean | exp.Null) \
                and not isinstance(column.parent, _WHOLE):
            found = exp.Paren(this=found)
        if column is node:
            return found
        column.replace(found)
    refuse_oversized(sum(1 for _ in node.walk()), "the query's joined subqueries")
    return node
