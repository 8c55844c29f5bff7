"""Small benchmark of the DP quantile mechanism (dp/quantile.py): python -m benchmarks.quantiles [--runs N].

Median, p10, p90, MIN and MAX of the visits table's cost (bounds [0, 5000], m = 5 visits per patient) and PUMS
income ([0, 500000], m = 1) at epsilon 0.1, 1 and 10: the mean rank error (|rows below the answer - q n|, for
MIN/MAX the rows beyond it) and value error (against DuckDB's exact quantile_disc of the same capped rows), and
coverage of the 95% rank tail. Then the time of DuckDB's exact quantile_cont against bucket counting plus
report-noisy-max on ROWS generated rows. The seeded generator is for benchmarks only; sized to run in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import duckdb
from sqlglot import exp, parse_one

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.quantile import ExtremeScore, QuantileScore, extreme_rank, grid_for, release, utility_tail
from dpsql.rewrite.quantile_buckets import bucket_counts, count_vectors

DATA = Path(__file__).resolve().parent.parent / "sample_data"
EPSILONS = (Fraction(1, 10), Fraction(1), Fraction(10))
TARGETS = (("median", Fraction(1, 2)), ("p10", Fraction(1, 10)), ("p90", Fraction(9, 10)), ("min", None),
           ("max", None))
ROWS = 1_000_000


@dataclass(frozen=True)
class Column:
    name: str
    capped: str  # SQL of the bounded rows: the column, at most m rows per unit
    low: float
    high: float
    integer: bool
    max_rows: int


COLUMNS = (
    Column("visits.cost", f"SELECT cost AS x FROM (SELECT cost, row_number() OVER (PARTITION BY patient_id ORDER BY "
           f"hash(visit_date, cost)) AS r FROM read_csv('{DATA / 'visits.csv'}')) WHERE r <= 5", 0, 5000, False, 5),
    Column("pums.income", f"SELECT income AS x FROM read_csv('{DATA / 'pums' / 'PUMS_pid.csv'}')", 0, 500000, True, 1),
)


def measure(connection: duckdb.DuckDBPyConnection, column: Column, runs: int, seed: int) -> None:
    values = sorted(min(max(v, column.low), column.high) for (v,) in connection.execute(
        f"SELECT x FROM ({column.capped}) WHERE x IS NOT NULL").fetchall())
    n = len(values)
    grid = grid_for(column.low, column.high, column.integer)
    query = bucket_counts(parse_one(column.capped, read="duckdb"), [], exp.column("x"), grid).sql("duckdb")
    counts = count_vectors(connection.execute(query).fetchall(), 0, grid)[()]
    rng = InsecureSeededRandomForTests(seed)
    for epsilon in EPSILONS:
        for name, q in TARGETS:
            if q is None:
                score = ExtremeScore(name == "max", extreme_rank(epsilon, column.max_rows, grid), column.max_rows)
                truth = values[-1] if name == "max" else values[0]
            else:
                score = QuantileScore(q, column.max_rows)
                truth = values[min(n - 1, int(q * n))]
            tail = utility_tail(epsilon, score.sensitivity, grid.candidates)
            rank_errors, value_errors, covered = [], [], 0
            utilities = score.utilities(counts)
            for _ in range(runs):
                index = release(counts, score, epsilon, rng)
                answer = grid.value(index)
                below = sum(v < answer for v in values)
                target = (n if name == "max" else 0) if q is None else float(q * n)
                rank_errors.append(abs(below - target))
                value_errors.append(abs(answer - truth))
                covered += max(utilities) - utilities[index] <= tail
            print(f"{column.name:12} n={n:6} eps={float(epsilon):5} {name:6}"
                  f" rank error {statistics.mean(rank_errors):9.1f}"
                  f"  value error {statistics.mean(value_errors):10.2f}  tail t={tail:8.1f}"
                  f"  within t {covered / runs:.0%}")


def speed(connection: duckdb.DuckDBPyConnection, seed: int) -> None:
    connection.execute(f"CREATE OR REPLACE TABLE gen AS SELECT (hash(i) % 500000)::DOUBLE AS x FROM range({ROWS}) "
                       "t(i)")
    start = time.perf_counter()
    connection.execute("SELECT quantile_cont(x, 0.5) FROM gen").fetchall()
    exact = time.perf_counter() - start
    grid = grid_for(0, 500000, integer=False)
    start = time.perf_counter()
    query = bucket_counts(parse_one("SELECT x FROM gen"), [], exp.column("x"), grid).sql("duckdb")
    counts = count_vectors(connection.execute(query).fetchall(), 0, grid)[()]
    release(counts, QuantileScore(Fraction(1, 2), 1), Fraction(1), InsecureSeededRandomForTests(seed))
    dp = time.perf_counter() - start
    print(f"{ROWS} rows: DuckDB exact quantile_cont {exact * 1000:.0f} ms, bucket counts + report-noisy-max "
          f"{dp * 1000:.0f} ms ({dp / exact:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    connection = duckdb.connect()
    connection.execute("SET threads = 1")  # the machine is shared
    for column in COLUMNS:
        measure(connection, column, args.runs, args.seed)
    speed(connection, args.seed)


if __name__ == "__main__":
    main()
