"""A per-unit SUM or AVG of a bare bounded column reads the fixed-point integers the loader computed for it
(`__dp_q_<col>`, analysis/per_unit.loaded_steps) instead of computing them per row again. Checked here: the
per-unit values are exactly those the per-row computation gives, on generated units with values outside the
bounds, NULLs, zeros of both signs and fractions of the grid step."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from benchmarks.support import write_csv, write_policy
from dpsql.analysis import per_unit
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import load_policy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT, parse
from tests.sizes import cases

_values = st.one_of(st.none(), st.sampled_from([-0.0, 0.0, 7.5, -9.0, 1e-9, 2.0 / 3.0]),
                    st.floats(-12, 12, allow_nan=False))


@settings(max_examples=cases(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(_values, min_size=1, max_size=6), min_size=1, max_size=15), m=st.integers(1, 4))
def test_per_unit_sums_of_the_loaded_integers_are_the_per_row_ones(tmp_path_factory, monkeypatch, units, m) -> None:
    folder = tmp_path_factory.mktemp("sums")
    write_csv(folder / "t.csv", ["pid", "x"], [(pid, x) for pid, xs in enumerate(units, start=1) for x in xs])
    policy = load_policy(write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": -5, "upper": 5}}}}))
    engine = DuckDBEngine(policy)
    try:
        for aggregate in ("SUM(x)", "AVG(x)"):
            sql = f"SELECT COUNT(*) FROM (SELECT pid, {aggregate} AS s FROM t GROUP BY pid) AS u"

            def per_unit_rows(sql: str = sql) -> tuple[exp.Select, list[tuple]]:
                relation = check(parse(sql), policy, VOCABULARY).relation
                assert relation is not None
                return relation.sql, sorted(engine.run(relation.sql.sql(DIALECT)), key=repr)

            loaded_sql, loaded = per_unit_rows()
            assert names.quantized_column("x") in {c.name for c in loaded_sql.find_all(exp.Column)}
            with monkeypatch.context() as patched:
                patched.setattr(per_unit, "loaded_steps", lambda *_: None)
                computed_sql, computed = per_unit_rows()
            assert names.quantized_column("x") not in {c.name for c in computed_sql.find_all(exp.Column)}
            assert loaded == computed, aggregate
    finally:
        engine.close()


@settings(max_examples=cases(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(st.one_of(st.none(), st.integers(-20, 20)), min_size=1, max_size=6), min_size=1,
                      max_size=15), m=st.integers(1, 4), seed=st.one_of(st.none(), st.integers(0, 2**31)))
def test_per_unit_sums_are_exact(tmp_path_factory, units, m, seed) -> None:
    """Integers in [-5, 5] lie on the fixed-point grid: a unit's SUM and AVG of its clamped kept values is then the
    exact one (a center off by one grid step, or a value summed twice, fails it)."""
    folder = tmp_path_factory.mktemp("exact")
    write_csv(folder / "t.csv", ["pid", "x"], [(pid, x) for pid, xs in enumerate(units, start=1) for x in xs])
    policy = load_policy(write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": -5, "upper": 5}}}}))
    engine = DuckDBEngine(policy, bounding_seed=seed)
    try:
        kept: dict[int, list[float]] = {}
        for unit, x in engine._con.execute(f"SELECT {names.UNIT}, x FROM {names.prepared_table('t')} WHERE "
                                           f"{names.RANK} <= {m}").fetchall():
            kept.setdefault(unit, [])
            if x is not None:
                kept[unit].append(min(max(x, -5.0), 5.0))
        for aggregate, exact in (("SUM(x)", lambda xs: float(sum(xs)) if xs else None),
                                 ("AVG(x)", lambda xs: float(sum(xs)) / len(xs) if xs else None)):
            relation = check(parse(f"SELECT COUNT(*) FROM (SELECT pid, {aggregate} AS s FROM t GROUP BY pid) AS u"),
                             policy, VOCABULARY).relation
            assert relation is not None
            found = engine._con.execute(f"SELECT {names.UNIT}, s FROM ({relation.sql.sql(DIALECT)})").fetchall()
            assert dict(found) == {unit: exact(xs) for unit, xs in kept.items()}, aggregate
    finally:
        engine.close()
