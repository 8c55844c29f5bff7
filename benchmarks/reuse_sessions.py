"""Budget per answer with reuse of released measurements (issue 32): `python -m benchmarks.reuse_sessions
[--sessions 20] [--seed 32] [--out benchmarks/results/reuse_sessions.md]`.

Exploration sessions are generated reproducibly (a seed) on the sample schema (visits, sample_data/visits.toml) and
on PUMS (../shared/data/PUMS_pid.csv, sample_data/pums/pums.toml). Each session is a random sequence of episodes of
the kinds analysts have:

- **drill-down**: a count (and a sum or an average) by one key, then by two, then by three: each finer question
  is new information; the coarser released ones can only tighten it a little (GLS);
- **roll-up**: the same at three keys first, then by two, by one, and the total;
- **dashboard**: a few panels on one filter (a count and an average by a key, the count by two keys, the total),
  refreshed with other filters, then back on the first (a refresh of a filter seen before);
- **parts then total**: a sum and a count by a key, then their totals over all rows;
- **repeat**: a question asked earlier in the session, asked again.

Every question carries an accuracy target per noisy column (`name=value`, planning/targets.py): an absolute 95%
half-width for COUNT and SUM, a share of the value's range for AVG. Three ways of answering at those targets:
**independent**, every question measured on its own as dpsql does without reuse (the CLI and the library before
issue 32); **independent + repeats**, the same with exact repeats free (the server's answer cache); **reuse**, a
session with the measurement store (per session: an analyst's own measurements). For each, the total epsilon
charged; for reuse, the share of answers that were free and the coverage of every released 95% interval against
the exact bounded answer (that of a noiseless run of the same query: the cap's rows, the clamped values).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.support import SAMPLE, seeded
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.errors import Error
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.store.ledger import BudgetLedger
from dpsql.store.measurements import MeasurementStore

RESULTS = Path(__file__).resolve().parent / "results"
PUMS = SAMPLE / "pums" / "PUMS_pid.csv"  # the very file of ../shared/data (its README: copied with its note)


@dataclass(frozen=True)
class Schema:
    """What the generator may ask of a table: keys with declared values, bounded values, filters."""

    name: str
    table: str
    keys: tuple[str, ...]
    values: tuple[tuple[str, float, str], ...]  # (column, SUM half-width, AVG target as a share of its range)
    filters: tuple[str, ...]
    count_width: float  # the COUNT half-width asked


VISITS = Schema("visits (sample schema)", "visits", ("region", "department", "sex", "smoker"),
                (("cost", 60000.0, "5%"), ("length_of_stay", 600.0, "5%")),
                ("age >= 65", "age < 18", "age BETWEEN 18 AND 64", "cost > 1000", "length_of_stay > 3", "smoker"),
                20.0)
PUMS_SCHEMA = Schema("PUMS (../shared/data)", "pums", ("sex", "married", "race", "educ"),
                     (("income", 400000.0, "5%"), ("age", 150.0, "5%")),
                     ("age >= 65", "age < 30", "age BETWEEN 30 AND 64", "income > 50000", "income <= 20000"),
                     10.0)


@dataclass(frozen=True)
class Question:
    episode: str
    sql: str
    accuracy: dict[str, float | str]
    keys: int


def _question(schema: Schema, episode: str, keys: tuple[str, ...], value: tuple[str, float, str] | None,
              where: str | None = None, average: bool = False) -> Question:
    columns = [*keys, "COUNT(*) AS n"]
    accuracy: dict[str, float | str] = {"n": schema.count_width}
    if value is not None:
        name, width, share = value
        if average:
            columns.append(f"AVG({name}) AS avg_{name}")
            accuracy[f"avg_{name}"] = share
        else:
            columns.append(f"SUM({name}) AS sum_{name}")
            accuracy[f"sum_{name}"] = width
    sql = f"SELECT {', '.join(columns)} FROM {schema.table}"
    if where:
        sql += f" WHERE {where}"
    if keys:
        sql += f" GROUP BY {', '.join(keys)}"
    return Question(episode, sql, accuracy, len(keys))


def session_questions(schema: Schema, rng: random.Random, episodes: int = 5) -> list[Question]:
    """One session: `episodes` episodes of the kinds in the module's docstring (a repeat only once some question
    was asked)."""
    asked: list[Question] = []
    for _ in range(episodes):
        kind = rng.choice(["drill-down", "roll-up", "dashboard", "parts then total", "repeat"] if asked else
                          ["drill-down", "roll-up", "dashboard", "parts then total"])
        keys = tuple(rng.sample(schema.keys, 3))
        value = rng.choice(schema.values)
        if kind == "drill-down":
            asked += [_question(schema, kind, keys[:k], value if k == 1 else None, average=True) for k in (1, 2, 3)]
        elif kind == "roll-up":
            asked += [_question(schema, kind, keys[:k], value) for k in (3, 2, 1, 0)]
        elif kind == "dashboard":
            filters = rng.sample(schema.filters, 3)
            for where in [*filters, filters[0]]:
                asked += [_question(schema, kind, keys[:1], value, where, average=True),
                          _question(schema, kind, keys[:2], None, where),
                          _question(schema, kind, keys[:1], None, where)]
        elif kind == "parts then total":
            asked += [_question(schema, kind, keys[:1], value), _question(schema, kind, (), value)]
        else:
            earlier = rng.choice(asked)
            asked.append(Question("repeat", earlier.sql, earlier.accuracy, earlier.keys))
    return asked


@dataclass
class Tally:
    """What one way of answering spent, and how its intervals covered."""

    epsilon: float = 0.0
    answers: int = 0
    refused: int = 0
    free: int = 0
    covered: int = 0
    intervals: int = 0
    by_episode: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    per_session: list[float] = field(default_factory=list)


@contextlib.contextmanager
def _noiseless(policy: Path) -> Iterator[PrivateSession]:
    """A session whose noise is zero: its answers are the exact bounded ones."""
    saved = LaplaceMechanism.sample, GaussianMechanism.sample
    LaplaceMechanism.sample = GaussianMechanism.sample = lambda self, rng: 0  # type: ignore[method-assign,assignment]
    session = PrivateSession(policy, "truth", rng=seeded(0), bounding_seed=7)
    try:
        yield session
    finally:
        session.close()
        LaplaceMechanism.sample, GaussianMechanism.sample = saved  # type: ignore[method-assign]


def _truths(policy: Path, questions: list[Question]) -> dict[str, dict[tuple, tuple]]:
    found: dict[str, dict[tuple, tuple]] = {}
    with _noiseless(policy) as session:
        for q in questions:
            if q.sql not in found:
                rows = session.execute(q.sql, epsilon=1.0).rows
                found[q.sql] = {tuple(row[:q.keys]): tuple(row[q.keys:]) for row in rows}
    return found


def _answer(session: PrivateSession, questions: list[Question], tally: Tally,
            truths: dict[str, dict[tuple, tuple]] | None) -> list[float]:
    costs = []
    for q in questions:
        before = session.ledger.spending(session.analyst).epsilon_spent
        try:
            result = session.execute(q.sql, accuracy=q.accuracy)
        except Error:
            result = None  # refused: a group too small for the AVG's target (what its counts' stage charged stays)
        cost = session.ledger.spending(session.analyst).epsilon_spent - before  # what the ledger charged
        costs.append(cost)
        tally.epsilon += cost
        tally.answers += result is not None
        tally.refused += result is None
        tally.free += result is not None and cost == 0
        tally.by_episode[q.episode] += cost
        if truths is not None and result is not None:
            for row, intervals in zip(result.rows, result.intervals, strict=True):
                truth = truths[q.sql][tuple(row[:q.keys])]
                for value, interval in zip(truth, intervals[q.keys:], strict=True):
                    tally.covered += interval[0] <= value <= interval[1]
                    tally.intervals += 1
    return costs


def run(schema: Schema, policy: Path, sessions: int, seed: int, episodes: int) -> dict[str, Tally]:
    tallies = {"independent": Tally(), "independent + repeats": Tally(), "reuse": Tally()}
    for s in range(sessions):
        questions = session_questions(schema, random.Random(seed * 1000 + s), episodes)
        truths = _truths(policy, questions)
        alone = PrivateSession(policy, f"independent {s}", rng=seeded(s), bounding_seed=7)
        reusing = PrivateSession(policy, f"reuse {s}", rng=seeded(s), bounding_seed=7, reuse=True)
        reusing.measurements.close()
        reusing.measurements = MeasurementStore(None, reusing.engine.data_version)  # this session's only
        try:
            costs = _answer(alone, questions, tallies["independent"], truths)
            seen: set[tuple] = set()
            cached = tallies["independent + repeats"]
            for q, cost in zip(questions, costs, strict=True):
                key = (q.sql, tuple(sorted(q.accuracy.items())))
                paid = 0.0 if key in seen else cost
                cached.free += key in seen
                seen.add(key)
                cached.epsilon += paid
                cached.answers += 1
                cached.by_episode[q.episode] += paid
            _answer(reusing, questions, tallies["reuse"], truths)
            for tally in tallies.values():
                tally.per_session.append(tally.epsilon - sum(tally.per_session))
        finally:
            alone.close()
            reusing.close()
    return tallies


def _policy(folder: Path, schema: Schema) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if schema is VISITS:
        for name in ("visits.csv", "patients.csv", "departments.csv", "regions.csv"):
            (folder / name).write_bytes((SAMPLE / name).read_bytes())
        text = (SAMPLE / "visits.toml").read_text()
    else:
        (folder / "PUMS_pid.csv").write_bytes(PUMS.read_bytes())
        text = (SAMPLE / "pums" / "pums.toml").read_text()
    text = text.replace("epsilon = 50.0 ", "epsilon = 1e9 ").replace("epsilon = 100.0 ", "epsilon = 1e9 ")
    path = folder / "policy.toml"
    path.write_text(text)
    loaded = load_policy(path)
    BudgetLedger(loaded.budget.ledger, loaded.budget, create=True).close()
    return path


def report(results: dict[str, dict[str, Tally]], sessions: int, seed: int, episodes: int) -> str:
    lines = [f"# Budget per answer with reuse (issue 32): {sessions} sessions of {episodes} episodes per schema, "
             f"seed {seed}", "",
             f"`python -m benchmarks.reuse_sessions --sessions {sessions} --episodes {episodes} --seed {seed}` "
             "(benchmarks/reuse_sessions.py says how the sessions are made). "
             "Every answer at the same accuracy target per noisy column; epsilon is the total charged.", "",
             "| schema | answers | independent | independent + repeats | reuse | independent / reuse | "
             "(+ repeats) / reuse | free with reuse | coverage with reuse | coverage independent |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, tallies in results.items():
        alone, cached, reuse = tallies["independent"], tallies["independent + repeats"], tallies["reuse"]
        lines.append(f"| {name} | {reuse.answers} | {alone.epsilon:.1f} | {cached.epsilon:.1f} | {reuse.epsilon:.1f} "
                     f"| {alone.epsilon / reuse.epsilon:.2f}x | {cached.epsilon / reuse.epsilon:.2f}x "
                     f"| {reuse.free / reuse.answers:.0%} | {reuse.covered / reuse.intervals:.2%} of "
                     f"{reuse.intervals} | {alone.covered / alone.intervals:.2%} of {alone.intervals} |")
    lines += ["", "Per session, independent / reuse (min, median, max); answers refused (an AVG target too tight for "
              "its smallest group, what its counts' stage charged counted above):", ""]
    for name, tallies in results.items():
        ratios = sorted(a / r for a, r in zip(tallies["independent"].per_session, tallies["reuse"].per_session,
                                              strict=True) if r)
        lines.append(f"- {name}: {ratios[0]:.2f}x, {statistics.median(ratios):.2f}x, {ratios[-1]:.2f}x; refused "
                     f"{tallies['independent'].refused} independent, {tallies['reuse'].refused} with reuse")
    lines += ["", "Epsilon by kind of episode (independent -> reuse):", ""]
    for name, tallies in results.items():
        parts = [f"{kind} {tallies['independent'].by_episode[kind]:.1f} -> {tallies['reuse'].by_episode[kind]:.1f}"
                 for kind in sorted(tallies["independent"].by_episode)]
        lines.append(f"- {name}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=5, help="episodes per session")
    parser.add_argument("--out", type=Path, default=RESULTS / "reuse_sessions.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpsql-reuse-"))
    results = {}
    for schema in (VISITS, PUMS_SCHEMA):
        policy = _policy(work / schema.table, schema)
        results[schema.name] = run(schema, policy, args.sessions, args.seed, args.episodes)
        print(report({schema.name: results[schema.name]}, args.sessions, args.seed, args.episodes), flush=True)
    text = report(results, args.sessions, args.seed, args.episodes)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
