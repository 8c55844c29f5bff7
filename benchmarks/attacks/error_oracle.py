"""An error side channel: a query that fails exactly when the target's row matches it.

dpsql wraps analyst expressions that "may fail" in TRY(...) and dry-runs every query on an empty copy of the
table, so that no row can turn a query into an error. But `vetting.NEVER_FAILS` counts every comparison as
unable to fail, and `pid IN (1, 'x')` fails at run time on the rows that reach it: the text literal cannot be
cast to the BIGINT column (a ConversionException), which the empty dry run never sees. (A negative literal in
the list, `-1`, is a Neg node, which does make the rewrite wrap the filter in TRY; then nothing fails.)

DuckDB evaluates a conjunction left to right on the rows that passed the previous terms, and a CASE branch only
on the rows that take it, so with `pid = X AND smoker AND pid IN (1, 'x')` the query fails if and only if X is
a smoker. dpsql charges the failed query (ExecutionFailed: "it was charged: whether it fails could depend on
the data"), but a charge does not make a deterministic bit private: the attacker wins the balanced game every
time, far beyond e^eps / (1 + e^eps).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.fixtures import open_session
from benchmarks.attacks.people import TARGET, Worlds, balanced_game, write_worlds
from benchmarks.attacks.stats import Proportion, success_bound
from dpsql.errors import ExecutionFailed

ORACLES = {
    "AND ... IN (1, 'x')": "SELECT COUNT(*) FROM people WHERE pid = ? AND smoker AND pid IN (1, 'x')",
    "CASE ... IN (1, 'x')":
        "SELECT COUNT(*) FROM people WHERE CASE WHEN pid = ? AND smoker THEN pid IN (1, 'x') ELSE false END",
}


@dataclass(frozen=True)
class OracleOutcome:
    name: str
    game: Proportion  # rounds of the balanced game, each one query end to end
    failures_charged: bool  # whether the ledger charged the failed queries


@dataclass(frozen=True)
class ErrorOracleReport:
    epsilon: float
    outcomes: tuple[OracleOutcome, ...]

    def lines(self) -> list[str]:
        return [f"error oracle: one query at epsilon {self.epsilon:g} per guess "
                f"(DP bound on success {success_bound(self.epsilon):.4f})",
                *(f"  {o.name}: success {o.game}; failed queries charged: {o.failures_charged}"
                  for o in self.outcomes)]


def attack(worlds: Worlds, epsilon: float, rounds: int, seed: int) -> ErrorOracleReport:
    sessions = [open_session(policy, seed) for policy in worlds.policies]
    outcomes = []
    try:
        for name, sql in ORACLES.items():
            charged = []

            def guesses(bit: int, n: int, sql: str = sql, charged: list = charged) -> np.ndarray:
                session = sessions[bit]
                out = []
                for _ in range(n):
                    before = session.spending().queries
                    try:
                        session.execute(sql, [TARGET], epsilon=epsilon)
                        out.append(0)
                    except ExecutionFailed:
                        out.append(1)
                        charged.append(session.spending().queries == before + 1)
                return np.array(out, dtype=int)

            game = balanced_game(rounds, seed, guesses)
            outcomes.append(OracleOutcome(name, game, bool(charged) and all(charged)))
    finally:
        for session in sessions:
            session.close()
    return ErrorOracleReport(epsilon, tuple(outcomes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        worlds = write_worlds(Path(folder), args.people, args.seed)
        print("\n".join(attack(worlds, args.epsilon, args.rounds, args.seed).lines()))


if __name__ == "__main__":
    main()
