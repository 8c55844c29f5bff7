"""Filtered queries against plain DuckDB (issue 16): `python -m benchmarks.filtered [--rows 1000000 10000000]`.

The grouped query (GROUP BY department: COUNT(*), AVG(cost)) on the synthetic visits table, without a filter, with
`WHERE age > 30` (age is the same on all of a patient's rows in this data) and with `WHERE cost > 500` (which
varies between a patient's rows), under max_rows_per_unit = 5 (nobody exceeds it) and 3 (12% of patients do,
with 27% of the rows; nobody has more than 5, so the cap's window, for people with more than m + 4 rows, never
has work here), with `age` declared per_unit or not; and, filtered on cost, the join path (the public departments
table) and the per-unit aggregation path (a patient's total, then a count). dpsql is `PrivateSession.execute` end to end
(check, plan, rewrite, engine, noise, post-processing; the session already open, so the data loaded once); DuckDB
is the same SQL on its own in-memory tables of the same files, and again with `department` as an ENUM (dpsql
groups a column with declared values by a small integer code: DuckDB grouping an ENUM does the same, so that
column shows what is left once the encoding is taken out). They alternate in one process, and the figures are
the medians of the run-by-run ratios. Sized for the 2-core machine: 10M rows need about 6 GB.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from benchmarks.datasets import DATA_DIR, SAMPLE, visits
from dpsql.session import PrivateSession

QUERY = "SELECT department, COUNT(*), AVG(cost) FROM visits {where} GROUP BY department"
WHERES = ("", "WHERE age > 30", "WHERE cost > 500")
# The other paths a filter takes, each filtered on a column that varies between a patient's rows.
PATHS = {
    "join, WHERE d.beds > 20 AND v.cost > 500":
        "SELECT v.department, COUNT(*), AVG(v.cost) FROM visits v JOIN departments d ON v.department = d.department "
        "WHERE d.beds > 20 AND v.cost > 500 GROUP BY v.department",
    "per-unit SUM, WHERE cost > 500":
        "SELECT COUNT(*) FROM (SELECT patient_id, SUM(cost) AS total FROM visits WHERE cost > 500 "
        "GROUP BY patient_id) AS t WHERE total > 1000",
}
DEPARTMENTS = SAMPLE / "departments.csv"
AGE = 'age = { type = "int", lower = 0, upper = 100, nullable = false }'


def _policy(folder: Path, rows: int, max_rows: int, per_unit: bool, data_dir: Path) -> Path:
    dataset = visits(rows, data_dir)
    path = dataset.write_policy(folder / f"filtered_{max_rows}_{per_unit}")
    text = path.read_text().replace("max_rows_per_unit = 5", f"max_rows_per_unit = {max_rows}")
    if per_unit:
        if AGE not in text:
            raise RuntimeError("the benchmark policy's age declaration changed: update benchmarks/filtered.py")
        text = text.replace(AGE, AGE[:-2] + ", per_unit = true }")
    # The public departments table of the shipped policy, for the join.
    text += (f'\n[tables.departments]\nsource = "{DEPARTMENTS}"\npublic = true\n\n[tables.departments.columns]\n'
             'department = { type = "text" }\nfloor = { type = "int" }\nbeds = { type = "int" }\n'
             'specialty_group = { type = "text" }\n')
    path.write_text(text)
    return path


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(rows: int, runs: int, data_dir: Path) -> list[dict]:
    dataset = visits(rows, data_dir)
    plain = duckdb.connect()
    plain.execute(f"CREATE TABLE visits AS SELECT * FROM read_parquet('{dataset.data_path}')")
    plain.execute(f"CREATE TABLE departments AS SELECT * FROM read_csv('{DEPARTMENTS}')")
    # DuckDB again with the grouping column as an ENUM: grouping by a small integer as dpsql's codes do (its keys
    # with declared values), which a DuckDB user can also do: the fair comparison for what the encoding gains.
    encoded = duckdb.connect()
    encoded.execute(f"CREATE TABLE raw AS SELECT * FROM read_parquet('{dataset.data_path}')")
    encoded.execute("CREATE TYPE department_enum AS ENUM (SELECT DISTINCT department FROM raw WHERE department IS "
                    "NOT NULL ORDER BY 1)")
    encoded.execute("CREATE TABLE visits AS SELECT * REPLACE (CAST(department AS department_enum) AS department) "
                    "FROM raw")
    encoded.execute("DROP TABLE raw")
    encoded.execute(f"CREATE TABLE departments AS SELECT * FROM read_csv('{DEPARTMENTS}')")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for max_rows in (5, 3):
            for per_unit in (False, True):
                session = PrivateSession(_policy(Path(scratch), rows, max_rows, per_unit, data_dir), "bench",
                                         create_ledger=True)
                try:
                    queries = {where or "-": QUERY.format(where=where) for where in WHERES}
                    if not per_unit:  # the paths below filter on cost: declaring age per_unit changes nothing
                        queries |= PATHS
                    for label, sql in queries.items():
                        session.execute(sql)  # prepared once, as a dashboard's repeated question is
                        timings = [(_timed(lambda: session.execute(sql)),  # noqa: B023 - called at once
                                  _timed(lambda: plain.execute(sql).fetchall()),  # noqa: B023
                                  _timed(lambda: encoded.execute(sql).fetchall())) for _ in range(runs)]  # noqa: B023
                        results.append({
                            "rows": dataset.rows, "max_rows": max_rows, "per_unit": per_unit, "where": label,
                            "dpsql_ms": 1000 * statistics.median(d for d, _, _ in timings),
                            "duckdb_ms": 1000 * statistics.median(p for _, p, _ in timings),
                            "ratio": statistics.median(d / p for d, p, _ in timings),
                            "enum_ms": 1000 * statistics.median(e for _, _, e in timings),
                            "enum_ratio": statistics.median(d / e for d, _, e in timings),
                        })
                finally:
                    session.close()
    plain.close()
    encoded.close()
    return results


def table(results: list[dict]) -> str:
    lines = ["| rows | max_rows_per_unit | age per_unit | query | dpsql ms | DuckDB ms | x DuckDB | DuckDB, ENUM ms | "
             "x DuckDB, ENUM |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['rows']:,} | {r['max_rows']} | {'yes' if r['per_unit'] else 'no'} | {r['where']} | "
              f"{r['dpsql_ms']:.1f} | {r['duckdb_ms']:.1f} | {r['ratio']:.2f} | {r['enum_ms']:.1f} | "
              f"{r['enum_ratio']:.2f} |" for r in results]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "filtered.md")
    args = parser.parse_args()
    results = [r for rows in args.rows for r in measure(rows, args.runs, args.data_dir)]
    text = table(results)
    print(text)
    args.out.write_text(f"# Filtered queries against plain DuckDB\n\n{__doc__.strip()}\n\n{text}\n")


if __name__ == "__main__":
    main()
