"""A PEP 249 (DB-API 2.0) interface over a private session.

    import dpsql
    con = dpsql.connect(policy="sample_data/visits.toml", analyst="alice", epsilon=0.5)
    cur = con.cursor()
    cur.execute("SELECT region, COUNT(*) FROM visits GROUP BY region")
    cur.fetchall()        # noisy rows
    cur.intervals         # per row and column, the 95% interval of each noisy cell (None elsewhere)

Every `execute` is a private query: it is charged before it runs, and the charge is final (commit and rollback
do nothing; nothing is ever written to the data). Extensions to PEP 249: `execute(..., epsilon=...)` or
`execute(..., accuracy=...)`,
`Cursor.intervals`, `Cursor.noise_std`, `Cursor.cost`, `Cursor.result`, `Cursor.messages` (PEP 249's optional
extension: a `NoRowsReleased` warning when a grouped answer has no rows), `Connection.explain`,
`Connection.budget`, `Connection.history`.
"""

from __future__ import annotations

import datetime
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpsql import errors
from dpsql.dp.noise import RandomSource
from dpsql.errors import (  # PEP 249's exceptions are module attributes (SQLAlchemy's dialect reads them here)
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)
from dpsql.frontends.explain import explain
from dpsql.frontends.format import why_no_rows
from dpsql.planning.plan import Cost
from dpsql.session import PrivateResult, PrivateSession
from dpsql.store.ledger import Charge, Spending

apilevel = "2.0"
threadsafety = 1  # threads may share the module, not connections
paramstyle = "qmark"  # ? placeholders; :name and $1 are accepted as well


class DBAPITypeObject:
    """PEP 249 type objects: compare equal to every DuckDB type name of their kind."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other.split("(")[0].upper() in self.names
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.names)


STRING = DBAPITypeObject("VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR")
BINARY = DBAPITypeObject("BLOB", "BYTEA", "VARBINARY")
NUMBER = DBAPITypeObject("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "DOUBLE", "FLOAT", "REAL",
                         "DECIMAL", "UBIGINT", "UINTEGER", "BOOLEAN")
DATETIME = DBAPITypeObject("DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "INTERVAL")
ROWID = DBAPITypeObject()

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime


def DateFromTicks(ticks: float) -> datetime.date:
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:
    return Timestamp(*time.localtime(ticks)[:6])


def Binary(value: bytes) -> bytes:
    return bytes(value)


def connect(policy: str | Path, analyst: str | None = None, epsilon: float | None = None, *,
            rng: RandomSource | None = None, bounding_seed: int | None = None,
            threads: int | None = None, create_ledger: bool = False, quantile_intervals: bool = True,
            reuse: bool = True) -> Connection:
    """Open a private connection: load the policy's tables into a sandboxed engine and open the ledger.

    `epsilon` is the default cost of each query (else the policy's query_epsilon). `create_ledger` makes the
    budget ledger if it does not exist yet: the steward's first start, never a way round a deleted ledger.
    `quantile_intervals=False` gives each quantile's (MEDIAN, QUANTILE_CONT, MIN, MAX) whole epsilon to its value
    and leaves its cell without an interval (cursor.intervals None); by default a quarter measures the interval.
    `reuse` derives answers from measurements already released where that costs less (the policy's [reuse]
    measurements store; docs/explanation/reuse.md); False measures every answer on its own.
    `rng` and `bounding_seed` are for tests and benchmarks only: production noise comes from the operating
    system's secure generator.
    """
    session = PrivateSession(policy, analyst, epsilon=epsilon, rng=rng, bounding_seed=bounding_seed,
                             threads=threads, create_ledger=create_ledger, quantile_intervals=quantile_intervals,
                             reuse=reuse)
    return Connection(session)


class Connection:
    Error = errors.Error
    Warning = errors.Warning
    InterfaceError = errors.InterfaceError
    DatabaseError = errors.DatabaseError
    DataError = errors.DataError
    OperationalError = errors.OperationalError
    IntegrityError = errors.IntegrityError
    InternalError = errors.InternalError
    ProgrammingError = errors.ProgrammingError
    NotSupportedError = errors.NotSupportedError

    def __init__(self, session: PrivateSession) -> None:
        self._session: PrivateSession | None = session
        self._lock = threading.Lock()

    @property
    def session(self) -> PrivateSession:
        if self._session is None:
            raise InterfaceError("the connection is closed")
        return self._session

    @property
    def analyst(self) -> str:
        return self.session.analyst

    def cursor(self) -> Cursor:
        return Cursor(self)

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None

    def commit(self) -> None:
        """Nothing to commit: dpsql never writes to the data, and each charge is committed as the query runs."""
        self.session  # noqa: B018 - raises on a closed connection

    def rollback(self) -> None:
        """Nothing to roll back: queries are read-only and a charge, once an answer exists, is final."""
        self.session  # noqa: B018

    def explain(self, operation: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, accuracy: float | None = None) -> str:
        """What the query would run and cost (with `accuracy`: the epsilon it would charge for it), without running
        it or spending budget."""
        return explain(self.session.plan_for(operation, parameters, epsilon=epsilon, accuracy=accuracy),
                       listed=self.session.engine.lists_earlier_rows)

    def budget(self, analyst: str | None = None, *, everyone: bool = False) -> Spending:
        """Spent and remaining budget: this connection's analyst's, or with `everyone` the totals of all analysts.

        Another analyst's own figures are theirs: how much and how often they ask is not for other analysts."""
        self._only_own(analyst)
        return self.session.spending(None if everyone else self.analyst)

    def history(self, analyst: str | None = None) -> list[Charge]:
        """This connection's analyst's charges, oldest first. Other analysts' queries are never shown: their
        texts (and the parameters written into them) are theirs."""
        self._only_own(analyst)
        return self.session.history(self.analyst)

    def _only_own(self, analyst: str | None) -> None:
        if analyst is not None and analyst != self.analyst:
            raise ProgrammingError(f"an analyst sees only their own charges and the totals, not {analyst!r}'s")

    def _execute(self, operation: str, parameters: Any, epsilon: float | None,
                 accuracy: float | None = None) -> PrivateResult:
        with self._lock:
            return self.session.execute(operation, parameters, epsilon=epsilon, accuracy=accuracy)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Cursor:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self._result: PrivateResult | None = None
        self._position = 0
        self._closed = False
        # PEP 249's optional extension: (class, instance) of each warning about the last query, cleared by execute.
        self.messages: list[tuple[type[errors.Warning], errors.Warning]] = []

    @property
    def description(self) -> list[tuple[Any, ...]] | None:
        if self._result is None:
            return None
        return [(c.name, c.type, None, None, None, None, True) for c in self._result.columns]

    @property
    def rowcount(self) -> int:
        return len(self._result.rows) if self._result is not None else -1

    @property
    def result(self) -> PrivateResult | None:
        """The whole private result of the last query: rows, intervals, noise, cost, plan."""
        return self._result

    @property
    def intervals(self) -> list[tuple[tuple[float, float] | None, ...]]:
        """Per row and column, the 95% interval of each noisy cell (None for a group key)."""
        return self._require_result().intervals

    @property
    def noise_std(self) -> list[tuple[float | None, ...]]:
        """Per row and column, the standard deviation of a noisy aggregate's noise (None elsewhere)."""
        return self._require_result().noise_std

    @property
    def cost(self) -> Cost:
        return self._require_result().cost

    def execute(self, operation: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, accuracy: float | None = None) -> Cursor:
        """Run a private query at `epsilon` (default: the connection's), or at the smallest epsilon that gives every
        released cell a 95% interval within +/- `accuracy` (COUNT and SUM outputs; see docs/how-to/accuracy.md).

        A grouped answer without rows (charged all the same) says why: a `NoRowsReleased` warning, issued with
        `warnings.warn` (shown by default, filtered like any Python warning) and listed in `messages`."""
        self._check_open()
        self._result = None
        self.messages.clear()
        self._result = self.connection._execute(operation, parameters, epsilon, accuracy)
        self._position = 0
        reason = why_no_rows(self._result)
        if reason is not None:  # after the result is kept: a warnings filter set to "error" must not lose it
            warning = errors.NoRowsReleased(reason)
            self.messages.append((errors.NoRowsReleased, warning))
            warnings.warn(warning, stacklevel=2)
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Sequence[Any] | Mapping[str, Any]], *,
                    epsilon: float | None = None, accuracy: float | None = None) -> Cursor:
        """Run the query once per parameter set; each run is a separate private query, charged separately."""
        for parameters in seq_of_parameters:
            self.execute(operation, parameters, epsilon=epsilon, accuracy=accuracy)
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._require_result().rows
        if self._position >= len(rows):
            return None
        self._position += 1
        return rows[self._position - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        size = self.arraysize if size is None else size
        rows = self._require_result().rows[self._position:self._position + size]
        self._position += len(rows)
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._require_result().rows[self._position:]
        self._position += len(rows)
        return rows

    def close(self) -> None:
        self._closed = True
        self._result = None

    def setinputsizes(self, sizes: Any) -> None:
        """PEP 249: may do nothing."""

    def setoutputsize(self, size: int, column: int | None = None) -> None:
        """PEP 249: may do nothing."""

    def nextset(self) -> None:
        raise NotSupportedError("a private query returns one result set")

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection.session  # noqa: B018 - raises on a closed connection

    def _require_result(self) -> PrivateResult:
        self._check_open()
        if self._result is None:
            raise ProgrammingError("no query has been run on this cursor")
        return self._result


__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor", "DataError", "DatabaseError",
    "Date", "DateFromTicks", "Error", "IntegrityError", "InterfaceError", "InternalError", "NotSupportedError",
    "OperationalError", "ProgrammingError", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning",
    "apilevel", "connect", "paramstyle", "threadsafety",
]
