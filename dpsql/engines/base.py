"""What the session needs from an engine: the one place bounded SQL runs on the private tables.

An engine is constructed from a policy (and, for tests only, a fixed bounding seed): construction reads every
declared table and prepares it for bounding (rewrite/bounding.py), under the names the rewrite reads
(sql/names.py). After that the session only asks two things, always in this order for a given SQL text: its
column types, decided by the schema alone, and its rows. Anything more an engine offers (DuckDB's physical
plans) stays on that engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpsql.analysis.public_facts import PublicFacts


@dataclass(frozen=True)
class ReleasedTable:
    """A released answer, as a table SQL over it reads (post-processing): its columns (name, DuckDB type) and
    rows. Released means public: it may sit beside the public tables."""

    name: str
    columns: tuple[tuple[str, str], ...]
    rows: list[tuple[Any, ...]]


class Engine(ABC):
    time_limit: float  # seconds a query may run before it is interrupted and fails
    # What was loaded, as a fingerprint: the policy's text and each source file's path, size and modification time.
    # Two engines with the same version hold the same data, so an answer already released about it still holds.
    data_version: str
    # Which ranking of each person's rows the tables carry (the salt's identity, never the salt): two engines with
    # the same data version and ranking cap the same rows, so a measurement one released measures what the other's
    # would (planning/reuse.py). `ranking_persistent`: it outlives this engine (a prepared store's, or a test's fixed
    # seed); a fresh load draws a new secret salt, so its measurements are of no use to another engine.
    ranking: str = ""
    ranking_persistent: bool = False
    store_built: bool = False  # whether constructing this engine built the policy's prepared store
    # Whether each private table comes with its later-rows table (rewrite/bounding.later_rows), which the filtered
    # cap reads instead of ranking those rows again.
    lists_earlier_rows: bool = True
    answers_probes: bool = False  # whether describe_declared works (column probes are answered without data)

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

    def run_public(self, sql: str, released: Sequence[ReleasedTable] = ()) -> tuple[list[str], list[str],
                                                                                    list[tuple[Any, ...]]]:
        """The column names, types and rows of a query that reads public tables only (analysis/public_query.py),
        and the released answers given, for the time of the query."""
        raise NotImplementedError("this engine holds no public tables")

    def describe_declared(self, sql: str) -> tuple[list[str], list[str]]:
        """The column names and types of a query over empty copies of the declared tables (a column probe:
        analysis/probes.py): no row of any table is there."""
        raise NotImplementedError("this engine cannot describe queries on the declared tables")

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
