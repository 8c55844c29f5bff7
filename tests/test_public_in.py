"""`x IN (SELECT ... FROM <public tables>)`: the subquery's values are public data, so the normaliser lists them
(analysis/normalize.py). The answer is the one of the hand-written IN list: same bounded SQL, same noise, same cost."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlglot import exp

from benchmarks.support import seeded
from dpsql.analysis.normalize import normalize
from dpsql.errors import QueryRejected
from dpsql.session import PrivateSession
from dpsql.sql.parse import parse


def _session(policy: Path) -> PrivateSession:
    return PrivateSession(policy, "tester", rng=seeded(11), bounding_seed=5)


@pytest.mark.parametrize(("written", "listed"), [
    ("SELECT region, COUNT(*) FROM visits WHERE department IN (SELECT department FROM departments "
     "WHERE specialty_group = 'medical') GROUP BY region",
     "SELECT region, COUNT(*) FROM visits WHERE department IN ('cardiology', 'dermatology', 'general', "
     "'neurology', 'oncology', 'pediatrics') GROUP BY region"),
    # NOT IN over values holding NULL is never TRUE: the listed form keeps the NULL, so it means the same.
    ("SELECT COUNT(*), AVG(cost) FROM visits WHERE department NOT IN (SELECT CASE WHEN floor > 2 THEN department "
     "END FROM departments)",
     "SELECT COUNT(*), AVG(cost) FROM visits WHERE department NOT IN ('cardiology', 'neurology', 'oncology', NULL)"),
    ("SELECT COUNT(*) FROM visits WHERE age > 30 AND region IN (SELECT region FROM regions WHERE urban)",
     "SELECT COUNT(*) FROM visits WHERE age > 30 AND region IN ('central', 'south', 'west')"),
])
def test_the_answer_is_that_of_the_listed_values(visits_policy: Path, written: str, listed: str) -> None:
    answers = []
    for sql in (written, listed):
        session = _session(visits_policy)
        try:
            result = session.execute(sql)
            answers.append((sorted(result.rows, key=repr), result.cost, session.prepare(sql).bounded.sql))
        finally:
            session.close()
    assert answers[0] == answers[1]


def test_an_empty_subquery_is_false_and_not_in_it_true(visits_policy: Path) -> None:
    session = _session(visits_policy)
    try:
        facts = session.engine.public_facts()
        tree = normalize(parse("SELECT COUNT(*) FROM visits WHERE department IN (SELECT department FROM departments "
                               "WHERE floor > 99) OR NOT region IN (SELECT region FROM regions WHERE population < 0)"),
                         session.policy, facts).tree
        assert tree.args["where"].this == exp.or_(exp.false(), exp.not_(exp.false()))
    finally:
        session.close()


@pytest.mark.parametrize("sql", [
    # a private table inside, not on the unit: its values are not public (on the unit: tests/test_semijoin.py)
    "SELECT COUNT(*) FROM visits WHERE region IN (SELECT sex FROM patients)",
    # correlated: it cannot run on its own, so it is left for the checker
    "SELECT COUNT(*) FROM visits v WHERE department IN (SELECT department FROM departments d WHERE d.floor = v.age)",
])
def test_other_subqueries_are_left_for_the_checker_to_refuse(visits_policy: Path, sql: str) -> None:
    session = _session(visits_policy)
    try:
        with pytest.raises(QueryRejected, match="this subquery is not supported"):
            session.execute(sql)
        assert session.spending("tester").queries == 0
    finally:
        session.close()


class _Recording:
    """The public database's watchdog, recording whether a statement ran while it was watching."""

    def __init__(self, watchdog) -> None:
        self.watchdog = watchdog
        self.watching = False
        self.unwatched: list[str] = []

    def running(self):
        import contextlib

        @contextlib.contextmanager
        def watched():
            with self.watchdog.running():
                self.watching = True
                try:
                    yield
                finally:
                    self.watching = False
        return watched()

    def __getattr__(self, name: str):
        return getattr(self.watchdog, name)


class _Connection:
    def __init__(self, con, recording: _Recording) -> None:
        self.con, self.recording = con, recording

    def execute(self, sql: str, *args):
        if not self.recording.watching and sql.lstrip().upper().startswith(("SELECT", "WITH")):
            self.recording.unwatched.append(sql)
        return self.con.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self.con, name)


def test_the_values_of_an_in_subquery_are_read_under_the_time_limit(visits_policy: Path) -> None:
    """Red team 6a: the analyst's IN subquery over public tables ran at check time without the query time limit
    (with `time_limit_seconds = 1`, a join of a 60-row public table with itself 8 times took 36 s in prepare, and
    more joins take hours, holding the public database's lock, before anything is charged or can be cancelled).
    Its read now runs under the watchdog, like a query of public tables; counted here, not timed."""
    session = _session(visits_policy)
    try:
        engine = session.engine
        public, watchdog = engine._public
        recording = _Recording(watchdog)
        engine._public = (_Connection(public, recording), recording)
        session.prepare("SELECT COUNT(*) FROM visits WHERE department IN (SELECT d.department FROM departments d "
                        "JOIN departments e ON d.floor = e.floor WHERE d.beds > 3)")
        session.execute("SELECT COUNT(*) FROM departments")
    finally:
        session.close()
    assert not recording.unwatched, recording.unwatched
