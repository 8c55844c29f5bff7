"""The answer cache (store/answers.py): the same question again returns the answer already released, at no cost."""

from __future__ import annotations

import datetime
import decimal
import os
import shutil
from pathlib import Path

import pytest

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.store.answers import AnswerStore, answer_key
from tests.conftest import SAMPLE, VISITS_FILES, create_ledger

QUERY = "SELECT department, COUNT(*) AS n, AVG(cost) FROM visits WHERE age > ? GROUP BY department ORDER BY n"


def test_values_come_back_with_their_type_and_value(tmp_path: Path) -> None:
    store = AnswerStore(tmp_path / "answers.sqlite")
    row = (2**70, -0.1, 1e-310, decimal.Decimal("12.3400"), datetime.date(2020, 2, 29),
           datetime.datetime(2020, 1, 2, 3, 4, 5, 6), datetime.time(1, 2, 3), None, True, "a'b\x00", 0)
    assert store.put("k", [row], [(None, (1.5, 2.25))], [(None, 0.1)], 7)
    got = store.get("k")
    assert got is not None and got.rows == [row] and got.released_groups == 7
    assert [type(v) for v in got.rows[0]] == [type(v) for v in row]
    assert got.intervals == [(None, (1.5, 2.25))] and got.noise_std == [(None, 0.1)]
    assert store.get("other") is None


def test_an_answer_it_cannot_keep_exactly_is_not_kept(tmp_path: Path) -> None:
    store = AnswerStore(tmp_path / "answers.sqlite")
    assert not store.put("k", [(b"bytes",)], [(None,)], [(None,)], 1)
    assert not store.put("j", [(1,)], [((0.0, float("inf")),)], [(None,)], 1)
    assert store.get("k") is None and store.get("j") is None


def test_the_first_answer_stays(tmp_path: Path) -> None:
    store = AnswerStore(tmp_path / "answers.sqlite")
    assert store.put("k", [(1,)], [(None,)], [(None,)], 1)
    assert store.put("k", [(2,)], [(None,)], [(None,)], 1)
    assert store.get("k").rows == [(1,)]


def test_the_key_names_everything_that_decides_an_answer() -> None:
    base = answer_key("alice", "SELECT 1", ("budget", 1), "v1")
    assert base == answer_key("alice", "SELECT 1", ("budget", 1), "v1")
    others = [("bob", "SELECT 1", ("budget", 1), "v1"), ("alice", "SELECT 2", ("budget", 1), "v1"),
              ("alice", "SELECT 1", ("budget", 2), "v1"), ("alice", "SELECT 1", ("budget", 1), "v2")]
    assert all(answer_key(*other) != base for other in others)


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, tmp_path / name)
    path = tmp_path / "visits.toml"
    create_ledger(path)
    return path


def _session(policy: Path, analyst: str = "alice", seed: int = 1) -> PrivateSession:
    loaded = load_policy(policy)
    return PrivateSession(loaded, analyst, rng=InsecureSeededRandomForTests(seed),
                          answers=AnswerStore(loaded.answers))


def test_the_same_question_is_answered_again_at_no_cost(policy: Path) -> None:
    session = _session(policy)
    try:
        first = session.execute(QUERY, [30])
        spent = session.spending("alice")
        again = session.execute("select department, count(*) as n, AVG(cost)  -- the same\n"
                                "from visits where age > ? group by department order by n", [30])
        assert again.rows == first.rows and again.intervals == first.intervals
        assert again.cost.epsilon == 0 and again.cached_at is not None and first.cached_at is None
        assert session.spending("alice") == spent and len(session.history("alice")) == 1
        assert [c.name for c in again.columns] == ["department", "n", "avg(cost)"]  # as written this time
        assert [c.type for c in again.columns] == [c.type for c in first.columns]
        # A different parameter, epsilon or analyst is another question, answered afresh and charged.
        session.execute(QUERY, [31])
        session.execute(QUERY, [30], epsilon=0.5)
        assert len(session.history("alice")) == 3
    finally:
        session.close()
    bob = _session(policy, "bob")
    try:
        assert bob.execute(QUERY, [30]).cached_at is None and len(bob.history("bob")) == 1
    finally:
        bob.close()


def test_answers_survive_a_restart_but_not_a_change_of_the_data(policy: Path) -> None:
    session = _session(policy)
    try:
        first = session.execute(QUERY, [30])
    finally:
        session.close()
    restarted = _session(policy, seed=2)
    try:
        assert restarted.execute(QUERY, [30]).rows == first.rows
        assert len(restarted.history("alice")) == 1
    finally:
        restarted.close()
    source = policy.parent / "visits.csv"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = _session(policy, seed=2)
    try:
        assert changed.execute(QUERY, [30]).cached_at is None
        assert len(changed.history("alice")) == 2
    finally:
        changed.close()


def test_without_a_store_every_query_is_answered_afresh(policy: Path) -> None:
    session = PrivateSession(policy, "alice", rng=InsecureSeededRandomForTests(1))
    try:
        first, second = session.execute(QUERY, [30]), session.execute(QUERY, [30])
        assert second.cached_at is None and len(session.history("alice")) == 2
        assert first.rows != second.rows  # fresh noise each time
    finally:
        session.close()


def test_the_policy_names_the_store_or_turns_it_off(policy: Path) -> None:
    assert load_policy(policy).answers == policy.parent / "visits.answers.sqlite"
    policy.write_text(policy.read_text() + "\n[server]\nanswers = false\n")
    assert load_policy(policy).answers is None
