"""COUNT(DISTINCT expr) of any column or row expression (planning/aggregates/distinct.py): the exact count of the
distinct non-NULL values among the capped rows, with the sensitivity of a count (m); APPROX_COUNT_DISTINCT is the
same exact count."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import seeded, write_csv, write_policy
from dpsql.errors import QueryRejected
from dpsql.session import PrivateSession
from tests.conftest import create_ledger


def _policy(folder: Path, rows: list[tuple], m: int) -> Path:
    write_csv(folder / "t.csv", ["pid", "grp", "v"], rows)
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b"]}, "v": {"type": "text"}}}},
        {"epsilon": 1000, "query_epsilon": 1})
    return create_ledger(policy)


def _released(policy: Path, sql: str, epsilon: float) -> list[tuple]:
    session = PrivateSession(policy, "tester", rng=seeded(4), bounding_seed=2)
    try:
        result = session.execute(sql, epsilon=epsilon)
        return sorted(result.rows), result.plan
    finally:
        session.close()


def test_the_count_of_distinct_values_over_the_capped_rows(tmp_path: Path) -> None:
    # 40 units, each with 2 rows: values v0..v19 in group a (each value held by two units), and NULLs in b
    rows = [(u, "a", f"v{u % 20}") for u in range(40)] + [(u, "b", None) for u in range(40)]
    policy = _policy(tmp_path, rows, m=2)
    released, plan = _released(policy, "SELECT grp, COUNT(DISTINCT v), APPROX_COUNT_DISTINCT(v) FROM t GROUP BY grp",
                               epsilon=400)
    # sensitivity m = 2 per measurement; at epsilon 400 split in two the Laplace scale is 0.01: rounding is exact
    assert released == [("a", 20, 20), ("b", 0, 0)]
    assert all(m.sensitivity == 2 for m in plan.measurements)


def test_a_unit_can_remove_m_values_and_the_plan_says_so(tmp_path: Path) -> None:
    # one unit holds m = 3 values no one else has: removing it drops the count by 3, the claimed sensitivity
    rows = [(1, "a", "x"), (1, "a", "y"), (1, "b", "z")] + [(u, "a", "common") for u in range(2, 10)]
    policy = _policy(tmp_path, rows, m=3)
    _, plan = _released(policy, "SELECT COUNT(DISTINCT v) FROM t", epsilon=1)
    assert plan.measurements[0].sensitivity == 3


def test_distinct_of_the_unit_keeps_its_own_sensitivity(tmp_path: Path) -> None:
    policy = _policy(tmp_path, [(u, "a", "x") for u in range(5)], m=3)
    _, plan = _released(policy, "SELECT grp, COUNT(DISTINCT pid) FROM t GROUP BY grp", epsilon=1)
    assert plan.measurements[0].sensitivity == 2  # one value per group it reaches: min(m = 3, 2 groups), not m


def test_several_expressions_are_refused(tmp_path: Path) -> None:
    policy = _policy(tmp_path, [(1, "a", "x")], m=1)
    with pytest.raises(QueryRejected, match="takes one expression"):
        _released(policy, "SELECT COUNT(DISTINCT grp, v) FROM t", epsilon=1)
