"""One CLI query at scale, with and without the prepared store, against DuckDB's own query on the same Parquet file
(issue 12): `python -m benchmarks.scale [--rows 10000000 100000000] [--runs 3] [--memory-limit 4GB] [--out FILE]`.

Data: generated Parquet of ROWS rows (1-5 rows per person, `state` with 10 values, `income` in [0, 200000]); the
policy declares them with max_rows_per_unit = 5. Every measurement is a fresh process (as a CLI user runs it):
- `dpsql query "SELECT state, COUNT(*), AVG(income) FROM t GROUP BY state"` with `[engine] store = false` (each
  query loads and ranks the whole file, the old way) and with `store = true` after `dpsql prepare` (the query
  attaches the prepared store read-only);
- DuckDB's own query on the Parquet file (`duckdb.sql(...)` in a fresh Python process), not private;
- `dpsql prepare` (once per size), against DuckDB sorting the same data into a table of a database file (what the
  ranking at the heart of preparing costs).
Time is the process's wall clock, memory its peak resident set size (the parent reads ru_maxrss of its only
child). DuckDB's query and dpsql's prepared query take turns, so that load on the machine hits both alike. The
store rows use the policy's `memory_limit` when --memory-limit is given (and `prepare_memory_limit` for the build
with --prepare-memory-limit). Sized for the 2-core, 24 GB machine: 10M rows take about a minute, 100M about 10
minutes and 12 GB of disk in a scratch folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

QUERY = "SELECT state, COUNT(*), AVG(income) FROM t GROUP BY state"
_MEASURE = """
import resource, subprocess, sys, time, json
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
elapsed = time.perf_counter() - started
print(json.dumps({"seconds": elapsed, "rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "rc": done.returncode, "stderr": done.stderr[-500:]}))
"""
_DUCKDB_QUERY = "import duckdb, sys; duckdb.sql(sys.argv[1]).fetchall()"


def generate(path: Path, rows: int) -> None:
    """ROWS rows of 1-5 per person, written by DuckDB straight to Parquet (no Python row ever)."""
    people = rows // 3 + 1
    with duckdb.connect() as con:
        con.execute(f"""COPY (
            SELECT pid, (hash(pid, 1) % 10)::INT AS state, (hash(pid, j, 2) % 200001)::INT AS income
            FROM (SELECT range AS pid, 1 + (hash(range) % 5)::INT AS n FROM range({people})) AS p,
                 range(5) AS r(j)
            WHERE j < n LIMIT {rows}) TO '{path}' (FORMAT PARQUET)""")


def write_policy(folder: Path, data: Path, store: bool, memory_limit: str | None,
                 prepare_memory_limit: str | None = None) -> Path:
    engine = [f"store = {'true' if store else 'false'}"]
    if memory_limit and store:
        engine.append(f'memory_limit = "{memory_limit}"')
    if prepare_memory_limit and store:
        engine.append(f'prepare_memory_limit = "{prepare_memory_limit}"')
    path = folder / f"scale_{'store' if store else 'load'}.toml"
    path.write_text(f"""[budget]
epsilon = 1000000.0
delta = 1e-6
query_epsilon = 1.0

[engine]
time_limit_seconds = 3600
{chr(10).join(engine)}

[tables.t]
source = "{data}"
privacy_unit = "pid"
max_rows_per_unit = 5

[tables.t.columns]
pid = {{ type = "int" }}
state = {{ type = "int", lower = 0, upper = 9, nullable = false }}
income = {{ type = "int", lower = 0, upper = 200000, nullable = false }}
""")
    return path


def measure(command: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    if result["rc"] != 0:
        raise RuntimeError(f"{command[:3]} failed: {result['stderr']}")
    return result


def _median(command: list[str], runs: int) -> dict:
    return _summary([measure(command) for _ in range(runs)])


def _paired(native: list[str], command: list[str], runs: int) -> tuple[dict, dict]:
    """Both commands in turn, `runs` times: whatever else the machine does hits both alike."""
    pairs = [(measure(native), measure(command)) for _ in range(runs)]
    return _summary([a for a, _ in pairs]), _summary([b for _, b in pairs])


def _summary(results: list[dict]) -> dict:
    return {"seconds": statistics.median(r["seconds"] for r in results),
            "rss_mib": statistics.median(r["rss_mib"] for r in results)}


def run_size(rows: int, runs: int, scratch: Path, memory_limit: str | None, store_only: bool = False,
             prepare_memory_limit: str | None = None) -> list[dict]:
    data = scratch / f"scale_{rows}.parquet"
    if not data.exists():
        generate(data, rows)
    dpsql = [sys.executable, "-m", "dpsql"]
    load_policy, store_policy = (write_policy(scratch, data, s, memory_limit, prepare_memory_limit)
                                 for s in (False, True))
    for policy in (load_policy, store_policy) if not store_only else (store_policy,):
        subprocess.run([*dpsql, "budget", "--init", "--no-history", "--policy", str(policy)], check=True,
                       capture_output=True)
    store_file = scratch / "scale_store.store.duckdb"
    store_file.unlink(missing_ok=True)
    prepare = measure([*dpsql, "prepare", "--policy", str(store_policy)])
    native, stored = _paired([sys.executable, "-c", _DUCKDB_QUERY, QUERY.replace(" t ", f" read_parquet('{data}') ")],
                             [*dpsql, "query", QUERY, "--policy", str(store_policy)], runs)
    if store_only:  # the sizes beyond memory: loading without a limit, or sorting in memory, would not fit
        return [{"rows": rows, "what": "DuckDB's own query on the Parquet file", **native},
                {"rows": rows, "what": "dpsql query, prepared store", **stored},
                {"rows": rows, "what": "dpsql prepare (once)", "seconds": prepare["seconds"],
                 "rss_mib": prepare["rss_mib"]}]
    sort_db = scratch / "sorted.duckdb"
    sort_db.unlink(missing_ok=True)
    sort = measure([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[2]); c.execute(sys.argv[1])",
                    f"CREATE TABLE s AS SELECT *, hash(pid, state, income) AS h FROM read_parquet('{data}') "
                    f"ORDER BY pid, h", str(sort_db)])
    sort_db.unlink(missing_ok=True)
    loaded = _median([*dpsql, "query", QUERY, "--policy", str(load_policy)], runs)
    return [
        {"rows": rows, "what": "DuckDB's own query on the Parquet file", **native},
        {"rows": rows, "what": "dpsql query, prepared store", **stored},
        {"rows": rows, "what": "dpsql query, loading the file (store = false)", **loaded},
        {"rows": rows, "what": "dpsql prepare (once)", "seconds": prepare["seconds"], "rss_mib": prepare["rss_mib"]},
        {"rows": rows, "what": "DuckDB sorting the data into a database file", "seconds": sort["seconds"],
         "rss_mib": sort["rss_mib"]},
    ]


def table(results: list[dict], memory_limit: str | None, prepare_memory_limit: str | None = None) -> str:
    lines = ["| rows | what | seconds | x DuckDB's query | peak RSS MiB | x DuckDB's memory |",
             "|---|---|---|---|---|---|"]
    for rows in sorted({r["rows"] for r in results}):
        here = [r for r in results if r["rows"] == rows]
        native = here[0]
        for r in here:
            lines.append(f"| {rows:,} | {r['what']} | {r['seconds']:.2f} | {r['seconds'] / native['seconds']:.2f} | "
                         f"{r['rss_mib']:.0f} | {r['rss_mib'] / native['rss_mib']:.2f} |")
    limit = f"; the prepared store's policy sets memory_limit = {memory_limit!r}" if memory_limit else ""
    if prepare_memory_limit:
        limit += f" and prepare_memory_limit = {prepare_memory_limit!r}"
    return "\n".join(lines) + f"\n\nQuery: `{QUERY}`{limit}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory-limit", default=None)
    parser.add_argument("--prepare-memory-limit", default=None, help="the store build's own limit")
    parser.add_argument("--store-only", action="store_true",
                        help="only prepare and the prepared query (for sizes beyond memory; use with --memory-limit)")
    parser.add_argument("--scratch", type=Path, default=None, help="Folder for the data (default: a temporary one).")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpsql-scale-") as temporary:
        scratch = args.scratch or Path(temporary)
        scratch.mkdir(parents=True, exist_ok=True)
        results = [r for rows in args.rows
                   for r in run_size(rows, args.runs, scratch, args.memory_limit, args.store_only,
                                     args.prepare_memory_limit)]
    text = table(results, args.memory_limit, args.prepare_memory_limit)
    print(text)
    if args.out:
        args.out.write_text(f"# Scale: one CLI query against DuckDB's own\n\n`python -m benchmarks.scale "
                            f"{' '.join(sys.argv[1:])}`\n\n{text}")


if __name__ == "__main__":
    main()
