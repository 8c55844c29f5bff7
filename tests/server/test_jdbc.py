"""The PostgreSQL JDBC driver (what DBeaver and other Java tools use): a prepared query with a parameter, a refusal
with its SQLSTATE, and the metadata calls tools make first (tables, columns with their JDBC types and nullability,
schemas), answered from the policy without charge. .ci/run installs the driver from the system's packages."""

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


@needs_jdbc
def test_jdbc_queries_and_reads_the_metadata(served) -> None:
    before = len(charges(served.policy))
    done = subprocess.run(["java", "-cp", str(DRIVER), str(PROBE), str(served.port), PASSWORDS["alice"]],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "describe n int8" in lines
    assert sorted(line.split()[1] for line in lines if line.startswith("row ")) == \
        ["central", "east", "north", "south", "west"]
    assert "refused 0A000" in lines
    assert "table public.visits" in lines and "schema public" in lines
    columns = {line.split()[1]: line.split()[2:] for line in lines if line.startswith("column ")}
    # java.sql.Types: BIGINT -5, DATE 91, VARCHAR 12, BIT -7 (PostgreSQL's boolean), DOUBLE 8.
    assert columns == {"patient_id": ["-5", "YES"], "visit_date": ["91", "YES"], "region": ["12", "YES"],
                       "department": ["12", "YES"], "age": ["-5", "NO"], "sex": ["12", "YES"],
                       "smoker": ["-7", "YES"], "cost": ["8", "YES"], "length_of_stay": ["-5", "NO"]}
    assert len(charges(served.policy)) == before + 1  # the one private query; Describe and metadata are free


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
