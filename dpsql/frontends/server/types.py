"""PostgreSQL types on the wire: the OID of each DuckDB type dpsql releases, values in text and binary format,
and parameters decoded from the client's text or binary encoding.

Text output follows PostgreSQL's own (`t`/`f`, ISO dates, `Infinity`, shortest round-trip floats as with
extra_float_digits >= 1) so that drivers parse it as they would a real server's.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from dataclasses import dataclass
from typing import Any

from dpsql.errors import DataError, NotSupportedError
from dpsql.frontends.server.protocol import Field
from dpsql.policy import ColumnType
from dpsql.sql import temporal
from dpsql.sql.parse import TextParameter

BOOL, BYTEA, INT8, INT2, INT4, TEXT, FLOAT4, FLOAT8, UNKNOWN, VARCHAR = 16, 17, 20, 21, 23, 25, 700, 701, 705, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ, NUMERIC = 1082, 1083, 1114, 1184, 1186, 1266, 1700
TEXT_ARRAY = 1009
_POSTGRES_EPOCH = datetime.datetime(2000, 1, 1)
_EPOCH_DATE = _POSTGRES_EPOCH.date()


@dataclass(frozen=True)
class WireType:
    oid: int
    size: int  # bytes of the binary form, -1 for variable length


_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8, TIMESTAMP: 8, TIMESTAMPTZ: 8,
          INTERVAL: 16}
_DUCKDB = {
    "BOOLEAN": BOOL, "TINYINT": INT2, "SMALLINT": INT2, "UTINYINT": INT2, "INTEGER": INT4, "USMALLINT": INT4,
    "BIGINT": INT8, "UINTEGER": INT8, "UBIGINT": NUMERIC, "HUGEINT": NUMERIC, "UHUGEINT": NUMERIC,
    "FLOAT": FLOAT4, "REAL": FLOAT4, "DOUBLE": FLOAT8, "DECIMAL": NUMERIC, "VARCHAR": TEXT, "BLOB": BYTEA,
    "DATE": DATE, "TIME": TIME, "TIMESTAMP": TIMESTAMP, "TIMESTAMP WITH TIME ZONE": TIMESTAMPTZ,
    "INTERVAL": INTERVAL,
}
# The wire type a parameter compared with a declared column is inferred to have.
COLUMN_OIDS = {ColumnType.INT: INT8, ColumnType.FLOAT: FLOAT8, ColumnType.TEXT: TEXT, ColumnType.BOOL: BOOL,
               ColumnType.DATE: DATE, ColumnType.TIMESTAMP: TIMESTAMP}


# Arrays (catalog queries return them: current_schemas(), proargnames): PostgreSQL's array type of the element's.
_ARRAYS = {BOOL: 1000, INT2: 1005, INT4: 1007, INT8: 1016, TEXT: 1009, FLOAT4: 1021, FLOAT8: 1022, NUMERIC: 1231,
           DATE: 1182, TIMESTAMP: 1115}


def wire_type(duckdb_type: str) -> WireType:
    """The PostgreSQL type of a DuckDB type name; anything else travels as text, which every client reads."""
    name = duckdb_type.strip().upper()
    if name.endswith("[]"):
        return WireType(_ARRAYS.get(wire_type(name[:-2]).oid, 1009), -1)
    oid = _DUCKDB.get(name.split("(")[0], TEXT)
    return WireType(oid, _SIZES.get(oid, -1))


def field(name: str, duckdb_type: str, result_format: int) -> Field:
    kind = wire_type(duckdb_type)
    modifier = -1
    if kind.oid == NUMERIC and "(" in duckdb_type:  # DECIMAL(p,s): PostgreSQL's typmod ((p << 16) | s) + 4
        try:
            precision, scale = (int(x) for x in duckdb_type.split("(")[1].rstrip(")").split(","))
            modifier = ((precision << 16) | scale) + 4
        except ValueError:
            modifier = -1
    return Field(name, kind.oid, kind.size, modifier, result_format)


# ---- values out --------------------------------------------------------------------------------------------------

def encode_text(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, float):
        if math.isnan(value):
            return b"NaN"
        if math.isinf(value):
            return b"Infinity" if value > 0 else b"-Infinity"
        text = repr(value)  # the shortest text that reads back exactly, as PostgreSQL's float output
        return text.removesuffix(".0").encode("ascii")
    if isinstance(value, decimal.Decimal):
        return (format(value, "f") if value.is_finite() else str(value).replace("Inf", "Infinity")).encode("ascii")
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ").encode("ascii")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat().encode("ascii")
    if isinstance(value, bytes):
        return b"\\x" + value.hex().encode("ascii")
    if isinstance(value, list | tuple):
        return ("{" + ",".join(_array_element(v) for v in value) + "}").encode("utf-8")
    return str(value).encode("utf-8")


def _array_element(value: Any) -> str:
    """One element of an array's text: NULL, or quoted where PostgreSQL would (empty, special characters)."""
    if value is None:
        return "NULL"
    encoded = encode_text(value)
    text = "" if encoded is None else encoded.decode("utf-8")
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def encode_binary(value: Any, oid: int) -> bytes | None:
    """The binary form of the types dpsql releases most (integers, floats, booleans, text, dates, timestamps)."""
    if value is None:
        return None
    try:
        if oid == BOOL:
            return b"\1" if value else b"\0"
        if oid in (INT2, INT4, INT8):
            return struct.pack({INT2: "!h", INT4: "!i", INT8: "!q"}[oid], int(value))
        if oid in (FLOAT4, FLOAT8):
            return struct.pack("!f" if oid == FLOAT4 else "!d", float(value))
        if oid == NUMERIC and isinstance(value, int | decimal.Decimal) and not isinstance(value, bool):
            return _encode_numeric(decimal.Decimal(value))
        if oid in (TEXT, VARCHAR):
            return str(value).encode("utf-8")
        if oid == DATE and type(value) is datetime.date:
            return struct.pack("!i", (value - _EPOCH_DATE).days)
        if oid == TIMESTAMP and isinstance(value, datetime.datetime) and value.tzinfo is None:
            delta = value - _POSTGRES_EPOCH
            return struct.pack("!q", (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    except (struct.error, ValueError, OverflowError, TypeError):
        pass
    raise NotSupportedError(f"binary output of type OID {oid} for this value is not supported: ask for text")


def binary_supported(oid: int) -> bool:
    return oid in (BOOL, INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, TEXT, VARCHAR, DATE, TIMESTAMP)


def _encode_numeric(value: decimal.Decimal) -> bytes:
    """PostgreSQL's binary numeric (read back by `_numeric`): base-10000 digits around the decimal point, the weight
    of the first, a sign and the display scale. A SUM of integers (HUGEINT) and a DECIMAL travel so; pgjdbc asks for
    numeric in binary once a statement is prepared."""
    if value.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    if not value.is_finite():
        raise ValueError("an infinite numeric has no binary form here")
    whole, _, fraction = format(abs(value), "f").partition(".")
    scale = len(fraction)
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    fraction = fraction + "0" * (-len(fraction) % 4)
    groups = [int(whole[i:i + 4]) for i in range(0, len(whole), 4)] + \
        [int(fraction[i:i + 4]) for i in range(0, len(fraction), 4)]
    weight = len(whole) // 4 - 1
    while groups and groups[0] == 0:  # leading zero groups of a number below 1
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    sign = 0x4000 if value.is_signed() and groups else 0
    return struct.pack(f"!hhHH{len(groups)}H", len(groups), weight, sign, scale, *groups)


# ---- parameters in -----------------------------------------------------------------------------------------------

_TEXT_LIKE = (0, TEXT, VARCHAR, UNKNOWN, 1042)  # 1042: bpchar


def decode_parameter(data: bytes | None, oid: int, binary: bool) -> Any:
    """A Bind parameter as the Python value dpsql binds. Untyped text becomes a TextParameter, which the checker
    converts to the type of the column it is compared with, as PostgreSQL types an untyped literal. A time of day or
    bytes decode too, so that binding them says why they have no column to be compared with (sql/parse.literal)."""
    if data is None:
        return None
    try:
        return _decode_binary(data, oid) if binary else _decode_text(data.decode("utf-8"), oid)
    except (ValueError, struct.error, decimal.InvalidOperation, UnicodeDecodeError, KeyError):
        kind = "binary" if binary else "text"
        raise DataError(f"invalid {kind} value for a parameter of type OID {oid}") from None


_BOOLEANS = {"t": True, "true": True, "yes": True, "on": True, "1": True, "y": True,
             "f": False, "false": False, "no": False, "off": False, "0": False, "n": False}


# Array parameters (`relkind = ANY($1)`): each array type's element type.
_ELEMENTS = {**{array: element for element, array in _ARRAYS.items()}, 1015: VARCHAR, 1028: INT8, 1002: TEXT,
             1003: TEXT, 1014: TEXT}


def _decode_text(text: str, oid: int) -> Any:
    if oid in _ELEMENTS:
        items = [None if item is None else _decode_text(item, _ELEMENTS[oid]) for item in _array_items(text)]
        return [item.text if isinstance(item, TextParameter) else item for item in items]
    if oid in _TEXT_LIKE:
        return TextParameter(text)
    if oid in (INT2, INT4, INT8):
        return int(text.strip())
    if oid in (FLOAT4, FLOAT8):
        return float(text)
    if oid == NUMERIC:
        return decimal.Decimal(text.strip())
    if oid == BOOL:
        return _BOOLEANS[text.strip().lower()]
    if oid in (DATE, TIMESTAMP, TIMESTAMPTZ):
        # As PostgreSQL reads them (sql/temporal.py): a date, with a time of day only at midnight; a timestamp's
        # wall-clock time, its offset dropped; a timestamptz the instant it names (compared as its UTC time).
        read = temporal.read(text)
        if read is None or (oid == DATE and not read.at_midnight):
            raise ValueError
        return read.value.date() if oid == DATE else read.instant if oid == TIMESTAMPTZ else read.value
    if oid in (TIME, TIMETZ):
        return datetime.time.fromisoformat(text.strip()[:8])
    if oid == BYTEA:
        return bytes.fromhex(text.removeprefix("\\x"))
    return TextParameter(text)


def text_array(text: str) -> list[str | None]:
    """An untyped parameter written as an array (`{r,v}`, where the query reads it as one): its elements."""
    try:
        return _array_items(text)
    except (ValueError, IndexError):
        raise DataError(f"invalid array value {text!r}") from None


def _array_items(text: str) -> list[str | None]:
    """The elements of a one-dimensional array's text, `{a,"b c",NULL}`."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError("not an array")
    items: list[str | None] = []
    body, i = text[1:-1], 0
    while i < len(body):
        while body[i] == " ":
            i += 1
        if body[i] == '"':
            i, value = i + 1, []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                value.append(body[i])
                i += 1
            items.append("".join(value))
            i += 1
            while i < len(body) and body[i] == " ":
                i += 1
        else:
            end = body.find(",", i)
            end = len(body) if end < 0 else end
            raw = body[i:end].strip()
            items.append(None if raw.upper() == "NULL" else raw)
            i = end
        if i < len(body):
            if body[i] != ",":
                raise ValueError("malformed array")
            i += 1
    return items


def _decode_binary_array(data: bytes) -> list[Any]:
    dimensions, _, element = struct.unpack("!iiI", data[:12])
    if dimensions == 0:
        return []
    if dimensions != 1:
        raise ValueError("only one-dimensional arrays")
    count = struct.unpack("!i", data[12:16])[0]
    position, items = 20, []
    for _ in range(count):
        length = struct.unpack("!i", data[position:position + 4])[0]
        position += 4
        if length < 0:
            items.append(None)
            continue
        value = _decode_binary(data[position:position + length], element)
        items.append(value.text if isinstance(value, TextParameter) else value)
        position += length
    return items


def _decode_binary(data: bytes, oid: int) -> Any:
    if oid in _ELEMENTS:
        return _decode_binary_array(data)
    if oid in _TEXT_LIKE:
        return TextParameter(data.decode("utf-8"))
    if oid == BOOL and len(data) == 1:
        return data != b"\0"
    formats = {INT2: "!h", INT4: "!i", INT8: "!q", FLOAT4: "!f", FLOAT8: "!d"}
    if oid in formats:
        return struct.unpack(formats[oid], data)[0]
    if oid == NUMERIC:
        return _numeric(data)
    if oid == DATE:
        return _EPOCH_DATE + datetime.timedelta(days=struct.unpack("!i", data)[0])
    if oid in (TIMESTAMP, TIMESTAMPTZ):  # microseconds since 2000-01-01 (a timestamptz's: in UTC)
        value = _POSTGRES_EPOCH + datetime.timedelta(microseconds=struct.unpack("!q", data)[0])
        return value.replace(tzinfo=datetime.UTC) if oid == TIMESTAMPTZ else value
    if oid in (TIME, TIMETZ):  # microseconds since midnight (a timetz's followed by its zone)
        return (datetime.datetime.min + datetime.timedelta(microseconds=struct.unpack("!q", data[:8])[0])).time()
    if oid == BYTEA:
        return data
    raise NotSupportedError(f"binary parameters of type OID {oid} are not supported: send them as text")


def _numeric(data: bytes) -> decimal.Decimal:
    """PostgreSQL's binary numeric: base-10000 digits with a weight, a sign and a display scale."""
    count, weight, sign, scale = struct.unpack("!hhHH", data[:8])
    digits = struct.unpack(f"!{count}H", data[8:8 + 2 * count])
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if sign not in (0, 0x4000) or len(data) != 8 + 2 * count or any(d > 9999 for d in digits):
        raise ValueError("malformed numeric")
    value = decimal.Decimal(0)
    for position, digit in enumerate(digits):
        value += decimal.Decimal(digit).scaleb(4 * (weight - position))
    value = value.quantize(decimal.Decimal(1).scaleb(-scale)) if scale else value
    return -value if sign == 0x4000 else value
