"""A query whose failure depends on one person's row must not tell that row apart.

The IN oracles (closed by commit 68e1a3e), ESCAPE 'ab' (closed by 59f3d94) and ESCAPE with one multi-byte
character (closed when the checker counted bytes) stay as regression tests; see also test_totality.py.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.error_oracle import ORACLES, attack, scan
from benchmarks.attacks.people import write_worlds
from benchmarks.attacks.stats import success_bound

EPSILON = 0.01


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    return write_worlds(tmp_path_factory.mktemp("oracle"), people=30, seed=13)


@pytest.fixture(scope="module")
def report(worlds):
    return attack(worlds, EPSILON, rounds=20, seed=13)


@pytest.mark.parametrize("name", list(ORACLES))
def test_a_failing_query_reveals_no_more_than_its_epsilon(report, name: str) -> None:
    outcome = next(o for o in report.outcomes if o.name == name)
    assert outcome.game.lower() <= success_bound(EPSILON), f"{name}: success {outcome.game}"


def test_no_risky_expression_fails_in_one_world_only(worlds) -> None:
    leaks = [p for p in scan(worlds, EPSILON, seed=13) if p.leaks]
    assert not leaks, "\n".join(f"{p.outcomes[0]} / {p.outcomes[1]}: {p.sql}" for p in leaks)
