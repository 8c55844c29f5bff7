"""dpsql on a Spark standalone cluster against Spark's own plain SQL on the same cluster (issue 34):
`python -m benchmarks.spark_cluster_speed [--rows 10000000] [--runs 3] [--workers 2] [--cores 1]
[--executor-memory 2g]`, writing benchmarks/results/spark_cluster.md.

The cluster is started here (benchmarks/spark_cluster.py: a master and `--workers` workers on this machine), the
data and query are benchmarks/scale.py's (generated Parquet, 1-5 rows per person, `SELECT state, COUNT(*),
AVG(income) FROM t GROUP BY state`). One driver (this process) on the cluster runs, alternately, per run:
- plain Spark SQL of the analyst's query on the Parquet file, and on the same rows cached in the executors' memory
  (what dpsql's engine reads: its prepared table is cached there);
- dpsql's bounded query (the engine's part: the exact measurements) and the whole private query (checked,
  rewritten, run, noised, charged).
dpsql's load (reading the Parquet file, ranking each person's rows by the portable key, caching) is timed once.
Reported: seconds, and each dpsql time over plain Spark's (median of the runs after a first one).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.scale import QUERY, generate, write_policy
from benchmarks.spark_cluster import environment, standalone
from dpsql.engines.spark_engine import SparkEngine, spark_session
from dpsql.policy import EngineChoice, load_policy
from dpsql.session import PrivateSession

RESULT = Path(__file__).parent / "results" / "spark_cluster.md"


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def run(args: argparse.Namespace, folder: Path) -> dict[str, object]:
    data = folder / "t.parquet"
    generate(data, args.rows)
    os.environ.update(environment())  # this process's driver joins the cluster from 127.0.0.1
    with standalone(folder, workers=args.workers, cores=args.cores, memory=args.worker_memory) as url:
        policy = load_policy(write_policy(folder, data, store=False, memory_limit=None))
        choice = EngineChoice("spark", url, (
            ("spark.executor.memory", args.executor_memory), ("spark.cores.max", str(args.workers * args.cores)),
            ("spark.driver.memory", "2g"), ("spark.sql.shuffle.partitions", str(2 * args.workers * args.cores))))
        policy = dataclasses.replace(policy, engine=choice, time_limit=3600.0)
        plain = spark_session(choice).newSession()  # the very SparkContext (and executors) dpsql's engine uses
        plain.read.parquet(str(data)).createOrReplaceTempView("t")
        cached = plain.read.parquet(str(data)).persist()
        cached_load = timed(cached.count)
        cached.createOrReplaceTempView("t_cached")
        engine_load = time.perf_counter()
        engine = SparkEngine(policy)
        engine_load = time.perf_counter() - engine_load
        session = PrivateSession(policy, "bench", engine=engine, create_ledger=True)
        prepared = session.prepare(QUERY)
        work = {
            "plain Spark SQL, Parquet": lambda: plain.sql(QUERY).collect(),
            "plain Spark SQL, cached": lambda: plain.sql(QUERY.replace("FROM t ", "FROM t_cached ")).collect(),
            "dpsql bounded query (engine)": lambda: session.measure(prepared),
            "dpsql private query (end to end)": lambda: session.execute(QUERY, epsilon=1.0),
        }
        times: dict[str, list[float]] = {name: [] for name in work}
        for _ in range(args.runs + 1):  # alternating, so that the machine's other load falls on every side alike
            for name, call in work.items():
                times[name].append(timed(call))
        session.close()
        engine.close()
        cached.unpersist()
    return {"url": url, "cached_load": cached_load, "engine_load": engine_load,
            "first": {name: t[0] for name, t in times.items()},
            "median": {name: statistics.median(t[1:]) for name, t in times.items()}}


def report(args: argparse.Namespace, measured: dict) -> str:
    median, first = measured["median"], measured["first"]
    base = median["plain Spark SQL, cached"]
    rows = "\n".join(f"| {name} | {first[name]:.2f} | {median[name]:.2f} | {median[name] / base:.2f}x |"
                     for name in median)
    return f"""# dpsql on a Spark standalone cluster against plain Spark SQL, {args.rows:,} rows

`python -m benchmarks.spark_cluster_speed --rows {args.rows} --runs {args.runs} --workers {args.workers} --cores \
{args.cores} --executor-memory {args.executor_memory}` (benchmarks/spark_cluster_speed.py). The cluster: a
standalone master and {args.workers} workers on this one machine (2 cores and 24 GiB shared with other engineers'
work), each worker {args.cores} core(s) and {args.worker_memory}, one executor per worker with
{args.executor_memory}; the driver (this process) 2g. Query: `{QUERY}`; median of {args.runs} runs after a first
one, the four alternating.

| | first (s) | median (s) | / plain Spark SQL on cached rows |
|---|---|---|---|
{rows}

Loads: plain Spark caching the Parquet rows {measured['cached_load']:.1f} s; dpsql's engine (read, rank each
person's rows by the portable md5 key, cache the prepared table) {measured['engine_load']:.1f} s.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--worker-memory", default="3g")
    parser.add_argument("--executor-memory", default="2g")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-cluster-") as folder:
        measured = run(args, Path(folder))
    text = report(args, measured)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
