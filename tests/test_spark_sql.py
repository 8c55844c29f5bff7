"""The Spark translation of the bounded SQL (engines/spark_sql.py), read without Spark: what it writes must mean what
DuckDB's SQL means. tests/test_spark_engine.py (slow: a JVM) runs the same shapes on both engines and compares."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from dpsql.engines.spark_sql import SPARK, to_spark
from dpsql.errors import QueryRejected

SCHEMA = {"t": {"a": "BIGINT", "d": "VARCHAR", "c": "DOUBLE"}}


def _where(sql: str) -> exp.Expression:
    return sqlglot.parse_one(to_spark(sql, SCHEMA), read=SPARK).args["where"].this


def test_a_try_keeps_the_parentheses_around_its_argument() -> None:
    """`a AND TRY(b OR c)`: sqlglot writes a tree as it is, so TRY must leave a Paren, not `a AND b OR c`."""
    where = _where("SELECT COUNT(*) FROM t WHERE a > 0 AND TRY(d = 'x' OR d = 'y')")
    assert isinstance(where, exp.And) and isinstance(where.expression.unnest(), exp.Or)
    where = _where("SELECT COUNT(*) FROM t WHERE TRY(c IS NULL) AND TRY(d = 'x' OR ABS(a - 50) < 9)")
    assert isinstance(where, exp.And) and isinstance(where.expression.unnest(), exp.Or)


def test_a_double_divided_by_zero_is_not_left_to_spark() -> None:
    """Spark's x / 0 and x % 0 are NULL; DuckDB's are +-inf and NaN: the zero divisor is decided before Spark's
    operation (tests/test_spark_engine.py and the parity test evaluate it)."""
    for operator in ("/", "%"):
        where = _where(f"SELECT COUNT(*) FROM t WHERE TRY(CAST(a AS DOUBLE) {operator} c > 5)")
        case = where.unnest().this
        assert isinstance(case, exp.Case), where.sql(SPARK)
        assert case.args["ifs"][0].this.find(exp.EQ).expression == exp.Literal.number(0)
        assert "NaN" in case.sql(SPARK)


def test_integer_arithmetic_beyond_decimal_38_is_refused() -> None:
    """HUGEINT holds about 1.7e38, DECIMAL(38, 0) less than 1e38: what may reach between the two is refused, from
    the operands' ranges (a product of two BIGINTs, at most 2**126 or 8.5e37, is not)."""
    wide = "CAST(a AS INT128) * CAST(a AS INT128)"
    assert "DECIMAL(38, 0)" in to_spark(f"SELECT COUNT(*) FROM t WHERE TRY({wide} + 5 > 0)", SCHEMA)
    for sql in [f"SELECT COUNT(*) FROM t WHERE TRY({wide} + CAST(a AS INT128) * 2000000000000000000 > 0)",
                f"SELECT COUNT(*) FROM t WHERE TRY(ABS({wide} - CAST(a AS INT128) * 2000000000000000000) > 0)",
                f"SELECT SUM(x) FROM (SELECT {wide} AS x FROM t) AS s",  # a sum of 2**63 such rows
                "SELECT COUNT(*) FROM t WHERE TRY_CAST(c AS INT128) > 0"]:
        with pytest.raises(QueryRejected, match="not supported on the Spark engine: .*(1e38|HUGEINT)"):
            to_spark(sql, SCHEMA)
    clamped = "GREATEST(LEAST(CAST(a AS BIGINT), 800000004), -800000004)"
    assert to_spark(f"SELECT SUM(x) + CAST(655360001 AS INT128) * COUNT(x) FROM (SELECT {clamped} AS x FROM t) "
                    "AS s", SCHEMA)


@pytest.mark.parametrize(("duckdb", "spark"), [
    ("SELECT DAYOFWEEK(dt) AS k, COUNT(*) FROM u GROUP BY k", "CAST((DAYOFWEEK(u.dt) - 1) AS BIGINT)"),  # Sunday 0
    ("SELECT EXTRACT(ISODOW FROM dt) FROM u", "CAST((WEEKDAY(u.dt) + 1) AS BIGINT)"),  # Monday 1 ... Sunday 7
    ("SELECT EXTRACT(WEEK FROM dt) FROM u", "CAST((WEEKOFYEAR(u.dt)) AS BIGINT)"),  # ISO weeks, DuckDB's BIGINT
    ("SELECT EXTRACT(YEARWEEK FROM dt) FROM u", "EXTRACT(YEAROFWEEK FROM u.dt) * 100 + WEEKOFYEAR(u.dt)"),
    ("SELECT EXTRACT(CENTURY FROM dt) FROM u", "CAST((FLOOR((YEAR(u.dt) - 1) / 100) + 1) AS BIGINT)"),
    ("SELECT DATE_TRUNC('WEEK', dt) FROM u", "CAST(TRUNC(u.dt, 'WEEK') AS TIMESTAMP_NTZ)"),  # no time zone
    ("SELECT DATE_TRUNC('DAY', dt) = CAST(dt AS TIMESTAMP) FROM u", "CAST(u.dt AS TIMESTAMP_NTZ)"),
    ("SELECT GROUPING(d, a), COUNT(*) FROM u GROUP BY ROLLUP (d, a)", "(GROUPING(u.a) * 1 + GROUPING(u.d) * 2)"),
    ("SELECT SUM(a) / NULLIF(COUNT(a), 0) FROM u", "CASE WHEN COUNT(u.a) = 0 THEN NULL ELSE COUNT(u.a) END"),
    ("SELECT SUM(DISTINCT a) FROM u", "SUM(DISTINCT CAST(u.a AS DECIMAL(38, 0)))"),
    ("SELECT SIGN(x) FROM u", "WHEN ISNAN(u.x) THEN 0"),  # DuckDB's sign of NaN is 0, Spark's signum NaN
    ("SELECT ROUND(x) FROM u", "CASE WHEN ROUND(u.x) = 0 THEN u.x * CAST('0.0' AS DOUBLE) ELSE ROUND(u.x) END"),
    ("SELECT SQRT(x) FROM u", "SQRT(u.x)"),
    ("SELECT d NOT LIKE 'n%' FROM u", "u.d NOT LIKE 'n%'"),  # sqlglot's Like(negate=True): the NOT is kept
    ("SELECT d NOT LIKE 'a!%' ESCAPE '!' FROM u", r"u.d NOT LIKE 'a\\%'"),
])
def test_functions_spark_writes_otherwise_are_translated(duckdb: str, spark: str) -> None:
    translated = to_spark(duckdb, {"u": {"a": "BIGINT", "d": "VARCHAR", "dt": "DATE", "x": "DOUBLE"}})
    assert spark in translated, translated
    sqlglot.parse_one(translated, read=SPARK)  # and it is Spark SQL


@pytest.mark.parametrize(("sql", "what"), [
    ("SELECT EXTRACT(JULIAN FROM dt) FROM u", "the date part julian"),
    ("SELECT DATE_TRUNC('DECADE', dt) FROM u", "date_trunc to a decade"),  # its start can be the year 0
    ("SELECT CAST('2024-01-01 10:00' AS TIMESTAMP) FROM u", "the text"),
])
def test_date_parts_not_translated_are_refused(sql: str, what: str) -> None:
    with pytest.raises(QueryRejected, match=what):
        to_spark(sql, {"u": {"dt": "DATE"}})


@pytest.mark.parametrize(("pattern", "linear"), [
    ("'%a%a%a%a%b'", False), ("'%a%b'", False), ("'%a_b%'", False), ("'%\\%'", False),
    ("'%!%!_%' ESCAPE '!'", False),  # two runs of %: Java's backtracking regular expressions in Spark
    ("'%o%'", True), ("'%%'", True), ("'a%b'", True), ("'_%_'", True), ("'%b'", True),  # contains, one run
])
def test_a_like_spark_would_match_by_backtracking_is_refused(pattern: str, linear: bool) -> None:
    """A LIKE with % in two or more places is a regular expression with two or more `.*` in Spark: its time grows
    as a power of the text's length (a second a row for '%a%a%a%a%b' on 100 characters), where DuckDB's LIKE is
    linear and the checker's person-work bound admits it. Only what Spark's optimizer makes `contains` runs."""
    sql = f"SELECT COUNT(*) FROM t WHERE d LIKE {pattern}"
    if linear:
        assert "LIKE" in to_spark(sql, SCHEMA)
    else:
        with pytest.raises(QueryRejected, match="backtracking"):
            to_spark(sql, SCHEMA)


def test_round_to_decimal_places_of_a_double_is_refused() -> None:
    with pytest.raises(QueryRejected, match="round\\(\\) of a double to 2 decimal places"):
        to_spark("SELECT ROUND(c, 2) FROM t", SCHEMA)
