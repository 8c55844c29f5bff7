"""DP quantiles, MIN and MAX against Tumult Analytics and OpenDP at equal epsilon, and their speed against DuckDB.

python -m benchmarks.quantile_accuracy [--runs 200] [--peer-runs 20] [--rows 10000000] [--quick] [--out FILE]

Accuracy: the median, 10th and 90th percentiles, MIN and MAX of PUMS income ([0, 500000], m = 1, 1,000 people) and
of the sample visits' cost ([0, 5000], m = 5 visits per patient), one aggregate per query, at epsilon 0.01 to 10.
Nobody in either table has more rows than m, so every system sees the same rows, clamped to the same bounds; the
truth is DuckDB's exact quantile_cont (MIN, MAX: min, max) of them. Errors: value error |answer - truth| and rank
error, the rows between the answer and the target rank (|#{x < answer} - q n|; for MIN the rows below the answer,
for MAX those above). dpsql: the engine runs once per query and the release stage `runs` times with a seeded
generator; its 95% intervals' coverage of the truth is counted too. Tumult Analytics 0.21 (`quantile`, `median`,
`min`, `max` after MaxRowsPerID(m), its own continuous mechanism over the bounds) and OpenDP 0.16
(`make_private_quantile` over dpsql's own candidate grid, permute-and-flip, scale searched so that m changed rows
cost epsilon) run in their virtualenvs (benchmarks/.venvs, `python -m benchmarks setup-peers`) as subprocesses;
Tumult evaluates through Spark, so it gets fewer runs. A missing peer is reported as skipped.

Speed: ROWS generated rows (one per person, a 10-valued key, x uniform in [0, 1000]) in DuckDB; dpsql's DB-API
query (connection open, median of 5) against DuckDB's exact quantile_cont on its own copy, without and with
GROUP BY; the ratio. Sized for the 2-core machine: the default run takes about 15 minutes, --quick seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
SAMPLE = BENCHMARKS.parent / "sample_data"
VENVS = BENCHMARKS / ".venvs"
EPSILONS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
# MIN and MAX are dpsql's (a value a few rows inside the extreme); q0 and q1 are QUANTILE_CONT(x, 0) and (x, 1),
# the exponential mechanism at the extremes as Tumult's min/max and OpenDP's alpha 0/1 do (their answer for those).
TARGETS = {"median": 0.5, "p10": 0.1, "p90": 0.9, "min": None, "max": None, "q0": 0.0, "q1": 1.0}
EXTREMES = {"min": "min", "q0": "min", "max": "max", "q1": "max"}


@dataclass(frozen=True)
class Column:
    name: str
    policy: Path
    table: str
    column: str
    unit: str
    csv: Path
    low: float
    high: float
    max_rows: int


COLUMNS = (
    Column("pums.income", SAMPLE / "pums" / "pums.toml", "pums", "income", "pid", SAMPLE / "pums" / "PUMS_pid.csv",
           0.0, 500000.0, 1),
    Column("visits.cost", SAMPLE / "visits.toml", "visits", "cost", "patient_id", SAMPLE / "visits.csv", 0.0, 5000.0,
           5),
)


def _sql(column: Column, target: str) -> str:
    q = TARGETS[target]
    call = f"{target.upper()}({column.column})" if q is None else f"QUANTILE_CONT({column.column}, {q})"
    return f"SELECT {call} FROM {column.table}"


def _capped(column: Column, folder: Path) -> Column:
    """The column over a copy of its policy and data in `folder` where nobody has more than m rows (each person's
    first m, in file order): then every system caps nothing and sees the same rows."""
    import shutil

    import duckdb
    for path in column.policy.parent.iterdir():
        if path.suffix in (".toml", ".csv"):
            shutil.copy(path, folder / path.name)
    csv = folder / column.csv.name
    duckdb.connect().execute(f"COPY (SELECT * EXCLUDE (__n) FROM (SELECT *, row_number() OVER (PARTITION BY "
                             f"{column.unit} ORDER BY __r) AS __n FROM (SELECT *, row_number() OVER () AS __r FROM "
                             f"read_csv('{column.csv}'))) WHERE __n <= {column.max_rows} ORDER BY __r) TO '{csv}' "
                             "(HEADER)")
    return replace(column, policy=folder / column.policy.name, csv=csv)


def _values(column: Column) -> list[float]:
    """The clamped non-NULL values every system sees."""
    import duckdb
    rows = duckdb.connect().execute(
        f"SELECT greatest(least({column.column}::DOUBLE, {column.high}), {column.low}) FROM read_csv('{column.csv}') "
        f"WHERE {column.column} IS NOT NULL AND NOT isnan({column.column}::DOUBLE)").fetchall()
    return sorted(v for (v,) in rows)


def _truth(values: list[float], target: str) -> float:
    q = TARGETS[target]
    if target in EXTREMES:
        return values[0] if EXTREMES[target] == "min" else values[-1]
    position = q * (len(values) - 1)  # quantile_cont: linear between the two neighbouring order statistics
    below = math.floor(position)
    above = min(below + 1, len(values) - 1)
    return values[below] + (position - below) * (values[above] - values[below])


def _rank_error(values: list[float], target: str, answer: float) -> float:
    """Rows between the answer and the target rank: 0 when the target rank q n falls among the rows equal to the
    answer (ties), else the distance from q n to the nearer end of [#{x < answer}, #{x <= answer}]."""
    q = TARGETS[target]
    if EXTREMES.get(target) == "min":
        return bisect_left(values, answer)
    if EXTREMES.get(target) == "max":
        return len(values) - bisect_right(values, answer)
    below, at_most, rank = bisect_left(values, answer), bisect_right(values, answer), q * len(values)
    return max(0.0, below - rank, rank - at_most)


def run_dpsql(column: Column, epsilons: tuple[float, ...], runs: int, targets: tuple[str, ...],
              intervals: bool) -> dict[str, list[tuple[float, float, float]]]:
    """(value, low, high) per run, keyed 'target|epsilon'; without intervals the value has the whole epsilon and
    the ends are NaN."""
    from benchmarks.support import seeded
    from dpsql.release.cells import release
    from dpsql.session import PrivateSession
    answers: dict[str, list[tuple[float, float, float]]] = {}
    session = PrivateSession(column.policy, "bench", create_ledger=True, quantile_intervals=intervals)
    try:
        for target in targets:
            for epsilon in epsilons:
                prepared = session.prepare(_sql(column, target), epsilon=epsilon)
                rows = session.measure(prepared)
                rng = seeded(zlib.crc32(f"{column.name}|{target}|{epsilon}|{intervals}".encode()))
                cells = [release(prepared.plan, rows, rng) for _ in range(runs)]
                answers[f"{target}|{epsilon}"] = [(float(c.values[0, 0]), float(c.lows[0, 0]),
                                                   float(c.highs[0, 0])) for c in cells]
    finally:
        session.close()
    return answers


def _grid(column: Column) -> list[float]:
    from dpsql.dp.quantile import grid_for
    grid = grid_for(column.low, column.high, False)
    return [grid.value(i) for i in range(grid.candidates)]


def _opendp_job(job: dict) -> dict:
    """Runs inside OpenDP's virtualenv: make_private_quantile over dpsql's candidates, permute-and-flip."""
    import opendp.prelude as dp
    dp.enable_features("contrib")
    answers: dict[str, list[float]] = {}
    for target in job["targets"]:
        alpha = {"min": 0.0, "max": 1.0}.get(EXTREMES.get(target, ""), TARGETS[target])
        for epsilon in job["epsilons"]:
            def make(scale: float, alpha: float = alpha) -> Any:
                return dp.m.make_private_quantile(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                                  dp.symmetric_distance(), dp.max_divergence(),
                                                  candidates=job["candidates"], alpha=alpha, scale=scale)
            scale = dp.binary_search_param(make, d_in=job["max_rows"], d_out=epsilon)
            measurement = make(scale)
            answers[f"{target}|{epsilon}"] = [float(measurement(job["values"])) for _ in range(job["runs"])]
    return answers


def _tumult_job(job: dict) -> dict:
    """Runs inside Tumult's virtualenv: one Spark session, each answer a fresh evaluate."""
    import os
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import pandas as pd
    from pyspark.sql import SparkSession
    from tmlt.analytics import AddRowsWithID, MaxRowsPerID, PureDPBudget, QueryBuilder, Session

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .config("spark.sql.shuffle.partitions", "2") \
        .config("spark.sql.warehouse.dir", str(Path(job["scratch"]) / "spark-warehouse")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    frame = pd.read_csv(job["csv"])[[job["unit"], job["column"]]].dropna()
    data = spark.createDataFrame(frame.astype({job["column"]: float}))
    session = Session.from_dataframe(PureDPBudget(float("inf")), "data", data,
                                     protected_change=AddRowsWithID(id_column=job["unit"]))
    low, high, name = float(job["low"]), float(job["high"]), job["column"]
    answers: dict[str, list[float]] = {}
    for target in job["targets"]:
        q, kind = TARGETS[target], EXTREMES.get(target, target)
        for epsilon in job["epsilons"]:
            base = QueryBuilder("data").enforce(MaxRowsPerID(job["max_rows"]))
            query = {"min": lambda b: b.min(name, low, high, name="v"),
                     "max": lambda b: b.max(name, low, high, name="v"),
                     "median": lambda b: b.median(name, low, high, name="v")}.get(
                kind, lambda b, q=q: b.quantile(name, q, low, high, name="v"))(base)
            answers[f"{target}|{epsilon}"] = [
                float(session.evaluate(query, PureDPBudget(epsilon)).toPandas()["v"][0]) for _ in range(job["runs"])]
    spark.stop()
    return answers


def run_peer(peer: str, column: Column, epsilons: tuple[float, ...], runs: int, values: list[float],
             scratch: Path, targets: tuple[str, ...]) -> dict[str, list[float]] | str:
    """The peer's answers, or why it was skipped."""
    python = VENVS / peer / "bin" / "python"
    if not python.exists():
        return f"not set up ({python} missing: python -m benchmarks setup-peers)"
    job = {"epsilons": list(epsilons), "targets": list(targets), "runs": runs, "max_rows": column.max_rows,
           "csv": str(column.csv),
           "unit": column.unit, "column": column.column, "low": column.low, "high": column.high,
           "values": values, "candidates": _grid(column), "scratch": str(scratch),
           "result": str(scratch / f"{peer}.json")}
    path = scratch / f"{peer}-job.json"
    path.write_text(json.dumps(job))
    done = subprocess.run([str(python), "-m", "benchmarks.quantile_accuracy", f"--{peer}-job", str(path)],
                          cwd=BENCHMARKS.parent, capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return json.loads(Path(job["result"]).read_text())


@dataclass(frozen=True)
class Errors:
    """One system's errors on one cell: the medians over its runs and their 95% order-statistic intervals."""

    value: float
    value_ci: tuple[float, float]
    rank: float
    rank_ci: tuple[float, float]

    @classmethod
    def of(cls, values: list[float], target: str, answers: list[float]) -> Errors:
        import numpy as np

        from benchmarks.stats import median_ci
        truth = _truth(values, target)
        value = np.array([abs(a - truth) for a in answers], dtype=float)
        rank = np.array([_rank_error(values, target, a) for a in answers], dtype=float)
        return cls(float(np.median(value)), median_ci(value), float(np.median(rank)), median_ci(rank))


def _compare(ours: Errors, theirs: Errors) -> tuple[str, str]:
    """'worse' / 'better' when the medians' 95% intervals do not overlap (value, rank), else '='."""
    def verdict(mine: tuple[float, float], other: tuple[float, float]) -> str:
        return "worse" if mine[0] > other[1] else "better" if mine[1] < other[0] else "="
    return verdict(ours.value_ci, theirs.value_ci), verdict(ours.rank_ci, theirs.rank_ci)


def accuracy(runs: int, peer_runs: int, epsilons: tuple[float, ...], peers: tuple[str, ...],
             targets: tuple[str, ...]) -> list[str]:
    """The table: dpsql's value alone (all of epsilon, as the peers) against each peer, with the verdicts of the
    medians' intervals; then dpsql with its 95% interval (a quarter of epsilon on it): value error, coverage and
    the interval's median width."""
    lines = ["| data | target | epsilon | dpsql value err | dpsql rank err | "
             + " | ".join(f"{p} value err | {p} rank err" for p in peers)
             + " | dpsql / best peer (value) | dpsql / best peer (rank) | significantly (value; rank) | "
               "with interval: value err | coverage | width |",
             "|---|---|---|---|---|" + "---|---|" * len(peers) + "---|---|---|---|---|---|"]
    skipped: list[str] = []
    tally = {"value": {"worse": 0, "better": 0, "=": 0}, "rank": {"worse": 0, "better": 0, "=": 0}}
    covers: list[float] = []
    for original in COLUMNS:
        with tempfile.TemporaryDirectory() as scratch:
            column = _capped(original, Path(scratch))
            values = _values(column)
            alone = run_dpsql(column, epsilons, runs, targets, intervals=False)
            with_interval = run_dpsql(column, epsilons, runs, targets, intervals=True)
            theirs = {peer: run_peer(peer, column, epsilons, peer_runs if peer == "tumult" else runs, values,
                                     Path(scratch), targets) for peer in peers}
        skipped += [f"{peer} on {column.name}: {found}" for peer, found in theirs.items() if isinstance(found, str)]
        for target in targets:
            truth = _truth(values, target)
            for epsilon in epsilons:
                key = f"{target}|{epsilon}"
                ours = Errors.of(values, target, [a[0] for a in alone[key]])
                cells, verdicts, best = [], [], [math.inf, math.inf]
                for peer in peers:
                    found = theirs[peer]
                    if isinstance(found, str):
                        cells.append("skipped | skipped")
                        continue
                    other = Errors.of(values, target, found[key])
                    best = [min(best[0], other.value), min(best[1], other.rank)]
                    cells.append(f"{other.value:.4g} | {other.rank:.4g}")
                    value_verdict, rank_verdict = _compare(ours, other)
                    tally["value"][value_verdict] += 1
                    tally["rank"][rank_verdict] += 1
                    if (value_verdict, rank_verdict) != ("=", "="):
                        verdicts.append(f"{peer}: {value_verdict}; {rank_verdict}")
                ratios = [f"{mine / other:.2f}" if math.isfinite(other) and other > 0 else "-"
                          for mine, other in ((ours.value, best[0]), (ours.rank, best[1]))]
                answers = with_interval[key]
                covered = sum(low <= truth <= high for _, low, high in answers) / len(answers)
                covers.append(covered)
                paid = Errors.of(values, target, [a[0] for a in answers])
                width = statistics.median(high - low for _, low, high in answers)
                lines.append(f"| {column.name} (n {len(values)}) | {target} | {epsilon:g} | {ours.value:.4g} | "
                             f"{ours.rank:.4g} | {''.join(c + ' | ' for c in cells)}{' | '.join(ratios)} | "
                             f"{', '.join(verdicts) or '='} | {paid.value:.4g} | {covered:.1%} | {width:.4g} |")
    summary = [f"Against each peer, cell by cell ({sum(tally['value'].values())} comparisons; 'worse' when dpsql's "
               "median error's 95% interval lies wholly above the peer's): value error worse "
               f"{tally['value']['worse']}, better {tally['value']['better']}, indistinguishable "
               f"{tally['value']['=']}; rank error worse {tally['rank']['worse']}, better {tally['rank']['better']}, "
               f"indistinguishable {tally['rank']['=']}."]
    if covers:
        summary.append(f"Coverage of dpsql's 95% intervals: {statistics.mean(covers):.1%} pooled, "
                       f"{min(covers):.1%} to {max(covers):.1%} per cell.")
    return lines + [""] + summary + [f"Skipped: {reason}" for reason in skipped]


def speed(rows: int) -> list[str]:
    import duckdb

    import dpsql
    from benchmarks.support import create_ledger, write_policy
    lines = ["| rows | query | dpsql ms | DuckDB quantile_cont ms | x DuckDB |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        parquet = folder / "t.parquet"
        duckdb.connect().execute(f"COPY (SELECT i AS pid, (i % 10)::INT AS g, (hash(i) % 1000000) / 1000.0 AS x "
                                 f"FROM range({rows}) t(i)) TO '{parquet}' (FORMAT parquet)")
        policy = create_ledger(write_policy(folder / "t.toml", {"t": {
            "source": "t.parquet", "privacy_unit": "pid", "max_rows_per_unit": 1,
            "columns": {"pid": {"type": "int"}, "g": {"type": "int", "values": list(range(10))},
                        "x": {"type": "float", "lower": 0, "upper": 1000}}}}, {"epsilon": 1e9}))
        plain = duckdb.connect()
        plain.execute(f"CREATE TABLE t AS SELECT * FROM '{parquet}'")
        with dpsql.connect(policy, "bench") as con:
            cursor = con.cursor()
            for label, ours, exact in (
                    ("MEDIAN(x)", "SELECT MEDIAN(x) FROM t", "SELECT quantile_cont(x, 0.5) FROM t"),
                    ("g, MEDIAN(x) GROUP BY g", "SELECT g, MEDIAN(x) FROM t GROUP BY g",
                     "SELECT g, quantile_cont(x, 0.5) FROM t GROUP BY g")):
                mine, theirs = [], []
                for _ in range(5):
                    start = time.perf_counter()
                    cursor.execute(ours, epsilon=1).fetchall()
                    mine.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    plain.execute(exact).fetchall()
                    theirs.append(time.perf_counter() - start)
                a, b = statistics.median(mine), statistics.median(theirs)
                lines.append(f"| {rows:,} | {label} | {a * 1000:.1f} | {b * 1000:.1f} | {a / b:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--peer-runs", type=int, default=20, help="Tumult's runs per point (each one is Spark's)")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="dpsql alone (its errors and coverage)")
    parser.add_argument("--quick", action="store_true", help="few runs, 2 epsilons, 100,000 rows, no peers")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables as Markdown")
    parser.add_argument("--tumult-job", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--opendp-job", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for job_path, work in ((args.tumult_job, _tumult_job), (args.opendp_job, _opendp_job)):
        if job_path is not None:
            job = json.loads(job_path.read_text())
            Path(job["result"]).write_text(json.dumps(work(job)))
            return
    if args.quick:
        args.runs, args.peer_runs, args.rows = 20, 2, 100_000
    epsilons = (0.1, 1.0) if args.quick else tuple(args.epsilons)
    peers = () if args.quick or args.no_peers else ("tumult", "opendp")
    lines = ["## Accuracy (median over runs)", "", *accuracy(args.runs, args.peer_runs, epsilons, peers,
                                                                tuple(args.targets))]
    if not args.no_speed:
        lines += ["", "## Speed", "", *speed(args.rows)]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text("# Quantiles against Tumult Analytics and OpenDP\n\n`python -m "
                            f"benchmarks.quantile_accuracy` (runs {args.runs}, Tumult {args.peer_runs}).\n\n{text}\n")


if __name__ == "__main__":
    main()
