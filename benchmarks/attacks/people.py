"""Two worlds for the guessing game of the tracker, averaging and error-oracle attacks.

A table of n people, one smoker bit each. The target (pid 0) is a smoker in world 1 and not in world 0; everyone
else is the same in both. The attacker knows everything about the others (the strongest background knowledge)
and must guess which world it is in, with a fair coin choosing the world: a balanced prior, so any
epsilon-DP answer lets it win with probability at most e^epsilon / (1 + e^epsilon).

Every query these attacks send counts smokers only, so a non-smoking target adds nothing to any answer: world 0
answers exactly as the world without the target does, and the two worlds are neighbours for the unit-level
guarantee (one unit added or removed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.stats import Proportion
from benchmarks.support import DEFAULT_BUDGET, Budget, Table, column, open_session, write_dataset
from dpsql.errors import QueryRejected

TARGET = 0
PEOPLE = Table("people", "pid", (column("pid", "int"), column("smoker", "bool")))
# The same, with a copy of each person's id in an ordinary column: dpsql refuses to group by an expression of the
# privacy unit, not by one of `tag`, so the attacks on group keys single the target out with `tag = 0`.
TAGGED = Table("people", "pid", (*PEOPLE.columns, column("tag", "int")))


@dataclass(frozen=True)
class Worlds:
    policies: tuple[Path, Path]  # world 0 (target not a smoker), world 1 (target a smoker)
    others_smoking: int  # how many people other than the target smoke: the attacker's background knowledge


def write_worlds(folder: Path, people: int, seed: int, budget: Budget = DEFAULT_BUDGET, tagged: bool = False) -> Worlds:
    chooser = random.Random(seed)
    others = [(pid, chooser.random() < 0.5) for pid in range(1, people)]
    rows = [(TARGET, False), *others]
    if tagged:
        rows = [(pid, smoker, pid) for pid, smoker in rows]
    policies = tuple(write_dataset(folder / f"world{bit}", TAGGED if tagged else PEOPLE,
                                   [(TARGET, bool(bit), *row[2:]) if i == 0 else row for i, row in enumerate(rows)],
                                   budget) for bit in (0, 1))
    return Worlds(policies, sum(smoker for _, smoker in others))


def balanced_game(trials: int, seed: int, guesses_in_world: Callable[[int, int], np.ndarray]) -> Proportion:
    """Play `trials` rounds: a fair coin picks the world, the attacker guesses it.

    `guesses_in_world(bit, n)` returns the attacker's n guesses in world `bit` (independent rounds), so a world's
    rounds can be drawn in one batch; the coin flips are the seeded part that decides how many each world gets.
    """
    coins = np.random.default_rng(seed).integers(0, 2, size=trials)
    wins = sum(int(np.sum(guesses_in_world(bit, int(np.sum(coins == bit))) == bit)) for bit in (0, 1))
    return Proportion(wins, trials)


@dataclass(frozen=True)
class Sent:
    """What one query did in one world: the refusal's message (None if it was answered), the queries charged."""
    refusal: str | None
    charged: int


def send_in_each_world(worlds: Worlds, sql: str, epsilon: float, seed: int) -> tuple[Sent, Sent]:
    """Send `sql` once in each world, from a fresh seeded session; a `?` is bound to the target's id."""
    sent = []
    for policy in worlds.policies:
        session = open_session(policy, seed)
        try:
            before = session.spending().queries
            try:
                session.execute(sql, [TARGET] if "?" in sql else None, epsilon=epsilon)
                refusal = None
            except QueryRejected as refused:
                refusal = str(refused)
            sent.append(Sent(refusal, session.spending().queries - before))
        finally:
            session.close()
    return sent[0], sent[1]
