"""Values that leave a DuckDB engine exactly: what Python cannot represent faithfully leaves as DuckDB's own text.

Everything here runs after the charge, on values that may be private (the engine's group keys) or released (the
post-processing's outputs). DuckDB's conversion of some types to Python is not exact: a DATE or TIMESTAMP
'infinity' becomes the same `date.max` as '9999-12-31' (two engine groups would merge in a dict), a date beyond
year 9999 becomes a string, an INTERVAL beyond `timedelta`'s range raises an OverflowError that quotes the value,
a TIME '24:00:00' has no `datetime.time`. Whether a conversion fails, or two values collide, would then depend on
one row.

So the choice is made from the column's DuckDB *type* alone, never from a value: a column of a type on this
module's faithful list is fetched as is; any other is cast to VARCHAR inside the SQL, which DuckDB does exactly
and injectively (its text reads back to the same value, `CAST(text AS type)`). `to_python` then turns that text
into a `date` or `datetime` only where the text is in the range and form those classes represent exactly, and
otherwise keeps the text: a total function that never raises and never maps two texts to one value.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

# DuckDB types whose Python value is exact and injective: ints, floats (bit for bit), Decimal, str, bool.
_FAITHFUL = re.compile(r"^(BOOLEAN|TINYINT|SMALLINT|INTEGER|BIGINT|HUGEINT|UTINYINT|USMALLINT|UINTEGER|UBIGINT|"
                       r"UHUGEINT|FLOAT|DOUBLE|DECIMAL\(\d+,\s*\d+\)|VARCHAR|\"NULL\"|NULL)$")
_DATE_TEXT = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_TIMESTAMP_TEXT = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?$")


def faithful(duckdb_type: str) -> bool:
    """Whether DuckDB's own conversion of this type to Python is exact and injective."""
    return bool(_FAITHFUL.match(duckdb_type.strip().upper()))


def canonical_select(sql: str, types: Sequence[str]) -> str:
    """`sql` with every column of a type Python cannot hold exactly replaced by its DuckDB text, in SQL.

    Columns are addressed by position (`#i`), so duplicate or odd output names do not matter, and a projection
    over the query keeps its row order (DuckDB preserves insertion order through a projection)."""
    if all(faithful(t) for t in types):
        return sql
    items = [f"#{i}" if faithful(kind) else f"CAST(#{i} AS VARCHAR)" for i, kind in enumerate(types, start=1)]
    return f"SELECT {', '.join(items)} FROM ({sql}) AS __dp_exact"


def to_python(value: Any, duckdb_type: str) -> Any:
    """The Python value of a fetched column: as fetched for a faithful type, else from its canonical text, as a
    `date`/`datetime` where the text is exactly one, or as the text itself. Total: never raises."""
    if value is None or faithful(duckdb_type) or not isinstance(value, str):
        return value
    kind = duckdb_type.strip().upper()
    try:
        if kind == "DATE" and _DATE_TEXT.match(value):
            return datetime.date.fromisoformat(value)
        if kind == "TIMESTAMP" and _TIMESTAMP_TEXT.match(value):
            return datetime.datetime.fromisoformat(value)
    except ValueError:  # e.g. year 0000: not a Python date, so it stays text (still distinct from every date)
        return value
    return value
