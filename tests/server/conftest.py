"""The server in-process, on a free port, over a temporary copy of the sample policy with its own ledger and users.

`RawClient` speaks the protocol byte by byte (its own SCRAM client), for what drivers never send: oversized and
malformed messages, queries before login, a look at the SCRAM exchange of an unknown name.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psycopg
import pytest

from benchmarks.support import RunningServer, start_server
from dpsql.frontends.server.users import UserStore, users_path
from dpsql.policy import load_policy
from dpsql.store.ledger import BudgetLedger
from tests.conftest import SAMPLE, copy_visits_data, create_ledger

PASSWORDS = {"alice": "correct horse", "bob": "battery staple", "carol": "tiny budget"}


def sample_policy(folder: Path) -> Path:
    """The sample visits policy in `folder`, with a fresh ledger, carol on a budget of 1.5, and three users."""
    folder.mkdir(parents=True, exist_ok=True)
    copy_visits_data(folder)
    text = (SAMPLE / "visits.toml").read_text() + "\n[budget.analysts.carol]\nepsilon = 1.5\n"
    policy = folder / "visits.toml"
    policy.write_text(text)
    create_ledger(policy)
    store = UserStore.load(users_path(load_policy(policy)), create=True)
    for name, password in PASSWORDS.items():
        store.add(name, password)
    store.save()
    return policy


@contextlib.contextmanager
def ledger_of(policy: Path) -> Iterator[BudgetLedger]:
    """The policy's ledger, open for the block."""
    loaded = load_policy(policy)
    ledger = BudgetLedger(loaded.budget.ledger, loaded.budget)
    try:
        yield ledger
    finally:
        ledger.close()


def charges(policy: Path) -> list:
    with ledger_of(policy) as ledger:
        return ledger.history()


@pytest.fixture(scope="module", params=[0, pytest.param(2, marks=pytest.mark.slow)], ids=["in-process", "workers"])
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The server on the sample: its sessions in its own process, and (slow: it starts processes) in two worker
    processes, so that every client's and driver's test also runs through the workers' pipes."""
    running = start_server(sample_policy(tmp_path_factory.mktemp("server")), workers=request.param)
    try:
        yield running
    finally:
        running.stop()


def hold_engine(running: RunningServer) -> Callable[[], None]:
    """Every turn of the server's query scheduler held (by other analysts' queries, as it were) until the function
    returned is called."""
    scheduler = running.server.queries
    holders = [f"holder{i}" for i in range(scheduler.slots)]
    for holder in holders:
        running.call(scheduler.acquire(holder))

    def release() -> None:
        for holder in holders:
            running.loop.call_soon_threadsafe(scheduler.release, holder)
    return release


def dsn(running: RunningServer, user: str = "alice", **extra: str) -> str:
    options = {"host": "127.0.0.1", "port": str(running.port), "user": user, "dbname": "visits",
               "password": PASSWORDS.get(user, "whatever"), "sslmode": "disable", **extra}
    return " ".join(f"{k}='{v}'" for k, v in options.items())


class RawClient:
    """A protocol-level client: frames messages and logs in with its own SCRAM-SHA-256."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))

    def close(self) -> None:
        self.sock.close()

    def send(self, kind: bytes, body: bytes) -> None:
        self.sock.sendall(kind + struct.pack("!i", len(body) + 4) + body)

    def startup(self, user: str) -> None:
        body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0visits\0\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)

    def receive(self) -> tuple[bytes, bytes] | None:
        """The next message, or None if the server closed the connection."""
        header = self._exactly(5)
        if header is None:
            return None
        length = struct.unpack("!i", header[1:])[0]
        body = self._exactly(length - 4)
        return None if body is None else (header[:1], body)

    def _exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def until(self, kind: bytes) -> list[tuple[bytes, bytes]]:
        seen = []
        while True:
            message = self.receive()
            if message is None:
                return seen
            seen.append(message)
            if message[0] in (kind, b"E") and (message[0] == kind or b"SFATAL" in message[1]):
                return seen

    def server_first(self, user: str, nonce: str = "clientnonce123") -> str:
        """Start a SCRAM login and return the server-first message."""
        self.startup(user)
        kind, body = self.receive()
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 10
        self._client_first_bare = f"n=,r={nonce}"
        first = f"n,,{self._client_first_bare}".encode()
        self.send(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first)
        kind, body = self.receive()
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 11
        return body[4:].decode()

    def login(self, user: str, password: str) -> list[tuple[bytes, bytes]]:
        server_first = self.server_first(user)
        attributes = dict(part.split("=", 1) for part in server_first.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attributes["s"]),
                                     int(attributes["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        without_proof = f"c=biws,r={attributes['r']}"
        auth = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
        self.send(b"p", f"{without_proof},p={proof}".encode())
        return self.until(b"Z")


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.rstrip(b"\0").split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


def url(running: RunningServer, scheme: str = "postgresql", user: str = "alice") -> str:
    """A connection URL (SQLAlchemy, connectorx, ADBC): the password percent-encoded."""
    password = PASSWORDS[user].replace(" ", "%20")
    return f"{scheme}://{user}:{password}@127.0.0.1:{running.port}/visits"


class Tally:
    """Answers and refusals (by SQLSTATE) per analyst, counted from many client threads at once."""

    def __init__(self, users: Sequence[str]) -> None:
        self.answered: Counter[str] = Counter(dict.fromkeys(users, 0))
        self.refused: dict[str, Counter[str]] = {user: Counter() for user in users}
        self._lock = threading.Lock()

    def ask(self, running: RunningServer, user: str, queries: Sequence[str], refusals: set[str],
            start: threading.Barrier | None = None) -> None:
        """On a connection of `user`'s at epsilon 0.25, each query in turn (after `start`, if given), counting
        answers and the refusals whose SQLSTATE is in `refusals` (any other fails the test)."""
        with psycopg.connect(dsn(running, user), autocommit=True) as conn:
            conn.execute("SET dpsql.epsilon = 0.25")
            if start is not None:
                start.wait()
            for sql in queries:
                try:
                    conn.execute(sql).fetchall()
                except psycopg.Error as exc:
                    assert exc.sqlstate in refusals, exc
                    with self._lock:
                        self.refused[user][exc.sqlstate] += 1
                else:
                    with self._lock:
                        self.answered[user] += 1
