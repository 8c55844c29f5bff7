"""`unit IN (SELECT unit FROM <private table> WHERE ...)`: a join with that table's qualifying units, one row each
(analysis/normalize.py), then the checker's join rules. Same answer as the written join; the true semi-join's count
when the inner table has one row per unit."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import seeded
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.session import PrivateSession

WRITTEN = ("SELECT region, COUNT(*), AVG(cost) FROM visits WHERE age > 20 AND patient_id IN (SELECT patient_id "
           "FROM patients WHERE chronic_conditions > 3) GROUP BY region")
JOINED = ("SELECT region, COUNT(*), AVG(cost) FROM visits JOIN (SELECT patient_id AS semijoin_1 FROM patients "
          "WHERE chronic_conditions > 3 GROUP BY patient_id) AS semijoin_1 "
          "ON visits.patient_id = semijoin_1.semijoin_1 WHERE age > 20 GROUP BY region")


def _session(policy: Path) -> PrivateSession:
    return PrivateSession(policy, "tester", rng=seeded(5), bounding_seed=9)


def _answer(policy: Path, sql: str) -> tuple:
    """The rows, the cost and the bounded SQL of `sql`, on a fresh session with the same seeds."""
    session = _session(policy)
    try:
        result = session.execute(sql)
        return sorted(result.rows), result.cost, session.prepare(sql).bounded.sql
    finally:
        session.close()


def test_the_answer_is_that_of_the_join(visits_policy: Path) -> None:
    assert _answer(visits_policy, WRITTEN) == _answer(visits_policy, JOINED)


def test_with_one_row_per_patient_it_is_the_semi_join(visits_policy: Path) -> None:
    sql = ("SELECT COUNT(*) FROM visits WHERE patient_id IN (SELECT patient_id FROM patients WHERE insurance = "
           "'none')")
    folder = visits_policy.parent
    # a unit's capped rows count min(its rows, m = 5), whichever are kept
    truth = duckdb.connect().execute(
        f"SELECT COUNT(*) FROM (SELECT patient_id, ROW_NUMBER() OVER (PARTITION BY patient_id) AS r "
        f"FROM read_csv('{folder / 'visits.csv'}')) v WHERE r <= 5 AND patient_id IN (SELECT "
        f"patient_id FROM read_csv('{folder / 'patients.csv'}') WHERE insurance = 'none')").fetchone()[0]
    session = _session(visits_policy)
    try:
        result = session.execute(sql, epsilon=40)
        # The Laplace noise, scale b = std / sqrt(2), exceeds b * ln(1e9) with probability 1e-9.
        bound = result.noise_std[0][0] / math.sqrt(2) * math.log(1e9)
        assert abs(result.rows[0][0] - truth) <= bound
    finally:
        session.close()


@pytest.mark.parametrize(("sql", "error"), [
    # not the unit on both sides: the join rules refuse it, and the semi-join's (analysis/semijoins.py) under NOT
    ("SELECT COUNT(*) FROM visits WHERE age IN (SELECT birth_year FROM patients)", QueryRejected),
    ("SELECT COUNT(*) FROM visits WHERE patient_id IN (SELECT chronic_conditions FROM patients)", QueryRejected),
    ("SELECT COUNT(*) FROM visits WHERE age NOT IN (SELECT birth_year FROM patients)", QueryRejected),
])
def test_the_other_forms_are_refused_at_no_cost(visits_policy: Path, sql: str, error: type) -> None:
    session = _session(visits_policy)
    try:
        with pytest.raises((error, ProgrammingError)):
            session.execute(sql)
        assert session.spending("tester").queries == 0
    finally:
        session.close()


@pytest.mark.parametrize(("exists", "listed"), [
    ("SELECT COUNT(*) FROM visits v WHERE v.age > 10 AND EXISTS (SELECT 1 FROM patients p WHERE p.patient_id = "
     "v.patient_id AND p.sex = 'F')",
     "SELECT COUNT(*) FROM visits v WHERE v.age > 10 AND v.patient_id IN (SELECT p.patient_id FROM patients p "
     "WHERE p.sex = 'F')"),
    ("SELECT region, AVG(cost) FROM visits v WHERE EXISTS (SELECT * FROM departments d WHERE v.department = "
     "d.department AND d.floor > 2) GROUP BY region",
     "SELECT region, AVG(cost) FROM visits v WHERE v.department IN ('cardiology', 'neurology', 'oncology') "
     "GROUP BY region"),
])
def test_a_correlated_exists_is_the_in_it_means(visits_policy: Path, exists: str, listed: str) -> None:
    answers = []
    for sql in (exists, listed):
        session = _session(visits_policy)
        try:
            result = session.execute(sql)
            answers.append((sorted(result.rows), result.cost, session.prepare(sql).bounded.sql))
        finally:
            session.close()
    assert answers[0] == answers[1]


@pytest.mark.parametrize("sql", [
    # a private table probed on another column than its unit: one person's row could meet everyone's
    "SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM patients p WHERE p.birth_year = v.age)",
    # a join inside: not one table
    "SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM patients p JOIN visits w ON w.patient_id = "
    "p.patient_id WHERE p.patient_id = v.patient_id)",
])
def test_other_exists_are_refused_at_no_cost(visits_policy: Path, sql: str) -> None:
    session = _session(visits_policy)
    try:
        with pytest.raises(QueryRejected):
            session.execute(sql)
        assert session.spending("tester").queries == 0
    finally:
        session.close()


@pytest.mark.parametrize(("written", "joined"), [
    # Red team 6a: a second unit IN was refused, its unqualified column taken for ambiguous beside the first's join
    ("SELECT COUNT(*), AVG(cost) FROM visits WHERE patient_id IN (SELECT patient_id FROM patients WHERE "
     "chronic_conditions > 3) AND age > 20 AND patient_id IN (SELECT patient_id FROM patients WHERE sex = 'F')",
     "SELECT COUNT(*), AVG(cost) FROM visits JOIN (SELECT patient_id AS semijoin_1 FROM patients WHERE "
     "chronic_conditions > 3 GROUP BY patient_id) AS semijoin_1 ON visits.patient_id = semijoin_1.semijoin_1 "
     "JOIN (SELECT patient_id AS semijoin_2 FROM patients WHERE sex = 'F' GROUP BY patient_id) AS semijoin_2 "
     "ON visits.patient_id = semijoin_2.semijoin_2 WHERE age > 20"),
    # an EXISTS over the outer query's own table: its alias names the inner table, the outer name the outer one
    ("SELECT COUNT(*) FROM visits WHERE EXISTS (SELECT 1 FROM visits AS w WHERE w.patient_id = visits.patient_id "
     "AND w.cost > 3000)",
     "SELECT COUNT(*) FROM visits JOIN (SELECT w.patient_id AS semijoin_1 FROM visits AS w WHERE w.cost > 3000 "
     "GROUP BY w.patient_id) AS semijoin_1 ON visits.patient_id = semijoin_1.semijoin_1"),
])
def test_two_semi_joins_and_a_self_exists_are_the_joins_they_mean(visits_policy: Path, written: str,
                                                                 joined: str) -> None:
    assert _answer(visits_policy, written) == _answer(visits_policy, joined)


# NOT IN, OR and a correlated IN cannot be a join: each is the semi-join flag of the EXISTS it means (semijoins.py), the
# unit being NULL on neither side.
@pytest.mark.parametrize(("written", "exists"), [
    ("SELECT COUNT(*) FROM visits v WHERE v.patient_id NOT IN (SELECT patient_id FROM patients WHERE sex = 'F')",
     "SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM patients p WHERE p.patient_id = v.patient_id "
     "AND p.sex = 'F')"),
    ("SELECT COUNT(*) FROM visits v WHERE v.age > 90 OR v.patient_id IN (SELECT patient_id FROM patients)",
     "SELECT COUNT(*) FROM visits v WHERE v.age > 90 OR EXISTS (SELECT 1 FROM patients p WHERE p.patient_id = "
     "v.patient_id)"),
    ("SELECT COUNT(*) FROM visits v WHERE patient_id IN (SELECT patient_id FROM patients p WHERE p.birth_year > "
     "v.age)",
     "SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM patients p WHERE p.patient_id = v.patient_id AND "
     "p.birth_year > v.age)"),
])
def test_in_under_not_or_and_correlated_is_the_exists_it_means(visits_policy: Path, written: str, exists: str):
    session = _session(visits_policy)
    try:
        measured = [session.measure(session.prepare(sql)) for sql in (written, exists)]
    finally:
        session.close()
    assert measured[0] == measured[1]
