"""Speed: the same grouped query at each size, plain DuckDB, dpsql end to end, and the peers.

Times are wall-clock seconds of one query end to end (for dpsql: parse, check, plan, rewrite, dry run, ledger,
the bounded query, noise and post-processing; for SmartNoise: `execute`, which rewrites, runs the query in its
in-memory SQLite and adds noise; for OpenDP: building the query, resolving its measurement and collecting the
release). Loading the data is timed separately. The median of the repeated runs is reported; dpsql's ratio to
DuckDB is the median of the run-by-run ratios of the paired process (see speed_worker.py), and its ratios to
the peers divide medians from the same benchmark run. Peak memory is each process's peak resident set size.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.config import SpeedConfig
from benchmarks.datasets import Dataset, visits
from benchmarks.peers_env import Peer, PeerUnavailable, run_job
from benchmarks.records import DPSQL, DUCKDB, Skipped
from benchmarks.workload import SPEED_QUERY, Dialect

EPSILON = 1.0


@dataclass(frozen=True, slots=True)
class Timing:
    system: str
    rows: int
    rep: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SpeedPoint:
    system: str
    rows: int
    median_s: float
    load_s: float
    peak_rss_mb: float
    reps: int
    ratio_to_duckdb: float | None  # dpsql: median of run-by-run ratios; peers: medians divided
    dpsql_speedup: float | None  # peer median / dpsql median, same run


@dataclass
class SpeedResult:
    timings: list[Timing] = field(default_factory=list)
    points: list[SpeedPoint] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def steps(config: SpeedConfig, peers: tuple[Peer, ...]) -> int:
    return len(config.sizes) * (2 + len(peers))


def run_speed(config: SpeedConfig, peers: tuple[Peer, ...], workdir: Path, data_dir: Path,
              advance: Callable[[int], None]) -> SpeedResult:
    result = SpeedResult()
    previous: dict[str, tuple[int, float]] = {}  # peer -> (rows, seconds its whole job took)
    for size in config.sizes:
        dataset = visits(size, data_dir)
        base = _dpsql_and_duckdb(dataset, config, workdir, result)
        advance(2)
        for peer in peers:
            _peer(peer, dataset, config, base, previous, result)
            advance(1)
    return result


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    run_job([sys.executable, "-m", "benchmarks.speed_worker"], job, records.append, "speed worker")
    return records[0]


def _dpsql_and_duckdb(dataset: Dataset, config: SpeedConfig, workdir: Path, result: SpeedResult) -> float:
    """Time both; return dpsql's median seconds."""
    sql = SPEED_QUERY.sql(dataset.table)
    common = {"sql": sql, "table": dataset.table, "data": str(dataset.data_path), "reps": config.reps,
              "epsilon": EPSILON}
    policy = dataset.write_policy(workdir / f"speed_{dataset.rows}")
    paired = _worker({**common, "mode": "paired", "policy": str(policy)})
    alone = _worker({**common, "mode": "duckdb"})
    rows = dataset.rows
    mine, duck = paired["dpsql"]["times"], paired["duckdb"]["times"]
    ratio = statistics.median(a / b for a, b in zip(mine, duck, strict=True))
    result.timings += [Timing(DPSQL, rows, i, t) for i, t in enumerate(mine)]
    result.timings += [Timing(DUCKDB, rows, i, t) for i, t in enumerate(duck)]
    result.points.append(SpeedPoint(DPSQL, rows, statistics.median(mine), paired["dpsql"]["load_s"],
                                    paired["dpsql"]["peak_rss_mb"], len(mine), ratio, None))
    result.points.append(SpeedPoint(DUCKDB, rows, statistics.median(duck), paired["duckdb"]["load_s"],
                                    alone["peak_rss_mb"], len(duck), 1.0, None))
    return statistics.median(mine)


def _peer(peer: Peer, dataset: Dataset, config: SpeedConfig, dpsql_median: float,
          previous: dict[str, tuple[int, float]], result: SpeedResult) -> None:
    rows = dataset.rows
    what = f"{rows} rows"
    if peer.name in previous:
        done_rows, seconds = previous[peer.name]
        estimate = seconds * rows / done_rows
        if estimate > config.peer_budget_s:
            result.skipped.append(Skipped("speed", peer.name, what, f"estimated {estimate:.0f} s from its time at "
                                          f"{done_rows} rows, over the {config.peer_budget_s:.0f} s budget"))
            return
    job = {"mode": "speed", "dataset": dataset.peer_spec(), "epsilon": EPSILON, "reps": config.peer_reps,
           "sql": SPEED_QUERY.sql(dataset.smartnoise_table, Dialect.SMARTNOISE), "query": SPEED_QUERY.spec()}
    records: list[dict[str, Any]] = []
    try:
        peer.run(job, records.append, timeout=config.peer_timeout_s)
    except PeerUnavailable as exc:
        result.skipped.append(Skipped("speed", peer.name, what, str(exc)))
        return
    record = records[0]
    median = statistics.median(record["times"])
    previous[peer.name] = (rows, record["load_s"] + sum(record["times"]))
    duck = next(p.median_s for p in result.points if p.system == DUCKDB and p.rows == rows)
    result.timings += [Timing(peer.name, rows, i, t) for i, t in enumerate(record["times"])]
    result.points.append(SpeedPoint(peer.name, rows, median, record["load_s"], record["peak_rss_mb"],
                                    len(record["times"]), median / duck, median / dpsql_median))
