"""Stage 1b, between parse and check: rewrite the SQL analysts type into the one-SELECT form the checker reads.

Each rewrite gives the same result as the written query, row for row, on every database (the reasons are beside
each one, and tests/test_normalize.py runs generated queries both ways in DuckDB):
- CTEs are inlined as subqueries (`WITH a AS (q) ... FROM a` is `FROM (q) AS a`, by definition of a non-recursive
  CTE over deterministic SQL; one used twice is inlined twice);
- row-level subqueries in FROM, and column aliases on a table, are merged into the SELECT that reads them
  (analysis/flatten.py);
- GROUP BY ALL becomes the list of select items it stands for;
- an aggregate's FILTER (WHERE c) moves into its argument as CASE WHEN c THEN x END;
- `x IN (SELECT ...)` over public tables only becomes `x IN (v1, v2, ...)`, the subquery's values: they are public
  data, read from the public tables (the one place this stage reads data, and never a private row);
- `unit IN (SELECT unit FROM private_table WHERE ...)`, a condition of the WHERE, becomes a join with that table's
  qualifying units, one row each: the checker's join rules then decide (the same privacy unit on both sides);
- `EXISTS (SELECT ... FROM t WHERE t.k = outer.x AND ...)`, a condition of the WHERE, is `outer.x IN (SELECT t.k
  FROM t WHERE ...)`, and goes the two ways above;
- joins as written (written_joins.py): RIGHT JOIN mirrored, comma joins on their WHERE equalities, conditions in ON
  beside the keys moved to where they filter; and a row-level subquery joined merged into the join (flatten.py);
- subqueries of public tables read at check time (public_relations.py): one in FROM or JOIN is its rows, written
  into the SQL; a scalar one its value; an uncorrelated EXISTS its truth.
EXISTS and IN left in WHERE (under OR or NOT, correlated beyond one key) are the checker's semi-joins (semijoins.py).
The checker then sees one SELECT over one table, and what it checks is what runs: nothing here reads the data, and
the rewrite neither adds a row nor a column the written query did not read. What it cannot rewrite exactly stays
as written, for the checker to refuse or to handle. The outputs keep the names the analyst's SQL gives them.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.analysis.check import written_output_names
from dpsql.analysis.flatten import flatten, has_aggregate, merge_join_members, refuse_oversized
from dpsql.analysis.public_facts import PublicFacts
from dpsql.analysis.public_query import public_sql
from dpsql.analysis.public_relations import materialize
from dpsql.analysis.written_joins import has_written_joins, join_filters, written_joins
from dpsql.errors import QueryRejected
from dpsql.policy import Policy
from dpsql.sql.parse import DIALECT, ParsedQuery, literal

# Aggregates that skip NULL arguments (so a FILTER can become a CASE without ELSE inside them) and read their
# filtered values from `this` only (a quantile's fraction is a constant argument beside it).
_NULL_SKIPPING = tuple(getattr(exp, name) for name in (
    "Count", "Sum", "Avg", "Min", "Max", "Variance", "VariancePop", "Stddev", "StddevPop", "StddevSamp", "Median",
    "Quantile", "PercentileCont", "PercentileDisc", "ApproxQuantile") if hasattr(exp, name))


def normalize(parsed: ParsedQuery, policy: Policy, facts: PublicFacts | None = None) -> ParsedQuery:
    """The query in the checker's form; the very same ParsedQuery when there is nothing to rewrite. `facts` reads
    public tables (for IN over them); without it such an IN is left as written."""
    if not _has_work(parsed.tree):
        return parsed
    tree = parsed.tree.copy()
    _inline_ctes(tree, policy)
    written_joins(tree, policy)
    if facts is not None:
        materialize(tree, policy, facts)
    merge_join_members(tree, policy)
    join_filters(tree, policy)
    if facts is not None:
        materialize(tree, policy, facts)  # the public tables a LEFT join's ON filtered
    _exists_as_in(tree, policy)
    if facts is not None:
        _public_in_lists(tree, policy, facts)
    flatten(tree, policy)
    _unit_semijoins(tree, policy)
    _expand_group_by_all(tree)
    _unfilter_aggregates(tree)
    return replace(parsed, tree=tree, output_names=written_output_names(parsed))


def _has_work(tree: exp.Select) -> bool:
    if has_written_joins(tree):
        return True
    for node in tree.walk():
        if isinstance(node, exp.With | exp.Subquery | exp.Filter):
            return True
        if isinstance(node, exp.Group) and node.args.get("all"):
            return True
        if isinstance(node, exp.TableAlias) and node.args.get("columns"):
            return True
        if isinstance(node, exp.In | exp.Exists):
            return True
    return False


# The most values an IN list read from a public table may hold (as many as a declared public domain).
MAX_IN_VALUES = 10_000


def _public_in_lists(tree: exp.Select, policy: Policy, facts: PublicFacts) -> None:
    """`x IN (SELECT c FROM departments WHERE ...)`, where the subquery reads declared public tables only (and is
    not correlated: it runs on its own), is `x IN (v1, ..., vn)` with its distinct values: the same truth value for
    every x, NULL among the values included (so NOT IN keeps its NULL semantics), and FALSE for no values (as IN
    over an empty subquery is). The values are public data; the checker then sees a plain IN list, whose per-row
    cost it bounds as any other. A subquery that reads a private table, fails on its own or returns more than
    MAX_IN_VALUES values is left as written, for the checker to refuse."""
    for node in list(tree.find_all(exp.In)):
        query = node.args.get("query")
        if query is None:
            continue
        inner = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(inner, exp.Query):
            continue
        try:
            resolved = public_sql(inner, policy)
        except QueryRejected:
            continue
        values = facts.values(resolved, MAX_IN_VALUES) if resolved is not None else None
        if values is None:
            continue
        listed = exp.In(this=node.this.copy(), expressions=[literal(v) for v in values]) if values else exp.false()
        node.replace(listed)


def _inline_ctes(tree: exp.Select, policy: Policy) -> None:
    """Replace each reference to a CTE by a copy of its query, innermost WITH first, so that a nested WITH's
    names shadow the outer ones exactly where SQL says they do."""
    for query in reversed(list(tree.find_all(exp.Query))):
        with_ = query.args.get("with_")
        if with_ is None:
            continue
        if with_.args.get("recursive"):
            raise QueryRejected("WITH RECURSIVE is not supported: a recursive query can loop over the rows any "
                                "number of times, so no bound on one person's contribution follows from the SQL")
        ctes = list(with_.expressions)
        query.set("with_", None)
        for i, cte in enumerate(ctes):
            name = cte.alias_or_name
            if policy.table(name) is not None:
                raise QueryRejected(f"WITH {name} AS (...): '{name}' is the name of a declared table; a CTE of that "
                                    "name would make it mean two things in one query (the policy's bounds and "
                                    "privacy unit belong to the table): give the CTE another name")
            scopes = [later.this for later in ctes[i + 1:]] + [query]
            references = [t for scope in scopes for t in scope.find_all(exp.Table) if _names_cte(t, name)]
            # checked before copying, so a chain of CTEs each read twice cannot grow the tree exponentially
            refuse_oversized(sum(1 for _ in tree.walk()) + len(references) * sum(1 for _ in cte.this.walk()),
                             "the query with its CTEs inlined")
            for table in references:
                table.replace(_inlined(cte, table))


def _exists_as_in(tree: exp.Select, policy: Policy) -> None:
    """`EXISTS (SELECT ... FROM t [AS a] WHERE a.k = o.x AND rest)`, one of the AND-ed conditions of the outer WHERE,
    where o is the outer query's and rest reads t only: `o.x IN (SELECT a.k FROM t AS a WHERE rest)`. In a condition
    of the WHERE the two keep the same rows: both are TRUE exactly when some row of t with rest has k = x (IN may
    be NULL where EXISTS is FALSE, and WHERE drops both). Under NOT or OR they differ on NULLs, so only the AND-ed
    conditions are rewritten; the rest stays for the checker to refuse."""
    where = tree.args.get("where")
    if where is None:
        return
    conditions = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    rewritten = [_exists_in(c, policy) if isinstance(c, exp.Exists) else None for c in conditions]
    if any(r is not None for r in rewritten):
        where.set("this", exp.and_(*[r if r is not None else c for r, c in zip(rewritten, conditions, strict=True)]))


def _exists_in(exists: exp.Exists, policy: Policy) -> exp.In | None:
    inner = exists.this
    source = inner.args.get("from_") if isinstance(inner, exp.Select) else None
    if source is None or not isinstance(source.this, exp.Table) or inner.args.get("where") is None or any(
            inner.args.get(k) for k in ("joins", "group", "having", "limit", "offset", "distinct", "with_", "qualify",
                                        "windows", "laterals")) or has_aggregate(inner):
        return None
    table = policy.table(source.this.name) if isinstance(source.this.this, exp.Identifier) else None
    if table is None:
        return None
    own = {source.this.alias_or_name.lower()}  # an aliased table is named by its alias only (as in DuckDB)

    def is_inner(column: exp.Column) -> bool:
        return column.table.lower() in own if column.table else column.name in table.columns
    condition = inner.args["where"].this
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    for i, part in enumerate(parts):
        if not isinstance(part, exp.EQ) or not all(isinstance(side, exp.Column) for side in (part.this,
                                                                                              part.expression)):
            continue
        sides = [part.this, part.expression]
        inside = [side for side in sides if is_inner(side)]
        outside = [side for side in sides if side.table and side.table.lower() not in own]
        rest = parts[:i] + parts[i + 1:]
        if len(inside) != 1 or len(outside) != 1 or any(not is_inner(c) for r in rest for c in r.find_all(exp.Column)):
            continue
        keys = exp.select(inside[0].copy()).from_(source.this.copy())
        if rest:
            keys = keys.where(exp.and_(*[r.copy() for r in rest]))
        return exp.In(this=outside[0].copy(), query=keys.subquery())
    return None


def _unit_semijoins(tree: exp.Select, policy: Policy) -> None:
    """`u IN (SELECT u2 FROM t2 [WHERE c])` as one of the AND-ed conditions of the outer WHERE, t2 a private table:
    the rows whose u is one of the units t2 has a row with c for. That is an inner join with those units, grouped
    so that each appears once (no row is repeated): `JOIN (SELECT u2 AS k FROM t2 WHERE c GROUP BY u2) AS k ON
    u = k.k`. The checker then applies its join rules, so this is accepted only when u and u2 are the same privacy
    unit: a per-unit subquery with one row per unit (m = 1), which does not raise the outer bound. One difference
    with the written IN, and it is the price of the bound: t2's rows are capped at its max_rows_per_unit before c is
    applied, so a unit whose only qualifying row is beyond the cap does not qualify (none can be, when t2 has one row
    per unit, as a person table does). Under OR or NOT the IN is left as written (a join only ANDs), and refused."""
    where = tree.args.get("where")
    if where is None:
        return
    conditions = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    kept, joins = [], []
    for condition in conditions:
        # The joins are added after all conditions are read: a second IN would otherwise see the first one's join
        # and find its unqualified column ambiguous.
        join = _unit_semijoin(condition, tree, policy, {j.alias_or_name for j in joins})
        if join is None:
            kept.append(condition)
        else:
            joins.append(join)
    for join in joins:
        tree.append("joins", join)
    if len(kept) < len(conditions):
        tree.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)


def _unit_semijoin(condition: exp.Expression, tree: exp.Select, policy: Policy,
                   added: set[str] = frozenset()) -> exp.Join | None:
    query = condition.args.get("query") if isinstance(condition, exp.In) else None
    inner = query.this if isinstance(query, exp.Subquery) else query
    if not isinstance(condition.this, exp.Column) or not isinstance(inner, exp.Select):
        return None
    source = inner.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or len(inner.expressions) != 1 or any(
            inner.args.get(k) for k in ("joins", "group", "having", "order", "limit", "offset", "distinct", "with_",
                                        "qualify", "windows", "laterals")):
        return None
    selected = inner.expressions[0].unalias()
    table = policy.table(source.this.name) if isinstance(source.this.this, exp.Identifier) else None
    if not isinstance(selected, exp.Column) or table is None or table.public or has_aggregate(inner) \
            or selected.name != table.privacy_unit:
        return None
    outer_table = tree.args["from_"].this
    if isinstance(outer_table, exp.Table) and not tree.args.get("joins"):
        declared = policy.table(outer_table.name)
        if declared is None or condition.this.name != declared.privacy_unit:
            return None  # not the unit on the outer side either: left as written, and refused as a subquery
    own = {source.this.alias_or_name.lower()}  # an aliased table is named by its alias only (as in DuckDB)
    for column in inner.find_all(exp.Column):  # correlated: it reads the outer query, which a join cannot
        if column.table.lower() not in own if column.table else column.name not in table.columns:
            return None
    outer = condition.this.copy()
    if not outer.table:
        if tree.args.get("joins") or not isinstance(tree.args["from_"].this, exp.Table):
            return None  # the unqualified name could mean another table's column once joined
        outer.set("table", exp.to_identifier(tree.args["from_"].this.alias_or_name))
    taken = {i.name.lower() for i in tree.find_all(exp.Identifier)} | added
    alias = next(name for name in (f"semijoin_{n}" for n in range(1, 10_000)) if name not in taken)
    units = exp.select(exp.alias_(selected.copy(), alias)).from_(source.this.copy())
    if inner.args.get("where") is not None:
        units = units.where(inner.args["where"].this.copy())
    units = units.group_by(selected.copy())
    return exp.Join(this=units.subquery(alias), on=exp.EQ(this=outer, expression=exp.column(alias, alias)))


def _names_cte(table: exp.Table, name: str) -> bool:
    return (isinstance(table.this, exp.Identifier) and table.name.lower() == name.lower()
            and not table.args.get("db") and not table.args.get("catalog"))


def _inlined(cte: exp.CTE, table: exp.Table) -> exp.Subquery:
    """`FROM a AS b(x)` for the CTE `a(p, q) AS (body)`: `FROM (body) AS b(x, q)`."""
    if any(table.args.get(k) for k in ("joins", "laterals", "pivots", "sample", "version")):
        raise QueryRejected(f"FROM {table.sql(DIALECT)}: this form of reading a CTE is not supported")
    reference = table.args.get("alias")
    written = list(reference.args.get("columns") or ()) if reference is not None else []
    declared = list(cte.args["alias"].args.get("columns") or ())
    columns = [c.copy() for c in written + declared[len(written):]]
    name = reference.this.copy() if reference is not None and reference.this else exp.to_identifier(table.name)
    return exp.Subquery(this=cte.this.copy(), alias=exp.TableAlias(this=name, columns=columns or None))


def _expand_group_by_all(tree: exp.Select) -> None:
    """GROUP BY ALL is DuckDB's GROUP BY every select item that holds no aggregate and reads some column (a
    constant item is not a key: `SELECT 1, COUNT(*) ... GROUP BY ALL` gives one row even on no rows)."""
    for select in tree.find_all(exp.Select):
        group = select.args.get("group")
        if group is None or not group.args.get("all"):
            continue
        items = [item.this if isinstance(item, exp.Alias) else item for item in select.expressions]
        if any(isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
               or any(isinstance(p, exp.Window) for p in item.walk()) for item in items):
            continue  # SELECT * or a window: left as written, for the checker to refuse
        keys = [item.copy() for item in items
                if not has_aggregate(item) and any(item.find_all(exp.Column))]
        select.set("group", exp.Group(expressions=keys) if keys else None)


def _unfilter_aggregates(tree: exp.Select) -> None:
    """AGG(x) FILTER (WHERE c) is AGG(CASE WHEN c THEN x END): the rows where c is not TRUE give NULL, which these
    aggregates skip, and that is what FILTER means (COUNT(*) counts the rows where c is TRUE: COUNT of a CASE that
    is 1 there and NULL elsewhere). An empty selection gives what it gives with FILTER: COUNT 0, the others NULL."""
    for node in list(tree.find_all(exp.Filter)):
        call, condition = node.this, node.expression.this
        slot = "this"
        if isinstance(call, exp.Anonymous) and call.name.lower() == "var" and len(call.expressions) == 1:
            slot = "expressions"  # VAR(x), the sample variance, which sqlglot reads as an anonymous call
        elif not isinstance(call, _NULL_SKIPPING):
            continue  # left as written: the checker refuses FILTER on it
        argument = call.this if slot == "this" else call.expressions[0]
        unfiltered = call.copy()
        if isinstance(argument, exp.Distinct):
            # AGG(DISTINCT x) FILTER (WHERE c) is AGG(DISTINCT CASE WHEN c THEN x END): the distinct non-NULL
            # values among the rows where c is TRUE, which DISTINCT skips NULL for.
            if len(argument.expressions) != 1 or slot != "this":
                continue  # DISTINCT of several expressions, VAR(DISTINCT x): left as written, for the checker
            case = exp.Case(ifs=[exp.If(this=condition.copy(), true=argument.expressions[0].copy())])
            unfiltered.set(slot, exp.Distinct(expressions=[case]))
            node.replace(unfiltered)
            continue
        value = exp.Literal.number(1) if argument is None or isinstance(argument, exp.Star) else argument
        case = exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])
        unfiltered.set(slot, case if slot == "this" else [case])
        node.replace(unfiltered)
