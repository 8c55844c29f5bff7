"""Public relations (issue 36, analysis/public_relations.py): subqueries and CTEs of public tables anywhere a table
or a value may stand, read at check time (public data) and written into the query.

What is checked: a public CTE joined is answered as the same join written against the public table with the filter
in WHERE (the same rows), with its k read from its own rows (smaller than the table's when the filter keeps fewer
rows per key); the SQL that runs reads the rows written into it, not the public table, so the facts are those of
exactly the rows joined; a scalar subquery of public tables is its value; the refusals name their reason.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import open_session, write_hospital
from dpsql.analysis import person_work
from dpsql.errors import QueryRejected


@pytest.fixture(scope="module")
def hospital(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hospital(tmp_path_factory.mktemp("hospital"))


@pytest.fixture
def session(hospital: Path):
    session = open_session(hospital, 3)
    yield session
    session.close()


def _staff_per_department(hospital: Path, where: str) -> int:
    rows = duckdb.sql(f"SELECT department FROM read_csv('{hospital.parent / 'staff.csv'}') WHERE {where}")
    return max(Counter(r[0] for r in rows.fetchall()).values())


@pytest.mark.parametrize("where", ["role = 'nurse'", "name LIKE '%0'"])
def test_a_public_cte_joined_is_the_join_with_its_filter_and_its_k_is_read_from_its_own_rows(session, hospital,
                                                                                                where):
    cte = session.prepare(f"WITH chosen AS (SELECT department, name FROM staff WHERE {where}) "
                          "SELECT v.region, COUNT(*), SUM(v.cost) FROM visits v JOIN chosen c "
                          "ON c.department = v.department GROUP BY v.region")
    table = session.prepare("SELECT v.region, COUNT(*), SUM(v.cost) FROM visits v JOIN staff s "
                            f"ON s.department = v.department WHERE s.{where} GROUP BY v.region")
    assert sorted(session.measure(cte)) == sorted(session.measure(table))
    k, everyone = _staff_per_department(hospital, where), _staff_per_department(hospital, "true")
    assert cte.plan.max_rows == 5 * k and table.plan.max_rows == 5 * everyone
    assert k < everyone or where != "name LIKE '%0'"  # one staff member per department ends with 0: k = 1
    # the person's work counts its k: each of a person's 5 rows meets at most k of its rows
    joined = [t for t in cte.plan.query.work.terms if str(t.what).startswith("JOIN the public relation")]
    assert [(t.rows, t.units) for t in joined] == [(5, person_work.ROW), (5 * k, person_work.JOIN)]


def test_the_sql_that_runs_holds_the_rows_whose_facts_bound_it(session) -> None:
    """The relation's rows are in the query: a second reading of the subquery (a LIMIT without ORDER BY could return
    other rows, and another k) never happens."""
    prepared = session.prepare("SELECT COUNT(*) FROM visits v JOIN (SELECT department FROM staff LIMIT 3) s "
                               "ON s.department = v.department")
    assert "__dp_staff" not in prepared.bounded.sql and "VALUES" in prepared.bounded.sql
    assert len(prepared.plan.query.relation.steps) == 3


def test_a_public_relations_columns_are_public_domains(session) -> None:
    prepared = session.prepare("WITH d AS (SELECT department, specialty_group AS grp FROM departments) "
                               "SELECT d.grp, COUNT(*) FROM visits v JOIN d ON d.department = v.department "
                               "GROUP BY d.grp")
    assert prepared.plan.selection is None and prepared.plan.cost.delta == 0
    assert prepared.plan.query.keys[0].domain == ("emergency", "medical", "surgical")


def test_a_scalar_subquery_of_public_tables_is_its_value(session) -> None:
    average = duckdb.sql("SELECT AVG(beds) FROM read_csv('sample_data/departments.csv')").fetchall()[0][0]
    scalar = session.prepare("SELECT COUNT(*) FROM visits WHERE cost > (SELECT AVG(beds) FROM departments)")
    literal = session.prepare(f"SELECT COUNT(*) FROM visits WHERE cost > CAST('{average!r}' AS DOUBLE)")
    assert session.measure(scalar) == session.measure(literal)
    # no row: NULL, as in SQL (no visit has cost > NULL)
    empty = session.prepare("SELECT COUNT(*) FROM visits WHERE cost > (SELECT beds FROM departments WHERE beds < 0)")
    assert session.measure(empty) == [(0,)]


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits WHERE cost > (SELECT beds FROM departments)", "returns 8 rows"),
    ("SELECT COUNT(*) FROM visits WHERE cost > (SELECT beds, floor FROM departments LIMIT 1)", "one column"),
    ("SELECT COUNT(*) FROM visits v JOIN (SELECT department, department FROM departments) d "
     "ON d.department = v.department", "two columns of one name"),
])
def test_what_a_public_subquery_cannot_stand_for_is_refused_with_its_reason(session, sql, message) -> None:
    with pytest.raises(QueryRejected, match=message):
        session.prepare(sql)


def test_a_forged_public_relation_mark_is_ignored(session) -> None:
    """sqlglot reads `/* sqlglot.meta k=v */` into a node's meta: a string under the mark's key is not a relation."""
    with pytest.raises(QueryRejected, match="per-unit aggregation only"):
        session.prepare("SELECT COUNT(*) FROM visits v JOIN (SELECT region FROM visits GROUP BY region) "
                        "/* sqlglot.meta dpsql_public_relation=1 */ AS x ON x.region = v.region")
