"""dpsql on a real Spark cluster (issue 34): a standalone master and two workers started here, on this machine (not
`local[*]`), and the CLI run on them. Its answer at a negligible noise is the DuckDB engine's, and the master saw
dpsql's application run executors on both workers.

The cluster's processes are Spark's own (pyspark's bin/spark-class), bound to 127.0.0.1, stopped at the end.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")

from benchmarks.support import create_ledger  # noqa: E402
from tests.conftest import SAMPLE, copy_visits_data  # noqa: E402

pytestmark = pytest.mark.slow  # four JVMs

SPARK_HOME = Path(pyspark.__file__).parent
ENV = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "DPSQL_ANALYST": "cluster"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _started(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=ENV)


def _wait_for(process: subprocess.Popen, log: Path, line: str) -> None:
    """Until `line` is in the process's log; a process that stops first fails the test (no clock: it either
    registers or dies)."""
    while line not in log.read_text():
        assert process.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _started(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                       "--webui-port", str(_free_port())], folder / "master.log")
    processes = [master]
    try:
        _wait_for(master, folder / "master.log", "I have been elected leader")
        for i in range(2):
            log = folder / f"worker{i}.log"
            worker = _started(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
                               "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir",
                               str(folder / f"work{i}")], log)
            processes.append(worker)
            _wait_for(worker, log, "Successfully registered with master")
        yield url, folder
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            process.wait()


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


def test_the_cli_on_a_standalone_cluster_answers_as_duckdb(cluster: tuple[str, Path], tmp_path: Path) -> None:
    url, folder = cluster
    on_spark = _policy(tmp_path / "spark", f'\n[engine]\nkind = "spark"\nmaster = "{url}"\n'
                                           'time_limit_seconds = 600\n\n[engine.spark]\n'
                                           'spark.executor.memory = "512m"\n"spark.cores.max" = 2\n')
    on_duckdb = _policy(tmp_path / "duckdb", "")
    # One row per patient: which rows a unit keeps, chosen by each engine's own secret salt, cannot matter.
    sql = "SELECT insurance, COUNT(*), SUM(chronic_conditions) FROM patients GROUP BY insurance ORDER BY insurance"
    expected = _query(on_duckdb, sql)
    answered = _query(on_spark, sql)
    assert expected.returncode == 0 and expected.stdout.count("\n") == 4, expected.stderr
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert answered.stdout == expected.stdout  # at epsilon 1e6 each noise draw is 0: the exact answers
    master_log = (folder / "master.log").read_text()
    assert "Registering app dpsql" in master_log
    for i in range(2):  # an executor of dpsql's application on each worker ("Asked to launch executor app-...")
        log = (folder / f"worker{i}.log").read_text()
        assert "launch executor" in log and "dpsql" in log, log[-2000:]
