"""SQLAlchemy 2 over the server (psycopg, psycopg2, pg8000): the inspector's reflection as SQLAlchemy, pandas and
Superset use it, then queries as Superset's SQL Lab sends them. Superset itself (6.1, on SQLAlchemy 1.4) is too
heavy for the test environment: its code path is the inspector's calls below (get_schema_names,
get_table_names, get_columns, get_pk_constraint, get_foreign_keys, get_indexes, get_table_comment), its SQL Lab
limit (LIMIT 1000 set on the statement), its row count and virtual-dataset wrappers and its column probe."""

from __future__ import annotations

import warnings

import pandas
import pytest
import sqlalchemy as sa

from tests.server.conftest import charges, url

DRIVERS = ["psycopg", "psycopg2", "pg8000"]


@pytest.fixture(params=DRIVERS)
def engine(served, request):
    created = sa.create_engine(url(served, f"postgresql+{request.param}"))
    yield created
    created.dispose()


def _grouped(engine: sa.Engine) -> str:
    """A question of its own per driver (the same question again would be the answer already released)."""
    return f"SELECT region, COUNT(*) AS n FROM public.visits WHERE age > {40 + DRIVERS.index(engine.driver)} " \
           "GROUP BY region"


def test_reflection_shows_the_policys_tables_in_public_at_no_cost(served, engine) -> None:
    before = charges(served.policy)
    inspector = sa.inspect(engine)
    assert inspector.default_schema_name == "public"
    assert "public" in inspector.get_schema_names() and "main" not in inspector.get_schema_names()
    assert inspector.get_table_names() == inspector.get_table_names("public") == ["visits", "patients",
                                                                                  "departments", "regions"]
    assert inspector.get_view_names("public") == []
    columns = [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns("visits", "public")]
    assert columns == [("patient_id", "BIGINT", True), ("visit_date", "DATE", True), ("region", "VARCHAR(1000)", True),
                       ("department", "VARCHAR(1000)", True), ("age", "BIGINT", False), ("sex", "VARCHAR(1000)", True),
                       ("smoker", "BOOLEAN", True), ("cost", "DOUBLE PRECISION", True),
                       ("length_of_stay", "BIGINT", False)]
    assert inspector.get_pk_constraint("visits")["constrained_columns"] == []
    assert inspector.get_foreign_keys("visits") == [] and inspector.get_indexes("visits") == []
    assert inspector.get_unique_constraints("visits") == [] and inspector.get_check_constraints("visits") == []
    assert "privacy unit patient_id" in inspector.get_table_comment("visits")["text"]
    assert inspector.has_table("visits") and not inspector.has_table("nope")
    table = sa.Table("visits", sa.MetaData(), autoload_with=engine)
    assert [c.name for c in table.columns][:3] == ["patient_id", "visit_date", "region"]
    assert charges(served.policy) == before


def test_pandas_reads_a_grouped_answer_and_the_table_read_is_refused(served, engine) -> None:
    before = len(charges(served.policy))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas warns about a DB-API connection that is not SQLAlchemy's
        frame = pandas.read_sql(_grouped(engine).replace(" > ", " >= "), engine)
    assert sorted(frame["region"]) == ["central", "east", "north", "south", "west"]
    with pytest.raises(pandas.errors.DatabaseError, match="only aggregates and group keys can be released"):
        pandas.read_sql_table("visits", engine)  # a row-level read: refused, with the reason
    assert len(charges(served.policy)) == before + 1


def test_superset_sql_lab_forms_are_answered_and_charged_once(served, engine) -> None:
    # Superset's SQL Lab sets LIMIT on the statement; its row count and virtual datasets wrap the query.
    before = len(charges(served.policy))
    grouped = _grouped(engine)
    with engine.connect() as connection:
        limited = connection.exec_driver_sql(f"{grouped}\nLIMIT 1000").fetchall()
        count = connection.exec_driver_sql(f"SELECT COUNT(*) AS rowcount FROM ({grouped}) AS virtual_table")
        wrapped = connection.exec_driver_sql(f"SELECT * FROM ({grouped}) AS virtual_table LIMIT 1000").fetchall()
        probe = connection.exec_driver_sql("SELECT * FROM visits WHERE 1=0")
        assert list(probe.keys()) == ["patient_id", "visit_date", "region", "department", "age", "sex", "smoker",
                                      "cost", "length_of_stay"] and probe.fetchall() == []
        assert count.scalar() == len(limited) == len(wrapped) == 5
        with pytest.raises(sa.exc.DBAPIError, match="individual rows"):  # the table preview (select_star)
            connection.exec_driver_sql("SELECT * FROM public.visits LIMIT 100").fetchall()
    charged = [c.query for c in charges(served.policy)[before:]]
    # One charge for the limited query; the wrappers' private query is another question (no LIMIT), asked once and
    # then answered again from the released answer; the probe and the refusal cost nothing.
    assert len(charged) == 2 and charged[1] == grouped.replace("public.visits", "visits")
