"""The cap after a row filter (rewrite/bounding.cap_rows): each unit keeps its first m filtered rows in the order of
the secret row hash. Checked against that definition computed in Python from the prepared table, on generated units
(some with more rows than m, some with fewer) and filters, for row counts and distinct values per group."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.support import write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql import names
from dpsql.sql.parse import parse

units = st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 9)), max_size=8),
                 min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=units, m=st.integers(1, 4), threshold=st.integers(-1, 9), seed=st.integers(0, 2**31))
def test_the_filtered_cap_keeps_each_unit_s_first_m_filtered_rows(tmp_path_factory, units, m, threshold,
                                                                   seed) -> None:
    folder = tmp_path_factory.mktemp("cap")
    rows = [(pid, g, v) for pid, unit in enumerate(units, start=1) for g, v in unit]
    write_csv(folder / "t.csv", ["pid", "grp", "v"], rows)
    policy = load_policy(write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                    "v": {"type": "int", "lower": 0, "upper": 9}}}}))
    engine = DuckDBEngine(policy, bounding_seed=seed)
    try:
        prepared = engine._con.execute(f"SELECT {names.UNIT}, {names.RANK}, grp, v FROM "
                                       f"{names.prepared_table('t')}").fetchall()
        budget = Budget(Fraction(1), Fraction(0), Accounting.PURE, MechanismKind.LAPLACE)
        found = {}
        for sql in (f"SELECT grp, COUNT(*) FROM t WHERE v > {threshold} GROUP BY grp",
                    f"SELECT grp, COUNT(DISTINCT v) FROM t WHERE v > {threshold} GROUP BY grp"):
            bounded = rewrite(plan(check(parse(sql), policy, VOCABULARY), budget)).sql
            found[sql] = {g: n for g, n in engine.run(bounded)}
    finally:
        engine.close()
    kept: dict[int, list[tuple]] = {}
    for unit, _rank, grp, v in sorted(prepared, key=lambda r: (r[0], r[1])):  # in each unit's rank order
        if v > threshold and len(kept.setdefault(unit, [])) < m:
            kept[unit].append((grp, v))
    expected_rows, expected_values = {}, {}
    for unit_rows in kept.values():
        for grp, v in unit_rows:
            expected_rows[grp] = expected_rows.get(grp, 0) + 1
            expected_values.setdefault(grp, set()).add(v)
    counts, distinct = found.values()
    assert {g: n for g, n in counts.items() if n} == expected_rows
    assert {g: n for g, n in distinct.items() if n} == {g: len(v) for g, v in expected_values.items()}
