"""The speed benchmark's own processes (dpsql's virtualenv): `python -m benchmarks.speed_worker` < job.json.

Each size runs in fresh processes so that a peak resident set size belongs to one system:
- "paired": dpsql is loaded and warmed up first, and its peak RSS is read then (dpsql alone); then the same
  data file is loaded into a plain DuckDB table and the timed runs alternate DuckDB and dpsql, swapping which goes
  first, so that both see the same machine load and their ratio is taken run by run;
- "duckdb": plain DuckDB alone, for its own peak RSS.
dpsql runs `execute` end to end with its default secure generator, as in production.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from benchmarks.datasets import source_sql
from benchmarks.peers.protocol import emit, peak_rss_mb, read_job, timed
from dpsql.session import PrivateSession


def _load_duckdb(job: dict[str, Any]) -> tuple[float, duckdb.DuckDBPyConnection]:
    con = duckdb.connect(":memory:")
    load_s, _ = timed(lambda: con.execute(
        f"CREATE TABLE {job['table']} AS SELECT * FROM {source_sql(Path(job['data']))}"))
    return load_s, con


def paired(job: dict[str, Any]) -> None:
    sql, epsilon = job["sql"], job["epsilon"]
    dpsql_load, session = timed(lambda: PrivateSession(job["policy"], analyst="bench", create_ledger=True))
    session.execute(sql, epsilon=epsilon)
    dpsql_peak = peak_rss_mb()
    duck_load, con = _load_duckdb(job)
    con.execute(sql).fetchall()

    def plain() -> float:
        return timed(lambda: con.execute(sql).fetchall())[0]

    def private() -> float:
        return timed(lambda: session.execute(sql, epsilon=epsilon))[0]

    duck_times, dpsql_times = [], []
    for rep in range(job["reps"]):
        if rep % 2 == 0:
            duck_times.append(plain())
            dpsql_times.append(private())
        else:
            dpsql_times.append(private())
            duck_times.append(plain())
    emit({"kind": "paired", "dpsql": {"load_s": dpsql_load, "times": dpsql_times, "peak_rss_mb": dpsql_peak},
          "duckdb": {"load_s": duck_load, "times": duck_times}})


def duckdb_alone(job: dict[str, Any]) -> None:
    load_s, con = _load_duckdb(job)
    con.execute(job["sql"]).fetchall()
    times = [timed(lambda: con.execute(job["sql"]).fetchall())[0] for _ in range(job["reps"])]
    emit({"kind": "duckdb", "load_s": load_s, "times": times, "peak_rss_mb": peak_rss_mb()})


if __name__ == "__main__":
    job = read_job()
    {"paired": paired, "duckdb": duckdb_alone}[job["mode"]](job)
