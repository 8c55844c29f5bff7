"""Property: removing one unit's rows moves each measurement by at most the sensitivity the plan reports.

The measurement is what the noise is added to: the exact integer vector over groups that the bounded SQL returns.
Its L1 change between neighbouring datasets (one unit's rows removed) must not exceed `Measurement.sensitivity`,
which is also what `explain` prints (times the grid step). Both datasets are loaded with the same bounding salt,
as the mechanism's randomness is shared between the two worlds of the DP definition.
"""

from __future__ import annotations

import itertools
import tempfile
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.support import write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import QueryRejected
from dpsql.frontends.explain import explain
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse
from tests.sizes import cases

QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT COUNT(x), SUM(x), AVG(x) FROM t",
    "SELECT grp, COUNT(*), SUM(x), AVG(x) FROM t GROUP BY grp",
    "SELECT grp, VAR_POP(x), STDDEV(x) FROM t WHERE k > 2 GROUP BY grp",
    "SELECT grp, COUNT(DISTINCT pid) FROM t GROUP BY grp",
    "SELECT city, COUNT(*), SUM(x) FROM t GROUP BY city",  # undeclared keys: partition selection
    "SELECT k > 3, SUM(x * k) FROM t WHERE x IS NOT NULL GROUP BY k > 3",
    "SELECT SUM(CASE WHEN grp = 'a' THEN x ELSE 0 END) FROM t",
    "SELECT grp, city, SUM(k) FROM t WHERE grp <> 'c' GROUP BY grp, city",
    # x is nullable: COUNT(*) is measured as the disjoint counts of rows where x is NULL and where it is not
    "SELECT COUNT(*), AVG(x) FROM t",
    "SELECT grp, COUNT(*), COUNT(x), STDDEV(x) FROM t WHERE k < 8 GROUP BY grp",
    # COUNT(DISTINCT expr): a unit removes at most its m capped rows' values, none added
    "SELECT grp, COUNT(DISTINCT city), COUNT(DISTINCT k % 3) FROM t GROUP BY grp",
    "SELECT COUNT(DISTINCT x), APPROX_COUNT_DISTINCT(city), SUM(x) FROM t WHERE k > 1",
]

row = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),  # "d" is outside grp's public values
    st.sampled_from(["x", "y", "z"]),
    st.one_of(st.none(), st.floats(min_value=-50, max_value=50, allow_nan=False)),
    st.integers(min_value=0, max_value=9),
)
datasets = st.lists(st.lists(row, max_size=7), min_size=1, max_size=6)  # per unit, its rows


def _write(folder: Path, units: list[list[tuple]], m: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(pid, *r) for pid, unit_rows in enumerate(units, start=1) for r in unit_rows]
    write_csv(folder / "t.csv", ["pid", "grp", "city", "x", "k"], rows)
    return write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                    "city": {"type": "text"}, "x": {"type": "float", "lower": -5, "upper": 10},
                    "k": {"type": "int", "lower": 0, "upper": 9, "nullable": False}}}})


def measurements(policy_path: Path, sql: str, seed: int, mechanism: MechanismKind = MechanismKind.LAPLACE):
    """The plan of `sql` and its exact measurements per group (keys -> integers), bounded with this row seed."""
    policy = load_policy(policy_path)
    accounting = Accounting.ZCDP if mechanism is MechanismKind.GAUSSIAN else Accounting.PURE
    query_plan = plan(check(parse(sql), policy, VOCABULARY),
                      Budget(Fraction(1), Fraction(1, 10**8), accounting, mechanism))
    engine = DuckDBEngine(policy, bounding_seed=seed)
    try:
        rows = engine.run(rewrite(query_plan).sql)
    finally:
        engine.close()
    keys = len(query_plan.query.keys)
    return query_plan, {tuple(r[:keys]): [int(v or 0) for v in r[keys:]] for r in rows}


# Issue 36: sums and averages over distinct values (a unit removes at most its rows' values, adds none), and the
# units with a row where a condition holds (COUNT(DISTINCT unit) FILTER (WHERE c), as normalize.py writes it).
DISTINCT_QUERIES = [
    "SELECT grp, SUM(DISTINCT x), AVG(DISTINCT k), SUM(DISTINCT k) FROM t GROUP BY grp",
    "SELECT city, AVG(DISTINCT x), COUNT(DISTINCT CASE WHEN k > 3 THEN pid END) FROM t GROUP BY city",
    "SELECT COUNT(DISTINCT CASE WHEN k > 3 THEN pid END), COUNT(DISTINCT CASE WHEN x > 0 THEN city END), "
    "SUM(DISTINCT x * 2), COUNT(*) FROM t",
    "SELECT grp, SUM(DISTINCT k), SUM(k), AVG(DISTINCT k), AVG(k), COUNT(k) FROM t WHERE x IS NOT NULL GROUP BY grp",
]


@pytest.mark.slow  # a property test of many generated cases: the full suite runs it
@settings(max_examples=cases(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=datasets, m=st.integers(1, 3), removed=st.integers(0, 5),
       query=st.sampled_from(QUERIES + DISTINCT_QUERIES), seed=st.integers(0, 2**31))
def test_one_unit_moves_each_measurement_by_at_most_its_sensitivity(tmp_path_factory, units, m, removed, query,
                                                                   seed) -> None:
    _moves_within_sensitivity(tmp_path_factory, units, m, removed, query, seed)


def _moves_within_sensitivity(tmp_path_factory, units, m, removed, query, seed) -> None:
    removed %= len(units)
    base = tmp_path_factory.mktemp("d")
    with_unit = _write(base / "with", units, m)
    without = _write(base / "without", [u if i != removed else [] for i, u in enumerate(units)], m)
    query_plan, full = measurements(with_unit, query, seed)
    _, neighbour = measurements(without, query, seed)
    text = explain(query_plan)
    items: dict[tuple, int] = {}
    for j, measurement in enumerate(query_plan.measurements):
        change = sum(abs(full.get(g, [0] * 99)[j] - neighbour.get(g, [0] * 99)[j])
                     for g in set(full) | set(neighbour))
        assert change <= measurement.sensitivity, (query, measurement.spec.label, change, measurement.sensitivity)
        shown = f"{measurement.sensitivity * float(measurement.spec.step):.4g}"
        assert shown in text  # explain reports the sensitivity that holds
        items[measurement.spec.budget_item] = items.get(measurement.spec.budget_item, 0) + change
    # Measurements that spend one share together (counts of disjoint rows) move by at most the sensitivity jointly.
    for measurement in query_plan.measurements:
        assert items[measurement.spec.budget_item] <= measurement.sensitivity, (query, measurement.spec.label)


def test_the_worst_case_unit_reaches_the_sensitivity(tmp_path: Path) -> None:
    """The bound is tight: a unit with m rows at the upper clamp moves COUNT by m and a sum by m * bound, less the
    one grid step per row that fixed_point keeps as slack for the engine's float rounding; a pair's two sums (SUM
    and COUNT from x - lo and hi - x) move by m * (hi - lo) together, exactly."""
    units = [[("a", "x", 10.0, 9)] * 3, [("b", "y", 1.0, 1)]]
    with_unit, without = _write(tmp_path / "w", units, 2), _write(tmp_path / "o", [[], units[1]], 2)
    for sql in ("SELECT SUM(k), COUNT(*) FROM t", "SELECT SUM(k) FROM t", "SELECT COUNT(*) FROM t"):
        query_plan, full = measurements(with_unit, sql, 1)
        _, neighbour = measurements(without, sql, 1)
        changes = [abs(a - b) for a, b in zip(*itertools.chain(full.values(), neighbour.values()), strict=True)]
        items: dict[tuple, int] = {}
        for change, measurement in zip(changes, query_plan.measurements, strict=True):
            items[measurement.spec.budget_item] = items.get(measurement.spec.budget_item, 0) + change
        for measurement in query_plan.measurements:
            joint = items[measurement.spec.budget_item]
            assert measurement.sensitivity - query_plan.max_rows <= joint <= measurement.sensitivity, sql


# A bounded argument measured as a pair (measurements.Pair): ABOVE = SUM(x - lo), BELOW = SUM(hi - x) and, beside a
# nullable x, (COUNT(*) - COUNT(x)) * (hi - lo) share one budget item, each calibrated to the whole item's change.
# The generated class: values at, beyond and far beyond the bounds, NaN, +-inf, -0.0 and NULL; narrow, degenerate,
# huge and sign-straddling bounds; a never-NULL argument (COUNT(*) from its pair), expressions, booleans, literals;
# WHERE, public and private keys, per-group caps; Laplace (L1), Laplace under zCDP, Gaussian (L2 of the item).
PAIR_BOUNDS = [(-5.0, 10.0), (0.0, 0.0), (3.0, 3.0), (-1e15, 1e15), (1e15 - 1, 1e15), (-2.0, -1.0), (0.0, 1.0),
               (-1e-9, 1e-9)]
PAIR_QUERIES = [
    "SELECT COUNT(*), SUM(x), AVG(x) FROM t",
    "SELECT COUNT(*), COUNT(x), SUM(x), AVG(y), SUM(y) FROM t",
    "SELECT grp, COUNT(*), COUNT(x), SUM(x), AVG(x) FROM t WHERE k > 2 GROUP BY grp",
    "SELECT city, SUM(x), AVG(x), AVG(y) FROM t GROUP BY city",  # undeclared keys: partition selection
    "SELECT COUNT(*), SUM(x * 2), AVG(x * 2), SUM(CASE WHEN grp = 'a' THEN y END) FROM t",
    "SELECT grp, COUNT(*), SUM(k), AVG(k), SUM(y), AVG(x), COUNT(x) FROM t GROUP BY grp",
    "SELECT COUNT(*), SUM(1), AVG(x > 1), SUM(x > 1), AVG(y) FROM t",
    "SELECT grp, COUNT(*), AVG(x), VAR_POP(x), SUM(x) FROM t GROUP BY grp",
]
PAIR_BUDGETS = {"laplace": (Accounting.PURE, MechanismKind.LAPLACE), "zcdp laplace": (Accounting.ZCDP,
                MechanismKind.LAPLACE), "gaussian": (Accounting.ZCDP, MechanismKind.GAUSSIAN)}
_special = st.sampled_from([None, float("nan"), float("inf"), float("-inf"), -0.0, 1e300, -1e300])
pair_row = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["x", "y"]),
    st.one_of(_special, st.floats(-3, 3), st.sampled_from(["lo", "hi"])),  # x: "lo"/"hi" are the bounds
    st.one_of(_special, st.floats(-3, 3), st.sampled_from(["lo", "hi"])),  # y: NULL and NaN rows are dropped
    st.integers(min_value=0, max_value=9))


def _pair_dataset(folder: Path, units: list[list[tuple]], m: int, bounds: tuple, caps: tuple | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (lo, hi), (ylo, yhi) = bounds

    def value(v, low, high):
        return {"lo": low, "hi": high}.get(v, v) if isinstance(v, str) else v
    rows = [(pid, g, c, value(x, lo, hi), value(y, ylo, yhi), k)
            for pid, unit_rows in enumerate(units, start=1) for g, c, x, y, k in unit_rows]
    write_csv(folder / "t.csv", ["pid", "grp", "city", "x", "y", "k"], rows)
    table = {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
             "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                         "city": {"type": "text"}, "x": {"type": "float", "lower": lo, "upper": hi},
                         "y": {"type": "float", "lower": ylo, "upper": yhi, "nullable": False},
                         "k": {"type": "int", "lower": 0, "upper": 9, "nullable": False}}}
    if caps is not None:
        table["max_groups_per_unit"], table["max_rows_per_group"] = (min(c, m) for c in caps)
    return write_policy(folder / "p.toml", {"t": table})


@settings(max_examples=cases(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(pair_row, max_size=6), min_size=1, max_size=5), m=st.integers(1, 4),
       removed=st.integers(0, 4), query=st.sampled_from(PAIR_QUERIES), budget=st.sampled_from(list(PAIR_BUDGETS)),
       bounds=st.tuples(st.sampled_from(PAIR_BOUNDS), st.sampled_from(PAIR_BOUNDS)),
       caps=st.sampled_from([None, (1, 1), (2, 1), (1, 2), (2, 2)]))
@pytest.mark.slow  # a property test of many generated cases: the full suite runs it
def test_a_pair_moves_by_at_most_its_sensitivity_jointly(tmp_path_factory, units, m, removed, query, budget, bounds,
                                                         caps) -> None:
    removed %= len(units)
    base = tmp_path_factory.mktemp("pair")
    worlds = [_pair_dataset(base / name, us, m, bounds, caps)
              for name, us in (("with", units), ("without", [u if i != removed else [] for i, u in
                                                             enumerate(units)]))]
    accounting, mechanism = PAIR_BUDGETS[budget]
    measured = []
    for policy_path in worlds:
        policy = load_policy(policy_path)
        try:
            checked = check(parse(query), policy, VOCABULARY)
        except QueryRejected:  # x * 2 beyond what can be summed exactly, with the huge bounds: for any data
            return
        query_plan = plan(checked, Budget(Fraction(1), Fraction(1, 10**8), accounting, mechanism))
        engine = DuckDBEngine(policy, bounding_seed=3)
        try:
            rows = engine.run(rewrite(query_plan).sql)
        finally:
            engine.close()
        keys = len(query_plan.query.keys)
        measured.append((query_plan, {tuple(r[:keys]): [int(v or 0) for v in r[keys:]] for r in rows}))
    (query_plan, full), (_, neighbour) = measured
    l1: dict[tuple, int] = {}
    l2: dict[tuple, int] = {}
    for j, measurement in enumerate(query_plan.measurements):
        for g in set(full) | set(neighbour):
            change = abs(full.get(g, [0] * 99)[j] - neighbour.get(g, [0] * 99)[j])
            l1[measurement.spec.budget_item] = l1.get(measurement.spec.budget_item, 0) + change
            l2[measurement.spec.budget_item] = l2.get(measurement.spec.budget_item, 0) + change**2
    for measurement in query_plan.measurements:
        item = measurement.spec.budget_item
        if mechanism is MechanismKind.GAUSSIAN:
            squared = measurement.mechanism.squared or measurement.sensitivity**2
            assert l2.get(item, 0) <= squared, (query, bounds, measurement.spec.label, l2.get(item), squared)
        else:
            assert l1.get(item, 0) <= measurement.sensitivity, (query, bounds, measurement.spec.label, l1.get(item))


def test_the_pair_class_measures_pairs() -> None:
    """The generated class above tests pairs: with Laplace noise each of its queries has one but VAR's, whose count
    and centered sum the planner shares with AVG and SUM instead (its choice depends on the query and policy only)."""
    for query in [q for q in PAIR_QUERIES if "VAR_POP" not in q]:
        policy = load_policy(_pair_dataset(Path(tempfile.mkdtemp()), [[("a", "x", 1.0, 1.0, 1)]], 2,
                                           (PAIR_BOUNDS[0], PAIR_BOUNDS[0]), None))
        query_plan = plan(check(parse(query), policy, VOCABULARY),
                          Budget(Fraction(1), Fraction(1, 10**8), Accounting.PURE, MechanismKind.LAPLACE))
        assert any(m.spec.paired for m in query_plan.measurements), query
