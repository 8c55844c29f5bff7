"""Accuracy of joins against Tumult Analytics at equal epsilon (issue 9):
`python -m benchmarks.joins_accuracy [--patients 20000] [--runs 30] [--epsilons 0.1 1]`.

Two queries on the sample schema at scale (sample_data/generate_visits.py), both grouped by public keys:
- public join: visits JOIN departments (public, unique key) GROUP BY specialty_group: COUNT(*), AVG(length_of_stay);
- private join: visits JOIN patients (same unit, one row per patient) GROUP BY insurance: COUNT(*),
  AVG(length_of_stay).
dpsql answers each with its SQL at epsilon e (its own allocation between the count and the average). Tumult 0.21
answers the same with `join_public` / `join_private` (ID-based, one ID space), MaxRowsPerID(5) as dpsql's
max_rows_per_unit, a count and an average(length_of_stay, 0, 30) at e/2 each (a query's epsilon split evenly, as the
main accuracy benchmark configures Tumult). Tumult runs in its own virtualenv (benchmarks/.venvs/tumult, see
benchmarks/README.md) as a subprocess of this script, on the same files. The truth is the exact answer on all rows.
The figure per cell is the median absolute error over the runs; the ratio is dpsql's over Tumult's (below 1: dpsql
is more accurate). Sized for a 2-core machine: the default data are about 42,000 visits, and Spark's start dominates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
SAMPLE = BENCHMARKS.parent / "sample_data"
TUMULT_PYTHON = BENCHMARKS / ".venvs" / "tumult" / "bin" / "python"
M = 5
QUERIES = {
    "public join": ("SELECT d.specialty_group AS k, COUNT(*) AS n, AVG(v.length_of_stay) AS a FROM visits v "
                    "JOIN departments d ON v.department = d.department GROUP BY d.specialty_group",
                    "departments", "specialty_group", ["emergency", "medical", "surgical"]),
    "private join": ("SELECT p.insurance AS k, COUNT(*) AS n, AVG(v.length_of_stay) AS a FROM visits v "
                     "JOIN patients p ON v.patient_id = p.patient_id GROUP BY p.insurance",
                     "patients", "insurance", ["none", "private", "public"]),
}


def _data(folder: Path, patients: int) -> Path:
    subprocess.run([sys.executable, str(SAMPLE / "generate_visits.py"), "--patients", str(patients),
                    "--out", str(folder / "visits.csv")], check=True, capture_output=True)
    policy = folder / "visits.toml"
    policy.write_text((SAMPLE / "visits.toml").read_text().replace("epsilon = 50.0", "epsilon = 1000000.0"))
    return policy


def _truth(folder: Path) -> dict[str, dict[str, tuple[float, float]]]:
    import duckdb  # here, not at the top: Tumult's virtualenv runs this module too, without it
    con = duckdb.connect()
    for table in ("visits", "patients", "departments", "regions"):
        con.execute(f"CREATE TABLE {table} AS SELECT * FROM read_csv('{folder / table}.csv', header = true)")
    return {name: {row[0]: (float(row[1]), float(row[2])) for row in con.execute(sql).fetchall()}
            for name, (sql, *_) in QUERIES.items()}


def _dpsql(policy: Path, epsilons: list[float], runs: int) -> dict:
    from benchmarks.support import create_ledger
    from dpsql.session import PrivateSession
    create_ledger(policy)
    session = PrivateSession(policy, "bench")
    answers: dict = {}
    try:
        for name, (sql, *_) in QUERIES.items():
            for epsilon in epsilons:
                answers[f"{name}|{epsilon}"] = [
                    {row[0]: (row[1], row[2]) for row in session.execute(sql, epsilon=epsilon).rows}
                    for _ in range(runs)]
    finally:
        session.close()
    return answers


def _tumult_job(job: dict) -> dict:
    """Runs inside Tumult's virtualenv."""
    import os
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this virtualenv's, which has tmlt
    import pandas as pd
    from pyspark.sql import SparkSession
    from tmlt.analytics import AddRowsWithID, KeySet, MaxRowsPerID, PureDPBudget, QueryBuilder, Session

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .config("spark.sql.shuffle.partitions", "4") \
        .config("spark.sql.warehouse.dir", str(Path(job["folder"]) / "spark-warehouse")).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    folder = Path(job["folder"])
    visits = spark.createDataFrame(pd.read_csv(folder / "visits.csv")[["patient_id", "department",
                                                                       "length_of_stay"]])
    patients = spark.createDataFrame(pd.read_csv(folder / "patients.csv")[["patient_id", "insurance"]])
    departments = spark.createDataFrame(pd.read_csv(folder / "departments.csv")[["department",
                                                                                 "specialty_group"]])
    answers: dict = {}
    for name, (_, joined, key, values) in QUERIES.items():
        for epsilon in job["epsilons"]:
            cells = []
            for _ in range(job["runs"]):
                session = (Session.Builder().with_privacy_budget(PureDPBudget(epsilon)).with_id_space("patient")
                           .with_private_dataframe("visits", visits, AddRowsWithID("patient_id", "patient"))
                           .with_private_dataframe("patients", patients, AddRowsWithID("patient_id", "patient"))
                           .with_public_dataframe("departments", departments).build())
                base = QueryBuilder("visits")
                base = base.join_public("departments") if joined == "departments" else base.join_private("patients")
                grouped = base.enforce(MaxRowsPerID(M)).groupby(KeySet.from_dict({key: values}))
                counts = session.evaluate(grouped.count(name="n"), PureDPBudget(epsilon / 2)).toPandas()
                base = QueryBuilder("visits")
                base = base.join_public("departments") if joined == "departments" else base.join_private("patients")
                grouped = base.enforce(MaxRowsPerID(M)).groupby(KeySet.from_dict({key: values}))
                means = session.evaluate(grouped.average("length_of_stay", 0, 30, name="a"),
                                         PureDPBudget(epsilon / 2)).toPandas()
                merged = counts.merge(means, on=key)
                cells.append({row[key]: (float(row["n"]), float(row["a"])) for _, row in merged.iterrows()})
            answers[f"{name}|{epsilon}"] = cells
    spark.stop()
    return answers


def _median_errors(answers: list[dict], truth: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    return {key: (statistics.median(abs(a[key][0] - true[0]) for a in answers if key in a),
                  statistics.median(abs(a[key][1] - true[1]) for a in answers if key in a and a[key][1] is not None))
            for key, true in truth.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--out", type=Path, default=None, help="also write the table as Markdown")
    parser.add_argument("--tumult-job", type=Path, default=None, help=argparse.SUPPRESS)  # the subprocess's side
    args = parser.parse_args()
    if args.tumult_job is not None:
        job = json.loads(args.tumult_job.read_text())
        Path(job["result"]).write_text(json.dumps(_tumult_job(job)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        policy = _data(folder, args.patients)
        truth = _truth(folder)
        mine = _dpsql(policy, args.epsilons, args.runs)
        job = folder / "job.json"
        job.write_text(json.dumps({"folder": str(folder), "epsilons": args.epsilons, "runs": args.runs,
                                   "result": str(folder / "tumult.json")}))
        subprocess.run([str(TUMULT_PYTHON), "-m", "benchmarks.joins_accuracy", "--tumult-job", str(job)],
                       check=True, cwd=BENCHMARKS.parent)
        theirs = json.loads((folder / "tumult.json").read_text())
    lines = [f"{args.patients} patients, {args.runs} runs per cell; median absolute error (dpsql / Tumult 0.21)", "",
             "| query | epsilon | group | COUNT dpsql | COUNT Tumult | ratio | AVG dpsql | AVG Tumult | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in QUERIES:
        for epsilon in args.epsilons:
            ours = _median_errors(mine[f"{name}|{epsilon}"], truth[name])
            peer = _median_errors(theirs[f"{name}|{epsilon}"], truth[name])
            for key in sorted(truth[name]):
                (cn, ca), (tn, ta) = ours[key], peer[key]
                lines.append(f"| {name} | {epsilon:g} | {key} | {cn:.3g} | {tn:.3g} | {cn / tn:.2f} | {ca:.3g} | "
                             f"{ta:.3g} | {ca / ta:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
