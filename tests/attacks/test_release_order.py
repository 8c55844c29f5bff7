"""The order of released groups is data too: with LIMIT and no ORDER BY it decides which groups are shown.

World D: 320 people (one row each) in 40 cities, 8 per city; the city has no public values, so groups pass DP
partition selection. World D': D plus one person with one row in one city. Every city passes selection in both
worlds (counts of 8 or 9 against a threshold of 4 at epsilon 5), so the released *set* is the same; what the
neighbour changes is the engine's GROUP BY order (DuckDB emits groups in the order the scan first meets them, and
the prepared table is laid out by unit). If release kept that order, `LIMIT 16` would show a city in D and never
in D': an event of probability 1 against 0, an unbounded privacy loss. dpsql puts the released groups in a
uniformly random order (a Fisher-Yates shuffle from the session's random source), so the sequence of released
rows is the released set plus independent randomness: its distribution must be the same in both worlds, namely
uniform over the orderings of the 40 cities. The tests check that exact distribution with a fixed seed.

The same first-row-wins behaviour shows in the key values themselves: DuckDB groups -0.0 with 0.0 and returns
whichever it met first, so release() returns one representative per group (last test).

The engine runs on one thread here so that its order, and so the attack without the fix, is deterministic; with
several threads the order also changes from run to run, which leaks as well (measured, not asserted: timing).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, chisquare

import dpsql.release.cells
from benchmarks.support import open_session, seeded, write_csv, write_policy
from dpsql.release.cells import release
from dpsql.session import PrivateSession

CITIES = [f"city{i:02d}" for i in range(40)]
PEOPLE = [(pid, CITIES[pid % 40]) for pid in range(100, 420)]
LIMIT = 16
QUERY = f"SELECT city, COUNT(*) FROM t GROUP BY city LIMIT {LIMIT}"
TIED = f"SELECT city, COUNT(*) FROM t GROUP BY city ORDER BY COUNT(*) DESC LIMIT {LIMIT}"
EPSILON = 5.0
RUNS = 60  # end-to-end answers per world
DRAWS = 600  # releases per world for the distribution of sequences
ALPHA = 1e-3  # each statistical check wrongly fails a correct implementation with probability at most ALPHA


def _session(folder: Path, people: list[tuple[int, str]], seed: int) -> PrivateSession:
    folder.mkdir()
    write_csv(folder / "t.csv", ["pid", "city"], people)
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "city": {"type": "text"}}}},
        {"epsilon": 1e9, "delta": 1e-3, "query_delta": 1e-6})
    return open_session(policy, seed, "attacker", threads=1)


def _engine_top(session: PrivateSession) -> list[str]:
    prepared = session.prepare(QUERY, epsilon=EPSILON)
    return [row[0] for row in session.engine.run(prepared.bounded.sql)][:LIMIT]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    """(D, D', the city the attacker watches). The attacker knows D and designs the neighbour offline: the first
    person (pid below 100, in the city the engine lists last) whose row moves a city out of the engine's top 16."""
    folder = tmp_path_factory.mktemp("order")
    d = _session(folder / "d", PEOPLE, seed=1)
    base = _engine_top(d)
    last = [row[0] for row in d.engine.run(d.prepare(QUERY, epsilon=EPSILON).bounded.sql)][-1]
    for pid in range(100):
        neighbour = _session(folder / f"n{pid}", [*PEOPLE, (pid, last)], seed=2)
        moved = set(base) - set(_engine_top(neighbour))
        if moved:
            yield d, neighbour, sorted(moved)[0]
            neighbour.close()
            break
        neighbour.close()
    else:
        pytest.fail("no neighbour changes the engine's order: the attack needs a new design for this DuckDB")
    d.close()


def _shown(session: PrivateSession, city: str) -> int:
    """In how many of RUNS answers (each one charged, noised and post-processed) the city is shown."""
    return sum(city in {row[0] for row in session.execute(QUERY, epsilon=EPSILON).rows} for _ in range(RUNS))


def test_without_the_shuffle_limit_names_the_neighbour(worlds, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's order passed through (the code before the fix): the watched city is shown in every answer on
    D and in none on D'. (Noise is now also drawn over the groups in a canonical order of their keys, which would
    hide the engine's order as well: both are undone here.)"""
    d, neighbour, city = worlds
    monkeypatch.setattr(dpsql.release.cells, "uniform_permutation", lambda n, rng: list(range(n)))
    monkeypatch.setattr(dpsql.release.cells, "_key_order", lambda key: 0)  # a stable sort keeps the engine's order
    assert (_shown(d, city), _shown(neighbour, city)) == (RUNS, 0)


def test_with_the_shuffle_both_worlds_show_the_city_as_often(worlds) -> None:
    """Shown with probability exactly 16/40 in both worlds: both counts lie in the Binomial(RUNS, 0.4) range."""
    d, neighbour, city = worlds
    p = LIMIT / len(CITIES)
    low, high = int(binom.ppf(ALPHA / 2, RUNS, p)), int(binom.isf(ALPHA / 2, RUNS, p))
    shown = _shown(d, city), _shown(neighbour, city)
    assert all(low <= count <= high for count in shown), (shown, low, high)


def _sequences(session: PrivateSession, sql: str, epsilon: float = EPSILON,
               reverse: bool = False) -> list[tuple[str, ...]]:
    """The first LIMIT released keys of DRAWS releases of the same engine rows (reversed, if asked): what
    post-processing shows, in that order (test_post_processing_shows_the_released_order)."""
    prepared = session.prepare(sql, epsilon=epsilon)
    rows = session.engine.run(prepared.bounded.sql)
    rows = rows[::-1] if reverse else rows
    return [tuple(key[0] for key in release(prepared.plan, rows, session.rng).keys[:LIMIT]) for _ in range(DRAWS)]


def _assert_uniform_orderings(sequences: list[tuple[str, ...]], label: str) -> None:
    """Every sequence is a uniformly random ordering of the 40 cities (cut at LIMIT): the first city and each
    position of one city are uniform (chi-square goodness of fit), and the set shown has the right size."""
    assert all(len(s) == LIMIT and len(set(s)) == LIMIT for s in sequences), label
    first = Counter(s[0] for s in sequences)
    assert chisquare([first[c] for c in CITIES]).pvalue > ALPHA, (label, "first city", first)
    watched = CITIES[0]
    places = Counter(s.index(watched) if watched in s else LIMIT for s in sequences)  # LIMIT: not shown
    expected = np.array([1 / len(CITIES)] * LIMIT + [1 - LIMIT / len(CITIES)]) * len(sequences)
    assert chisquare([places[i] for i in range(LIMIT + 1)], expected).pvalue > ALPHA, (label, "place", places)


def test_released_sequences_have_the_same_distribution_in_both_worlds(worlds) -> None:
    """Not only the set: where each city comes in the sequence follows the same (uniform) law under D and D'."""
    d, neighbour, _ = worlds
    for session, label in ((d, "D"), (neighbour, "D'")):
        _assert_uniform_orderings(_sequences(session, QUERY), label)


def test_ties_under_order_by_a_noisy_value_do_not_follow_the_data_order(worlds) -> None:
    """At epsilon 50 every noisy count is exactly 8 (the noise is 0 with probability 1 - 4e-22): ORDER BY COUNT(*)
    DESC ties all 40 cities. Whether the engine's rows come in its order or reversed, the 16 shown are a uniformly
    random choice in a uniformly random order, never the first or last 16 of the data."""
    d, _, _ = worlds
    for reverse in (False, True):
        _assert_uniform_orderings(_sequences(d, TIED, 50.0, reverse), f"reversed={reverse}")


@pytest.mark.parametrize(("sql", "shown"), [(QUERY, LIMIT), (TIED, LIMIT), (TIED.replace(f" LIMIT {LIMIT}", ""), 40)],
                         ids=["limit", "ties-limit", "ties"])
def test_post_processing_shows_the_released_order(worlds, sql: str, shown: int) -> None:
    """LIMIT without ORDER BY shows the first 16 released groups, and ORDER BY a tied noisy value keeps the
    released order. DuckDB's sort is not stable (40 tied rows come back reordered, even on one thread), so
    post-processing adds each row's released position as the last ORDER BY term."""
    d, _, _ = worlds
    prepared = d.prepare(sql, epsilon=50.0)
    rows = d.engine.run(prepared.bounded.sql)
    for _ in range(10):
        cells = release(prepared.plan, rows, d.rng)
        assert len(set(cells.values[:, 0])) == 1  # all tied
        final = d.post.run(prepared.plan.query, prepared.key_types, cells)
        assert [row[0] for row in final.rows] == [key[0] for key in cells.keys[:shown]]


def test_a_zero_key_does_not_carry_the_sign_of_the_first_row_the_engine_met(tmp_path: Path, monkeypatch) -> None:
    """DuckDB groups -0.0 with 0.0 but returns the representation of the first row it met. D: 320 people whose key
    is -0.0; D': one more person whose key is 0.0, placed (by the attacker, offline) where the scan meets it first.
    Without canonical keys the released zero is -0.0 on D and 0.0 on D', every time; with them, 0.0 in both."""
    def world(name: str, people: list[tuple[int, float]]) -> PrivateSession:
        folder = tmp_path / name
        folder.mkdir()
        write_csv(folder / "t.csv", ["pid", "x"], people)
        policy = write_policy(folder / "p.toml", {"t": {
            "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
            "columns": {"pid": {"type": "int"}, "x": {"type": "float"}}}}, {"epsilon": 1e9, "delta": 1e-3})
        return PrivateSession(policy, "attacker", rng=seeded(3), threads=1, create_ledger=True)

    def engine_sign(session: PrivateSession) -> float:
        prepared = session.prepare("SELECT x, COUNT(*) FROM t GROUP BY x", epsilon=EPSILON)
        return math.copysign(1, session.engine.run(prepared.bounded.sql)[0][0])

    def released_signs(session: PrivateSession) -> set[float]:
        answers = (session.execute("SELECT x, COUNT(*) FROM t GROUP BY x", epsilon=EPSILON) for _ in range(20))
        return {math.copysign(1, answer.rows[0][0]) for answer in answers}

    people = [(pid, -0.0) for pid in range(100, 420)]
    d = world("d", people)
    assert engine_sign(d) == -1
    for pid in range(100):
        neighbour = world(f"n{pid}", [*people, (pid, 0.0)])
        if engine_sign(neighbour) == 1:
            break
        neighbour.close()
    else:
        pytest.fail("no neighbour changes the engine's zero: the attack needs a new design for this DuckDB")
    assert released_signs(d) == released_signs(neighbour) == {1.0}
    monkeypatch.setattr(dpsql.release.cells, "_canonical", lambda value: value)
    assert (released_signs(d), released_signs(neighbour)) == ({-1.0}, {1.0})
    d.close()
    neighbour.close()
