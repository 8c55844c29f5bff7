"""Issue 13's own table: `python -m benchmarks.states [--rows 1000000] [--runs 200] [--peer-runs 20]`.

`SELECT state, COUNT(*), SUM(income), AVG(income) FROM t GROUP BY state` at epsilon 1 on the scale benchmark's data
(1-5 rows per person, 10 states, income in [0, 200000]; max_rows_per_unit = 5, so the cap never binds and every
system bounds the same rows), through dpsql with income declared nullable (the default) and `nullable = false`, and
through Tumult Analytics in its most accurate configuration (the accuracy benchmark's runner: COUNT and SUM at
epsilon / 2 each, AVG their ratio). Prints the median over the 10 states of each system's median relative error
against the bounded truth, per aggregate. dpsql: the bounded SQL once, then `runs` seeded releases; Tumult: its exact
truncated sums once, then `peer-runs` fresh draws of the noise its compiler chose. Sized for the 2-core machine
(1M rows: about 2 minutes, most of it Spark's start and Tumult's exact sums). Tumult's speed is in summary.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.accuracy import AccuracyResult, run_dpsql, run_peer
from benchmarks.config import AccuracyConfig
from benchmarks.datasets import DATA_DIR, Dataset
from benchmarks.peers_env import by_name
from benchmarks.records import DPSQL
from benchmarks.scale import generate
from benchmarks.support import write_policy
from benchmarks.workload import Query, basic_aggregates

QUERY = Query("by_state", basic_aggregates("income"), group_by="state")
COLUMNS = {"pid": {"type": "int"}, "state": {"type": "int", "values": list(range(10)), "nullable": False},
           "income": {"type": "int", "lower": 0, "upper": 200000}}


def dataset(rows: int, data_dir: Path, folder: Path, nullable: bool) -> Dataset:
    data = data_dir / f"states_{rows}.parquet"
    if not data.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        generate(data, rows)
    folder.mkdir(parents=True, exist_ok=True)
    base = write_policy(folder / "states_base.toml", {"t": {"source": str(data), "privacy_unit": "pid",
                                                          "max_rows_per_unit": 5, "columns": COLUMNS}})
    return Dataset("states", "t", data, base, "bench.t", not_null=() if nullable else ("income",))


def median_errors(result: AccuracyResult) -> dict[str, dict[str, float]]:
    """Per system, per aggregate: the median over states of the median over runs of |value - truth| / |truth|."""
    truth = {(t.aggregate, t.group): t.bounded for t in result.truths}
    errors: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for o in result.observations:
        errors[o.system, o.aggregate, o.group].append(abs(o.value - truth[o.aggregate, o.group]) /
                                                      abs(truth[o.aggregate, o.group]))
    per_group: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (system, aggregate, _), values in errors.items():
        per_group[system, aggregate].append(statistics.median(values))
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for (system, aggregate), values in per_group.items():
        table[system][aggregate] = statistics.median(values)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--peer-runs", type=int, default=20)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    config = AccuracyConfig(epsilons=(1.0,), runs=args.runs, peer_runs=args.peer_runs, visits_rows=0,
                            queries_per_dataset=None, peer_timeout_s=1800)
    labels = [a.label for a in QUERY.aggregates]
    print(f"| system | {' | '.join(labels)} |\n|---|{'---|' * len(labels)}")
    with tempfile.TemporaryDirectory() as scratch:
        for nullable in (True, False):
            folder = Path(scratch) / ("nullable" if nullable else "not_null")
            result = AccuracyResult()
            data = dataset(args.rows, args.data_dir, folder, nullable)
            run_dpsql(data, (QUERY,), config, folder, lambda _: None, result)
            if not nullable and not args.no_peers:
                run_peer(by_name(["tumult"])[0], data, (QUERY,), config, lambda _: None, result)
            for skipped in result.skipped:
                print(f"skipped: {skipped}")
            for system, errors in median_errors(result).items():
                name = f"dpsql, income {'nullable' if nullable else 'nullable = false'}" if system == DPSQL else \
                    system
                print(f"| {name} | {' | '.join(f'{errors[label]:.3g}' for label in labels)} |")


if __name__ == "__main__":
    main()
