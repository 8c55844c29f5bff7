"""The DuckDB type the analyst's SQL gives an aggregate call: the type of the released cell.

dpsql computes an aggregate its own way (a fixed-point sum, a quantile on a grid, an average from noisy sums), but
the analyst wrote SQL, and the cell is released with the type plain DuckDB gives that SQL: SUM of integers (or
booleans) is HUGEINT, of DOUBLE a DOUBLE, of DECIMAL(p, s) a DECIMAL(38, s); AVG, VAR, STDDEV, MEDIAN and
QUANTILE_CONT of numbers are DOUBLE; QUANTILE_DISC, MIN and MAX have their argument's type; COUNT is BIGINT.
Post-processing then computes over cells of those types, so `SUM(age) // 7` is integer division and
`CAST(SUM(age) AS VARCHAR)` has no '.0', as in DuckDB.

Rather than a copy of DuckDB's typing rules, DuckDB types the call itself: in the constant checker's empty sandbox
(vetting.CONSTANTS), `DESCRIBE SELECT <the call>` with every column replaced by a NULL of its type. Binding depends
on types, not values, so the answer is a function of the SQL and the policy alone, found before any charge. A call
DuckDB has no function for (AVG, VAR or QUANTILE_CONT of a boolean: DuckDB refuses them) is still answered here, as
dpsql always has, as a DOUBLE, the type of an average of numbers.

`released_range` says what a value of the type can be, so that the release puts a noisy value into it (a whole
number for an integer type, within the type's range) instead of failing a cast after the charge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from fractions import Fraction

import duckdb
from sqlglot import exp

from dpsql.analysis.typecheck import INTEGER_TYPES
from dpsql.analysis.vetting import CONSTANTS
from dpsql.errors import QueryRejected, first_line
from dpsql.policy import ColumnPolicy
from dpsql.sql.parse import DIALECT

COUNT_TYPE = "BIGINT"  # COUNT(*), COUNT(x), COUNT(DISTINCT x), APPROX_COUNT_DISTINCT


def written_type(call: exp.Expression, columns: Mapping[str, ColumnPolicy], context: object) -> str:
    """The DuckDB type of `call` (an aggregate, its columns qualified or not) over columns of these types; DOUBLE
    for a call DuckDB has no function for (module docstring)."""
    def typed_null(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return exp.cast(exp.Null(), columns[node.name].sql_type)
        return node
    try:
        kind = _describe(call.copy().transform(typed_null, copy=False).sql(DIALECT)) or "DOUBLE"
    except duckdb.Error as exc:  # not a missing function: decided from the text all the same
        raise QueryRejected(f"{context}: DuckDB cannot type it ({first_line(exc)})") from None
    if kind.upper() not in _RELEASED and not kind.upper().startswith("DECIMAL("):
        raise QueryRejected(f"{context}: DuckDB makes it a {kind}, and only numbers and booleans are released here")
    return kind


@functools.lru_cache(maxsize=4096)
def _describe(select_item: str) -> str | None:
    try:
        ((_, kind, *_),) = CONSTANTS.evaluate(f"DESCRIBE SELECT {select_item}")
    except duckdb.BinderException:
        return None
    return str(kind)


def released_range(kind: str) -> tuple[float, float, bool] | None:
    """(lowest, highest, whole) for a value of the DuckDB type `kind`, as doubles within the type; None for DOUBLE,
    which holds any released value. `whole`: only whole numbers (integers; a BOOLEAN is 0 or 1)."""
    name = kind.strip().upper()
    if name in INTEGER_TYPES:
        low, high = INTEGER_TYPES[name]
        return _inside(low), _inside(high), True
    if name == "BOOLEAN":
        return 0.0, 1.0, True
    if name in ("FLOAT", "REAL"):
        largest = 3.4028234663852886e38
        return -largest, largest, False
    if name.startswith("DECIMAL("):
        precision, scale = (int(part) for part in name[len("DECIMAL("):-1].split(","))
        # DuckDB refuses a double whose value times 10^scale, in double arithmetic, reaches 10^precision.
        largest = _inside(Fraction(10**precision - 1, 10**scale))
        while largest * 10.0**scale >= 10.0**precision:
            largest = math.nextafter(largest, 0.0)
        return -largest, largest, False
    return None  # DOUBLE: written_type admits no other type


_RELEASED = frozenset({*INTEGER_TYPES, "BOOLEAN", "FLOAT", "REAL", "DOUBLE"})  # and DECIMAL(p,s)


def _inside(bound: int | Fraction) -> float:
    """The double nearest `bound` on the side of zero (2**63 - 1 is no double: the nearest rounds beyond it)."""
    value = float(bound)
    if abs(value) > abs(bound):
        value = math.nextafter(value, 0.0)
    return value
