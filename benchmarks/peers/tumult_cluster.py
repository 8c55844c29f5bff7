"""Tumult Analytics on a Spark cluster, for benchmarks/spark_cluster_tumult.py; run with the Tumult venv's Python
(benchmarks/.venvs/tumult/bin/python, `python -m benchmarks setup-peers --only tumult`).

`tumult_cluster.py MASTER PARQUET EPSILON RUNS` answers `SELECT state, COUNT(*), AVG(income) FROM t GROUP BY state`
RUNS times, each a fresh Session over the cached rows with a budget of EPSILON (pure DP), as an analyst would: one
person's rows capped at 5 (MaxRowsPerID, as dpsql's max_rows_per_unit), the states 0-9 given as public keys
(KeySet, as dpsql's declared values), COUNT and SUM(income) clamped to [0, 200000] at EPSILON / 2 each, AVG their
ratio (tumult_runner.py: its most accurate configuration). Prints one JSON line: each run's seconds and answers.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from tmlt.analytics import AddRowsWithID, KeySet, MaxRowsPerID, PureDPBudget, QueryBuilder, Session


def main() -> None:
    master, path, epsilon, runs = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(master).appName("tumult")
             .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="dpsql-tumult-cluster-"))
             .config("spark.executor.memory", "2g").config("spark.driver.memory", "2g")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    frame = spark.read.parquet(path).selectExpr("CAST(pid AS BIGINT) AS pid", "CAST(state AS BIGINT) AS state",
                                                "CAST(income AS BIGINT) AS income").cache()
    frame.count()
    keys = KeySet.from_dict({"state": list(range(10))})
    measured = []
    for _ in range(runs):
        started = time.perf_counter()
        session = Session.from_dataframe(privacy_budget=PureDPBudget(epsilon), source_id="t", dataframe=frame,
                                         protected_change=AddRowsWithID(id_column="pid"))
        base = QueryBuilder("t").enforce(MaxRowsPerID(5)).groupby(keys)
        counts = session.evaluate(base.count(name="n"), PureDPBudget(epsilon / 2)).collect()
        base = QueryBuilder("t").enforce(MaxRowsPerID(5)).groupby(keys)
        sums = {r["state"]: r["s"] for r in session.evaluate(base.sum("income", 0, 200000, name="s"),
                                                               PureDPBudget(epsilon / 2)).collect()}
        answers = {int(r["state"]): [int(r["n"]), sums[r["state"]] / r["n"] if r["n"] else None] for r in counts}
        measured.append({"seconds": time.perf_counter() - started, "answers": answers})
    print(json.dumps(measured))
    spark.stop()


if __name__ == "__main__":
    main()
