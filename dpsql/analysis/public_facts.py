"""What the checker may learn from public tables: their data are public, so facts about them leak nothing.

The analysis layer may not read data (it sits below the engines), so it asks through this Protocol, which the
engine that holds the public tables implements (engines/public_facts.py). A private table is never asked about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ColumnFacts:
    lower: float | None  # the smallest and largest value of a numeric column; None if it has no value
    upper: float | None
    values: tuple[Any, ...] | None  # the distinct values (not NULL), as the engine returns them; None if too many


class PublicFacts(Protocol):
    def max_rows_per_key(self, table: str, columns: tuple[str, ...]) -> int:
        """The largest number of rows of public `table` that share one value of `columns` (none NULL)."""

    def column(self, table: str, column: str) -> ColumnFacts:
        """The range and distinct values of one column of public `table`."""

    def values(self, sql: str, limit: int) -> tuple[Any, ...] | None:
        """The distinct values of the one column of `sql`, a query of public tables only (public_query.py resolved
        it: every table a declared public one); None if there are more than `limit` or the query fails."""

    def rows(self, sql: str, limit: int) -> PublicRows | None:
        """The whole result of `sql`, a query of public tables only (public_query.py resolved it), with its columns'
        names and types; None if it has more than `limit` rows or fails (a correlated subquery fails on its own)."""


@dataclass(frozen=True)
class PublicRows:
    """The result of a query of public tables only, read in full: each column's name and DuckDB type, and the rows
    (a DATE, TIMESTAMP or any type Python does not hold exactly as DuckDB's text of it), sorted."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
