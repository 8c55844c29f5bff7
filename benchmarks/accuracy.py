"""Accuracy versus epsilon: the workload through dpsql and each peer, many runs per point.

dpsql: for each query and epsilon the bounded SQL runs once on the data (`engine.run`), then dpsql's release
stage (noise, partition selection, the outputs with their intervals) runs `runs` times with a seeded generator.
That is the part of `execute` that varies from run to run; parse, check, plan and the ledger are deterministic
and are exercised by the speed and overhead benchmarks instead.

Every system answers each query at the same total privacy cost: dpsql is given epsilon, SmartNoise epsilon / k
where k is its odometer's count of charged mechanisms, OpenDP epsilon (its query budget covers all the query's
aggregates). The costs each system reports are written to accuracy_costs.csv.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.config import ACCURACY_SEED, AccuracyConfig
from benchmarks.datasets import Dataset
from benchmarks.peers_env import Peer, PeerUnavailable
from benchmarks.records import DPSQL, Cost, Observation, Skipped, Truth
from benchmarks.truth import RawTruth, bounded_truth, group_label
from benchmarks.workload import Dialect, Query
from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.release.cells import release
from dpsql.session import PrivateSession

Advance = Callable[[int], None]


@dataclass
class AccuracyResult:
    truths: list[Truth] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    costs: list[Cost] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def steps(workloads: list[tuple[Dataset, tuple[Query, ...]]], config: AccuracyConfig, peers: tuple[Peer, ...]) -> int:
    """Progress-bar length: one step per system, query and epsilon."""
    queries = sum(len(q) for _, q in workloads)
    return queries * len(config.epsilons) * (1 + len(peers))


def run_accuracy(workloads: list[tuple[Dataset, tuple[Query, ...]]], config: AccuracyConfig,
                 peers: tuple[Peer, ...], workdir: Path, advance: Advance) -> AccuracyResult:
    result = AccuracyResult()
    for dataset, queries in workloads:
        run_dpsql(dataset, queries, config, workdir, advance, result)
        for peer in peers:
            run_peer(peer, dataset, queries, config, advance, result)
    return result


def run_dpsql(dataset: Dataset, queries: tuple[Query, ...], config: AccuracyConfig, workdir: Path,
              advance: Advance, result: AccuracyResult) -> None:
    rng = InsecureSeededRandomForTests(ACCURACY_SEED)
    session = PrivateSession(dataset.write_policy(workdir), analyst="bench", rng=rng, bounding_seed=1,
                             create_ledger=True)
    raw = RawTruth(dataset)
    try:
        for query in queries:
            sql = query.sql(dataset.table)
            raw_cells = raw.cells(query)
            for index, epsilon in enumerate(config.epsilons):
                prepared = session.prepare(sql, epsilon=epsilon)
                plan = prepared.plan
                assert len(plan.query.aggregates) == len(query.aggregates), "each aggregate must be distinct"
                rows = session.engine.run(prepared.bounded.sql)
                if index == 0:
                    result.truths += _truths(dataset, query, bounded_truth(plan, rows, rng), raw_cells)
                result.costs.append(Cost(DPSQL, dataset.name, query.name, epsilon, epsilon,
                                         len(plan.measurements), float(plan.cost.epsilon)))
                for run in range(config.runs):
                    cells = release(plan, rows, rng)
                    for g, key in enumerate(cells.keys):
                        group = group_label(key[0]) if query.grouped else ""
                        for j, aggregate in enumerate(query.aggregates):
                            result.observations.append(Observation(
                                dataset.name, query.name, aggregate.label, aggregate.kind.value, group, DPSQL,
                                epsilon, run, float(cells.values[g, j]), float(cells.lows[g, j]),
                                float(cells.highs[g, j]), float(cells.stds[g, j])))
                advance(1)
    finally:
        raw.close()
        session.close()


def _truths(dataset: Dataset, query: Query, cells: Any, raw_cells: dict) -> list[Truth]:
    truths = []
    total = dataset.rows
    for g, key in enumerate(cells.keys):
        group = group_label(key[0]) if query.grouped else ""
        raw_values, rows = raw_cells.get(group, ([None] * len(query.aggregates), 0))
        for j, aggregate in enumerate(query.aggregates):
            truths.append(Truth(dataset.name, query.name, aggregate.label, aggregate.kind.value, group,
                                float(cells.values[g, j]), raw_values[j], rows, rows / total))
    return truths


def run_peer(peer: Peer, dataset: Dataset, queries: tuple[Query, ...], config: AccuracyConfig, advance: Advance,
             result: AccuracyResult) -> None:
    supported = []
    for query in queries:
        missing = peer.unsupported(query)
        if missing:
            result.skipped.append(Skipped("accuracy", peer.name, f"{dataset.name}/{query.name}", missing))
            advance(len(config.epsilons))
        else:
            supported.append(query)
    if not supported:
        return
    by_name = {q.name: q for q in supported}
    job = {
        "mode": "accuracy",
        "dataset": dataset.peer_spec(),
        "epsilons": list(config.epsilons),
        "runs": config.peer_runs,
        "queries": [{**q.spec(), "sql": q.sql(dataset.smartnoise_table, Dialect.SMARTNOISE)} for q in supported],
    }
    done = 0

    def on_record(record: dict[str, Any]) -> None:
        nonlocal done
        query = by_name[record["query"]]
        epsilon = record["epsilon"]
        done += 1
        advance(1)
        if record["kind"] == "refused":
            result.skipped.append(Skipped("accuracy", peer.name, f"{dataset.name}/{query.name} at ε = {epsilon:g}",
                                          f"refused: {record['reason']}"))
            return
        result.costs.append(Cost(peer.name, dataset.name, query.name, epsilon, record["system_epsilon"],
                                 record["mechanisms"], record["cost"]))
        for run, rows in enumerate(record["runs"]):
            for row in rows:
                group = group_label(row[0]) if query.grouped else ""
                values = row[1:] if query.grouped else row
                for aggregate, value in zip(query.aggregates, values, strict=True):
                    result.observations.append(Observation(
                        dataset.name, query.name, aggregate.label, aggregate.kind.value, group, peer.name, epsilon,
                        run, float("nan") if value is None else float(value)))

    try:
        peer.run(job, on_record, timeout=config.peer_timeout_s)
    except PeerUnavailable as exc:
        result.skipped.append(Skipped("accuracy", peer.name, dataset.name, str(exc)))
        advance(len(supported) * len(config.epsilons) - done)
