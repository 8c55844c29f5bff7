"""The filtered cap's three UNION ALL branches keep exactly the first m passing rows of each unit (red team, stop 22):
benchmarks/attacks/filtered_cap.py at CI size, on a table where most units have more than m rows, on its neighbours
(one unit removed, one adversarial row added to a unit), with filters of the typed grammar and of per_unit columns."""

from __future__ import annotations

import pytest

from benchmarks.attacks.filtered_cap import (
    WORLD_NAMES,
    fuzz,
    fuzz_per_group,
    open_per_group_worlds,
    open_worlds,
    reference_rows,
)

CASES, SEED = 120, 11


def _closed_after(opened: dict):
    yield opened
    for session in opened.values():
        session.close()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory):
    yield from _closed_after(open_worlds(tmp_path_factory.mktemp("filtered_cap"), SEED))


def test_the_cap_keeps_the_first_m_passing_rows_of_each_unit_in_every_world(sessions) -> None:
    summary = fuzz(sessions, CASES, SEED)
    assert summary.cases - summary.refused >= CASES // 2
    assert summary.compared == (summary.cases - summary.refused) * len(WORLD_NAMES)
    assert not summary.mismatches, "\n".join(summary.lines())


def test_the_reference_can_tell_a_wrong_cap(sessions) -> None:
    """A cap that ranks over all of a unit's rows before the filter (capping first) differs from the reference on
    this table: the comparison has teeth."""
    session = sessions["base"]
    plan = session.prepare("SELECT COUNT(*) FROM f WHERE i > 0", epsilon=1.0).plan
    capped_first = "SELECT __dp_unit, __dp_rank FROM __dp_f AS f WHERE __dp_rank <= 2 AND i > 0"
    assert sorted(session.engine.run(capped_first)) != sorted(session.engine.run(reference_rows(plan)))


@pytest.fixture(scope="module")
def per_group_sessions(tmp_path_factory: pytest.TempPathFactory):
    yield from _closed_after(open_per_group_worlds(tmp_path_factory.mktemp("per_group_cap"), SEED))


def test_the_per_group_cap_keeps_r_rows_in_k_groups_chosen_by_the_units_own_hashes(per_group_sessions) -> None:
    """max_groups_per_unit = 2, max_rows_per_group = 1 (m = 3): after the unit cap, each unit's r rows with the
    smallest row hash in each of its k groups whose smallest hash is smallest, computed independently in Python, on
    every neighbouring world, for declared-values, boolean, CASE and partition-selected keys, with and without WHERE."""
    summary = fuzz_per_group(per_group_sessions, 50, SEED)
    assert summary.cases - summary.refused >= 40
    assert not summary.mismatches, "\n".join(summary.lines())
