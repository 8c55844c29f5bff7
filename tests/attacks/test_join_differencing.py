"""Differencing through a join and through a per-unit subquery: the target's presence is guessed no better than DP
allows.

The attacker knows everything but whether the target is in the data, and picks queries that multiply the target's
weight: a join to a public table whose key the target's rows meet twice (k = 2), a self-join on the unit (m*m
rows), and a per-unit subquery whose derived value the target maximises. It guesses "present" when the noisy
answer is above the midpoint of the two worlds' exact answers. The plan's sensitivity (m*k, m*m, the derived
bound) must make that guess no better than (e^eps)/(1 + e^eps): a noise calibrated to m alone would let the
first two attacks win (about 0.82 against a bound of 0.73 at eps = 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import create_ledger, seeded, write_csv, write_policy
from dpsql.session import PrivateSession

EPSILON, TRIALS, M = 1.0, 200, 5
TARGET = 1
QUERIES = [
    "SELECT COUNT(*) FROM t JOIN look l ON t.city = l.city",
    "SELECT COUNT(*) FROM t a JOIN t b ON a.pid = b.pid",
    "SELECT SUM(n) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) AS p",
    "SELECT COUNT(*) FROM (SELECT pid, MAX(k) AS top FROM t GROUP BY pid) AS p WHERE top >= 9",
]


def _world(folder: Path, with_target: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [(pid, "y", pid % 9) for pid in range(2, 60) for _ in range(pid % 4 + 1)]
    if with_target:
        rows += [(TARGET, "x", 9)] * 8  # more rows than the cap, all meeting the duplicated key
    write_csv(folder / "t.csv", ["pid", "city", "k"], rows)
    write_csv(folder / "look.csv", ["city", "note"], [("x", "a"), ("x", "b"), ("y", "c")])
    policy = write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": M,
              "columns": {"pid": {"type": "int"}, "city": {"type": "text"},
                          "k": {"type": "int", "lower": 0, "upper": 9}}},
        "look": {"source": "look.csv", "public": True,
                 "columns": {"city": {"type": "text"}, "note": {"type": "text"}}}},
        {"epsilon": 1e6, "query_epsilon": EPSILON})
    return create_ledger(policy)


@pytest.mark.parametrize("sql", QUERIES)
def test_differencing_through_joins_and_per_unit_subqueries_stays_within_the_dp_bound(tmp_path: Path, sql) -> None:
    answers = {}
    for present in (True, False):
        session = PrivateSession(_world(tmp_path / str(present), present), "attacker", rng=seeded(11 + present),
                                 bounding_seed=3)
        try:
            answers[present] = [float(session.execute(sql).rows[0][0]) for _ in range(TRIALS)]
        finally:
            session.close()
    exact = {present: sorted(values)[len(values) // 2] for present, values in answers.items()}  # medians
    midpoint = (exact[True] + exact[False]) / 2
    hits = sum(v > midpoint for v in answers[True]) + sum(v <= midpoint for v in answers[False])
    game = Proportion(hits, 2 * TRIALS)
    assert exact[True] > exact[False]  # the attack aims at a real difference
    assert game.lower() <= success_bound(EPSILON), (sql, str(game))
