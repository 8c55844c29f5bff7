"""The Spark translation of the bounded SQL (engines/spark_sql.py), read without Spark: what it writes must mean what
DuckDB's SQL means. tests/test_spark_engine.py (slow: a JVM) runs the same shapes on both engines and compares."""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from dpsql.engines.spark_sql import SPARK, to_spark

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
