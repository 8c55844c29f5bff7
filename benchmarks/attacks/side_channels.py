"""Side channels of issue 7 that the engine and the result path must close: one bit of one row per query.

The target (tag 0, pid 0) is a smoker in world 1 only (people.py). Every oracle below is a query that, on the
build before issue 7, fails or loses a group exactly when the target's row is a smoker, so the attacker wins the
balanced game with one query per guess, far above the bound e^eps / (1 + e^eps) that DP allows.

Class 2, the optimizer moves analyst code out of its TRY (HOISTING). dpsql wraps every analyst expression in
TRY(...), so a conversion or overflow on one row becomes NULL. But DuckDB's optimizer rewrote the plan:
- in_clause: `e IN (c1, ..., c6)` nested in a CASE (or under NOT) becomes a MARK join, and `e` is computed for every
  row in the join's condition, outside both the TRY and the CASE;
- common_subexpressions: an expression used twice in one projection (two aggregated values, a CASE's condition and
  its branch, a group key and a value) is computed once below it, outside every TRY.
`fails(t)` is an expression that raises (a bad cast, an overflow) only on the target's row when it is a smoker.

Class 4, Python after the charge (LOSSLESS). The engine's rows were converted to Python objects:
- an INTERVAL beyond `timedelta`'s range raised OverflowError, quoting the value, after the charge;
- DATE 'infinity' and '9999-12-31' (and '-infinity', '0001-01-01') both became the same `date`, so the target's
  one-row group replaced the large group of everyone else in a dict: the large group vanished from the answer.

The guess: "smoker" when the query was charged and then failed (any exception), or when it answered no rows (the
large group of class 4 is always released in world 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.people import Worlds, balanced_game, write_worlds
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import DEFAULT_BUDGET, GAUSSIAN, Budget, open_session
from dpsql.session import PrivateSession

ONLY_TARGET = "tag = 0 AND smoker"
# Expressions that raise on the target's row only (when it smokes), each with an error that TRY absorbs.
FAILURES = {
    "text to integer": f"CAST(CASE WHEN {ONLY_TARGET} THEN 'x' ELSE '1' END AS INTEGER)",
    "text to date": f"year(CAST(CASE WHEN {ONLY_TARGET} THEN 'x' ELSE '2024-01-01' END AS DATE))",
    "double to integer": f"CAST(CASE WHEN {ONLY_TARGET} THEN 1e300 ELSE 1.5 END AS BIGINT)",
    "narrowing cast": f"CAST(CASE WHEN {ONLY_TARGET} THEN 1000 ELSE 1 END AS TINYINT)",
}
# Query forms that make DuckDB hoist `{e}` out of its TRY (and out of the CASE that guards it).
HOISTING_FORMS = {
    "IN list in a CASE": "SELECT COUNT(*) FROM people WHERE CASE WHEN smoker THEN {e} IN (1, 2, 3, 4, 5, 6) "
                         "ELSE false END",
    "NOT IN list": "SELECT COUNT(*) FROM people WHERE NOT ({e} IN (1, 2, 3, 4, 5, 6))",
    "shared by two aggregates": "SELECT COUNT({e} + 1), COUNT({e} + 2) FROM people",
    "shared by a CASE condition and branch": "SELECT COUNT(CASE WHEN {e} > 0 THEN {e} END) FROM people",
}
HOISTING = {f"{form}, {failure}": sql.format(e=expression)
            for form, sql in HOISTING_FORMS.items() for failure, expression in FAILURES.items()}

_KEYED = "SELECT {k} AS k, COUNT(*) FROM people GROUP BY k"
LOSSLESS = {
    "INTERVAL beyond timedelta": _KEYED.format(
        k=f"INTERVAL 1 DAY * (CASE WHEN {ONLY_TARGET} THEN 1000000000 ELSE 1 END)"),
    "INTERVAL literal beyond timedelta": _KEYED.format(
        k=f"CASE WHEN {ONLY_TARGET} THEN INTERVAL 1000000000 DAY ELSE INTERVAL 1 DAY END"),
    "DATE infinity = 9999-12-31": _KEYED.format(
        k=f"CASE WHEN {ONLY_TARGET} THEN DATE '9999-12-31' ELSE DATE 'infinity' END"),
    # Which of two merged groups survives depends on the order DuckDB returns them in: this one wins less often.
    "DATE -infinity = 0001-01-01": _KEYED.format(
        k=f"CASE WHEN {ONLY_TARGET} THEN DATE '0001-01-01' ELSE DATE '-infinity' END"),
}


@dataclass(frozen=True)
class ChannelClass:
    name: str
    oracles: dict[str, str]
    epsilon: float  # per query: class 4 needs a group large enough to pass partition selection
    budget: Budget


CLASSES = (
    ChannelClass("class 2, hoisting out of TRY", HOISTING, 0.01, DEFAULT_BUDGET),
    ChannelClass("class 4, Python after the charge", LOSSLESS, 1.0, GAUSSIAN),
)


@dataclass(frozen=True)
class Outcome:
    name: str
    game: Proportion
    failures: int  # queries that were charged and then raised (any exception type)
    crashes: int  # of which were not dpsql's generic ExecutionFailed (a traceback, possibly quoting a value)


def says_smoker(session: PrivateSession, sql: str, epsilon: float) -> tuple[int, str | None]:
    """(guess, name of the exception if the query was charged and then raised)."""
    before = session.spending().queries
    try:
        result = session.execute(sql, epsilon=epsilon)
    except Exception as exc:  # any type: a crash after the charge is as much an oracle as a clean error
        charged = session.spending().queries == before + 1
        return int(charged), type(exc).__name__ if charged else None
    return int(not result.rows), None


def attack(worlds: Worlds, channel: ChannelClass, rounds: int, seed: int) -> list[Outcome]:
    sessions = [open_session(policy, seed) for policy in worlds.policies]
    outcomes = []
    try:
        for name, sql in channel.oracles.items():
            errors: list[str] = []

            def guesses(bit: int, n: int, sql: str = sql, errors: list[str] = errors) -> np.ndarray:
                out = []
                for _ in range(n):
                    guess, error = says_smoker(sessions[bit], sql, channel.epsilon)
                    out.append(guess)
                    if error is not None:
                        errors.append(error)
                return np.array(out, dtype=int)

            game = balanced_game(rounds, seed, guesses)
            outcomes.append(Outcome(name, game, len(errors), sum(e != "ExecutionFailed" for e in errors)))
    finally:
        for session in sessions:
            session.close()
    return outcomes


def write_class_worlds(folder: Path, channel: ChannelClass, people: int, seed: int) -> Worlds:
    return write_worlds(folder / channel.name.split(",")[0].replace(" ", "_"), people, seed, channel.budget,
                        tagged=True)


def main() -> None:
    args = options(__doc__, people=60, rounds=32, seed=17)
    with scratch() as folder:
        for channel in CLASSES:
            worlds = write_class_worlds(folder, channel, args.people, args.seed)
            outcomes = attack(worlds, channel, args.rounds, args.seed)
            bound = success_bound(channel.epsilon, channel.budget.query_delta)
            won = sum(o.game.successes for o in outcomes)
            total = sum(o.game.trials for o in outcomes)
            print(f"{channel.name}: {won}/{total} bits over {len(outcomes)} oracles at epsilon {channel.epsilon:g} "
                  f"per query (DP bound on success {bound:.4f})")
            for o in outcomes:
                print(f"  {o.name}: {o.game.successes}/{o.game.trials} (success {o.game}); {o.failures} charged "
                      f"failures, {o.crashes} of them not the generic error")


if __name__ == "__main__":
    main()
