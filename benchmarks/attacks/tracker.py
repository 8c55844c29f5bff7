"""Tracker / differencing attack (Denning 1980): "how many smokers" minus "how many smokers other than X".

Against plain DuckDB the difference of the two exact counts is X's smoker bit, for every X. Against dpsql each
count is noisy and each is charged, so a guess costs twice the query epsilon, and over many rounds of the
balanced game (notes in people.py) the guess wins no more often than the DP bound allows: at most
e^eps/(1 + e^eps) with eps the epsilon charged for the two answers. (The second count is the same in both worlds,
so the tight bound uses the first query's epsilon alone; the report shows both.)

The many rounds run the bounded SQL once per world and draw dpsql's release many times (sampling.py); a few
rounds also go end to end through `PrivateSession.execute` to show that each guess is charged twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from benchmarks.attacks.baseline import PlainDuckDB
from benchmarks.attacks.people import TARGET, Worlds, balanced_game, write_worlds
from benchmarks.attacks.sampling import measure, scalar_outputs
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import open_session, seeded

SMOKERS = "SELECT COUNT(*) FROM people WHERE smoker"
SMOKERS_BUT = "SELECT COUNT(*) FROM people WHERE smoker AND pid <> ?"


def guess(smokers: np.ndarray, smokers_but: np.ndarray) -> np.ndarray:
    """X smokes if the count with X exceeds the count without X (the two differ by X's bit plus noise)."""
    return (np.asarray(smokers) - np.asarray(smokers_but) >= 1).astype(int)


def baseline(policy: Path) -> Proportion:
    """Every person's bit, recovered from two exact counts each."""
    plain = PlainDuckDB(policy)
    try:
        truth = dict(plain.rows("SELECT pid, smoker FROM people"))
        smokers = plain.scalar(SMOKERS)
        right = sum(int(guess(smokers, plain.scalar(SMOKERS_BUT, [pid]))) == int(bit) for pid, bit in truth.items())
    finally:
        plain.close()
    return Proportion(right, len(truth))


@dataclass(frozen=True)
class EndToEnd:
    rounds: int
    answers: int
    charged: Fraction  # the epsilon the ledger recorded for these rounds
    wins: int


@dataclass(frozen=True)
class TrackerReport:
    epsilon: float  # of each query
    baseline: Proportion
    game: Proportion
    end_to_end: EndToEnd

    @property
    def charged_per_guess(self) -> float:
        return 2 * self.epsilon

    def lines(self) -> list[str]:
        e2e = self.end_to_end
        return [
            "tracker / differencing: COUNT(smokers) - COUNT(smokers AND pid <> X)",
            f"  baseline (plain DuckDB, exact): bits recovered {self.baseline}",
            f"  dpsql, {e2e.rounds} rounds end to end: {e2e.answers} answers, epsilon charged {float(e2e.charged):g} "
            f"(= 2 x {self.epsilon:g} per guess), {e2e.wins} guesses right",
            f"  dpsql, balanced game: success {self.game}",
            f"    DP bound for the epsilon charged per guess ({self.charged_per_guess:g}): "
            f"{success_bound(self.charged_per_guess):.4f}; tight bound (only the first count differs, "
            f"epsilon {self.epsilon:g}): {success_bound(self.epsilon):.4f}",
        ]


def attack(worlds: Worlds, epsilon: float, rounds: int, end_to_end_rounds: int, seed: int) -> TrackerReport:
    sessions = [open_session(policy, seed + bit) for bit, policy in enumerate(worlds.policies)]
    try:
        measured = [(measure(s, SMOKERS, epsilon=epsilon), measure(s, SMOKERS_BUT, [TARGET], epsilon=epsilon))
                    for s in sessions]
        rng = seeded(seed)

        def guesses(bit: int, n: int) -> np.ndarray:
            first, second = measured[bit]
            return guess(scalar_outputs(first.plan, first.rows, rng, n),
                         scalar_outputs(second.plan, second.rows, rng, n))

        game = balanced_game(rounds, seed, guesses)
        e2e = _end_to_end(sessions, epsilon, end_to_end_rounds, seed)
    finally:
        for session in sessions:
            session.close()
    return TrackerReport(epsilon, baseline(worlds.policies[1]), game, e2e)


def _end_to_end(sessions: list, epsilon: float, rounds: int, seed: int) -> EndToEnd:
    coins = np.random.default_rng(seed + 1).integers(0, 2, size=rounds)
    before = [s.ledger.history() for s in sessions]
    wins = 0
    for bit in coins:
        first = sessions[bit].execute(SMOKERS, epsilon=epsilon).rows[0][0]
        second = sessions[bit].execute(SMOKERS_BUT, [TARGET], epsilon=epsilon).rows[0][0]
        wins += int(guess(first, second)) == bit
    new = [c for s, old in zip(sessions, before, strict=True) for c in s.ledger.history()[len(old):]]
    return EndToEnd(rounds, len(new), sum((c.epsilon for c in new), Fraction(0)), wins)


def main() -> None:
    args = options(__doc__, people=100, epsilon=0.5, rounds=20000, end_to_end=50, seed=3)
    with scratch() as folder:
        worlds = write_worlds(folder, args.people, args.seed)
        print("\n".join(attack(worlds, args.epsilon, args.rounds, args.end_to_end, args.seed).lines()))


if __name__ == "__main__":
    main()
