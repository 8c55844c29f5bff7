"""Reconstruction (Dinur and Nissim 2003): rebuild a secret column from many random subset counts.

n people, one secret bit each. The attacker asks q = 2n counts "how many of the people in this random subset
have the bit", solves the linear system by least squares and rounds. With exact answers (plain DuckDB) the
column comes back exactly. dpsql charges each count, so a budget B buys q answers at epsilon B/q each, then
refuses; the noise then swamps the subset sums and the recovered column is near chance. Any attack on a
B-DP release gets each person's bit right with probability at most e^B / (1 + e^B) (balanced prior).

Many independent trials run in one table: `trial` is a public group key and each trial is its own population of
n people with its own random column, so every query is one grouped count whose cells (one per trial) are
disjoint (parallel composition): one answer gives every trial its noisy subset count at the query's cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import t as student

from benchmarks.attacks.baseline import PlainDuckDB
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import CONFIDENCE, Proportion, hoeffding_lower, success_bound
from benchmarks.support import Budget, Table, column, open_session, write_dataset
from dpsql.errors import BudgetExhausted


@dataclass(frozen=True)
class Population:
    policy: Path
    secrets: np.ndarray  # trials x people, 0/1
    subsets: np.ndarray  # queries x people, 0/1: who each query counts

    @property
    def queries(self) -> list[str]:
        return [_subset_count(row) for row in self.subsets]


def _subset_count(members: np.ndarray) -> str:
    people = ", ".join(str(p) for p in np.flatnonzero(members))
    # The subset is inside the aggregate, not in WHERE: the same count, but dpsql rewrites it ~5x faster (with a
    # WHERE it also filters on the 200-value public domain of `trial`, which its rewrite copies per query).
    return f"SELECT trial, COUNT(CASE WHEN secret AND person IN ({people}) THEN 1 END) FROM recon GROUP BY trial"


def write_population(folder: Path, people: int, trials: int, queries: int, budget: float, seed: int) -> Population:
    rng = np.random.default_rng(seed)
    secrets = rng.integers(0, 2, size=(trials, people))
    subsets = rng.integers(0, 2, size=(queries, people))
    table = Table("recon", "uid", (column("uid", "int"), column("trial", "int", values=tuple(range(trials))),
                                   column("person", "int"), column("secret", "bool")))
    rows = [(t * people + p, t, p, bool(secrets[t, p])) for t in range(trials) for p in range(people)]
    policy = write_dataset(folder, table, rows, Budget(epsilon=budget, query_epsilon=budget))
    return Population(policy, secrets, subsets)


def reconstruct(subsets: np.ndarray, answers: np.ndarray) -> np.ndarray:
    """Least squares for every trial at once (answers: queries x trials), rounded to bits: trials x people."""
    solution, *_ = np.linalg.lstsq(subsets.astype(float), answers.astype(float), rcond=None)
    return (solution.T >= 0.5).astype(int)


@dataclass(frozen=True)
class Accuracy:
    per_trial: np.ndarray  # the fraction of each trial's column recovered
    designated: Proportion  # one person per trial, fixed in advance: independent Bernoulli rounds

    @property
    def mean(self) -> float:
        return float(self.per_trial.mean())

    def interval(self) -> tuple[float, float]:
        """A t-interval for the mean accuracy over independent trials."""
        n = len(self.per_trial)
        half = student.ppf((1 + CONFIDENCE) / 2, n - 1) * self.per_trial.std(ddof=1) / math.sqrt(n) if n > 1 else 1
        return self.mean - half, self.mean + half

    @property
    def hoeffding_lower(self) -> float:
        return hoeffding_lower(self.mean, len(self.per_trial))

    def __str__(self) -> str:
        lo, hi = self.interval()
        return (f"mean {self.mean:.4f} (95% CI {lo:.4f}..{hi:.4f} over {len(self.per_trial)} trials; one-sided "
                f"Hoeffding lower {self.hoeffding_lower:.4f}); designated bits {self.designated}")


def score(population: Population, answers: np.ndarray, seed: int) -> Accuracy:
    guessed = reconstruct(population.subsets, answers)
    right = guessed == population.secrets
    designated = np.random.default_rng(seed + 1).integers(0, right.shape[1], size=right.shape[0])
    return Accuracy(right.mean(axis=1), Proportion(int(right[np.arange(right.shape[0]), designated].sum()),
                                                   right.shape[0]))


def _by_trial(rows: list[tuple], trials: int) -> np.ndarray:
    counts = np.zeros(trials)
    for trial, count in rows:
        counts[int(trial)] = count
    return counts


@dataclass(frozen=True)
class ReconstructionReport:
    people: int
    trials: int
    budget: float
    baseline: Accuracy
    answered: int
    refused: str
    dpsql: Accuracy

    def lines(self) -> list[str]:
        return [
            f"reconstruction: {self.people} people x {self.trials} trials, random subset counts, least squares",
            f"  baseline (plain DuckDB, exact), {self.answered} queries: {self.baseline}",
            f"  dpsql, budget {self.budget:g}: {self.answered} answers at epsilon {self.budget / self.answered:g}, "
            f"then refused ({self.refused!r})",
            f"  dpsql: {self.dpsql}",
            f"    DP bound for one bit at epsilon {self.budget:g}: {success_bound(self.budget):.4f}",
        ]


def attack(population: Population, budget: float, seed: int) -> ReconstructionReport:
    trials, people = population.secrets.shape
    plain = PlainDuckDB(population.policy)
    try:
        exact = np.column_stack([_by_trial(plain.rows(q), trials) for q in population.queries]).T
    finally:
        plain.close()
    epsilon = budget / len(population.queries)
    session = open_session(population.policy, seed)
    try:
        noisy = np.column_stack([_by_trial(session.execute(q, epsilon=epsilon).rows, trials)
                                 for q in population.queries]).T
        try:
            session.execute(population.queries[0], epsilon=epsilon)
            refused = "not refused"
        except BudgetExhausted as exc:
            refused = str(exc)
    finally:
        session.close()
    return ReconstructionReport(people, trials, budget, score(population, exact, seed), len(population.queries),
                                refused, score(population, noisy, seed))


def main() -> None:
    args = options(__doc__, people=128, trials=500, budgets=[1.0, 4.0, 16.0, 64.0, 256.0], seed=7)
    for budget in args.budgets:
        with scratch() as folder:
            population = write_population(folder, args.people, args.trials, 2 * args.people, budget, args.seed)
            print("\n".join(attack(population, budget, args.seed).lines()))


if __name__ == "__main__":
    main()
