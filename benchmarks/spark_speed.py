"""Spark local against DuckDB at scale, one query (issue 12): `python -m benchmarks.spark_speed [--rows 10000000]
[--runs 3] [--master local[2]] [--out benchmarks/results/spark.md]`.

Data and query as benchmarks/scale.py (generated Parquet, 1-5 rows per person, `SELECT state, COUNT(*),
AVG(income) FROM t GROUP BY state`). Side by side in one process, each engine built from the same policy but for
`[engine] kind`: the load (reading and preparing the table: DuckDB in memory with its hash() ranks; Spark with the
portable md5 ranks, cached in Spark's memory), then the bounded query run `--runs` times (the exact measurements,
no noise: the engine's part only). Reported as seconds and as Spark / DuckDB ratios. Not a test: it needs Java,
PySpark and a minute or more.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.scale import QUERY, generate, write_policy
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.engines.spark_engine import SparkEngine
from dpsql.policy import EngineChoice, load_policy
from dpsql.session import PrivateSession


def timed(make):
    started = time.perf_counter()
    value = make()
    return value, time.perf_counter() - started


def run(rows: int, runs: int, master: str, folder: Path) -> list[tuple[str, float, float]]:
    data = folder / f"t_{rows}.parquet"
    if not data.exists():
        generate(data, rows)
    policy = load_policy(write_policy(folder, data, store=False, memory_limit=None))
    spark_policy = dataclasses.replace(policy, engine=EngineChoice("spark", master, (
        ("spark.driver.memory", "6g"), ("spark.sql.shuffle.partitions", "8"))))
    results = []
    engines = [("duckdb", lambda: DuckDBEngine(policy)),
               ("duckdb, portable ranks", lambda: DuckDBEngine(policy, bounding_seed=1)),
               ("spark", lambda: SparkEngine(spark_policy))]
    for name, build in engines:
        engine, load = timed(build)
        session = PrivateSession(policy, "bench", engine=engine, create_ledger=True)
        prepared = session.prepare(QUERY)
        first = timed(lambda s=session, p=prepared: s.measure(p))[1]
        times = [timed(lambda s=session, p=prepared: s.measure(p))[1] for _ in range(runs)]
        session.close()
        engine.close()
        results.append((name, load, first, statistics.median(times)))
        print(f"{name}: load {load:.2f} s, first query {first:.2f} s, median query {statistics.median(times):.3f} s",
              flush=True)
    return results


def report(rows: int, runs: int, master: str, results: list) -> str:
    (_, *duckdb), (_, *portable), (_, *spark) = results
    lines = []
    for i, (what, digits) in enumerate([("load and prepare (s)", 2), ("first query (s)", 3), ("query, median (s)", 3)]):
        cells = [f"{engine[i]:.{digits}f}" for engine in (duckdb, portable, spark)]
        lines.append(f"| {what} | {' | '.join(cells)} | {spark[i] / duckdb[i]:.1f}x | {spark[i] / portable[i]:.1f}x |")
    table = "\n".join(lines)
    return f"""# Spark local against DuckDB, one query, {rows:,} rows

`python -m benchmarks.spark_speed --rows {rows} --runs {runs} --master '{master}'` (benchmarks/spark_speed.py), one
process, the 2-core machine shared with other work. Query: `{QUERY}`; the engine's part only (the bounded query's
exact measurements), median of {runs} runs after a first one.

| | DuckDB (hash ranks, the default) | DuckDB (portable md5 ranks, a fixed seed) | Spark ({master}, md5 ranks) \
| Spark / DuckDB default | Spark / DuckDB md5 |
|---|---|---|---|---|---|
{table}

Spark's load includes starting the JVM (and py4j), reading the Parquet file, computing the portable md5 rank key
and caching the prepared table in Spark's memory; DuckDB's default load ranks by its own hash(), and with a fixed
bounding seed by the same md5 key as Spark. On one 2-core machine Spark local is much the slower engine; it is there
for data and clusters that one machine cannot hold, not for speed here.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "spark.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-spark-") as folder:
        results = run(args.rows, args.runs, args.master, Path(folder))
    args.out.write_text(report(args.rows, args.runs, args.master, results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
