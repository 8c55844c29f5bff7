"""The server's defences: no query before login, names that cannot be probed, TLS when required, and limits that
close only the offending connection."""

from __future__ import annotations

import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pg8000.native
import psycopg
import pytest

from benchmarks.support import RunningServer
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import ExecutionFailed
from dpsql.frontends.server.server import ServerConfig, load_tls
from dpsql.policy import load_policy
from tests.server.conftest import (
    PASSWORDS,
    RawClient,
    charges,
    dsn,
    error_fields,
    hold_engine,
    sample_policy,
    start_server,
)


def _login_error(served, user: str, password: str) -> dict[str, str]:
    """The server's error fields, as pg8000 reports them (libpq gives no SQLSTATE for a failed connection)."""
    with pytest.raises(pg8000.native.DatabaseError) as caught:
        pg8000.native.Connection(user, host="127.0.0.1", port=served.port, password=password)
    return caught.value.args[0]


def test_wrong_password_and_unknown_user_fail_alike(served) -> None:
    wrong = _login_error(served, "alice", "not the password")
    unknown = _login_error(served, "mallory", "not the password")
    assert wrong["C"] == unknown["C"] == "28P01"
    assert {**wrong, "M": wrong["M"].replace("alice", "NAME")} == {**unknown,
                                                                    "M": unknown["M"].replace("mallory", "NAME")}
    with pytest.raises(psycopg.OperationalError, match='password authentication failed for user "mallory"'):
        psycopg.connect(dsn(served, "mallory"))


def test_an_unknown_name_gets_a_stable_salt_like_a_real_user(served) -> None:
    def first(user: str) -> dict[str, str]:
        client = RawClient(served.port)
        try:
            return dict(part.split("=", 1) for part in client.server_first(user).split(","))
        finally:
            client.close()

    real, fake, fake_again = first("alice"), first("mallory"), first("mallory")
    assert fake["s"] == fake_again["s"] != real["s"]
    assert len(fake["s"]) == len(real["s"]) and fake["i"] == real["i"] == "4096"
    assert fake["r"].startswith("clientnonce123") and fake["r"] != fake_again["r"]


def test_raw_login_and_query(served) -> None:
    client = RawClient(served.port)
    try:
        messages = client.login("alice", PASSWORDS["alice"])
        assert [kind for kind, _ in messages][-2:] == [b"K", b"Z"]
        client.send(b"Q", b"SHOW dpsql.epsilon\0")
        assert [kind for kind, _ in client.until(b"Z")] == [b"T", b"D", b"C", b"Z"]
    finally:
        client.close()


def test_no_query_before_authentication(served) -> None:
    before = len(charges(served.policy))
    client = RawClient(served.port)
    try:
        client.startup("alice")
        assert client.receive()[0] == b"R"  # asked for SASL
        client.send(b"Q", b"SELECT COUNT(*) FROM visits\0")
        kind, body = client.receive()
        assert kind == b"E" and error_fields(body)["S"] == "FATAL" and error_fields(body)["C"] == "08P01"
        assert client.receive() is None
    finally:
        client.close()
    assert len(charges(served.policy)) == before


@pytest.mark.parametrize("attack", ["oversized", "truncated", "unknown type"])
def test_a_bad_message_closes_only_its_connection(served, attack: str) -> None:
    with psycopg.connect(dsn(served, "bob"), autocommit=True) as other:
        client = RawClient(served.port)
        try:
            client.login("alice", PASSWORDS["alice"])
            if attack == "oversized":
                client.sock.sendall(b"Q" + struct.pack("!i", (2 << 20) + 4) + b"SELECT")
            elif attack == "truncated":
                client.send(b"B", b"\0\0" + struct.pack("!h", 5))  # five format codes announced, none sent
            else:
                client.send(b"?", b"")
            kind, body = client.receive()
            assert kind == b"E" and error_fields(body)["C"] == "08P01" and error_fields(body)["S"] == "FATAL"
            assert client.receive() is None
        finally:
            client.close()
        assert other.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0
    with psycopg.connect(dsn(served)) as again:
        assert again.execute("SHOW TimeZone").fetchone() == ("UTC",)


def test_the_extended_protocol_skips_to_sync_after_an_error(served) -> None:
    client = RawClient(served.port)
    try:
        client.login("alice", PASSWORDS["alice"])
        client.send(b"P", b"\0SELECT * FROM visits\0\0\0")
        client.send(b"B", b"\0\0\0\0\0\0\0\0")
        client.send(b"E", b"\0\0\0\0\0")
        client.send(b"S", b"")
        kinds = [kind for kind, _ in client.until(b"Z")]
        assert kinds == [b"1", b"2", b"E", b"Z"]  # Parse and Bind fine, Execute refused, then only ReadyForQuery
        client.send(b"Q", b"SELECT 1\0")
        assert [kind for kind, _ in client.until(b"Z")] == [b"T", b"D", b"C", b"Z"]
    finally:
        client.close()


def test_too_many_connections(tmp_path: Path) -> None:
    running = start_server(sample_policy(tmp_path), max_connections=1)
    try:
        with psycopg.connect(dsn(running)), pytest.raises(psycopg.OperationalError, match="too many clients"):
            psycopg.connect(dsn(running, "bob"))
        while running.server._connections:  # the server frees the slot once it has seen the client go
            threading.Event().wait(0.01)
        with psycopg.connect(dsn(running, "bob")) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        running.stop()


def test_a_silent_client_is_dropped_at_the_login_timeout(tmp_path: Path) -> None:
    running = start_server(sample_policy(tmp_path), login_timeout=0.2)
    client = RawClient(running.port)
    try:
        kind, body = client.receive()  # sends nothing; the server gives up
        assert kind == b"E" and error_fields(body)["C"] == "08006"
        assert client.receive() is None
    finally:
        client.close()
        running.stop()


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed to make a test certificate")
def test_tls_required(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    running = start_server(sample_policy(tmp_path / "policy"), tls=load_tls(cert, key), require_tls=True)
    try:
        with psycopg.connect(dsn(running, sslmode="require", channel_binding="require")) as conn:
            assert conn.pgconn.ssl_in_use  # and SCRAM-SHA-256-PLUS, bound to the certificate
            assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0
        with pytest.raises(psycopg.OperationalError, match="accepts TLS connections only"):
            psycopg.connect(dsn(running, sslmode="disable"))
        # a wrong password over TLS fails as it does in the clear
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn(running, sslmode="require", password="nope"))
    finally:
        running.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed to make a test certificate")
def test_tls_offered_but_not_required(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    running = start_server(sample_policy(tmp_path / "policy"), tls=load_tls(cert, key))
    try:
        with psycopg.connect(dsn(running, sslmode="prefer")) as conn:
            assert conn.pgconn.ssl_in_use
        with psycopg.connect(dsn(running, sslmode="disable")) as conn:
            assert not conn.pgconn.ssl_in_use
    finally:
        running.stop()


def test_without_a_certificate_tls_is_declined(served) -> None:
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn(served, sslmode="require"))
    with psycopg.connect(dsn(served, sslmode="prefer")) as conn:
        assert not conn.pgconn.ssl_in_use


def test_an_idle_client_is_dropped_at_the_idle_timeout(tmp_path: Path) -> None:
    running = start_server(sample_policy(tmp_path), idle_timeout=0.2)
    client = RawClient(running.port)
    try:
        client.login("alice", PASSWORDS["alice"])
        kind, body = client.receive()  # says nothing after logging in
        assert kind == b"E" and error_fields(body)["C"] == "57P05"
        assert client.receive() is None
    finally:
        client.close()
        running.stop()


def test_a_busy_engine_does_not_stop_other_clients(served) -> None:
    """While a query holds the engine, other analysts still log in, set and show things without waiting."""
    release = hold_engine(served)
    try:
        with psycopg.connect(dsn(served, "bob"), autocommit=True) as conn:
            conn.execute("SET application_name = 'while busy'")
            assert conn.execute("SHOW dpsql.budget").fetchone()[0] == "bob"
    finally:
        release()


def _wait_until(condition) -> None:
    while not condition():
        threading.Event().wait(0.01)


@pytest.mark.parametrize("leaves_early", [True, False])
def test_a_client_gone_before_its_turn_is_not_charged_and_one_killed_after_is_once(served, leaves_early) -> None:
    before = len(charges(served.policy))
    release = hold_engine(served)
    client = RawClient(served.port)
    try:
        client.login("alice", PASSWORDS["alice"])
        connection = max(served.server._connections.values(), key=lambda c: c.process_id)
        # A question nobody asked before here: an answer already released would come from the cache, uncharged.
        client.send(b"Q", f"SELECT COUNT(*) FROM visits WHERE age > {40 + leaves_early}\0".encode())
        _wait_until(lambda: connection._busy)
        if leaves_early:
            client.close()
            _wait_until(connection.reader.at_eof)
    finally:
        release()
    if not leaves_early:
        _wait_until(lambda: len(charges(served.policy)) == before + 1)
        client.close()  # killed once its query runs: the charge stands, once
    _wait_until(lambda: connection.process_id not in served.server._connections)
    assert len(charges(served.policy)) == before + (0 if leaves_early else 1)
    with psycopg.connect(dsn(served)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0] > 0


class _HeldEngine(DuckDBEngine):
    """The real engine, whose queries on the data wait until interrupted and then fail as DuckDB's would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.running = threading.Event()
        self.interrupted = threading.Event()

    def run(self, sql: str):
        self.running.set()
        self.interrupted.wait()
        raise ExecutionFailed()

    def interrupt(self, owner: int | None = None) -> None:
        if self.running.is_set():
            self.interrupted.set()


def test_a_cancel_interrupts_a_query_running_on_the_data_and_its_charge_stands(tmp_path: Path) -> None:
    policy = sample_policy(tmp_path)
    engine = _HeldEngine(load_policy(policy))
    running = RunningServer(policy, ServerConfig(port=0), engine=engine).start()
    try:
        with psycopg.connect(dsn(running), autocommit=True) as conn:
            before = len(charges(policy))
            outcome: list = []

            def ask() -> None:
                try:
                    conn.execute("SELECT COUNT(*) FROM visits WHERE age > 10")
                except psycopg.Error as exc:
                    outcome.append(exc)
            thread = threading.Thread(target=ask)
            thread.start()
            engine.running.wait()
            conn.cancel_safe()  # the non-blocking cancel: the blocking one holds the GIL the server needs
            thread.join()
            assert len(outcome) == 1 and outcome[0].sqlstate == "57014"
            assert "its charge stands" in str(outcome[0])
            assert len(charges(policy)) == before + 1
    finally:
        running.stop()
        engine.close()
