"""Per-unit aggregation: `FROM (SELECT unit, COUNT(*) AS n, SUM(x) AS s ... FROM t GROUP BY unit) AS p`.

The inner query has one row per unit; the outer query aggregates those rows like a table whose bound is one row
per unit. Why one unit moves the outer measurements by at most their sensitivity:
- the inner rows are the unit's own rows capped at rank <= m (the prepared rank, chosen by the unit's own rows),
  then filtered by the inner WHERE (row-local): so the unit's derived row is a function of its own rows only, and
  removing the unit removes exactly that one derived row and changes no other;
- each derived value lies in a bound that holds whatever the rows: COUNT in [0, m] (COUNT(*) in [1, m]: a unit
  is in the subquery only with a row); SUM of values clamped to
  [lo, hi] in [m*min(lo, 0), m*max(hi, 0)]; AVG, MIN, MAX in [lo, hi]. The outer rewrite clamps every bounded
  column again inside its aggregates, so the sensitivity the plan computes from these bounds (with m = 1) holds;
- the derived rows are never released: check() refuses an outer query without aggregates and refuses grouping by
  the unit, as for any table.
An inner HAVING keeps or drops a unit's derived row by that unit's own aggregates: a row filter for the outer query.
Refused: an inner GROUP BY other than exactly the unit (several rows per unit), anything but the unit and named
aggregates in the inner SELECT, and inner ORDER BY, LIMIT, DISTINCT (LIMIT would choose units by their data). The
inner FROM may join tables by the join rules (relation.py): its rows are then the joined rows, at most m per unit.
Joined to other tables (relation.py), the subquery is a private table with one row per unit (m = 1).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from dpsql.analysis import person_work
from dpsql.analysis.bounds import Unbounded, interval_of
from dpsql.analysis.public_facts import PublicFacts
from dpsql.analysis.public_relations import public_relation
from dpsql.analysis.relation import JOINED, Relation, gated, resolve
from dpsql.analysis.semijoins import has_semijoins
from dpsql.analysis.typecheck import Typed, total_expression
from dpsql.analysis.vetting import may_fail, vet_row_expression
from dpsql.analysis.written_types import written_type
from dpsql.dp.fixedpoint import clamp, double, fixed_point, null_preserving
from dpsql.dp.interval import Interval
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.policy import ColumnPolicy, ColumnType, ContributionBound, Policy, TablePolicy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT

TypeCheck = Callable[..., Typed]  # check._type_check: (node, table, context, boolean=, numeric=) -> Typed

_INNER_CLAUSES = {"expressions", "from_", "joins", "where", "group", "having"}
# The hidden per-unit columns a HAVING condition reads (not in the relation's schema: the outer query cannot).
_HAVING_COLUMN = "__dp_having"
_AGGREGATES = {exp.Count: "COUNT", exp.Sum: "SUM", exp.Avg: "AVG", exp.Min: "MIN", exp.Max: "MAX"}
# A derived integer with at most this many values (COUNT per unit: 0..m) is a public domain of group keys.
MAX_DERIVED_DOMAIN = 1000
_RULE = ("subqueries in FROM are supported as per-unit aggregation only: SELECT unit, COUNT(*) AS n, "
         "SUM(x) AS s, ... FROM t [WHERE ...] GROUP BY unit (or as a private query answerable on its own, whose "
         "released rows the outer query reads)")


def resolve_per_unit(tree: exp.Select, policy: Policy, type_check: TypeCheck,
                     facts: PublicFacts | None = None) -> tuple[exp.Select, Relation] | None:
    """The outer query over the per-unit relation, if its FROM is a subquery and nothing else; None otherwise (a
    subquery joined to tables is a member of a join: relation.py asks `per_unit_relation` for it)."""
    from_ = tree.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Subquery) or tree.args.get("joins") \
            or public_relation(from_.this) is not None or has_semijoins(tree):
        return None  # a join (or a semi-join) reads it as one of its members: relation.py
    subquery = from_.this
    relation = per_unit_relation(subquery, policy, type_check, facts)
    outer = tree.copy()
    outer.set("from_", exp.From(this=exp.alias_(exp.to_table(JOINED), subquery.alias_or_name or JOINED,
                                                table=True)))
    return outer, relation


def per_unit_relation(subquery: exp.Subquery, policy: Policy, type_check: TypeCheck,
                      facts: PublicFacts | None = None) -> Relation:
    """The relation of a per-unit subquery: one row per unit, its derived columns bounded by the cap.

    Its FROM may join tables (relation.py): the joined rows, at most m per unit already, are then what is
    aggregated per unit, with that m."""
    inner = subquery.this
    if not isinstance(inner, exp.Select):
        raise QueryRejected(f"{_RULE}; a set operation (UNION ...) is not supported")
    for clause, value in inner.args.items():
        if value and clause not in _INNER_CLAUSES:
            label = {"limit": "LIMIT (it would choose units by their data)", "order": "ORDER BY",
                     "distinct": "DISTINCT"}.get(clause, clause.upper())
            raise QueryRejected(f"{_RULE}; {label} inside it is not supported")
    for item in inner.expressions:  # before qualify(), which names every item
        if not isinstance(item, exp.Alias | exp.Column):
            raise QueryRejected(f"{_RULE}; {item.sql(DIALECT)} is not a named COUNT, SUM, AVG, MIN or MAX (name it: "
                                f"{item.sql(DIALECT)} AS n)")
    joined = None
    if inner.args.get("joins") or has_semijoins(inner):
        inner, joined = resolve(inner, policy, facts)  # the joined rows, capped: at most m per unit
        if joined is None:
            raise QueryRejected(f"{_RULE}; a JOIN needs a table in FROM before it")
        if joined.schema.privacy_unit is None:
            raise QueryRejected(f"{_RULE}; the joined rows have no privacy unit to aggregate by")
    table = joined.schema if joined is not None else _inner_table(inner, policy)
    inner = _qualified(inner, table)
    unit_item, unit_name = _unit_item(inner, table)
    m = table.bound.max_rows
    alias = inner.args["from_"].this.alias_or_name
    columns = {unit_name: ColumnPolicy(unit_name, table.columns[table.privacy_unit].type)}
    # One table: its unit column is __dp_unit (bounding.prepared_rows). A join's __dp_unit is its first table's,
    # equal to the unit column the analyst names. The rows are grouped by __dp_unit alone, and the unit column is an
    # aggregate of the group (its one value): a filter of the outer query on it is then not pushed below the GROUP
    # BY into the scan, where it would run on every row of the person, not only on the m rows within the cap.
    single = joined is None
    unit_value = exp.column(names.UNIT, alias) if single else unit_item.copy()
    projection = [exp.alias_(exp.column(names.UNIT, alias), names.UNIT),
                  exp.alias_(exp.Min(this=unit_value), unit_name, quoted=True)]
    expressions = []  # each aggregate's argument and its cost per row, for the person's work
    for item in inner.expressions:
        if item is unit_item or (isinstance(item, exp.Alias) and item.this is unit_item):
            continue
        column, value, cost = _derived(item, table, m, type_check)
        if column.name in columns:
            raise QueryRejected(f"{_RULE}; the name '{column.name}' is used twice")
        columns[column.name] = column
        projection.append(exp.alias_(value, column.name, quoted=True))
        expressions.append((f"{item.sql(DIALECT)} in the per-unit subquery", cost))
    where = inner.args.get("where")
    # The cap, before the filter: it stays the unit's own choice (a join's rows are capped inside its SQL). The
    # filter runs only on the rows within the cap, wherever DuckDB places it (relation.gated).
    rank = exp.column(names.RANK, alias)
    filters = [rank <= m] if joined is None else []
    where_cost, where_text = None, ""
    if where is not None:
        where_text = "WHERE (in the per-unit subquery)"
        vet_row_expression(where.this, where_text)
        where_cost = type_check(where.this, table, where_text, boolean=True).cost
        total = _total(where.this, table)
        filters.append(gated(total, joined.caps, alias) if joined is not None else
                       exp.Case().when(rank.copy() <= m, total).else_(exp.false()))
    having = inner.args.get("having")  # a filter on the unit's own aggregates: keeps or drops its derived row
    keep = _having(having.this, table, m, type_check, columns, projection) if having is not None else None
    source = joined.sql.subquery(alias) if joined is not None else exp.to_table(
        names.prepared_table(table.name)).as_(alias)
    per_unit = exp.select(*projection).from_(source).group_by(exp.column(names.UNIT, alias))
    if filters:
        per_unit = per_unit.where(exp.and_(*filters))
    quantized = [exp.alias_(exp.cast(fixed_point(c.interval).centered(exp.column(exp.to_identifier(
        c.name, quoted=True))), exp.DataType.Type.INT), names.quantized_column(c.name))
        for c in columns.values() if c.bounded]
    sql = exp.select("*", *quantized).from_(per_unit.subquery("__dp_per_unit"))
    if keep is not None:
        sql = sql.where(keep)
    schema = TablePolicy(JOINED, table.source, columns, ContributionBound(1), unit_name, unit=table.unit)
    over = (f"the join above: at most {m} rows per unit" if joined is not None
            else f"'{table.name}': each unit's rows capped at {m} (rank <= {m})")
    steps = (*(joined.steps if joined is not None else ()),
             f"per-unit subquery over {over} before its aggregates, so COUNT(*) per unit is in [1, {m}], "
             f"COUNT(x) in [0, {m}], SUM in [{m} * min(lo, 0), {m} * max(hi, 0)], AVG, MIN and MAX in [lo, hi]",
             "the subquery has one row per unit: m = 1 for the outer query")
    work = (*(joined.work if joined is not None else ()),
            *person_work.stage_terms(m, where_cost, where_text, expressions))
    return Relation(schema, sql, steps, work=work)


def _inner_table(inner: exp.Select, policy: Policy) -> TablePolicy:
    source = inner.args.get("from_")
    source = source.this if source is not None else None
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier) or source.args.get("db"):
        raise QueryRejected(f"{_RULE}; it must read one declared private table")
    table = policy.table(source.name)
    if table is None:
        raise ProgrammingError(f"unknown table '{source.name}' (the policy declares: "
                               f"{', '.join(sorted(policy.tables))})")
    if table.public or table.privacy_unit is None:
        raise QueryRejected(f"{_RULE}; '{table.name}' has no privacy unit to aggregate by")
    return table


def _qualified(inner: exp.Select, table: TablePolicy) -> exp.Select:
    schema = {table.name: {c.name: c.type.duckdb for c in table.columns.values()}}
    try:
        return qualify(inner.copy(), schema=schema, dialect=DIALECT, validate_qualify_columns=True,
                       expand_stars=False, quote_identifiers=False, identify=False)
    except OptimizeError as exc:
        raise ProgrammingError(f"{exc} (table '{table.name}' has the columns: "
                               f"{', '.join(sorted(table.columns))})") from None


def _unit_item(inner: exp.Select, table: TablePolicy) -> tuple[exp.Column, str]:
    group = inner.args.get("group")
    keys = list(group.expressions) if group is not None else []
    if len(keys) != 1 or not (isinstance(keys[0], exp.Column) and keys[0].name == table.privacy_unit):
        raise QueryRejected(f"{_RULE}; GROUP BY must be exactly the unit column '{table.privacy_unit}' (anything "
                            "else gives several rows per unit, or mixes units)")
    units = [item for item in inner.expressions
             if isinstance(item.unalias(), exp.Column) and item.unalias().name == table.privacy_unit]
    if len(units) != 1:
        raise QueryRejected(f"{_RULE}; select the unit column '{table.privacy_unit}' once")
    return units[0].unalias(), units[0].alias_or_name


def _having(condition: exp.Expression, table: TablePolicy, m: int, type_check: TypeCheck,
            columns: dict[str, ColumnPolicy], projection: list[exp.Expression]) -> exp.Expression:
    """The inner HAVING as a filter on the per-unit rows: each aggregate in it becomes a hidden per-unit column
    (appended to `projection`), checked like the named ones; the condition may read nothing else."""
    place = "HAVING (in the per-unit subquery)"
    hidden: dict[str, ColumnPolicy] = {}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.AggFunc):
            name = f"{_HAVING_COLUMN}{len(hidden)}"
            column, value, _ = _aggregate_column(node, name, table, m, type_check)
            hidden[name] = column
            projection.append(exp.alias_(value, name, quoted=True))
            return exp.column(name)
        return node

    rewritten = condition.copy().transform(swap, copy=False)
    for column in rewritten.find_all(exp.Column):
        if column.name not in hidden:
            raise QueryRejected(f"{place}: it may read aggregates only, not the column '{column.name}'")
    vet_row_expression(rewritten, place)
    scope = TablePolicy(JOINED, table.source, {**columns, **hidden}, ContributionBound(1), None)
    type_check(rewritten, scope, place, boolean=True)
    return _total(rewritten, scope)


def _derived(item: exp.Expression, table: TablePolicy, m: int,
             type_check: TypeCheck) -> tuple[ColumnPolicy, exp.Expression, int]:
    """One named per-unit aggregate: its column (type, bounds, public values), its SQL over the capped rows and the
    cost of its argument on one row."""
    call = item.unalias()
    if type(call) not in _AGGREGATES or not isinstance(item, exp.Alias):
        raise QueryRejected(f"{_RULE}; {item.sql(DIALECT)} is not a named COUNT, SUM, AVG, MIN or MAX")
    name = item.alias
    if not name.isidentifier() or name.startswith(names.RESERVED_PREFIX):
        raise QueryRejected(f"{_RULE}; '{name}' is not a plain name")
    return _aggregate_column(call, name, table, m, type_check)


def _aggregate_column(call: exp.Expression, name: str, table: TablePolicy, m: int,
                      type_check: TypeCheck) -> tuple[ColumnPolicy, exp.Expression, int]:
    kind = _AGGREGATES.get(type(call))
    if kind is None:
        raise QueryRejected(f"{_RULE}; {call.sql(DIALECT)} is not COUNT, SUM, AVG, MIN or MAX")
    argument = call.this
    place = f"{kind} in the per-unit subquery"
    if kind == "COUNT" and (argument is None or isinstance(argument, exp.Star)):
        # A unit is in the subquery only with at least one row: COUNT(*) is 1..m (COUNT(x) may be 0).
        return _count_column(name, m, nullable=False, lowest=1), exp.Count(this=exp.Star()), 0
    if isinstance(argument, exp.Distinct):
        if kind != "COUNT" or len(argument.expressions) != 1:
            raise QueryRejected(f"{place}: DISTINCT is not supported here (COUNT(DISTINCT x) is)")
        # The distinct non-NULL values of x among the unit's capped rows: in [0, m], as COUNT(x) is. x as written
        # (total, not clamped: clamping could merge distinct values).
        (value,) = argument.expressions
        vet_row_expression(value, place)
        typed = type_check(value, table, place)  # hashed for its distinct values: its length, besides computing it
        return _count_column(name, m, nullable=False), exp.Count(this=exp.Distinct(expressions=[
            _total(value, table)])), typed.cost + typed.length
    vet_row_expression(argument, place)
    cost = type_check(argument, table, place, numeric=kind != "COUNT").cost
    column, value = _argument_column(kind, call, argument, name, table, m)
    return column, value, cost


def _argument_column(kind: str, call: exp.Expression, argument: exp.Expression, name: str, table: TablePolicy,
                     m: int) -> tuple[ColumnPolicy, exp.Expression]:
    """A per-unit aggregate of an argument: its column and its SQL."""
    place = f"{kind} in the per-unit subquery"
    value = _total(argument, table, clamped=True)
    if kind == "COUNT":
        return _count_column(name, m, nullable=False), exp.Count(this=value)
    try:
        interval = interval_of(argument, table.columns)
    except Unbounded as exc:
        raise QueryRejected(f"{place}: {exc}") from None
    bare = argument.unnest() if isinstance(argument, exp.Paren) else argument
    nullable = not (isinstance(bare, exp.Column) and not table.columns[bare.name].nullable)
    steps = loaded_steps(bare, table, interval)
    written = written_type(call, table.columns, place)  # what the outer query's SQL reads (HUGEINT for SUM(int))
    if kind == "SUM":
        derived = Interval(m * min(interval.lo, 0.0), m * max(interval.hi, 0.0))
        return (ColumnPolicy(name, ColumnType.FLOAT, derived.lo, derived.hi, nullable=nullable,
                             written_type=written), _exact_sum(value, interval, steps=steps))
    if kind == "AVG":
        return (ColumnPolicy(name, ColumnType.FLOAT, interval.lo, interval.hi, nullable=nullable,
                             written_type=written), _exact_sum(value, interval, average=True, steps=steps))
    integer = isinstance(bare, exp.Column) and table.columns[bare.name].type is ColumnType.INT
    values = tuple(range(int(interval.lo), int(interval.hi) + 1)) if integer and (
        interval.hi - interval.lo < MAX_DERIVED_DOMAIN) else None
    column_type = ColumnType.INT if integer else ColumnType.FLOAT
    aggregate = type(call)(this=value)
    column = ColumnPolicy(name, column_type, interval.lo, interval.hi, values, nullable, written_type=written)
    if integer:
        return column, exp.cast(aggregate, exp.DataType.Type.BIGINT)
    # -0.0 and 0.0 tie, and MIN/MAX keep whichever it meets first: the order of the rows, not the unit's values
    # (and on several threads other units' rows decide it). Adding 0.0 makes -0.0 the 0.0 it equals.
    return column, exp.Add(this=exp.cast(aggregate, exp.DataType.Type.DOUBLE), expression=double(0.0))


def loaded_steps(argument: exp.Expression, table: TablePolicy, interval: Interval) -> exp.Expression | None:
    """A bare bounded column's fixed-point integers, computed at load on the same grid (`__dp_q_<col>`): read
    rather than computed per row again (which was half of a per-unit SUM's time), or None."""
    if not isinstance(argument, exp.Column):
        return None
    column = table.columns[argument.name]
    if not (column.bounded and column.interval == interval):
        return None
    return exp.column(names.quantized_column(argument.name), argument.table)


def _exact_sum(value: exp.Expression, interval: Interval, average: bool = False,
               steps: exp.Expression | None = None) -> exp.Expression:
    """SUM (or AVG) of a unit's clamped values, exactly: each row's fixed-point integer (dp/fixedpoint.py) summed in
    HUGEINT, which no order of additions can change, and the exact total turned into a DOUBLE once. A float SUM
    rounds by the order DuckDB adds the rows in, and with several threads that order follows where the unit's rows
    fall among everyone else's: one person's rows would then move other units' derived values."""
    grid = fixed_point(interval)
    steps = steps if steps is not None else grid.centered(value)  # `steps`: the loader's grid.centered(value)
    count = exp.Count(this=steps.copy())
    # One SUM of each row's integer with the center added back (a center is below 2**60 and a centered integer
    # below 2**31, dp/fixedpoint.py: a BIGINT never overflows; its SUM is a HUGEINT), rather than SUM(steps) +
    # center * COUNT(steps): the second aggregate was an eighth of a per-unit query's time (1M rows: 18.6 ->
    # 15.7 ms).
    total = exp.Sum(this=exp.Add(this=exp.cast(steps, exp.DataType.Type.BIGINT),
                                 expression=exp.Literal.number(grid.center)))
    scaled = exp.Mul(this=exp.cast(total, exp.DataType.Type.DOUBLE), expression=double(float(grid.step)))
    if not average:
        return scaled
    return exp.Div(this=exp.paren(scaled), expression=exp.cast(exp.func("NULLIF", count, exp.Literal.number(0)),
                                                                exp.DataType.Type.DOUBLE))


def _count_column(name: str, m: int, nullable: bool, lowest: int = 0) -> ColumnPolicy:
    values = tuple(range(lowest, m + 1)) if m < MAX_DERIVED_DOMAIN else None
    return ColumnPolicy(name, ColumnType.INT, lowest, m, values, nullable)


def _total(node: exp.Expression, table: TablePolicy, clamped: bool = False) -> exp.Expression:
    """The analyst's expression in its total form (it cannot fail on any row), bounded columns clamped to their
    declared intervals, TRY around it as a second layer; booleans as 0/1 (as the rewrite's aggregated values)."""
    total = total_expression(node, table.columns)

    def clamp_column(part: exp.Expression) -> exp.Expression:
        if isinstance(part, exp.Column) and part.name in table.columns and table.columns[part.name].bounded:
            return null_preserving(part, clamp(part, table.columns[part.name].interval))
        return part

    value = total.transform(clamp_column, copy=False) if clamped else total
    # A filter (unclamped) may go without TRY where the rewrite's would (vetting.may_fail given the columns).
    value = exp.func("TRY", value) if may_fail(total, None if clamped else table.columns) else exp.paren(value)
    bare = node.unnest() if isinstance(node, exp.Paren) else node
    if clamped and (isinstance(bare, exp.Predicate | exp.Connector | exp.Not) or (
            isinstance(bare, exp.Column) and table.columns[bare.name].type is ColumnType.BOOL)):
        value = exp.cast(value, "INTEGER")
    return value
