"""The DB-API's side of tests/test_spark_cluster.py, run in a process of its own: dpsql.connect on a policy whose
engine is a standalone cluster starts this process's Spark driver there. A child process, because a process has one
SparkContext, of one master: the test process may hold a local one for other modules' tests.

`python -m tests.spark_cluster_driver answers POLICY SQL...` prints, as JSON, the driver's master, its executors'
hosts and each query's release (repr of the column names and rows, seeded as the test seeds DuckDB's).
`python -m tests.spark_cluster_driver time-limit POLICY SQL` prints what the cluster shows after SQL ran into the
policy's time limit: the error, the charge, the job's and its stages' status, the tasks left running.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import dpsql
from benchmarks.support import seeded
from dpsql.errors import ExecutionFailed

ANALYST = "cluster"
BOUNDING_SEED, NOISE_SEED = 34, 7


def connected(policy: str) -> dpsql.Connection:
    return dpsql.connect(policy, ANALYST, rng=seeded(NOISE_SEED), bounding_seed=BOUNDING_SEED)


def release(connection: dpsql.Connection, sql: str) -> str:
    """The release as text: column names, rows (repr keeps each value's type) and intervals."""
    connection.session.rng = seeded(NOISE_SEED)
    cursor = connection.cursor()
    cursor.execute(sql)
    return repr(([d[0] for d in cursor.description], cursor.fetchall(), cursor.intervals))


def _context() -> Any:
    from pyspark import SparkContext

    return SparkContext._active_spark_context


def _executors(context: Any) -> list[dict[str, Any]]:
    """What the driver knows of its executors, itself included (Spark lists the driver among them): each one's host
    and the tasks it is running now."""
    infos = context._jsc.sc().statusTracker().getExecutorInfos()
    return [{"host": info.host(), "running": info.numRunningTasks()} for info in infos]


def answers(policy: str, queries: list[str]) -> dict[str, Any]:
    with connected(policy) as connection:
        released = [release(connection, sql) for sql in queries]
        context = _context()
        return {"master": context.master, "executors": _executors(context), "released": released}


def time_limit(policy: str, sql: str) -> dict[str, Any]:
    """SQL run into the time limit; then, once the driver shows no job or stage active (no clock: a job that was
    not cancelled ends too, and its tasks then show as completed, not killed), what the cluster ran for dpsql's
    job groups (Spark's own status store: each job's status and tasks killed on the executors)."""
    # The slow query is a LIKE that Spark matches by backtracking, which the engine refuses (spark_sql._like: its
    # time could depend on one row's text); lifted here, in this process only, to have a job that runs long.
    from dpsql.engines import spark_sql

    spark_sql._LINEAR_LIKE = re.compile(".*", re.DOTALL)
    with connected(policy) as connection:
        before = connection.budget().queries
        try:
            connection.cursor().execute(sql)
            error = None
        except ExecutionFailed as exc:
            error = str(exc)
        charged = connection.budget().queries - before
        context = _context()
        tracker = context.statusTracker()
        while tracker.getActiveJobsIds() or tracker.getActiveStageIds() or any(
                e["running"] for e in _executors(context)):
            context._jvm.java.lang.Thread.sleep(100)
        jobs = [{"status": job.status().toString(), "tasks": job.numTasks(), "completed": job.numCompletedTasks(),
                 "killed": job.numKilledTasks(), "active": job.numActiveTasks()}
                for job in _listed(context, context._jsc.sc().statusStore().jobsList(None))
                if job.jobGroup().isDefined() and job.jobGroup().get().startswith("dpsql-")]
        cursor = connection.cursor()  # the engine answers the next query
        cursor.execute("SELECT COUNT(*) FROM t WHERE pid < 10", epsilon=1e6)
        return {"error": error, "charged": charged, "jobs": jobs, "executors": _executors(context),
                "next": cursor.fetchall()}


def _listed(context: Any, sequence: Any) -> list[Any]:
    """A Scala Seq from the JVM (Spark 3.5: Scala 2.12) as a Python list."""
    return list(context._jvm.scala.collection.JavaConverters.seqAsJavaList(sequence))


def main() -> None:
    command, policy, *queries = sys.argv[1:]
    outcome = answers(policy, queries) if command == "answers" else time_limit(policy, queries[0])
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
