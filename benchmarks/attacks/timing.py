"""Timing side channel (issue 7, class 5): one row makes a query slow, and the attacker reads the clock.

`CASE WHEN tag = 0 AND smoker THEN length(grow(...)) > 0 ELSE false END`, where grow is `levels` nested
`replace(t, 'a', 'aaaaaaaaaa')`: each level makes the text ten times longer, so the target's row alone costs about
10^levels times an ordinary row's work, and only when the target smokes. The attacker calibrates on a world it
builds itself (the background knowledge of people.py), then guesses "smoker" when a query takes more than
THRESHOLD times the calibrated median.

What the engine's time limit (policy `[engine] time_limit_seconds`) does and does not do: it caps how slow one
query can be (the slow query fails with the generic, charged error instead), so the worst slowdown one row can
cause is the limit over an ordinary query's time. It does not hide the bit: a failure or a slow answer are both
visible. Hiding it needs a bounded per-row cost (the type and cost check of issue 7: text lengths bounded by the
policy's max_length and functions that grow text bounded or refused). Timing is measured here only, never in a
test.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.attacks.people import Worlds, balanced_game, write_worlds
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion
from benchmarks.support import open_session
from dpsql.errors import Error
from dpsql.session import PrivateSession

EPSILON = 0.01
THRESHOLD = 5.0  # times the calibrated median: far above the run-to-run spread of a ~10 ms query


def slow_query(levels: int) -> str:
    grown = "(CAST(tag AS TEXT) || 'aaaaaaaaaa')"
    for _ in range(levels):
        grown = f"replace({grown}, 'a', 'aaaaaaaaaa')"
    return f"SELECT COUNT(*) FROM people WHERE CASE WHEN tag = 0 AND smoker THEN length({grown}) > 0 ELSE false END"


def with_time_limit(worlds: Worlds, seconds: float) -> Worlds:
    """The same worlds, their policies given `[engine] time_limit_seconds`."""
    for policy in worlds.policies:
        text = policy.read_text().split("\n[engine]")[0]
        policy.write_text(f"{text}\n[engine]\ntime_limit_seconds = {seconds}\n")
    return worlds


def seconds(session: PrivateSession, sql: str) -> float:
    """Wall-clock seconds of one execute, whether it answers or fails after the charge."""
    start = time.perf_counter()
    with contextlib.suppress(Error):
        session.execute(sql, epsilon=EPSILON)
    return time.perf_counter() - start


@dataclass(frozen=True)
class TimingReport:
    levels: int
    time_limit: float
    median_seconds: tuple[float, float]  # world 0, world 1
    game: Proportion

    @property
    def slowdown(self) -> float:
        return self.median_seconds[1] / self.median_seconds[0]

    def line(self) -> str:
        return (f"  {self.levels} levels, time limit {self.time_limit:g} s: median {self.median_seconds[0] * 1000:.1f} "
                f"ms (not a smoker) vs {self.median_seconds[1] * 1000:.1f} ms (smoker), {self.slowdown:.0f}x; "
                f"attacker wins {self.game.successes}/{self.game.trials} ({self.game})")


def attack(worlds: Worlds, levels: int, rounds: int, seed: int, time_limit: float) -> TimingReport:
    with_time_limit(worlds, time_limit)
    sessions = [open_session(policy, seed) for policy in worlds.policies]
    sql = slow_query(levels)
    try:
        for session in sessions:
            seconds(session, sql)  # prepared and warm
        calibration = statistics.median(seconds(sessions[0], sql) for _ in range(5))
        medians = (calibration, statistics.median(seconds(sessions[1], sql) for _ in range(5)))

        def guesses(bit: int, n: int) -> np.ndarray:
            return np.array([int(seconds(sessions[bit], sql) > THRESHOLD * calibration) for _ in range(n)])

        return TimingReport(levels, time_limit, medians, balanced_game(rounds, seed, guesses))
    finally:
        for session in sessions:
            session.close()


def main() -> None:
    args = options(__doc__, people=200, rounds=32, seed=23, levels=[3, 5, 7], limits=[60.0, 0.05])
    with scratch() as folder:
        worlds = write_worlds(folder / "worlds", args.people, args.seed, tagged=True)
        print(f"timing: one query at epsilon {EPSILON:g} per guess, guess 'smoker' above {THRESHOLD:g}x the "
              "calibrated median")
        for limit in args.limits:
            for levels in args.levels:
                print(attack(worlds, levels, args.rounds, args.seed, limit).line())


if __name__ == "__main__":
    main()
