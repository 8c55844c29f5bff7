"""Smoke test of the benchmark harness: `python -m benchmarks all --quick --no-peers` on tiny data.

It runs the real command line in a subprocess (the benchmarks package lives beside dpsql, not inside it) with
the data cache and the output in a temporary folder, and checks that every CSV and the summary are written with
sane content. Tolerances come from the distributions (binomial for coverage); nothing here measures time.
"""

from __future__ import annotations

import csv
import gzip
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers_env import PEERS
from benchmarks.stats import _order_coverage, median_ci

ROOT = Path(__file__).resolve().parent.parent
LEVEL = 0.95
pytestmark = pytest.mark.slow  # the harness run the module shares takes several seconds


def _rows(path: Path) -> list[dict[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("results")
    data = tmp_path_factory.mktemp("data")
    done = subprocess.run([sys.executable, "-m", "benchmarks", "all", "--quick", "--no-peers", "--out", str(out),
                           "--data-dir", str(data)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_every_output_is_written(results: Path) -> None:
    for name in ("accuracy_runs.csv.gz", "accuracy_cells.csv", "accuracy_truth.csv", "accuracy_costs.csv",
                 "speed_runs.csv", "speed_summary.csv", "overhead_runs.csv", "overhead_summary.csv",
                 "skipped_accuracy.csv", "skipped_speed.csv", "summary.md"):
        assert (results / name).stat().st_size > 0, name


def test_relative_errors_are_finite_and_shrink_with_epsilon(results: Path) -> None:
    cells = [c for c in _rows(results / "accuracy_cells.csv") if c["system"] == "dpsql"]
    assert cells
    assert all(math.isfinite(float(c["median_rel"])) and float(c["median_rel"]) >= 0 for c in cells)
    by_epsilon: dict[float, list[float]] = {}
    for c in cells:
        by_epsilon.setdefault(float(c["epsilon"]), []).append(float(c["median_rel"]))
    low, high = min(by_epsilon), max(by_epsilon)
    assert sorted(by_epsilon[high])[len(by_epsilon[high]) // 2] < sorted(by_epsilon[low])[len(by_epsilon[low]) // 2]


def test_coverage_is_within_a_binomial_tolerance_of_95_percent(results: Path) -> None:
    runs = [r for r in _rows(results / "accuracy_runs.csv.gz") if r["system"] == "dpsql"]
    truth = {(t["query"], t["aggregate"], t["group"]): float(t["bounded"])
             for t in _rows(results / "accuracy_truth.csv")}
    # COUNT and SUM intervals are exact (or conservative) for their own noise; pool those.
    exact = [r for r in runs if r["kind"] in ("count", "sum")]
    covered = sum(float(r["low"]) <= truth[(r["query"], r["aggregate"], r["group"])] <= float(r["high"])
                  for r in exact)
    n = len(exact)
    tolerance = 4 * math.sqrt(LEVEL * (1 - LEVEL) / n)  # 4 standard errors: a false alarm once in ~16,000 runs
    assert covered / n >= LEVEL - tolerance


def test_equal_cost_is_recorded_and_peers_are_reported_skipped(results: Path) -> None:
    costs = _rows(results / "accuracy_costs.csv")
    assert costs and all(math.isclose(float(c["cost"]), float(c["epsilon"])) for c in costs)
    skipped = _rows(results / "skipped_accuracy.csv") + _rows(results / "skipped_speed.csv")
    assert {s["system"] for s in skipped} == {"smartnoise", "opendp", "tumult"} == {p.name for p in PEERS}
    assert all(s["reason"] for s in skipped)


def test_summary_states_the_targets_and_the_speed_ratio(results: Path) -> None:
    summary = (results / "summary.md").read_text()
    assert "## Targets of issue 4" in summary
    assert "95% intervals cover between 94% and 96%" in summary
    speed = {(p["system"], p["rows"]): p for p in _rows(results / "speed_summary.csv")}
    dpsql = [p for (system, _), p in speed.items() if system == "dpsql"]
    assert dpsql and all(float(p["ratio_to_duckdb"]) > 0 and float(p["peak_rss_mb"]) > 0 for p in dpsql)
    overhead = {s["stage"]: float(s["median_ms"]) for s in _rows(results / "overhead_summary.csv")}
    assert overhead["execute, new SQL text"] > 0 and overhead["noise"] > 0


def test_the_quantile_benchmark_runs_and_writes_its_tables(tmp_path: Path) -> None:
    out = tmp_path / "quantiles.md"
    done = subprocess.run([sys.executable, "-m", "benchmarks.quantile_accuracy", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| pums.income") or line.startswith("| visits")]
    assert len(rows) == 2 * 7 * 2  # two columns, seven targets, two epsilons
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 11  # no peers: value and rank error, two ratios, verdicts, then with the interval
        assert float(cells[3]) >= 0 and float(cells[4]) >= 0 and float(cells[8]) >= 0 and cells[9].endswith("%")
    assert "Coverage of dpsql's 95% intervals:" in text
    assert "| 100,000 | MEDIAN(x) |" in text


def test_the_median_interval_covers_95_percent_exactly_or_says_nothing() -> None:
    """The order statistics chosen are the narrowest symmetric pair whose exact binomial coverage of the median is
    >= 95% (one pair narrower is below it); with fewer than 6 values none is, and the interval is [0, inf]."""
    for n in (3, 5):
        assert median_ci(np.arange(n, dtype=float)) == (0.0, math.inf)
    for n in (6, 20, 100, 200):
        low, high = median_ci(np.arange(n, dtype=float))
        j = int(low) + 1  # 1-based order statistic
        assert high == n - j and _order_coverage(n, j) >= 0.95 > _order_coverage(n, j + 1)
