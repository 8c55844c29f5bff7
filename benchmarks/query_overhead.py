"""dpsql's fixed CPU cost per query, stage by stage, in-process (issue 31):
`python -m benchmarks.query_overhead [--queries N] [--before DIR] [--profile QUERY] [--out DIR]`.

Each representative query runs N times through `PrivateSession.execute` on the sample (sample_data/visits.toml, a
huge budget, no answer cache, no measurement store) with new parameters each time, as a server's analysts ask:
the grouped query (`... WHERE age > $1 AND cost < $2 GROUP BY region`, every pair of values different), a join to
a public table, and a per-unit subquery. The first execution of each is left out (imports, the engine's first
plans). The CPU (user + system of the process, so DuckDB's threads count too) is attributed to the stage running
at the time, innermost first, by wrapping the functions `PrivateSession` calls: parse, check (normalise + check),
plan, rewrite, dry run (the bounded SQL on the empty tables), rehearsal (post-processing of no groups), charge (the
ledger), data (the bounded query), release (the noise) and post-processing; "other" is the rest (caches, the
public-or-private decision, the measurement store's relation key, building the result).

With --before DIR (e.g. a `git archive main` extracted there) the same script runs a second time on that source
tree, in a process of its own, and the report gives both and their ratio (after / before) per query and stage. The
two alternate query by query, so load on the shared machine hits them alike. --profile QUERY prints cProfile's top
functions of that query (this tree) instead.

Results: `<out>/query_overhead.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
RESULTS = Path(__file__).resolve().parent / "results"
QUERIES = {
    "grouped": "SELECT region, COUNT(*), AVG(cost) FROM visits WHERE age > $1 AND cost < $2 GROUP BY region",
    "join": "SELECT d.specialty_group, COUNT(*), AVG(v.cost) FROM visits v JOIN departments d "
            "ON v.department = d.department WHERE v.age > $1 AND v.cost < $2 GROUP BY d.specialty_group",
    "per_unit": "SELECT n_visits, COUNT(*) AS patients, AVG(spend) AS avg_spend FROM (SELECT patient_id, "
                "COUNT(*) AS n_visits, SUM(cost) AS spend FROM visits WHERE age > $1 AND cost < $2 "
                "GROUP BY patient_id) AS p GROUP BY n_visits",
}
STAGES = ("parse", "check", "plan", "rewrite", "dry_run", "rehearsal", "charge", "data", "release", "postprocess",
          "other")


class StageClock:
    """CPU seconds per stage: each wrapped call's time, less the wrapped calls inside it (innermost first), except
    in a whole stage (`whole`: the rehearsal's post-processing is the rehearsal's)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._inner: list[float] = []  # per open call: the time of the wrapped calls inside it
        self._whole = 0  # open calls of whole stages

    def wrap(self, stage: str, function: Callable[..., Any], whole: bool = False) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._whole and not whole:
                return function(*args, **kwargs)
            self._whole += whole
            start = time.process_time()
            self._inner.append(0.0)
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.process_time() - start
                self._whole -= whole
                inner = self._inner.pop()
                self.seconds[stage] += spent - inner
                if self._inner:
                    self._inner[-1] += spent
        return timed


def _instrument(clock: StageClock) -> None:
    """Wrap the stages where `dpsql.session` finds them (module names it imported, methods of its objects)."""
    import dpsql.session as session
    from dpsql.engines.duckdb_engine import DuckDBEngine
    from dpsql.release.postprocess import PostProcessor
    from dpsql.store.ledger import BudgetLedger

    for stage, names in {"parse": ("parse",), "check": ("check", "normalize"), "plan": ("plan",),
                         "rewrite": ("rewrite",), "release": ("release", "release_no_groups")}.items():
        for name in names:
            setattr(session, name, clock.wrap(stage, getattr(session, name)))
    for owner, name, stage in ((DuckDBEngine, "dry_run", "dry_run"), (DuckDBEngine, "run", "data"),
                               (BudgetLedger, "begin_charge", "charge"), (PostProcessor, "run", "postprocess")):
        setattr(owner, name, clock.wrap(stage, getattr(owner, name)))
    rehearse = session.PrivateSession._rehearse
    session.PrivateSession._rehearse = clock.wrap("rehearsal", rehearse, whole=True)  # type: ignore[method-assign]


@contextlib.contextmanager
def sample_session(folder: Path) -> Iterator[Any]:
    """A session on the sample in `folder`: its own ledger, a huge budget, no answer cache."""
    from dpsql.policy import load_policy
    from dpsql.session import PrivateSession
    from dpsql.store.ledger import BudgetLedger

    text = (SAMPLE / "visits.toml").read_text().replace("epsilon = 50.0", "epsilon = 1000000000.0")
    for table in ("visits", "patients", "departments", "regions"):
        text = text.replace(f'source = "{table}.csv"', f'source = "{SAMPLE / (table + ".csv")}"')
    policy_path = folder / "visits.toml"
    policy_path.write_text(text)
    policy = load_policy(policy_path)
    BudgetLedger(policy.budget.ledger, policy.budget, create=True).close()
    session = PrivateSession(policy, "bench", threads=1)
    try:
        yield session
    finally:
        session.close()


def parameters(i: int) -> list[int]:
    """The i-th pair of parameters (age, cost): every pair different, every group non-empty."""
    return [i % 60, 4000 + i // 60]


def measure(session: Any, clock: StageClock, sql: str, count: int) -> dict[str, float]:
    """Milliseconds of CPU per query, per stage and in total, over `count` executions with new parameters."""
    session.execute(sql, [0, 5000])  # warm: imports, the engine's first plans
    before = dict(clock.seconds)
    start = time.process_time()
    for i in range(count):
        session.execute(sql, parameters(i))
    total = time.process_time() - start
    stages = {stage: (clock.seconds[stage] - before[stage]) * 1000 / count for stage in STAGES}
    stages["other"] = total * 1000 / count - sum(v for k, v in stages.items() if k != "other")
    stages["total"] = total * 1000 / count
    return stages


def worker(names: list[str], count: int) -> dict[str, dict[str, float]]:
    """This process's measurements of `names` (the dpsql on sys.path: this tree, or --before's)."""
    clock = StageClock()
    _instrument(clock)
    with tempfile.TemporaryDirectory() as scratch, sample_session(Path(scratch)) as session:
        return {name: measure(session, clock, QUERIES[name], count) for name in names}


def _run_tree(tree: Path | None, names: list[str], count: int) -> dict[str, dict[str, float]]:
    """`worker` in a process of its own, importing dpsql from `tree` (None: this one)."""
    env = dict(os.environ, PYTHONPATH=str(tree if tree is not None else ROOT))
    out = subprocess.run([sys.executable, __file__, "--worker", "--queries", str(count), *names], env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def profile(name: str, count: int) -> None:
    """cProfile's top functions (cumulative) of `count` executions of one query."""
    with tempfile.TemporaryDirectory() as scratch, sample_session(Path(scratch)) as session:
        session.execute(QUERIES[name], [0, 5000])
        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(count):
            session.execute(QUERIES[name], parameters(i))
        profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)


def report(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]] | None, count: int) -> str:
    lines = ["# dpsql's CPU per query, stage by stage (benchmarks/query_overhead.py)", "",
             f"{count} executions of each query with a new parameter each time, through PrivateSession.execute on the "
             "sample (no answer cache), in-process; ms of CPU (user + system, every thread) per query.", ""]
    columns = ["stage", "after ms"] + (["before ms", "after / before"] if before else [])
    for name in after:
        lines += [f"## {name}", "", f"`{QUERIES[name]}`", "", "| " + " | ".join(columns) + " |",
                  "|" + "---|" * len(columns)]
        for stage in (*STAGES, "total"):
            row = [stage, f"{after[name][stage]:.2f}"]
            if before:
                was = before[name][stage]
                row += [f"{was:.2f}", f"{after[name][stage] / was:.2f}" if was > 0.05 else "-"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(QUERIES), metavar="QUERY", help=f"of {sorted(QUERIES)}")
    parser.add_argument("--queries", type=int, default=200, help="executions of each query")
    parser.add_argument("--before", type=Path, help="a second source tree to measure (e.g. main's)")
    parser.add_argument("--profile", choices=list(QUERIES), help="print cProfile's top functions of one query")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.names or list(QUERIES)
    if args.worker:
        print(json.dumps(worker(names, args.queries)))
        return
    if args.profile:
        profile(args.profile, args.queries)
        return
    after: dict[str, dict[str, float]] = {}
    before: dict[str, dict[str, float]] | None = {} if args.before else None
    for name in names:  # the two trees alternate query by query
        after.update(_run_tree(None, [name], args.queries))
        if before is not None:
            before.update(_run_tree(args.before, [name], args.queries))
    text = report(after, before, args.queries)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "query_overhead.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
