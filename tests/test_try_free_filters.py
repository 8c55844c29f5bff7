"""Row filters the rewrite leaves outside TRY (analysis/vetting.may_fail with the table's columns): comparisons of
numeric columns with each other and with integer literals or literals cast to DOUBLE. TRY is the second layer
behind the type check, and it cost a fifth of a filtered query's time; what goes without it must not be able to
fail on any row. Checked by running every such comparison the rule admits on the values most likely to break
one (the integer extremes, infinities, zeros of both signs, NULL), and by the forms it must keep in TRY."""

from __future__ import annotations

import itertools

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from dpsql.analysis.vetting import may_fail
from dpsql.policy import ColumnPolicy, ColumnType
from dpsql.sql.parse import DIALECT

COLUMNS = {"i": ColumnPolicy("i", ColumnType.INT), "f": ColumnPolicy("f", ColumnType.FLOAT),
           "s": ColumnPolicy("s", ColumnType.TEXT), "d": ColumnPolicy("d", ColumnType.DATE)}
CONSTANTS = ["0", "9223372036854775807", "CAST(500 AS DOUBLE)", "CAST(1e308 AS DOUBLE)", "-5",
             "CAST(0.1234567890123456789012345678901234567 AS DOUBLE)",
             "CAST(123456789012345678901234567890 AS DOUBLE)"]
OPERATORS = ["=", "<>", ">", ">=", "<", "<="]
TRY_FREE = [f"{column} {op} {constant}" for column, op, constant in itertools.product("if", OPERATORS, CONSTANTS)]
TRY_FREE += ["i > f", "f = i", "NOT (i > 3 AND f < CAST(2 AS DOUBLE)) OR i <> -1"]
# A DECIMAL literal makes DuckDB cast a BIGINT column to a DECIMAL that overflows on large values; text, dates,
# functions and arithmetic are not covered by the rule.
KEEP_TRY = ["i > 0.1234567890123456789012345678901234567", "i > 1.5", "s > 'a'", "i + 1 > 3", "abs(f) > 1",
            "d > CAST('2020-01-01' AS DATE)", "i > 99999999999999999999", "i > CAST('5' AS DOUBLE)", "3 > 2",
            "i IS NULL", "i IN (1, 2)", "i > " + "9" * 5000]
ROWS = [(-(2 ** 63), float("-inf")), (2 ** 63 - 1, float("inf")), (0, -0.0), (0, 0.0), (None, None), (7, 1e308)]


def _condition(text: str) -> exp.Expression:
    return sqlglot.parse_one(text, read=DIALECT)


@pytest.mark.parametrize("text", TRY_FREE)
def test_the_rule_admits_comparisons_that_cannot_fail_on_any_row(text: str) -> None:
    assert not may_fail(_condition(text), COLUMNS)
    assert may_fail(_condition(text))  # without the columns, TRY as before
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i BIGINT, f DOUBLE, s VARCHAR, d DATE)")
    con.executemany("INSERT INTO t VALUES (?, ?, 'x', DATE '2020-01-01')", ROWS)
    con.execute(f"SELECT count(*) FROM t WHERE {_condition(text).sql(DIALECT)}").fetchall()


@pytest.mark.parametrize("text", KEEP_TRY)
def test_anything_else_keeps_its_try(text: str) -> None:
    assert may_fail(_condition(text), COLUMNS)


def test_a_decimal_literal_beside_an_integer_column_does_fail_on_some_rows() -> None:
    """Why KEEP_TRY has the first entry: the error would depend on the rows."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1000 AS i")
    with pytest.raises(duckdb.Error):
        con.execute("SELECT count(*) FROM t WHERE i > 0.1234567890123456789012345678901234567").fetchall()
