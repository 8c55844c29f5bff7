"""The server under load (issue 31): analysts' queries run at the same time, a fair share each, and nothing that
costs nothing (a catalog query, a query of public tables, answers left unread) can stall another analyst.

No test here has a wall-clock limit: each asserts an order (the victim's answer arrives before the attacker's work
ends) or a count. A stalled server makes a test fail, not time out: the attacker's work is bounded by the
policy's time limit (a catalog query's by the catalog's own), after which the order is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from pathlib import Path

import psycopg
import pytest

from benchmarks.support import RunningServer
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.frontends.server.server import ServerConfig
from dpsql.policy import load_policy
from tests.server.conftest import PASSWORDS, RawClient, Tally, charges, dsn, ledger_of, sample_policy

# A catalog query that runs until the catalog's time limit stops it (no table function the checker refuses).
CATALOG_CROSS_JOIN = "SELECT count(*) FROM pg_catalog.pg_class a, generate_series(1, 100000000000) r"
CATALOG_RANGE = "SELECT count(*) FROM pg_catalog.pg_class a, range(100000000000) r"
# A query of public tables only, free, that runs until the policy's time limit: departments^12 is 7e10 rows.
PUBLIC_CROSS_JOIN = "SELECT count(*) FROM " + ", ".join(f"departments d{i}" for i in range(12))
PRIVATE = "SELECT COUNT(*) FROM visits WHERE age > {}"


def _policy(folder: Path, time_limit: float = 10.0) -> Path:
    """The sample policy with a short time limit (an attacker's free query ends there, before or after the victim's)
    and a total budget that 65 queries of epsilon 1 do not exhaust."""
    policy = sample_policy(folder)
    text = policy.read_text()
    assert "\nepsilon = 50.0 " in text
    policy.write_text(text.replace("\nepsilon = 50.0 ", "\nepsilon = 500.0 ", 1)
                      + f"\n[engine]\ntime_limit_seconds = {time_limit}\n")
    return policy


class _Order:
    """Who finished, in the order they did."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done: list[str] = []

    def add(self, name: str) -> None:
        with self._lock:
            self.done.append(name)

    def now(self) -> list[str]:
        with self._lock:
            return list(self.done)


def _answer_of(client: RawClient, order: _Order, name: str) -> threading.Thread:
    """Read `client`'s answer in a thread of its own, then say `name` is done."""
    def read() -> None:
        with contextlib.suppress(OSError):
            client.until(b"Z")
        order.add(name)
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _ahead_of_bob(readers: list[threading.Thread], order: _Order) -> int:
    """Once alice's 64 answers and bob's one are read: how many of hers came before his."""
    for reader in readers:
        reader.join()
    done = order.now()
    assert len(done) == 65
    return done.index("bob")


def _key(messages: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """The BackendKeyData of a login: what a CancelRequest names."""
    body = next(body for kind, body in messages if kind == b"K")
    return struct.unpack("!iI", body)


def _cancel(port: int, key: tuple[int, int]) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(struct.pack("!iiiI", 16, 80877102, *key))


def _query(client: RawClient, sql: str) -> None:
    client.send(b"Q", sql.encode() + b"\0")


@pytest.mark.slow  # waits out the catalog's 5 s limit twice
def test_catalog_queries_running_to_their_limit_do_not_freeze_the_server(tmp_path: Path) -> None:
    """Six catalog cross joins of one analyst, each running until the catalog's time limit, once froze the server:
    they took every worker thread, so no one could log in or ask anything until they ended. Another analyst now
    logs in and is answered while they still run."""
    running = RunningServer(_policy(tmp_path), ServerConfig(port=0)).start()
    order = _Order()
    attackers = [RawClient(running.port) for _ in range(6)]
    try:
        for attacker in attackers:
            attacker.login("bob", PASSWORDS["bob"])
        for attacker in attackers:
            _query(attacker, CATALOG_CROSS_JOIN)
        readers = [_answer_of(attacker, order, "attacker") for attacker in attackers]
        with psycopg.connect(dsn(running, "alice"), autocommit=True) as conn:
            assert conn.execute(PRIVATE.format(41)).fetchone()[0] is not None
            assert conn.execute("SELECT count(*) FROM pg_catalog.pg_namespace").fetchone()[0] > 0
            # The red team's own query: `range` is no row function of the catalog's, and the private pipeline
            # refuses table functions, from the text, at no cost.
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(CATALOG_RANGE)
            assert refused.value.sqlstate == "0A000"
        assert order.now() == [], "the victim was answered only after an attacker's catalog query had ended"
    finally:
        for attacker in attackers:
            attacker.close()
        running.stop()
    for reader in readers:
        reader.join()


@pytest.mark.slow  # waits out a free query's time limit
def test_a_free_query_of_public_tables_does_not_hold_what_private_queries_need(tmp_path: Path) -> None:
    """A query of public tables costs nothing: it held the engine's one slot until the time limit, and a victim's
    private query waited that long, repeatably and for free. The victim is now answered while it runs, and a
    cancel stops it."""
    running = RunningServer(_policy(tmp_path), ServerConfig(port=0)).start()
    order = _Order()
    attacker = RawClient(running.port)
    try:
        key = _key(attacker.login("bob", PASSWORDS["bob"]))
        _query(attacker, PUBLIC_CROSS_JOIN)
        reader = _answer_of(attacker, order, "attacker")
        with psycopg.connect(dsn(running, "alice"), autocommit=True) as conn:
            assert conn.execute(PRIVATE.format(42)).fetchone()[0] is not None
        assert order.now() == [], "the victim's private query waited for the attacker's free query to end"
        _cancel(running.port, key)
        reader.join()
    finally:
        attacker.close()
        running.stop()


class _CountingEngine(DuckDBEngine):
    """The real engine, counting the queries of public tables it runs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.public_runs = 0

    def run_public(self, sql: str, released=()):
        self.public_runs += 1
        return super().run_public(sql, released)


def test_describing_a_query_of_public_tables_does_not_run_it(tmp_path: Path) -> None:
    """A Describe needs no turn, so it must do no query's work: the free cross join is bound for its columns, not
    run (it ran to the time limit, outside every turn)."""
    policy = _policy(tmp_path)
    engine = _CountingEngine(load_policy(policy))
    running = RunningServer(policy, ServerConfig(port=0), engine=engine).start()
    client = RawClient(running.port)
    try:
        client.login("bob", PASSWORDS["bob"])
        client.send(b"P", b"\0" + PUBLIC_CROSS_JOIN.encode() + b"\0" + struct.pack("!h", 0))
        client.send(b"D", b"S\0")
        client.send(b"S", b"")
        messages = client.until(b"Z")
        assert [kind for kind, _ in messages] == [b"1", b"t", b"T", b"Z"]
        assert engine.public_runs == 0
    finally:
        client.close()
        running.stop()
        engine.close()


def test_answers_left_unread_are_not_buffered_without_bound(tmp_path: Path, monkeypatch) -> None:
    """One message of 10,000 free `SHOW ALL` statements from a client that reads nothing: the server answered them
    all into memory (9 MB; 116,000 of them grew it by 110 MB) before it waited for the client once. It now waits
    as soon as the connection's buffer is full, holding little, and the other clients are answered meanwhile."""
    blocked = threading.Event()
    buffered: list[int] = []
    original = asyncio.StreamWriter.drain
    watched: list[tuple[str, int]] = []

    async def drain(writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        if watched and writer.get_extra_info("peername") == watched[0]:
            size, (_, high) = transport.get_write_buffer_size(), transport.get_write_buffer_limits()
            if size > high and not blocked.is_set():  # this drain waits for the client: it reads nothing
                buffered.append(size)
                blocked.set()
        await original(writer)

    monkeypatch.setattr(asyncio.StreamWriter, "drain", drain)
    running = RunningServer(_policy(tmp_path), ServerConfig(port=0)).start()
    attacker = RawClient(running.port)
    try:
        attacker.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        attacker.login("bob", PASSWORDS["bob"])
        watched.append(attacker.sock.getsockname())
        _query(attacker, "SHOW ALL;" * 10_000)
        blocked.wait()
        assert buffered[0] <= 1 << 20, f"the server held {buffered[0]} bytes of unread answers"
        with psycopg.connect(dsn(running, "alice"), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute(PRIVATE.format(43)).fetchone()[0] is not None
    finally:
        attacker.close()
        running.stop()


class _GatedEngine(DuckDBEngine):
    """The real engine, whose queries on the data wait at a gate the test opens (or, as the time limit would stop
    them, until the policy's time limit), counting how many wait at once and how many went through."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.changed = threading.Condition()
        self.waiting = 0
        self.most = 0
        self.passed = 0

    def run(self, sql: str):
        with self.changed:
            self.waiting += 1
            self.most = max(self.most, self.waiting)
            self.changed.notify_all()
        try:
            self.gate.wait(self.time_limit)
            return super().run(sql)
        finally:
            with self.changed:
                self.waiting -= 1
                self.passed += 1
                self.changed.notify_all()

    def wait_for(self, count: int) -> None:
        """Until `count` queries wait at the gate at once, or one went through (its time was up)."""
        with self.changed:
            self.changed.wait_for(lambda: self.waiting >= count or self.passed)


def _gated(tmp_path: Path) -> tuple[RunningServer, _GatedEngine, Path]:
    policy = _policy(tmp_path)
    engine = _GatedEngine(load_policy(policy))
    return RunningServer(policy, ServerConfig(port=0, max_connections=100), engine=engine).start(), engine, policy


def test_queries_of_different_analysts_run_on_the_data_at_the_same_time(tmp_path: Path) -> None:
    running, engine, _ = _gated(tmp_path)
    order = _Order()
    clients = [RawClient(running.port) for _ in range(2)]
    try:
        for client, user in zip(clients, ("alice", "bob"), strict=True):
            client.login(user, PASSWORDS[user])
        for number, client in enumerate(clients):
            _query(client, PRIVATE.format(50 + number))
        readers = [_answer_of(client, order, "answered") for client in clients]
        engine.wait_for(2)
        assert engine.most == 2, "the second query reached the data only once the first had left it"
        engine.gate.set()
        for reader in readers:
            reader.join()
        assert order.now() == ["answered", "answered"]
    finally:
        engine.gate.set()
        for client in clients:
            client.close()
        running.stop()
        engine.close()


def test_one_analysts_flood_does_not_starve_another(tmp_path: Path) -> None:
    """Alice sends 64 queries at once; Bob's one query, sent after them, is answered after at most a few of hers
    (those already running), not after all 64: the engine is shared by analyst, in turn, not by arrival. And no
    analyst has more than a few queries on the data at a time."""
    running, engine, policy = _gated(tmp_path)
    order = _Order()
    flood = [RawClient(running.port) for _ in range(64)]
    victim = RawClient(running.port)
    try:
        for client in flood:
            client.login("alice", PASSWORDS["alice"])
        victim.login("bob", PASSWORDS["bob"])
        for number, client in enumerate(flood):
            _query(client, PRIVATE.format(100 + number))
        readers = [_answer_of(client, order, "alice") for client in flood]
        engine.wait_for(1)
        _query(victim, PRIVATE.format(99))
        readers.append(_answer_of(victim, order, "bob"))
        engine.gate.set()
        ahead = _ahead_of_bob(readers, order)
        assert ahead <= 4, f"bob's query was answered after {ahead} of alice's 64"
        assert engine.most <= 4, f"{engine.most} queries were on the data at once"
        assert len(charges(policy)) == 65
    finally:
        engine.gate.set()
        for client in [*flood, victim]:
            client.close()
        running.stop()
        engine.close()


def test_describe_does_not_wait_for_another_query_on_the_data(tmp_path: Path) -> None:
    """A driver's Describe (Parse, Describe, Sync) needs no data: it is answered while another analyst's query holds
    the data, not after it."""
    running, engine, _ = _gated(tmp_path)
    order = _Order()
    holder = RawClient(running.port)
    describer = RawClient(running.port)
    try:
        holder.login("alice", PASSWORDS["alice"])
        describer.login("bob", PASSWORDS["bob"])
        _query(holder, PRIVATE.format(60))
        reader = _answer_of(holder, order, "holder")
        engine.wait_for(1)
        sql = b"SELECT department, COUNT(*) FROM visits WHERE age > $1 GROUP BY department\0"
        describer.send(b"P", b"\0" + sql + struct.pack("!h", 0))
        describer.send(b"D", b"S\0")
        describer.send(b"S", b"")
        messages = describer.until(b"Z")
        assert [kind for kind, _ in messages] == [b"1", b"t", b"T", b"Z"]
        assert order.now() == []
        engine.gate.set()
        reader.join()
    finally:
        engine.gate.set()
        holder.close()
        describer.close()
        running.stop()
        engine.close()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2: worker processes
def test_the_ledger_stays_exact_under_concurrent_load(tmp_path: Path, workers: int) -> None:
    """Three analysts, four connections each, asking at once until carol's budget (1.5) and more runs out: every
    answer was charged once, no refused query was, and no budget was overspent; in the server's process, and with
    the analysts' sessions in two worker processes, each charging the one ledger."""
    policy = sample_policy(tmp_path)
    running = RunningServer(policy, ServerConfig(port=0, workers=workers)).start()
    tally = Tally(["alice", "bob", "carol"])
    threads = [threading.Thread(target=tally.ask, args=(running, user, [PRIVATE.format(1000 * (10 * k + i) + n)
                                                                        for n in range(8)], {"53000"}))
               for k, user in enumerate(tally.answered) for i in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        running.stop()
    with ledger_of(policy) as ledger:
        history = ledger.history()
        for user, answered in tally.answered.items():
            mine = [c for c in history if c.analyst == user]
            assert len(mine) == answered
            assert float(sum(c.epsilon for c in mine)) == ledger.spending(user).epsilon_spent
        carol = ledger.spending("carol")
    # 1.5 / 0.25: six answers, the rest refused
    assert tally.answered["carol"] == 6 and tally.refused["carol"] == {"53000": 26}
    assert carol.epsilon_spent <= 1.5
    assert tally.answered["alice"] == tally.answered["bob"] == 32

