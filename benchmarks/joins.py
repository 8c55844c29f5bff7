"""Joins and per-unit aggregation against plain DuckDB (issue 9): `python -m benchmarks.joins [--patients 200000]`.

The sample schema at scale (sample_data/generate_visits.py writes visits, patients, departments and regions from
the same patients), under sample_data/visits.toml with the sources swapped for the generated files. Each query is
`PrivateSession.execute` end to end (the session open, tables loaded once) against the same SQL in plain DuckDB
on its own in-memory copy of the tables, alternating in one process; the figure is the median of the run-by-run
ratios. Sized for a shared 2-core machine: 200,000 patients are about 420,000 visits.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.support import create_ledger
from dpsql.session import PrivateSession

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
TABLES = ("visits", "patients", "departments", "regions")
QUERIES = {
    "public join": "SELECT d.specialty_group, COUNT(*), AVG(v.cost) FROM visits v "
                   "JOIN departments d ON v.department = d.department GROUP BY d.specialty_group",
    "private join": "SELECT p.insurance, COUNT(*), AVG(v.cost) FROM visits v "
                    "JOIN patients p ON v.patient_id = p.patient_id GROUP BY p.insurance",
    "per-unit": "SELECT n, COUNT(*), AVG(s) FROM (SELECT patient_id, COUNT(*) AS n, SUM(cost) AS s FROM visits "
                "GROUP BY patient_id) AS p GROUP BY n",
    "single table": "SELECT department, COUNT(*), AVG(cost) FROM visits GROUP BY department",
}


def _data(folder: Path, patients: int) -> Path:
    subprocess.run([sys.executable, str(SAMPLE / "generate_visits.py"), "--patients", str(patients),
                    "--out", str(folder / "visits.csv")], check=True, capture_output=True)
    policy = folder / "visits.toml"
    policy.write_text((SAMPLE / "visits.toml").read_text().replace("epsilon = 50.0", "epsilon = 1000000.0"))
    return create_ledger(policy)


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(patients: int, reps: int) -> dict[str, tuple[float, float, float]]:
    """Per query: dpsql's median seconds, DuckDB's, and the median ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        policy = _data(folder, patients)
        session = PrivateSession(policy, "bench")
        plain = duckdb.connect()
        for table in TABLES:
            plain.execute(f"CREATE TABLE {table} AS SELECT * FROM read_csv('{folder / table}.csv', header = true)")
        results = {}
        try:
            for name, sql in QUERIES.items():
                ours, theirs = [], []
                session.execute(sql)  # warm: the plan is cached, as for an analyst asking again
                for _ in range(reps):
                    ours.append(_timed(lambda sql=sql: session.execute(sql)))
                    theirs.append(_timed(lambda sql=sql: plain.execute(sql).fetchall()))
                ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
                results[name] = (statistics.median(ours), statistics.median(theirs), ratio)
        finally:
            session.close()
            plain.close()
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    for name, (ours, theirs, ratio) in measure(args.patients, args.reps).items():
        print(f"{name:14s} dpsql {ours * 1000:8.1f} ms  duckdb {theirs * 1000:8.1f} ms  ratio {ratio:5.2f}")


if __name__ == "__main__":
    main()
