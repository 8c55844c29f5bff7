"""What the session needs from an engine: the one place bounded SQL runs on the private tables.

An engine is constructed from a policy (and, for tests only, a fixed bounding seed): construction reads every
declared table and prepares it for bounding (rewrite/bounding.py), under the names the rewrite reads
(sql/names.py). After that the session only asks two things, always in this order for a given SQL text: its
column types, decided by the schema alone, and its rows. Anything more an engine offers (DuckDB's physical
plans) stays on that engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from dpsql.analysis.public_facts import PublicFacts


class Engine(ABC):
    time_limit: float  # seconds a query may run before it is interrupted and fails
    # What was loaded, as a fingerprint: the policy's text and each source file's path, size and modification time.
    # Two engines with the same version hold the same data, so an answer already released about it still holds.
    data_version: str
    store_built: bool = False  # whether constructing this engine built the policy's prepared store
    # Whether each private table comes with its later-rows table (rewrite/bounding.later_rows), which the filtered
    # cap reads instead of ranking those rows again.
    lists_earlier_rows: bool = True

    @abstractmethod
    def dry_run(self, sql: str) -> list[str]:
        """The column types of a bounded query, found without reading a row: a query that fails here (a type
        error) is rejected with a message that depends on the SQL and the schema only, and costs nothing."""

    @abstractmethod
    def run(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of a bounded query on the data, every value exact. Any failure, whatever its cause, raises
        the one generic ExecutionFailed: how a query fails on the data could depend on a single row. Nothing a
        query does survives it."""

    def public_facts(self) -> PublicFacts | None:
        """Facts of the public tables, for joins with them; None: this engine holds none."""
        return None

    def run_public(self, sql: str) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
        """The column names, types and rows of a query that reads public tables only (analysis/public_query.py)."""
        raise NotImplementedError("this engine holds no public tables")

    def describe_public(self, sql: str) -> tuple[list[str], list[str]]:
        """The column names and types of a query that reads public tables only, without reading a row."""
        raise NotImplementedError("this engine holds no public tables")

    @abstractmethod
    def interrupt(self) -> None:
        """Stop the query running on the data now (it then fails like any other: ExecutionFailed); nothing if none
        is running. For a client's cancel: the query was charged before it ran, and stays charged."""

    @abstractmethod
    def close(self) -> None:
        """Release the tables and everything held for them."""
