"""COUNT, SUM and AVG of a bounded argument from its pair of complementary sums, x - lo and hi - x (measurements.Pair).

The privacy of the pair (one unit moves the two sums, and the NULL rows beside them, by at most the sensitivity
together) is checked with every other measurement on neighbouring datasets in test_sensitivity.py and audited in
tests/attacks/test_audit.py. Here: the outputs are the exact answers when the noise is zero, the pair is what makes
the outputs more accurate (the variances it promises), and the released intervals cover 95%.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pytest

from benchmarks.support import (
    DEFAULT_BUDGET,
    GAUSSIAN,
    Budget,
    Table,
    column,
    open_session,
    seeded,
    write_csv,
    write_dataset,
    write_policy,
)
from benchmarks.truth import bounded_truth
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import QueryRejected
from dpsql.planning.aggregates import VOCABULARY, aggregate
from dpsql.planning.aggregates.average import Average
from dpsql.planning.aggregates.total import Sum
from dpsql.planning.measurements import MeasurementKind
from dpsql.planning.plan import Budget as PlanBudget
from dpsql.planning.plan import QueryPlan, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.release.cells import release
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse
from tests.sizes import cases

LEVEL = 0.95
LOWER, UPPER = -20.0, 10.0
SPEC = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b")),
                          column("x", "float", LOWER, UPPER), column("k", "int", 0, 10, nullable=False)), 3)
# Every unit has at most 3 rows, so the cap keeps them all and the truth is plain SQL over the clamped values.
ROWS = [(u, "ab"[u % 2], x, u % 11) for u in range(1, 41)
        for x in ([None, 7.25, -33.0] if u % 5 == 0 else [u * 0.7 - 9.1, 12.5 if u % 3 == 0 else -u / 7])]
QUERIES = {
    "nullable x": ("SELECT g, COUNT(*), COUNT(x), SUM(x), AVG(x) FROM t GROUP BY g",
                   "SELECT g, COUNT(*), COUNT(x), SUM(c), AVG(c) FROM (SELECT *, CASE WHEN x > 10 THEN 10 WHEN x < -20 "
                   "THEN -20 ELSE x END AS c FROM t) GROUP BY g ORDER BY g"),  # DuckDB's LEAST(NULL, 10) is 10
    "k never NULL": ("SELECT g, COUNT(*), SUM(k), AVG(k) FROM t GROUP BY g",
                     "SELECT g, COUNT(*), SUM(k), AVG(k) FROM t GROUP BY g ORDER BY g"),
}


def _prepared(tmp_path: Path, sql: str, budget: Budget = DEFAULT_BUDGET, epsilon: float = 1.0):
    session = open_session(write_dataset(tmp_path, SPEC, ROWS, budget), 5)
    try:
        prepared = session.prepare(sql, epsilon=epsilon)
        return prepared.plan, session.engine.run(prepared.bounded.sql)
    finally:
        session.close()


def _exact_outputs(plan: QueryPlan, rows: list[tuple]) -> np.ndarray:
    """Each output computed from the measurements without noise (the benchmarks' bounded truth: dpsql's release with
    mechanisms that add nothing): groups x outputs, groups in the order of their declared values."""
    return bounded_truth(plan, rows, seeded(0)).values.astype(float)


@pytest.mark.parametrize("case", QUERIES)
def test_without_noise_the_outputs_are_the_exact_answers(tmp_path: Path, case: str) -> None:
    sql, truth_sql = QUERIES[case]
    plan, rows = _prepared(tmp_path, sql)
    assert MeasurementKind.ABOVE in [m.spec.kind for m in plan.measurements], "no pair here: this tests nothing"
    source = f"FROM read_csv({str(tmp_path / 't.csv')!r})"
    truth = duckdb.sql(truth_sql.replace("FROM t", source)).fetchall()
    outputs = _exact_outputs(plan, rows)
    for got, expected in zip(outputs, truth, strict=True):
        # Each value is held on a grid of 2**-29 of its range; the rounding of 120 rows stays far below 1e-6.
        assert np.allclose(got, np.array(expected[1:], dtype=float), rtol=1e-9, atol=1e-6), (got, expected)


def _without_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sum, "pairable", False)
    monkeypatch.setattr(Average, "pairable", False)


def test_the_pair_halves_the_count_variance_and_narrows_every_output(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sql = QUERIES["k never NULL"][0]
    paired, _ = _prepared(tmp_path / "p", sql)
    _without_pairs(monkeypatch)
    apart, _ = _prepared(tmp_path / "a", sql)
    assert not any(m.spec.paired for m in apart.measurements)
    m, epsilon = SPEC.max_rows, 1.0
    count, total, average = paired.recipes
    # COUNT(*) = (ABOVE + BELOW) / (hi - lo), each with Laplace scale m (hi - lo) / epsilon: variance 4 m^2 / eps^2,
    # half that of a count given epsilon / 2 (measured apart, the count got about half of epsilon here: 0.51).
    above = paired.measurements[count.linear[0][1]]
    count_std = above.std * math.sqrt(2) / above.spec.value_point.width
    assert math.isclose(count_std, 2 * m / epsilon, rel_tol=1e-6)
    old_count = apart.measurements[apart.recipes[0].count]
    assert count_std**2 < 0.6 * old_count.std**2 and 0.45 < old_count.share / epsilon < 0.55
    for new, old in ((count, apart.recipes[0]), (total, apart.recipes[1])):
        assert aggregate(new.call).width(new, paired.measurements) < \
            aggregate(old.call).width(old, apart.measurements), new.call.text
    # AVG: the centered sum (ABOVE - BELOW) / 2 and the count are both less noisy than measured apart.
    above, below = average.pair
    centered_std = paired.measurements[above].std / math.sqrt(2)
    assert centered_std < apart.measurements[apart.recipes[2].total].std
    assert paired.measurements[below].std == paired.measurements[above].std


@pytest.mark.parametrize(("budget", "epsilon"), [(DEFAULT_BUDGET, 1.0), (DEFAULT_BUDGET, 0.1), (GAUSSIAN, 1.0)])
def test_the_released_intervals_cover_95_percent(tmp_path: Path, budget: Budget, epsilon: float) -> None:
    plan, rows = _prepared(tmp_path, QUERIES["nullable x"][0], budget, epsilon)
    assert any(m.spec.paired for m in plan.measurements), "no pair here: this tests nothing"
    truth = _exact_outputs(plan, rows)
    runs = cases(4000, floor=1000)
    rng = seeded(11)
    inside, released = np.zeros(truth.shape), np.zeros(truth.shape)
    for _ in range(runs):
        cells = release(plan, rows, rng)
        inside += (cells.lows <= truth) & (truth <= cells.highs)
        released += ~np.isnan(cells.values)  # an AVG whose noisy count rounds to 0 is NULL, without an interval
    coverage = inside / released
    kinds = [r.call.kind for r in plan.recipes]
    for j, kind in enumerate(kinds):
        for g in range(truth.shape[0]):
            assert kind == "avg" or released[g, j] == runs, (kind, g, released[g, j])
            # The count of covering runs among the released ones is binomial: 3.29 standard deviations is a
            # two-sided 0.1% band around 95%.
            band = 3.29 * math.sqrt(LEVEL * (1 - LEVEL) / released[g, j])
            assert coverage[g, j] >= LEVEL - band, (kind, g, coverage[g, j])
            if kind != "avg":  # a linear output's interval is exact; AVG's is clamped to the bounds, so may cover more
                assert coverage[g, j] <= LEVEL + band, (kind, g, coverage[g, j])


# The generated class: zero-noise outputs of every pair-measured query against plain SQL over the clamped values,
# on random data (NULL, NaN, +-inf, -0.0, values at and beyond the bounds) and bounds whose grid ends lie outside
# the declared ones (a degenerate lo = hi, [0, 0], tiny, huge, negative, sign-straddling), grouped and not.
GENERATED_BOUNDS = [(-5.0, 10.0), (0.0, 0.0), (3.0, 3.0), (-1e15, 1e15), (1e15 - 1, 1e15), (-2.0, -1.0), (0.0, 1.0),
                    (-1e-9, 1e-9), (-0.75, 0.25)]
GENERATED_QUERIES = [  # the dpsql query; its truth over c (x clamped, NULL for NULL or NaN) and d (y clamped)
    ("SELECT g, COUNT(*), COUNT(x), SUM(x), AVG(x) FROM t GROUP BY g", "SELECT g, COUNT(*), COUNT(c), SUM(c), AVG(c)"),
    ("SELECT COUNT(*), SUM(y), AVG(y) FROM t", "SELECT COUNT(*), SUM(d), AVG(d)"),
    ("SELECT g, COUNT(*), SUM(x), AVG(y), COUNT(x), SUM(y) FROM t GROUP BY g",
     "SELECT g, COUNT(*), SUM(c), AVG(d), COUNT(c), SUM(d)"),
    ("SELECT COUNT(*), AVG(x), AVG(y), SUM(k), AVG(k) FROM t", "SELECT COUNT(*), AVG(c), AVG(d), SUM(k), AVG(k)"),
    ("SELECT g, COUNT(*), SUM(x), AVG(x) FROM t WHERE k > 3 GROUP BY g",
     "SELECT g, COUNT(*), SUM(c), AVG(c) FROM clamped WHERE k > 3"),
]


def _generated_rows(seed: int, bounds: tuple) -> list[tuple]:
    chooser = random.Random(seed)
    (lo, hi), (ylo, yhi) = bounds

    def value(low: float, high: float) -> float | None:
        return chooser.choice([None, math.nan, math.inf, -math.inf, -0.0, low, high, low - 1e3 - abs(low),
                               high + 1e3 + abs(high), chooser.uniform(low, high), chooser.uniform(low, high)])
    return [(u, chooser.choice("ab"), value(lo, hi), value(ylo, yhi), chooser.randint(0, 9))
            for u in range(1, 13) for _ in range(chooser.randint(1, 4))]


@pytest.mark.parametrize("seed", range(cases(12, floor=3)))
def test_a_generated_class_of_pair_queries_is_exact_without_noise(tmp_path: Path, seed: int) -> None:
    chooser = random.Random(seed)
    bounds = (chooser.choice(GENERATED_BOUNDS), chooser.choice(GENERATED_BOUNDS))
    (lo, hi), (ylo, yhi) = bounds
    rows = _generated_rows(seed, bounds)
    write_csv(tmp_path / "t.csv", ["uid", "g", "x", "y", "k"], rows)
    policy = load_policy(write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "uid", "max_rows_per_unit": 4,  # no unit has more: nothing is capped
        "columns": {"uid": {"type": "int"}, "g": {"type": "text", "values": ["a", "b"]},
                    "x": {"type": "float", "lower": lo, "upper": hi},
                    "y": {"type": "float", "lower": ylo, "upper": yhi, "nullable": False},
                    "k": {"type": "int", "lower": 0, "upper": 9, "nullable": False}}}}))
    plain = duckdb.connect()
    plain.execute("CREATE TABLE t (uid INT, g TEXT, x DOUBLE, y DOUBLE, k INT)")
    plain.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    # The loader drops a row with NULL (or NaN) in y, declared never NULL; clamps are CASEs (DuckDB's LEAST skips NULL)
    plain.execute(f"CREATE VIEW clamped AS SELECT *, CASE WHEN x IS NULL OR isnan(x) THEN NULL WHEN x < {lo!r} THEN "
                  f"{lo!r} WHEN x > {hi!r} THEN {hi!r} ELSE x END AS c, CASE WHEN y < {ylo!r} THEN {ylo!r} WHEN "
                  f"y > {yhi!r} THEN {yhi!r} ELSE y END AS d FROM t WHERE y IS NOT NULL AND NOT isnan(y)")
    paired = 0
    for accounting, mechanism in ((Accounting.PURE, MechanismKind.LAPLACE), (Accounting.ZCDP, MechanismKind.GAUSSIAN)):
        for sql, truth_sql in GENERATED_QUERIES:
            try:
                checked = check(parse(sql), policy, VOCABULARY)
            except QueryRejected:
                continue
            query_plan = plan(checked, PlanBudget(Fraction(1), Fraction(1, 10**8), accounting, mechanism))
            paired += any(m.spec.paired for m in query_plan.measurements)
            engine = DuckDBEngine(policy, bounding_seed=seed)
            try:
                measured = engine.run(rewrite(query_plan).sql)
            finally:
                engine.close()
            grouped = " GROUP BY g ORDER BY g" if "GROUP BY" in sql else ""
            source = "" if " FROM " in truth_sql else " FROM clamped"
            truth = plain.execute(truth_sql + source + grouped).fetchall()
            outputs = _exact_outputs(query_plan, measured)
            assert len(outputs) == len(truth), (sql, bounds)
            for got, expected in zip(outputs, truth, strict=True):
                for value, exact, recipe in zip(got, expected[1 if grouped else 0:], query_plan.recipes, strict=True):
                    if exact is None:
                        continue
                    # One grid step (2**-29 of the range or finer) per row at most, far below 1e-6 of the range.
                    scale = max(hi - lo, yhi - ylo, 9.0, abs(float(exact)))
                    labels = [m.spec.label for m in query_plan.measurements]
                    assert abs(value - float(exact)) <= 1e-6 * scale, (sql, bounds, recipe.call.text, value, exact,
                                                                         labels)
    assert paired >= 3, "few pairs here: this tests little"
