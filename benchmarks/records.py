"""The rows the benchmarks write: one dataclass per CSV, and the one function that writes them."""

from __future__ import annotations

import csv
import gzip
import math
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DPSQL = "dpsql"
DUCKDB = "duckdb"


@dataclass(frozen=True, slots=True)
class Observation:
    """One released value of one run: every accuracy measurement."""

    dataset: str
    query: str
    aggregate: str  # e.g. SUM(cost)
    kind: str
    group: str  # the group key as text; "" when the query has no GROUP BY
    system: str
    epsilon: float  # the query's total privacy cost, the same for every system
    run: int
    value: float
    low: float | None = None  # dpsql's 95% interval
    high: float | None = None
    std: float | None = None  # dpsql's reported noise standard deviation


@dataclass(frozen=True, slots=True)
class Truth:
    dataset: str
    query: str
    aggregate: str
    kind: str
    group: str
    bounded: float | None  # the exact answer after dpsql's contribution bounding and clamping
    raw: float | None  # the exact answer on the raw rows (plain DuckDB)
    rows: int  # rows in the cell (after the WHERE)
    fraction: float  # rows / rows of the table


@dataclass(frozen=True, slots=True)
class Cost:
    """How a system was made to spend the query's epsilon, and what it reports having spent."""

    system: str
    dataset: str
    query: str
    epsilon: float  # dpsql's epsilon for the query
    system_epsilon: float  # the epsilon the system was given
    mechanisms: float  # SmartNoise: epsilons charged per query at epsilon 1; dpsql: measurements sharing epsilon
    cost: float  # the total the system's own accounting reports for the query


@dataclass(frozen=True, slots=True)
class Skipped:
    part: str  # accuracy, speed, overhead
    system: str
    what: str
    reason: str


def write_csv(path: Path, rows: Sequence[Any], kind: type) -> Path:
    """Dataclass rows of type `kind` as CSV (gzip when the name ends in .gz); the header is its field names."""
    names = [f.name for f in fields(kind)]
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        writer.writerows(_cells(getattr(row, name) for name in names) for row in rows)
    return path


def _cells(values: Iterable[Any]) -> list[Any]:
    out = []
    for value in values:
        if value is None:
            out.append("")
        elif isinstance(value, float) and math.isfinite(value):
            out.append(f"{value:.10g}")
        else:
            out.append(value)
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        return list(csv.DictReader(handle))


def read_rows(path: Path, kind: type[T]) -> list[T]:
    """Rows written by write_csv, back as `kind` (empty if the file does not exist)."""
    if not path.exists():
        return []
    hints = typing.get_type_hints(kind)
    return [kind(**{name: _parse(text, hints[name]) for name, text in row.items()}) for row in read_csv(path)]


def _parse(text: str, hint: Any) -> Any:
    if text == "":
        return None
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if bool in options:
        return text == "True"
    for kind in (int, float):
        if kind in options:
            return kind(text)
    return text
