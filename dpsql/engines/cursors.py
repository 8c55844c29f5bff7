"""Connections to one DuckDB database for statements that run at the same time, each under its own time limit.

A server runs several analysts' queries at once: DuckDB runs statements of different connections to one database
in parallel (and releases the GIL while it does), but one connection runs one statement at a time. So each
statement takes a cursor (a connection to the same database, with the same locked configuration) from the pool
for its duration and gives it back; a cursor is opened when none is free, and each has its own watchdog, so that
one query's time limit or cancel interrupts that query only. How many run at once is the caller's to bound (the
server's scheduler): the pool only keeps what was opened for reuse.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import duckdb

from dpsql.engines.watchdog import Watchdog


class CursorPool:
    def __init__(self, con: duckdb.DuckDBPyConnection, time_limit: float, setup: Sequence[str] = ()) -> None:
        """`setup`: statements run once on each new cursor (`USE` the schema its queries name tables in)."""
        self._con = con
        self._time_limit = time_limit
        self._setup = tuple(setup)
        self._lock = threading.Lock()
        self._free: list[tuple[duckdb.DuckDBPyConnection, Watchdog]] = []
        self._running: dict[int, Watchdog] = {}  # thread id -> the watchdog of the statement it runs
        self._closed = False

    @contextlib.contextmanager
    def taken(self) -> Iterator[tuple[duckdb.DuckDBPyConnection, Watchdog]]:
        """A cursor and its watchdog for the calling thread's statement (the watchdog not yet running: the caller
        decides what its time limit covers)."""
        with self._lock:
            if self._closed:
                raise duckdb.ConnectionException("the engine is closed")
            pair = self._free.pop() if self._free else None
        if pair is None:
            pair = self._open()
        owner = threading.get_ident()
        with self._lock:
            self._running[owner] = pair[1]
        try:
            yield pair
        finally:
            with self._lock:
                self._running.pop(owner, None)
                if self._closed:
                    _close(pair)
                else:
                    self._free.append(pair)

    def _open(self) -> tuple[duckdb.DuckDBPyConnection, Watchdog]:
        cursor = self._con.cursor()
        for statement in self._setup:
            cursor.execute(statement)
        return cursor, Watchdog(cursor, self._time_limit)

    def interrupt(self, owner: int | None = None) -> None:
        """Stop the statement the thread `owner` runs (None: every running statement), as its time limit would."""
        with self._lock:
            watchdogs = list(self._running.values()) if owner is None else \
                [self._running[owner]] if owner in self._running else []
        for watchdog in watchdogs:
            watchdog.interrupt_now()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._free = self._free, []  # the taken ones close as they come back
        for pair in idle:
            _close(pair)


def _close(pair: tuple[duckdb.DuckDBPyConnection, Watchdog]) -> None:
    cursor, watchdog = pair
    watchdog.close()
    with contextlib.suppress(duckdb.Error):
        cursor.close()
