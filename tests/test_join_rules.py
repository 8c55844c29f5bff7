"""Joins on the sample data: what is answered, and every rule that refuses a join, with the rule in the message."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.support import create_ledger, seeded
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.frontends.explain import explain
from dpsql.session import PrivateSession
from tests.conftest import SAMPLE, VISITS_FILES

REFUSED = [
    ("SELECT COUNT(*) FROM visits v RIGHT JOIN regions r ON v.region = r.region", "keeps every row of the public"),
    ("SELECT COUNT(*) FROM regions r JOIN visits v ON v.region = r.region RIGHT JOIN patients p "
     "ON p.patient_id = v.patient_id", "RIGHT JOIN after another join"),
    ("SELECT COUNT(*) FROM regions r RIGHT JOIN visits v ON v.region = r.region RIGHT JOIN patients p "
     "ON p.patient_id = v.patient_id", "RIGHT JOIN after another join"),
    ("SELECT COUNT(*) FROM visits v FULL JOIN regions r ON v.region = r.region", "only INNER and LEFT"),
    # DuckDB rejects a bare OUTER JOIN; dpsql ran it as INNER (red team)
    ("SELECT COUNT(*) FROM visits v OUTER JOIN regions r ON v.region = r.region", "OUTER JOIN needs LEFT"),
    ("SELECT COUNT(*) FROM visits v CROSS JOIN regions r", "cross join"),
    ("SELECT COUNT(*) FROM visits v, regions r", "cross join"),
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON v.age > d.floor", "non-equality"),
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON LOWER(v.department) = d.department", "expression"),
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON CAST(v.age AS TEXT) = d.department", "expression"),
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON v.age = d.department", "implicit cast"),
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON d.floor = d.beds", "each between the joined table"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r ON v.region = r.region JOIN departments d "
     "ON v.region = r.region", "each between the joined table"),
    ("SELECT COUNT(*) FROM visits v, regions r WHERE v.age > 3", "cross join"),
    ("SELECT COUNT(*) FROM visits v, departments d WHERE v.region = d.floor", "implicit cast"),
    ("SELECT COUNT(*) FROM regions r LEFT JOIN visits v ON v.region = r.region", "private table first"),
    ("SELECT COUNT(*) FROM visits v LEFT JOIN patients p ON v.patient_id = p.patient_id", "only be joined INNER"),
    ("SELECT COUNT(*) FROM visits v JOIN patients p ON v.sex = p.sex", "equals their unit columns"),
    ("SELECT COUNT(*) FROM visits a JOIN visits b ON a.age = b.age", "equals their unit columns"),
    ("SELECT p.patient_id, COUNT(*) FROM visits v JOIN patients p ON v.patient_id = p.patient_id "
     "GROUP BY p.patient_id", "privacy unit"),
    ("SELECT COUNT(*) FROM visits v JOIN regions r0 ON v.region = r0.region "
     + " ".join(f"JOIN regions r{i} ON r{i}.urban = r{i - 1}.urban" for i in range(1, 14)), "joins 14 tables"),
]


@pytest.fixture
def session(visits_policy: Path):
    session = PrivateSession(visits_policy, "tester", rng=seeded(3), bounding_seed=5)
    yield session
    session.close()


@pytest.mark.parametrize(("sql", "message"), REFUSED)
def test_joins_outside_the_rules_are_refused_with_the_rule_and_cost_nothing(refusing_visits_session, sql,
                                                                          message) -> None:
    with pytest.raises(QueryRejected, match=message):
        refusing_visits_session.execute(sql)
    assert refusing_visits_session.spending("tester").queries == 0


def test_private_tables_of_different_units_are_not_joined(tmp_path: Path) -> None:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, tmp_path / name)
    policy = tmp_path / "visits.toml"
    text = policy.read_text()
    head, tail = text.split("[tables.patients]")
    policy.write_text(head + "[tables.patients]" + tail.replace('unit = "patient"', 'unit = "household"', 1))
    create_ledger(policy)
    session = PrivateSession(policy, "tester", rng=seeded(1))
    try:
        with pytest.raises(QueryRejected, match="unit is 'household'"):
            session.execute("SELECT COUNT(*) FROM visits v JOIN patients p ON v.patient_id = p.patient_id")
    finally:
        session.close()


def test_joins_are_answered_with_public_domains_and_the_derived_bound(session) -> None:
    result = session.execute("SELECT d.specialty_group, COUNT(*) AS n FROM visits v "
                             "JOIN departments d ON v.department = d.department GROUP BY d.specialty_group "
                             "ORDER BY d.specialty_group", epsilon=5)
    assert [r[0] for r in result.rows] == ["emergency", "medical", "surgical"]  # public values: no selection
    assert result.cost.delta == 0 and result.plan.max_rows == 5
    joined = session.execute("SELECT p.insurance, AVG(v.cost) FROM visits v JOIN patients p "
                             "ON v.patient_id = p.patient_id GROUP BY p.insurance", epsilon=5)
    assert sorted(r[0] for r in joined.rows) == ["none", "private", "public"]
    twice = session.prepare("SELECT COUNT(*) FROM visits v JOIN regions r ON v.region = r.region "
                            "JOIN regions r2 ON r2.region = v.region").plan
    assert twice.max_rows == 5  # a public table joined twice on a unique key: k = 1 each time
    self_join = session.prepare("SELECT COUNT(*) FROM visits a JOIN visits b ON a.patient_id = b.patient_id").plan
    assert self_join.max_rows == 25


PER_UNIT_REFUSED = [
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id, region) p",
     "exactly the unit column"),
    # Answerable on its own, but the outer query reads a private table: no post-processing (tests/test_released.py).
    ("SELECT COUNT(*) FROM (SELECT region, COUNT(*) AS n FROM visits GROUP BY region) p JOIN patients q "
     "ON p.n = q.patient_id", "exactly the unit.*one private query's answer and public tables only"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id "
     "HAVING region = 'north') p", "aggregates only"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id "
     "HAVING MEDIAN(age) > 3) p", "not COUNT"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id LIMIT 10) p",
     "LIMIT"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id ORDER BY n) p",
     "ORDER BY"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) FROM visits GROUP BY patient_id) p", "named COUNT"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, region AS r FROM visits GROUP BY patient_id) p", "named COUNT"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, SUM(DISTINCT age) AS r FROM visits GROUP BY patient_id) p",
     "DISTINCT"),
    ("SELECT COUNT(*) FROM (SELECT COUNT(*) AS n FROM visits GROUP BY patient_id) p", "select the unit column"),
    ("SELECT n FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p", "outside an aggregate"),
    ("SELECT patient_id, COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p "
     "GROUP BY patient_id", "privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, SUM(region) AS s FROM visits GROUP BY patient_id) p", "text"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p "
     "JOIN patients q ON p.n = q.chronic_conditions", "equals their unit columns"),
    ("SELECT COUNT(*) FROM visits v JOIN (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p "
     "ON v.age = p.n", "equals their unit columns"),
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p "
     "JOIN __dp_sub0 q ON p.patient_id = q.patient_id", "unknown table"),
    ("SELECT COUNT(*) FROM (SELECT DISTINCT region FROM visits) p JOIN visits v ON v.region = p.region",
     "per-unit aggregation only"),
]


@pytest.mark.parametrize(("sql", "message"), PER_UNIT_REFUSED)
def test_per_unit_subqueries_outside_the_rules_are_refused(refusing_visits_session, sql, message) -> None:
    with pytest.raises((QueryRejected, ProgrammingError), match=message):
        refusing_visits_session.execute(sql)
    assert refusing_visits_session.spending("tester").queries == 0


def test_a_per_unit_aggregation_is_answered_with_the_count_domain(session) -> None:
    sql = ("SELECT n, COUNT(*) AS patients FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) "
           "AS p GROUP BY n ORDER BY n")
    result = session.execute(sql, epsilon=5)
    assert [r[0] for r in result.rows] == [1, 2, 3, 4, 5]  # COUNT(*) per unit: the public domain 1..m
    assert result.cost.delta == 0 and result.plan.max_rows == 1


def test_a_per_unit_subquery_joins_the_tables_of_its_unit(session) -> None:
    sql = ("SELECT q.insurance, AVG(p.n) AS visits FROM (SELECT patient_id, COUNT(*) AS n FROM visits "
           "GROUP BY patient_id) AS p JOIN patients q ON p.patient_id = q.patient_id GROUP BY q.insurance")
    prepared = session.prepare(sql)
    assert prepared.plan.max_rows == 1  # one row per patient on both sides
    assert sorted(r[0] for r in session.execute(sql, epsilon=5).rows) == ["none", "private", "public"]


def test_having_in_a_per_unit_subquery_filters_units_by_their_own_aggregates(session) -> None:
    having = ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id "
              "HAVING COUNT(*) >= 3 AND AVG(cost) > 0) p")
    outer = "SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) p WHERE n >= 3"
    assert abs(session.execute(having, epsilon=20).rows[0][0] - session.execute(outer, epsilon=20).rows[0][0]) < 40


def test_unit_columns_of_different_types_are_not_joined(tmp_path: Path) -> None:
    """An implicit cast between unit columns (text '01' and '1' both equal the integer 1) would let one unit's rows
    meet several units' rows: the two sides of every join equality must have the same declared type."""
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, tmp_path / name)
    policy = tmp_path / "visits.toml"
    head, tail = policy.read_text().split("[tables.patients.columns]")
    policy.write_text(head + "[tables.patients.columns]" + tail.replace('patient_id = { type = "int" }',
                                                                          'patient_id = { type = "text" }', 1))
    create_ledger(policy)
    session = PrivateSession(policy, "tester", rng=seeded(1))
    try:
        with pytest.raises(QueryRejected, match="implicit cast"):
            session.execute("SELECT COUNT(*) FROM visits v JOIN patients p ON v.patient_id = p.patient_id")
    finally:
        session.close()


def test_explain_derives_the_bound_step_by_step(session) -> None:
    text = explain(session.prepare("SELECT COUNT(*) FROM visits a JOIN visits b ON a.patient_id = b.patient_id "
                                   "JOIN regions r ON r.region = a.region").plan)
    assert "Contribution bound: at most 25 row(s) per unit" in text
    assert "1. a: private table 'visits' (unit 'patient'), capped at 5 row(s) per unit (rank <= 5): m = 5" in text
    assert "2. b: private table 'visits' joined on its unit column, capped at 5 row(s) per unit" in text
    assert "3. r: public table 'regions' joined on (region): unique key, so each row meets at most 1: m = 25" in text
    per_unit = explain(session.prepare("SELECT COUNT(*) FROM (SELECT patient_id, SUM(cost) AS s FROM visits "
                                       "GROUP BY patient_id) AS p WHERE s > 10").plan)
    assert "SUM in [5 * min(lo, 0), 5 * max(hi, 0)]" in per_unit and "m = 1 for the outer query" in per_unit


def test_an_inner_join_written_public_first_is_answered_as_if_private_first(session) -> None:
    """Inner joins commute: the rows are the same, and the bound is derived from the private table."""
    written = session.prepare("SELECT d.specialty_group, COUNT(*) FROM departments d JOIN visits v "
                              "ON v.department = d.department GROUP BY 1").plan
    private_first = session.prepare("SELECT d.specialty_group, COUNT(*) FROM visits v JOIN departments d "
                                    "ON v.department = d.department GROUP BY 1").plan
    assert written.max_rows == private_first.max_rows == 5
    assert written.query.relation.steps == private_first.query.relation.steps
    # NATURAL JOIN and USING are equalities of the same-named columns (qualify() writes them as ON)
    natural = session.prepare("SELECT COUNT(*) FROM visits v NATURAL JOIN regions r").plan
    assert natural.query.relation.steps == session.prepare(
        "SELECT COUNT(*) FROM visits v JOIN regions r USING (region)").plan.query.relation.steps


def test_a_per_unit_subquery_may_aggregate_joined_rows(session) -> None:
    sql = ("SELECT n, COUNT(*) FROM (SELECT v.patient_id, COUNT(*) AS n FROM visits v JOIN departments d "
           "ON v.department = d.department WHERE d.specialty_group = 'medical' GROUP BY v.patient_id) AS p GROUP BY n")
    query_plan = session.prepare(sql).plan
    assert query_plan.max_rows == 1 and query_plan.query.keys[0].domain == (1, 2, 3, 4, 5)
    assert "per-unit subquery over the join above: at most 5 rows per unit" in explain(query_plan)


# Joins as written (issue 36): each is answered as the form the rules read, with the same measurements -------------

WRITTEN = [
    # RIGHT JOIN keeping the private table: the mirrored LEFT JOIN
    ("SELECT d.specialty_group, COUNT(*), SUM(v.cost) FROM departments d RIGHT JOIN visits v "
     "ON v.department = d.department GROUP BY d.specialty_group",
     "SELECT d.specialty_group, COUNT(*), SUM(v.cost) FROM visits v LEFT JOIN departments d "
     "ON v.department = d.department GROUP BY d.specialty_group"),
    # a comma join with its WHERE equality: the INNER JOIN on it, the rest of the WHERE kept
    ("SELECT d.specialty_group, COUNT(*) FROM visits v, departments d WHERE v.department = d.department "
     "AND v.age > 30 GROUP BY d.specialty_group",
     "SELECT d.specialty_group, COUNT(*) FROM visits v JOIN departments d ON v.department = d.department "
     "WHERE v.age > 30 GROUP BY d.specialty_group"),
    ("SELECT COUNT(*) FROM visits v, patients p WHERE p.patient_id = v.patient_id AND p.birth_year > 1950",
     "SELECT COUNT(*) FROM visits v JOIN patients p ON p.patient_id = v.patient_id WHERE p.birth_year > 1950"),
    # a constant (or any other condition) in an INNER join's ON: a filter in WHERE
    ("SELECT COUNT(*) FROM visits v JOIN departments d ON d.department = v.department AND d.beds > 20",
     "SELECT COUNT(*) FROM visits v JOIN departments d ON d.department = v.department WHERE d.beds > 20"),
    ("SELECT COUNT(*) FROM visits v JOIN patients p ON p.patient_id = v.patient_id AND v.age > p.chronic_conditions",
     "SELECT COUNT(*) FROM visits v JOIN patients p ON p.patient_id = v.patient_id WHERE v.age > "
     "p.chronic_conditions"),
]


@pytest.mark.parametrize(("written", "rules"), WRITTEN)
def test_a_join_as_written_is_answered_as_the_form_the_rules_read(session, written, rules) -> None:
    mine, theirs = session.prepare(written), session.prepare(rules)
    assert mine.plan.max_rows == theirs.plan.max_rows
    assert mine.plan.query.relation.steps == theirs.plan.query.relation.steps
    assert sorted(session.measure(mine), key=repr) == sorted(session.measure(theirs), key=repr)


def test_a_left_join_filtered_in_on_keeps_unmatched_rows_and_counts_the_filtered_rows_per_key(session) -> None:
    """`LEFT JOIN d ON key AND f(d)` keeps every visit (with NULLs where no department passes f): the department table
    filtered first, whose rows per key are read from its own rows."""
    filtered = session.prepare("SELECT d.floor, COUNT(*) FROM visits v LEFT JOIN departments d "
                               "ON d.department = v.department AND d.beds > 20 GROUP BY d.floor")
    total = session.prepare("SELECT COUNT(*) FROM visits v")
    counts = session.measure(filtered)
    assert sum(row[-1] for row in counts) == session.measure(total)[0][-1]
    assert any(row[0] is None for row in counts)  # the departments with at most 20 beds: no match, kept
