"""A Spark standalone cluster on this machine: a master and workers, Spark's own processes (pyspark's
bin/spark-class), bound to 127.0.0.1, started for tests/test_spark_cluster.py and benchmarks/spark_cluster_speed.py
and stopped when the block ends (whatever happens inside it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def environment() -> dict[str, str]:
    """The environment of the cluster's processes and of every driver that joins it."""
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _started(args: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=environment())


def _wait_for(process: subprocess.Popen, log: Path, line: str) -> None:
    """Until `line` is in the process's log; a process that stops first fails (no clock: it either registers or
    dies)."""
    while line not in log.read_text():
        if process.poll() is not None:
            raise RuntimeError(f"a cluster process stopped: {log.read_text()[-2000:]}")
        time.sleep(0.2)


@contextmanager
def standalone(folder: Path, workers: int = 2, cores: int = 2, memory: str = "1g") -> Iterator[str]:
    """The master's URL while the cluster runs; each worker offers `cores` and `memory`. Logs in `folder`
    (master.log, worker<i>.log)."""
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _started(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                       "--webui-port", str(free_port())], folder / "master.log")
    processes = [master]
    try:
        _wait_for(master, folder / "master.log", "I have been elected leader")
        for i in range(workers):
            log = folder / f"worker{i}.log"
            worker = _started(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores",
                               str(cores), "--memory", memory, "--webui-port", str(free_port()), "--work-dir",
                               str(folder / f"work{i}")], log)
            processes.append(worker)
            _wait_for(worker, log, "Successfully registered with master")
        yield url
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            process.wait()
