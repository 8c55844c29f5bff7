"""The query time limit: a thread that interrupts a DuckDB connection whose query runs too long."""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from collections.abc import Iterator

import duckdb


class Watchdog:
    """Interrupts the connection when a query runs longer than `seconds` (DuckDB then raises InterruptException).

    One thread per engine, waiting on a condition, so a query pays no thread start. The interrupt is sent with the
    condition held, and a query ends by clearing its deadline under the same lock: once `running` is left, no
    interrupt for that query is in flight (and DuckDB forgets an interrupt that finds no query running). The
    thread holds the connection only weakly and stops when the watchdog is closed, collected, or at exit: a thread
    still waiting at exit would keep DuckDB's objects alive through interpreter shutdown.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self._seconds = seconds
        self._changed = threading.Condition()
        self._state = _WatchState()
        self._thread = threading.Thread(target=_watch, args=(self._changed, self._state, weakref.ref(con)),
                                        name="dpsql-time-limit", daemon=True)
        _THREADS[self._thread] = (self._changed, self._state)
        self._thread.start()
        self._stop = weakref.finalize(self, _stop, self._changed, self._state)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._changed:
            self._state.deadline = time.monotonic() + self._seconds
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._state.deadline = None

    def interrupt_now(self) -> None:
        """Interrupt the running query now, as its time limit would (and again until it stops); nothing if no query
        is running (so a late call cannot reach the next query: the deadline is the running query's own)."""
        with self._changed:
            if self._state.deadline is not None:
                self._state.deadline = time.monotonic()
                self._changed.notify()

    def close(self) -> None:
        self._stop()
        self._thread.join()


_REPEAT = 0.01  # seconds between interrupts of a query that is past its deadline


class _WatchState:
    deadline: float | None = None  # time.monotonic() at which the running query is interrupted
    closed = False


_THREADS: dict[threading.Thread, tuple[threading.Condition, _WatchState]] = {}


def _stop(changed: threading.Condition, state: _WatchState) -> None:
    with changed:
        state.closed = True
        changed.notify()


@atexit.register
def _stop_all() -> None:
    for thread, (changed, state) in list(_THREADS.items()):
        _stop(changed, state)
        thread.join()


def _watch(changed: threading.Condition, state: _WatchState, con: weakref.ref) -> None:
    try:
        with changed:
            while not state.closed:
                if state.deadline is None:
                    changed.wait()
                elif time.monotonic() < state.deadline:
                    changed.wait(state.deadline - time.monotonic())
                else:
                    connection = con()
                    if connection is not None:
                        connection.interrupt()
                    del connection
                    # Again every few milliseconds until the query leaves `running`: an interrupt that reaches
                    # DuckDB before the statement has started (or between two statements) is forgotten.
                    state.deadline = time.monotonic() + _REPEAT
    finally:
        _THREADS.pop(threading.current_thread(), None)
