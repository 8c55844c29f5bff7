"""Parameters: every value the user gives lands exactly where its placeholder stands in the text, as exactly that
value, or the query is refused before anything runs.

The property tests write each query twice from one generated template: once with placeholders and the values
passed as parameters, once with the values written in as literals. Both must parse to the same tree. Every value
is distinct, so a value bound to the wrong placeholder cannot go unnoticed.
"""

from __future__ import annotations

import decimal
import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsql
from benchmarks.support import seeded
from dpsql.errors import DataError
from dpsql.sql.parse import parse
from tests.sizes import cases

# A slot is one place a parameter may stand: (the literal text, the Python value) for a fresh value each time.
Slot = Callable[[], tuple[str, object]]


class _Values:
    """Distinct values in generation order: numbers count up, texts are numbered."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def number(self) -> tuple[str, object]:
        n = next(self._counter)
        return str(n), n

    def text(self) -> tuple[str, object]:
        n = next(self._counter)
        return f"'t{n}%'", f"t{n}%"

    def escape(self) -> tuple[str, object]:
        n = next(self._counter)
        char = chr(ord("!") + n % 90)
        char = "#" if char in "'\\%_" else char
        return "'" + char + "'", char


def _condition(draw: st.DrawFn, values: _Values, depth: int) -> Iterator[tuple[str, Callable]]:
    """Yields template pieces: plain text, or a slot (a function giving a fresh value)."""
    kind = draw(st.sampled_from(["cmp", "between", "in", "like", "case", "and", "or", "not"] if depth < 3
                                else ["cmp", "between", "in", "like"]))
    column = draw(st.sampled_from(["age", "income", "educ"]))
    if kind == "cmp":
        yield f"{column} {draw(st.sampled_from(['>', '<', '=', '<>', '>=']))} ", values.number
    elif kind == "between":
        yield f"{column} BETWEEN ", values.number
        yield " AND ", values.number
    elif kind == "in":
        for i in range(draw(st.integers(1, 4))):
            yield (f"{column} IN (" if i == 0 else ", "), values.number
        yield ")", None
    elif kind == "like":
        yield "CAST(educ AS VARCHAR) LIKE ", values.text
        if draw(st.booleans()):
            yield " ESCAPE ", values.escape
    elif kind == "case":
        yield "CASE WHEN ", None
        yield from _condition(draw, values, depth + 1)
        yield " THEN ", values.number
        yield " ELSE ", values.number
        yield " END > ", values.number
    elif kind == "not":
        yield "NOT (", None
        yield from _condition(draw, values, depth + 1)
        yield ")", None
    else:
        yield "(", None
        yield from _condition(draw, values, depth + 1)
        yield f" {kind.upper()} ", None
        yield from _condition(draw, values, depth + 1)
        yield ")", None


@st.composite
def _template(draw: st.DrawFn) -> list[tuple[str, Callable | None]]:
    values = _Values()
    pieces: list[tuple[str, Callable | None]] = [("SELECT sex, SUM(CASE WHEN age > ", values.number),
                                                 (" THEN ", values.number), (" ELSE ", values.number),
                                                 (" END), COUNT(*) FROM pums WHERE ", None)]
    pieces += list(_condition(draw, values, 0))
    pieces.append((" GROUP BY sex", None))
    if draw(st.booleans()):
        pieces.append((" HAVING COUNT(*) > ", values.number))
        if draw(st.booleans()):
            pieces.append((" AND SUM(age) < ", values.number))
    if draw(st.booleans()):
        pieces.append((" ORDER BY sex LIMIT ", values.number))
        if draw(st.booleans()):
            pieces.append((" OFFSET ", values.number))
    return pieces


def _render(pieces: list[tuple[str, Callable | None]], style: str) -> tuple[str, str, object]:
    """The query with placeholders, the same query with literals, and the parameters in the given style."""
    with_placeholders, with_literals, values = [], [], []
    for text, slot in pieces:
        with_placeholders.append(text)
        with_literals.append(text)
        if slot is not None:
            literal_text, value = slot()
            values.append(value)
            with_literals.append(literal_text)
            with_placeholders.append({"qmark": "?", "numeric": f"${len(values)}", "named": f":p{len(values)}"}[style])
    parameters: object = values if style != "named" else {f"p{i + 1}": v for i, v in enumerate(values)}
    return "".join(with_placeholders), "".join(with_literals), parameters


@settings(max_examples=cases(300), deadline=None)
@given(template=_template(), style=st.sampled_from(["qmark", "numeric", "named"]))
def test_every_parameter_binds_to_the_placeholder_at_its_place_in_the_text(template, style) -> None:
    sql, expected, parameters = _render(template, style)
    assert parse(sql, parameters).tree == parse(expected).tree, (sql, parameters)


@settings(max_examples=cases(40), deadline=None)
@given(template=_template())
def test_numbered_placeholders_in_any_order_bind_by_number(template) -> None:
    sql, expected, parameters = _render(template, "numeric")
    count = len(parameters)
    # $1 <-> $n, and the parameter list reversed: the same query
    reversed_sql = re.sub(r"\$(\d+)", lambda m: f"${count + 1 - int(m.group(1))}", sql)
    assert parse(reversed_sql, list(reversed(parameters))).tree == parse(expected).tree


def test_the_issue_examples_run_with_the_values_where_they_were_written(pums_session) -> None:
    prepared = pums_session.prepare("SELECT COUNT(*) FROM pums WHERE (age > ? AND income > ?) OR age < ?",
                                    (60, 5, 10))
    assert prepared.plan.query.where.sql() == parse(
        "SELECT 1 FROM pums WHERE (pums.age > 60 AND pums.income > 5) OR pums.age < 10").tree.args["where"].this.sql()
    result = pums_session.execute("SELECT educ, COUNT(*) FROM pums WHERE age > ? GROUP BY educ LIMIT ?", (60, 2))
    assert len(result.rows) == 2
    assert "60" in result.plan.query.where.sql()


@pytest.mark.parametrize("value, expected", [
    (np.int64(42), 42), (np.int8(-3), -3), (np.uint64(2**64 - 1), 2**64 - 1), (np.bool_(True), True),
    (np.float32(0.5), 0.5), (np.float64(-1.25), -1.25), (np.str_("north"), "north"),
    (decimal.Decimal("12.50"), decimal.Decimal("12.50")), (decimal.Decimal("-1E+3"), decimal.Decimal("-1E+3")),
])
def test_numpy_and_decimal_scalars_with_an_exact_value_bind_as_that_value(value, expected) -> None:
    bound = parse("SELECT COUNT(*) FROM t WHERE x = ?", (value,)).tree
    assert bound == parse("SELECT COUNT(*) FROM t WHERE x = ?", (expected,)).tree


@pytest.mark.parametrize("value", [
    decimal.Decimal("sNaN"), decimal.Decimal("NaN"), decimal.Decimal("-Infinity"), np.float64("nan"),
    np.float32("inf"), np.complex128(1 + 2j), np.datetime64("2020-01-01T00:00:00.000000001"), np.void(b"x"),
    float("-inf"),
])
def test_scalars_without_an_exact_finite_value_are_refused_with_a_data_error(value) -> None:
    with pytest.raises(DataError):
        parse("SELECT COUNT(*) FROM t WHERE x = ?", (value,))


def test_a_long_double_that_a_float_would_round_is_refused() -> None:
    value = np.longdouble(1) + np.finfo(np.longdouble).eps
    if np.longdouble(float(value)) == value:  # platforms where long double is a double: nothing to refuse
        assert parse("SELECT ?", (value,)).tree == parse("SELECT ?", (float(value),)).tree
    else:
        with pytest.raises(DataError, match="no exact float value"):
            parse("SELECT ?", (value,))


@pytest.mark.filterwarnings("ignore:pandas only supports SQLAlchemy")  # pandas' note on any other DB-API
def test_pandas_read_sql_with_a_numpy_parameter(pums_policy: Path) -> None:
    con = dpsql.connect(pums_policy, analyst="tester", epsilon=0.5, rng=seeded(3))
    ages = pandas.Series([20, 40, 60])
    frame = pandas.read_sql("SELECT COUNT(*) AS n FROM pums WHERE age > ?", con, params=(ages.max(),))
    assert list(frame.columns) == ["n"] and len(frame) == 1
    con.close()


def test_importing_and_parsing_leave_the_hosts_sqlglot_logging_alone(caplog) -> None:
    import logging

    import sqlglot

    assert logging.getLogger("sqlglot").level == logging.NOTSET  # dpsql is imported: no level was set
    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        with pytest.raises(dpsql.QueryRejected):
            parse("LOAD httpfs")
        assert not caplog.records  # dpsql's own parse: quiet
        sqlglot.parse_one("LOAD httpfs", read="duckdb")  # the host's: its warning still arrives
        assert caplog.records


def test_importing_dpsql_opens_no_duckdb_connection() -> None:
    import subprocess
    import sys

    probe = "import dpsql, dpsql.analysis.vetting as v; print(v.CONSTANTS._opened is None)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
