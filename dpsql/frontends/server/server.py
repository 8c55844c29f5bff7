"""`dpsql serve`: the PostgreSQL wire protocol in front of private sessions, on asyncio.

The server serves many clients. Each connection logs in with SCRAM-SHA-256 as an analyst the steward registered
(users.py) and gets its own PrivateSession, so every statement goes through the same pipeline, charges and
refusals as the DB-API's. Where the sessions live (ServerConfig.workers): in worker processes, each with its own
sandboxed engine on the data, an analyst's sessions all in one of them (workers.py), so that the queries' Python
work uses every core; or (workers = 0) in this process, over one engine loaded once. The connection asks its
session the same way in both cases (analyst.py).

Concurrency: the event loop only frames messages. A query runs in a query thread (which, with workers, sends it
to the analyst's worker and waits) when the scheduler gives it a turn (scheduler.py): several at once (each on an
engine cursor of its own, engines/cursors.py), shared by analyst in turn, a few per analyst at most; queries of
public tables only and catalog queries, which cost nothing, take turns of their own, one per analyst, so they never
hold a turn a private query needs. A query still waiting for its turn can be cancelled before it is charged; one
already running on the data runs to its end (or the policy's time limit, or a cancel that interrupts it alone); its
charge stands, as with every query that touched the data.
A Describe or an EXPLAIN (the query planned, and dry-run on empty tables: no data) takes a turn of a third kind,
one per analyst, so it never waits for a query on the data. Logins and session commands run unscheduled in threads
of their own.

Back-pressure: a client's answers are written statement by statement, and the next statement waits while the
connection's output buffer is full (the client does not read): a client that sends many statements and reads
nothing holds a bounded buffer, not its answers.

Limits: connections, message size (smaller before login), login time and idle time. A client that breaks the
protocol or a limit gets one FATAL error and loses its own connection; the others are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import functools
import hmac
import itertools
import logging
import os
import secrets
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from dpsql.engines.base import Engine
from dpsql.engines.progress import SILENT, Progress
from dpsql.errors import (
    CannotListen,
    DataError,
    Error,
    ExecutionFailed,
    NotSupportedError,
    ProgrammingError,
    ServerSetupError,
)
from dpsql.frontends.server import protocol as pq
from dpsql.frontends.server import types
from dpsql.frontends.server.analyst import AnalystSession, LocalSession
from dpsql.frontends.server.catalog import Catalog, CatalogStatement, ConnectionFacts, CursorFacts
from dpsql.frontends.server.commands import Answer, Context, LocalCommand, Settings, version_text
from dpsql.frontends.server.copy import CopyStatement, copy_rows
from dpsql.frontends.server.cursors import Close, Cursors, Declare, Fetch
from dpsql.frontends.server.parameters import dummy_value, parameter_types
from dpsql.frontends.server.router import Explain, Private, Route, query_route, route
from dpsql.frontends.server.scheduler import FairScheduler
from dpsql.frontends.server.scram import ScramError, ScramExchange, end_point_hash
from dpsql.frontends.server.statements import split_statements
from dpsql.frontends.server.users import UserStore, users_path
from dpsql.frontends.server.workers import WorkerPool
from dpsql.policy import Policy
from dpsql.session import PrivateSession, build_engine, measurement_store
from dpsql.sql.parse import TextParameter
from dpsql.store.answers import AnswerStore
from dpsql.store.ledger import BudgetLedger
from dpsql.store.measurements import MeasurementStore

log = logging.getLogger("dpsql.server")
T = TypeVar("T")

_LOGIN_MESSAGE_LIMIT = 10_000  # before login only small messages are read (SASL), whatever max_message says
_EXPLAIN_COLUMNS = (("QUERY PLAN", "VARCHAR"),)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 5433
    tls: Tls | None = None
    require_tls: bool = False
    max_connections: int = 64
    max_message: int = pq.DEFAULT_MAX_MESSAGE
    login_timeout: float = 30.0  # seconds from connect to logged in
    idle_timeout: float = 3600.0  # seconds a logged-in client may send nothing; 0: no limit
    query_slots: int = 0  # queries on the data at once; 0: two per core
    analyst_queries: int = 2  # of them, one analyst's at most
    output_buffer: int = 256 * 1024  # bytes of answers held for a client before its next statement waits
    # Worker processes holding the analysts' sessions (workers.py); 0: the sessions run in the server's own process
    # (one engine, one core for the queries' Python work). The CLI's default is one per core.
    workers: int = 0


@dataclass(frozen=True)
class Tls:
    context: ssl.SSLContext
    end_point: bytes | None  # the certificate's tls-server-end-point hash: SCRAM-SHA-256-PLUS is offered if known


def load_tls(cert: Path, key: Path) -> Tls:
    """The server's TLS context from its PEM certificate and key; ServerSetupError naming the file if either cannot
    be used."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
        pem = Path(cert).read_text()  # the first certificate in the file is the server's own
        start = pem.index("-----BEGIN CERTIFICATE-----")
        end = pem.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
        der = ssl.PEM_cert_to_DER_cert(pem[start:end])
    except ssl.SSLError:
        raise ServerSetupError(f"cannot use the TLS certificate {cert} with the key {key}: they are not a PEM "
                               "certificate and the private key that belongs to it") from None
    except (OSError, ValueError) as exc:
        problem = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else "no PEM certificate in it"
        raise ServerSetupError(f"cannot use the TLS certificate {cert}: {problem}") from None
    return Tls(context, end_point_hash(der))


class WireError(Exception):
    """An error the server itself raises (not the pipeline): a SQLSTATE and a message."""

    def __init__(self, sqlstate: str, message: str, severity: str = "ERROR") -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.severity = severity


class _Closed(Exception):
    """The connection is over: the client said Terminate, or a FATAL error was sent."""


def _costs(settings: Settings) -> dict[str, Any]:
    """What the connection's settings ask of each query's plan. A quantile's interval is measured (a quarter of its
    epsilon) only when dpsql.intervals shows it."""
    return {"epsilon": settings.epsilon, "accuracy": settings.accuracy, "quantile_intervals": settings.intervals}


class DpsqlServer:
    """The listening server. `await start()`, then `await serve_forever()` or `await close()`."""

    def __init__(self, policy: Policy, config: ServerConfig, *, engine: Engine | None = None,
                 session_factory: Callable[..., PrivateSession] = PrivateSession, progress: Progress = SILENT) -> None:
        self.policy = policy
        self.progress = progress  # the loading's, on the steward's stderr; nothing of it ever reaches a client
        self.config = config
        self.engine = engine
        self._owns_engine = engine is None
        self._session_factory = session_factory
        self._users_path = users_path(policy)
        self._users: UserStore | None = None
        self._users_stamp: tuple[int, int] | None = None
        self._connections: dict[int, Connection] = {}
        self._tasks: set[asyncio.Task] = set()
        self._ids = itertools.count(secrets.randbelow(1 << 20) + 1000)
        self._server: asyncio.Server | None = None
        # Queries run when the scheduler says (free ones in turns of their own) in the query threads; logins,
        # session commands and Describes in threads of their own: one per connection at most, so none waits.
        cores = os.cpu_count() or 1
        slots = config.query_slots or 2 * cores
        self.queries = FairScheduler(slots, min(config.analyst_queries, slots))
        self.free_queries = FairScheduler(cores, 1)
        # A Describe or an EXPLAIN plans the query (and dry-runs it on empty tables): free, bounded work, one per
        # analyst at a time, in turns of its own, so it never waits for a query on the data.
        self.plans = FairScheduler(cores, 1)
        self.executor = ThreadPoolExecutor(max_workers=slots + 2 * cores, thread_name_prefix="dpsql-query")
        self.control = ThreadPoolExecutor(max_workers=config.max_connections + 2, thread_name_prefix="dpsql-control")
        # Catalog queries: PostgreSQL's catalog generated from the policy, in a database of its own, never the engine.
        self.catalog = Catalog(policy, version_text())
        self.started = datetime.datetime.now(datetime.UTC)
        # Answers already released, shared by every connection: a dashboard refreshing pays once (store/answers.py).
        self.answers: AnswerStore | None = None
        # Measurements already released, shared by every connection's session (each analyst reads their own unless
        # the policy shares them): later answers derive from them (store/measurements.py).
        self.measurements: MeasurementStore | None = None
        # With workers: the processes the sessions live in (each its own engine and stores); self.engine stays None.
        self.workers: WorkerPool | None = None
        self._threads = slots + 2 * cores + config.max_connections + 2  # calls a worker may get at once

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        # Fail at start, not at the first login, if the users file or the ledger is missing or broken.
        self.users()
        BudgetLedger(self.policy.budget.ledger, self.policy.budget).close()
        if self.policy.answers is not None and self.answers is None:
            self.answers = AnswerStore(self.policy.answers)
        if self.engine is None and self._use_workers():
            self._can_listen()
            await asyncio.get_running_loop().run_in_executor(self.control, self._start_workers)
        elif self.engine is None:
            self._can_listen()  # before a load that may take minutes, not after it
            self.engine = await asyncio.get_running_loop().run_in_executor(
                self.control, functools.partial(build_engine, self.policy, progress=self.progress))
        if self.measurements is None and self.engine is not None:
            self.measurements = measurement_store(self.policy, self.engine)
        try:
            self._server = await asyncio.start_server(self._accept, self.config.host, self.config.port,
                                                      limit=self.config.max_message + 1024)
        except OSError as exc:
            if self.workers is not None:  # taken since the early check: the workers go, as the server does
                await asyncio.get_running_loop().run_in_executor(None, self.workers.close)
                self.workers = None
            raise CannotListen(f"cannot listen on {self.config.host}:{self.config.port}: {_listen_problem(exc)}") \
                from None
        log.info("dpsql server listening on %s:%s", self.config.host, self.port)

    def _use_workers(self) -> bool:
        """Workers unless asked for none, or the engine is Spark's (a cluster of its own: one session serves)."""
        return self.config.workers > 0 and self.policy.engine.kind != "spark"

    def _start_workers(self) -> None:
        """The workers, each loading the data. A prepared store is built (or checked) here first, with the steward's
        progress, so that the workers only attach it read-only; a load error is raised here either way, as the
        same error the server's own load gives."""
        if self.policy.store is not None:
            build_engine(self.policy, progress=self.progress).close()
        self.workers = WorkerPool(self.policy, self.config.workers, self._threads)
        self.workers.start()

    def session(self, user: str, database: str) -> AnalystSession:
        """A private session for a connection of `user`'s: in their worker, or in this process."""
        if self.workers is not None:
            return self.workers.session(user, database)
        return LocalSession(self._session_factory(self.policy, user, engine=self.engine, answers=self.answers,
                                                  measurements=self.measurements, database=database))

    def _can_listen(self) -> None:
        """CannotListen now if the address cannot be bound (in use, no privilege, unknown host): the socket is let
        go at once, and binding it for real may still fail, which start() reports the same way."""
        host, port = self.config.host, self.config.port
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                      flags=socket.AI_PASSIVE):
                with socket.socket(family, kind, proto) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
                    probe.bind(address)
        except OSError as exc:
            raise CannotListen(f"cannot listen on {host}:{port}: {_listen_problem(exc)}") from None

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
        await asyncio.get_running_loop().run_in_executor(None, self.control.shutdown)
        if self.workers is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.workers.close)
        if self._owns_engine and self.engine is not None:
            self.engine.close()
        self.catalog.close()
        if self.answers is not None:
            self.answers.close()
        if self.measurements is not None:
            self.measurements.close()

    def users(self) -> UserStore:
        """The users file, read again when it changed, so `dpsql user add` takes effect without a restart."""
        stat = self._users_path.stat() if self._users_path.exists() else None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat else None
        if self._users is None or stamp != self._users_stamp:
            self._users = UserStore.load(self._users_path, create=True) if stamp is None else \
                UserStore.load(self._users_path)
            self._users_stamp = stamp
        return self._users

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        connection = Connection(self, reader, writer, next(self._ids) & 0x7FFFFFFF, secrets.randbits(32))
        full = len(self._connections) >= self.config.max_connections
        self._connections[connection.process_id] = connection
        try:
            await connection.run(refuse=full)
        finally:
            self._connections.pop(connection.process_id, None)
            self._tasks.discard(task)

    def cancel(self, process_id: int, secret: int) -> None:
        connection = self._connections.get(process_id)
        if connection is not None and hmac.compare_digest(struct.pack("!I", connection.secret),
                                                          struct.pack("!I", secret)):
            connection.cancel()


@dataclass
class Statement:
    """A parsed (extended protocol) statement: its text, where it goes, and its parameters' types."""

    sql: str
    declared: list[int]  # the OIDs the client gave (0: unspecified)
    reported: list[int]  # the OIDs the server reports: declared, else inferred
    route: Route


@dataclass
class Portal:
    statement: Statement
    parameters: list[Any]
    result_formats: list[int]
    answer: Answer | None = None
    sent: int = 0


@dataclass
class _State:
    transaction: bytes = b"I"
    skipping: bool = False  # after an error in the extended protocol: discard messages until Sync
    statements: dict[str, Statement] = field(default_factory=dict)
    portals: dict[str, Portal] = field(default_factory=dict)
    cursors: Cursors = field(default_factory=Cursors)


class Connection:
    def __init__(self, server: DpsqlServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 process_id: int, secret: int) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.process_id = process_id
        self.secret = secret
        self.user = ""
        self.database = ""
        self.session: AnalystSession | None = None
        self.settings: Settings | None = None
        self.state = _State()
        self._tls = False
        self._busy = False
        self._cancelled = asyncio.Event()
        self._worker: int | None = None  # the thread its query runs in (planning, charging or on the data)
        # Held while that thread leaves the query and while a cancel interrupts it: the query threads are shared, so
        # a cancel must not reach the next connection's query the thread runs.
        self._worker_lock = threading.Lock()
        self._interrupted = False  # a cancel interrupted its query on the data

    # ---- lifecycle -------------------------------------------------------------------------------------------

    async def run(self, *, refuse: bool = False) -> None:
        try:
            logged_in = await asyncio.wait_for(self._login(refuse), self.server.config.login_timeout)
            if logged_in:
                await self._serve()
        except pq.ProtocolViolation as exc:
            await self._fatal(exc.sqlstate, f"protocol violation: {exc}")
        except TimeoutError:
            await self._fatal("08006" if self.session is None else "57P05",
                              "login timed out" if self.session is None else
                              "terminating connection due to idle-session timeout")
        except (WireError, Error) as exc:
            await self._fatal(exc.sqlstate, str(exc))
        except (_Closed, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            await self._fatal("57P01", "terminating connection due to administrator command")
        except Exception:  # a bug: log it, tell the client as little as possible
            log.exception("connection %s failed", self.process_id)
            await self._fatal("XX000", "internal error in the dpsql server")
        finally:
            await self._close()

    async def _close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            # Even when the server shuts down (this task cancelled), the close runs to its end in its thread, and
            # the executor's shutdown waits for it.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._in_thread(session.close)
        with contextlib.suppress(Exception):
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 5)

    async def _fatal(self, sqlstate: str, text: str) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(pq.error_response("FATAL", sqlstate, text))
            await asyncio.wait_for(self.writer.drain(), 5)

    def cancel(self) -> None:
        """A CancelRequest for this connection. A query still waiting for the engine stops before it is charged; one
        that holds the engine is interrupted if it is running on the data (charged already: the charge stands);
        otherwise (no query, or one still being planned) the request is ignored, as PostgreSQL does."""
        if self._busy:
            self._cancelled.set()
        with self._worker_lock:
            worker, session = self._worker, self.session
            if worker is not None and session is not None:
                self._interrupted = True
                session.interrupt(worker)  # its own query only (in its worker process, if there)
                self.server.catalog.interrupt(worker)

    # ---- login -----------------------------------------------------------------------------------------------

    async def _login(self, refuse: bool) -> bool:
        while True:
            code, rest = await pq.read_startup(self.reader)
            if code == pq.CANCEL_REQUEST:
                if len(rest) == 8:
                    self.server.cancel(*struct.unpack("!iI", rest))
                return False
            if refuse:
                raise WireError("53300", "sorry, too many clients already", "FATAL")
            if code == pq.SSL_REQUEST and not self._tls:
                if self.server.config.tls is None:
                    self.writer.write(b"N")
                    continue
                self.writer.write(b"S")
                await self.writer.drain()
                # Bytes sent after SSLRequest but before the handshake would be read as if they had come over
                # TLS (CVE-2021-23214): refuse them. (StreamReader has no public way to look at its buffer.)
                if getattr(self.reader, "_buffer", b""):
                    raise pq.ProtocolViolation("data after SSLRequest before the TLS handshake")
                await self.writer.start_tls(self.server.config.tls.context)
                self._tls = True
                continue
            if code == pq.GSSENC_REQUEST:
                self.writer.write(b"N")
                continue
            if code >> 16 != 3:
                raise WireError("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                                         "dpsql speaks 3.0", "FATAL")
            break
        startup = pq.startup_parameters(rest)
        unsupported = sorted(name for name in startup if name.startswith("_pq_."))
        if code & 0xFFFF or unsupported:
            self.writer.write(pq.negotiate_protocol_version(0, unsupported))
        user = startup.get("user", "")
        if not user:
            raise WireError("28000", "no user name specified in the startup packet", "FATAL")
        if self.server.config.require_tls and not self._tls:
            raise WireError("28000", "this server accepts TLS connections only (use sslmode=require)", "FATAL")
        await self._authenticate(user)
        self.user = user
        self.database = startup.get("database") or user  # as PostgreSQL: the user's name if none is given
        self.settings = Settings.initial(user, startup)
        self.session = await self._in_thread(self.server.session, user, self.database)
        for name in ("server_version", "server_encoding", "client_encoding", "DateStyle", "IntervalStyle",
                     "TimeZone", "integer_datetimes", "standard_conforming_strings", "application_name",
                     "is_superuser", "session_authorization"):
            self.writer.write(pq.parameter_status(name, self.settings.get(name)))
        self.writer.write(pq.backend_key_data(self.process_id, self.secret))
        self.writer.write(pq.ready_for_query(b"I"))
        self.writer.transport.set_write_buffer_limits(high=self.server.config.output_buffer)
        await self.writer.drain()
        return True

    async def _authenticate(self, user: str) -> None:
        """SCRAM-SHA-256, the same exchange for a known and an unknown name, and the same failure."""
        verifier, known = self.server.users().verifier(user)
        exchange = ScramExchange(verifier, channel_binding=self._binding())
        self.writer.write(pq.authentication(pq.AUTH_SASL, b"".join(pq.cstring(m) for m in exchange.mechanisms)
                                            + b"\0"))
        await self.writer.drain()
        initial = pq.BodyReader(await self._sasl_message())
        mechanism = initial.cstring()
        data = initial.counted()
        if mechanism not in exchange.mechanisms or data is None:
            raise WireError("28000", f"the server offers {', '.join(exchange.mechanisms)} only", "FATAL")
        try:
            first = exchange.server_first(data, mechanism)
        except ScramError as exc:
            raise WireError("08P01", f"malformed SCRAM message: {exc}", "FATAL") from None
        self.writer.write(pq.authentication(pq.AUTH_SASL_CONTINUE, first))
        await self.writer.drain()
        try:
            final = exchange.server_final(await self._sasl_message())
        except ScramError:
            final = None
        if final is None or not known:
            log.info("failed login for %r", user)
            raise WireError("28P01", f'password authentication failed for user "{user}"', "FATAL")
        self.writer.write(pq.authentication(pq.AUTH_SASL_FINAL, final) + pq.authentication(pq.AUTH_OK))

    def _binding(self) -> bytes | None:
        tls = self.server.config.tls
        return tls.end_point if self._tls and tls is not None else None

    async def _sasl_message(self) -> bytes:
        message = await pq.read_message(self.reader, _LOGIN_MESSAGE_LIMIT)
        if message.kind == b"X":
            raise _Closed()
        if message.kind != b"p":
            raise pq.ProtocolViolation(f"expected a SASL response, got message {message.kind!r}")
        return message.body

    # ---- the logged-in loop ----------------------------------------------------------------------------------

    async def _serve(self) -> None:
        idle = self.server.config.idle_timeout or None
        while True:
            message = await asyncio.wait_for(pq.read_message(self.reader, self.server.config.max_message), idle)
            kind = message.kind
            if kind == b"X":
                return
            if kind == b"Q":
                await self._simple_query(message.body)
            elif kind in b"PBDECHS" and len(kind) == 1:
                await self._extended(kind, message.body)
            elif kind == b"F":
                await self._extended_error(WireError("0A000", "function calls are not supported"))
            else:
                raise pq.ProtocolViolation(f"unexpected message type {kind!r}")
            await self.writer.drain()

    def _send(self, data: bytes) -> None:
        self.writer.write(data)

    def _send_error(self, exc: BaseException) -> None:
        if isinstance(exc, Error):
            self._send(pq.error_response("ERROR", exc.sqlstate, str(exc) or type(exc).__name__))
        elif isinstance(exc, WireError):
            self._send(pq.error_response(exc.severity, exc.sqlstate, str(exc)))
        else:  # a bug in the server: its message might say anything, so it goes to the log only
            log.error("statement failed in connection %s", self.process_id, exc_info=exc)
            self._send(pq.error_response("ERROR", "XX000", "internal error in the dpsql server"))

    async def _simple_query(self, body: bytes) -> None:
        reader = pq.BodyReader(body)
        sql = reader.cstring()
        reader.end()
        statements = split_statements(sql)
        if not statements:
            self._send(pq.EMPTY_QUERY)
        for text in statements:
            try:
                answer = await self._answer(self._statement(text, [], infer=False), [])
            except (Error, WireError) as exc:
                self._send_error(exc)
                break
            except Exception as exc:
                self._send_error(exc)
                break
            if answer.copy is not None:
                self._send_copy(answer)
            else:
                if answer.columns:
                    self._send(pq.row_description([types.field(n, t, 0) for n, t in answer.columns]))
                self._send_answer(answer, [0] * len(answer.columns), 0, len(answer.rows))
                self._send(pq.command_complete(answer.tag))
            await self.writer.drain()  # the next statement waits while the client leaves its answers unread
        self._send(pq.ready_for_query(self.state.transaction))

    def _send_copy(self, answer: Answer) -> None:
        """COPY ... TO STDOUT: CopyOutResponse, a CopyData per row (and the format's header and trailer), CopyDone,
        then the command tag; notices first, as for any answer."""
        assert answer.copy is not None
        oids = [types.wire_type(t).oid for _, t in answer.columns]
        if answer.copy.binary:
            _check_binary(answer.columns, [1] * len(answer.columns))
        data = list(copy_rows([n for n, _ in answer.columns], oids, answer.rows, answer.copy))
        for notice in answer.notices:
            self._send(pq.notice_response(notice))
        self._send(pq.copy_out_response(answer.copy.binary, len(answer.columns)))
        for chunk in data:
            self._send(pq.copy_data(chunk))
        self._send(pq.COPY_DONE)
        self._send(pq.command_complete(answer.tag))

    def _send_answer(self, answer: Answer, formats: list[int], start: int, stop: int) -> None:
        oids = [types.wire_type(t).oid for _, t in answer.columns]
        for row in answer.rows[start:stop]:
            self._send(pq.data_row([types.encode_binary(v, oid) if binary else types.encode_text(v)
                                    for v, oid, binary in zip(row, oids, formats, strict=True)]))
        for reported in answer.reported:
            assert self.settings is not None
            self._send(pq.parameter_status(reported, self.settings.get(reported)))
        for notice in answer.notices:
            self._send(pq.notice_response(notice))
        if answer.transaction == "begin":
            self.state.transaction = b"T"
        elif answer.transaction == "end":
            self.state.transaction = b"I"

    # ---- statements ------------------------------------------------------------------------------------------

    def _statement(self, sql: str, declared: list[int], *, infer: bool = True) -> Statement:
        where = route(sql, self.server.catalog)
        if isinstance(where, CatalogStatement):
            # Parameters the client left untyped are text, as PostgreSQL would resolve a name or pattern.
            reported = declared + [types.TEXT_ARRAY if n in where.translated.arrays else types.TEXT
                                   for n in range(len(declared) + 1, where.parameters + 1)]
        else:
            query = _query_of(where)
            reported = parameter_types(query, declared, self.server.policy) if infer and query is not None \
                else declared
        return Statement(sql, declared, reported, where)

    async def _answer(self, statement: Statement, parameters: list[Any]) -> Answer:
        where = statement.route
        if isinstance(where, LocalCommand):
            assert self.session is not None and self.settings is not None
            session = self.session
            if len(parameters) != where.parameters:
                raise ProgrammingError(f"this statement takes {where.parameters or 'no'} parameters, "
                                       f"not {len(parameters)}")
            context = Context(self.settings, self.user, session.spending, database=self.database,
                              parameters=parameters)
            answer = await self._in_thread(where.run, context)
            if answer.transaction == "end":
                self.state.cursors.end_transaction()
            return answer
        if isinstance(where, Fetch):
            return self.state.cursors.fetch(where)
        if isinstance(where, Close):
            return self.state.cursors.close(where)
        if isinstance(where, Declare):
            answer = await self._query_answer(query_route(where.query, self.server.catalog), parameters)
            return self.state.cursors.add(where, answer, self.state.transaction != b"I")
        if isinstance(where, CopyStatement):
            answer = await self._query_answer(query_route(where.query, self.server.catalog), parameters)
            return replace(answer, copy=where.format, tag=f"COPY {len(answer.rows)}")
        if isinstance(where, Explain):
            assert self.session is not None and self.settings is not None
            session, cost, bound = self.session, _costs(self.settings), parameters or None
            text = await self._scheduled(self.server.plans, lambda: session.explain(where.query, bound, cost))
            return Answer(_EXPLAIN_COLUMNS, [(line,) for line in text.splitlines()], "EXPLAIN")
        return await self._query_answer(where, parameters)

    async def _query_answer(self, where: CatalogStatement | Private, parameters: list[Any]) -> Answer:
        """A query's answer: the catalog's, or the private session's (charged there, once)."""
        if isinstance(where, CatalogStatement):
            if len(parameters) != where.parameters:
                raise ProgrammingError(f"this statement takes {where.parameters or 'no'} parameters, "
                                       f"not {len(parameters)}")
            # An untyped parameter arrives as text whose type its place decides: in a catalog query, it is text.
            values = [types.text_array(p.text) if isinstance(p, TextParameter) and i + 1 in where.translated.arrays
                      else p.text if isinstance(p, TextParameter) else p for i, p in enumerate(parameters)]
            facts, catalog = self._facts(), self.server.catalog
            columns, rows = await self._scheduled(self.server.free_queries,
                                                  lambda: catalog.run(where, facts, values))
            return Answer(tuple(columns), rows, f"SELECT {len(rows)}")
        assert self.session is not None and self.settings is not None
        session, settings = self.session, self.settings
        cost, bound = _costs(settings), parameters or None
        # A query of public tables only costs nothing: it takes a free turn, never one a private query needs.
        free = session.known_public_only(where.sql, bound)  # known after a Describe: no thread to wait for
        if free is None:
            free = await self._in_thread(session.reads_public_only, where.sql, bound)
        lane = self.server.free_queries if free else self.server.queries
        return await self._scheduled(lane, lambda: session.answer(where.sql, bound, cost, settings.intervals))

    def _facts(self) -> ConnectionFacts:
        """What the catalog shows of this connection: its login, settings and cursors."""
        assert self.settings is not None
        settings = self.settings
        shown = tuple((spelt, value, "") for spelt, value in sorted(settings.values.values()))
        shown += tuple((name, settings.get(name), "dpsql: see SHOW dpsql.budget")
                       for name in ("dpsql.epsilon", "dpsql.accuracy", "dpsql.intervals"))
        cursors = tuple(CursorFacts(name, c.declared.query, c.declared.hold, c.declared.binary, c.declared.scroll,
                                    c.created) for name, c in self.state.cursors.open.items())
        return ConnectionFacts(self.database, self.user, self.process_id, self.server.started, shown, cursors,
                               _search_path(settings.get("search_path"), self.user),
                               settings.get("application_name"))

    async def _columns(self, statement: Statement, parameters: list[Any] | None) -> tuple[tuple[str, str], ...]:
        """The columns a statement returns, from the dry run only: nothing runs on the data, nothing is charged."""
        where = statement.route
        if isinstance(where, LocalCommand):
            return where.columns
        if isinstance(where, Explain):
            return _EXPLAIN_COLUMNS
        if isinstance(where, Fetch):
            cursor = self.state.cursors.open.get(where.name)
            return cursor.answer.columns if cursor is not None and not where.move else ()
        if isinstance(where, Declare | Close | CopyStatement):
            return ()  # no rows (COPY's travel as CopyData)
        if isinstance(where, CatalogStatement):
            return tuple(await self._in_thread(self.server.catalog.columns, where, self._facts()))
        assert self.session is not None and self.settings is not None
        session, with_ci = self.session, self.settings.intervals
        cost = _costs(self.settings)
        values = parameters if parameters is not None else [dummy_value(oid) for oid in statement.reported]

        # The session's rehearsal finds the output types when it prepares the question (a query of public tables:
        # binding it does): no data, no charge, so no turn of the data's to wait for.
        return await self._scheduled(self.server.plans, lambda: session.columns(where.sql, values or None, cost,
                                                                                with_ci))

    async def _in_thread(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Work that needs no turn (a login, a session command, a Describe), in a thread of the connection's."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.server.control, lambda: work(*args, **kwargs))

    async def _scheduled(self, lane: FairScheduler, work: Callable[[], T]) -> T:
        """Run `work` in a query thread when `lane` gives the analyst a turn. A cancel that arrives while the query
        waits for its turn stops it before anything is charged."""
        self._cancelled.clear()
        self._busy = True
        try:
            acquire = asyncio.ensure_future(lane.acquire(self.user))
            cancelled = asyncio.ensure_future(self._cancelled.wait())
            try:
                await asyncio.wait({acquire, cancelled}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                cancelled.cancel()
                if not acquire.done():
                    acquire.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await acquire
            if not acquire.done() or acquire.cancelled():
                raise WireError("57014", "canceling statement due to user request")
            if self.reader.at_eof():  # the client left while its query waited: do not charge it for nothing
                lane.release(self.user)
                raise WireError("08006", "the client has gone")
            self._interrupted = False

            def in_worker() -> T:
                self._worker = threading.get_ident()
                try:
                    return work()
                finally:
                    with self._worker_lock:
                        self._worker = None
            try:
                return await asyncio.get_running_loop().run_in_executor(self.server.executor, in_worker)
            except Error as exc:
                if not self._interrupted:
                    raise
                # The client's cancel, not the data, stopped it: a free query (public tables, the catalog) cost
                # nothing whatever its error says; a private one that reached the data stays charged.
                if lane is not self.server.queries:
                    raise WireError("57014", "canceling statement due to user request") from None
                if isinstance(exc, ExecutionFailed):
                    raise WireError("57014", "canceling statement due to user request (it had started on the "
                                             "data: its charge stands)") from None
                raise
            finally:
                lane.release(self.user)
        finally:
            self._busy = False

    # ---- the extended protocol -------------------------------------------------------------------------------

    async def _extended(self, kind: bytes, body: bytes) -> None:
        if kind == b"S":
            self.state.skipping = False
            if self.state.transaction == b"I":
                self.state.portals.clear()
            self._send(pq.ready_for_query(self.state.transaction))
            return
        if kind == b"H":
            return  # Flush: the caller drains the writer after every message
        if self.state.skipping:
            return
        try:
            await {b"P": self._parse, b"B": self._bind, b"D": self._describe, b"E": self._execute,
                   b"C": self._close_object}[kind](pq.BodyReader(body))
        except pq.ProtocolViolation:
            raise
        except Exception as exc:
            await self._extended_error(exc)

    async def _extended_error(self, exc: BaseException) -> None:
        self._send_error(exc)
        self.state.skipping = True

    async def _parse(self, fields: pq.BodyReader) -> None:
        name, sql = fields.cstring(), fields.cstring()
        declared = [fields.uint32() for _ in range(fields.int16())]
        fields.end()
        if name and name in self.state.statements:
            raise WireError("42P05", f'prepared statement "{name}" already exists')
        statements = split_statements(sql)
        if len(statements) > 1:
            raise WireError("42601", "cannot insert multiple commands into a prepared statement")
        self.state.statements[name] = self._statement(statements[0] if statements else "", declared)
        self._send(pq.PARSE_COMPLETE)

    async def _bind(self, fields: pq.BodyReader) -> None:
        portal_name, statement_name = fields.cstring(), fields.cstring()
        formats = [fields.int16() for _ in range(fields.int16())]
        values = [fields.counted() for _ in range(fields.int16())]
        result_formats = [fields.int16() for _ in range(fields.int16())]
        fields.end()
        statement = self._find_statement(statement_name)
        if len(values) != len(statement.reported):
            raise WireError("08P01", f"bind message supplies {len(values)} parameters, but prepared statement "
                                       f'"{statement_name}" requires {len(statement.reported)}')
        if len(formats) not in (0, 1, len(values)) or any(f not in (0, 1) for f in formats + result_formats):
            raise WireError("08P01", "invalid format codes in a bind message")
        parameters = []
        for i, value in enumerate(values):
            binary = bool(formats[0] if len(formats) == 1 else formats[i] if formats else 0)
            # Text keeps the client's own type (none: typed by its place in the query); binary is read as the
            # type the client said or the server reported.
            oid = statement.reported[i] if binary else (statement.declared[i] if i < len(statement.declared)
                                                          else 0)
            try:
                parameters.append(types.decode_parameter(value, oid, binary))
            except (DataError, NotSupportedError) as exc:
                raise type(exc)(f"parameter ${i + 1}: {exc}") from None
        if portal_name and portal_name in self.state.portals:
            raise WireError("42P03", f'cursor "{portal_name}" already exists')
        self.state.portals[portal_name] = Portal(statement, parameters, result_formats)
        self._send(pq.BIND_COMPLETE)

    def _find_statement(self, name: str) -> Statement:
        statement = self.state.statements.get(name)
        if statement is None:
            raise WireError("26000", f'prepared statement "{name}" does not exist')
        return statement

    def _find_portal(self, name: str) -> Portal:
        portal = self.state.portals.get(name)
        if portal is None:
            raise WireError("34000", f'portal "{name}" does not exist')
        return portal

    async def _describe(self, fields: pq.BodyReader) -> None:
        what, name = fields.byte(), fields.cstring()
        fields.end()
        if what == b"S":
            statement = self._find_statement(name)
            columns = await self._columns(statement, None) if statement.sql.strip() else ()
            self._send(pq.parameter_description(statement.reported))
            formats = [0] * len(columns)
        elif what == b"P" and name not in self.state.portals and name in self.state.cursors.open:
            # A cursor is a portal too (psycopg describes a named cursor so): its answer's columns.
            columns = self.state.cursors.open[name].answer.columns
            formats = [0] * len(columns)
        elif what == b"P":
            portal = self._find_portal(name)
            columns = await self._columns(portal.statement, portal.parameters) if portal.statement.sql.strip() \
                else ()
            formats = _formats(portal.result_formats, len(columns))
            _check_binary(columns, formats)
        else:
            raise pq.ProtocolViolation(f"invalid Describe target {what!r}")
        self._send(pq.row_description([types.field(n, t, f) for (n, t), f in zip(columns, formats, strict=True)])
                   if columns else pq.NO_DATA)

    async def _execute(self, fields: pq.BodyReader) -> None:
        name, limit = fields.cstring(), fields.int32()
        fields.end()
        portal = self._find_portal(name)
        if not portal.statement.sql.strip():
            self._send(pq.EMPTY_QUERY)
            return
        if portal.answer is None:  # the first Execute runs (and charges) the query; later ones page through it
            portal.answer = await self._answer(portal.statement, portal.parameters)
        answer = portal.answer
        if answer.copy is not None:
            self._send_copy(answer)
            return
        formats = _formats(portal.result_formats, len(answer.columns))
        _check_binary(answer.columns, formats)
        stop = len(answer.rows) if limit <= 0 else min(len(answer.rows), portal.sent + limit)
        first = portal.sent == 0  # notices, parameter changes and the transaction state: once per answer
        self._send_answer(answer if first else replace(answer, notices=(), reported=(), transaction=None),
                          formats, portal.sent, stop)
        portal.sent = stop
        if stop < len(answer.rows):
            self._send(pq.PORTAL_SUSPENDED)
        else:
            self._send(pq.command_complete(answer.tag))

    async def _close_object(self, fields: pq.BodyReader) -> None:
        what, name = fields.byte(), fields.cstring()
        fields.end()
        if what == b"S":
            self.state.statements.pop(name, None)
        elif what == b"P":
            self.state.portals.pop(name, None)
        else:
            raise pq.ProtocolViolation(f"invalid Close target {what!r}")
        self._send(pq.CLOSE_COMPLETE)


def _query_of(where: Route) -> str | None:
    """The query whose parameters a statement takes, if any."""
    if isinstance(where, Private):
        return where.sql
    if isinstance(where, Explain):
        return where.query
    if isinstance(where, Declare | CopyStatement):
        return where.query
    return None


def _search_path(setting: str, user: str) -> tuple[str, ...]:
    """The schemas of a search_path setting that exist ("$user" is the user's schema: there is none)."""
    existing = ("public", "pg_catalog", "information_schema")
    names = [part.strip().strip('"') for part in setting.split(",")]
    return tuple(name for name in names if name in existing and name != "pg_catalog") or ("public",)


def _listen_problem(exc: OSError) -> str:
    """Why the server cannot listen, and what to change, in words."""
    if isinstance(exc, socket.gaierror):
        return "no such host: choose another --host"
    if exc.errno == errno.EADDRINUSE:
        return "the port is already in use (another server listens on it): stop it or choose another --port"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges): choose another --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address: choose another --host"
    return (exc.strerror or "the system refused").lower()


def _formats(codes: list[int], count: int) -> list[int]:
    if not codes:
        return [0] * count
    if len(codes) == 1:
        return codes * count
    if len(codes) != count:
        raise WireError("08P01", f"{len(codes)} result format codes for {count} columns")
    return codes


def _check_binary(columns: tuple[tuple[str, str], ...], formats: list[int]) -> None:
    for (name, kind), binary in zip(columns, formats, strict=True):
        if binary and not types.binary_supported(types.wire_type(kind).oid):
            raise NotSupportedError(f"binary output of column {name!r} ({kind}) is not supported: ask for text")
