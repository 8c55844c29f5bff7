"""The budget ledger: every answered query's cost, persisted before the answer is released.

A SQLite file (by default beside the policy). A charge is one `BEGIN IMMEDIATE` transaction: it takes the write
lock, sums what was spent, refuses if the query would overspend the total or the analyst's share, and commits
the charge, all before the query touches the data. SQLite's locking makes this safe across processes; its
journal makes a killed process leave either the whole charge or none of it. Costs are stored as exact rationals
("1/10"), so ten queries of 0.1 spend exactly 1.

Accounting is fixed when a ledger is created: "pure" sums (epsilon, delta); "zcdp" sums rho (= epsilon^2/2 per
query) and converts it to (epsilon, delta) with epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke 2016),
half of the policy's delta going to that conversion and half to partition selection.
"""

from __future__ import annotations

import datetime
import math
import sqlite3
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from dpsql.errors import BudgetExhausted, LedgerError
from dpsql.plan import Cost
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
    query TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class Charge:
    id: int
    at: str
    analyst: str
    epsilon: Fraction
    delta: Fraction
    rho: Fraction
    query: str


@dataclass(frozen=True)
class Spending:
    """Spent and remaining, for everyone or for one analyst, in (epsilon, delta) terms."""

    accounting: Accounting
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float
    queries: int

    @property
    def epsilon_remaining(self) -> float:
        return max(0.0, self.epsilon_total - self.epsilon_spent)

    @property
    def delta_remaining(self) -> float:
        return max(0.0, self.delta_total - self.delta_spent)


def exact(value: float | int | str | Fraction) -> Fraction:
    """The rational a user meant: 0.1 is 1/10, not the binary float nearest to it."""
    if isinstance(value, Fraction):
        return value
    return Fraction(repr(float(value))) if isinstance(value, float) else Fraction(str(value))


def rho_budget(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon, rounded down."""
    log = math.log(1 / float(delta))
    root = math.sqrt(log + float(epsilon)) - math.sqrt(log)
    return Fraction(root * root * (1 - 1e-12))


def epsilon_of_rho(rho: Fraction, delta: Fraction) -> float:
    return float(rho) + 2 * math.sqrt(float(rho) * math.log(1 / float(delta)))


class BudgetLedger:
    def __init__(self, path: Path, budget: BudgetPolicy) -> None:
        self.path = path
        self.budget = budget
        if not path.parent.is_dir():
            raise LedgerError(f"budget ledger {path}: the folder {path.parent} does not exist; refusing to answer "
                              "without a ledger")
        con = self._connect()
        try:
            con.executescript(_SCHEMA)
            con.execute("INSERT OR IGNORE INTO meta VALUES ('accounting', ?)", (budget.accounting.value,))
            stored = con.execute("SELECT value FROM meta WHERE key = 'accounting'").fetchone()[0]
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {path}: cannot be written ({exc}); refusing to answer") from None
        finally:
            con.close()
        if stored != budget.accounting.value:
            raise LedgerError(f"budget ledger {path} was started with {stored} accounting, but the policy now says "
                              f"{budget.accounting.value}: use a new ledger")

    def _connect(self) -> sqlite3.Connection:
        try:
            con = sqlite3.connect(self.path, timeout=60, isolation_level=None)
            con.execute("PRAGMA journal_mode = WAL")
            con.execute("PRAGMA synchronous = FULL")
            return con
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot be opened ({exc}); refusing to answer") from None

    def charge(self, analyst: str, cost: Cost, query: str) -> Spending:
        """Commit the cost of a query, or raise BudgetExhausted and commit nothing."""
        con = self._connect()
        try:
            con.execute("BEGIN IMMEDIATE")
            charges = self._charges(con)
            for who, mine in (("the total budget", charges), (f"analyst {analyst!r}'s budget",
                                                               [c for c in charges if c.analyst == analyst])):
                problem = self._overspend(mine, cost, analyst if who != "the total budget" else None)
                if problem:
                    con.execute("ROLLBACK")
                    raise BudgetExhausted(f"refused: this query would overspend {who}: {problem}. Nothing was "
                                          "released or charged")
            con.execute("INSERT INTO charges (at, analyst, epsilon, delta, rho, query) VALUES (?, ?, ?, ?, ?, ?)",
                        (datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"), analyst,
                         str(cost.epsilon), str(cost.delta), str(cost.rho), query))
            con.execute("COMMIT")
            return self._spending(self._charges(con), analyst)
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot record the charge ({exc}); refusing to "
                              "answer") from None
        finally:
            con.close()

    def _limits(self, analyst: str | None) -> tuple[Fraction, Fraction]:
        if analyst is None:
            return exact(self.budget.epsilon), exact(self.budget.delta)
        share = self.budget.for_analyst(analyst)
        return exact(share.epsilon), exact(share.delta)

    def _overspend(self, charges: list[Charge], cost: Cost, analyst: str | None) -> str | None:
        epsilon, delta = self._limits(analyst)
        if self.budget.accounting is Accounting.PURE:
            spent = sum((c.epsilon for c in charges), Fraction(0))
            if spent + cost.epsilon > epsilon:
                return f"epsilon {float(cost.epsilon):g} asked, {float(max(epsilon - spent, 0)):g} of " \
                       f"{float(epsilon):g} left"
            delta_cap = delta
        else:
            spent = sum((c.rho for c in charges), Fraction(0))
            cap = rho_budget(epsilon, delta / 2)
            if spent + cost.rho > cap:
                return f"rho {float(cost.rho):g} asked (epsilon {float(cost.epsilon):g}), " \
                       f"{float(max(cap - spent, 0)):g} of {float(cap):g} left"
            delta_cap = delta / 2
        delta_spent = sum((c.delta for c in charges), Fraction(0))
        if delta_spent + cost.delta > delta_cap:
            return f"delta {float(cost.delta):g} asked, {float(max(delta_cap - delta_spent, 0)):g} left"
        return None

    def _charges(self, con: sqlite3.Connection) -> list[Charge]:
        rows = con.execute("SELECT id, at, analyst, epsilon, delta, rho, query FROM charges ORDER BY id").fetchall()
        return [Charge(r[0], r[1], r[2], Fraction(r[3]), Fraction(r[4]), Fraction(r[5]), r[6]) for r in rows]

    def _spending(self, charges: list[Charge], analyst: str | None) -> Spending:
        mine = [c for c in charges if analyst is None or c.analyst == analyst]
        epsilon, delta = self._limits(analyst)
        delta_spent = sum((c.delta for c in mine), Fraction(0))
        if self.budget.accounting is Accounting.PURE:
            spent = float(sum((c.epsilon for c in mine), Fraction(0)))
            return Spending(Accounting.PURE, float(epsilon), float(delta), spent, float(delta_spent), len(mine))
        rho = sum((c.rho for c in mine), Fraction(0))
        spent = epsilon_of_rho(rho, delta / 2) if rho else 0.0
        conversion = delta / 2 if rho else Fraction(0)  # the delta that turning rho into epsilon uses
        return Spending(Accounting.ZCDP, float(epsilon), float(delta), spent, float(delta_spent + conversion),
                        len(mine))

    def spending(self, analyst: str | None = None) -> Spending:
        con = self._connect()
        try:
            return self._spending(self._charges(con), analyst)
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot be read ({exc})") from None
        finally:
            con.close()

    def history(self, analyst: str | None = None) -> list[Charge]:
        con = self._connect()
        try:
            return [c for c in self._charges(con) if analyst is None or c.analyst == analyst]
        except sqlite3.Error as exc:
            raise LedgerError(f"budget ledger {self.path}: cannot be read ({exc})") from None
        finally:
            con.close()
