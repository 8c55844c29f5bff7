"""COUNT(*) beside a nullable argument: the rows where it is NULL and those where it is not, counted apart.

Every row is in exactly one of the two sets, so the two counts spend one budget share together (parallel
composition) and COUNT(*) is their sum: better than a count of all rows beside a count of the non-NULL rows, which
overlap and split the budget (issue 13: dpsql's COUNT(*) was 1.19x Tumult's error with a nullable column).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dpsql.planning.plan as planning
from dpsql.planning.aggregates import aggregate
from dpsql.planning.measurements import MeasurementKind
from dpsql.session import PrivateSession

COUNTS = "SELECT region, COUNT(*), COUNT(cost) FROM visits GROUP BY region"
# With SUM or AVG of cost, cost is measured as a pair (x - lo, hi - x) and its NULL rows join the pair's share
GROUPED = "SELECT region, COUNT(*), COUNT(cost), SUM(cost), AVG(cost) FROM visits GROUP BY region"


def _plan(policy: Path, sql: str):
    session = PrivateSession(policy, "t", bounding_seed=3)
    try:
        prepared = session.prepare(sql, epsilon=1.0)
        return prepared, session.engine.run(prepared.bounded.sql)
    finally:
        session.close()


def _rows_per_region(policy: Path) -> dict[str, int]:
    """The exact COUNT(*) per region of the bounded rows, from a plan of its own."""
    _, rows = _plan(policy, "SELECT region, COUNT(*) FROM visits GROUP BY region")
    return {row[0]: row[1] for row in rows}


def test_count_star_is_the_sum_of_two_disjoint_counts_that_share_one_share(visits_policy: Path) -> None:
    prepared, rows = _plan(visits_policy, COUNTS)
    plan = prepared.plan
    kinds = [m.spec.kind for m in plan.measurements]
    assert MeasurementKind.NULLS in kinds and sum(k is MeasurementKind.ROWS for k in kinds) == 1
    nulls = kinds.index(MeasurementKind.NULLS)
    values = next(i for i, m in enumerate(plan.measurements)
                  if m.spec.kind is MeasurementKind.ROWS and m.spec.argument is not None)
    assert plan.measurements[nulls].share == plan.measurements[values].share
    assert plan.recipes[0].parts == (nulls, values)
    # The budget is spent once per item: the items' shares add up to at most epsilon.
    shares = {m.spec.budget_item: m.share for m in plan.measurements}
    assert len(shares) == 1 and 0.999999 < sum(shares.values()) <= 1.0
    # And the two counts add up to every row (engine's exact values, before noise): NULL or not, each row once.
    exact = {row[0]: row[1 + nulls] + row[1 + values] for row in rows}
    assert exact == _rows_per_region(visits_policy)


@pytest.mark.parametrize("sql", [COUNTS, GROUPED])
def test_every_output_is_at_least_as_accurate_as_without_the_split(visits_policy: Path, sql: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    split, _ = _plan(visits_policy, sql)
    monkeypatch.setattr(planning, "_split_choices", lambda query, needs_selection: [None])
    plain, _ = _plan(visits_policy, sql)
    assert any(m.spec.kind is MeasurementKind.NULLS for m in split.plan.measurements)
    assert not any(m.spec.kind is MeasurementKind.NULLS for m in plain.plan.measurements)

    # COUNT(*), COUNT(cost) and SUM(cost) are linear in the measurements: their half-widths are the same for every
    # group. AVG(cost) divides a sum by a count: each of the measurements it reads is less noisy.
    for new, old in zip(split.plan.recipes, plain.plan.recipes, strict=True):
        if new.call.kind == "avg":
            for a, b in zip(new.pair or (new.count, new.total), old.pair or (old.count, old.total), strict=True):
                assert split.plan.measurements[a].std < plain.plan.measurements[b].std
        else:
            assert aggregate(new.call).width(new, split.plan.measurements) < \
                aggregate(old.call).width(old, plain.plan.measurements), new.call.text


def test_a_pair_and_the_null_rows_share_one_share_and_count_every_row(visits_policy: Path) -> None:
    prepared, rows = _plan(visits_policy, GROUPED)
    plan = prepared.plan
    kinds = [m.spec.kind for m in plan.measurements]
    assert kinds == [MeasurementKind.ABOVE, MeasurementKind.BELOW, MeasurementKind.NULLS]
    assert len({m.spec.budget_item for m in plan.measurements}) == 1 and 0.999999 < plan.measurements[0].share <= 1
    width = plan.measurements[0].spec.value_point.width
    steps = 1 / float(plan.measurements[0].spec.step)
    # Each row adds hi - lo to the three together: their exact sum is COUNT(*) times that, in grid steps.
    per_row = round(width * steps)
    expected = {region: count * per_row for region, count in _rows_per_region(visits_policy).items()}
    assert {row[0]: sum(row[1:]) for row in rows} == expected
    assert [r.linear for r in plan.recipes[:2]] == [((1 / width, 0), (1 / width, 1), (1 / width, 2)),
                                                    ((1 / width, 0), (1 / width, 1))]


def test_partition_selection_keeps_a_count_of_all_rows(visits_policy: Path) -> None:
    """The selection threshold is calibrated to one count's noise, so a query that needs it is not split."""
    prepared, _ = _plan(visits_policy, "SELECT length_of_stay, COUNT(*), AVG(cost) FROM visits GROUP BY length_of_stay")
    kinds = [(m.spec.kind, m.spec.argument) for m in prepared.plan.measurements]
    assert prepared.plan.selection is not None and (MeasurementKind.ROWS, None) in kinds
    assert all(kind is not MeasurementKind.NULLS for kind, _ in kinds)


def test_a_non_nullable_argument_needs_no_split(visits_policy: Path) -> None:
    prepared, _ = _plan(visits_policy, "SELECT region, COUNT(*), AVG(age) FROM visits GROUP BY region")
    assert [m.spec.kind for m in prepared.plan.measurements] == [MeasurementKind.ABOVE, MeasurementKind.BELOW]
    assert prepared.plan.recipes[0].linear and prepared.plan.recipes[1].pair == (0, 1)
