"""Stage 4: the bounded SQL that runs on the private table, built as passes over a sqlglot tree.

The SQL itself enforces everything the sensitivity analysis assumed:
- at most m rows per privacy unit, chosen by a secret per-row hash, so the choice depends only on that unit's
  own rows (bounding.py: the table is ranked once at load, the cap pass keeps m rows per unit);
- every bounded column clamped to its declared interval inside an aggregate, and every aggregated expression
  clamped to its derived interval and held as a fixed-point integer (see fixedpoint.py), so sums are exact;
- every analyst expression in its total form (typecheck.py: integer arithmetic widened, failing casts as
  TRY_CAST, date functions guarded), so no row can turn the query into an error; TRY(...) around it remains as
  a second layer only.

Each pass takes the tree and the plan and returns a new tree, in the manner of sqlglot's optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.analysis.relation import gated
from dpsql.analysis.typecheck import total_expression
from dpsql.analysis.vetting import may_fail
from dpsql.dp.fixedpoint import clamp, double, null_preserving
from dpsql.planning.contribution import contribution
from dpsql.planning.plan import MeasurementKind, MeasurementSpec, QueryPlan
from dpsql.policy import ColumnPolicy, ColumnType
from dpsql.rewrite import bounding
from dpsql.rewrite.quantile_buckets import bucket_counts
from dpsql.sql import names
from dpsql.sql.parse import DIALECT, literal


@dataclass(frozen=True)
class BoundedQuery:
    sql: str  # runs on the prepared table (and first on its empty twin, see engine.py)
    key_count: int
    # Per quantile argument, the indices of the quantile measurements that read it (their columns in `sql` are NULL)
    # and the SQL of its rows per candidate over the same bounded rows: (keys..., bucket, rows). A separate query:
    # beside other aggregates in one GROUP BY, DuckDB plans histogram() as a materialized CTE and a join, and a
    # bounded plan never joins (tests/test_engine_plans.py). release/cells.with_buckets fills those columns.
    buckets: tuple[tuple[tuple[int, ...], str], ...] = ()


@dataclass(frozen=True)
class _Context:
    plan: QueryPlan
    table: str  # the physical table to read
    alias: str  # the alias the analyst's qualified expressions use
    # The distinct aggregated expressions, in the order of their __v columns. sqlglot nodes compare as trees, so a
    # measurement's argument finds its column by equality, never by its rendered text.
    arguments: tuple[exp.Expression, ...]
    # The row filter reads only the unit and columns declared per_unit, so it keeps whole units or none: the rank
    # prepared at load caps the query, as without a filter.
    whole_units: bool
    listed: bool = True  # the engine prepared the later-rows tables (rewrite/bounding.later_rows)
    # The group keys grouped by the loader's code of their column (bounding.code), by index: decoded after the
    # aggregation (`decode_keys`).
    coded: Mapping[int, ColumnPolicy] = field(default_factory=dict)

    def value_index(self, argument: exp.Expression) -> int:
        return self.arguments.index(argument)


Pass = Callable[[exp.Select, _Context], exp.Select]


def rewrite(plan: QueryPlan, dialect: str = DIALECT, listed: bool = True) -> BoundedQuery:
    """The bounded query, as SQL of the target engine's dialect. `listed`: the engine prepared the later-rows tables
    (rewrite/bounding.later_rows), which the filtered cap then reads."""
    name = plan.query.table.name
    sql = _build(plan, names.prepared_table(name), listed).sql(dialect)
    buckets = tuple((indices, _bucket_query(plan, names.prepared_table(name), spec, listed).sql(dialect))
                    for indices, spec in _quantile_arguments(plan))
    return BoundedQuery(sql=sql, key_count=len(plan.query.keys), buckets=buckets)


def _quantile_arguments(plan: QueryPlan) -> list[tuple[tuple[int, ...], MeasurementSpec]]:
    """The quantile measurements grouped by what they count (argument and grid): MEDIAN(x) and MAX(x) read one
    bucket query."""
    found: dict[tuple, tuple[list[int], MeasurementSpec]] = {}
    for i, m in enumerate(plan.measurements):
        if m.spec.kind is MeasurementKind.QUANTILE:
            found.setdefault((m.spec.argument, m.spec.grid), ([], m.spec))[0].append(i)
    return [(tuple(indices), spec) for indices, spec in found.values()]


def _bucket_query(plan: QueryPlan, table: str, spec: MeasurementSpec, listed: bool = True) -> exp.Select:
    """The rows per (group, candidate) of one quantile's argument, over the very rows the bounded query reads."""
    rows, context = _rows(plan, table, listed)
    keys = [names.key(i) for i in range(len(plan.query.keys))]
    return bucket_counts(rows, keys, _value_column(spec, context), spec.grid,
                         lambda source, measures, extra: grouped(source, measures, context, extra))


def pretty(plan: QueryPlan, dialect: str = DIALECT, listed: bool = True) -> str:
    return _build(plan, names.prepared_table(plan.query.table.name), listed).sql(dialect, pretty=True)


def pretty_buckets(plan: QueryPlan, dialect: str = DIALECT, listed: bool = True) -> list[tuple[tuple[int, ...], str]]:
    """Each quantile argument's own query (see BoundedQuery.buckets), for explain."""
    table = names.prepared_table(plan.query.table.name)
    return [(indices, _bucket_query(plan, table, spec, listed).sql(dialect, pretty=True))
            for indices, spec in _quantile_arguments(plan)]


def _build(plan: QueryPlan, table: str, listed: bool = True) -> exp.Select:
    return aggregate_measurements(*_rows(plan, table, listed))


def _rows(plan: QueryPlan, table: str, listed: bool = True, passes: tuple[Pass, ...] | None = None,
          alias: str | None = None) -> tuple[exp.Select, _Context]:
    """The bounded rows, one per kept row (every pass but the aggregation, or those given), and the context they were
    built in."""
    context = _Context(plan, table, alias or _alias(plan), _arguments(plan), _whole_units(plan), listed,
                       _coded_keys(plan))
    relation = plan.query.relation  # joined tables: their SQL, capped already, stands for the table
    source = relation.sql.subquery(context.alias) if relation is not None else exp.to_table(table).as_(context.alias)
    tree = exp.select("*", copy=False).from_(source, copy=False)
    for step in ROW_PASSES if passes is None else passes:
        tree = step(tree, context)
    return tree, context


def kept_rows(plan: QueryPlan, alias: str, listed: bool = True) -> exp.Select:
    """The rows the bounded query keeps, read as `alias` (the alias its expressions' columns name), before any key or
    value is computed from them: the filter and the cap (with per-group bounds, that cap comes later and depends on
    the keys: see rewrite/identity.py)."""
    return _rows(plan, names.prepared_table(plan.query.table.name), listed, (filter_rows, cap_rows_per_unit),
                 alias)[0]


def _coded_keys(plan: QueryPlan) -> dict[int, ColumnPolicy]:
    """The group keys to group by their column's code: a bare column of the table read (not a join's relation,
    whose SQL carries no codes) whose public values are exactly its declared ones. Rows with any other value, or
    NULL, share the code NULL, and so one group, which is never released (its key is not a public value). Not
    under per-group bounds: a unit's groups are counted and ranked there, and those rows' groups would merge."""
    if plan.query.relation is not None or contribution(plan.query).per_group_enforced:
        return {}
    columns = plan.query.table.columns
    coded = {}
    for index, key in enumerate(plan.query.keys):
        column = columns.get(key.expression.name) if isinstance(key.expression, exp.Column) else None
        if column is not None and bounding.code(column) is not None and key.domain == column.values:
            coded[index] = column
    return coded


def _alias(plan: QueryPlan) -> str:
    for node in [*(k.expression for k in plan.query.keys), *(m.spec.argument for m in plan.measurements),
                 plan.query.where]:
        if node is not None:
            column = next(node.find_all(exp.Column), None)
            if column is not None and column.table:
                return column.table
    return plan.query.table.name


def _arguments(plan: QueryPlan) -> tuple[exp.Expression, ...]:
    """The distinct aggregated expressions, each projected once as __v<i>."""
    return tuple(dict.fromkeys(m.spec.argument for m in plan.measurements if m.spec.argument is not None))


def _guarded(node: exp.Expression, context: _Context) -> exp.Expression:
    """The analyst's expression in its total form (typecheck.py: it cannot fail on any row), inside TRY as a
    second layer only."""
    total = total_expression(node, context.plan.query.table.columns)
    return exp.func("TRY", total) if may_fail(total, context.plan.query.table.columns) else exp.paren(total)


def filter_rows(tree: exp.Select, context: _Context) -> exp.Select:
    where = context.plan.query.where
    if where is None:
        return tree
    # Each conjunct in its own TRY: a row passes only if every one is TRUE either way (an error is NULL, which no
    # AND of them makes TRUE), and DuckDB can push a conjunct that reads one side of a join into that side's scan
    # (one TRY around `d.beds > 20 AND v.cost > 500` made the join read every row first).
    bare = where.unnest()
    conditions = [_guarded(conjunct, context) for conjunct in (bare.flatten() if isinstance(bare, exp.And) else
                                                                 [where])]
    if not context.whole_units and not context.plan.query.groupings:
        # Rows whose public key is outside its declared values are never released; with a filter anyway, drop
        # them before the cap so that the cap is spent on rows that can count. (Not with grouping sets: such a row
        # counts in the groupings that roll that key up.)
        conditions += [_declared(key.expression, key.domain, context) for key in context.plan.query.keys
                       if key.domain is not None]
    relation = context.plan.query.relation
    for condition in conditions:
        # Over a join, each condition runs only on the rows within the caps of the tables it reads (a single
        # table's filter is gated by bounding.cap_rows, which reads it from here).
        tree = tree.where(gated(condition, relation.caps, context.alias) if relation is not None else condition,
                          copy=False)
    return tree


def _declared(key: exp.Expression, domain: tuple, context: _Context) -> exp.Expression:
    """The condition that a row's key is one of its declared values: the flag the loader computed when the key is
    a bare column with exactly the column's declared values and the prepared table is read (a boolean, where the
    IN compares text: 0.35x plain DuckDB's time over 1M rows), else the IN, in TRY unless it cannot fail."""
    total = _same_type_membership(key, domain, context)
    relation = context.plan.query.relation
    if total:
        assert isinstance(key, exp.Column)
        column = context.plan.query.table.columns[key.name]
        flag = bounding.known(column)
        carried = relation is None or key.name in relation.flagged  # a join's SQL carries private tables' flags
        if flag is not None and carried and column.values == domain:
            return exp.column(flag, context.alias)
    member = exp.In(this=_guarded(key, context), expressions=[literal(v) for v in domain])
    return member if total else exp.func("TRY", member)


def _same_type_membership(key: exp.Expression, domain: tuple, context: _Context) -> bool:
    """Whether `key IN (domain)` compares a bare text or integer column with literals of its own type: no cast, so
    nothing to fail, and no TRY (which kept DuckDB from pushing the filter into the scan: 100 ms of a 250 ms
    filtered query over 10M rows with eight declared values)."""
    if not isinstance(key, exp.Column) or key.name not in context.plan.query.table.columns:
        return False
    kind = context.plan.query.table.columns[key.name].type
    if kind is ColumnType.TEXT:
        return all(isinstance(value, str) for value in domain)
    return kind is ColumnType.INT and all(type(value) is int for value in domain)


def cap_rows_per_unit(tree: exp.Select, context: _Context) -> exp.Select:
    if context.plan.query.relation is not None:
        return tree  # the relation's SQL keeps at most m rows per unit; a row filter only removes rows
    work = context.plan.query.work
    return bounding.cap_rows(tree, context.plan.query.table, context.plan.max_rows, context.table, context.alias,
                             context.whole_units, context.listed, work.examined if work is not None else None)


def _whole_units(plan: QueryPlan) -> bool:
    """Whether the row filter reads only the unit and columns declared per_unit: it keeps whole units or none."""
    return plan.query.whole_units


def project_row_values(tree: exp.Select, context: _Context) -> exp.Select:
    """One row per kept row: its group keys, each aggregated value, and the unit."""
    keys = [exp.alias_(_key_value(i, k.expression, context), names.key(i))
            for i, k in enumerate(context.plan.query.keys) if not k.grouping_id]  # the id: the aggregation's
    values = [exp.alias_(_value(argument, context), names.row_value(i))
              for i, argument in enumerate(context.arguments)]
    per_group = contribution(context.plan.query).per_group_enforced
    unit = [exp.column(names.UNIT, context.alias)] if per_group or any(
        m.spec.kind is MeasurementKind.UNITS for m in context.plan.measurements) else []
    row_key = [exp.column(names.ROW_KEY, context.alias)] if per_group else []
    projection = [*keys, *values, *unit, *row_key] or [exp.alias_(exp.Literal.number(1), names.ONE)]
    return tree.select(*projection, append=False, copy=False)


def _key_value(index: int, key: exp.Expression, context: _Context) -> exp.Expression:
    column = context.coded.get(index)
    if column is None:
        return _guarded(key, context)
    return exp.column(bounding.code(column), context.alias)


def decode_keys(tree: exp.Select, context: _Context) -> exp.Select:
    """The grouped `tree` with each coded key (`_coded_keys`) as its declared value again, of the column's type:
    a CASE over the groups, after the aggregation."""
    if not context.coded:
        return tree

    def decoded(index: int, column: ColumnPolicy) -> exp.Expression:
        assert column.values is not None
        pairs = [(exp.Literal.number(number), literal(value)) for number, value in enumerate(column.values, 1)]
        found = bounding.lookup(exp.column(names.key(index)), pairs)
        return exp.alias_(exp.cast(found, exp.DataType.build(column.type.duckdb, dialect=DIALECT)), names.key(index))

    keys = {names.key(i): decoded(i, column) for i, column in context.coded.items()}
    outputs = [keys.get(c.alias_or_name, exp.column(c.alias_or_name)) for c in tree.expressions]
    return exp.select(*outputs, copy=False).from_(tree.subquery(names.CODED, copy=False), copy=False)


def cap_rows_per_group(tree: exp.Select, context: _Context) -> exp.Select:
    """With the policy's per-group bounds (planning/contribution.py): of each unit's rows (already at most m), at
    most r in each group, by the secret row hash, and only the k groups whose smallest row hash is smallest. Both
    choices read the unit's own rows only; the keys are the projected (total) key columns."""
    unit = contribution(context.plan.query)
    if not unit.per_group_enforced:
        return tree
    names_out = [e.alias_or_name for e in tree.expressions]
    keys = [exp.column(names.key(i)) for i in range(len(context.plan.query.keys))]
    by_group = [exp.column(names.UNIT), *[k.copy() for k in keys]]
    key_order = exp.Order(expressions=[exp.Ordered(this=exp.column(names.ROW_KEY))])
    in_group = exp.Window(this=exp.RowNumber(), partition_by=by_group, order=key_order)
    group_key = exp.Window(this=exp.Min(this=exp.column(names.ROW_KEY)), partition_by=[c.copy() for c in by_group])
    ranked = exp.select("*", exp.alias_(in_group, names.GROUP_ROW), exp.alias_(group_key, names.GROUP_KEY),
                        copy=False).from_(tree.subquery(names.VALUES_BY_GROUP, copy=False), copy=False)
    group_order = exp.Order(expressions=[exp.Ordered(this=exp.column(names.GROUP_KEY)),
                                         *[exp.Ordered(this=k.copy()) for k in keys]])
    numbered = exp.select("*", exp.alias_(exp.Window(this=exp.func("dense_rank"), partition_by=[exp.column(
        names.UNIT)], order=group_order), names.GROUP_NUMBER), copy=False).from_(
        ranked.subquery(names.VALUES_BY_GROUP, copy=False), copy=False).where(
        exp.column(names.GROUP_ROW) <= unit.rows_per_group, copy=False)
    return exp.select(*[exp.column(n) for n in names_out], copy=False).from_(
        numbered.subquery(names.VALUES_BY_GROUP, copy=False), copy=False).where(
        exp.column(names.GROUP_NUMBER) <= unit.groups, copy=False)


def project_fixed_point(tree: exp.Select, context: _Context) -> exp.Select:
    """Each summed value as its clamped fixed-point integer __q<i> (already one for a bare bounded column)."""
    points = {}
    for m in context.plan.measurements:
        if m.spec.kind in (MeasurementKind.SUM, MeasurementKind.SUMSQ, MeasurementKind.ABOVE, MeasurementKind.BELOW) \
                or (m.spec.kind is MeasurementKind.ROWS and m.spec.distinct):
            points[context.value_index(m.spec.argument)] = m.spec
    passthrough = [exp.column(c.alias_or_name) for c in tree.expressions]
    integers = []
    for index, spec in sorted(points.items()):
        value = exp.column(names.row_value(index))
        integer = value if _precomputed(spec.argument, context) else spec.value_point.centered(value)
        integers.append(exp.alias_(integer, names.row_integer(index)))
    if not integers:
        return tree
    return exp.select(*passthrough, *integers, copy=False).from_(tree.subquery(names.VALUES, copy=False), copy=False)


def aggregate_measurements(tree: exp.Select, context: _Context) -> exp.Select:
    measures = [exp.alias_(_measurement(m.spec, context), names.measurement(i))
                for i, m in enumerate(context.plan.measurements)]
    return grouped(tree.subquery(names.INTEGERS, copy=False), measures, context)


def grouped(rows: exp.Expression, measures: list[exp.Expression], context: _Context,
            extra: tuple[exp.Expression, ...] = ()) -> exp.Select:
    """SELECT keys, measures FROM rows GROUP BY keys (and the `extra` columns, selected before the measures), the
    coded keys decoded. With grouping sets: GROUP BY GROUPING SETS, one set per grouping (each with the `extra`
    columns), and the grouping id as the last key: DuckDB's GROUPING() of all keys (analysis/grouping_sets.py)."""
    query = context.plan.query
    keys = [exp.column(names.key(i)) for i, k in enumerate(query.keys) if not k.grouping_id]
    selected = [*keys, *[e.copy() for e in extra]]
    if not query.groupings:
        outer = exp.select(*selected, *measures, copy=False).from_(rows, copy=False)
        return decode_keys(outer.group_by(*[c.copy() for c in selected], copy=False), context) if selected else outer
    grouping_id = exp.alias_(exp.Grouping(expressions=[k.copy() for k in keys]), names.key(len(keys)))
    sets = exp.GroupingSets(expressions=[exp.Tuple(expressions=[*[keys[i].copy() for i in grouping],
                                                                *[e.copy() for e in extra]])
                                         for grouping in query.groupings])
    outer = exp.select(*keys, grouping_id, *[e.copy() for e in extra], *measures, copy=False).from_(rows, copy=False)
    return decode_keys(outer.group_by(sets, copy=False), context)


ROW_PASSES: tuple[Pass, ...] = (  # one row per kept row: what the aggregation and the bucket queries read
    filter_rows,
    cap_rows_per_unit,
    project_row_values,
    cap_rows_per_group,
    project_fixed_point,
)
PASSES: tuple[Pass, ...] = (*ROW_PASSES, aggregate_measurements)


def _value_column(spec: MeasurementSpec, context: _Context,
                  name: Callable[[int], str] = names.row_value) -> exp.Column:
    return exp.column(name(context.value_index(spec.argument)))


def _measurement(spec: MeasurementSpec, context: _Context) -> exp.Expression:
    if spec.kind is MeasurementKind.UNITS:
        unit = exp.column(names.UNIT)
        if spec.argument is not None:  # the units with a row where the condition (projected as the value) holds
            unit = exp.Case().when(_value_column(spec, context), unit).else_(exp.null())
        return exp.Count(this=exp.Distinct(expressions=[unit]))
    if spec.kind is MeasurementKind.DISTINCT:
        return exp.Count(this=exp.Distinct(expressions=[_value_column(spec, context)]))
    if spec.kind is MeasurementKind.QUANTILE:
        # Its counts come from its own query (BoundedQuery.buckets); an aggregate of NULL keeps one row per group
        # (a bare NULL would make a query of quantiles only a row-level SELECT).
        return exp.Max(this=exp.cast(exp.null(), "BIGINT"))
    if spec.kind is MeasurementKind.ROWS:
        if spec.argument is None:
            return exp.Count(this=exp.Star())
        if spec.distinct:  # the distinct fixed-point values (SUM(DISTINCT x) counts the same ones)
            return exp.Count(this=exp.Distinct(expressions=[_value_column(spec, context, names.row_integer)]))
        return exp.Count(this=_value_column(spec, context))
    if spec.kind is MeasurementKind.NULLS:
        nulls = exp.Sub(this=exp.Count(this=exp.Star()), expression=exp.Count(this=_value_column(spec, context)))
        if spec.value_point is None:
            return nulls
        return exp.Mul(this=exp.paren(nulls), expression=_huge(2 * spec.value_point.bound))  # a pair's units
    value = _value_column(spec, context)
    centered = _value_column(spec, context, names.row_integer)
    if spec.kind in (MeasurementKind.ABOVE, MeasurementKind.BELOW):
        # x - lo is the centered integer plus bound, hi - x bound minus it: summed exactly in 128-bit integers.
        bounds = exp.Mul(this=_huge(spec.value_point.bound), expression=exp.Count(this=value.copy()))
        if spec.kind is MeasurementKind.ABOVE:
            return exp.Add(this=exp.Sum(this=centered), expression=bounds)
        return exp.Sub(this=bounds, expression=exp.Sum(this=centered))
    if spec.kind is MeasurementKind.SUMSQ:
        real = exp.Mul(this=exp.cast(centered, "DOUBLE"), expression=double(float(spec.value_point.step)))
        return exp.Sum(this=spec.square_point.centered(exp.Pow(this=exp.paren(real), expression=exp.Literal.number(2))))
    if spec.distinct:  # each distinct fixed-point value once: a bijection of the clamped value's grid point
        total = exp.Sum(this=exp.Distinct(expressions=[centered]))
        counted = exp.Count(this=exp.Distinct(expressions=[centered.copy()]))
    else:
        total, counted = exp.Sum(this=centered), exp.Count(this=value.copy())
    if not spec.plain:
        return total
    # The uncentered sum, exactly: add center * count back in 128-bit integers.
    shift = exp.Mul(this=_huge(spec.value_point.center), expression=counted)
    return exp.Add(this=total, expression=shift)


def _huge(value: int) -> exp.Expression:
    return exp.cast(exp.Literal.number(value), "HUGEINT")


def _precomputed(argument: exp.Expression, context: _Context) -> str | None:
    """The prepared table's fixed-point column of a bare bounded column, if that is what is aggregated."""
    column = argument.unnest() if isinstance(argument, exp.Paren) else argument
    if not isinstance(column, exp.Column):
        return None
    policy = context.plan.query.table.columns.get(column.name)
    return bounding.quantized(policy) if policy is not None else None


def _value(argument: exp.Expression, context: _Context) -> exp.Expression:
    """The aggregated value of one row: bounded columns clamped, failures made NULL, booleans made 0/1.

    For a bare bounded column this is the prepared table's fixed-point integer instead (the same
    fixed_point of the declared interval that the plan used), so the common case costs one integer sum.
    """
    if isinstance(argument, exp.Distinct):
        # COUNT(DISTINCT x): x as written, neither clamped nor on a grid, which could merge distinct values.
        return _guarded(argument.expressions[0], context)
    precomputed = _precomputed(argument, context)
    if precomputed is not None:
        return exp.column(precomputed, context.alias)
    columns = context.plan.query.table.columns

    def clamp_column(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in columns and columns[node.name].bounded:
            return null_preserving(node, clamp(node, columns[node.name].interval))
        return node

    total = total_expression(argument, columns)
    value = total.transform(clamp_column, copy=False)
    value = exp.func("TRY", value) if may_fail(total) else value
    if _is_boolean(argument, columns):
        value = exp.cast(value, "INTEGER")
    return value


def _is_boolean(node: exp.Expression, columns: dict) -> bool:
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.Predicate | exp.Connector | exp.Not):
        return True
    return isinstance(node, exp.Column) and node.name in columns and columns[node.name].type.value == "bool"
