"""The bounded SQL (DuckDB's dialect, from rewrite/) as Spark SQL that computes exactly the same rows, or a refusal.

Nothing here reads data: whether a query can run on Spark is decided from its SQL text and the prepared tables'
column types, so a refusal is a QueryRejected before the charge ("not supported on the Spark engine: ...").

Only an allow-list of SQL nodes passes (`_ALLOWED`), each one checked to mean the same in both engines on every
value; everything else is refused, which is also what keeps Spark-only functions (reflect, java_method,
input_file_name) and file tables (parquet.`/x`) out, should one ever get past the checker. The translations:
- TRY(e) -> (e). The checker already made every analyst expression total (TRY is DuckDB's second layer only), and
  the engine runs Spark with ANSI mode off, where what would still fail (a bad cast) is NULL. The parentheses
  stay: sqlglot writes a tree as it is, and `a AND TRY(b OR c)` must not become `a AND b OR c`.
- HUGEINT (INT128) -> DECIMAL(38, 0); every SUM of integers sums DECIMAL(38, 0) (DuckDB's SUM of integers is a
  HUGEINT; Spark's SUM of a BIGINT would wrap around on overflow). DECIMAL(38, 0) holds less than HUGEINT (1e38
  against 1.7e38): arithmetic, or a cast of a double to HUGEINT, whose range (engines/spark_ranges.py) reaches
  beyond it is refused.
- CAST(double AS integer) rounds half to even in DuckDB and truncates in Spark: it becomes CAST(BROUND(e, 0) ...),
  and a TRY_CAST is NULL outside the target's range, as in DuckDB.
- `/` divides as DOUBLE (Spark would divide DECIMAL as DECIMAL); FLOOR and CEIL of a DOUBLE stay DOUBLE.
- A double `/` or `%` by 0 (or -0.0) is DuckDB's IEEE result, +-inf or NaN, where Spark's is NULL.
- Date parts (EXTRACT and the functions): DuckDB's BIGINT of the same calendar (`_DATE_PARTS`): DAYOFWEEK(d) - 1
  (Sunday is 0 in DuckDB, 1 in Spark), ISODOW as WEEKDAY + 1, ISO weeks and years as Spark's WEEKOFYEAR and
  YEAROFWEEK (YEARWEEK their year * 100 + week), decades, centuries and millennia from the year, EPOCH from
  UNIX_DATE; the era and the Julian day stay refused. DATE_TRUNC
  of a date to a year, quarter, month, week or day: Spark's TRUNC as a TIMESTAMP_NTZ.
  EXISTS means the same.
- GROUPING(a, b) -> grouping(a) * 2 + grouping(b) (Spark's GROUPING takes one column, its grouping_id all of the
  grouping columns); ROLLUP, CUBE, GROUPING SETS and VALUES (a public CTE, inlined) as written.
- SQRT is IEEE's correctly rounded square root in both (NaN below 0); SIGN is a CASE (DuckDB's sign of NaN is 0);
  ROUND of a double to a whole number, or of an integer, is the same in both (`_rounded`).
- LIKE's pattern is rewritten for Spark's backslash escapes (`_like`); ILIKE stays refused (case folding).
- POWER(e, 2) -> e * e (both engines' pow(x, 2) is the correctly rounded x * x; Java's general pow need not be).
- QUALIFY (Spark 3.5 has none) -> a window column in a subquery, filtered outside it.
Casts from text, of doubles to text, SUMs of doubles (their rounding depends on the order of addition) and any
other function are refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from dpsql.engines.spark_ranges import first_too_wide
from dpsql.errors import QueryRejected
from dpsql.sql.parse import DIALECT

SPARK = "spark"
# Column name -> DuckDB type, per prepared table name.
Schema = Mapping[str, Mapping[str, str]]

_ALLOWED = (
    exp.Select, exp.Union, exp.Subquery, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered,
    exp.Alias, exp.TableAlias, exp.Table, exp.Column, exp.Identifier, exp.Star, exp.Literal, exp.Null,
    exp.Boolean, exp.Paren, exp.Window, exp.RowNumber, exp.DenseRank, exp.Join, exp.Qualify, exp.DataType,
    exp.In, exp.Between,
    exp.Is, exp.Not, exp.And, exp.Or, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Add, exp.Sub, exp.Mul,
    exp.Div, exp.Neg, exp.Mod, exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Abs, exp.Floor,
    exp.Ceil, exp.Cast, exp.TryCast, exp.Try, exp.Count, exp.Sum, exp.Max, exp.Min, exp.Distinct, exp.Pow,
    exp.Year, exp.Month, exp.Day, exp.Length, exp.Tuple, exp.BitwiseAnd, exp.DayOfWeek, exp.DayOfYear, exp.Quarter,
    exp.Exists, exp.Grouping, exp.GroupingSets, exp.Rollup, exp.Cube, exp.Nullif, exp.Values, exp.Sqrt, exp.Sign,
    exp.Round, exp.Like, exp.Escape, exp.Extract, exp.TimestampTrunc, exp.DateTrunc, exp.Week, exp.WeekOfYear,
    exp.DayOfWeekIso, exp.YearOfWeek,
)
# A part's name (EXTRACT's, DATE_TRUNC's): allowed only under those, which translate the parts they know.
_PART_OWNERS = (exp.Extract, exp.TimestampTrunc, exp.DateTrunc)
# Built by dpsql itself at load (rewrite/bounding.py), never from an analyst's text.
_LOAD_ONLY = (exp.MD5, exp.Concat, exp.DPipe, exp.IsNan, exp.Left, exp.Substring, exp.NullSafeEQ)
_INTEGERS = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
             exp.DataType.Type.BIGINT, exp.DataType.Type.INT128}
_FLOATS = {exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT}
_RANGES = {exp.DataType.Type.TINYINT: 2 ** 7, exp.DataType.Type.SMALLINT: 2 ** 15, exp.DataType.Type.INT: 2 ** 31,
           exp.DataType.Type.BIGINT: 2 ** 63, exp.DataType.Type.INT128: 10 ** 38}
_TEXT = {exp.DataType.Type.VARCHAR, exp.DataType.Type.TEXT}
_TIMESTAMPS = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ}  # DuckDB's TIMESTAMP, as sqlglot reads it
_WIDE = exp.DataType.build("DECIMAL(38, 0)")


def refuse(what: str) -> QueryRejected:
    return QueryRejected(f"not supported on the Spark engine: {what}")


def to_spark(sql: str, schema: Schema, trusted: bool = False) -> str:
    """`sql` (DuckDB's dialect) as Spark SQL with the same result, or QueryRejected. `trusted`: SQL built by dpsql
    at load (the portable key's md5, NaN checks), which may use a few functions more."""
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except SqlglotError as exc:
        raise refuse(f"the bounded SQL does not parse ({type(exc).__name__})") from None
    _vet(tree, schema, trusted)
    tree = _without_qualify(tree, schema)
    for node in list(tree.find_all(exp.Try)):
        # TRY's parentheses are the only ones around its argument: `a AND TRY(b OR c)` must not become
        # `a AND b OR c` (sqlglot writes a tree as it is, adding no parentheses for precedence).
        node.replace(exp.Paren(this=node.this))
    for node in list(tree.find_all(exp.Left)):  # the same characters; and sqlglot knows SUBSTRING's type
        node.replace(exp.Substring(this=node.this, start=exp.Literal.number(1), length=node.expression))
    try:
        tree = qualify(tree, schema=_sqlglot_schema(schema), dialect=DIALECT, quote_identifiers=False,
                       validate_qualify_columns=True)
        tree = annotate_types(tree, schema=_sqlglot_schema(schema), dialect=DIALECT)
    except SqlglotError as exc:
        raise refuse(f"the bounded SQL's types cannot be traced ({type(exc).__name__})") from None
    too_wide = first_too_wide(tree)
    if too_wide is not None:
        raise refuse(f"integer arithmetic that may reach 1e38, beyond Spark's widest integer (DECIMAL(38, 0)) but "
                     f"not DuckDB's HUGEINT ({too_wide.sql(DIALECT)[:60]}); cast an operand to DOUBLE")
    # Innermost first: a translation reads its operands' types, kept on each replacement.
    for node in reversed(list(tree.walk(bfs=False))):
        translated = _translate(node, trusted)
        if translated is not node:
            translated.type = node.type
            if node is tree:
                tree = translated
            else:
                node.replace(translated)
    return tree.sql(SPARK)


def _vet(tree: exp.Expression, schema: Schema, trusted: bool) -> None:
    allowed = (*_ALLOWED, *_LOAD_ONLY) if trusted else _ALLOWED
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):  # a function sqlglot does not know (reflect, java_method, ...)
            raise refuse(f"the function {node.name}")
        elif isinstance(node, exp.Table):
            if node.args.get("db") or node.args.get("catalog") or not isinstance(node.this, exp.Identifier) \
                    or node.name not in schema:
                raise refuse(f"the table {node.sql(DIALECT)}")
        elif isinstance(node, exp.Var) and isinstance(node.parent, _PART_OWNERS):
            continue
        elif not isinstance(node, allowed):
            name = node.key.upper() if not isinstance(node, exp.Func) else node.sql_name()
            raise refuse(f"{name} ({node.sql(DIALECT)[:60]})")


def _without_qualify(tree: exp.Expression, schema: Schema) -> exp.Expression:
    """`SELECT * FROM t AS a WHERE w QUALIFY c` (the filtered cap, rewrite/bounding.py) as a filter on a subquery
    that computes c's windows as columns, selecting t's columns by name so that the windows do not leak out."""
    for select in list(tree.find_all(exp.Select)):
        qualify_clause = select.args.get("qualify")
        if qualify_clause is None:
            continue
        source = select.args["from_"].this
        if not (isinstance(source, exp.Table) and select.is_star and not select.args.get("joins")):
            raise refuse("QUALIFY over anything but one table")
        condition = qualify_clause.this
        windows = []
        for i, window in enumerate(list(condition.find_all(exp.Window))):
            windows.append(exp.alias_(window.copy(), f"__dp_w{i}"))
            window.replace(exp.column(f"__dp_w{i}"))
        inner = select.copy()
        inner.set("qualify", None)
        inner.select(*windows, copy=False)
        alias = source.alias_or_name
        columns = [exp.column(name, alias) for name in schema[source.name]]
        outer = exp.select(*columns).from_(inner.subquery(alias)).where(condition)
        select.replace(outer)
        if select is tree:
            tree = outer
    return tree


def _translate(node: exp.Expression, trusted: bool) -> exp.Expression:
    if isinstance(node, exp.Cast | exp.TryCast):
        return _cast(node, trusted)
    if isinstance(node, exp.Sum):
        kind = _type(node.this)
        if kind in _FLOATS or kind not in _INTEGERS | {exp.DataType.Type.DECIMAL}:
            raise refuse(f"a SUM of {kind.value if kind else 'unknown'} values (only integer sums are exact)")
        if isinstance(node.this, exp.Distinct):  # SUM(DISTINCT x): the same distinct values, widened
            return exp.Sum(this=exp.Distinct(expressions=[exp.cast(e, _WIDE.copy()) for e in node.this.expressions]))
        return exp.Sum(this=exp.cast(node.this, _WIDE.copy()))
    if isinstance(node, exp.Div):
        # DuckDB's `/` divides as DOUBLE whatever the operands; Spark's divides DECIMAL (a HUGEINT here) as DECIMAL.
        for side in ("this", "expression"):
            operand = node.args[side]
            if _type(operand) not in _FLOATS:
                node.set(side, exp.Cast(this=operand.copy(), to=exp.DataType.build("DOUBLE")))
        return node if _nonzero(node.expression) else _by_zero(node, _quotient_by_zero(node.this, node.expression))
    if isinstance(node, exp.Mod) and _FLOATS & {_type(node.this), _type(node.expression)}:
        # DuckDB's fmod (an integer % has a nonzero literal divisor)
        return node if _nonzero(node.expression) else _by_zero(node, _double("NaN"))
    if isinstance(node, exp.Floor | exp.Ceil) and _type(node.this) in _FLOATS:
        # Spark's FLOOR of a DOUBLE is a BIGINT (saturating beyond its range, then wrapping in later arithmetic);
        # DuckDB's is a DOUBLE. A double of magnitude 2**52 or more is an integer already.
        rounded = exp.Cast(this=node.copy(), to=exp.DataType.build("DOUBLE"))
        integral = exp.Abs(this=node.this.copy()) < exp.Literal.number(float(2 ** 52))
        return exp.Case().when(integral, rounded).else_(node.this.copy())
    if isinstance(node, exp.BitwiseAnd):  # the filtered cap's test of the varies mask (rewrite/bounding.py)
        if not all(_type(operand) in _INTEGERS for operand in (node.this, node.expression)):
            raise refuse("& of values that are not integers")
        return node
    if isinstance(node, exp.Grouping):  # GROUPING(a, b): a's bit the highest; Spark's GROUPING takes one column
        bits = [exp.Mul(this=exp.Anonymous(this="grouping", expressions=[e.copy()]),
                        expression=exp.Literal.number(2 ** i)) for i, e in enumerate(reversed(node.expressions))]
        total = bits[0]
        for bit in bits[1:]:
            total = exp.Add(this=total, expression=bit)
        return exp.paren(total, copy=False)
    if isinstance(node, exp.Nullif):  # as its definition: the operands are of one type, equal alike in both engines
        equal = exp.EQ(this=node.this.copy(), expression=node.expression.copy())
        return exp.Case().when(equal, exp.Null()).else_(node.this.copy())
    if isinstance(node, exp.Sign):  # DuckDB's sign of NaN is 0, Spark's signum NaN (and NaN > 0 is true in both)
        value = node.this
        nan = exp.IsNan(this=value.copy()) if _type(value) in _FLOATS else exp.false()
        return (exp.Case().when(exp.Is(this=value.copy(), expression=exp.Null()), exp.Null())
                .when(nan, exp.Literal.number(0)).when(value.copy() > exp.Literal.number(0), exp.Literal.number(1))
                .when(value.copy() < exp.Literal.number(0), exp.Literal.number(-1)).else_(exp.Literal.number(0)))
    if isinstance(node, exp.Round):
        return _rounded(node)
    if isinstance(node, exp.Escape):  # the LIKE inside, left as it is (below), gets its pattern rewritten here
        return _like(node.this, node.expression.name)
    if isinstance(node, exp.Like):
        return node if isinstance(node.parent, exp.Escape) else _like(node, None)
    if isinstance(node, exp.DayOfWeek | exp.Year | exp.Month | exp.Day | exp.DayOfYear | exp.Quarter | exp.Week
                  | exp.WeekOfYear | exp.DayOfWeekIso | exp.YearOfWeek):
        return _date_part(_PART_NODES[type(node)], node.this)
    if isinstance(node, exp.Extract):
        return _date_part(node.name.lower(), node.expression)
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        return _truncated(node)
    if isinstance(node, exp.Pow):
        if not (isinstance(node.expression, exp.Literal) and node.expression.name in ("2", "2.0")):
            raise refuse("POWER other than a square")
        return exp.Paren(this=exp.Mul(this=exp.Paren(this=node.this.copy()), expression=exp.Paren(
            this=node.this.copy())))
    return node


_PART_NODES = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfYear: "doy", exp.Quarter: "quarter",
               exp.DayOfWeek: "dow", exp.DayOfWeekIso: "isodow", exp.Week: "week", exp.WeekOfYear: "week",
               exp.YearOfWeek: "isoyear"}
# DuckDB's part of a DATE (BIGINT, in the proleptic Gregorian calendar, as Spark's) as Spark's functions, written by
# name (exp.Anonymous: sqlglot's own nodes could be written otherwise) of the date, plus a number. The checker
# keeps the dates these see within 0001-01-01 and 9999-12-31 (typecheck.DATE_GUARD).
_DATE_PARTS = {
    "year": ("year", 0), "month": ("month", 0), "day": ("dayofmonth", 0), "quarter": ("quarter", 0),
    "doy": ("dayofyear", 0), "dayofyear": ("dayofyear", 0),
    "dow": ("dayofweek", -1), "dayofweek": ("dayofweek", -1), "weekday": ("dayofweek", -1),  # Sunday 0 in DuckDB
    "isodow": ("weekday", 1),  # Monday 1 ... Sunday 7 (Spark's WEEKDAY: Monday 0)
    "week": ("weekofyear", 0), "weekofyear": ("weekofyear", 0),  # ISO 8601 weeks in both
}


# DuckDB's decade (year / 10), century ((year - 1) / 100 + 1) and millennium: (offset, size) of the division.
_YEAR_GROUPS = {"decade": (0, 10), "century": (1, 100), "millennium": (1, 1000)}
# DATE_TRUNC of a DATE -> Spark's TRUNC unit (a DATE, made DuckDB's TIMESTAMP at midnight); a day or finer is the
# date itself. Decades, centuries and millennia are not translated (a decade's start can be the year 0, which
# Python's dates do not hold: DuckDB's engine gives it as text).
_TRUNC_UNITS = {"year": "YEAR", "quarter": "QUARTER", "month": "MONTH", "week": "WEEK"}


def _date_part(part: str, value: exp.Expression) -> exp.Expression:
    """DuckDB's date part `part` of a DATE, as a BIGINT (DuckDB's type: Spark's INT would overflow sooner in the
    arithmetic around it)."""
    if _type(value) is not exp.DataType.Type.DATE:
        raise refuse(f"the date part {part} of a {_type(value).value if _type(value) else 'value'}")
    iso_year = exp.Extract(this=exp.var("YEAROFWEEK"), expression=value.copy())
    year = exp.Anonymous(this="year", expressions=[value.copy()])
    if part == "epoch":  # DuckDB's DOUBLE of seconds since 1970-01-01 (whole days: exact in a double)
        days = exp.Cast(this=exp.Anonymous(this="unix_date", expressions=[value.copy()]),
                        to=exp.DataType.build("DOUBLE"))
        return exp.paren(exp.Mul(this=days, expression=exp.Literal.number(86400)), copy=False)
    if part in _YEAR_GROUPS:  # of years 1-9999 (the checker's guard): positive, so DuckDB's / floors
        offset, size = _YEAR_GROUPS[part]
        # Parenthesized: sqlglot writes a tree as it is, without parentheses for precedence.
        shifted = exp.paren(exp.Sub(this=year, expression=exp.Literal.number(offset)), copy=False) if offset else year
        spark: exp.Expression = exp.Floor(this=exp.Div(this=shifted, expression=exp.Literal.number(size)))
        if offset:
            spark = exp.Add(this=spark, expression=exp.Literal.number(1))
    elif part == "isoyear":
        spark = iso_year
    elif part == "yearweek":  # the ISO year times 100 plus the ISO week
        week = exp.Anonymous(this="weekofyear", expressions=[value.copy()])
        spark = exp.Add(this=exp.Mul(this=iso_year, expression=exp.Literal.number(100)), expression=week)
    elif part in _DATE_PARTS:
        function, shift = _DATE_PARTS[part]
        spark = exp.Anonymous(this=function, expressions=[value.copy()])
        if shift:
            spark = exp.Add(this=spark, expression=exp.Literal.number(shift)) if shift > 0 else exp.Sub(
                this=spark, expression=exp.Literal.number(-shift))
    else:
        raise refuse(f"the date part {part}")
    return exp.Cast(this=exp.paren(spark, copy=False), to=exp.DataType.build("BIGINT"))


def _truncated(node: exp.TimestampTrunc | exp.DateTrunc) -> exp.Expression:
    """DATE_TRUNC(unit, date): DuckDB's TIMESTAMP at the start of the unit, as Spark's TIMESTAMP_NTZ (a wall-clock
    time, no time zone between Spark and Python)."""
    value = node.this
    unit = node.text("unit").lower()
    if _type(value) is not exp.DataType.Type.DATE:
        raise refuse(f"date_trunc of a {_type(value).value if _type(value) else 'value'}")
    if unit in _TRUNC_UNITS:
        value = exp.Anonymous(this="trunc", expressions=[value.copy(), exp.Literal.string(_TRUNC_UNITS[unit])])
    elif unit not in ("day", "hour", "minute", "second", "millisecond", "microsecond"):
        raise refuse(f"date_trunc to a {unit}")
    return exp.Cast(this=value.copy(), to=_NTZ.copy())


# A pattern Spark matches without its regular expressions (its optimizer's LikeSimplification: `contains`). Any
# other pattern with two or more runs of % is a Java regular expression with two or more `.*`, whose backtracking
# costs up to (text length)^runs a row: a second a row for '%a%a%a%a%b' on 100 characters, where DuckDB's LIKE
# takes microseconds and the checker's person-work bound (calibrated on DuckDB) admits it. One row's text would
# then decide the query's time (the timing channel analysis/person_work.py closes on DuckDB).
_LINEAR_LIKE = re.compile(r"%[^%_\\]+%")


def _like(like: exp.Like, escape: str | None) -> exp.Like:
    """LIKE with DuckDB's pattern as Spark reads it. In DuckDB a pattern has no escape character unless ESCAPE
    names one, which makes the next character (any) literal; Spark's default escape is the backslash, and may
    precede only %, _ and itself. Both match `_` to one code point and `%` to any run of them, newlines included,
    case-sensitively. So the pattern is read as DuckDB reads it and written with Spark's backslash escapes."""
    pattern = like.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise refuse("a LIKE pattern that is not a literal")
    written, text, index = [], pattern.this, 0
    while index < len(text):
        char = text[index]
        if escape is not None and char == escape and index + 1 < len(text):
            index += 1
            written.append("\\" + text[index] if text[index] in "%_\\" else text[index])
        elif char == "\\":
            written.append("\\\\")
        else:
            written.append(char)  # % and _ are wildcards in both
        index += 1
    spark_pattern = "".join(written)
    # Runs of wildcard %: an escaped one is written "\\%" (one element), a wildcard one "%".
    runs = sum(1 for i, part in enumerate(written) if part == "%" and (i == 0 or written[i - 1] != "%"))
    if runs >= 2 and not _LINEAR_LIKE.fullmatch(spark_pattern):
        raise refuse("a LIKE pattern with % in two or more places but for '%text%' (Spark matches it by "
                     "backtracking, whose time one row's text could decide)")
    # `x NOT LIKE p` is one node in sqlglot, its `negate` set: kept.
    return exp.Like(this=like.this.copy(), expression=exp.Literal.string(spark_pattern),
                    negate=like.args.get("negate"))


def _rounded(node: exp.Round) -> exp.Expression:
    """ROUND of an integer to places >= 0 is the integer in both; of a double to a whole number, half away from
    zero in both (DuckDB's std::round, Spark's exact HALF_UP), NaN and +-inf kept. At other places Spark rounds the
    double's shortest decimal text HALF_UP (2.675 -> 2.68), and DuckDB 2.0 follows none of the rules that could be
    written in Spark: measured on 8,000 doubles per place count, neither the scaled 10^n rounding (round(x * 100) /
    100 is 2.68 for 2.675; DuckDB's 2.67), nor the exact decimal value of the double (DuckDB's round(123456.785, 15)
    is 123456.78499999999, round(4500000000000000.0, 10) is 4500000000000000.5), nor the shortest text: 25-730
    disagreements per place count for each rule. So it stays refused."""
    places = node.args.get("decimals")
    value = 0 if places is None else _literal_integer(places)
    if _type(node.this) in _INTEGERS and value is not None and value >= 0:
        return node
    if _type(node.this) in _FLOATS and value == 0:
        # Spark's rounding goes through a decimal, which has no -0.0: round(-0.4) is -0.0 in DuckDB, 0.0 in Spark.
        rounded = exp.Round(this=node.this.copy())
        signed_zero = exp.Mul(this=node.this.copy(), expression=_double("0.0"))
        return exp.Case().when(exp.EQ(this=rounded.copy(), expression=exp.Literal.number(0)), signed_zero).else_(
            rounded)
    raise refuse(f"round() of a double to {value} decimal places (Spark rounds the shortest decimal text, DuckDB "
                 "its own floating-point way; they differ in the last place kept)")


def _literal_integer(node: exp.Expression) -> int | None:
    negative = isinstance(node, exp.Neg)
    node = node.this if negative else node
    if isinstance(node, exp.Literal) and not node.is_string and node.name.isdigit():
        return -int(node.name) if negative else int(node.name)
    return None


def _nonzero(divisor: exp.Expression) -> bool:
    """A number literal other than 0 (as written, or cast to DOUBLE): no row divides by zero."""
    while isinstance(divisor, exp.Cast | exp.Paren | exp.Neg):
        divisor = divisor.this
    if not isinstance(divisor, exp.Literal) or divisor.is_string:
        return False
    try:
        return float(divisor.name) != 0.0
    except ValueError:
        return False


def _by_zero(node: exp.Div | exp.Mod, by_zero: exp.Expression) -> exp.Expression:
    """`x / y` or `x % y` of doubles with DuckDB's (IEEE) meaning where y is 0 or -0.0, which Spark makes NULL:
    `by_zero` there (when x is not NULL), Spark's own operation elsewhere (the same IEEE result)."""
    dividend, divisor = node.this, node.expression
    zero = exp.and_(exp.EQ(this=divisor.copy(), expression=exp.Literal.number(0)),
                    exp.Not(this=exp.paren(exp.Is(this=dividend.copy(), expression=exp.Null()))))
    return exp.Case().when(zero, by_zero).else_(node)


def _quotient_by_zero(dividend: exp.Expression, divisor: exp.Expression) -> exp.Expression:
    """x / 0 in IEEE doubles: NaN for x NaN or 0, else an infinity whose sign is x's times the zero's (a negative
    zero reads '-0.0' as text in Spark, and `-0.0 = 0` is true, so the sign is told by the text)."""
    positive_zero = exp.EQ(this=exp.Cast(this=divisor.copy(), to=exp.DataType.build("TEXT")),
                           expression=exp.Literal.string("0.0"))
    undefined = exp.or_(exp.IsNan(this=dividend.copy()), exp.EQ(this=dividend.copy(),
                                                                  expression=exp.Literal.number(0)))
    same_sign = exp.EQ(this=exp.paren(exp.GT(this=dividend.copy(), expression=exp.Literal.number(0))),
                       expression=exp.paren(positive_zero))
    return exp.Case().when(undefined, _double("NaN")).when(same_sign, _double("Infinity")).else_(
        _double("-Infinity"))


def _double(text: str) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DOUBLE"))


# Text literals the checker turned into typed constants (`d > '2020-01-01'`), in forms both engines read alike.
_LITERAL_FORMS = {exp.DataType.Type.DATE: re.compile(r"\d{4}-\d{2}-\d{2}"),
                  exp.DataType.Type.BIGINT: re.compile(r"[+-]?\d{1,18}"),
                  exp.DataType.Type.INT: re.compile(r"[+-]?\d{1,9}"),
                  exp.DataType.Type.DOUBLE: re.compile(r"[+-]?\d{1,15}(\.\d{1,15})?"),
                  **dict.fromkeys(_TIMESTAMPS, re.compile(r"\d{4}-\d{2}-\d{2}"))}  # a midnight (TIMESTAMP_NTZ)
_NTZ = exp.DataType.build("TIMESTAMP_NTZ", dialect=SPARK)  # DuckDB's TIMESTAMP: a wall-clock time, no time zone


def _cast(node: exp.Cast, trusted: bool = False) -> exp.Expression:
    target = node.to.this
    source = _type(node.this)
    if isinstance(node.this, exp.Literal) and node.this.is_string:
        form = _LITERAL_FORMS.get(target)
        if form is None or not form.fullmatch(node.this.name):
            raise refuse(f"the text {node.this.sql(DIALECT)} as {node.to.sql(DIALECT)}")
        return exp.Cast(this=node.this, to=_NTZ.copy() if target in _TIMESTAMPS else node.to.copy())
    trying = isinstance(node, exp.TryCast)
    to = _WIDE.copy() if target is exp.DataType.Type.INT128 else node.to.copy()
    if target in _INTEGERS:
        if source in _INTEGERS or source is exp.DataType.Type.BOOLEAN:
            return exp.Cast(this=node.this, to=to)
        if source is exp.DataType.Type.DECIMAL and isinstance(node.this, exp.Literal):
            # DuckDB rounds a DECIMAL half away from zero, as Spark's ROUND does.
            return exp.Cast(this=exp.Round(this=node.this, decimals=exp.Literal.number(0)), to=to)
        if source in _FLOATS:
            rounded = exp.func("bround", node.this, exp.Literal.number(0))
            cast = exp.Cast(this=rounded, to=to)
            if not trying:
                return cast
            limit = _RANGES[target]
            inside = exp.and_(rounded.copy() >= exp.Literal.number(-limit), rounded.copy() < exp.Literal.number(limit))
            return exp.Case().when(inside, cast)
    elif target in _FLOATS:
        if source in _INTEGERS | _FLOATS | {exp.DataType.Type.DECIMAL, exp.DataType.Type.BOOLEAN}:
            return exp.Cast(this=node.this, to=to)
    elif target in _TEXT:
        if source in _INTEGERS | _TEXT | {exp.DataType.Type.BOOLEAN, exp.DataType.Type.DATE}:
            return exp.Cast(this=node.this, to=to)
        if trusted and source in _FLOATS:  # the per_unit check (bounding.varying_units): distinct texts, as in DuckDB
            return exp.Cast(this=node.this, to=to)
    elif target in (exp.DataType.Type.DATE, exp.DataType.Type.BOOLEAN) and source is target:
        return exp.Cast(this=node.this, to=to)
    elif target in _TIMESTAMPS and source in {exp.DataType.Type.DATE, *_TIMESTAMPS}:
        return exp.Cast(this=node.this, to=_NTZ.copy())  # a date's midnight; a timestamp (DATE_TRUNC's) as it is
    if source is exp.DataType.Type.NULL or (isinstance(node.this, exp.Null)):
        return exp.Cast(this=node.this, to=to)
    raise refuse(f"a cast of {source.value if source else 'an untyped value'} to {node.to.sql(DIALECT)} "
                 f"({node.this.sql(DIALECT)[:60]})")


def _type(node: exp.Expression) -> exp.DataType.Type | None:
    kind = node.type
    return None if kind is None or kind.this is exp.DataType.Type.UNKNOWN else kind.this


def _sqlglot_schema(schema: Schema) -> dict[str, dict[str, str]]:
    return {table: dict(columns) for table, columns in schema.items()}
