"""The SQLAlchemy dialect over the embedded DB-API (`dpsql:///path/policy.toml`): pandas reads a private answer
without its warning about non-SQLAlchemy connections, the inspector reflects the policy (no query, no charge),
and a row-level read is refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas
import pytest
import sqlalchemy as sa

from dpsql.errors import QueryRejected


@pytest.fixture
def engine(visits_policy: Path):
    created = sa.create_engine(f"dpsql:///{visits_policy}?analyst=alice")
    yield created
    created.dispose()


def _charges(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return len(connection.connection.dbapi_connection.history())


def test_the_url_names_the_policy_and_the_analyst(engine, visits_policy: Path) -> None:
    with engine.connect() as connection:
        session = connection.connection.dbapi_connection.session
        assert session.policy.path == visits_policy and session.analyst == "alice"
    with pytest.raises(ValueError, match="not colour"):
        sa.create_engine(f"dpsql:///{visits_policy}?colour=red").connect()


def test_reflection_from_the_policy_at_no_cost(engine) -> None:
    inspector = sa.inspect(engine)
    assert inspector.get_schema_names() == ["public"] and inspector.default_schema_name == "public"
    assert inspector.get_table_names() == ["visits", "patients", "departments", "regions"]
    columns = {c["name"]: (str(c["type"]), c["nullable"]) for c in inspector.get_columns("visits")}
    assert columns["age"] == ("BIGINT", False) and columns["region"] == ("VARCHAR(1000)", True)
    assert columns["cost"] == ("DOUBLE", True) and columns["visit_date"] == ("DATE", True)
    assert inspector.get_pk_constraint("visits")["constrained_columns"] == [] and inspector.get_indexes("visits") == []
    assert "bounds [0, 100]" in {c["name"]: c["comment"] for c in inspector.get_columns("visits")}["age"]
    table = sa.Table("visits", sa.MetaData(), autoload_with=engine, schema="public")
    assert len(table.columns) == 9
    assert _charges(engine) == 0


def test_pandas_reads_private_answers_through_the_engine(engine) -> None:
    visits = sa.Table("visits", sa.MetaData(), autoload_with=engine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = pandas.read_sql("SELECT sex, COUNT(*) AS n FROM visits WHERE age > ? GROUP BY sex", engine,
                                params=(30,))
        compiled = pandas.read_sql(sa.select(visits.c.region, sa.func.avg(visits.c.cost).label("c"))
                                   .group_by(visits.c.region), engine)
        probe = pandas.read_sql("SELECT * FROM visits LIMIT 0", engine)
    assert sorted(frame["sex"]) == ["F", "M"] and len(compiled) == 5
    assert list(probe.columns)[:3] == ["patient_id", "visit_date", "region"] and probe.empty
    with pytest.raises(pandas.errors.DatabaseError, match="individual rows") as caught:
        pandas.read_sql("SELECT * FROM visits", engine)
    assert isinstance(caught.value.__cause__.orig, QueryRejected)  # pandas wraps SQLAlchemy's, which wraps ours
    assert _charges(engine) == 2
