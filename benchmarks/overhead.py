"""dpsql's per-query overhead on a tiny table (PUMS, 1,000 rows), in milliseconds, stage by stage.

On a tiny table the bounded query itself costs almost nothing, so `execute`'s time is dpsql's own overhead:
parse, check, plan, rewrite, the dry run on the empty twin, the ledger charge (a SQLite transaction), the
bounded query, the noise, and the post-processing. `execute` is timed end to end on a SQL text it has not seen
(the headline figure: every stage runs) and on the same text again (dpsql may reuse its prepared plan), and the
stages are timed one by one in the order `PrivateSession.execute` runs them, the three alternating. dpsql has
no per-stage timing hook, so the stages are called here directly (see the report).
The noise comes from dpsql's default secure generator, as in production.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.datasets import pums
from benchmarks.workload import Query, basic_aggregates
from dpsql.analysis.check import check
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import plan
from dpsql.release.cells import release
from dpsql.rewrite.passes import rewrite
from dpsql.session import PrivateSession
from dpsql.sql.parse import parse

EPSILON = 1.0
# The same shape as the speed benchmark's query, on PUMS: GROUP BY a public column, COUNT/SUM/AVG.
TINY_QUERY = Query("overhead_by_sex", basic_aggregates("income"), group_by="sex")
STAGES = ("parse", "check", "plan", "rewrite", "dry_run", "ledger", "engine", "noise", "postprocess")
TOTAL = "execute, new SQL text"  # the whole pipeline: what the overhead target is about
CACHED = "execute, same SQL again"  # dpsql may reuse what it prepared for the same text, parameters and epsilon


@dataclass(frozen=True, slots=True)
class StageTiming:
    rep: int
    stage: str  # one of STAGES, or "execute" for the end-to-end call
    ms: float


@dataclass(frozen=True, slots=True)
class LedgerTiming:
    """One ledger charge, timed with `prior` charges already in the ledger."""

    prior: int
    rep: int
    ms: float


@dataclass(frozen=True, slots=True)
class StageSummary:
    stage: str
    median_ms: float
    p95_ms: float


def _new_text(rep: int) -> str:
    """The same question in a text dpsql has not seen (a new alias), so nothing prepared can be reused."""
    return TINY_QUERY.sql("pums").replace("COUNT(*)", f"COUNT(*) AS n_{abs(rep)}_{'a' if rep >= 0 else 'b'}")


def _staged(session: PrivateSession, sql: str, clock: Callable[[str, Callable[[], Any]], Any]) -> None:
    """PrivateSession.execute, one stage at a time (keep in step with dpsql/session.py)."""
    parsed = clock("parse", lambda: parse(sql, None))
    checked = clock("check", lambda: check(parsed, session.policy, VOCABULARY))
    query_plan = clock("plan", lambda: plan(checked, session._budget(EPSILON)))
    bounded = clock("rewrite", lambda: rewrite(query_plan))
    types = clock("dry_run", lambda: session.engine.dry_run(bounded.sql))
    clock("ledger", lambda: session.ledger.charge(session.analyst, query_plan.cost, sql))
    rows = clock("engine", lambda: session.engine.run(bounded.sql))
    cells = clock("noise", lambda: release(query_plan, rows, session.rng))
    clock("postprocess", lambda: session.post.run(query_plan.query, types[:bounded.key_count], cells))


def run_overhead(reps: int, workdir: Path, advance: Callable[[int], None]) -> list[StageTiming]:
    dataset = pums()
    session = PrivateSession(dataset.write_policy(workdir / "overhead"), analyst="bench",  # secure noise
                             create_ledger=True)
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

            clock(CACHED, lambda: session.execute(sql, epsilon=EPSILON))
            fresh = _new_text(rep)
            clock(TOTAL, lambda fresh=fresh: session.execute(fresh, epsilon=EPSILON))
            _staged(session, _new_text(-1 - rep), clock)
            advance(1)
    finally:
        session.close()
    return timings


def ledger_scaling(sizes: tuple[int, ...], reps: int, workdir: Path) -> list[LedgerTiming]:
    """How a ledger charge's time grows with the number of charges already recorded.

    dpsql's BudgetLedger.charge reads every past charge to sum the spending. The ledger is filled by copying a
    charge dpsql itself wrote (a SQL INSERT ... SELECT doubling the `charges` table), which is how a long-lived
    ledger looks, without spending minutes charging one query at a time.
    """
    dataset = pums()
    folder = workdir / "ledger"
    session = PrivateSession(dataset.write_policy(folder), analyst="bench", create_ledger=True)
    sql = TINY_QUERY.sql(dataset.table)
    cost = session.prepare(sql, epsilon=EPSILON).plan.cost
    timings = []
    try:
        for size in sorted(sizes):
            _fill(session.ledger.path, size)
            for rep in range(reps):
                start = time.perf_counter()
                session.ledger.charge(session.analyst, cost, sql)
                timings.append(LedgerTiming(size, rep, (time.perf_counter() - start) * 1000))
    finally:
        session.close()
    return timings


def _fill(path: Path, size: int) -> None:
    """Grow the ledger to at least `size` charges by copying the ones it holds."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        count = con.execute("SELECT count(*) FROM charges").fetchone()[0]
        while 0 < count < size:
            copy = min(count, size - count)
            con.execute("INSERT INTO charges (at, analyst, epsilon, delta, rho, query) SELECT at, analyst, "
                        f"epsilon, delta, rho, query FROM charges LIMIT {copy}")
            count += copy
    finally:
        con.close()


def summarize(timings: list[StageTiming]) -> list[StageSummary]:
    out = []
    for stage in (*STAGES, TOTAL, CACHED):
        values = sorted(t.ms for t in timings if t.stage == stage)
        if values:
            out.append(StageSummary(stage, statistics.median(values), values[min(len(values) - 1,
                                                                                 int(0.95 * len(values)))]))
    stage_sum = sum(s.median_ms for s in out if s.stage in STAGES)
    out.append(StageSummary("sum of stages", stage_sum, float("nan")))
    return out
