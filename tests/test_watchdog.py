"""The engine's watchdog: the time limit, and interrupting the running query now (a client's cancel)."""

from __future__ import annotations

import threading

import duckdb
import pytest

from dpsql.engines.watchdog import Watchdog

LONG = "SELECT COUNT(*) FROM range(1000000000000) t(i) WHERE i % 7 = 3"  # hours, unless interrupted


def _run_in_thread(con: duckdb.DuckDBPyConnection, watchdog: Watchdog) -> tuple[threading.Thread, list]:
    outcome: list = []
    started = threading.Event()

    def run() -> None:
        with watchdog.running():
            started.set()
            try:
                outcome.append(con.execute(LONG).fetchall())
            except duckdb.InterruptException as exc:
                outcome.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    started.wait()
    return thread, outcome


def test_interrupt_now_stops_the_running_query() -> None:
    con = duckdb.connect()
    watchdog = Watchdog(con, 3600.0)
    try:
        thread, outcome = _run_in_thread(con, watchdog)
        # Once: the query may not have reached DuckDB yet, so the watchdog repeats the interrupt until it stops.
        watchdog.interrupt_now()
        thread.join()
        assert len(outcome) == 1 and isinstance(outcome[0], duckdb.InterruptException)
    finally:
        watchdog.close()


def test_interrupt_now_without_a_running_query_reaches_no_later_query() -> None:
    con = duckdb.connect()
    watchdog = Watchdog(con, 3600.0)
    try:
        watchdog.interrupt_now()
        with watchdog.running():
            assert con.execute("SELECT COUNT(*) FROM range(2000000)").fetchone()[0] == 2000000
    finally:
        watchdog.close()


def test_the_time_limit_still_interrupts() -> None:
    con = duckdb.connect()
    watchdog = Watchdog(con, 0.2)
    try:
        with watchdog.running(), pytest.raises(duckdb.InterruptException):
            con.execute(LONG).fetchall()
    finally:
        watchdog.close()
