"""The differencing attack recovers every bit from plain DuckDB; from dpsql it pays twice and stays in the bound."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from benchmarks.attacks.people import write_worlds
from benchmarks.attacks.stats import success_bound
from benchmarks.attacks.tracker import attack

EPSILON = 0.5


def test_tracker_recovers_every_bit_from_duckdb_and_pays_twice_in_dpsql(tmp_path: Path) -> None:
    report = attack(write_worlds(tmp_path, people=60, seed=11), EPSILON, rounds=4000, end_to_end_rounds=5, seed=11)
    assert report.baseline.successes == report.baseline.trials == 60

    e2e = report.end_to_end
    assert e2e.answers == 2 * e2e.rounds
    assert e2e.charged == 2 * e2e.rounds * Fraction(str(EPSILON))

    # The second count is identical in both worlds, so the first query's epsilon bounds the game; the charged
    # 2 * EPSILON bound is looser still. The one-sided 95% lower confidence bound must not exceed it.
    assert report.game.lower() <= success_bound(EPSILON), str(report.game)
