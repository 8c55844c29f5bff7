"""Averaging attack: ask the same noisy count again and again until the noise averages away.

The attacker wants the target's smoker bit (the balanced game of people.py) and knows how many others smoke;
the mean of many noisy "how many smokers" answers, minus that, rounds to the bit.

- Against a proxy that does not charge (dpsql's own noise and release, with no ledger in front) the mean of a
  few thousand answers pins the count down exactly, and the bit with it.
- Against dpsql the ledger refuses once the budget is spent (BudgetExhausted), so the attacker averages only
  budget/epsilon answers; its success stays within e^budget / (1 + e^budget), whatever it does with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.people import Worlds, balanced_game, write_worlds
from benchmarks.attacks.sampling import Measured, measure, scalar_outputs
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import Budget, open_session, seeded
from dpsql.errors import BudgetExhausted

SMOKERS = "SELECT COUNT(*) FROM people WHERE smoker"


@dataclass(frozen=True)
class Averaging:
    """Many rounds of the game, each averaging `answers` noisy counts."""

    answers: int
    game: Proportion
    rmse: float  # of the averaged count, over the rounds


@dataclass(frozen=True)
class Refusal:
    """One end-to-end run against dpsql: ask until refused."""

    answers: int
    spent: float
    error: str  # the BudgetExhausted message
    achieved_error: float  # |mean of the answers - the true count|


@dataclass(frozen=True)
class AveragingReport:
    epsilon: float  # per query
    budget: float
    uncharged: Averaging
    dpsql: Averaging
    refusal: Refusal

    def lines(self) -> list[str]:
        r = self.refusal
        return [
            f"averaging: the same COUNT at epsilon {self.epsilon:g}, repeated",
            f"  proxy that does not charge (dpsql noise, no ledger), {self.uncharged.answers} answers per round: "
            f"success {self.uncharged.game}, RMSE of the mean {self.uncharged.rmse:.3f}",
            f"  dpsql end to end: {r.answers} answers (epsilon {r.spent:g} of {self.budget:g}), then "
            f"BudgetExhausted: {r.error!r}; achieved error of the mean {r.achieved_error:.2f}",
            f"  dpsql, {self.dpsql.answers} answers per round (all the budget allows): success {self.dpsql.game}, "
            f"RMSE of the mean {self.dpsql.rmse:.2f}; DP bound for the whole budget {success_bound(self.budget):.4f}",
        ]


def _averaging(measured: list[Measured], others: int, answers: int, rounds: int, seed: int) -> Averaging:
    rng = seeded(seed)
    errors: list[np.ndarray] = []

    def guesses(bit: int, n: int) -> np.ndarray:
        m = measured[bit]
        means = scalar_outputs(m.plan, m.rows, rng, n * answers).reshape(n, answers).mean(axis=1)
        errors.append(means - (others + bit))
        return (means - others >= 0.5).astype(int)

    game = balanced_game(rounds, seed, guesses)
    return Averaging(answers, game, float(np.sqrt(np.mean(np.concatenate(errors) ** 2))))


def _ask_until_refused(policy: Path, truth: int, epsilon: float, seed: int) -> Refusal:
    session = open_session(policy, seed)
    answers: list[float] = []
    try:
        while True:
            try:
                answers.append(session.execute(SMOKERS, epsilon=epsilon).rows[0][0])
            except BudgetExhausted as exc:
                return Refusal(len(answers), session.spending().epsilon_spent, str(exc),
                               abs(float(np.mean(answers)) - truth))
    finally:
        session.close()


def attack(worlds: Worlds, epsilon: float, budget: float, rounds: int, uncharged_rounds: int,
           uncharged_answers: int, seed: int) -> AveragingReport:
    sessions = [open_session(policy, seed) for policy in worlds.policies]
    try:
        measured = [measure(s, SMOKERS, epsilon=epsilon) for s in sessions]
    finally:
        for session in sessions:
            session.close()
    allowed = int(budget / epsilon)
    return AveragingReport(
        epsilon, budget,
        uncharged=_averaging(measured, worlds.others_smoking, uncharged_answers, uncharged_rounds, seed),
        dpsql=_averaging(measured, worlds.others_smoking, allowed, rounds, seed + 1),
        refusal=_ask_until_refused(worlds.policies[1], worlds.others_smoking + 1, epsilon, seed),
    )


def write_budgeted_worlds(folder: Path, people: int, budget: float, seed: int) -> Worlds:
    return write_worlds(folder, people, seed, Budget(epsilon=budget, query_epsilon=budget))


def main() -> None:
    args = options(__doc__, people=200, epsilon=1 / 8, budget=1.0, rounds=5000, uncharged_rounds=200,
                   uncharged_answers=4000, seed=5)
    with scratch() as folder:
        worlds = write_budgeted_worlds(folder, args.people, args.budget, args.seed)
        report = attack(worlds, args.epsilon, args.budget, args.rounds, args.uncharged_rounds,
                        args.uncharged_answers, args.seed)
    print("\n".join(report.lines()))


if __name__ == "__main__":
    main()
