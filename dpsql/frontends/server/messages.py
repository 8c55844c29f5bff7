"""The messages between the server and its worker processes (workers.py), one frozen dataclass per kind, sent
pickled over a pipe. Pickle keeps every value an answer may hold as it is (Decimal, date, datetime with its zone,
-0.0, NaN, UUID, lists and structs): an answer crosses the pipe unchanged.

Server to worker: Start once, then Open, Call, CloseSession, Interrupt, Stop. Worker to server: Ready or
LoadFailed once (its load), then a Reply or a Failure per request. An error crosses as its dpsql class's name
and its message, and is raised again as the same class on the server's side (`raised`): the client gets the same
SQLSTATE and words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql import errors
from dpsql.policy import Policy


@dataclass(frozen=True)
class Start:
    """The worker's first message: the policy whose data it loads, and how many requests it may run at once."""

    policy: Policy
    threads: int


@dataclass(frozen=True)
class SessionRequest:
    """A request about the session the server numbered `session`; its reply names `request`."""

    request: int
    session: int


@dataclass(frozen=True)
class Open(SessionRequest):
    """Open a private session for `analyst` (as connected to `database`), known from now on as `session`."""

    analyst: str
    database: str


@dataclass(frozen=True)
class Call(SessionRequest):
    """Call a method of LocalSession (analyst.py) on the session."""

    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class CloseSession(SessionRequest):
    """Close the session (its ledger connection, its post-processing database)."""


@dataclass(frozen=True)
class Interrupt:
    """Stop the query on the data that request `request` runs (a CancelRequest); nothing if it is not on the data."""

    request: int


@dataclass(frozen=True)
class Stop:
    """Finish the requests under way, close every session and the engine, and exit."""


@dataclass(frozen=True)
class Ready:
    pid: int


@dataclass(frozen=True)
class ErrorText:
    """A dpsql error as it crosses the pipe: its class's name in dpsql.errors ("" for a bug) and its message."""

    kind: str
    message: str


@dataclass(frozen=True)
class LoadFailed:
    error: ErrorText


@dataclass(frozen=True)
class Reply:
    """Request `request` done: what the call returned."""

    request: int
    value: Any


@dataclass(frozen=True)
class Failure:
    """Request `request` failed: its error."""

    request: int
    error: ErrorText


class WorkerFailed(errors.InternalError):
    """A bug in a worker process (logged there, with its traceback): the client learns as little as of any bug."""

    sqlstate = "XX000"


class WorkerStopped(errors.OperationalError):
    """The worker process running the query stopped (killed, or crashed) before it answered; it is restarted."""

    sqlstate = "57P02"  # crash_shutdown: what PostgreSQL's other backends report when one of them crashes


def error_text(exc: BaseException) -> ErrorText:
    """What crosses the pipe of an exception: a dpsql error's class and message; of anything else, nothing (a bug:
    its message might say anything, so the worker logs it and the server says only that it happened)."""
    if isinstance(exc, WorkerStopped):
        return ErrorText("WorkerStopped", str(exc))
    if isinstance(exc, errors.Error):  # a subclass of another layer's (a rejection) as its class in dpsql.errors
        kind = next(c for c in type(exc).__mro__ if getattr(errors, c.__name__, None) is c)
        return ErrorText(kind.__name__, str(exc))
    return ErrorText("", "internal error in a dpsql worker process")


def raised(error: ErrorText) -> errors.Error:
    """The exception to raise on the server's side: the worker's dpsql error, its class and message unchanged."""
    kind = WorkerStopped if error.kind == "WorkerStopped" else getattr(errors, error.kind, None) if error.kind \
        else None
    if not (isinstance(kind, type) and issubclass(kind, errors.Error)):
        return WorkerFailed(error.message)
    exc = kind.__new__(kind)
    Exception.__init__(exc, error.message)  # whatever the class's own __init__ takes: the message as it was
    return exc
