"""Property: through joins, removing one unit's rows moves each measurement by at most the plan's sensitivity.

As tests/test_sensitivity.py, over two private tables with the same unit (t and u) and a public lookup table whose
join key is not unique (one-to-many: a private row meets up to k public rows). The public table is the same in both
worlds: public data are not part of what DP protects. Covers private x public (inner, left, filtered, grouped by a
public column), private x private on the unit, a self-join, and per-unit aggregation (FROM a subquery grouped by
the unit: one row per unit, derived values bounded by the cap).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.support import write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.frontends.explain import explain
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse
from tests.sizes import cases

QUERIES = [
    "SELECT COUNT(*), SUM(l.weight) FROM t JOIN look l ON t.city = l.city",
    "SELECT l.region, COUNT(*), SUM(t.x) FROM t JOIN look l ON t.city = l.city GROUP BY l.region",
    "SELECT l.region, COUNT(*), AVG(t.k) FROM t LEFT JOIN look l ON t.city = l.city GROUP BY l.region",
    "SELECT COUNT(*) FROM t JOIN look l ON t.city = l.city WHERE l.weight > 1 AND t.k < 7",
    "SELECT COUNT(DISTINCT t.pid), COUNT(*) FROM t JOIN look l ON l.city = t.city",
    "SELECT t.grp, COUNT(*), SUM(u.y) FROM t JOIN u ON t.pid = u.pid GROUP BY t.grp",
    "SELECT COUNT(*), SUM(a.k) FROM t a JOIN t b ON a.pid = b.pid",
    "SELECT l.region, COUNT(*) FROM look l JOIN t ON t.city = l.city JOIN u ON u.pid = t.pid GROUP BY l.region",
    "SELECT l.region, SUM(u.y) FROM t JOIN u ON u.pid = t.pid JOIN look l ON l.city = t.city GROUP BY l.region",
    # per-unit aggregation: one derived row per unit, bounded by the cap
    "SELECT n, COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) AS p GROUP BY n",
    "SELECT SUM(s), AVG(a) FROM (SELECT pid, SUM(x) AS s, AVG(k) AS a FROM t WHERE grp <> 'c' GROUP BY pid) p",
    "SELECT top, COUNT(*), SUM(n) FROM (SELECT pid, MAX(k) AS top, COUNT(x) AS n FROM t GROUP BY pid) p "
    "WHERE n > 0 GROUP BY top",
    "SELECT COUNT(*), SUM(lo) FROM (SELECT pid, MIN(x) AS lo FROM t GROUP BY pid) p WHERE lo < 3",
    "SELECT SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid HAVING SUM(x) > 2 OR MAX(k) = 9) p",
    # a per-unit subquery over a one-to-many join: at most m * k joined rows per unit before the per-unit aggregates
    "SELECT n, COUNT(*), SUM(w) FROM (SELECT t.pid, COUNT(*) AS n, SUM(l.weight) AS w FROM t "
    "JOIN look l ON t.city = l.city GROUP BY t.pid) p GROUP BY n",
    # a per-unit subquery joined to a private table of its unit (m = 1 * 2) and to a public one
    "SELECT COUNT(*), SUM(p.n), SUM(u.y) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) p "
    "JOIN u ON u.pid = p.pid",
    "SELECT l.region, COUNT(*), SUM(p.top) FROM (SELECT pid, MAX(k) AS top FROM t GROUP BY pid) p "
    "JOIN t ON t.pid = p.pid JOIN look l ON l.city = t.city GROUP BY l.region",
]

LOOKUP = [("x", 1, "n"), ("x", 3, "s"), ("y", 2, "n"), ("w", 5, "s")]  # city x: two rows, so k = 2

t_row = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["x", "y", "z"]),  # z meets no lookup row
    st.one_of(st.none(), st.floats(min_value=-50, max_value=50, allow_nan=False)),
    st.integers(min_value=0, max_value=9),
)
u_row = st.integers(min_value=-2, max_value=8)
datasets = st.lists(st.tuples(st.lists(t_row, max_size=5), st.lists(u_row, max_size=3)), min_size=1, max_size=5)


def _write(folder: Path, units: list[tuple[list[tuple], list[int]]], m: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "t.csv", ["pid", "grp", "city", "x", "k"],
              [(pid, *r) for pid, (rows, _) in enumerate(units, start=1) for r in rows])
    write_csv(folder / "u.csv", ["pid", "y"], [(pid, y) for pid, (_, ys) in enumerate(units, start=1) for y in ys])
    write_csv(folder / "look.csv", ["city", "weight", "region"], LOOKUP)
    return write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "unit": "person", "max_rows_per_unit": m,
              "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                          "city": {"type": "text"}, "x": {"type": "float", "lower": -5, "upper": 10},
                          "k": {"type": "int", "lower": 0, "upper": 9, "nullable": False}}},
        "u": {"source": "u.csv", "privacy_unit": "pid", "unit": "person", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "y": {"type": "int", "lower": 0, "upper": 5}}},
        "look": {"source": "look.csv", "public": True,
                 "columns": {"city": {"type": "text"}, "weight": {"type": "int"}, "region": {"type": "text"}}}})


def _measurements(policy_path: Path, sql: str, seed: int):
    policy = load_policy(policy_path)
    engine = DuckDBEngine(policy, bounding_seed=seed)
    try:
        query_plan = plan(check(parse(sql), policy, VOCABULARY, engine.public_facts()),
                          Budget(Fraction(1), Fraction(1, 10**8), Accounting.PURE, MechanismKind.LAPLACE))
        rows = engine.run(rewrite(query_plan).sql)
    finally:
        engine.close()
    keys = len(query_plan.query.keys)
    return query_plan, {tuple(r[:keys]): [int(v or 0) for v in r[keys:]] for r in rows}


@pytest.mark.slow  # a property test of many generated cases: the full suite runs it
@settings(max_examples=cases(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=datasets, m=st.integers(1, 3), removed=st.integers(0, 4), query=st.sampled_from(QUERIES),
       seed=st.integers(0, 2**31))
def test_one_unit_moves_each_joined_measurement_by_at_most_its_sensitivity(tmp_path_factory, units, m, removed,
                                                                          query, seed) -> None:
    removed %= len(units)
    base = tmp_path_factory.mktemp("d")
    with_unit = _write(base / "with", units, m)
    without = _write(base / "without", [u if i != removed else ([], []) for i, u in enumerate(units)], m)
    query_plan, full = _measurements(with_unit, query, seed)
    _, neighbour = _measurements(without, query, seed)
    text = explain(query_plan)
    assert "m = " in text  # explain shows how the bound was derived
    items: dict[tuple, int] = {}
    for j, measurement in enumerate(query_plan.measurements):
        change = sum(abs(full.get(g, [0] * 99)[j] - neighbour.get(g, [0] * 99)[j])
                     for g in set(full) | set(neighbour))
        assert change <= measurement.sensitivity, (query, measurement.spec.label, change, measurement.sensitivity)
        items[measurement.spec.budget_item] = items.get(measurement.spec.budget_item, 0) + change
    for measurement in query_plan.measurements:
        assert items[measurement.spec.budget_item] <= measurement.sensitivity, (query, measurement.spec.label)


def test_the_bound_multiplies_the_caps_and_the_rows_per_public_key(tmp_path: Path) -> None:
    """m = m_t * k for a public join (k = 2 rows share city x), m_t * m_u for a private one, m_t^2 for a self-join;
    and the worst case reaches it: a unit with m_t rows in city x has 2 * m_t joined rows."""
    units = [([("a", "x", 1.0, 1)] * 3, [1, 2, 3]), ([("b", "y", 1.0, 1)], [1])]
    policy = _write(tmp_path / "w", units, 2)
    cases = {"SELECT COUNT(*) FROM t JOIN look l ON t.city = l.city": 4,
             "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid": 4,
             "SELECT COUNT(*) FROM t a JOIN t b ON a.pid = b.pid": 4,
             "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid JOIN look l ON l.city = t.city": 8}
    for sql, m in cases.items():
        query_plan, _full = _measurements(policy, sql, 1)
        assert query_plan.max_rows == m, sql
    without = _write(tmp_path / "o", [([], []), units[1]], 2)
    sql = "SELECT COUNT(*) FROM t JOIN look l ON t.city = l.city"
    assert _measurements(policy, sql, 1)[1][()][0] - _measurements(without, sql, 1)[1][()][0] == 4
