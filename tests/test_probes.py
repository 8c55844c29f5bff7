"""Column probes and tables named as tools write them, in the session (so the DB-API and the server alike).

A query whose answer has no row whatever the data (LIMIT 0, a WHERE false on every row) is answered from the
declared schema on empty tables: its columns, no row, no charge, and the engine's data is never read. A read that
returns rows is still refused. `public.visits` and `<database>.public.visits` are the declared table."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import seeded
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.session import PrivateSession

DECLARED = ["patient_id", "visit_date", "region", "department", "age", "sex", "smoker", "cost", "length_of_stay"]


@pytest.fixture
def session(visits_policy: Path):
    made = PrivateSession(visits_policy, "tester", rng=seeded(3), bounding_seed=3)
    yield made
    made.close()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM visits WHERE 1=0",
    "SELECT * FROM visits LIMIT 0",
    "SELECT * FROM public.visits WHERE false",
    "SELECT * FROM visits WHERE age > 3 AND 1 = 2",
    "SELECT * FROM (SELECT * FROM visits) AS t WHERE NULL",
])
def test_a_probe_returns_the_declared_columns_without_data_or_charge(refusing_visits_session, monkeypatch, sql) -> None:
    def no_data(query: str):
        raise AssertionError("a probe read the data")
    monkeypatch.setattr(refusing_visits_session.engine, "run", no_data)
    result = refusing_visits_session.execute(sql)
    assert [c.name for c in result.columns] == DECLARED and result.rows == []
    assert [c.type for c in result.columns][:5] == ["BIGINT", "DATE", "VARCHAR", "VARCHAR", "BIGINT"]
    assert result.cost.epsilon == 0 and refusing_visits_session.history() == []
    assert [c.name for c in refusing_visits_session.describe(sql)] == DECLARED


def test_a_probe_of_a_private_query_gives_its_output_columns(session) -> None:
    result = session.execute("SELECT * FROM (SELECT region, COUNT(*) AS n, AVG(cost) AS c FROM visits "
                             "GROUP BY region) AS t LIMIT 0")
    assert [(c.name, c.type) for c in result.columns] == [("region", "VARCHAR"), ("n", "BIGINT"), ("c", "DOUBLE")]
    assert result.rows == [] and session.history() == []


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT * FROM visits", "individual rows"),
    ("SELECT * FROM visits WHERE 1=1 LIMIT 5", "individual rows"),
    ("SELECT * FROM visits WHERE 1=0 OR age > 3", "individual rows"),  # not false on every row
    ("SELECT * FROM visits WHERE age > 200", "individual rows"),  # no row today says nothing of the data
    ("SELECT * FROM visits LIMIT 1 - 1", "individual rows"),  # only a literal 0 is read as no row
])
def test_reads_that_may_return_rows_stay_refused(refusing_visits_session, sql, message) -> None:
    with pytest.raises(QueryRejected, match=message):
        refusing_visits_session.execute(sql)
    assert refusing_visits_session.history() == []


def test_an_aggregate_over_no_rows_is_one_row_and_goes_the_private_way(session) -> None:
    result = session.execute("SELECT COUNT(*) AS n FROM visits WHERE 1=0")
    assert len(result.rows) == 1 and len(session.history()) == 1  # a noisy 0, charged like any count


@pytest.mark.parametrize("name", ["public.visits", '"public"."visits"', "visits.public.visits", "PUBLIC.Visits"])
def test_qualified_names_are_the_declared_table(visits_policy: Path, name: str) -> None:
    answers = []
    for table in ("visits", name):
        session = PrivateSession(visits_policy, "tester", rng=seeded(4), bounding_seed=3)
        try:
            answers.append(session.execute(f"SELECT sex, COUNT(*) FROM {table} GROUP BY sex").rows)
        finally:
            session.close()
    assert answers[0] == answers[1]


@pytest.mark.parametrize("name", ["other.public.visits", "main.visits", '"Public".visits', "pg_catalog.visits"])
def test_other_schemas_and_databases_are_unknown(refusing_visits_session, name: str) -> None:
    with pytest.raises((QueryRejected, ProgrammingError), match="only the policy's tables"):
        refusing_visits_session.execute(f"SELECT COUNT(*) FROM {name}")
