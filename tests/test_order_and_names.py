"""Post-processing over the released rows: ORDER BY expressions of group keys, aliases and aggregates, and the
names of the output columns.

ORDER BY accepts what HAVING accepts (functions of group keys and aggregates) and runs only in the post-processor,
over the noisy cells: the order is checked on the released rows themselves, so the noise cannot fail a test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

from dpsql.analysis.check import check
from dpsql.errors import ProgrammingError
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import load_policy
from dpsql.sql import names
from dpsql.sql.parse import parse

ORDERED: list[tuple[str, Callable[[tuple], tuple]]] = [
    ("SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ ORDER BY educ % 3, educ", lambda r: (r[0] % 3, r[0])),
    ("SELECT COUNT(*) AS n, educ FROM pums GROUP BY educ ORDER BY n * -1, educ", lambda r: (-r[0], r[1])),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ ORDER BY CASE WHEN educ > 8 THEN 0 ELSE 1 END, educ DESC",
     lambda r: (0 if r[0] > 8 else 1, -r[0])),
    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ ORDER BY CAST(educ AS VARCHAR)", lambda r: (str(r[0]),)),
    # gender is an alias of the key sex; (g * -1) DESC is g ascending. educ is the column (no output is named so).
    ("SELECT sex AS gender, educ AS sex, COUNT(*) AS n FROM pums GROUP BY sex, educ "
     "ORDER BY (CAST(gender AS INTEGER) * -1) DESC, educ", lambda r: (r[0], r[1])),
    # DuckDB's rule when an output alias is also a column name: a bare name is the alias, a name inside an
    # expression is the column. Here `sex + 0` is the column sex (the output named educ), `sex` the output sex.
    ("SELECT educ AS sex, sex AS educ, COUNT(*) FROM pums GROUP BY educ, sex ORDER BY sex + 0 DESC, sex",
     lambda r: (-r[1], r[0])),
    ("SELECT educ, AVG(age) AS a, COUNT(*) AS n FROM pums GROUP BY educ ORDER BY -a, n", lambda r: (-r[1], r[2])),
]


@pytest.mark.parametrize(("sql", "key"), ORDERED)
def test_order_by_an_expression_of_keys_aliases_and_aggregates(pums_session, sql, key) -> None:
    rows = pums_session.execute(sql).rows
    assert len(rows) > 2 and rows == sorted(rows, key=key)


def test_order_by_is_evaluated_only_over_the_released_rows(pums_session) -> None:
    """The private query is the same with or without ORDER BY; ORDER BY reads only the noisy table's columns."""
    select = "SELECT sex AS gender, educ, COUNT(*) AS n FROM pums GROUP BY sex, educ"
    ordered = pums_session.prepare(f"{select} ORDER BY (CAST(gender AS INTEGER) * -1) DESC, educ % 3, n * -1")
    assert ordered.bounded.sql == pums_session.prepare(select).bounded.sql
    outer = ordered.plan.query.outer
    assert outer.args.get("order") is not None
    assert {table.name for table in outer.find_all(exp.Table)} == {names.NOISY_TABLE}
    outputs = {names.output(i) for i in range(len(outer.expressions))}
    assert all(names.key_index(c) is not None or names.aggregate_index(c) is not None or c.name in outputs
               for c in outer.find_all(exp.Column))


def _names(policy: Path, select_list: str) -> list[str]:
    checked = check(parse(f"SELECT {select_list} FROM pums GROUP BY educ"), load_policy(policy), VOCABULARY)
    return list(checked.output_names)


def test_unaliased_outputs_are_named_as_duckdb_names_them(pums_policy: Path) -> None:
    """Each function under the name the analyst typed, in lower case: not sqlglot's synonym (VAR_SAMP is
    VARIANCE to it). The expected names are DuckDB's own for the same SELECT list."""
    written = ("VAR_SAMP(age), VARIANCE(age), STDDEV(age), stddev_samp(age), Var_Pop(age), Sum(age), avg(income), "
               "STDDEV_POP(income)")
    expected = duckdb.sql(f"SELECT {written} FROM (SELECT 1 AS age, 2 AS income)").columns
    assert _names(pums_policy, written) == expected


def test_output_names_keep_literals_and_disambiguate_duplicates(pums_policy: Path) -> None:
    names = _names(pums_policy, "COUNT(*), count(*), VAR(age), variance(age), VARIANCE(age), avg(age) + 1, "
                                "COUNT(CASE WHEN CAST(sex AS TEXT) = 'A' THEN 1 END), SUM(age) AS n, educ")
    assert names == ["count(*)", "count(*)_2", "var(age)", "variance(age)", "variance(age)_2", "avg(age) + 1",
                     "count(CASE WHEN CAST(sex AS TEXT) = 'A' THEN 1 END)", "n", "educ"]


@pytest.mark.parametrize(("sql", "same_as"), [
    ("SELECT TOP 5 educ, COUNT(*) AS n FROM pums GROUP BY educ ORDER BY n DESC",
     "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ ORDER BY n DESC LIMIT 5"),
    ("select top 2 AVG(age) from pums", "SELECT AVG(age) FROM pums LIMIT 2"),
    ("SELECT top FROM t", "SELECT top FROM t"),  # a column named top is still a column
])
def test_select_top_is_a_limit(sql: str, same_as: str) -> None:
    assert parse(sql).tree == parse(same_as).tree


def test_top_beside_limit_is_refused_as_unparseable() -> None:
    with pytest.raises(ProgrammingError, match="cannot parse"):
        parse("SELECT TOP 2 AVG(age) FROM pums LIMIT 3")
