"""Issue 7, classes 1 and 3: errors TRY does not absorb and implicit casts must not tell the target's row apart.

Against the build before the type check every oracle here won the balanced game 32 rounds of 32 (one bit per
query); see benchmarks/attacks/totality.py.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.people import send_in_each_world
from benchmarks.attacks.stats import success_bound
from benchmarks.attacks.totality import ORACLES, probes, run, write_worlds

EPSILON = 0.01


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    return write_worlds(tmp_path_factory.mktemp("totality"), people=30, seed=17)


@pytest.fixture(scope="module")
def report(worlds):
    return run(worlds, EPSILON, rounds=20, seed=17)


@pytest.mark.parametrize("name", list(ORACLES))
def test_an_oracle_wins_no_more_than_two_changed_rows_allow(report, name: str) -> None:
    outcome = next(o for o in report.outcomes if o.name == name)
    assert outcome.game.lower() <= success_bound(2 * EPSILON), f"{name}: success {outcome.game}"
    assert outcome.failures == 0


@pytest.mark.parametrize("name", list(ORACLES))
def test_an_oracle_is_refused_from_the_text_the_same_in_both_worlds_at_no_cost(worlds, name: str) -> None:
    sent = send_in_each_world(worlds, ORACLES[name], EPSILON, seed=17)
    assert all(s.refusal is not None and s.charged == 0 for s in sent), sent
    assert sent[0].refusal == sent[1].refusal


def test_no_implicit_cast_fails_in_one_world_only(worlds) -> None:
    leaks = [p for p in probes(worlds, EPSILON, seed=17) if p.leaks]
    assert not leaks, "\n".join(f"{p.outcomes[0]} / {p.outcomes[1]}: {p.sql}" for p in leaks)
