"""Which source values would not load exactly as their column's declared type: a condition per column, which the
loader (engines/loading.py) counts over the source before it loads it, so that such a value fails the load.

DuckDB's casts round where a steward would expect a refusal: '1.5' (text) or 2.5 (a Parquet double) read as BIGINT
become 2 and 3, and '2024-01-02 10:00' read as DATE loses its time of day. A value the cast cannot read at all fails
the load's typed read already; these are the values it reads, but not as what they are.

- int, from text: a number is exact when its decimal value is an integer (1.0, 1e3, 1_000, 0x1e are). Decided on
  the text, digit by digit, never through a double (which holds no fraction beyond 2**52): with w and f the digits
  before and after the point and e the exponent, the value is the integer w f times 10**(e - len(f)), an integer
  when its last len(f) - e digits are zeros. Only cells with a point or an e are looked at, so a column of plain
  integers costs a substring test per cell.
- int, from a non-integral number type (float, double, a decimal with a scale): exact when it has no fraction.
- date, from text or a timestamp type: exact when the timestamp it spells is its date at midnight.
"""

from __future__ import annotations

import functools

from sqlglot import exp

from dpsql.policy import ColumnType
from dpsql.sql.parse import DIALECT

_FRACTIONAL_TYPES = ("FLOAT", "REAL", "DOUBLE", "DECIMAL")
_TIMESTAMP_TYPES = ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS", "DATETIME")
# A decimal number as DuckDB reads one for an integer type, with its parts: whole digits, fraction digits, exponent
# (digits may be separated by single underscores, which carry no value).
_DECIMAL = r"^\s*[+-]?([0-9_]*)(?:\.([0-9_]*))?(?:[eE]([+-]?[0-9_]+))?\s*$"
_HEXADECIMAL = r"^\s*[+-]?0[xXbB][0-9a-fA-F_]+\s*$"  # DuckDB's hexadecimal and binary integers: no fraction


@functools.cache
def inexact_column(column: str, source_type: str, declared: ColumnType) -> str | None:
    """inexact() of a source column, as the engine's SQL. Cached: every session that opens a policy loads the same
    columns, and building these trees cost more than the engine's count itself (about 0.1 s of CPU a session)."""
    condition = inexact(exp.column(exp.to_identifier(column, quoted=True)), source_type, declared)
    return None if condition is None else condition.sql(DIALECT)


def inexact(value: exp.Expression, source_type: str, declared: ColumnType) -> exp.Expression | None:
    """A condition true where `value`, of the DuckDB type `source_type`, would load as another value of the declared
    type; None when every value the load's cast reads is read exactly."""
    base = source_type.strip().upper().split("(")[0]
    if declared is ColumnType.INT:
        if base == "VARCHAR":
            return inexact_integer_text(value)
        if base in _FRACTIONAL_TYPES and not _integral_decimal(source_type):
            return value.neq(exp.Anonymous(this="trunc", expressions=[value.copy()]))
        return None
    if declared is ColumnType.DATE:
        if base == "VARCHAR":
            # A date alone is at most 10 characters (years of five digits or more, and BC, are longer: checked too).
            stamp = exp.TryCast(this=value.copy(), to=exp.DataType.build("TIMESTAMP"))
            day = exp.TryCast(this=exp.TryCast(this=value.copy(), to=exp.DataType.build("DATE")),
                              to=exp.DataType.build("TIMESTAMP"))
            return exp.and_(exp.Length(this=value.copy()) > 10, stamp.neq(day))
        if base in _TIMESTAMP_TYPES:
            day = exp.cast(exp.cast(value.copy(), "DATE"), exp.DataType.build(source_type, dialect="duckdb"))
            return value.neq(day)
    return None


def inexact_integer_text(text: exp.Expression) -> exp.Expression:
    """True where `text` is a number DuckDB reads as a BIGINT only by rounding it (NULL, unreadable or exact:
    false)."""
    has_point = exp.or_(*(exp.Anonymous(this="contains", expressions=[text.copy(), exp.Literal.string(mark)])
                          for mark in (".", "e", "E")))
    readable = exp.TryCast(this=text.copy(), to=exp.DataType.build("BIGINT")).is_(exp.null()).not_()
    hexadecimal = exp.RegexpLike(this=text.copy(), expression=exp.Literal.string(_HEXADECIMAL))
    decimal = exp.RegexpLike(this=text.copy(), expression=exp.Literal.string(_DECIMAL))

    def part(group: int) -> exp.Expression:
        extracted = exp.RegexpExtract(this=text.copy(), expression=exp.Literal.string(_DECIMAL),
                                      group=exp.Literal.number(group))
        return exp.Replace(this=extracted, expression=exp.Literal.string("_"), replacement=exp.Literal.string(""))

    whole, fraction, exponent = part(1), part(2), part(3)
    digits = exp.DPipe(this=whole, expression=fraction.copy(), safe=True)
    significant = exp.Length(this=exp.Anonymous(this="rtrim", expressions=[digits.copy(), exp.Literal.string("0")]))
    trailing_zeros = exp.Sub(this=exp.Length(this=digits.copy()), expression=significant)
    power = exp.Coalesce(this=exp.TryCast(this=exponent, to=exp.DataType.build("BIGINT")),
                         expressions=[exp.Literal.number(0)])
    places = exp.Sub(this=exp.Length(this=fraction), expression=power)  # digits after the point, once scaled
    exact = exp.or_(places <= 0, trailing_zeros >= places.copy(), significant.copy().eq(0))  # the last: zero
    # A spelling DuckDB reads that neither pattern knows is refused: it cannot be shown exact.
    rounded = exp.Case().when(hexadecimal, exp.false()).when(decimal, exp.not_(exact)).else_(exp.true())
    return exp.Case().when(exp.and_(has_point, readable), rounded).else_(exp.false())


def _integral_decimal(source_type: str) -> bool:
    """DECIMAL(p, 0): no fraction to lose."""
    inside = source_type.partition("(")[2].rstrip(") ")
    return inside.count(",") == 1 and inside.split(",")[1].strip() == "0"
