"""`COPY (query) TO STDOUT`: the statement read, and an answer's rows written in PostgreSQL's three COPY formats.

The query inside is answered as any other statement (a private query is charged once, as itself); COPY only
changes how its rows travel: text (tab-separated, `\\N` for NULL, backslash escapes), CSV (RFC 4180 quoting, an
optional header) or binary (PostgreSQL's PGCOPY file: each value in its binary wire format, types.py). `COPY table
TO STDOUT` is `SELECT * FROM table`: a public table's rows, a private table's refused. dpsql never writes: COPY
FROM is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import Token, TokenType

from dpsql.errors import NotSupportedError, ProgrammingError
from dpsql.frontends.server import types

_POSTGRES = Dialect.get_or_raise("postgres")
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # no OIDs, no header extension


@dataclass(frozen=True)
class CopyFormat:
    kind: str = "text"  # text, csv or binary
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    quote: str = '"'
    escape: str = '"'

    @property
    def binary(self) -> bool:
        return self.kind == "binary"


@dataclass(frozen=True)
class CopyStatement:
    query: str  # the SELECT whose rows are copied
    format: CopyFormat


def copy_statement(sql: str) -> CopyStatement | None:
    """The COPY ... TO STDOUT that `sql` is, None if it is no COPY; a COPY dpsql cannot do is refused here."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except (SqlglotError, ValueError):
        return None
    if not tokens or tokens[0].text.upper() != "COPY":
        return None
    position = 1
    if position < len(tokens) and tokens[position].token_type == TokenType.L_PAREN:
        end = _closing(tokens, position)
        query = sql[tokens[position].end + 1:tokens[end].start].strip()
        position = end + 1
    else:
        start = position
        while position < len(tokens) and tokens[position].text.upper() not in ("TO", "FROM", "("):
            position += 1
        name = sql[tokens[start].start:tokens[position - 1].end + 1] if position > start else ""
        columns = "*"
        if position < len(tokens) and tokens[position].token_type == TokenType.L_PAREN:
            end = _closing(tokens, position)
            columns = sql[tokens[position].end + 1:tokens[end].start]
            position = end + 1
        if not name:
            raise ProgrammingError("COPY needs a table or a (query)")
        query = f"SELECT {columns} FROM {name}"
    words = [t.text for t in tokens[position:]]
    if len(words) < 2 or words[0].upper() != "TO" or words[1].upper() != "STDOUT":
        if words and words[0].upper() == "FROM":
            raise NotSupportedError("dpsql is read-only: COPY ... FROM is not supported")
        raise NotSupportedError("dpsql copies to the client only: COPY ... TO STDOUT")
    return CopyStatement(query, _options(tokens[position + 2:]))


def _closing(tokens: list[Token], opening: int) -> int:
    depth = 0
    for i in range(opening, len(tokens)):
        if tokens[i].token_type == TokenType.L_PAREN:
            depth += 1
        elif tokens[i].token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                return i
    raise ProgrammingError("COPY: a parenthesis is not closed")


def _options(tokens: list[Token]) -> CopyFormat:
    """`WITH (FORMAT csv, HEADER, DELIMITER ';')`, or the old `WITH CSV HEADER` / `BINARY` spelling."""
    values: dict[str, str] = {}
    words = [t for t in tokens if t.token_type not in (TokenType.L_PAREN, TokenType.R_PAREN, TokenType.COMMA)]
    i = 0
    while i < len(words):
        word = words[i].text.lower()
        following = words[i + 1] if i + 1 < len(words) else None
        if word == "with":
            i += 1
        elif word in ("binary", "csv") and (following is None or (following.token_type != TokenType.STRING
                                             and following.text.lower() not in ("true", "false", "on", "off"))):
            values["format"] = word
            i += 1
        elif word == "header" and (following is None or following.text.lower() not in ("true", "false", "on",
                                                                                       "off", "1", "0", "match")):
            values["header"] = "true"
            i += 1
        elif following is not None:
            if word in ("delimiter", "null", "quote", "escape") and following.text.lower() == "as" and \
                    i + 2 < len(words):
                following = words[i + 2]
                i += 1
            values[word] = following.text
            i += 2
        else:
            raise ProgrammingError(f"COPY option {words[i].text!r} needs a value")
    kind = values.pop("format", "text").lower()
    if kind not in ("text", "csv", "binary"):
        raise ProgrammingError(f"COPY format {kind!r} is not text, csv or binary")
    csv = kind == "csv"
    header = values.pop("header", "false").lower() in ("true", "on", "1")
    quote = values.pop("quote", '"')
    chosen = CopyFormat(kind, header, values.pop("delimiter", "," if csv else "\t"),
                        values.pop("null", "" if csv else "\\N"), quote, values.pop("escape", quote))
    if values:
        raise NotSupportedError(f"COPY option {sorted(values)[0].upper()} is not supported")
    if len(chosen.delimiter) != 1 or len(chosen.quote) != 1 or len(chosen.escape) != 1:
        raise ProgrammingError("COPY delimiter, quote and escape must each be one character")
    if chosen.binary and chosen.header:
        raise ProgrammingError("COPY: HEADER is not available in binary format")
    return chosen


def copy_rows(names: Sequence[str], oids: Sequence[int], rows: Sequence[tuple[Any, ...]],
              chosen: CopyFormat) -> Iterator[bytes]:
    """The CopyData payloads of an answer: a header (binary signature or CSV names), one per row, a trailer."""
    if chosen.binary:
        # The signature travels with the first row (or the trailer), as PostgreSQL sends it: psycopg and
        # connectorx read a row from the rest of the first CopyData.
        header = _BINARY_SIGNATURE
        for row in rows:
            fields = [types.encode_binary(value, oid) for value, oid in zip(row, oids, strict=True)]
            yield header + struct.pack("!h", len(fields)) + b"".join(
                struct.pack("!i", -1) if f is None else struct.pack("!i", len(f)) + f for f in fields)
            header = b""
        yield header + struct.pack("!h", -1)
        return
    if chosen.kind == "csv":
        if chosen.header:
            yield (chosen.delimiter.join(_csv_field(n, chosen) for n in names) + "\n").encode("utf-8")
        for row in rows:
            yield (chosen.delimiter.join(chosen.null if v is None else _csv_field(_text(v), chosen)
                                         for v in row) + "\n").encode("utf-8")
        return
    for row in rows:
        yield (chosen.delimiter.join(chosen.null if v is None else _escaped(_text(v), chosen.delimiter)
                                     for v in row) + "\n").encode("utf-8")


def _text(value: Any) -> str:
    encoded = types.encode_text(value)
    return "" if encoded is None else encoded.decode("utf-8")


def _csv_field(text: str, chosen: CopyFormat) -> str:
    special = (chosen.delimiter, chosen.quote, "\n", "\r")
    if text == chosen.null or any(c in text for c in special) or text != text.strip(" "):
        doubled = text.replace(chosen.escape, chosen.escape * 2) if chosen.escape == chosen.quote else \
            text.replace(chosen.escape, chosen.escape * 2).replace(chosen.quote, chosen.escape + chosen.quote)
        return f"{chosen.quote}{doubled}{chosen.quote}"
    return text


def _escaped(text: str, delimiter: str) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text.replace(delimiter, "\\" + delimiter) if delimiter != "\t" else text
