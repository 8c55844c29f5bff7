"""Date parts as aggregated values (issue 36, analysis/bounds.py): YEAR, MONTH, DAY, QUARTER, DOW, HOUR, ... have
interval rules, from the calendar and, for the year and what follows from it, from a date column's declared range
(`lower`/`upper` in the policy, new), else from the years DuckDB's date functions are guarded to (1 to 9999).

The rules are checked against DuckDB itself: over dates and timestamps that stress the calendar (leap days, year
ends, the first and last dates of the guarded range), every part DuckDB computes lies in the interval the checker
derives; and a declared range narrows the year's interval to its own years.
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from benchmarks.support import open_session, write_hospital
from dpsql.analysis.bounds import interval_of
from dpsql.errors import PolicyError, QueryRejected
from dpsql.policy import ColumnPolicy, ColumnType, load_policy

FUNCTIONS = ["YEAR", "MONTH", "DAY", "DAYOFMONTH", "QUARTER", "DAYOFWEEK", "ISODOW", "DAYOFYEAR", "WEEK",
             "WEEKOFYEAR"]
TIME_FUNCTIONS = ["HOUR", "MINUTE", "SECOND"]
PARTS = ["year", "month", "day", "quarter", "dow", "isodow", "doy", "week", "decade", "century", "millennium", "era",
         "isoyear", "yearweek", "epoch"]
TIME_PARTS = ["hour", "minute", "second", "millisecond", "microsecond"]
DATES = ["0001-01-01", "0001-12-31", "1582-10-15", "1900-02-28", "2000-02-29", "2020-12-31", "2021-01-01",
         "2021-01-03", "2024-12-30", "9999-01-01", "9999-12-31"]
TIMES = ["00:00:00", "23:59:59.999999", "12:30:45.5"]
COLUMNS = {"d": ColumnPolicy("d", ColumnType.DATE), "ts": ColumnPolicy("ts", ColumnType.TIMESTAMP)}


def _values(sql: str) -> list:
    con = duckdb.connect()
    dates = ", ".join(f"(DATE '{d}', TIMESTAMP '{d} {t}')" for d in DATES for t in TIMES)
    return [row[0] for row in con.execute(f"SELECT {sql} FROM (VALUES {dates}) AS v(d, ts)").fetchall()]


@pytest.mark.parametrize("expression", [f"{f}(d)" for f in FUNCTIONS] + [f"{f}(ts)" for f in TIME_FUNCTIONS]
                         + [f"EXTRACT({p} FROM d)" for p in PARTS] + [f"EXTRACT({p} FROM ts)" for p in TIME_PARTS])
def test_every_value_duckdb_computes_lies_in_the_interval_the_checker_derives(expression: str) -> None:
    interval = interval_of(sqlglot.parse_one(expression, read="duckdb"), COLUMNS)
    values = [v for v in _values(expression) if v is not None]
    assert values and all(interval.lo <= v <= interval.hi for v in values), (interval, min(values), max(values))
    assert math.isfinite(interval.lo) and math.isfinite(interval.hi)


def test_a_declared_range_narrows_the_years() -> None:
    bounded = {"d": ColumnPolicy("d", ColumnType.DATE, earliest=datetime.date(2015, 3, 1),
                                 latest=datetime.date(2025, 1, 31))}
    year = interval_of(exp.Year(this=exp.column("d")), bounded)
    assert (year.lo, year.hi) == (2015, 2025)
    decade = interval_of(sqlglot.parse_one("EXTRACT(decade FROM d)", read="duckdb"), bounded)
    assert (decade.lo, decade.hi) == (201, 202)
    # without a range: the guarded years; through an expression: the guarded years too
    assert interval_of(exp.Year(this=exp.column("d")), COLUMNS).hi == 9999
    assert interval_of(sqlglot.parse_one("YEAR(CAST(d AS DATE))", read="duckdb"), bounded).hi == 9999


@pytest.fixture(scope="module")
def hospital(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dates")
    policy = write_hospital(folder)
    text = policy.read_text().replace('visit_date = { type = "date" }',
                                      'visit_date = { type = "date", lower = 2019-01-01, upper = "2025-12-31" }')
    policy.write_text(text)
    return policy


def test_date_parts_are_answered_with_the_sensitivity_of_their_interval(hospital: Path) -> None:
    session = open_session(hospital, 3)
    try:
        prepared = session.prepare("SELECT AVG(YEAR(visit_date)), MEDIAN(MONTH(visit_date)), "
                                   "SUM(EXTRACT(dow FROM visit_date)), AVG(YEAR(lab_date)) FROM visits v JOIN labs l "
                                   "ON l.patient_id = v.patient_id")
        intervals = {call.text: call.interval for call in prepared.plan.query.aggregates}
    finally:
        session.close()
    assert (intervals["AVG(YEAR(visit_date))"].lo, intervals["AVG(YEAR(visit_date))"].hi) == (2019, 2025)
    assert (intervals["MEDIAN(MONTH(visit_date))"].lo, intervals["MEDIAN(MONTH(visit_date))"].hi) == (1, 12)
    assert (intervals["AVG(YEAR(lab_date))"].lo, intervals["AVG(YEAR(lab_date))"].hi) == (1, 9999)  # undeclared


def test_a_time_of_day_of_a_date_is_refused(hospital: Path) -> None:
    session = open_session(hospital, 3)
    try:
        with pytest.raises(QueryRejected, match="a date has no time of day"):
            session.prepare("SELECT AVG(HOUR(visit_date)) FROM visits")
    finally:
        session.close()


@pytest.mark.parametrize(("declared", "message"), [
    ('lower = 2020-01-01, upper = 2019-01-01', "later than upper"),
    ('lower = "yesterday", upper = 2019-01-01', "is not a date"),
    ('lower = 2019-01-01T10:00:00, upper = 2020-01-01', "expected a date"),
    ('lower = 1, upper = 2', "expected a date"),
])
def test_a_broken_date_range_is_refused_naming_the_key(tmp_path: Path, declared: str, message: str) -> None:
    policy = write_hospital(tmp_path)
    policy.write_text(policy.read_text().replace('visit_date = { type = "date" }',
                                                 f'visit_date = {{ type = "date", {declared} }}'))
    with pytest.raises(PolicyError, match=rf"column 'visit_date'.*{message}"):
        load_policy(policy)
