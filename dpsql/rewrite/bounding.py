"""Contribution bounding, both halves: how a table is prepared when it is loaded, and how a query caps each unit.

The sensitivity analysis assumes that one privacy unit contributes at most m rows to a query, that those rows
are chosen by something that depends only on that unit's own rows and is unpredictable to the analyst, and
that every bounded column lies in its declared interval. This module is where the SQL makes that true.

At load (`prepared_rows`, once per table): each declared column is read with its declared type, NaN becomes
NULL (NaN sorts above every number, so it would slip through comparisons and clamps), text is cut to its
declared maximum length (the checker's per-row cost bound relies on it), and rows without a privacy unit or
with NULL in a column declared `nullable = false` are dropped. Then each row gets a secret salted hash of its
values (`__dp_key`), its rank within its unit by that hash (`__dp_rank`), the unit's row count (`__dp_n`), and
each bounded column its clamped fixed-point integer (`__dp_q_<col>`, see dp/fixedpoint.py); each text or integer
column with declared values the position of the row's value among them (`__dp_code_<col>`, NULL if none: queries
group by it) and a flag that there is one (`__dp_known_<col>`), and the row a bit
mask of the columns (and known flags) that hold more than one value among its unit's rows (`__dp_varies`). The
rows of units with more than m rows are stored last. Beside it (`later_rows`), the rows ranked m + 1 .. m + 4 of
those units, each with the lists of its unit's earlier rows' values. Queries then only filter, so they do not sort
the table per person each time.

At query time (`cap_rows`): a query without a row filter keeps `__dp_rank <= m`. A query with a filter caps
*after* filtering (the filter is row-local, so this still depends only on the unit's rows): rows among the first
m of their unit are kept if they pass; the next few are kept if fewer than m of their earlier rows pass, counted
over the lists by the filter rewritten to read them; only the rows after those, in units with still more rows
whose filter columns vary, are ranked again, in the load-time order (a unit whose filter columns hold one value
passes all its rows or none). Unless the filter reads only columns declared `per_unit` (the same value on every
row of a unit, checked at load by `varying_units`): it then keeps whole units, and `__dp_rank <= m` is the same
cap at the cost of a filter.

Everything here is a sqlglot tree; the engine decides how the source is read and where the result is stored.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.dp.fixedpoint import fixed_point
from dpsql.policy import ColumnPolicy, ColumnType, TablePolicy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT, literal


def prepared_rows(table: TablePolicy, source: exp.Expression, salt: int, portable: bool = False) -> exp.Select:
    """The SELECT that turns the rows of `source` (read with the declared types) into the prepared table.

    The salt makes each unit's choice of rows unpredictable; the same salt gives the same ranks. `portable`: the
    row key is `portable_key` and ties are broken by the row's values, so that another engine (Spark) given the
    same salt ranks every unit's rows exactly as DuckDB does; otherwise DuckDB's own (faster) hash()."""
    kept = _coded_rows(table, source, portable)
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
    if table.row_privacy:
        return exp.select("*", *_ranks(table, portable), *_quantized(table), *_known(table), copy=False) \
            .from_(keyed.subquery(copy=False), copy=False)
    # The varies mask per unit by a GROUP BY joined back: as windows beside the rank's, its min/max made the load
    # 5.6x as long (0.73 -> 4.1 s over 1M rows). The GROUP BY reads the source again rather than a CTE of the
    # keyed rows, which DuckDB materialized (10M rows: 20 s and 4.9 GB peak with the CTE, 16 s and 3.9 GB without;
    # before the mask 6 s and 1.4 GB).
    rows = exp.select("*", *_ranks(table, portable), *_quantized(table), *_known(table), copy=False) \
        .from_(keyed.subquery(copy=False), copy=False)
    units = exp.select("*", exp.alias_(unit.copy(), names.UNIT), copy=False) \
        .from_(_coded_rows(table, source, portable).subquery(copy=False), copy=False)
    per_unit = exp.select(exp.column(names.UNIT), *_varies(table, portable), copy=False) \
        .from_(units.subquery(copy=False), copy=False).group_by(exp.column(names.UNIT), copy=False)
    joined = exp.select("__dp_rows.*", exp.column(names.VARIES, "__dp_units"), copy=False) \
        .from_(rows.subquery("__dp_rows", copy=False), copy=False) \
        .join(per_unit.subquery("__dp_units", copy=False), on=exp.column(names.UNIT, "__dp_rows").eq(
            exp.column(names.UNIT, "__dp_units")), copy=False)
    # Stored with the rows of units over the bound last: the filtered cap's second part reads only those, and
    # DuckDB skips the row groups (of about 122,880 rows) whose __dp_n all lie at or below it; then by unit, as the
    # rank's window laid them out before (each unit's rows together, in rank order, for the window per query).
    # Speed only: no answer depends on the order of the rows (release shuffles the groups: see
    # tests/attacks/test_release_order.py, whose attack without the shuffle relies on a layout by unit).
    # Units with more rows than the later-rows table holds come last of all: only they go through the window.
    over = exp.column(names.UNIT_ROWS)
    return joined.order_by(over > table.bound.max_rows, over.copy() > table.bound.max_rows + LISTED_DEPTH,
                           exp.column(names.UNIT), exp.column(names.RANK), copy=False)


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
             whole_units: bool = False, listed: bool = True, examined: int | None = None) -> exp.Select:
    """The bounded query's rows, at most `max_rows` per unit. `tree` reads the prepared table `prepared` as
    `alias`, with the analyst's row filter (if any) as its WHERE; the result reads the kept rows as `alias`.

    The filter runs only on the rows ranked within `examined` (at least `max_rows`; None: no limit) of each unit,
    and the kept rows are the first `max_rows` of those that pass: so a person's work in the query is bounded
    whatever their number of rows (analysis/person_work.py chooses `examined`). Each part tests the rank in a CASE
    before the filter: a condition beside the filter, even one pushed into the scan, was not always tested first
    (DuckDB orders a scan's filters adaptively, and ran a costly filter on 10-20% of the rows beyond the cap).

    `whole_units`: the filter reads only columns declared `per_unit` (checked at load), so it keeps all of a unit's
    rows or none, and the rank prepared at load is already the rank among the kept rows. Keeping `rank <= m` is
    private whatever the filter (at most m rows of each unit, chosen by its own rows: capping before the filter
    is as private as after it); per_unit is what makes it the same answer as capping after.

    `listed`: the engine prepared the later-rows table (`later_rows`; DuckDB does, Spark does not): part 2 below.
    """
    if table.row_privacy:
        return tree  # every row is its own unit: the cap of one row holds by construction
    where = tree.args.get("where")
    if where is None:
        return tree.where(exp.column(names.RANK, alias) <= max_rows, copy=False)
    passes = where.this
    if whole_units:
        capped = tree.copy()
        capped.set("where", None)
        return capped.where(exp.column(names.RANK, alias) <= max_rows, _within(passes, max_rows), copy=False)
    examined = max(examined or _UNLIMITED, max_rows)

    def kept(*conditions: exp.Expression) -> exp.Select:
        return exp.select("*").from_(exp.to_table(prepared).as_(alias)) \
            .where(exp.and_(*conditions, copy=False), copy=False)

    # The first m passing rows of each unit in load-rank order, in three disjoint parts, so that only the few rows
    # that need it are ranked again (a window sorts, and it was 5-9x the query on its own).
    # 1. A row among the first m of its unit has at most m - 1 rows before it: it is kept if it passes (every
    #    unit with at most m rows is all here).
    # 2. A later row (rank r > m) is kept if it passes and fewer than m of the r - 1 rows before it pass. For the
    #    ranks m + 1 .. m + LISTED_DEPTH the loader stored those rows' values beside the row (`later_rows`): the
    #    filter, rewritten to read them, is counted over them, row by row, without a window. Only when the filter
    #    reads columns of this table alone (no subquery): else this part is left out and part 3 takes its rows.
    # 3. The rows after those, in units with more rows: with f the unit's failing rows among its first m and L
    #    its passing later rows before this one, kept if m - f + L < m, or L < f. One window over the unit's
    #    failing first and passing later rows, in rank order (the f failing ones come first) numbers the passing
    #    later rows f + L + 1: kept if that is at most 2f.
    # In parts 2 and 3, a unit whose rows all hold the same value of every column the filter reads (the load-time
    # mask) passes all its rows or none, so none of its later rows is kept (f = 0 or no passing row): it is left
    # out before the filter runs, which leaves nothing to do when the filter reads columns constant within units
    # (age, sex, region of a patient). A row's values meet the filter at most seven times, whatever the data: in
    # each part, and in the lists of up to LISTED_DEPTH later rows of its unit.
    rank, rows = exp.column(names.RANK), exp.column(names.UNIT_ROWS)
    first_rows = kept(rank <= max_rows, _within(passes, max_rows))
    same = _one_value_within_units(passes, table, alias)
    # The later-rows table was built for the table's own bound (a smaller one would need other rows listed).
    listed = listed and max_rows == table.bound.max_rows and examined > max_rows
    passing_before = _passing_earlier_rows(passes, table, alias) if listed else None
    parts = [first_rows]
    windowed_from = max_rows
    if passing_before is not None:
        decided = exp.Case().when(rank.copy() > examined, exp.false(), copy=False) \
            .when(same.copy(), exp.false(), copy=False) \
            .when(passes.copy(), passing_before < max_rows, copy=False).else_(exp.false(), copy=False)
        lists = [exp.column(names.earlier_column(name)) for name in _listed(table)]
        parts.append(exp.select(exp.Star(except_=lists)).from_(
            exp.to_table(names.later_rows_table(table.name)).as_(alias)).where(decided, copy=False))
        windowed_from = max_rows + LISTED_DEPTH
    if examined <= windowed_from:
        return _union(parts, alias)
    # One CASE, so that the filter runs only on the rows of units whose filter columns vary (DuckDB evaluated the
    # filter first when it was a conjunction beside the mask's test, and it did not push that test into the scan),
    # and only on the rows within the look-ahead.
    candidates = exp.Case().when(rank.copy() > examined, exp.false(), copy=False) \
        .when(same.copy(), exp.false(), copy=False) \
        .when(rank.copy() <= max_rows, exp.Not(this=exp.Coalesce(this=passes.copy(), expressions=[exp.false()])),
              copy=False) \
        .else_(passes.copy(), copy=False)
    in_rank_order = exp.Order(expressions=[exp.Ordered(this=rank.copy())])
    # COUNT of a CASE rather than COUNT(*) FILTER, which the Spark translation does not take.
    failing_first = exp.Window(this=exp.Count(this=exp.Case().when(rank.copy() <= max_rows, exp.Literal.number(1),
                                                                   copy=False)),
                               partition_by=[exp.column(names.UNIT)], order=in_rank_order)
    parts.append(kept(rows > windowed_from, candidates).qualify(
        exp.and_(rank.copy() > windowed_from, _rank_among_kept() <= exp.Literal.number(2) * failing_first,
                 copy=False),
        copy=False))
    return _union(parts, alias)


# No look-ahead given: the filtered cap may read every row of a unit.
_UNLIMITED = 2**31 - 1


def _within(condition: exp.Expression, rank_limit: int) -> exp.Expression:
    """`condition` on the rows ranked within `rank_limit` of their unit, FALSE on the others, without running it
    there: a CASE evaluates its THEN only on the rows its WHEN selects."""
    return exp.Case().when(exp.column(names.RANK) <= rank_limit, condition.copy(), copy=False) \
        .else_(exp.false(), copy=False)


def _union(parts: list[exp.Select], alias: str) -> exp.Select:
    union = parts[0]
    for part in parts[1:]:
        union = exp.union(union, part, distinct=False, copy=False)
    return exp.select("*").from_(union.subquery(alias, copy=False), copy=False)


# Rows ranked m + 1 .. m + LISTED_DEPTH in units over the bound get their earlier rows' values (`later_rows`), so
# that the filtered cap decides them without a window; later ones (units with more rows still) go to the window.
# The lists hold at most LISTED_DEPTH * (m + LISTED_DEPTH / 2) values per such unit and column.
LISTED_DEPTH = 4


def later_rows(table: TablePolicy, prepared: str) -> exp.Select | None:
    """The SELECT of the later-rows table from the prepared table `prepared` (None under row privacy): its rows
    ranked m + 1 .. m + LISTED_DEPTH in units with more than m rows, each with every column's values on the unit's
    rows ranked before it, as lists in rank order (`__dp_earlier_<col>`, at index i the row ranked i).

    The lists are cut from one list of whole rows (structs), so that index i of every list is the same row; a
    struct is never NULL, so no engine's list aggregate drops one (Spark's collect_list drops NULLs)."""
    if table.row_privacy:
        return None
    m = table.bound.max_rows
    row = exp.Struct(expressions=[exp.PropertyEQ(this=exp.to_identifier(name, quoted=True), expression=_column(name))
                                  for name in _listed(table)])
    before = exp.Window(this=exp.ArrayAgg(this=row), partition_by=[exp.column(names.UNIT)],
                        order=exp.Order(expressions=[exp.Ordered(this=exp.column(names.RANK))]),
                        spec=exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING",
                                            end=exp.Literal.number(1), end_side="PRECEDING"))
    heads = exp.select("*", exp.alias_(before, names.EARLIER), copy=False).from_(prepared, copy=False).where(
        exp.and_(exp.column(names.UNIT_ROWS) > m, exp.column(names.RANK) <= m + LISTED_DEPTH), copy=False)
    element = names.EARLIER_ELEMENT
    lists = [exp.alias_(exp.Transform(this=exp.column(names.EARLIER), expression=exp.Lambda(
        this=exp.Dot(this=exp.column(element), expression=exp.to_identifier(name, quoted=True)),
        expressions=[exp.to_identifier(element)])), names.earlier_column(name)) for name in _listed(table)]
    return exp.select(exp.Star(except_=[exp.column(names.EARLIER)]), *lists, copy=False) \
        .from_(heads.subquery(copy=False), copy=False).where(exp.column(names.RANK) > m, copy=False) \
        .order_by(exp.column(names.UNIT), exp.column(names.RANK), copy=False)


def _listed(table: TablePolicy) -> list[str]:
    """The prepared columns whose earlier values the later-rows table lists: the declared ones and the known flags."""
    return [*table.columns, *_known_names(table)]


def _passing_earlier_rows(condition: exp.Expression, table: TablePolicy, alias: str) -> exp.Expression | None:
    """How many of the row's earlier rows `condition` keeps, from the later-rows table's lists, or None when it
    reads anything but this table's declared columns and known flags (a subquery, another table, another dpsql
    column).

    A lambda over the list of one column, the columns that hold one value in the unit (the load-time mask; the
    unit itself) read from the row itself: they are the same on the earlier rows, exactly (the mask compares NULLs
    and the sign of zeros). One such lambda per column read, for the units where the others hold one value; the
    other units zip the lists (one struct per earlier row), which was about twice as slow. An index into each
    list was slower still: DuckDB copies a list a lambda reads from outside once per element."""
    read = _columns_read(condition, table, alias)
    if read is None:
        return None
    if len(read) <= 1:  # no column but the unit's: the same on all rows; counted over any list of earlier rows
        return _count_earlier(condition, read or [next(iter(table.columns))], alias, set())
    flagged = _flagged(table)
    count = exp.Case()
    for name in read:
        others = [other for other in read if other != name]
        if all(other in flagged for other in others):
            same = _hold_one_value(alias, sum(flagged[other] for other in others))
            count = count.when(same, _count_earlier(condition, [name], alias, set(others)), copy=False)
    zipped = _count_earlier(condition, read, alias, set())
    return count.else_(zipped, copy=False) if count.args.get("ifs") else zipped


def _count_earlier(condition: exp.Expression, lists: list[str], alias: str, own: set[str]) -> exp.Expression:
    """How many earlier rows `condition` keeps: a lambda over the list of the one column in `lists` (or over the
    lists zipped), reading the columns in `own` from the row itself and the unit's column from the row too."""
    element = exp.column(names.EARLIER_ELEMENT)

    def on_earlier(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or node.name in own or node.name not in lists:
            return node  # the row's own value (one value in the unit), or not a column
        if len(lists) == 1:
            return element.copy()
        # sqlglot numbers from 0 and writes DuckDB's e[1] for the first field.
        return exp.Bracket(this=element.copy(), expressions=[exp.Literal.number(lists.index(node.name))])

    columns = [exp.column(names.earlier_column(name), alias) for name in lists]
    over = columns[0] if len(columns) == 1 else exp.Anonymous(this="LIST_ZIP", expressions=columns)
    body = _on_earlier_rows(condition, lists).transform(on_earlier, copy=False)
    return exp.ArraySize(this=exp.ArrayFilter(this=over, expression=exp.Lambda(
        this=body, expressions=[exp.to_identifier(names.EARLIER_ELEMENT)])))


def _on_earlier_rows(condition: exp.Expression, lists: list[str]) -> exp.Expression:
    """The part of `condition` the lambda must test on the earlier rows. Counted only for a row that passes it, so
    each of its conjuncts is TRUE on that row; one that reads none of the listed columns (only columns that hold
    one value in the unit, read from the row itself) is then TRUE on every earlier row too, and is left out: DuckDB
    copies what a lambda reads from outside once per element (1M rows: 4.1 -> 3.2 ms for the later rows)."""
    needed = [part for part in _conjuncts(condition)
              if any(column.name in lists for column in part.find_all(exp.Column))]
    return exp.and_(*needed) if needed else exp.true()


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    """The operands of `condition`'s ANDs, through parentheses at any depth."""
    bare = condition.unnest()
    if isinstance(bare, exp.And):
        return [part for side in (bare.this, bare.expression) for part in _conjuncts(side)]
    return [condition]


def _one_value_within_units(condition: exp.Expression, table: TablePolicy, alias: str) -> exp.Expression:
    """A condition, the same on all rows of a unit, that holds only if every column `condition` reads has one value
    on all the unit's rows (by the load-time `varies` mask), so that `condition` has one value on all of them too.
    FALSE when that cannot be told from the columns alone (a column without a bit, a subquery)."""
    read, flagged = _columns_read(condition, table, alias), _flagged(table)
    if read is None or any(name not in flagged for name in read):
        return exp.false()
    return _hold_one_value(alias, sum(flagged[name] for name in read))


def _columns_read(condition: exp.Expression, table: TablePolicy, alias: str) -> list[str] | None:
    """The declared columns and known flags of this table that `condition` reads, but the unit's (one value in a
    unit by definition), each once in the order met; None if it reads anything else (a subquery, another table,
    another dpsql column)."""
    if any(isinstance(node, exp.Query) for node in condition.walk()):
        return None
    listed, read = set(_listed(table)), []
    for column in condition.find_all(exp.Column):
        if column.table not in ("", alias) or column.name not in listed:
            return None
        if column.name not in read and column.name != table.privacy_unit:
            read.append(column.name)
    return read


def _hold_one_value(alias: str, mask: int) -> exp.Expression:
    """Whether the columns of `mask`'s bits hold one value each on all the row's unit's rows (the `varies` mask)."""
    return exp.EQ(this=exp.BitwiseAnd(this=exp.column(names.VARIES, alias), expression=exp.Literal.number(mask)),
                  expression=exp.Literal.number(0))


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


def known(column: ColumnPolicy) -> str | None:
    """The prepared table's flag of a column with declared values that the row's value is one of them (NULL: no),
    if it has one: a filter keeping rows whose key is a declared value reads it instead of comparing text."""
    return names.known_column(column.name) if column.flags_values else None


def _known_names(table: TablePolicy) -> list[str]:
    """The known flags' names, in the policy's order: the SQL built from them (the later-rows table's columns, the
    store's identity) is then the same text in every process, which a set's order is not."""
    return [name for name in map(known, table.columns.values()) if name is not None]


def _known(table: TablePolicy) -> list[exp.Expression]:
    return [exp.alias_(_is_known(column), known(column)) for column in table.columns.values() if known(column)]


def _is_known(column: ColumnPolicy) -> exp.Expression:
    """Whether the column's value is one of its declared values (NULL: no), from its code."""
    return exp.column(code(column)).is_(exp.null()).not_()


def code(column: ColumnPolicy) -> str | None:
    """The prepared table's small integer of a column with declared values, if it has one: i for the i-th declared
    value, NULL for any other value and for NULL. A query grouping by the column groups by it instead (rewrite/
    passes.py): hashing a small integer is far cheaper than hashing text (10M rows, eight departments: 45 ms against
    108, with the engine's perfect hash tables off: see engines/duckdb_engine.py)."""
    return names.code_column(column.name) if column.flags_values else None


def lookup(subject: exp.Expression, pairs: list[tuple[exp.Expression, exp.Expression]]) -> exp.Case:
    """CASE WHEN subject = a THEN b ... END over `pairs` (a value to its code at a portable load, a code back to its
    value after a query's aggregation). Built in place: Case.when copies the whole CASE by default, which made it
    quadratic in the declared values (red team: 1,000 values took 13 s per query to rewrite, 10,000 about half an
    hour, holding the GIL, before any charge)."""
    found = exp.Case()
    for match, result in pairs:
        found.when(subject.copy().eq(match), result, copy=False)
    return found


def _coded_rows(table: TablePolicy, source: exp.Expression, portable: bool) -> exp.Select:
    """The cleaned rows with each column's code (`code`). Found by a join with the declared values, whose time does
    not grow with their number (an IN list of 1,000 values took 12 s over 10M rows, the join 0.3 s); the values are
    grouped first, so that no row can meet two of them, whatever the engine's equality. `portable` (Spark): a CASE,
    which the Spark translation takes."""
    coded = [column for column in table.columns.values() if code(column)]
    cleaned = cleaned_rows(table, source)
    if not coded:
        return cleaned
    if portable:
        def case(column: ColumnPolicy) -> exp.Expression:
            assert column.values is not None
            pairs = [(literal(value), exp.Literal.number(index)) for index, value in enumerate(column.values, 1)]
            return exp.cast(lookup(_column(column.name), pairs), exp.DataType.Type.SMALLINT)
        return exp.select("*", *[exp.alias_(case(column), code(column)) for column in coded], copy=False) \
            .from_(cleaned.subquery(copy=False), copy=False)
    rows = "__dp_cleaned"
    tree = exp.select(f"{rows}.*", *[exp.alias_(exp.column("c", f"__dp_codes_{i}"), code(column))
                                     for i, column in enumerate(coded)], copy=False) \
        .from_(cleaned.subquery(rows, copy=False), copy=False)
    for i, column in enumerate(coded):
        assert column.values is not None
        pairs = exp.Values(expressions=[exp.tuple_(literal(value), exp.Literal.number(index))
                                        for index, value in enumerate(column.values, start=1)],
                           alias=exp.TableAlias(this=exp.to_identifier("m"),
                                                columns=[exp.to_identifier("v"), exp.to_identifier("c")]))
        codes = exp.select(exp.column("v"), exp.alias_(exp.cast(exp.Min(this=exp.column("c")),
                                                                 exp.DataType.Type.SMALLINT), "c"), copy=False) \
            .from_(pairs, copy=False).group_by(exp.column("v"), copy=False)
        tree = tree.join(codes.subquery(f"__dp_codes_{i}", copy=False), join_type="left", copy=False,
                         on=exp.column(exp.to_identifier(column.name, quoted=True), rows).eq(
                             exp.column("v", f"__dp_codes_{i}")))
    return tree


_VARIES_BITS = 63  # a BIGINT's non-negative bits


def _flagged(table: TablePolicy) -> dict[str, int]:
    """The columns that have a bit in the prepared table's `varies` mask, with their bit: the declared columns but
    the unit, then the known flags, in the policy's order (the same policy, the same bits), as many as fit."""
    columns = [name for name in table.columns if name != table.privacy_unit] + _known_names(table)
    return {name: 1 << bit for bit, name in enumerate(columns[:_VARIES_BITS])}


def _varies(table: TablePolicy, portable: bool) -> list[exp.Expression]:
    """Which flagged columns hold more than one value among a unit's rows, as a bit mask (cap_rows leaves out of its
    window the units whose filter columns hold one value each): an aggregate over the unit's rows. One BIGINT, not
    a flag per column: a test of one column DuckDB can skip by its statistics, which an OR of flags does not get.
    `portable` (Spark has no signbit): a double's bit is always set, "may vary", which is always safe."""
    values = {name: _column(name) for name in table.columns} | {
        known(column): _is_known(column) for column in table.columns.values() if known(column)}
    nullable = {name: column.nullable for name, column in table.columns.items()}
    floating = {name for name, column in table.columns.items() if column.type is ColumnType.FLOAT}
    always = {name for name in floating if portable}
    def bit_if_varies(name: str, bit: int) -> exp.Expression:
        if name in always:
            return exp.Literal.number(bit)
        same = _one_value(values[name], nullable.get(name, False), name in floating)
        return exp.Case().when(exp.Not(this=exp.paren(same)), exp.Literal.number(bit)).else_(exp.Literal.number(0))

    bits = [bit_if_varies(name, bit) for name, bit in _flagged(table).items()]
    mask = exp.cast(_sum(bits) if bits else exp.Literal.number(0), exp.DataType.Type.BIGINT)
    return [exp.alias_(mask, names.VARIES)]


def _sum(terms: list[exp.Expression]) -> exp.Expression:
    total = terms[0]
    for term in terms[1:]:
        total = exp.Add(this=total, expression=term)
    return total


def _one_value(value: exp.Expression, nullable: bool, floating: bool) -> exp.Expression:
    """Whether `value` is the same on all of the unit's rows (an aggregate): smallest and largest equal (or both
    NULL), no NULL beside a value, and for a double the same sign bit, which tells -0.0 from 0.0 where `=` does not
    (a filter such as `1 / x > 0` does; NaN is NULL already)."""
    def equal_ends(of: exp.Expression) -> exp.Expression:
        return exp.NullSafeEQ(this=exp.Min(this=of), expression=exp.Max(this=of.copy()))

    conditions = [equal_ends(value)]
    if floating:
        conditions.append(equal_ends(exp.Anonymous(this="signbit", expressions=[value.copy()])))
    if nullable:
        conditions.append(exp.In(this=exp.Count(this=value.copy()), expressions=[
            exp.Literal.number(0), exp.Count(this=exp.Star())]))
    return exp.and_(*conditions, copy=False)


def _quantized(table: TablePolicy) -> list[exp.Expression]:
    # 32-bit columns: a fixed-point bound is below 2**30.
    return [exp.alias_(exp.cast(fixed_point(column.interval).centered(_column(name)), exp.DataType.Type.INT),
                       quantized(column)) for name, column in table.columns.items() if column.bounded]
