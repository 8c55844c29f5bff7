"""The other drivers analysts use: psycopg2, asyncpg (typed parameters from Describe), SQLAlchemy (its connection
set-up, table reflection from the catalog, pandas.read_sql), each with parameters and without charge for what is
not a private answer."""

from __future__ import annotations

import asyncio
import urllib.parse

import asyncpg
import pandas
import psycopg2
import pytest
import sqlalchemy

from tests.server.conftest import PASSWORDS, charges


def test_psycopg2_runs_a_query_with_parameters(served) -> None:
    conn = psycopg2.connect(host="127.0.0.1", port=served.port, user="alice", password=PASSWORDS["alice"],
                            dbname="dpsql", sslmode="disable")
    try:
        before = len(charges(served.policy))
        cursor = conn.cursor()
        cursor.execute("SELECT sex, COUNT(*) FROM visits WHERE age BETWEEN %s AND %s GROUP BY sex ORDER BY sex",
                       (20, 60))
        rows = cursor.fetchall()
        assert [r[0] for r in rows] == ["F", "M"] and all(isinstance(r[1], int) for r in rows)
        assert len(charges(served.policy)) == before + 1
        with pytest.raises(psycopg2.errors.FeatureNotSupported):
            cursor.execute("SELECT age FROM visits")
    finally:
        conn.close()


def test_asyncpg_prepares_with_typed_parameters_and_describe_charges_nothing(served) -> None:
    async def run() -> tuple[list, list, int, int]:
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="alice",
                                     password=PASSWORDS["alice"], database="dpsql", ssl=False)
        try:
            before = len(charges(served.policy))
            statement = await conn.prepare("SELECT AVG(cost) AS c FROM visits WHERE region = $1 AND age > $2")
            described = len(charges(served.policy))
            types = [t.name for t in statement.get_parameters()]
            rows = await statement.fetch("north", 30)
            return types, rows, before, described
        finally:
            await conn.close()
    types, rows, before, described = asyncio.run(run())
    assert types == ["text", "int8"]  # the compared columns' types, inferred for the driver
    assert described == before
    assert len(rows) == 1 and isinstance(rows[0]["c"], float)
    assert len(charges(served.policy)) == before + 1


@pytest.fixture
def engine(served):
    password = urllib.parse.quote(PASSWORDS["bob"])
    made = sqlalchemy.create_engine(f"postgresql+psycopg://bob:{password}@127.0.0.1:{served.port}/dpsql"
                                    "?sslmode=disable")
    yield made
    made.dispose()


def test_sqlalchemy_reflects_the_declared_schema_without_charge(served, engine) -> None:
    before = len(charges(served.policy))
    inspector = sqlalchemy.inspect(engine)
    assert sorted(inspector.get_table_names()) == ["departments", "patients", "regions", "visits"]
    columns = {c["name"]: c for c in inspector.get_columns("visits")}
    assert list(columns) == ["patient_id", "visit_date", "region", "department", "age", "sex", "smoker", "cost",
                             "length_of_stay"]
    assert isinstance(columns["age"]["type"], sqlalchemy.BIGINT) and not columns["age"]["nullable"]
    assert isinstance(columns["cost"]["type"], sqlalchemy.Double | sqlalchemy.DOUBLE_PRECISION)
    assert isinstance(columns["region"]["type"], sqlalchemy.VARCHAR) and columns["region"]["nullable"]
    assert len(charges(served.policy)) == before


def test_pandas_read_sql_through_sqlalchemy(served, engine) -> None:
    before = len(charges(served.policy))
    frame = pandas.read_sql(sqlalchemy.text("SELECT department, COUNT(*) AS n FROM visits WHERE age > :age "
                                            "GROUP BY department ORDER BY department"), engine, params={"age": 70})
    assert list(frame.columns) == ["department", "n"] and len(frame) == 8
    assert len(charges(served.policy)) == before + 1
