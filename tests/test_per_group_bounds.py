"""Per-group contribution bounds (policy max_groups_per_unit, max_rows_per_group; planning/contribution.py and
rewrite/passes.cap_rows_per_group): the sensitivities they give, that the rewrite enforces them, and what they buy."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.support import seeded, write_csv, write_policy
from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.errors import PolicyError
from dpsql.planning.contribution import Contribution, contribution
from dpsql.planning.plan import _threshold
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from tests.conftest import create_ledger
from tests.exact_tails import tail
from tests.sizes import cases

GROUPS = [f"g{i}" for i in range(12)]


def _spreads(m: int, k: int, r: int) -> list[tuple[int, ...]]:
    """Every way one unit can put its rows in groups under the bounds (rows per group, non-increasing)."""
    found = []
    for j in range(1, min(k, m) + 1):
        for rows in itertools.combinations_with_replacement(range(1, r + 1), j):
            if sum(rows) <= m:
                found.append(rows)
    return found


@settings(max_examples=cases(60), deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9))
def test_the_sensitivities_are_the_largest_a_unit_can_reach(m: int, k: int, r: int) -> None:
    k, r = min(k, m), min(r, m)
    unit = Contribution(m, k, r, True)
    spreads = _spreads(m, k, r)
    assert unit.l1 == max(sum(s) for s in spreads)
    assert unit.l2_squared == max(sum(c * c for c in s) for s in spreads)
    # partition selection: a convex tail summed over the groups is largest at one of the peaked allocations
    for convex in (lambda c: math.exp(c), lambda c: c**3, lambda c: 2.0**c - 1):
        worst = max(sum(convex(c) for c in s) for s in spreads)
        assert max(sum(n * convex(c) for n, c in a) for a in unit.allocations()) == pytest.approx(worst)
        assert all(sum(n * c for n, c in a) <= m and all(c <= r for _, c in a) and sum(n for n, _ in a) <= k
                   for a in unit.allocations())


def _policy(folder: Path, rows: list[tuple], bounds: dict, budget: dict | None = None) -> Path:
    write_csv(folder / "t.csv", ["pid", "g", "h", "x"], rows)
    return create_ledger(write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 6, **bounds,
        "columns": {"pid": {"type": "int"}, "g": {"type": "text", "values": GROUPS}, "h": {"type": "text"},
                    "x": {"type": "float", "lower": 0, "upper": 10}}}},
        {"epsilon": 1000, "delta": 1e-6, **(budget or {})}))


def _cells(policy: Path, sql: str) -> tuple[dict, object]:
    session = PrivateSession(policy, "tester", rng=seeded(1), bounding_seed=4)
    try:
        prepared = session.prepare(sql)
        rows = session.engine.run(prepared.bounded.sql)
        keys = len(prepared.plan.query.keys)
        return {row[:keys]: row[keys:] for row in rows}, prepared.plan
    finally:
        session.close()


@pytest.mark.parametrize(("bounds", "l1", "l2_squared"), [
    ({"max_groups_per_unit": 2, "max_rows_per_group": 1}, 2, 2),
    ({"max_groups_per_unit": 3}, 6, 36),  # r = m: 6 rows may fall in one group
    ({"max_rows_per_group": 2}, 6, 12),  # k = m: three groups of two
    ({"max_groups_per_unit": 4, "max_rows_per_group": 2}, 6, 12),
])
def test_one_unit_moves_the_cells_by_at_most_the_claimed_sensitivity(tmp_path: Path, bounds: dict, l1: int,
                                                                     l2_squared: int) -> None:
    """Neighbouring tables: a victim with 12 rows over 6 groups, two in each (more than every bound), is removed.
    Each group's count moves by the victim's kept rows there: their sum is the plan's L1 (tight) and their squares'
    sum at most its L2 squared (tight except where r = m, which two rows per group cannot reach)."""
    base = [(u, GROUPS[u % 12], "a", float(u % 10)) for u in range(1, 300)]
    victim = [(0, GROUPS[i % 6], "a", 9.0) for i in range(12)]
    found = []
    for name, rows in (("with", base + victim), ("without", base)):
        folder = tmp_path / name
        folder.mkdir()
        cells, plan = _cells(_policy(folder, rows, bounds), "SELECT g, COUNT(*) FROM t GROUP BY g")
        found.append({key: value[0] for key, value in cells.items()})
        (measurement,) = plan.measurements
        assert measurement.sensitivity == l1 and contribution(plan.query).l2_squared == l2_squared
    moved = [found[0].get(key, 0) - found[1].get(key, 0) for key in found[0].keys() | found[1].keys()]
    assert sum(moved) == l1 and sum(c * c for c in moved) == min(l2_squared, 12)
    assert max(moved) <= bounds.get("max_rows_per_group", 6) and sum(c > 0 for c in moved) <= bounds.get(
        "max_groups_per_unit", 6)


def test_gaussian_noise_shrinks_with_the_bounds_and_laplace_with_l1(tmp_path: Path) -> None:
    rows = [(u, GROUPS[u % 12], "a", 1.0) for u in range(50)]
    stds = {}
    for label, bounds in (("none", {}), ("k2r1", {"max_groups_per_unit": 2, "max_rows_per_group": 1})):
        for mechanism in ("gaussian", "laplace"):
            folder = tmp_path / f"{label}-{mechanism}"
            folder.mkdir()
            budget = {"accounting": "zcdp", "mechanism": mechanism}
            _, plan = _cells(_policy(folder, rows, bounds, budget), "SELECT g, COUNT(*) FROM t GROUP BY g")
            stds[label, mechanism] = plan.measurements[0].std
    assert stds["k2r1", "gaussian"] == pytest.approx(stds["none", "gaussian"] * math.sqrt(2) / 6, rel=1e-9)
    assert stds["k2r1", "laplace"] < stds["none", "laplace"] / 2.5  # L1 2 against 6, discrete


def test_the_bounds_apply_to_grouped_single_table_queries_only(tmp_path: Path) -> None:
    policy = _policy(tmp_path, [(u, "g1", "a", 1.0) for u in range(20)],
                     {"max_groups_per_unit": 1, "max_rows_per_group": 1})
    _, grouped = _cells(policy, "SELECT g, COUNT(*) FROM t GROUP BY g")
    _, total = _cells(policy, "SELECT COUNT(*) FROM t")
    _, selected = _cells(policy, "SELECT h, COUNT(*) FROM t GROUP BY h")
    assert grouped.measurements[0].sensitivity == 1 and total.measurements[0].sensitivity == 6
    assert selected.measurements[0].sensitivity == 1
    # the threshold of partition selection for one row in one group is far below the one for six
    _, unbounded = _cells(_policy(tmp_path / ".." / tmp_path.name, [(u, "g1", "a", 1.0) for u in range(20)], {}),
                          "SELECT h, COUNT(*) FROM t GROUP BY h")
    assert selected.selection.threshold < unbounded.selection.threshold


@pytest.mark.parametrize(("bounds", "message"), [
    ({"max_groups_per_unit": 0}, "between 1 and max_rows_per_unit"),
    ({"max_rows_per_group": 7}, "between 1 and max_rows_per_unit"),
    ({"max_rows_per_group": "2"}, "max_rows_per_group"),
])
def test_a_bad_bound_is_a_clear_policy_error(tmp_path: Path, bounds: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy(_policy(tmp_path, [(1, "g1", "a", 1.0)], bounds))


@pytest.mark.parametrize("unit", [Contribution(6, 2, 2, True), Contribution(6, 6, 1, True),
                                  Contribution(5, 3, 4, True)])
@pytest.mark.parametrize("delta", [1e-5, 1e-12])
def test_the_threshold_bounds_every_spread_of_a_unit_by_delta(unit: Contribution, delta: float) -> None:
    """Computed exactly (mpmath): whichever way the unit spreads its rows under the bounds, the chance that one of
    the groups only it supports is released is at most delta."""
    mechanism = LaplaceMechanism(unit.l1, 0.5)
    tau = _threshold(mechanism, unit, delta)
    worst = max(sum(tail(mechanism, tau - c) for c in spread)
                for spread in _spreads(unit.max_rows, unit.groups, unit.rows_per_group))
    assert worst <= mpmath.mpf(delta)
