"""Semi- and anti-joins in general form: EXISTS, NOT EXISTS, and IN on the unit, anywhere in WHERE (under OR and
NOT), correlated by more than one equality. Each becomes a *semi-join flag*: a boolean column of the relation
(relation.py) that tells, for each joined row, whether the subquery has a row for it; the WHERE then reads it.

Which subqueries, and why one person still moves the answer by at most the plan's sensitivity:
- `EXISTS (SELECT ... FROM t AS a WHERE a.u = o.u AND <conditions>)` with t a private table of the relation's unit,
  correlated on t's unit column equal to the unit of a row o of the relation: t's rows are capped at its m_t first
  (its prepared rank), and only rows of o's own unit can satisfy the equality. So the semi-join's value on o depends on
  o's unit's rows alone (its values and its own rows of t): it is a row filter, and keeps the relation's m (a unit's
  rows are still at most m, and removing a unit changes no other unit's rows or flags). The conditions may read t
  and o in any way (`a.lab_date > o.visit_date`), and the semi-join may stand anywhere in WHERE: under NOT (an
  anti-join: "no lab after the visit"), under OR. `o.u IN (SELECT a.u FROM t AS a WHERE c)` is the same semi-join (the
  unit is never NULL on either side, so IN and EXISTS agree, also under NOT).
- `EXISTS (SELECT ... FROM p AS a WHERE a.k = o.x AND <conditions>)` with p a public table or public relation,
  correlated on equalities of plain columns (of one type, not float: relation.py's key rule): public data, so the
  semi-join is a function of o's values alone, a row filter again. (With one equality and conditions on p alone, and
  not AND-ed, normalize.py writes it as an IN list instead.)

Work: each of a person's rows meets at most m_t (or k, the public rows per key) rows of the probed table, on which
the conditions run: person_work counts it as a join stage plus the conditions' cost on those pairs. Gates: a private
table's rows beyond its cap never meet a condition (a CASE on their rank comes first), and the relation's rows are
capped before the semi-join runs (it is a column of the capped rows).
Refused, each with its rule: a semi-join over a private table of another unit, or not correlated on its unit column; a
subquery with joins, grouping, aggregates, LIMIT or DISTINCT, or nested subqueries; an IN not on the unit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sqlglot import exp

from dpsql.analysis import person_work
from dpsql.analysis.public_facts import PublicFacts
from dpsql.analysis.public_relations import PublicRelation, public_relation
from dpsql.analysis.typecheck import Kind, typed_expression
from dpsql.analysis.vetting import may_fail, vet_row_expression
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.policy import ColumnPolicy, ColumnType, Policy, TablePolicy, WorkLimits
from dpsql.sql import names
from dpsql.sql.parse import DIALECT

FLAG = "__dp_semijoin"  # the flag columns' names: FLAG0, FLAG1, ...
_FORBIDDEN = ("joins", "group", "having", "limit", "offset", "distinct", "with_", "qualify", "windows", "laterals",
              "order", "pivots", "sample")


@dataclass(frozen=True)
class SemiJoin:
    flag: str  # the column of the relation holding it
    written: str  # the subquery as written, for messages and explain
    table: TablePolicy  # the probed table (a public relation's schema for one)
    alias: str  # its alias in the subquery
    relation: PublicRelation | None  # a public relation's rows, or None for a declared table
    source: exp.Expression  # the probed FROM source as written
    keys: tuple[tuple[str, exp.Column], ...]  # (column of the probed table, column of the outer query)
    residual: exp.Expression | None  # the other conditions: probed columns qualified by `alias`, outer ones by theirs


def has_semijoins(tree: exp.Select) -> bool:
    where = tree.args.get("where")
    return where is not None and bool(_candidates(where.this))


def extract(tree: exp.Select, policy: Policy, outer: dict[str, set[str] | None],
            carrier: str) -> tuple[exp.Select, tuple[SemiJoin, ...]]:
    """The query with each EXISTS and IN (SELECT ...) of its WHERE that is a semi-join replaced by a flag column
    qualified by `carrier` (an outer alias), and the semi-joins. `outer` maps each alias of the outer FROM to its
    columns (None: unknown). A subquery that is no semi-join at all (not over one known table, or not correlated by
    an equality, or an IN not on a private table's unit) is left as written, for the checker to refuse with the
    forms it answers; one that is a semi-join but breaks a rule is refused here, with the rule."""
    where = tree.args.get("where")
    if where is None or not _candidates(where.this):
        return tree, ()
    tree = tree.copy()
    outer = {alias.lower(): columns for alias, columns in outer.items()}
    found: list[SemiJoin] = []
    for node in _candidates(tree.args["where"].this):
        semijoin = _semijoin(node, policy, outer, f"{FLAG}{len(found)}")
        if semijoin is not None:
            found.append(semijoin)
            node.replace(exp.column(semijoin.flag, carrier))
    return tree, tuple(found)


def _candidates(condition: exp.Expression) -> list[exp.Expression]:
    """The EXISTS nodes and IN (SELECT ...) nodes of a condition, outside any nested query, in the order written."""
    found, stack = [], [condition]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Exists) or (isinstance(node, exp.In) and node.args.get("query") is not None):
            found.append(node)
        elif not isinstance(node, exp.Query | exp.Subquery):
            stack.extend(reversed(list(node.iter_expressions())))
    return found


def _semijoin(node: exp.Expression, policy: Policy, outer: dict[str, set[str] | None], flag: str) -> SemiJoin | None:
    written = node.sql(DIALECT)
    inner = node.this if isinstance(node, exp.Exists) else node.args["query"]
    inner = inner.this if isinstance(inner, exp.Subquery) else inner
    rule = (f"{written}: EXISTS and IN (SELECT ...) are answered over one table: a private table of the query's "
            "privacy unit correlated on its unit column (a.unit = outer.unit AND ...), or a public table correlated "
            "on equal columns (a.key = outer.column AND ...)")
    if not isinstance(inner, exp.Select) or any(inner.args.get(k) for k in _FORBIDDEN) or any(
            isinstance(n, exp.AggFunc) for n in inner.walk()):
        return None  # joins, GROUP BY, aggregates, ORDER BY, LIMIT, DISTINCT: not a semi-join
    source = inner.args["from_"].this if inner.args.get("from_") is not None else None
    relation = public_relation(source) if source is not None else None
    if relation is not None:
        table = relation.schema
    elif isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier) and not any(
            source.args.get(k) for k in ("db", "catalog", "joins", "laterals", "pivots")) \
            and policy.table(source.name) is not None:
        table = policy.table(source.name)
        if source.args.get("alias") is not None and source.args["alias"].args.get("columns"):
            raise QueryRejected(f"{rule}; column aliases on its table (AS t(x, ...)) are not")
    else:
        return None  # no table, an unknown one, a subquery: not a semi-join
    if isinstance(node, exp.In) and not _on_the_unit(node, inner, table):
        return None
    alias = source.alias_or_name.lower()
    if alias in outer:
        raise QueryRejected(f"{rule}; its table's alias '{alias}' is also an alias of the outer query: rename it")
    conditions = _conjuncts(inner.args["where"].this) if inner.args.get("where") is not None else []
    if isinstance(node, exp.In):
        conditions.append(_in_equality(node, inner, alias, outer, rule))
    keys: list[tuple[str, exp.Column]] = []
    residual: list[exp.Expression] = []
    for condition in conditions:
        if any(isinstance(n, exp.Query | exp.Subquery) for n in condition.walk()):
            raise QueryRejected(f"{rule}; a subquery inside it is not")
        located = _located(condition, table, alias, outer, rule)
        key = _key(located, alias)
        if key is not None:
            keys.append(key)
        else:
            residual.append(located)
    if not keys:
        return None  # not correlated by an equality: not a semi-join
    return SemiJoin(flag, written, table, alias, relation, source, tuple(keys),
                 exp.and_(*residual) if residual else None)


def _on_the_unit(node: exp.In, inner: exp.Select, table: TablePolicy) -> bool:
    """`o.x IN (SELECT a.u FROM t AS a ...)` with u the unit of private t: the IN a semi-join answers (the unit is never
    NULL, nor is the outer unit, which the checker verifies the column is), where IN and EXISTS agree on every row,
    also under NOT."""
    selected = inner.expressions[0].unalias() if len(inner.expressions) == 1 else None
    return (not table.public and table.privacy_unit is not None and isinstance(selected, exp.Column)
            and selected.name.lower() == table.privacy_unit and isinstance(node.this, exp.Column))


def _in_equality(node: exp.In, inner: exp.Select, alias: str, outer: dict[str, set[str] | None],
                 rule: str) -> exp.Expression:
    """The IN as the equality a.u = o.x of the EXISTS it is (`_on_the_unit`)."""
    mine = exp.column(inner.expressions[0].unalias().name.lower(), alias)
    theirs = node.this.copy()
    if not theirs.table:  # the outer query's column, named without its table: the one source that has it
        owners = [a for a, columns in outer.items() if columns is None or theirs.name.lower() in columns]
        if len(owners) != 1:
            raise QueryRejected(f"{rule}; qualify {theirs.sql(DIALECT)} with its table")
        theirs = exp.column(theirs.name.lower(), owners[0])
    return exp.EQ(this=mine, expression=theirs)


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    bare = condition.unnest()
    return [c.copy() for c in bare.flatten()] if isinstance(bare, exp.And) else [condition.copy()]


def _located(condition: exp.Expression, table: TablePolicy, alias: str, outer: dict[str, set[str] | None],
             rule: str) -> exp.Expression:
    """The condition with every column qualified: by `alias` for the probed table's (a bare name is the probed
    table's first, as SQL resolves it), by its own alias for the outer query's (which must be written qualified)."""
    def qualify(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        name, owner = node.name.lower(), node.table.lower()
        if not owner:
            if name in table.columns:
                return exp.column(name, alias)
            raise QueryRejected(f"{rule}; the column '{node.name}' is not {alias}'s: qualify the outer query's "
                                "columns with their table (o.x)")
        if owner == alias and name not in table.columns:
            raise ProgrammingError(f"{alias} has no column '{node.name}' (it has: {', '.join(table.columns)})")
        if owner != alias and owner not in outer:
            raise ProgrammingError(f"column {node.sql(DIALECT)} does not name a table in FROM")
        if owner != alias and outer[owner] is not None and name not in outer[owner]:
            raise ProgrammingError(f"{owner} has no column '{node.name}'")
        return exp.column(name, owner)
    return condition.transform(qualify)


def _key(condition: exp.Expression, alias: str) -> tuple[str, exp.Column] | None:
    """`a.k = o.x` of plain columns, one of the probed table and one of the outer query: (k, o.x)."""
    bare = condition.unnest()
    if not isinstance(bare, exp.EQ):
        return None
    sides = [side.unnest() for side in (bare.this, bare.expression)]
    if not all(isinstance(side, exp.Column) for side in sides):
        return None
    mine = [side for side in sides if side.table == alias]
    theirs = [side for side in sides if side.table != alias]
    if len(mine) != 1 or len(theirs) != 1:
        return None
    return mine[0].name, theirs[0]




@dataclass(frozen=True)
class Outer:
    """A FROM source of the relation, as a semi-join sees it."""

    table: TablePolicy
    physical: str  # its alias in the relation's SQL
    unit: bool  # whether its unit column holds the relation's unit (a private source: first, or INNER-joined on it)


@dataclass(frozen=True)
class CheckedSemiJoin:
    semijoin: SemiJoin
    rows: int  # the most rows of the probed table one row of the relation meets (m_t, or k)
    steps: tuple[str, ...]  # for explain
    work: tuple[person_work.WorkTerm, ...]
    sql: exp.Exists  # the flag's value over the relation's row, in the relation's SQL


def checked(semijoin: SemiJoin, index: int, outer: dict[str, Outer], unit: str | None, m: int,
            facts: PublicFacts | None, limits: WorkLimits) -> CheckedSemiJoin:
    """The semi-join's rules (module docstring), its bound on the rows each relation row meets, its work, and its SQL.
    `unit`: the relation's unit label (None under row privacy); `m`: the relation's rows of one person."""
    table, alias = semijoin.table, semijoin.alias
    if table.public:
        rows = _public_rows_per_key(semijoin, outer, facts)
        how = (f"public {'relation' if semijoin.relation is not None else 'table'} '{alias}' probed on "
               f"({', '.join(k for k, _ in semijoin.keys)}): at most {rows} row(s) share one value")
    else:
        _check_private(semijoin, outer, unit)
        rows = table.bound.max_rows
        how = (f"private table '{table.name}' probed on its unit column, capped at {rows} row(s) per unit: each row "
               f"meets at most {rows} row(s) of its own unit")
    pairs = m * rows
    if pairs > limits.max_joined_rows:
        raise QueryRejected(f"{semijoin.written}: one person's rows could meet {pairs} rows of {table.name} (the "
                            f"policy allows {limits.max_joined_rows}: [engine] max_joined_rows)")
    residual, cost = _residual(semijoin, outer, index)
    step = f"{semijoin.written}: {how}; a row filter, m stays {m}"
    work = [*person_work.join_terms(f"EXISTS over {table.name} {alias}", m, pairs)]
    if residual is not None:
        work.append(person_work.WorkTerm(f"the conditions of {semijoin.written}", pairs, cost))
    return CheckedSemiJoin(semijoin, rows, (step,), tuple(work), _sql(semijoin, index, outer, residual))


def _public_rows_per_key(semijoin: SemiJoin, outer: dict[str, Outer], facts: PublicFacts | None) -> int:
    for mine, other in semijoin.keys:
        mine_type = semijoin.table.columns[mine].type
        other_type = outer[other.table].table.columns[other.name].type
        if mine_type is not other_type or mine_type is ColumnType.FLOAT:
            raise QueryRejected(f"{semijoin.written}: a public table is probed on equal columns of one type, not float "
                                f"(as a join key): {semijoin.alias}.{mine} is {mine_type.value}, "
                                f"{other.sql(DIALECT)} is {other_type.value}")
    keys = tuple(dict.fromkeys(mine for mine, _ in semijoin.keys))
    if semijoin.relation is not None:
        return max(semijoin.relation.max_rows_per_key(keys), 1)
    if facts is None:
        raise QueryRejected(f"{semijoin.written}: this engine cannot read public tables")
    return max(facts.max_rows_per_key(semijoin.table.name, keys), 1)


def _check_private(semijoin: SemiJoin, outer: dict[str, Outer], unit: str | None) -> None:
    table = semijoin.table
    rule = (f"{semijoin.written}: a private table is probed only on its unit column, equal to the unit of the outer "
            "query's rows (a.unit = outer.unit), so that only a person's own rows can meet them")
    if table.row_privacy or table.privacy_unit is None or unit is None:
        raise QueryRejected(f"{rule}; a table with row privacy has no unit")
    if table.unit != unit:
        raise QueryRejected(f"{rule}; '{table.name}' has the unit '{table.unit}', the query's rows '{unit}'")
    for mine, other in semijoin.keys:
        source = outer[other.table]
        if mine == table.privacy_unit and source.unit and other.name == source.table.privacy_unit:
            return
    raise QueryRejected(f"{rule}; no condition equals '{semijoin.alias}.{table.privacy_unit}' to such a unit column")


def _residual(semijoin: SemiJoin, outer: dict[str, Outer], index: int) -> tuple[exp.Expression | None, int]:
    """The semi-join's other conditions, type-checked over the probed table's and the outer query's columns and made
    total (typecheck.py), with each column its physical one; and their cost on one pair of rows."""
    if semijoin.residual is None:
        return None, 0
    place = f"the conditions of {semijoin.written}"
    vet_row_expression(semijoin.residual, place)
    scope: dict[str, ColumnPolicy] = {}
    physical: dict[str, exp.Column] = {}

    def rename(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        if node.table == semijoin.alias:
            name, column, where = f"p{index}_{node.name}", semijoin.table.columns[node.name], _probed_alias(index)
        else:
            source = outer[node.table]
            name = f"o{list(outer).index(node.table)}_{node.name}"
            column, where = source.table.columns[node.name], source.physical
        scope[name] = dataclasses.replace(column, name=name)
        physical[name] = exp.column(exp.to_identifier(node.name, quoted=True), where)
        return exp.column(name)

    renamed = semijoin.residual.copy().transform(rename)
    typed = typed_expression(renamed, scope, place)
    if typed.kind not in (Kind.BOOL, Kind.NULL):
        raise QueryRejected(f"{place}: the condition is {typed.kind.value}, not boolean: write a comparison")
    total = typed.node
    guarded = exp.func("TRY", total) if may_fail(total, scope) else exp.paren(total)
    return guarded.transform(lambda n: physical[n.name].copy() if isinstance(n, exp.Column) and n.name in physical
                             else n), typed.cost


def _probed_alias(index: int) -> str:
    return f"__dp_p{index}"


def _sql(semijoin: SemiJoin, index: int, outer: dict[str, Outer], residual: exp.Expression | None) -> exp.Exists:
    """EXISTS (SELECT 1 FROM <probed> AS __dp_p<i> WHERE <keys> [AND rank <= m_t] AND <residual, gated>)."""
    alias = _probed_alias(index)
    if semijoin.relation is not None:
        source = semijoin.source.this.subquery(alias)
    else:
        source = exp.to_table(names.prepared_table(semijoin.table.name)).as_(alias)
    conditions: list[exp.Expression] = [
        exp.EQ(this=exp.column(exp.to_identifier(mine, quoted=True), alias),
               expression=exp.column(exp.to_identifier(other.name, quoted=True), outer[other.table].physical))
        for mine, other in semijoin.keys]
    capped = not semijoin.table.public and not semijoin.table.row_privacy
    within = exp.column(names.RANK, alias) <= semijoin.table.bound.max_rows
    if capped:
        conditions.append(within)
    if residual is not None:
        # The rank first, in a CASE: a condition beside the rank's, even pushed into the scan, is not always tested
        # after it (relation.gated), and a row beyond the cap must never meet the analyst's condition.
        conditions.append(exp.Case().when(within.copy(), residual).else_(exp.false()) if capped else residual)
    return exp.Exists(this=exp.select(exp.Literal.number(1)).from_(source).where(exp.and_(*conditions)))


__all__ = ["FLAG", "CheckedSemiJoin", "Outer", "SemiJoin", "checked", "extract", "has_semijoins"]
