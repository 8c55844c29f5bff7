"""How an engine reports long work (loading tables, building a store) to whoever shows it.

The engine names each step and, while a DuckDB statement runs, offers how far it is (DuckDB's own estimate, in
percent); the front end decides what to show and how (frontends/progress.py: a live line on a terminal, plain lines
otherwise, nothing with --quiet). `Progress` itself shows nothing: engines built without a reporter stay silent.

What a step may carry is decided here, by `detailed`: figures read from the data (a table's row count, how far a
scan of it has gone) are for the steward, who owns the data (`dpsql prepare`, `policy check`, `serve`), never for an
analyst, who is shown elapsed time only (a command-line query). A reporter that is not detailed is never asked
for them, so the engine does not even compute them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import duckdb

Percent = Callable[[], float | None]  # how far the running statement is, 0-100, or None when unknown


class Step:
    """A step under way: `result` (detailed reporters only) is what it produced, said when it ends."""

    result: str | None = None


class Progress:
    """A reporter that shows nothing (the default of every engine)."""

    detailed = False  # whether figures read from the data may be reported: the steward's commands only

    @contextlib.contextmanager
    def step(self, what: str, percent: Percent | None = None) -> Iterator[Step]:
        """A step of long work, `what` in words ("reading visits.csv into table visits"); `percent` is polled while
        it runs (detailed reporters only)."""
        yield Step()


SILENT = Progress()


@contextlib.contextmanager
def duckdb_percent(con: duckdb.DuckDBPyConnection, progress: Progress) -> Iterator[Percent | None]:
    """How far `con`'s running statement is, for a detailed reporter (None for others): DuckDB tracks it only with
    its progress bar on, which is switched on for this connection alone (a SET: DuckDB 2.0 refuses it as a startup
    option) without printing, and off again when the block ends, before the sandbox locks the configuration."""
    if not progress.detailed:
        yield None
        return
    con.execute("SET enable_progress_bar_print = false")
    con.execute("SET enable_progress_bar = true")
    try:
        yield lambda: _percent(con)
    finally:
        con.execute("SET enable_progress_bar = false")


def _percent(con: duckdb.DuckDBPyConnection) -> float | None:
    """Asked from the reporter's thread while `con` runs a statement on another (DuckDB allows it)."""
    try:
        value = con.query_progress()
    except duckdb.Error:
        return None
    return value if value >= 0 else None
