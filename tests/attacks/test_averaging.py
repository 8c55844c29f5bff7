"""Averaging beats a proxy that does not charge; dpsql refuses once the budget is spent, before it works."""

from __future__ import annotations

from pathlib import Path

from benchmarks.attacks.averaging import attack, write_budgeted_worlds
from benchmarks.attacks.stats import success_bound

EPSILON, BUDGET = 1 / 8, 1.0  # powers of two: the ledger's exact sum reaches the budget after exactly 8 answers


def test_averaging_needs_more_answers_than_the_budget_allows(tmp_path: Path) -> None:
    worlds = write_budgeted_worlds(tmp_path, people=200, budget=BUDGET, seed=5)
    report = attack(worlds, EPSILON, BUDGET, rounds=1000, uncharged_rounds=20, uncharged_answers=4000, seed=5)

    # Without a ledger the mean of 4000 answers wins beyond anything the budget's epsilon would allow.
    assert report.uncharged.game.lower() > success_bound(BUDGET), str(report.uncharged.game)

    assert report.refusal.answers == int(BUDGET / EPSILON)
    assert report.refusal.spent == BUDGET
    assert "overspend" in report.refusal.error

    assert report.dpsql.answers == report.refusal.answers
    assert report.dpsql.game.lower() <= success_bound(BUDGET), str(report.dpsql.game)
