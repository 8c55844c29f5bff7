"""The charge's few statements: both totals read and written at once, kept equal to the charges themselves, and
every charge committed with synchronous FULL."""

from __future__ import annotations

import sqlite3
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql.errors import BudgetExhausted
from dpsql.planning.plan import Cost
from dpsql.policy import Accounting, AnalystBudget, BudgetPolicy, MechanismKind
from dpsql.store.ledger import BudgetLedger


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
