"""COUNT, SUM and AVG of a bounded argument from its pair of complementary sums, x - lo and hi - x (measurements.Pair).

The privacy of the pair (one unit moves the two sums, and the NULL rows beside them, by at most the sensitivity
together) is checked with every other measurement on neighbouring datasets in test_sensitivity.py and audited in
tests/attacks/test_audit.py. Here: the outputs are the exact answers when the noise is zero, the pair is what makes
the outputs more accurate (the variances it promises), and the released intervals cover 95%.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import pytest

from benchmarks.support import DEFAULT_BUDGET, GAUSSIAN, Budget, Table, column, open_session, seeded, write_dataset
from dpsql.planning.aggregates import aggregate
from dpsql.planning.aggregates.average import Average
from dpsql.planning.aggregates.base import NoisyCells
from dpsql.planning.aggregates.total import Sum
from dpsql.planning.measurements import MeasurementKind
from dpsql.planning.plan import QueryPlan
from dpsql.release.cells import release

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
    """Each output computed from the measurements without noise: groups x outputs, groups in key order."""
    k = len(plan.query.keys)
    exact = np.array([[int(v or 0) for v in row[k:]] for row in sorted(rows, key=lambda r: r[:k])], dtype=object)
    cells = NoisyCells(plan.measurements, exact)
    return np.array([aggregate(r.call).estimate(r, cells).value for r in plan.recipes], dtype=float).T


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
    runs = 4000
    rng = seeded(11)
    inside = np.zeros(truth.shape)
    for _ in range(runs):
        cells = release(plan, rows, rng)
        inside += (cells.lows <= truth) & (truth <= cells.highs)
    coverage = inside / runs
    # The count of covering runs is binomial: 3.29 standard deviations is a two-sided 0.1% band around 95%.
    band = 3.29 * math.sqrt(LEVEL * (1 - LEVEL) / runs)
    kinds = [r.call.kind for r in plan.recipes]
    for j, kind in enumerate(kinds):
        for g in range(truth.shape[0]):
            assert coverage[g, j] >= LEVEL - band, (kind, g, coverage[g, j])
            if kind != "avg":  # a linear output's interval is exact; AVG's is clamped to the bounds, so may cover more
                assert coverage[g, j] <= LEVEL + band, (kind, g, coverage[g, j])
