"""COUNT(*), SUM and AVG of a column declared nullable or not: `python -m benchmarks.nullable_counts`.

The benchmark's visits table (about 100,000 rows; no cost is ever NULL there) under the shipped policy with `cost`
declared `nullable = false` (as the accuracy workload does) and nullable (the default), the grouped query
`SELECT department, COUNT(*), SUM(cost), AVG(cost) ... GROUP BY department` at epsilon 1, `--runs` releases with
seeded noise, against the exact answer. Prints the median over departments of the median relative error per
aggregate: what a nullable declaration costs, and what the disjoint counts of issue 13 win back. Peers are in the
accuracy benchmark (their figures do not depend on dpsql's declaration).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
from pathlib import Path

import duckdb

from benchmarks.datasets import DATA_DIR, visits
from benchmarks.support import seeded
from dpsql.session import PrivateSession

QUERY = "SELECT department, COUNT(*), SUM(cost), AVG(cost) FROM visits GROUP BY department"
AGGREGATES = ("COUNT(*)", "SUM(cost)", "AVG(cost)")
NOT_NULL = 'cost = { type = "float", lower = 0, upper = 5000, nullable = false }'


def errors(nullable: bool, runs: int, data_dir: Path) -> dict[str, float]:
    dataset = visits(100_000, data_dir)
    # The bounded truth, where every system's noise is centred: the cap of 5 rows per patient never binds here, and
    # cost is clamped to its declared [0, 5000].
    clamped = "least(greatest(cost, 0), 5000)"
    truth = {row[0]: row[1:] for row in duckdb.sql(
        f"SELECT department, COUNT(*), SUM({clamped}), AVG({clamped}) FROM read_parquet('{dataset.data_path}') "
        "GROUP BY department").fetchall()}
    with tempfile.TemporaryDirectory() as folder:
        path = dataset.write_policy(Path(folder))
        text = path.read_text()
        if NOT_NULL not in text:
            raise RuntimeError("the benchmark policy's cost declaration changed: update benchmarks/nullable_counts.py")
        if nullable:
            path.write_text(text.replace(NOT_NULL, 'cost = { type = "float", lower = 0, upper = 5000 }'))
        session = PrivateSession(path, "bench", create_ledger=True, rng=seeded(11), bounding_seed=5)
        found: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        try:
            for _ in range(runs):
                for row in session.execute(QUERY, epsilon=1.0).rows:
                    for name, value, exact in zip(AGGREGATES, row[1:], truth[row[0]], strict=True):
                        found[(name, row[0])].append(abs(value - float(exact)) / abs(float(exact)))
        finally:
            session.close()
    per_aggregate = collections.defaultdict(list)
    for (name, _), values in found.items():
        per_aggregate[name].append(statistics.median(values))
    return {name: statistics.median(per_aggregate[name]) for name in AGGREGATES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    print("| cost declared | " + " | ".join(AGGREGATES) + " |")
    print("|---|---|---|---|")
    for nullable in (False, True):
        result = errors(nullable, args.runs, args.data_dir)
        print(f"| {'nullable' if nullable else 'nullable = false'} | "
              + " | ".join(f"{result[name]:.3e}" for name in AGGREGATES) + " |")


if __name__ == "__main__":
    main()
