"""The other drivers analysts use: psycopg2, asyncpg (typed parameters from Describe), SQLAlchemy (its connection
set-up, table reflection from the catalog, pandas.read_sql), each with parameters and without charge for what is
not a private answer."""

from __future__ import annotations

import asyncio
import datetime
import urllib.parse

import asyncpg
import pandas
import pg8000.dbapi
import psycopg
import psycopg2
import pytest
import sqlalchemy

from tests.server.conftest import PASSWORDS, charges, dsn


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


# What each value travels as: psycopg 3 binary DATE, TIMESTAMP and TIMESTAMPTZ (an aware datetime); psycopg2 a
# literal in the SQL ('...'::timestamp, '...'::timestamptz); pg8000 untyped text ('2024-01-01T10:00:00'); asyncpg
# the type the server reported for the date column.
MOMENTS = [datetime.date(2024, 1, 1), datetime.datetime(2024, 1, 2), datetime.datetime(2024, 1, 3, 10),
           datetime.datetime(2024, 1, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))]
SQL = "SELECT COUNT(*) FROM visits WHERE visit_date >= {}"


def _psycopg(served, value: object) -> int:
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.01")
        return conn.cursor(binary=True).execute(SQL.format("%b"), (value,)).fetchone()[0]


def _dbapi(conn, value: object) -> int:
    """The count through a DB-API connection whose driver writes %s (closed after)."""
    try:
        cursor = conn.cursor()
        cursor.execute("SET dpsql.epsilon = 0.01")
        cursor.execute(SQL.format("%s"), (value,))
        return cursor.fetchone()[0]
    finally:
        conn.close()


def _psycopg2(served, value: object) -> int:
    return _dbapi(psycopg2.connect(dsn(served)), value)


def _pg8000(served, value: object) -> int:
    return _dbapi(pg8000.dbapi.connect(host="127.0.0.1", port=served.port, user="alice",
                                       password=PASSWORDS["alice"], database="dpsql"), value)


def _asyncpg(served, value: object) -> int:
    async def run() -> int:
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="alice", password=PASSWORDS["alice"],
                                     database="dpsql", ssl=False)
        try:
            await conn.execute("SET dpsql.epsilon = 0.01")
            return await conn.fetchval(SQL.format("$1"), value)
        finally:
            await conn.close()
    return asyncio.run(run())


@pytest.mark.parametrize("driver", [_psycopg, _psycopg2, _pg8000, _asyncpg], ids=lambda d: d.__name__[1:])
def test_every_driver_binds_dates_and_datetimes_to_a_date_column(served, driver) -> None:
    for value in MOMENTS:
        assert isinstance(driver(served, value), int)


@pytest.mark.parametrize("value", [datetime.time(10), b"north"], ids=["time", "bytes"])
def test_a_time_or_bytes_is_refused_naming_the_parameter_and_not_charged(served, value) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served), autocommit=True) as conn, \
            pytest.raises(psycopg.errors.InvalidParameterValue, match=r"parameter \$1: .* no column"):
        conn.cursor(binary=True).execute("SELECT COUNT(*) FROM visits WHERE region = %b", (value,))
    assert len(charges(served.policy)) == before
