"""Dates and timestamps as drivers spell them in text, read exactly.

PostgreSQL drivers send a date or a timestamp as text in more shapes than ISO's `2024-01-01`: the JDBC driver's
setDate sends `2024-01-01 +01` (the date with the JVM's offset), setTimestamp `2024-01-01 10:00:00+01`, pg8000 a
datetime as `2024-01-01T00:00:00`. `read` takes all of them: a date, then optionally a time of day (`T` or a space
between; seconds to the microsecond), then optionally an offset (`Z`, `+01`, `+01:00`, `+0100`; a space before it
allowed). A finer fraction than a microsecond is refused rather than cut (Python's fromisoformat cuts it).

What the offset means is the reader's choice, as in PostgreSQL: a value read as a date or as a timestamp without
time zone keeps its wall-clock time and drops the offset (PostgreSQL's date and timestamp input ignore a time zone
indication, and DuckDB's cast to TIMESTAMP does too); a timestamp *with* time zone is the instant it names, which
dpsql, like a PostgreSQL session in UTC, compares with a timestamp column as its UTC time (`utc`).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from sqlglot import exp

_TEXT = re.compile(r"(\d{4})-(\d{2})-(\d{2})"
                   r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?)?"
                   r"\s*(?:(Z)|([+-])(\d{2})(?::?(\d{2}))?)?", re.IGNORECASE)


@dataclass(frozen=True)
class Temporal:
    """A date or timestamp read from text: its wall-clock value, whether it had a time of day, and its offset."""

    value: datetime.datetime  # naive: the wall-clock date and time as written
    timed: bool  # a time of day was written (00:00 included)
    offset: datetime.timedelta | None

    @property
    def at_midnight(self) -> bool:
        return self.value.time() == datetime.time()

    @property
    def instant(self) -> datetime.datetime:
        """The value as a timestamp with time zone would read it: aware when an offset was written."""
        zone = datetime.timezone(self.offset) if self.offset is not None else None
        return self.value.replace(tzinfo=zone)


def read(text: str) -> Temporal | None:
    """The date or timestamp `text` spells exactly, or None."""
    match = _TEXT.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, offset_hours, offset_minutes = match.groups()
    if fraction is not None and fraction[6:].strip("0"):
        return None  # finer than a microsecond: no datetime holds it
    try:
        value = datetime.datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0),
                                  int(second or 0), int((fraction or "").ljust(6, "0")[:6]))
        offset = None
        if zulu:
            offset = datetime.timedelta(0)
        elif sign:
            offset = datetime.timedelta(hours=int(offset_hours), minutes=int(offset_minutes or 0))
            offset = -offset if sign == "-" else offset
            datetime.timezone(offset)  # within a day, or ValueError
    except ValueError:
        return None
    return Temporal(value, hour is not None, offset)


def utc(value: datetime.datetime) -> datetime.datetime:
    """A timestamp as dpsql compares it with a timestamp column: an aware one as its UTC time, naive (as a
    PostgreSQL session in UTC casts a timestamptz to a timestamp); a naive one as it is."""
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=None)
    return value.astimezone(datetime.UTC).replace(tzinfo=None)


def written(node: exp.Expression) -> Temporal | None:
    """The date or timestamp a text literal spells, if it is one."""
    return read(node.this) if isinstance(node, exp.Literal) and node.is_string else None


def instants_in_utc(tree: exp.Expression) -> None:
    """Replace, in place, each timestamp with time zone written as text (psycopg2 sends an aware datetime as
    '2024-01-01T00:00:00+02:00'::timestamptz) by the timestamp of its UTC time: what it compares as, with a
    timestamp, in a PostgreSQL session in UTC. Other casts to TIMESTAMPTZ are left to be refused."""
    for cast in list(tree.find_all(exp.Cast)):
        value = written(cast.this)
        if value is None or not cast.to.is_type(exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ):
            continue
        try:
            instant = utc(value.instant)
        except OverflowError:
            continue  # out of range in UTC: refused with the cast
        cast.replace(exp.cast(exp.Literal.string(instant.isoformat(sep=" ")), exp.DataType.Type.TIMESTAMP))
