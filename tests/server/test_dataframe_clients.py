"""The dataframe clients, each through its own API: ibis's postgres backend (connect, list the tables, a table's
schema, a grouped aggregate it compiles itself), connectorx and ADBC (polars.read_database_uri with each engine,
and ADBC's own object and schema listing). connectorx counts the query's rows with an outer query and fetches
with binary COPY; ADBC reads pg_type and fetches with binary COPY. Each private question is charged once."""

from __future__ import annotations

import subprocess
import sys

import adbc_driver_postgresql.dbapi as adbc
import ibis
import polars
import pytest

from tests.server.conftest import PASSWORDS, charges, url

REGIONS = ["central", "east", "north", "south", "west"]


def test_ibis_lists_reads_the_schema_and_aggregates(served) -> None:
    before = len(charges(served.policy))
    con = ibis.postgres.connect(host="127.0.0.1", port=served.port, user="alice", password=PASSWORDS["alice"],
                                database="visits")
    try:
        assert con.list_tables() == ["departments", "patients", "regions", "visits"]
        visits = con.table("visits")
        schema = visits.schema()
        assert schema.names == ("patient_id", "visit_date", "region", "department", "age", "sex", "smoker", "cost",
                                "length_of_stay")
        assert str(schema["age"]) == "!int64" and str(schema["cost"]) == "float64"  # NOT NULL where declared
        older = visits.filter(visits.age > 50)
        frame = older.group_by("region").aggregate(n=older.count()).execute()
        assert sorted(frame["region"]) == REGIONS
    finally:
        con.disconnect()
    assert len(charges(served.policy)) == before + 1


@pytest.mark.parametrize("engine", ["connectorx", "adbc"])
def test_polars_reads_a_private_answer_with_each_engine(served, engine) -> None:
    before = len(charges(served.policy))
    sql = f"SELECT sex, COUNT(*) AS n, AVG(cost) AS c FROM visits WHERE age < {60 + len(engine)} GROUP BY sex"
    frame = polars.read_database_uri(sql, url(served), engine=engine)
    assert frame.columns == ["sex", "n", "c"] and sorted(frame["sex"].to_list()) == ["F", "M"]
    assert frame.schema["n"] == polars.Int64 and frame.schema["c"] == polars.Float64
    assert len(charges(served.policy)) == before + 1


def test_connectorx_counts_rows_with_an_outer_query_charged_as_the_inner(served) -> None:
    before = len(charges(served.policy))
    sql = "SELECT department, COUNT(*) AS n FROM visits WHERE smoker GROUP BY department"
    # In a process of its own: connectorx's pandas path holds the GIL while it waits for the in-process server.
    script = ("import connectorx, sys; frame = connectorx.read_sql(sys.argv[1], sys.argv[2]); "
              "print(len(frame), sorted(frame.columns))")
    done = subprocess.run([sys.executable, "-c", script, url(served), sql], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split(maxsplit=1) == ["8", "['department', 'n']\n"]  # it asks SELECT count(*) FROM (sql)
    assert [c.query for c in charges(served.policy)[before:]] == [sql]


def test_adbc_lists_objects_and_schemas_from_the_catalog(served) -> None:
    before = charges(served.policy)
    with adbc.connect(url(served)) as con:
        (catalog,) = con.adbc_get_objects(depth="columns").read_all().to_pylist()
        assert catalog["catalog_name"] == "visits"
        public = {s["db_schema_name"]: s for s in catalog["catalog_db_schemas"]}["public"]
        tables = {t["table_name"]: t for t in public["db_schema_tables"]}
        assert sorted(tables) == ["departments", "patients", "regions", "visits"]
        columns = sorted(tables["regions"]["table_columns"], key=lambda c: c["ordinal_position"])
        assert [c["column_name"] for c in columns] == ["region", "population", "urban"]
        schema = con.adbc_get_table_schema("visits", db_schema_filter="public")
        assert [str(schema.field(name).type) for name in ("patient_id", "visit_date", "region", "smoker")] == \
            ["int64", "date32[day]", "string", "bool"]
    assert charges(served.policy) == before
