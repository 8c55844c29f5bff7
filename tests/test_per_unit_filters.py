"""Columns declared `per_unit` (one value for all of a unit's rows, checked at load) let a filtered query cap each
unit by the rank prepared at load instead of ranking the filtered rows again (issue 16).

Capping before a filter is private whatever the filter: each unit keeps at most m rows, chosen by its own rows. A
filter on per-unit columns keeps all of a unit's rows or none, so it is also the same answer as capping after it.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot.expressions import Window as _Window

from benchmarks.support import sql_tree, write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import PolicyError
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse
from tests.sizes import cases

QUERIES = [
    "SELECT COUNT(*), SUM(x) FROM t WHERE band = 1",
    "SELECT grp, COUNT(*), AVG(x) FROM t WHERE band <> 0 AND pid > 2 GROUP BY grp",
    "SELECT COUNT(DISTINCT pid), COUNT(x) FROM t WHERE band IN (0, 2)",
]


def _write(folder: Path, units: list[list[tuple]], m: int, per_unit: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # band is a function of the unit: the same on all of its rows
    rows = [(pid, pid % 3, g, x) for pid, unit_rows in enumerate(units, start=1) for g, x in unit_rows]
    write_csv(folder / "t.csv", ["pid", "band", "grp", "x"], rows)
    return write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "band": {"type": "int", "per_unit": per_unit},
                    "grp": {"type": "text", "values": ["a", "b"]}, "x": {"type": "float", "lower": 0, "upper": 10}}}})


def _run(policy_path: Path, sql: str, seed: int):
    policy = load_policy(policy_path)
    query_plan = plan(check(parse(sql), policy, VOCABULARY),
                      Budget(Fraction(1), Fraction(1, 10**8), Accounting.PURE, MechanismKind.LAPLACE))
    engine = DuckDBEngine(policy, bounding_seed=seed)
    try:
        bounded = rewrite(query_plan).sql
        rows = engine.run(bounded)
    finally:
        engine.close()
    keys = len(query_plan.query.keys)
    return query_plan, bounded, {tuple(r[:keys]): [int(v or 0) for v in r[keys:]] for r in rows}


unit_rows = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.one_of(st.none(), st.floats(0, 10))), max_size=6)


@settings(max_examples=cases(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(unit_rows, min_size=1, max_size=6), m=st.integers(1, 3), removed=st.integers(0, 5),
       query=st.sampled_from(QUERIES), seed=st.integers(0, 2**31))
def test_the_load_time_cap_keeps_the_sensitivity_and_the_answer(tmp_path_factory, units, m, removed, query,
                                                                seed) -> None:
    removed %= len(units)
    base = tmp_path_factory.mktemp("d")
    with_unit = _write(base / "with", units, m)
    without = _write(base / "without", [u if i != removed else [] for i, u in enumerate(units)], m)
    query_plan, bounded, full = _run(with_unit, query, seed)
    _, _, neighbour = _run(without, query, seed)
    assert not list(sql_tree(bounded).find_all(_Window))  # no ranking per query: the load-time rank caps
    for j, measurement in enumerate(query_plan.measurements):
        change = sum(abs(full.get(g, [0] * 9)[j] - neighbour.get(g, [0] * 9)[j]) for g in set(full) | set(neighbour))
        assert change <= measurement.sensitivity, (query, measurement.spec.label, change)
    # The same exact answer as capping after the filter (band not declared per_unit: the filtered rows re-ranked).
    _, slow, after = _run(_write(base / "slow", units, m, per_unit=False), query, seed)
    assert list(sql_tree(slow).find_all(_Window)) and after == full


def test_a_per_unit_column_that_varies_within_a_unit_is_refused_at_load(tmp_path: Path) -> None:
    write_csv(tmp_path / "t.csv", ["pid", "band", "grp", "x"], [(1, 0, "a", 1.0), (1, 1, "b", 2.0), (2, 0, "a", 3.0)])
    path = write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
        "columns": {"pid": {"type": "int"}, "band": {"type": "int", "per_unit": True},
                    "grp": {"type": "text"}, "x": {"type": "float", "lower": 0, "upper": 10}}}})
    with pytest.raises(PolicyError, match="table 't', key 'columns.band': declared per_unit = true, but some unit"):
        DuckDBEngine(load_policy(path))


def test_a_filter_on_other_columns_still_caps_after_filtering(tmp_path: Path) -> None:
    path = _write(tmp_path, [[("a", 1.0), ("b", 2.0)]], 1)
    _, bounded, _ = _run(path, "SELECT COUNT(*) FROM t WHERE band = 1 AND x > 1", 1)
    assert list(sql_tree(bounded).find_all(_Window))

