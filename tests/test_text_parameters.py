"""Command-line parameters are text: each takes the type of the column it is compared with, or the query is
refused before anything is charged."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pytest

from benchmarks.support import write_policy
from dpsql.analysis.check import check
from dpsql.errors import DataError
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import load_policy
from dpsql.sql.parse import TextParameter, parse

_COLUMNS = {"person": {"type": "int"}, "age": {"type": "int", "lower": 0, "upper": 100},
            "income": {"type": "float", "lower": 0, "upper": 1e6}, "city": {"type": "text"},
            "smoker": {"type": "bool"}, "born": {"type": "date"}, "seen": {"type": "timestamp"}}


@pytest.fixture
def policy(tmp_path: Path):
    (tmp_path / "people.csv").write_text(",".join(_COLUMNS) + "\n")
    return load_policy(write_policy(tmp_path / "people.toml", {"people": {
        "source": "people.csv", "privacy_unit": "person", "max_rows_per_unit": 1, "columns": _COLUMNS}}))


def _where(sql: str, texts: list[str], policy) -> str:
    checked = check(parse(sql, [TextParameter(t) for t in texts]), policy, VOCABULARY)
    return checked.where.sql("duckdb")


def _typed_where(sql: str, values: list[object], policy) -> str:
    return check(parse(sql, values), policy, VOCABULARY).where.sql("duckdb")


@pytest.mark.parametrize(("condition", "text", "value"), [
    ("age > ?", "40", 40), ("age > ?", " 40 ", 40), ("age > ?", "40.5", decimal.Decimal("40.5")),
    ("income < ?", "0.1", decimal.Decimal("0.1")), ("income < ?", "1e3", decimal.Decimal("1e3")),
    ("city = ?", "007", "007"), ("city = ?", "north", "north"), ("? = city", "42", "42"),
    ("smoker = ?", "true", True), ("smoker = ?", "F", False), ("smoker IS NOT DISTINCT FROM ?", "1", True),
    ("born < ?", "2000-01-31", datetime.date(2000, 1, 31)),
    ("seen >= ?", "2024-05-01 12:30:00", datetime.datetime(2024, 5, 1, 12, 30)),
    ("age BETWEEN 1 AND ?", "9", 9), ("city IN ('a', ?)", "0042", "0042"), ("(age) > ?", "3", 3),
])
def test_a_text_parameter_takes_the_type_of_the_column_it_is_compared_with(policy, condition, text, value) -> None:
    sql = f"SELECT COUNT(*) FROM people WHERE {condition}"
    assert _where(sql, [text], policy) == _typed_where(sql, [value], policy)


@pytest.mark.parametrize(("condition", "text", "kind"), [
    ("age > ?", "abc", "int"), ("age > ?", "nan", "int"), ("income < ?", "inf", "float"),
    ("income < ?", "", "float"), ("smoker = ?", "maybe", "bool"), ("born < ?", "2000-02-30", "date"),
    ("seen >= ?", "yesterday", "timestamp"), ("age IN (1, ?)", "x", "int"), ("age BETWEEN ? AND 5", "1,5", "int"),
])
def test_a_text_parameter_that_does_not_convert_is_refused_naming_the_column(policy, condition, text, kind) -> None:
    with pytest.raises(DataError, match=f"parameter 1 \\('{text}'\\) is compared with the {kind} column"):
        check(parse(f"SELECT COUNT(*) FROM people WHERE {condition}", [TextParameter(text)]), policy, VOCABULARY)


def test_without_a_column_to_compare_with_a_number_is_a_number_and_anything_else_text(policy) -> None:
    sql = "SELECT SUM(CASE WHEN age > 1 THEN ? ELSE 0 END) FROM people WHERE age + ? > 3 LIMIT ?"
    as_text = check(parse(sql, [TextParameter("2"), TextParameter("0.5"), TextParameter("7")]), policy, VOCABULARY)
    typed = check(parse(sql, [2, decimal.Decimal("0.5"), 7]), policy, VOCABULARY)
    assert as_text.where == typed.where and as_text.outer == typed.outer
    assert as_text.aggregates[0].interval == typed.aggregates[0].interval
