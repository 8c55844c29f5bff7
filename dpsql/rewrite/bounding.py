"""Contribution bounding, both halves: how a table is prepared when it is loaded, and how a query caps each unit.

The sensitivity analysis assumes that one privacy unit contributes at most m rows to a query, that those rows
are chosen by something that depends only on that unit's own rows and is unpredictable to the analyst, and
that every bounded column lies in its declared interval. This module is where the SQL makes that true.

At load (`prepared_rows`, once per table): each declared column is read with its declared type, NaN becomes
NULL (NaN sorts above every number, so it would slip through comparisons and clamps), text is cut to its
declared maximum length (the checker's per-row cost bound relies on it), and rows without a privacy unit or
with NULL in a column declared `nullable = false` are dropped. Then each row gets a secret salted hash of its
values (`__dp_key`), its rank within its unit by that hash (`__dp_rank`), the unit's row count (`__dp_n`), and
each bounded column its clamped fixed-point integer (`__dp_q_<col>`, see dp/fixedpoint.py). Queries then only
filter, so they do not sort the table per person each time.

At query time (`cap_rows`): a query without a row filter keeps `__dp_rank <= m`. A query with a filter caps
*after* filtering (the filter is row-local, so this still depends only on the unit's rows), ranking again, in
the load-time order, only the rows after the m-th of units with more than m rows in all; unless the filter
reads only columns declared `per_unit` (the same value on every row of a unit, checked at load by
`varying_units`): it then keeps whole units, and `__dp_rank <= m` is the same cap at the cost of a filter.

Everything here is a sqlglot tree; the engine decides how the source is read and where the result is stored.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.dp.fixedpoint import fixed_point
from dpsql.policy import ColumnPolicy, ColumnType, TablePolicy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT


def prepared_rows(table: TablePolicy, source: exp.Expression, salt: int, portable: bool = False) -> exp.Select:
    """The SELECT that turns the rows of `source` (read with the declared types) into the prepared table.

    The salt makes each unit's choice of rows unpredictable; the same salt gives the same ranks. `portable`: the
    row key is `portable_key` and ties are broken by the row's values, so that another engine (Spark) given the
    same salt ranks every unit's rows exactly as DuckDB does; otherwise DuckDB's own (faster) hash()."""
    kept = cleaned_rows(table, source)
    unit = _column(table.privacy_unit) if table.privacy_unit is not None else exp.Window(this=exp.RowNumber())
    # DuckDB's hash() gives -0.0 and 0.0 one value: two rows of a unit that differ only there would tie, and the
    # rank window would order them as its sort meets them, which follows other units' rows (red team). Each float's
    # sign bit goes into the hash too, so that rows a query can tell apart never share a key (exact duplicates do,
    # and which of them is kept cannot be seen). The portable key (a fixed bounding seed) keys a zero by its text.
    signs = [exp.Anonymous(this="signbit", expressions=[_column(name)]) for name, column in table.columns.items()
             if column.type is ColumnType.FLOAT]
    row_hash = portable_key(table, salt) if portable else exp.Anonymous(
        this="hash", expressions=[*map(_column, table.columns), *signs, exp.Literal.number(salt)])
    keyed = exp.select("*", exp.alias_(unit, names.UNIT), exp.alias_(row_hash, names.ROW_KEY), copy=False) \
        .from_(kept.subquery(copy=False), copy=False)
    return exp.select("*", *_ranks(table, portable), *_quantized(table), copy=False).from_(
        keyed.subquery(copy=False), copy=False)


# Floats enter the portable key at this resolution only (2**-20), as an integer: the text of a double differs
# between engines (DuckDB '10000000.0', Java '1.0E7'), its floor does not. Rows this leaves tied are ordered by
# their values (`_rank_within_unit`), which both engines sort alike.
_FLOAT_STEPS = 1 << 20
_FLOAT_KEYED = 1e12  # beyond it (or for infinities) a float enters the key as 'L' only: the floor must fit a BIGINT


def portable_key(table: TablePolicy, salt: int) -> exp.Expression:
    """md5 of the salt and each declared column's length-prefixed text (NULL as '-'): a secret order of a unit's
    rows that DuckDB and Spark compute identically (ints, text, booleans and dates have the same text in both)."""
    parts: list[exp.Expression] = [exp.Literal.string(str(salt))]
    for name, column in table.columns.items():
        value = _column(name)
        if column.type is ColumnType.FLOAT:
            # A zero enters as its text, '0.0' or '-0.0' in both engines: a query tells them apart, so their rows
            # must not tie (the red team's -0.0 finding, test_zero_sign_ties.py).
            scaled = exp.Floor(this=exp.Mul(this=value, expression=exp.Literal.number(_FLOAT_STEPS)))
            text = exp.Case().when(value.copy().eq(0), exp.cast(value.copy(), exp.DataType.Type.VARCHAR)) \
                .when(exp.Abs(this=value.copy()) < exp.Literal.number(_FLOAT_KEYED),
                      exp.cast(exp.cast(scaled, exp.DataType.Type.BIGINT), exp.DataType.Type.VARCHAR)) \
                .else_(exp.Literal.string("L"))
        else:
            text = exp.cast(value, exp.DataType.Type.VARCHAR)
        length = exp.cast(exp.Length(this=text.copy()), exp.DataType.Type.VARCHAR)
        parts.append(exp.Coalesce(this=exp.Concat(expressions=[length, exp.Literal.string(":"), text]),
                                  expressions=[exp.Literal.string("-")]))
    return exp.MD5(this=exp.Concat(expressions=parts))


def cleaned_rows(table: TablePolicy, source: exp.Expression) -> exp.Select:
    """The rows of `source` with the declared types, NaN as NULL, text cut to its length, and without the rows
    that lack a unit or have NULL where the policy says never: all a public table gets at load."""
    cleaned = exp.select(*[exp.alias_(_cleaned(column), _column(name).this) for name, column in table.columns.items()],
                         copy=False).from_(source.copy(), copy=False)
    conditions = [_column(name).is_(exp.null()).not_() for name, column in table.columns.items()
                  if not column.nullable]
    if table.privacy_unit is not None:
        conditions.append(_column(table.privacy_unit).is_(exp.null()).not_())
    # The conditions test the cleaned columns (NaN already NULL), not the raw ones.
    kept = exp.select("*", copy=False).from_(cleaned.subquery(copy=False), copy=False)
    if conditions:
        kept = kept.where(exp.and_(*conditions, copy=False), copy=False)
    return kept


def cap_rows(tree: exp.Select, table: TablePolicy, max_rows: int, prepared: str, alias: str,
             whole_units: bool = False) -> exp.Select:
    """The bounded query's rows, at most `max_rows` per unit. `tree` reads the prepared table `prepared` as
    `alias`, with the analyst's row filter (if any) as its WHERE; the result reads the kept rows as `alias`.

    `whole_units`: the filter reads only columns declared `per_unit` (checked at load), so it keeps all of a unit's
    rows or none, and the rank prepared at load is already the rank among the kept rows. Keeping `rank <= m` is
    private whatever the filter (at most m rows of each unit, chosen by its own rows: capping before the filter
    is as private as after it); per_unit is what makes it the same answer as capping after.
    """
    if table.row_privacy:
        return tree  # every row is its own unit: the cap of one row holds by construction
    where = tree.args.get("where")
    if where is None or whole_units:
        return tree.where(exp.column(names.RANK, alias) <= max_rows, copy=False)
    def kept(*conditions: exp.Expression) -> exp.Select:
        return exp.select("*").from_(exp.to_table(prepared).as_(alias)) \
            .where(exp.and_(where.this.copy(), *conditions, copy=False), copy=False)

    # Three disjoint parts of the filtered rows, so that only the few that need it are ranked again (a window
    # sorts, and it was 5-9x the query on its own). A unit with at most m rows in all keeps all it passes; a row
    # among the first m of its unit at load has at most m - 1 passing rows before it, so it is kept; only the later
    # rows of larger units are ranked among their unit's passing rows, by the load-time rank (the same order as
    # the hash, cheaper to sort). The union is exactly the first m passing rows of each unit.
    rows = exp.column(names.UNIT_ROWS)
    rank = exp.column(names.RANK)
    small_units = kept(rows <= max_rows)
    first_rows = kept(rows.copy() > max_rows, rank <= max_rows)
    later_rows = kept(rows.copy() > max_rows).qualify(
        exp.and_(rank.copy() > max_rows, _rank_among_kept() <= max_rows, copy=False), copy=False)
    union = exp.union(exp.union(small_units, first_rows, distinct=False, copy=False), later_rows, distinct=False,
                      copy=False)
    return exp.select("*").from_(union.subquery(alias, copy=False), copy=False)


def varying_units(table: TablePolicy, prepared: str, column: ColumnPolicy) -> exp.Select:
    """How many units have more than one value (NULL counting as one) in a column declared per_unit: must be 0.

    Values are compared as DuckDB's text of them, which tells apart what `=` does not: -0.0 and 0.0 are equal, yet
    a filter such as `1 / x > 0` or `CAST(x AS TEXT) = '0.0'` keeps one and drops the other (found by the red
    team). A double's text is its shortest round-trip form, so distinct values always have distinct text."""
    value = exp.cast(exp.column(column.name), exp.DataType.Type.VARCHAR)
    varies = exp.or_(exp.Count(this=exp.Distinct(expressions=[value])) > 1,
                     exp.and_(exp.Count(this=value.copy()) > 0, exp.Count(this=value.copy()) < exp.Count(
                         this=exp.Star())))
    per_unit = exp.select(exp.column(names.UNIT)).from_(prepared).group_by(exp.column(names.UNIT)).having(varies)
    return exp.select(exp.Count(this=exp.Star())).from_(per_unit.subquery())


def quantized(column: ColumnPolicy) -> str | None:
    """The prepared table's fixed-point integer of a column (fixed_point of its declared interval), if it has one:
    a query summing the bare column sums that instead."""
    return names.quantized_column(column.name) if column.bounded else None


def _column(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True))


def _cleaned(column: ColumnPolicy) -> exp.Expression:
    value = exp.cast(_column(column.name), exp.DataType.build(column.type.duckdb, dialect=DIALECT))
    if column.type is ColumnType.FLOAT:
        return exp.Case().when(exp.IsNan(this=value), exp.null()).else_(value.copy())
    if column.type is ColumnType.TEXT:
        return exp.Left(this=value, expression=exp.Literal.number(column.text_length))
    return value


def _rank_within_unit(table: TablePolicy, portable: bool) -> exp.Window:
    """Each row's rank among its unit's rows, by the salted hash (portable: then by the row's values, NULLs first,
    so that no two rows that differ tie, in either engine)."""
    order = [exp.Ordered(this=exp.column(names.ROW_KEY))]
    if portable:
        order += [exp.Ordered(this=_column(name), nulls_first=True) for name in table.columns]
    return exp.Window(this=exp.RowNumber(), partition_by=[exp.column(names.UNIT)],
                      order=exp.Order(expressions=order))


def _rank_among_kept() -> exp.Window:
    """A row's rank among the rows of its unit a query keeps, in load-time rank order."""
    return exp.Window(this=exp.RowNumber(), partition_by=[exp.column(names.UNIT)],
                      order=exp.Order(expressions=[exp.Ordered(this=exp.column(names.RANK))]))


def _ranks(table: TablePolicy, portable: bool) -> list[exp.Expression]:
    if table.row_privacy:
        return [exp.alias_(exp.Literal.number(1), names.RANK), exp.alias_(exp.Literal.number(1), names.UNIT_ROWS)]
    # 32-bit columns: no unit has 2**31 rows.
    unit_rows = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[exp.column(names.UNIT)])
    return [exp.alias_(exp.cast(_rank_within_unit(table, portable), exp.DataType.Type.INT), names.RANK),
            exp.alias_(exp.cast(unit_rows, exp.DataType.Type.INT), names.UNIT_ROWS)]


def _quantized(table: TablePolicy) -> list[exp.Expression]:
    # 32-bit columns: a fixed-point bound is below 2**30.
    return [exp.alias_(exp.cast(fixed_point(column.interval).centered(_column(name)), exp.DataType.Type.INT),
                       quantized(column)) for name, column in table.columns.items() if column.bounded]
