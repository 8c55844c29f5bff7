"""dpsql's per-query overhead on a tiny table (PUMS, 1,000 rows), in milliseconds, stage by stage.

On a tiny table the bounded query itself costs almost nothing, so `execute`'s time is dpsql's own overhead:
parse, check, plan, rewrite, the dry run on the empty twin, the ledger charge (a SQLite transaction), the
bounded query, the noise, and the post-processing. `execute` is timed end to end (the headline figure), and the
same stages are timed one by one in the order `PrivateSession.execute` runs them, alternating with the end-to-end
runs. dpsql has no per-stage timing hook, so the stages are called here directly (see the report).
The noise comes from dpsql's default secure generator, as in production.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.datasets import pums
from benchmarks.workload import Query, basic_aggregates
from dpsql.check import check
from dpsql.parse import parse
from dpsql.plan import plan
from dpsql.release import release
from dpsql.rewrite import rewrite
from dpsql.session import PrivateSession

EPSILON = 1.0
# The same shape as the speed benchmark's query, on PUMS: GROUP BY a public column, COUNT/SUM/AVG.
TINY_QUERY = Query("overhead_by_sex", basic_aggregates("income"), group_by="sex")
STAGES = ("parse", "check", "plan", "rewrite", "dry_run", "ledger", "engine", "noise", "postprocess")
TOTAL = "execute"


@dataclass(frozen=True, slots=True)
class StageTiming:
    rep: int
    stage: str  # one of STAGES, or "execute" for the end-to-end call
    ms: float


@dataclass(frozen=True, slots=True)
class StageSummary:
    stage: str
    median_ms: float
    p95_ms: float


def _staged(session: PrivateSession, sql: str, clock: Callable[[str, Callable[[], Any]], Any]) -> None:
    """PrivateSession.execute, one stage at a time (keep in step with dpsql/session.py)."""
    parsed = clock("parse", lambda: parse(sql, None))
    checked = clock("check", lambda: check(parsed, session.policy))
    query_plan = clock("plan", lambda: plan(checked, session._budget(EPSILON)))
    bounded = clock("rewrite", lambda: rewrite(query_plan))
    types = clock("dry_run", lambda: session.engine.dry_run(bounded.dry_run_sql))
    clock("ledger", lambda: session.ledger.charge(session.analyst, query_plan.cost, sql))
    rows = clock("engine", lambda: session.engine.run(bounded.sql))
    cells = clock("noise", lambda: release(query_plan, rows, session.rng))
    clock("postprocess", lambda: session.post.run(query_plan.query, types[:bounded.key_count], cells))


def run_overhead(reps: int, workdir: Path, advance: Callable[[int], None]) -> list[StageTiming]:
    dataset = pums()
    session = PrivateSession(dataset.write_policy(workdir / "overhead"), analyst="bench")  # secure noise
    sql = TINY_QUERY.sql(dataset.table)
    timings: list[StageTiming] = []
    try:
        for _ in range(3):  # warm-up: imports, DuckDB's first-query caches, SQLite's first transaction
            session.execute(sql, epsilon=EPSILON)
        for rep in range(reps):
            def clock(stage: str, action: Callable[[], Any], rep: int = rep) -> Any:
                start = time.perf_counter()
                value = action()
                timings.append(StageTiming(rep, stage, (time.perf_counter() - start) * 1000))
                return value

            clock(TOTAL, lambda: session.execute(sql, epsilon=EPSILON))
            _staged(session, sql, clock)
            advance(1)
    finally:
        session.close()
    return timings


def summarize(timings: list[StageTiming]) -> list[StageSummary]:
    out = []
    for stage in (*STAGES, TOTAL):
        values = sorted(t.ms for t in timings if t.stage == stage)
        if values:
            out.append(StageSummary(stage, statistics.median(values), values[min(len(values) - 1,
                                                                                 int(0.95 * len(values)))]))
    stage_sum = sum(s.median_ms for s in out if s.stage in STAGES)
    out.append(StageSummary("sum of stages", stage_sum, float("nan")))
    return out
