"""Dates, timestamps, times and bytes as parameters, in every form a driver sends them: a value of the compared
column's type is accepted and means exactly that value; anything else is refused before any charge, naming the
parameter.

Each accepted value is checked against plain DuckDB running the same SQL with the value DuckDB's own Python binding
gives it (a datetime is a TIMESTAMP: a date column is compared with it as a timestamp at midnight), on a table
where no bound binds and the noise is negligible (epsilon 10^6: P(noise != 0) about 2 exp(-10^6))."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import create_ledger, seeded, write_csv, write_policy
from dpsql.errors import DataError, QueryRejected
from dpsql.session import PrivateSession
from dpsql.sql.parse import TextParameter

PLUS_TWO = datetime.timezone(datetime.timedelta(hours=2))
START = datetime.datetime(2023, 12, 30, 7, 30)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("events")
    stamps = [START + datetime.timedelta(hours=5 * i) for i in range(40)]  # 2023-12-30 .. 2024-01-07
    rows = [(i, stamp.date().isoformat(), stamp.isoformat(sep=" "), f"n{i % 3}") for i, stamp in enumerate(stamps)]
    # A date beyond the timestamp range, which DuckDB fails to compare with a timestamp (a data-dependent error):
    # dpsql compares it as the later date that DuckDB's reference reads in its place.
    far = [(40, "5000000-01-01", "2024-01-01 00:00:00", "n0"), (41, "-3000-01-01", None, "n1")]
    write_csv(folder / "events.csv", ["pid", "day", "seen", "name"], rows + far)
    stand_in = [(40, "200000-01-01", *far[0][2:]), far[1]]
    write_csv(folder / "reference.csv", ["pid", "day", "seen", "name"], rows + stand_in)
    policy = write_policy(folder / "events.toml", {"events": {
        "source": "events.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "day": {"type": "date"}, "seen": {"type": "timestamp"},
                    "name": {"type": "text", "values": ["n0", "n1", "n2"]}}}},
        budget={"epsilon": 1e12, "query_epsilon": 1e6, "delta": 0})
    return create_ledger(policy)


@pytest.fixture(scope="module")
def session(events: Path):
    opened = PrivateSession(events, "tester", rng=seeded(11), bounding_seed=3)
    yield opened
    opened.close()


def duckdb_count(events: Path, condition: str, values: list) -> int:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")  # an aware datetime is a TIMESTAMPTZ: compared in UTC, as dpsql does
    types = "{'day': 'DATE', 'seen': 'TIMESTAMP'}"
    source = f"read_csv('{events.parent / 'reference.csv'}', header = true, types = {types})"
    return con.execute(f"SELECT COUNT(*) FROM {source} WHERE {condition}", values).fetchone()[0]


def dpsql_count(session: PrivateSession, condition: str, values: list) -> int:
    return session.execute(f"SELECT COUNT(*) FROM events WHERE {condition}", values).rows[0][0]


TIMES = [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 1, 10), datetime.datetime(2024, 1, 2, 0, 0, 0, 1),
         datetime.datetime(2024, 1, 1, tzinfo=PLUS_TWO), datetime.datetime(2024, 1, 1, 23, tzinfo=PLUS_TWO),
         datetime.date(2024, 1, 3)]
CONDITIONS = ["day >= ?", "day < ?", "day = ?", "day <> ?", "day <= ?", "day > ?", "day IS DISTINCT FROM ?",
              "seen >= ?", "seen = ?", "seen < ?"]


@pytest.mark.parametrize("condition", CONDITIONS)
@pytest.mark.parametrize("value", TIMES, ids=str)
def test_a_date_or_datetime_compares_as_duckdb_compares_it(events, session, condition: str, value) -> None:
    assert dpsql_count(session, condition, [value]) == duckdb_count(events, condition, [value])


@pytest.mark.parametrize(("condition", "values"), [
    ("day BETWEEN ? AND ?", [datetime.datetime(2023, 12, 31, 12), datetime.datetime(2024, 1, 2)]),
    ("day IN (?, ?)", [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2, 1)]),
    ("day NOT IN (?, ?)", [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2)]),
])
def test_between_and_in_lists_of_datetimes_against_a_date_column(events, session, condition, values) -> None:
    assert dpsql_count(session, condition, values) == duckdb_count(events, condition, values)


@pytest.mark.parametrize("condition", [
    "day >= '2024-01-01T10:00:00'::timestamp", "day < TIMESTAMP '2024-01-02 00:00:00'",  # psycopg2's datetime
    "day >= '2024-01-01T23:00:00+02:00'::timestamptz", "seen < '2024-01-02T10:00:00-05:00'::timestamptz",
    "seen >= '2024-01-01T00:00:00'::timestamptz",  # psycopg2's aware datetime; one without its offset
])
def test_the_literals_psycopg2_writes_compare_as_duckdb_compares_them(events, session, condition: str) -> None:
    assert dpsql_count(session, condition, []) == duckdb_count(events, condition, [])


@pytest.mark.parametrize(("condition", "meaning"), [
    ("day >= '2024-01-01 10:00'", "day >= TIMESTAMP '2024-01-01 10:00'"),
    ("day = '2024-01-02 00:00:00'", "day = DATE '2024-01-02'"), ("day < '2024-01-02'", "day < DATE '2024-01-02'"),
])
def test_a_text_literal_beside_a_date_is_the_date_or_timestamp_it_spells(events, session, condition, meaning) -> None:
    """DuckDB would read '2024-01-01 10:00' as the date 2024-01-01 (the time cut away): it is the timestamp."""
    assert dpsql_count(session, condition, []) == duckdb_count(events, meaning, [])


# What drivers send as untyped text (the JDBC driver's setDate, setTimestamp; pg8000's datetime; the CLI's -p), and
# the value each means: a date with an offset is that date; a timestamp's offset is dropped, as PostgreSQL's date
# and timestamp input drop it (its wall-clock time is kept).
TEXTS = [("2024-01-01 +01", datetime.date(2024, 1, 1)), ("2024-01-01", datetime.date(2024, 1, 1)),
         ("2024-01-01T00:00:00", datetime.date(2024, 1, 1)), ("2024-01-01 00:00:00+01", datetime.date(2024, 1, 1)),
         ("2024-01-01 10:00:00+01", datetime.datetime(2024, 1, 1, 10)),
         ("2024-01-01 10:00:00.5-05:30", datetime.datetime(2024, 1, 1, 10, 0, 0, 500000)),
         ("2024-01-02T07:30Z", datetime.datetime(2024, 1, 2, 7, 30))]


@pytest.mark.parametrize("condition", ["day >= ?", "day = ?", "seen >= ?", "seen = ?"])
@pytest.mark.parametrize(("text", "meaning"), TEXTS, ids=[t for t, _ in TEXTS])
def test_the_texts_drivers_send_mean_the_value_they_spell(events, session, condition, text, meaning) -> None:
    assert dpsql_count(session, condition, [TextParameter(text)]) == duckdb_count(events, condition, [meaning])


@pytest.mark.parametrize(("condition", "value", "problem"), [
    ("seen >= ?", datetime.time(10), "parameter 1: a time of day"),
    ("name = ?", b"n1", "parameter 1: bytes"),
    ("name = ?", bytearray(b"n1"), "parameter 1: bytes"),
    ("day >= ?", TextParameter("10:00:00+01"), "parameter 1 ('10:00:00+01') is compared with the date column 'day'"),
    ("seen >= ?", TextParameter("2024-01-01 10:00:00.1234567"), "is compared with the timestamp column 'seen'"),
    ("day = ?", TextParameter("2024-13-01"), "is compared with the date column 'day'"),
])
def test_a_value_of_no_column_type_is_refused_naming_the_parameter_and_not_charged(session, condition, value,
                                                                                  problem) -> None:
    before = len(session.history())
    with pytest.raises(DataError, match=re.escape(problem)):
        session.execute(f"SELECT COUNT(*) FROM events WHERE {condition}", [value])
    assert len(session.history()) == before


def test_a_named_or_numbered_parameter_is_named_so(session) -> None:
    with pytest.raises(DataError, match=r"parameter :t: a time of day"):
        session.execute("SELECT COUNT(*) FROM events WHERE seen >= :t", {"t": datetime.time(10)})
    with pytest.raises(DataError, match=r"parameter \$2: bytes"):
        session.execute("SELECT COUNT(*) FROM events WHERE name = $1 OR name = $2", ["n1", b"n2"])


def test_a_timestamp_the_checker_cannot_read_still_refuses_to_widen_a_date_column(session) -> None:
    """Only a timestamp written in the query widens a date column: an expression of the data does not."""
    with pytest.raises(QueryRejected, match="mixes date and timestamp"):
        session.execute("SELECT COUNT(*) FROM events WHERE day >= seen")
