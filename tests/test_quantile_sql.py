"""DP quantiles, MEDIAN, MIN and MAX through SQL: the spellings, the engine's counts per candidate, the release and its
interval, and the bound one unit has on the counts (planning/aggregates/quantile.py, rewrite/quantile_buckets.py)."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom
from sqlglot import exp

from benchmarks.support import seeded, write_csv, write_policy
from dpsql.dp.quantile import grid_for
from dpsql.frontends.explain import explain
from dpsql.planning.measurements import MeasurementKind
from dpsql.release.cells import release
from dpsql.rewrite.quantile_buckets import bucket_of
from dpsql.session import PrivateSession
from tests.conftest import create_ledger
from tests.sizes import cases

SPELLINGS_OF_THE_MEDIAN = (
    "MEDIAN(income)", "QUANTILE_CONT(income, 0.5)", "QUANTILE_DISC(income, 0.5)", "QUANTILE(income, 0.5)",
    "APPROX_QUANTILE(income, 0.5)", "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY income)",
    "PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY income DESC)", "percentile_cont(income, 0.5)",
)


def _spec(session: PrivateSession, call: str):
    (measurement,) = session.prepare(f"SELECT {call} FROM pums").plan.measurements
    assert measurement.spec.kind is MeasurementKind.QUANTILE
    return measurement.spec


def test_every_spelling_of_the_median_is_one_measurement(pums_session) -> None:
    keys = {_spec(pums_session, call).key for call in SPELLINGS_OF_THE_MEDIAN}
    assert len(keys) == 1
    assert _spec(pums_session, "MEDIAN(income)").fraction == Fraction(1, 2)


def test_descending_order_asks_for_the_other_side(pums_session) -> None:
    desc = _spec(pums_session, "PERCENTILE_CONT(0.1) WITHIN GROUP (ORDER BY income DESC)")
    assert desc.key == _spec(pums_session, "QUANTILE_CONT(income, 0.9)").key
    assert _spec(pums_session, "MIN(income)").key != _spec(pums_session, "MAX(income)").key
    assert _spec(pums_session, "MIN(income)").key == _spec(pums_session, "QUANTILE_CONT(income, 0)").key


def _table(folder: Path, rows: list[tuple], m: int, budget: dict | None = None) -> Path:
    write_csv(folder / "t.csv", ["pid", "g", "v", "x"], rows)
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": m,
        "columns": {"pid": {"type": "int"}, "g": {"type": "text", "values": ["a", "b"]},
                    "v": {"type": "int", "lower": 0, "upper": 1000},
                    "x": {"type": "float", "lower": 0, "upper": 100}}}},
        {"epsilon": 100000, "query_epsilon": 1, **(budget or {})})
    return create_ledger(policy)


def _session(policy: Path, seed: int = 3) -> PrivateSession:
    return PrivateSession(policy, "tester", rng=seeded(seed), bounding_seed=5)


def test_a_large_epsilon_finds_the_quantiles_of_the_capped_rows(tmp_path: Path) -> None:
    # group a: v = 1..999 (one row per unit); group b: v = 500 for 50 units
    rows = [(u, "a", u, u / 10) for u in range(1, 1000)] + [(1000 + u, "b", 500, 50.0) for u in range(50)]
    session = _session(_table(tmp_path, rows, m=1))
    try:
        result = session.execute("SELECT g, MEDIAN(v), QUANTILE_CONT(v, 0.1), MIN(v), MAX(v), MEDIAN(x) FROM t "
                                  "GROUP BY g ORDER BY g", epsilon=20000)
    finally:
        session.close()
    (a, median, p10, low, high, middle), (b, median_b, p10_b, low_b, high_b, _) = result.rows
    assert (a, b) == ("a", "b")
    assert abs(median - 500) <= 1 and abs(p10 - 100) <= 1  # integers 0..1000: every integer is a candidate
    assert low in (0, 1) and high in (999, 1000)  # MIN/MAX: between the bound and the extreme (a tie)
    assert median_b == p10_b == 500 and 0 <= low_b <= 500 <= high_b <= 1000  # ties down (up) to the bounds
    assert abs(middle - 50) <= 100 / 4096  # floats: the middle of a bucket of width 100/4096
    for interval, truth in zip(result.intervals[0][1:], (500, 100, 1, 999, 50), strict=True):
        assert interval[0] <= truth <= interval[1]


def test_the_interval_holds_the_released_value_and_stays_within_the_bounds(tmp_path: Path) -> None:
    rows = [(u, "ab"[u % 2], (u * 37) % 1001, (u * 13) % 100 + 0.5) for u in range(400)]
    session = _session(_table(tmp_path, rows, m=1))
    try:
        for epsilon in (0.01, 1, 100):
            result = session.execute("SELECT g, MEDIAN(v), MIN(x), MAX(x), QUANTILE_CONT(x, 0.75) FROM t GROUP BY g",
                                     epsilon=epsilon)
            for row, intervals in zip(result.rows, result.intervals, strict=True):
                for value, bounds in zip(row[1:], intervals[1:], strict=True):
                    assert bounds[0] <= value <= bounds[1]
                    assert bounds[0] >= 0 and bounds[1] <= (1000 if bounds is intervals[1] else 100)
            assert all(std is None for row in result.noise_std for std in row)
    finally:
        session.close()


def test_the_interval_covers_the_true_median_about_95_percent_of_the_time(tmp_path: Path) -> None:
    """Continuous values, one row per unit, 2,000 units: over RUNS releases at a fixed seed the count of covers is
    Binomial(RUNS, p); the method claims p >= 0.95 (up to its Cornish-Fisher approximation and the grid, which
    both widen), so the count must not fall below that law's 1e-4 quantile."""
    rows = [(u, "a", 0, 100 * ((u * 0.6180339887) % 1) ** 2) for u in range(2000)]
    session = _session(_table(tmp_path, rows, m=1))
    try:
        prepared = session.prepare("SELECT MEDIAN(x) FROM t", epsilon=0.5)
        engine_rows = session.measure(prepared)
        truth = duckdb.connect().execute("SELECT quantile_cont(x, 0.5) FROM read_csv(?)",
                                         [str(tmp_path / "t.csv")]).fetchall()[0][0]
        rng, runs = seeded(11), cases(400, floor=100)
        covered = 0
        for _ in range(runs):
            cells = release(prepared.plan, engine_rows, rng)
            covered += cells.lows[0, 0] <= truth <= cells.highs[0, 0]
    finally:
        session.close()
    assert covered >= binom.ppf(1e-4, runs, 0.95)


def test_one_unit_moves_the_counts_per_candidate_by_at_most_m(tmp_path: Path) -> None:
    """Neighbouring tables (one unit's rows removed): the engine's counts, over all groups and candidates, move by
    at most m in L1 (the sensitivity the mechanism and the interval's noise are calibrated to)."""
    m = 3
    base = [(u, "ab"[u % 2], (u * 7) % 1001, float(u % 100)) for u in range(1, 200)]
    victim = [(0, "a", 10, 1.0), (0, "b", 999, 99.0), (0, "a", 500, 50.0), (0, "b", 3, 0.5), (0, "a", 0, 0.0)]
    vectors = []
    for name, rows in (("with", base + victim), ("without", base)):
        folder = tmp_path / name
        folder.mkdir()
        session = _session(_table(folder, rows, m))
        try:
            prepared = session.prepare("SELECT g, MEDIAN(v), MAX(x) FROM t GROUP BY g", epsilon=1)
            plan = prepared.plan
            found = {row[0]: row[1:] for row in session.measure(prepared)}
            vectors.append({(key, j, bucket): rows for key, maps in found.items()
                            for j, counts in enumerate(maps) for bucket, rows in (counts or {}).items()})
        finally:
            session.close()
    assert all(mm.mechanism.max_rows == m for mm in plan.measurements)
    moved = {j: 0 for j in range(2)}
    for key in vectors[0].keys() | vectors[1].keys():
        moved[key[1]] += abs(vectors[0].get(key, 0) - vectors[1].get(key, 0))
    assert moved == {0: m, 1: m}  # the victim's m capped rows, each in one bucket of one group


@settings(max_examples=cases(200), deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from([0.0, -0.0, 5000.0, 4.8828125,
                                                                                  4.8828124999, math.inf])),
                min_size=1, max_size=30),
       st.sampled_from([(0.0, 5000.0, False), (-3.0, 17.0, True), (0.0, 200000.0, True), (-1.5, 2.25, False)]))
def test_the_engine_rounds_a_value_to_the_candidate_the_grid_does(values: list[float], bounds: tuple) -> None:
    """Rounding at a bucket edge may differ by one candidate in floats (a function of the row either way); any
    other difference, or a failure on some value, would be a bug."""
    grid = grid_for(*bounds)
    query = exp.select(bucket_of(exp.column("x"), grid)).from_("t").order_by("i").sql("duckdb")
    con = duckdb.connect()
    con.execute("CREATE TABLE t(i INTEGER, x DOUBLE)")
    if grid.points:  # the grid of every integer is used for integer arguments only
        values = [float(round(v)) if math.isfinite(v) else v for v in values]
    con.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(values)))
    engine = [b for (b,) in con.execute(query).fetchall()]
    for value, found in zip(values, engine, strict=True):
        clamped = min(max(value, float(grid.low)), float(grid.high))  # what the rewrite's clamp hands it
        assert abs(found - grid.bucket(clamped)) <= (0 if grid.points else 1)


def test_nan_goes_to_the_top_candidate_and_null_to_none(tmp_path: Path) -> None:
    grid = grid_for(0.0, 100.0, False)
    con = duckdb.connect()
    bucket = bucket_of(exp.column("x"), grid).sql("duckdb")
    rows = con.execute(f"SELECT {bucket} FROM (VALUES ('nan'::DOUBLE), ('-inf'::DOUBLE)) AS t(x)").fetchall()
    assert rows == [(grid.buckets,), (0,)]


def test_quantiles_are_post_processed_like_any_aggregate(tmp_path: Path) -> None:
    rows = [(u, "ab"[u % 2], u % 1001, float(u % 100)) for u in range(1, 600)]
    session = _session(_table(tmp_path, rows, m=1))
    try:
        result = session.execute("SELECT g, MEDIAN(v) AS med, MEDIAN(v) + 1 AS shifted FROM t WHERE x < 50 GROUP BY g "
                                 "HAVING MEDIAN(v) > -1 ORDER BY med DESC LIMIT 1", epsilon=1000)
        (_, med, shifted), = result.rows
        assert shifted == med + 1 and result.intervals[0][2] == tuple(e + 1 for e in result.intervals[0][1])
        assert [c.type for c in result.columns] == ["VARCHAR", "DOUBLE", "DOUBLE"]
    finally:
        session.close()


def test_under_zcdp_a_share_rho_buys_the_epsilon_whose_value_and_interval_cost_rho(tmp_path: Path) -> None:
    """epsilon-DP implies (epsilon^2 / 2)-zCDP: the value's and the interval's parts together cost the share (10/16
    of it was spent when the share bought sqrt(2 rho) for both); without an interval the value has sqrt(2 rho)."""
    policy = _table(tmp_path, [(u, "a", u, 1.0) for u in range(10)], m=2, budget={"accounting": "zcdp"})
    session = _session(policy)
    try:
        (measurement,) = session.prepare("SELECT MEDIAN(v) FROM t", epsilon=1).plan.measurements
        mechanism = measurement.mechanism
        spent = (float(mechanism.point_epsilon) ** 2 + mechanism.interval_noise.epsilon ** 2) / 2
        assert spent == pytest.approx(measurement.share, rel=1e-12) and measurement.share == pytest.approx(0.5)
        (alone,) = session.prepare("SELECT MEDIAN(v) FROM t", epsilon=1, quantile_intervals=False).plan.measurements
        assert alone.mechanism.epsilon == pytest.approx(math.sqrt(2 * alone.share))
        assert alone.mechanism.epsilon == pytest.approx(1, rel=1e-9)
    finally:
        session.close()


def test_explain_names_the_mechanism_the_grid_and_the_rank_error(pums_session) -> None:
    text = explain(pums_session.prepare("SELECT sex, MEDIAN(income), MIN(age) FROM pums GROUP BY sex").plan)
    assert "report-noisy-max (geometric noise) exponential mechanism for the 0.5 quantile" in text
    assert "4097 candidates from 0 to 500000" in text  # pums.toml: income in [0, 500000]
    assert "the 0 quantile (MIN)" in text and "rank error at most" in text


def test_quantiles_over_a_join_and_over_per_unit_values(visits_policy: Path) -> None:
    session = PrivateSession(visits_policy, "tester", rng=seeded(2), bounding_seed=1)
    try:
        joined = session.execute("SELECT r.urban, MEDIAN(v.cost) FROM visits v JOIN regions r ON v.region = r.region "
                                 "GROUP BY r.urban", epsilon=5)
        assert sorted(row[0] for row in joined.rows) == [False, True]
        per_unit = session.execute("SELECT MEDIAN(total), MAX(total) FROM (SELECT patient_id, SUM(cost) AS total "
                                   "FROM visits GROUP BY patient_id)", epsilon=5)
        (median, maximum), = per_unit.rows
        assert 0 <= median <= maximum
    finally:
        session.close()


def test_the_extreme_quantiles_answer_a_bucket_s_end_not_its_middle(tmp_path: Path) -> None:
    """QUANTILE_CONT(x, 0) and (x, 1) where many values sit at the bounds (clamped): at a large epsilon the bucket
    chosen is the first (last), and the answer its end, the bound itself, not the bucket's middle."""
    rows = [(u, "a", 0, 0.0 if u % 2 else 150.0) for u in range(400)]  # x clamped to [0, 100]: 0 and 100
    session = _session(_table(tmp_path, rows, m=1))
    try:
        result = session.execute("SELECT QUANTILE_CONT(x, 0), QUANTILE_CONT(x, 1) FROM t", epsilon=5000)
    finally:
        session.close()
    assert result.rows == [(0.0, 100.0)]
