"""dpsql against Tumult Analytics on one Spark standalone cluster, the same rows, the same epsilon (issue 34):
`python -m benchmarks.spark_cluster_tumult [--rows 1000000] [--runs 5] [--epsilon 1]`, writing
benchmarks/results/spark_cluster_tumult.md. Needs the Tumult venv (`python -m benchmarks setup-peers --only
tumult`).

The data are benchmarks/scale.py's (1-5 rows per person), the query `SELECT state, COUNT(*), AVG(income) FROM t
GROUP BY state`, the states 0-9 public (dpsql: declared values; Tumult: a KeySet), income in [0, 200000], at most 5
rows per person (both cap). The cluster (benchmarks/spark_cluster.py) runs dpsql's driver first (this process: the
engine's load, then each run a whole private query), which is then stopped, and Tumult's (its own process,
benchmarks/peers/tumult_cluster.py: each run a fresh Session, two measurements). Error: the mean absolute
difference from the true answer (DuckDB over the Parquet file), over every state and run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.peers_env import VENVS
from benchmarks.scale import QUERY, generate, write_policy
from benchmarks.spark_cluster import environment, standalone
from dpsql.engines.spark_engine import SparkEngine, spark_session
from dpsql.policy import EngineChoice, load_policy
from dpsql.session import PrivateSession

RESULT = Path(__file__).parent / "results" / "spark_cluster_tumult.md"
TUMULT = Path(__file__).parent / "peers" / "tumult_cluster.py"
STATES = range(10)


def truth(data: Path) -> dict[int, tuple[int, float]]:
    rows = duckdb.sql(f"SELECT state, COUNT(*), AVG(income) FROM '{data}' GROUP BY state").fetchall()
    return {int(state): (count, mean) for state, count, mean in rows}


def dpsql_runs(policy_path: Path, url: str, args: argparse.Namespace) -> tuple[float, list[dict]]:
    choice = EngineChoice("spark", url, (("spark.executor.memory", "2g"), ("spark.driver.memory", "2g"),
                                         ("spark.sql.shuffle.partitions", "4")))
    policy = dataclasses.replace(load_policy(policy_path), engine=choice, time_limit=3600.0)
    started = time.perf_counter()
    engine = SparkEngine(policy)
    load = time.perf_counter() - started
    session = PrivateSession(policy, "bench", engine=engine, create_ledger=True)
    runs = []
    for _ in range(args.runs):
        started = time.perf_counter()
        result = session.execute(QUERY, epsilon=args.epsilon)
        runs.append({"seconds": time.perf_counter() - started,
                     "answers": {int(state): [count, mean] for state, count, mean in result.rows}})
    session.close()
    engine.close()
    spark_session(choice).sparkContext.stop()  # its executors leave the cluster to Tumult's
    return load, runs


def errors(runs: list[dict], true: dict[int, tuple[int, float]]) -> tuple[float, float]:
    counts, means = [], []
    for run in runs:
        answers = {int(k): v for k, v in run["answers"].items()}
        for state in STATES:
            count, mean = answers.get(state, (0, None))
            counts.append(abs(count - true[state][0]))
            if mean is not None:
                means.append(abs(mean - true[state][1]))
    return statistics.mean(counts), statistics.mean(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-tumult-") as name:
        folder = Path(name)
        data = folder / "t.parquet"
        generate(data, args.rows)
        true = truth(data)
        policy = write_policy(folder, data, store=False, memory_limit=None)
        policy.write_text(policy.read_text().replace('lower = 0, upper = 9,', f'values = {list(STATES)},'))
        os.environ.update(environment())
        with standalone(folder, workers=2, cores=1, memory="3g") as url:
            load, ours = dpsql_runs(policy, url, args)
            tumult_env = {k: v for k, v in environment().items() if k != "SPARK_HOME"}
            done = subprocess.run([str(VENVS / "tumult" / "bin" / "python"), str(TUMULT), url, str(data),
                                   str(args.epsilon), str(args.runs)], env=tumult_env, capture_output=True,
                                  text=True)
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            theirs = json.loads(done.stdout.strip().splitlines()[-1])
    lines = []
    for name, runs in (("dpsql", ours), ("Tumult Analytics 0.21", theirs)):
        count_error, mean_error = errors(runs, true)
        seconds = [r["seconds"] for r in runs]
        lines.append(f"| {name} | {statistics.median(seconds):.2f} | {min(seconds):.2f} | {count_error:.2f} | "
                     f"{mean_error:.2f} |")
    text = f"""# dpsql against Tumult Analytics on one Spark standalone cluster, {args.rows:,} rows

`python -m benchmarks.spark_cluster_tumult --rows {args.rows} --runs {args.runs} --epsilon {args.epsilon:g}`
(benchmarks/spark_cluster_tumult.py): a standalone master and 2 workers (1 core, 3g each) on this 2-core machine
shared with other work; each system's driver 2g, executors 2g. Query `{QUERY}` at epsilon {args.epsilon:g} (pure
DP), the states public for both, income in [0, 200000], at most 5 rows per person. {args.runs} runs each; error =
mean absolute difference from the true answer over the 10 states and the runs.

| system | seconds a query, median | fastest | COUNT error | AVG error |
|---|---|---|---|---|
{chr(10).join(lines)}

dpsql's engine load (read, rank, cache) {load:.1f} s, not in the query times; Tumult's cached the rows before its
runs (not timed). Each Tumult run is a fresh Session and two measurements (COUNT, SUM at epsilon / 2 each; AVG their
ratio); each dpsql run a whole private query (checked, rewritten, run, noised, charged).
"""
    print(text)
    RESULT.write_text(text)


if __name__ == "__main__":
    main()
