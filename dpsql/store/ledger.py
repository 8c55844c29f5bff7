"""The budget ledger: every answered query's cost, persisted before the answer is released.

A SQLite file (by default beside the policy). A charge is one `BEGIN IMMEDIATE` transaction: it takes the write
lock, sums what was spent, refuses if the query would overspend the total or the analyst's share, and commits
the charge, all decided before the query touches the data. SQLite's locking makes this safe across processes; its
journal makes a killed process leave either the whole charge or none of it. The commit, whose fsync is most of a
charge's time, may run while the query reads the data (`begin_charge`): the answer waits for it. Costs are stored
as exact rationals ("1/10"), so ten queries of 0.1 spend exactly 1.

Accounting is fixed when a ledger is created: "pure" sums (epsilon, delta); "zcdp" sums rho (= epsilon^2/2 per
query) and converts it to (epsilon, delta) with epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke 2016),
half of the policy's delta going to that conversion and half to partition selection.
"""

from __future__ import annotations

import _thread
import contextlib
import datetime
import functools
import math
import os
import sqlite3
import threading
import weakref
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import ClassVar

from dpsql.errors import BudgetExhausted, LedgerError
from dpsql.planning.plan import Cost
from dpsql.policy import Accounting, BudgetPolicy

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    analyst TEXT NOT NULL,
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    rho TEXT NOT NULL,
    query TEXT NOT NULL,
    note TEXT  -- how the answer was had: "derived from released measurements, no charge", a reduced charge
);
CREATE TABLE IF NOT EXISTS totals (
    scope TEXT PRIMARY KEY,  -- '*' for everyone, else the analyst's name
    epsilon TEXT NOT NULL,
    delta TEXT NOT NULL,
    rho TEXT NOT NULL,
    queries INTEGER NOT NULL
);
"""
_EVERYONE = "*"


@dataclass(frozen=True)
class Charge:
    id: int
    at: str
    analyst: str
    epsilon: Fraction
    delta: Fraction
    rho: Fraction
    query: str
    note: str | None = None  # how the answer was had, when released measurements helped (planning/reuse.py)


@dataclass(frozen=True)
class Spending:
    """Spent and remaining, for everyone or for one analyst, in (epsilon, delta) terms."""

    accounting: Accounting
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float
    queries: int
    # For one analyst: what is left of everyone's budget. Their share may have more left than the whole budget
    # (others spent it), and they can spend only what both allow.
    everyone_remaining: float | None = None

    @property
    def epsilon_remaining(self) -> float:
        """What this scope can still spend: for an analyst, the smaller of their share's rest and the total's."""
        own = max(0.0, self.epsilon_total - self.epsilon_spent)
        return own if self.everyone_remaining is None else min(own, self.everyone_remaining)


def exact(value: float | int | str | Fraction) -> Fraction:
    """The rational a user meant: 0.1 is 1/10, not the binary float nearest to it."""
    if isinstance(value, Fraction):
        return value
    return Fraction(repr(float(value))) if isinstance(value, float) else Fraction(str(value))


@functools.lru_cache(maxsize=64)  # a pure function of the policy's budgets, asked at every charge
def rho_budget(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon, rounded down.

    sqrt(rho) = sqrt(L + e) - sqrt(L) with L = ln(1/delta), written as e / (sqrt(L + e) + sqrt(L)): the difference
    of two nearly equal roots loses about log10(L/e) digits (3e-6 relative at e = 1e-9), the sum loses none, so
    the final 1e-12 shrink covers the rounding that is left.
    """
    log = -math.log(float(delta))
    e = float(epsilon)
    root = e / (math.sqrt(log + e) + math.sqrt(log))
    return Fraction(root * root * (1 - 1e-12))


def epsilon_of_rho(rho: Fraction, delta: Fraction) -> float:
    return float(rho) + 2 * math.sqrt(float(rho) * math.log(1 / float(delta)))


@dataclass(frozen=True)
class _Total:
    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)
    rho: Fraction = Fraction(0)
    queries: int = 0

    def plus(self, cost: Cost) -> _Total:
        return self.add(cost.epsilon, cost.delta, cost.rho)

    def add(self, epsilon: Fraction, delta: Fraction, rho: Fraction) -> _Total:
        """The total after one more charge of this epsilon, delta and rho."""
        return _Total(self.epsilon + epsilon, self.delta + delta, self.rho + rho, self.queries + 1)


class PendingCharge:
    """A charge written to the ledger whose commit may still be running (BudgetLedger.begin_charge)."""

    def __init__(self, spending: Spending, charge: int | None = None) -> None:
        self.spending = spending  # the analyst's budget once this charge is counted
        self.charge = charge  # the ledger entry's id
        self._error: LedgerError | None = None
        self._done = threading.Lock()  # held until the commit has finished, well or not
        self._done.acquire()

    def _finish(self, error: LedgerError | None) -> None:
        self._error = error
        self._done.release()

    def wait(self) -> Spending:
        """Return once the charge is on disk; LedgerError if it could not be committed (then it was not charged)."""
        with self._done:  # taken and given back: waiting twice is fine
            pass
        if self._error is not None:
            raise self._error
        return self.spending


class BudgetLedger:
    """One process's handle on a ledger file, shared safely with every other process that opens it."""

    _instances: ClassVar[weakref.WeakSet[BudgetLedger]] = weakref.WeakSet()

    def __init__(self, path: Path, budget: BudgetPolicy, *, create: bool = False) -> None:
        """Open the ledger at `path`. Only with `create` is a missing ledger made: a ledger that has gone missing
        is refused, never taken for a fresh budget. Creating one is the steward's step (`dpsql budget --init`)."""
        self.path = path
        self.budget = budget
        self._lock = threading.Lock()
        BudgetLedger._instances.add(self)
        self._con: sqlite3.Connection | None = None
        self._identity: tuple[int, int, int] | None = None
        self._limit_cache: dict[str | None, tuple[Fraction, Fraction]] = {}
        if not path.parent.is_dir():
            raise LedgerError(f"budget ledger {path}: the folder {path.parent} does not exist; refusing to answer "
                              "without a ledger")
        if not path.exists():
            if not create:
                raise LedgerError(f"no budget ledger at {path}: the steward creates it once with `dpsql budget "
                                  "--init --policy POLICY`; a missing ledger is never taken for a fresh budget")
            self._create()
        with self._lock:
            stored = self._read(lambda con: con.execute("SELECT value FROM meta WHERE key = 'accounting'")
                                .fetchone())
            self._add_notes()
        if stored is None or stored[0] != budget.accounting.value:
            raise LedgerError(f"budget ledger {path} was started with {stored[0] if stored else 'no'} accounting, but "
                              f"the policy now says {budget.accounting.value}: use a new ledger")

    def _add_notes(self) -> None:
        """A ledger made before charges had notes gets the column (NULL for its charges)."""
        def columns(con: sqlite3.Connection) -> set[str]:
            return {row[1] for row in con.execute("PRAGMA table_info(charges)")}
        found = self._read(columns)
        if found and "note" not in found:  # (no table at all: not a ledger, which the accounting check says)
            try:
                self._connection().execute("ALTER TABLE charges ADD COLUMN note TEXT")
            except sqlite3.Error as exc:
                if "duplicate column" not in str(exc):  # another process added it first
                    raise LedgerError(f"budget ledger {self.path}: cannot be updated ({exc})") from None

    @classmethod
    def _after_fork_in_child(cls) -> None:
        """A forked child gets a fresh lock: the parent's may be held by a commit whose thread the child lacks (its
        connection is reopened anyway: `_connection` compares the process id)."""
        for ledger in list(cls._instances):
            ledger._lock = threading.Lock()

    def _create(self) -> None:
        """The only place a ledger file is created: afterwards a missing file is an error, never a fresh budget.

        The ledger is built complete (schema, accounting, WAL mode) in a private temporary file and then linked
        into place, which fails if another process got there first: nobody ever sees a half-made ledger.
        """
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.new")
        try:
            con = sqlite3.connect(temporary, isolation_level=None)
            try:
                con.execute("PRAGMA journal_mode = WAL")
                con.executescript(_SCHEMA)
                con.execute("INSERT INTO meta VALUES ('accounting', ?)", (self.budget.accounting.value,))
            finally:
                con.close()  # the last connection checkpoints the WAL into the file
            with contextlib.suppress(FileExistsError):
                os.link(temporary, self.path)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot be created ({exc}); refusing to answer") from None
        finally:
            for leftover in (temporary, temporary.with_name(temporary.name + "-wal"),
                             temporary.with_name(temporary.name + "-shm")):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _connection(self) -> sqlite3.Connection:
        """The open connection, reopened if the file was replaced or this is a forked child process."""
        try:
            stat = os.stat(self.path)
        except OSError:
            self._close()
            raise LedgerError(f"budget ledger {self.path} has disappeared; refusing to answer") from None
        identity = (stat.st_dev, stat.st_ino, os.getpid())
        if self._con is None or identity != self._identity:
            self._close()
            try:
                con = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=60, isolation_level=None,
                                      check_same_thread=False)
                if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":  # made in WAL mode
                    con.execute("PRAGMA journal_mode = WAL")
                con.execute("PRAGMA synchronous = FULL")  # a charge is on disk before its answer is released
            except sqlite3.Error as exc:
                raise LedgerError(f"budget ledger {self.path}: cannot be opened ({exc}); refusing to answer") from None
            self._con, self._identity = con, identity
        return self._con

    def _close(self) -> None:
        if self._con is not None:
            with contextlib.suppress(sqlite3.Error):
                self._con.close()
            self._con = None

    def close(self) -> None:
        with self._lock:
            self._close()

    def _read(self, work):
        try:
            return work(self._connection())
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot be read ({exc}); refusing to answer") from None

    def charge(self, analyst: str, cost: Cost, query: str, note: str | None = None) -> Spending:
        """Commit the cost of a query, or raise BudgetExhausted and commit nothing."""
        return self.begin_charge(analyst, cost, query, overlap=False, note=note).wait()

    def begin_charge(self, analyst: str, cost: Cost, query: str, *, overlap: bool = True,
                     note: str | None = None) -> PendingCharge:
        """Write the cost of a query and commit it: with `overlap`, the commit (its fsync, the slow part) runs on a
        thread of its own while the caller reads the data. Refusals (BudgetExhausted, nothing written) and an
        unusable ledger (LedgerError) are raised here, before the data is touched; the ledger's write lock is held
        from the totals' read to the end of the commit, as in one call, so concurrent charges cannot both fit.

        Nothing may be released before the pending charge's `wait()` returns: then the charge is on disk. If the
        commit fails, `wait()` raises LedgerError and nothing was charged, so nothing may be released either."""
        self._lock.acquire()
        try:
            con = self._connection()
            pending = PendingCharge(*self._write(con, analyst, cost, query, note))
        except BaseException:
            self._lock.release()
            raise
        if overlap:
            # A bare thread: threading.Thread.start() would wait until the new thread runs, which on a busy machine
            # took as long as the commit itself. The pending charge's own lock says when it is done.
            with contextlib.suppress(RuntimeError):  # no thread to be had: commit here instead
                _thread.start_new_thread(self._commit, (con, pending))
                return pending
        self._commit(con, pending)
        return pending

    def _write(self, con: sqlite3.Connection, analyst: str, cost: Cost, query: str,
               note: str | None = None) -> tuple[Spending, int]:
        """Four statements, all but the commit: take the write lock, read both totals (one SELECT), insert the
        charge, write both totals (one INSERT). Left open for `_commit`; rolled back on a refusal."""
        try:
            con.execute("BEGIN IMMEDIATE")
            try:
                everyone, mine = self._totals(con, analyst)
                for who, total, scope in (("the total budget", everyone, None),
                                          (f"analyst {analyst!r}'s budget", mine, analyst)):
                    problem = self._overspend(total, cost, scope)
                    if problem:
                        raise BudgetExhausted(f"refused: this query would overspend {who}: {problem}. Nothing "
                                              "was released or charged")
                epsilon, delta, rho = cost.epsilon, cost.delta, cost.rho
                inserted = con.execute(
                    "INSERT INTO charges (at, analyst, epsilon, delta, rho, query, note) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"), analyst, str(epsilon),
                     str(delta), str(rho), query, note))
                everyone, mine = everyone.add(epsilon, delta, rho), mine.add(epsilon, delta, rho)
                # Everyone's row first: for an analyst named like the everyone scope the two rows are one, and
                # both carry the same total, as two separate writes did.
                con.execute("INSERT OR REPLACE INTO totals VALUES (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)",
                            (*self._row(_EVERYONE, everyone), *self._row(analyst, mine)))
            except BaseException:
                con.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._close()
            raise LedgerError(f"budget ledger {self.path}: cannot record the charge ({exc}); refusing to "
                              "answer") from None
        return self._spending(mine, analyst, everyone), inserted.lastrowid

    def _commit(self, con: sqlite3.Connection, pending: PendingCharge) -> None:
        """Commit the written charge (synchronous FULL: on disk when COMMIT returns), then let go of the ledger."""
        error = None
        try:
            con.execute("COMMIT")
        except BaseException as exc:  # on whatever thread: the waiter must learn of it, whatever it was
            self._close()  # closing rolls back what a failed commit left
            error = LedgerError(f"budget ledger {self.path}: cannot record the charge ({type(exc).__name__}: "
                                f"{exc}); refusing to answer")
        finally:
            self._lock.release()  # first: once the waiter goes on, the ledger is free for its next call
            pending._finish(error)

    def _totals(self, con: sqlite3.Connection, analyst: str) -> tuple[_Total, _Total]:
        """Everyone's total and the analyst's, read in one statement."""
        found = {row[0]: _Total(Fraction(row[1]), Fraction(row[2]), Fraction(row[3]), row[4]) for row in
                 con.execute("SELECT scope, epsilon, delta, rho, queries FROM totals WHERE scope IN (?, ?)",
                             (_EVERYONE, analyst))}
        return tuple(found[scope] if scope in found else self._recount(con, scope)  # type: ignore[return-value]
                     for scope in (_EVERYONE, analyst))

    def _total(self, con: sqlite3.Connection, scope: str) -> _Total:
        row = con.execute("SELECT epsilon, delta, rho, queries FROM totals WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return self._recount(con, scope)
        return _Total(Fraction(row[0]), Fraction(row[1]), Fraction(row[2]), row[3])

    def _recount(self, con: sqlite3.Connection, scope: str) -> _Total:
        """The total from the charges themselves: for a scope with no totals row yet."""
        where, args = ("", ()) if scope == _EVERYONE else (" WHERE analyst = ?", (scope,))
        total = _Total()
        for epsilon, delta, rho in con.execute(f"SELECT epsilon, delta, rho FROM charges{where}", args):
            total = total.add(Fraction(epsilon), Fraction(delta), Fraction(rho))
        return total

    @staticmethod
    def _row(scope: str, total: _Total) -> tuple[str, str, str, str, int]:
        return scope, str(total.epsilon), str(total.delta), str(total.rho), total.queries

    def _limits(self, analyst: str | None) -> tuple[Fraction, Fraction]:
        """The (epsilon, delta) a scope may spend, as exact rationals: fixed by the policy, so worked out once."""
        limits = self._limit_cache.get(analyst)
        if limits is None:
            share = self.budget if analyst is None else self.budget.for_analyst(analyst)
            limits = self._limit_cache[analyst] = (exact(share.epsilon), exact(share.delta))
        return limits

    def _overspend(self, total: _Total, cost: Cost, analyst: str | None) -> str | None:
        epsilon, delta = self._limits(analyst)
        if self.budget.accounting is Accounting.PURE:
            if total.epsilon + cost.epsilon > epsilon:
                return f"epsilon {float(cost.epsilon):g} asked, {float(max(epsilon - total.epsilon, 0)):g} of " \
                       f"{float(epsilon):g} left"
            delta_cap = delta
        else:
            cap = rho_budget(epsilon, delta / 2)
            if total.rho + cost.rho > cap:
                return f"rho {float(cost.rho):g} asked (epsilon {float(cost.epsilon):g}), " \
                       f"{float(max(cap - total.rho, 0)):g} of {float(cap):g} left"
            delta_cap = delta / 2
        if total.delta + cost.delta > delta_cap:
            return f"delta {float(cost.delta):g} asked, {float(max(delta_cap - total.delta, 0)):g} left"
        return None

    def _spending(self, total: _Total, analyst: str | None, everyone: _Total | None = None) -> Spending:
        """The scope's spending; for an analyst, with `everyone`'s total, their remaining is capped by the whole
        budget's (the one place that cap is applied: every front end shows Spending.epsilon_remaining)."""
        epsilon, delta = self._limits(analyst)
        left = None if analyst is None or everyone is None else self._spending(everyone, None).epsilon_remaining
        if self.budget.accounting is Accounting.PURE:
            return Spending(Accounting.PURE, float(epsilon), float(delta), float(total.epsilon), float(total.delta),
                            total.queries, left)
        spent = epsilon_of_rho(total.rho, delta / 2) if total.rho else 0.0
        conversion = delta / 2 if total.rho else Fraction(0)  # the delta that turning rho into epsilon uses
        return Spending(Accounting.ZCDP, float(epsilon), float(delta), spent, float(total.delta + conversion),
                        total.queries, left)

    def spending(self, analyst: str | None = None) -> Spending:
        """Everyone's spending, or one analyst's (their remaining capped by what is left of the whole budget)."""
        if analyst is None:
            with self._lock:
                total = self._read(lambda con: self._total(con, _EVERYONE))
            return self._spending(total, None)
        with self._lock:
            everyone, mine = self._read(lambda con: self._totals(con, analyst))
        return self._spending(mine, analyst, everyone)

    def history(self, analyst: str | None = None) -> list[Charge]:
        def charges(con: sqlite3.Connection) -> list[Charge]:
            rows = con.execute("SELECT id, at, analyst, epsilon, delta, rho, query, note FROM charges ORDER BY id")
            return [Charge(r[0], r[1], r[2], Fraction(r[3]), Fraction(r[4]), Fraction(r[5]), r[6], r[7]) for r in rows
                    if analyst is None or r[2] == analyst]
        with self._lock:
            return self._read(charges)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=BudgetLedger._after_fork_in_child)
