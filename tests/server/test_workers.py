"""The server with worker processes (frontends/server/workers.py): each analyst's sessions in a worker process of its
own engine, the server's process speaking the protocol and scheduling.

What must hold as without workers: answers cross the process boundary unchanged, errors keep their class and words,
a CancelRequest stops a query running in a worker, a Describe never waits behind a query on the data, a load error
is the same clear error at start, and a worker that dies fails its query with a clear error and is started again,
without the server going down or the ledger losing or doubling a charge.
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import psycopg
import pytest

from benchmarks.support import RunningServer
from dpsql import errors
from dpsql.analysis.typecheck import Rejected
from dpsql.frontends.server.commands import Answer
from dpsql.frontends.server.messages import Reply, WorkerFailed, WorkerStopped, error_text, raised
from dpsql.frontends.server.server import ServerConfig
from dpsql.policy import load_policy
from tests.server.conftest import PASSWORDS, RawClient, Tally, charges, dsn, hold_engine, ledger_of, sample_policy
from tests.server.test_load import (
    PRIVATE,
    PUBLIC_CROSS_JOIN,
    _ahead_of_bob,
    _answer_of,
    _cancel,
    _key,
    _Order,
    _policy,
    _query,
)

# A query of public tables only (exact, no noise: the same answer every time) whose columns have many types.
TYPED = ("SELECT department, floor, CAST(beds AS BIGINT) AS beds, floor / 3.0 AS ratio, "
         "CAST(beds AS DECIMAL(18, 3)) + 0.1 AS share, DATE '2024-02-29' + CAST(floor AS INTEGER) AS day, "
         "TIMESTAMP '2024-01-01 12:34:56.789012' + CAST(floor AS INTEGER) * INTERVAL 1 HOUR AS at, "
         "CAST('-0.0' AS DOUBLE) AS minus_zero, CAST('nan' AS DOUBLE) AS nan, CAST('inf' AS DOUBLE) AS inf, "
         "floor > 2 AS high, CAST(NULL AS INTEGER) AS nothing, specialty_group || ' é ✓' AS label "
         "FROM departments ORDER BY department")


LONG = 120.0  # seconds: the time limit of a query that runs until cancelled


def _running(policy: Path, workers: int) -> RunningServer:
    return RunningServer(policy, ServerConfig(port=0, workers=workers, max_connections=100)).start()


@pytest.fixture
def one_worker(tmp_path: Path) -> Iterator[RunningServer]:
    """A server whose analysts all share one worker process, with a long time limit (a query runs until
    cancelled)."""
    running = _running(_policy(tmp_path, time_limit=LONG), workers=1)
    try:
        yield running
    finally:
        running.stop()


# ---- the messages, without processes ---------------------------------------------------------------------------

def test_errors_cross_the_pipe_as_their_class_and_words() -> None:
    """Each dpsql error arrives as the same class (so the same SQLSTATE) with the same message; another layer's
    subclass as its class in dpsql.errors; anything else (a bug) without its message, which might say anything."""
    for kind in (errors.BudgetExhausted, errors.QueryRejected, errors.DataError, errors.ProgrammingError,
                 errors.PolicyError, errors.LedgerError, errors.ExecutionFailed, errors.NotSupportedError):
        again = raised(error_text(kind("the words, 'quoted'")))
        assert type(again) is kind and str(again) == "the words, 'quoted'"
    again = raised(error_text(errors.ExecutionFailed()))
    assert type(again) is errors.ExecutionFailed and str(again) == errors.ExecutionFailed.MESSAGE
    rejected = raised(error_text(Rejected("a cross join is not supported")))
    assert type(rejected) is errors.QueryRejected and rejected.sqlstate == Rejected.sqlstate
    assert str(rejected) == "a cross join is not supported"
    stopped = raised(error_text(WorkerStopped("stopped")))
    assert type(stopped) is WorkerStopped and stopped.sqlstate == "57P02"
    bug = raised(error_text(KeyError("secret value 42")))
    assert type(bug) is WorkerFailed and "42" not in str(bug) and bug.sqlstate == "XX000"


def test_answers_cross_the_pipe_unchanged() -> None:
    """An answer sent over a worker's kind of pipe arrives with every value of the same type and value: exact
    decimals, dates, times with their zone, -0.0, NaN, infinities, text beyond ASCII, lists and structs."""
    values = (decimal.Decimal("12345678901234567890.123456789"), decimal.Decimal("-0.000"), 2**70, -0.0,
              float("nan"), float("inf"), 1 / 3, datetime.date(2024, 2, 29),
              datetime.datetime(2024, 1, 1, 12, 34, 56, 789012),
              datetime.datetime(2024, 1, 1, 12, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))),
              datetime.time(23, 59, 59, 999999), datetime.timedelta(days=-1, microseconds=1), True, None, "é ✓ \0x",
              b"\x00\xff", uuid.UUID("12345678-1234-5678-1234-567812345678"), [1, None, 3], {"a": [1.5], "b": None})
    answer = Answer((("v", "VARCHAR"),), [values], "SELECT 1", notices=("dpsql: cost",))
    ours, theirs = socket.socketpair()
    with Connection(ours.detach()) as sender, Connection(theirs.detach()) as receiver:
        sender.send(Reply(7, answer))
        arrived = receiver.recv()
    assert isinstance(arrived, Reply) and arrived.request == 7
    row = arrived.value.rows[0]
    assert [type(v) for v in row] == [type(v) for v in values]
    for sent, got in zip(values, row, strict=True):
        if isinstance(sent, float) and math.isnan(sent):
            assert math.isnan(got)
        else:
            assert got == sent and repr(got) == repr(sent)
    assert math.copysign(1, row[3]) == -1 and row[9].utcoffset() == values[9].utcoffset()
    assert arrived.value.notices == answer.notices and arrived.value.tag == answer.tag


# ---- a server with workers -------------------------------------------------------------------------------------

@pytest.mark.slow  # starts worker processes
def test_answers_from_a_worker_are_the_servers_own(tmp_path: Path) -> None:
    """The same exact query (public tables: no noise) read through the wire in text and in binary: the same rows,
    types and values with workers as without."""
    policy = _policy(tmp_path)
    read = {}
    for workers in (0, 2):
        running = _running(policy, workers)
        try:
            with psycopg.connect(dsn(running), autocommit=True) as conn:
                rows = {binary: conn.cursor(binary=binary).execute(TYPED).fetchall() for binary in (False, True)}
                described = [(c.name, c.type_code) for c in conn.execute(TYPED).description]
        finally:
            running.stop()
        read[workers] = (rows, described)
    assert repr(read[0]) == repr(read[2])  # repr: NaN is not equal to itself, and -0.0 equals 0.0
    assert len(read[2][0][False]) > 0 and "nan" in repr(read[2][0][True])


@pytest.mark.slow  # starts a worker process
def test_a_cancel_stops_a_query_running_in_a_worker(one_worker: RunningServer) -> None:
    """Bob's query runs on the data in the worker until cancelled (its time limit is two minutes away); meanwhile
    Alice, in the same worker, gets a Describe and a private answer; then Bob's CancelRequest stops his query."""
    bob = RawClient(one_worker.port)
    alice = RawClient(one_worker.port)
    try:
        key = _key(bob.login("bob", PASSWORDS["bob"]))
        alice.login("alice", PASSWORDS["alice"])
        started = time.monotonic()
        _query(bob, PUBLIC_CROSS_JOIN)
        _until_in_worker(one_worker)
        sql = b"SELECT department, COUNT(*) FROM visits WHERE age > $1 GROUP BY department\0"
        alice.send(b"P", b"\0" + sql + struct.pack("!h", 0))
        alice.send(b"D", b"S\0")
        alice.send(b"S", b"")
        assert [kind for kind, _ in alice.until(b"Z")] == [b"1", b"t", b"T", b"Z"]
        _query(alice, PRIVATE.format(44))
        assert [kind for kind, _ in alice.until(b"Z")][-3:] == [b"N", b"C", b"Z"]  # a row, its notice, done
        _cancel(one_worker.port, key)
        error = next(body for kind, body in bob.until(b"Z") if kind == b"E")
        assert b"C57014\0" in error and b"Mcanceling statement due to user request\0" in error  # free: no charge
        # The cancel stopped it, not its time limit (which fails it the same way): not a limit on the test's time.
        assert time.monotonic() - started < LONG
    finally:
        bob.close()
        alice.close()


@pytest.mark.slow  # starts worker processes, 65 connections
def test_one_analysts_flood_does_not_starve_another_with_workers(tmp_path: Path) -> None:
    """Alice's 64 queries wait for their turns, then Bob's one, asked after all of them; when the turns free, Bob's
    is answered after a few of Alice's (those that run beside it), not after all 64: the server's scheduler gives
    the turns, whichever worker runs the query."""
    policy = _policy(tmp_path)
    running = _running(policy, workers=2)
    order = _Order()
    flood = [RawClient(running.port) for _ in range(64)]
    victim = RawClient(running.port)
    scheduler = running.server.queries
    try:
        for client in flood:
            client.login("alice", PASSWORDS["alice"])
        victim.login("bob", PASSWORDS["bob"])
        release = hold_engine(running)
        for number, client in enumerate(flood):
            _query(client, PRIVATE.format(100 + number))
        readers = [_answer_of(client, order, "alice") for client in flood]
        while len(scheduler._waiting.get("alice", ())) < 64:
            threading.Event().wait(0.01)
        _query(victim, PRIVATE.format(99))
        readers.append(_answer_of(victim, order, "bob"))
        while "bob" not in scheduler._waiting:
            threading.Event().wait(0.01)
        release()
        ahead = _ahead_of_bob(readers, order)
        assert ahead <= 8, f"bob's query was answered after {ahead} of alice's 64"
        assert len(charges(policy)) == 65
    finally:
        for client in [*flood, victim]:
            client.close()
        running.stop()


def _until_in_worker(running: RunningServer) -> None:
    """Until a connection's query has had its turn and waits for its worker's answer."""
    workers = running.server.workers.workers
    while not any(c._busy for c in running.server._connections.values()) or not any(w._requests for w in workers):
        threading.Event().wait(0.01)


@pytest.mark.slow  # starts a worker process, kills it and starts another
def test_a_killed_worker_fails_its_query_and_is_started_again(one_worker: RunningServer) -> None:
    """The worker is killed while Bob's query runs in it: Bob gets a clear error (not a dropped connection), the
    server stays up, and the next query, on the same connection, is answered by the worker started again."""
    worker = one_worker.server.workers.workers[0]
    first = worker.pid
    with psycopg.connect(dsn(one_worker, "bob"), autocommit=True) as conn:
        failure: list[BaseException] = []

        def ask() -> None:
            try:
                conn.execute(PUBLIC_CROSS_JOIN)
            except psycopg.Error as exc:
                failure.append(exc)
        asker = threading.Thread(target=ask)
        asker.start()
        _until_in_worker(one_worker)
        os.kill(first, signal.SIGKILL)
        asker.join()
        assert failure and failure[0].sqlstate == "57P02"
        assert "worker process running this statement stopped" in str(failure[0])
        assert "Traceback" not in str(failure[0]) and "Worker" not in str(failure[0])
        assert conn.execute(PRIVATE.format(45)).fetchone()[0] is not None
    assert worker.pid != first
    with psycopg.connect(dsn(one_worker, "alice"), autocommit=True) as conn:
        assert conn.execute(PRIVATE.format(46)).fetchone()[0] is not None
    assert [c.analyst for c in charges(one_worker.policy)] == ["bob", "alice"]


@pytest.mark.slow  # starts worker processes, kills one
def test_the_ledger_stays_exact_when_a_worker_dies_under_load(tmp_path: Path) -> None:
    """Alice and Bob (one worker each) ask private queries on four connections each while Bob's worker is killed:
    each of the queries it had fails with the worker's error, and was charged at most once (in one transaction,
    or not at all); every answer was charged once; Alice never noticed."""
    policy = _policy(tmp_path)
    running = _running(policy, workers=2)
    tally = Tally(["alice", "bob"])
    go = threading.Barrier(9)
    threads = [threading.Thread(target=tally.ask, args=(running, user, [PRIVATE.format(1000 * (10 * k + i) + n)
                                                                        for n in range(12)], {"57P02"}, go))
               for k, user in enumerate(tally.answered) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        go.wait()
        bobs = running.server.workers.home("bob")
        os.kill(bobs.pid, signal.SIGSTOP)  # frozen: what is asked of it now cannot be answered before the kill
        while len(bobs._requests) < 2:  # his two turns' queries, at least, sent to it and waiting
            threading.Event().wait(0.001)
        os.kill(bobs.pid, signal.SIGKILL)
        for thread in threads:
            thread.join()
    finally:
        running.stop()
    stopped = {user: refused["57P02"] for user, refused in tally.refused.items()}
    assert stopped["alice"] == 0 and tally.answered["alice"] == 48
    assert stopped["bob"] >= 1 and tally.answered["bob"] + stopped["bob"] == 48
    with ledger_of(policy) as ledger:
        history = ledger.history()
        for user, answered in tally.answered.items():
            mine = [c for c in history if c.analyst == user]
            assert answered <= len(mine) <= answered + stopped[user]
            assert float(sum(c.epsilon for c in mine)) == ledger.spending(user).epsilon_spent


def _with_a_bad_age(tmp_path: Path) -> Path:
    """The sample policy, its visits file with an age of 57.5 in the first row: the load refuses it (an integer
    column), naming the file; the policy itself loads."""
    policy = sample_policy(tmp_path)
    visits = policy.parent / "visits.csv"
    header, first, *rest = visits.read_text().splitlines(keepends=True)
    assert first.startswith("1,2023-08-20,east,general,57,")
    visits.write_text(header + first.replace(",57,", ",57.5,", 1) + "".join(rest))
    return policy


@pytest.mark.slow  # starts worker processes (that fail to load)
def test_a_load_error_is_the_same_clear_error_with_workers(tmp_path: Path) -> None:
    """A value the load refuses: the server's start raises the same error, class and words, with workers as without, and
    `dpsql serve` says it in one line, no traceback, with the same exit status."""
    policy = _with_a_bad_age(tmp_path)
    seen = []
    for workers in (0, 2):
        with pytest.raises(errors.Error) as failed:
            _running(policy, workers)
        seen.append((type(failed.value), str(failed.value)))
    assert seen[0] == seen[1] and "visits.csv" in seen[0][1]
    outcomes = []
    for workers in ("0", "2"):
        done = subprocess.run([sys.executable, "-m", "dpsql", "serve", "--policy", str(policy), "--port", "0",
                               "--workers", workers, "--quiet"], capture_output=True, text=True, timeout=120,
                              check=False)
        outcomes.append((done.returncode, done.stderr.strip().splitlines()[-1]))
        assert "Traceback" not in done.stderr
    assert outcomes[0] == outcomes[1] and outcomes[0][0] != 0 and "visits.csv" in outcomes[0][1]
    assert load_policy(policy)  # the policy itself is fine: the error was the load's
