"""The PostgreSQL JDBC driver, as DBeaver and Metabase use it: a prepared query with a parameter, a refusal with its
SQLSTATE, DatabaseMetaData (catalogs, schemas, tables, columns with their JDBC types and nullability, primary,
imported and exported keys, indexes, privileges, types), Metabase's sync queries, a native query with a date
parameter and a question's rows counted by an outer query: the metadata answered from the policy at no cost,
the queries charged once each. .ci/run installs the driver from the system's packages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.server.conftest import PASSWORDS, charges

DRIVER = Path("/usr/share/java/postgresql.jar")
PROBE = Path(__file__).parent / "java" / "JdbcProbe.java"
DATES = Path(__file__).parent / "java" / "DateProbe.java"

needs_jdbc = pytest.mark.skipif(shutil.which("java") is None or not DRIVER.exists(),
                                reason="Java or the PostgreSQL JDBC driver is not installed (.ci/run installs them)")


@pytest.fixture(scope="module")
def probed(served) -> tuple[list[str], list, list]:
    before = charges(served.policy)
    done = subprocess.run(["java", "-cp", str(DRIVER), str(PROBE), str(served.port), PASSWORDS["alice"]],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines(), before, charges(served.policy)


def _with(lines: list[str], label: str) -> list[list[str]]:
    return [line.split()[1:] for line in lines if line.split()[0] == label]


@needs_jdbc
def test_jdbc_queries_and_refuses_row_level_reads(probed) -> None:
    lines, _, _ = probed
    assert "describe n int8" in lines
    assert sorted(row[0] for row in _with(lines, "row")) == ["central", "east", "north", "south", "west"]
    assert "refused 0A000" in lines
    assert [row[0] for row in _with(lines, "dated")] == ["F", "M"]
    assert not any("FAILED" in line for line in lines), [line for line in lines if "FAILED" in line]


@needs_jdbc
def test_jdbc_metadata_shows_the_policys_tables_in_public_and_nothing_else(probed) -> None:
    lines, _, _ = probed
    assert _with(lines, "catalog") == [["visits"], ["count", "1"]]  # the database as the client named it
    assert ["public"] in _with(lines, "schema") and ["main"] not in _with(lines, "schema")
    assert _with(lines, "table")[:-1] == [["public", name] for name in ("departments", "patients", "regions",
                                                                         "visits")]
    columns = {row[0]: row[1:] for row in _with(lines, "column")[:-1]}
    # java.sql.Types: BIGINT -5, DATE 91, VARCHAR 12, BIT -7 (PostgreSQL's boolean), DOUBLE 8.
    assert columns == {"patient_id": ["-5", "YES"], "visit_date": ["91", "YES"], "region": ["12", "YES"],
                       "department": ["12", "YES"], "age": ["-5", "NO"], "sex": ["12", "YES"],
                       "smoker": ["-7", "YES"], "cost": ["8", "YES"], "length_of_stay": ["-5", "NO"]}
    for label in ("primary", "imported", "exported", "index"):  # none exists: answered, empty
        assert _with(lines, label) == [["count", "0"]], label
    assert _with(lines, "privilege")[:-1] == [["PUBLIC", "SELECT"]]  # read only, for everyone
    types = {row[0] for row in _with(lines, "type")}
    assert {"int8", "text", "varchar", "float8", "bool", "date", "timestamp", "numeric"} <= types


@needs_jdbc
def test_metabases_sync_queries_read_the_catalog(probed) -> None:
    lines, _, _ = probed
    assert ["public", "visits"] in _with(lines, "metabase-schema")
    assert _with(lines, "metabase-privilege") == [["public", name, "t", "f"] for name in ("departments", "patients",
                                                                                        "regions", "visits")]
    # Each table described from the policy; no row count is told (0: unknown).
    assert _with(lines, "metabase-table") == [["public", name, "t", "0"] for name in ("departments", "patients",
                                                                                    "regions", "visits")]


@needs_jdbc
def test_jdbc_charges_each_private_query_once_and_nothing_else(probed) -> None:
    lines, before, after = probed
    assert _with(lines, "wrapped") == [["8"]]  # the eight declared departments, counted from the released rows
    charged = [charge.query for charge in after[len(before):]]
    # The prepared query, the dated one and the wrapped one's inner query, each once: Describe, the refusal and
    # all the metadata cost nothing.
    assert charged == ["SELECT region, COUNT(*) AS n FROM visits WHERE age > $1 GROUP BY region ORDER BY region",
                       "SELECT sex, COUNT(*) AS n FROM visits WHERE visit_date >= $1 GROUP BY sex ORDER BY sex",
                       "SELECT department, COUNT(*) AS n FROM visits GROUP BY department"]


@needs_jdbc
def test_jdbc_binds_dates_and_timestamps_as_the_driver_sends_them(served) -> None:
    """setDate sends '2024-01-01 +01' (the date with the JVM's offset), setTimestamp '2024-01-02 00:00:00+01',
    setObject(LocalDateTime) a timestamp with an offset too: each is the value of the compared date column it
    spells (a time of day compares as DuckDB compares a date with a timestamp). A time of day and bytes have no
    column to be compared with: refused (22023), not charged."""
    before = len(charges(served.policy))
    done = subprocess.run(["java", "-Duser.timezone=Europe/Paris", "-cp", str(DRIVER), str(DATES), str(served.port),
                           PASSWORDS["alice"]], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    accepted = ["setDate", "setTimestamp", "setTimestampWithTime", "setObjectLocalDate", "setObjectLocalDateTime",
                "setObjectOffsetDateTime", "setString"]
    assert lines == [f"OK {setter}" for setter in accepted] + ["ERR setTime 22023", "ERR setBytes 22023"]
    assert len(charges(served.policy)) == before + len(accepted)
