"""Least squares over subset counts rebuilds the secret column from exact answers, not from dpsql's."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.attacks.reconstruction import attack, write_population
from benchmarks.attacks.stats import success_bound

PEOPLE, TRIALS, BUDGET = 64, 200, 1.0
QUERIES = 2 * PEOPLE  # 128: a power of two, so BUDGET / QUERIES sums exactly to BUDGET in the ledger


def test_reconstruction_works_on_exact_answers_and_not_within_the_budget(tmp_path: Path) -> None:
    population = write_population(tmp_path, PEOPLE, TRIALS, QUERIES, BUDGET, seed=7)
    report = attack(population, BUDGET, seed=7)

    assert np.all(report.baseline.per_trial == 1.0)

    assert report.answered == QUERIES
    assert "overspend" in report.refused

    # Each trial's designated bit is an independent round of the balanced game at epsilon BUDGET per person.
    assert report.dpsql.designated.lower() <= success_bound(BUDGET), str(report.dpsql)
    assert report.dpsql.hoeffding_lower <= success_bound(BUDGET), str(report.dpsql)
