"""What is wrong with the shape of a CSV source that DuckDB could not read as the policy declares it.

DuckDB's reader guesses the dialect from a sample; on a file with one malformed row it may give up and read every
line as one column, and the steward was told that the column `pid` is missing from a file whose header is
`pid,s,v`. When a CSV load fails, the loader asks here first: the files are read again with Python's csv module,
and the first structural problem is named with its file and line (an empty file, a line that is not UTF-8, a
header that names a column twice, a line with more or fewer fields than the header, a quote never closed). Only a
place is named, never a value: the message goes to whoever loads the policy, the same for every query.

It runs only after a load has failed, so the time it takes (the whole file, in Python) is paid only then.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import gzip
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

_DELIMITERS = (",", ";", "\t", "|")


def csv_problem(pattern: str, columns: Iterable[str]) -> str | None:
    """The first structural problem among the CSV files `pattern` matches (a glob), or None if each is well formed.

    `columns` are the declared column names: the delimiter is the one under which the header names most of them
    (DuckDB sniffs the delimiter; this only has to agree with it on a file whose header is right)."""
    declared = {name.lower() for name in columns}
    for name in sorted(glob.glob(pattern, recursive=True, include_hidden=True)):
        try:
            with _opened(name) as raw:
                problem = _file_problem(raw, declared)
        except (OSError, EOFError):  # unreadable, or a truncated gzip stream
            problem = "cannot be read to the end (is it a complete file, compressed as its name says?)"
        if problem is not None:
            return f"{Path(name).name}: {problem}"
    return None


@contextlib.contextmanager
def _opened(name: str) -> Iterator[BinaryIO]:
    with (gzip.open(name, "rb") if name.lower().endswith(".gz") else open(name, "rb")) as raw:
        yield raw  # type: ignore[misc]


def _file_problem(raw: BinaryIO, declared: set[str]) -> str | None:
    data = raw.read()
    if not data.strip():
        return "the file is empty: its first line must name the columns"
    for number, line in enumerate(data.split(b"\n"), start=1):  # no UTF-8 sequence holds a newline byte
        try:
            line.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            return f"line {number} is not UTF-8 text"
    text = data.decode("utf-8-sig")
    delimiter = _delimiter(text.split("\n", 1)[0], declared)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader)
    except csv.Error:
        return "the header (line 1) is not well-formed CSV"
    seen: set[str] = set()
    for name in (field.strip().lower() for field in header):
        if name in seen:
            return f"the header (line 1) names the column '{name}' twice"
        seen.add(name)
    return _ragged(reader, len(header))


def _ragged(reader: Any, width: int) -> str | None:
    """The first record with another number of fields than the header, or that is not well-formed CSV (a quote
    never closed, text after a closing quote)."""
    start = reader.line_num + 1
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            unclosed = f"a quoted field that starts on line {start} or after is never closed"
            if "field larger than field limit" in str(exc):
                # One long line is a long value (DuckDB reads it, the load cuts it to max_length); a value that
                # runs on over lines until it is that long is a quote left open.
                return unclosed if reader.line_num > start else None
            if "unexpected end of data" in str(exc):
                return unclosed
            return f"line {start} or the next is not well-formed CSV (a quote inside a value that is not quoted?)"
        if fields and len(fields) != width:
            if reader.line_num > start:
                return (f"lines {start} to {reader.line_num} read as one row of {len(fields)} fields, but the header "
                        f"has {width}: a quote opened on line {start} is closed too late, or not at all")
            return (f"line {start} has {len(fields)} fields, but the header has {width}: a field too many or too "
                    "few, or the delimiter inside a value that is not quoted")
        start = reader.line_num + 1


def _delimiter(header: str, declared: set[str]) -> str:
    """The delimiter under which the header names most declared columns (most fields, if it names none)."""
    def score(candidate: str) -> tuple[int, int]:
        fields = [field.strip().strip('"').lower() for field in header.split(candidate)]
        return len(declared.intersection(fields)), len(fields)
    return max(_DELIMITERS, key=score)
