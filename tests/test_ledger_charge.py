"""The charge's few statements: both totals read and written at once, kept equal to the charges themselves, and
every charge committed with synchronous FULL; the commit overlapped with the data's read, the answer waiting for it."""

from __future__ import annotations

import os
import sqlite3
import threading
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql.errors import BudgetExhausted, LedgerError
from dpsql.planning.plan import Cost
from dpsql.policy import Accounting, AnalystBudget, BudgetPolicy, MechanismKind
from dpsql.store.ledger import BudgetLedger
from tests.forking import in_forked_child


def _ledger(tmp_path: Path, accounting: Accounting = Accounting.PURE) -> BudgetLedger:
    budget = BudgetPolicy(epsilon=10.0, delta=1e-5, query_epsilon=0.1, query_delta=1e-9, accounting=accounting,
                          mechanism=MechanismKind.LAPLACE, ledger=tmp_path / "ledger.sqlite",
                          analysts={"bob": AnalystBudget(2.0, 1e-5)})
    return BudgetLedger(budget.ledger, budget, create=True)


def _totals(path: Path) -> dict[str, tuple[Fraction, Fraction, Fraction, int]]:
    with sqlite3.connect(path) as con:
        return {scope: (Fraction(e), Fraction(d), Fraction(r), n)
                for scope, e, d, r, n in con.execute("SELECT * FROM totals")}


@pytest.mark.parametrize("accounting", list(Accounting))
def test_the_totals_rows_are_the_sums_of_the_charges(tmp_path: Path, accounting: Accounting) -> None:
    ledger = _ledger(tmp_path, accounting)
    # "*" is the everyone scope's own name: an analyst called so shares its row, as before.
    spent = {"ann": [Fraction(1, 10), Fraction(1, 20)], "bob": [Fraction(1, 8), Fraction(1, 7)], "*": [Fraction(1, 9)]}
    for round_ in range(2):
        for analyst, epsilons in spent.items():
            ledger.charge(analyst, Cost(epsilons[round_ % len(epsilons)], Fraction(1, 10**9)), "SELECT 1")
    charges = ledger.history()
    totals = _totals(ledger.path)
    for scope in ("*", "ann", "bob"):
        mine = [c for c in charges if scope == "*" or c.analyst == scope]
        assert totals[scope] == (sum(c.epsilon for c in mine), sum(c.delta for c in mine),
                                 sum(c.epsilon**2 / 2 for c in mine), len(mine))
    assert ledger.spending("ann").queries == 2 and ledger.spending().queries == 6
    with pytest.raises(BudgetExhausted, match="analyst 'bob'"):
        # past bob's share, within the total (rho caps: about 0.076 for bob, 1.49 in all)
        ledger.charge("bob", Cost(Fraction(19, 10) if accounting is Accounting.PURE else Fraction(1, 2), Fraction(0)),
                      "SELECT 1")
    assert len(ledger.history()) == 6 and _totals(ledger.path) == totals  # a refusal writes nothing


def test_a_ledger_without_totals_rows_recounts_them_from_the_charges(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.charge("ann", Cost(Fraction(1, 10), Fraction(0)), "SELECT 1")
    with sqlite3.connect(ledger.path) as con:
        con.execute("DELETE FROM totals")
    ledger.charge("ann", Cost(Fraction(1, 5), Fraction(0)), "SELECT 1")
    assert _totals(ledger.path)["ann"][0] == _totals(ledger.path)["*"][0] == Fraction(3, 10)


def test_each_charge_is_committed_with_synchronous_full(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.charge("ann", Cost(Fraction(1, 10), Fraction(0)), "SELECT 1")
    con = ledger._connection()
    assert con.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: the WAL is fsynced at every commit
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def _session(tmp_path: Path):
    from benchmarks.support import create_ledger, seeded, write_csv, write_policy
    from dpsql.session import PrivateSession

    write_csv(tmp_path / "t.csv", ["pid", "x"], [(i, i % 7) for i in range(1, 50)])
    policy = create_ledger(write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 6}}}}))
    return PrivateSession(policy, "ann", rng=seeded(1))


def test_the_commit_runs_while_the_data_is_read_and_the_answer_waits_for_it(tmp_path: Path, monkeypatch) -> None:
    """The commit is held until the engine has read the data: the answer still comes only after the commit."""
    session = _session(tmp_path)
    events: list[str] = []
    data_read = threading.Event()
    run, commit = session.engine.run, BudgetLedger._commit

    def reading(sql: str):
        rows = run(sql)
        events.append("data read")
        data_read.set()
        return rows

    def committing(self, con, pending) -> None:
        data_read.wait()  # were the commit not overlapped with the read, this would never return
        commit(self, con, pending)
        events.append("committed")

    monkeypatch.setattr(session.engine, "run", reading)
    monkeypatch.setattr(BudgetLedger, "_commit", committing)
    session.execute("SELECT COUNT(*) FROM t", epsilon=0.5)
    events.append("released")
    assert events == ["data read", "committed", "released"]
    assert len(session.history()) == 1
    session.close()


def test_a_commit_that_fails_releases_nothing_and_charges_nothing(tmp_path: Path, monkeypatch) -> None:
    session = _session(tmp_path)

    def failing(self, con, pending) -> None:
        con.execute("ROLLBACK")  # as a failed COMMIT leaves it: nothing written
        self._lock.release()
        pending._finish(LedgerError("budget ledger: cannot record the charge (disk I/O error); refusing to answer"))

    kept: list = []

    class Answers:  # the store of released answers: nothing may reach it
        get = staticmethod(lambda key: None)
        put = staticmethod(lambda *args: kept.append(args))

    session.answers = Answers()
    monkeypatch.setattr(BudgetLedger, "_commit", failing)
    with pytest.raises(LedgerError, match="cannot record the charge"):
        session.execute("SELECT COUNT(*) FROM t", epsilon=0.5)
    monkeypatch.undo()
    assert kept == [] and session.history() == []
    session.execute("SELECT COUNT(*) FROM t", epsilon=0.5)  # the ledger is usable again
    assert len(session.history()) == 1
    session.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_during_a_commit_can_charge(tmp_path: Path) -> None:
    """A fork while a commit's thread holds the ledger's lock would leave the child's copy locked for ever."""
    ledger = _ledger(tmp_path)
    ledger._lock.acquire()  # as a commit in flight holds it
    try:
        answer = in_forked_child(lambda: b"1" if ledger._lock.acquire(blocking=False) else b"0")
    finally:
        ledger._lock.release()
    assert answer == b"1"
    ledger.charge("ann", Cost(Fraction(1, 10), Fraction(0)), "SELECT 1")
