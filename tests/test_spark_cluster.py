"""dpsql on a real Spark cluster (issue 34): a standalone master and two workers started here, on this machine (not
`local[*]`), and every front end run on them: the CLI, the DB-API and `dpsql serve` queried with psycopg, each
in a process of its own (a process holds one SparkContext, of one master). Their answers at a negligible noise are
the DuckDB engine's, and the master saw dpsql's applications run executors on both workers. The time limit cancels
the job on the cluster: the query fails with the generic error and is charged, as on DuckDB, and no job, stage or
task is left running.

The cluster (benchmarks/spark_cluster.py) is Spark's own processes, bound to 127.0.0.1, stopped at the end of the
module. Each worker offers two cores (of the machine's two), so that two of dpsql's applications (each taking one
core on each worker) could hold executors at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

import dpsql
from benchmarks.spark_cluster import environment, standalone
from benchmarks.support import create_ledger, write_csv, write_policy
from dpsql.errors import ExecutionFailed
from tests.conftest import SAMPLE, copy_visits_data
from tests.spark_cluster_driver import connected, release

pytestmark = pytest.mark.slow  # three JVMs, and a driver and two executors for each front end

ENV = {**environment(), "DPSQL_ANALYST": "cluster"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("cluster")
    with standalone(folder, workers=2, cores=2, memory="1g") as url:
        yield url, folder


def _on_cluster(url: str, extra: str = "") -> str:
    """The [engine] section that runs on the cluster: one core and 512 MiB on each worker."""
    return (f'\n[engine]\nkind = "spark"\nmaster = "{url}"\ntime_limit_seconds = 600\n{extra}\n[engine.spark]\n'
            'spark.executor.memory = "512m"\n"spark.cores.max" = 2\n')


def _policy(folder: Path, engine: str) -> Path:
    folder.mkdir()
    copy_visits_data(folder)
    text = (SAMPLE / "visits.toml").read_text().replace("epsilon = 50.0", "epsilon = 100000000.0")
    path = folder / "visits.toml"
    path.write_text(text + engine)
    return create_ledger(path)


def _query(policy: Path, sql: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsql", "query", sql, "--policy", str(policy), "--epsilon",
                           "1000000", "--format", "csv"], env=ENV, capture_output=True, text=True)


# One row per patient: which rows a unit keeps, chosen by each engine's own secret salt, cannot matter.
CLUSTER_QUERY = ("SELECT insurance, COUNT(*), SUM(chronic_conditions) FROM patients GROUP BY insurance "
                 "ORDER BY insurance")


def test_the_cli_on_a_standalone_cluster_answers_as_duckdb(cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, folder = cluster
    on_spark = _policy(tmp_path / "spark", _on_cluster(url))
    on_duckdb = _policy(tmp_path / "duckdb", "")
    expected = _query(on_duckdb, CLUSTER_QUERY)
    answered = _query(on_spark, CLUSTER_QUERY)
    assert expected.returncode == 0 and expected.stdout.count("\n") == 4, expected.stderr
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert answered.stdout == expected.stdout  # at epsilon 1e6 each noise draw is 0: the exact answers
    master_log = (folder / "master.log").read_text()
    assert "Registering app dpsql" in master_log
    for i in range(2):  # an executor of dpsql's application on each worker ("Asked to launch executor app-...")
        log = (folder / f"worker{i}.log").read_text()
        assert "launch executor" in log and "dpsql" in log, log[-2000:]


# Shapes with several rows per unit (the portable ranking, seeded alike), a join, a per-unit subquery, a quantile.
DBAPI_QUERIES = [
    "SELECT region, COUNT(*), AVG(cost), SUM(length_of_stay) FROM visits GROUP BY region ORDER BY region",
    "SELECT p.insurance, COUNT(*), AVG(v.cost) FROM visits v JOIN patients p ON v.patient_id = p.patient_id "
    "GROUP BY p.insurance ORDER BY p.insurance",
    "SELECT n, COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) AS u GROUP BY n "
    "ORDER BY n",
    "SELECT MEDIAN(age), COUNT(DISTINCT department) FROM visits WHERE cost > 100",
]


def _driver(*args: str) -> dict:
    """tests/spark_cluster_driver.py in a process of its own (its own SparkContext, on the cluster)."""
    done = subprocess.run([sys.executable, "-m", "tests.spark_cluster_driver", *args], env=ENV, capture_output=True,
                          text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_dbapi_on_a_standalone_cluster_answers_as_duckdb(cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = cluster
    on_spark = _policy(tmp_path / "spark", _on_cluster(url))
    on_duckdb = _policy(tmp_path / "duckdb", "")
    answered = _driver("answers", str(on_spark), *DBAPI_QUERIES)
    with connected(str(on_duckdb)) as duck:
        expected = [release(duck, sql) for sql in DBAPI_QUERIES]
    assert answered["released"] == expected
    assert answered["master"] == url
    # The driver and an executor on each worker (every process of the cluster is on 127.0.0.1: counted, not named).
    assert len(answered["executors"]) == 3, answered["executors"]


# A text whose LIKE makes Java's regular expressions backtrack: about a second a row on this machine, where DuckDB's
# LIKE takes microseconds. 64 rows, so the job outlives the time limit by far. (The engine refuses such a LIKE:
# tests/spark_cluster_driver.py lifts that refusal in its own process, to have a long job to cancel.)
SLOW_ROWS, SLOW_TEXT, SLOW_LIKE = 64, "a" * 100, "SELECT COUNT(*) FROM t WHERE s LIKE '%a%a%a%a%b'"


def test_the_time_limit_cancels_the_job_on_the_cluster(cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = cluster
    write_csv(tmp_path / "t.csv", ["pid", "s"], [(i, SLOW_TEXT) for i in range(SLOW_ROWS)])
    policy = write_policy(tmp_path / "t.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "s": {"type": "text"}}}}, {"epsilon": 1e9})
    # The steward allows a costly row (analysis/person_work.py), and eight partitions, so the job has tasks to
    # cancel on both workers.
    policy.write_text(policy.read_text() + _on_cluster(url, "max_person_slowdown = 100\n").replace(
        "time_limit_seconds = 600", "time_limit_seconds = 4") + '"spark.sql.shuffle.partitions" = 8\n'
        '"spark.sql.adaptive.enabled" = false\n')
    create_ledger(policy)
    seen = _driver("time-limit", str(policy), SLOW_LIKE)
    # As on DuckDB (tests/test_engine_results.py): the generic error, and charged, for it ran on the data.
    assert seen["error"] == ExecutionFailed.MESSAGE and seen["charged"] == 1, seen
    # The job was stopped, not waited out: tasks of it were killed on the executors, it did not complete the
    # others, and once the driver shows no job or stage active, no executor runs a task.
    assert [job["status"] for job in seen["jobs"]] == ["FAILED"], seen
    assert seen["jobs"][0]["killed"] > 0 and seen["jobs"][0]["completed"] < seen["jobs"][0]["tasks"], seen
    assert [e["running"] for e in seen["executors"]] == [0, 0, 0], seen
    assert seen["next"] == [[10]], seen  # pids 0-9, at a negligible noise


def test_the_server_on_a_standalone_cluster_answers_psycopg_as_duckdb(cluster: tuple[str, Path],
                                                                        tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg")
    url, folder = cluster
    on_spark = _policy(tmp_path / "spark", _on_cluster(url))
    on_duckdb = _policy(tmp_path / "duckdb", "")
    added = subprocess.run([sys.executable, "-m", "dpsql", "user", "add", "alice", "--policy", str(on_spark),
                            "--password-stdin"], input="correct horse\n", env=ENV, capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    log = folder / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "dpsql", "serve", "--policy", str(on_spark), "--port", "0",
                                   "--quiet"], env=ENV, stderr=out, stdout=subprocess.DEVNULL)
    try:
        while (port := re.search(r"serving \S+ on [\d.]+:(\d+)", log.read_text())) is None:
            assert server.poll() is None, log.read_text()[-3000:]  # it either serves or dies: no clock
            time.sleep(0.2)
        with psycopg.connect(host="127.0.0.1", port=int(port.group(1)), user="alice", password="correct horse",
                             dbname="visits", sslmode="disable", autocommit=True) as client:
            client.execute("SET dpsql.epsilon = 1000000")
            served = client.execute(CLUSTER_QUERY).fetchall()
            # The server's own engine is Spark on the cluster: a query it cannot run there is refused, free.
            with pytest.raises(psycopg.Error, match="not supported on the Spark engine"):
                client.execute("SELECT COUNT(*) FROM visits WHERE department ILIKE 'c%'")
    finally:
        server.terminate()
        server.wait()
    with dpsql.connect(str(on_duckdb), "cluster", epsilon=1e6) as duck:
        cursor = duck.cursor()
        cursor.execute(CLUSTER_QUERY)
        expected = cursor.fetchall()
    # Integer cells at epsilon 1e6: each noise draw is 0 (the server's noise is not seeded).
    assert [tuple(int(v) if not isinstance(v, str) else v for v in row) for row in served] == expected
    assert len(expected) == 3
    assert (folder / "master.log").read_text().count("Registering app dpsql") >= 2  # the server's own application
