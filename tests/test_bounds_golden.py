"""Golden cases for interval arithmetic (tests/fixtures/bounds.txt), in the manner of sqlglot's fixture files.

Each accepted case is checked twice: against the interval derived by hand in the file, and by brute force, by
evaluating the expression in DuckDB over a grid of rows the schema admits (every end point and some inner
values, NULLs included) and asserting each value lies in the interval the code returned.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from benchmarks.support import column, sql_tree
from dpsql.analysis.bounds import Unbounded, interval_of
from dpsql.dp.interval import Interval

FIXTURE = Path(__file__).parent / "fixtures" / "bounds.txt"
SCHEMA = {c.name: c for c in (
    column("a", "float", 0.0, 10.0), column("b", "int", -5.0, 5.0), column("c", "float", 1.0, 4.0),
    column("n", "float", -3.0, -1.0), column("big", "float", 0.0, 1e8), column("f", "bool"),
    column("u", "float"), column("t", "text"))}
# Sample values per column for the brute-force check: both end points, inner values, NULL where it matters.
SAMPLES = {
    "a": (0.0, 0.5, 2.5, 9.99, 10.0, None), "b": (*range(-5, 6), None), "c": (1.0, 1.5, 2.5, 4.0),
    "n": (-3.0, -2.5, -1.5, -1.0), "big": (0.0, 12345.6, 1e8), "f": (True, False, None), "u": (None, -7.5),
    "t": ("x",),
}
SQL_TYPES = {"a": "DOUBLE", "b": "INTEGER", "c": "DOUBLE", "n": "DOUBLE", "big": "DOUBLE", "f": "BOOLEAN",
             "u": "DOUBLE", "t": "VARCHAR"}
_INTERVAL = re.compile(r"\[(?P<lo>[^,\]]+),(?P<hi>[^\]]+)\]")


@dataclass(frozen=True)
class Case:
    line: int
    expression: str
    expected: Interval | None  # None: refused
    refusal: str = ""  # part of the refusal's message


def read_cases(path: Path) -> list[Case]:
    cases = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        expression, expected = (part.strip() for part in text.rsplit(" -> ", 1))
        if expected.startswith("refused:"):
            cases.append(Case(number, expression, None, expected.removeprefix("refused:").strip()))
            continue
        match = _INTERVAL.fullmatch(expected.replace(" ", ""))
        if match is None:
            raise ValueError(f"{path.name}:{number}: expected `[lo, hi]` or `refused: ...`, got {expected!r}")
        cases.append(Case(number, expression, Interval(float(match["lo"]), float(match["hi"]))))
    return cases


CASES = read_cases(FIXTURE)
ACCEPTED = [c for c in CASES if c.expected is not None]
REFUSED = [c for c in CASES if c.expected is None]


def _interval(expression: str) -> Interval:
    return interval_of(sql_tree(expression), SCHEMA)


def test_the_fixture_covers_enough_cases() -> None:
    assert len(CASES) >= 40 and len(REFUSED) >= 10


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.expression)
def test_interval_matches_the_hand_derived_one(case: Case) -> None:
    result = _interval(case.expression)
    assert (result.lo, result.hi) == pytest.approx((case.expected.lo, case.expected.hi), rel=1e-12, abs=1e-12), \
        f"bounds.txt:{case.line}"


@pytest.mark.parametrize("case", REFUSED, ids=lambda c: c.expression)
def test_refusal_says_why(case: Case) -> None:
    with pytest.raises(Unbounded) as refused:
        _interval(case.expression)
    assert case.refusal in str(refused.value), f"bounds.txt:{case.line}"


def _sql_literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value).upper() if isinstance(value, bool) else repr(value)


@pytest.fixture(scope="module")
def grid():
    """Every combination of the sample values (about 10,000 rows) in an in-memory DuckDB table: a cross join of
    one VALUES list per column."""
    con = duckdb.connect()
    lists = [f"(SELECT CAST(v AS {SQL_TYPES[name]}) AS {name} FROM (VALUES "
             + ", ".join(f"({_sql_literal(v)})" for v in SAMPLES[name]) + ") AS s(v))" for name in SQL_TYPES]
    con.execute("CREATE TABLE grid AS SELECT * FROM " + " CROSS JOIN ".join(lists))
    expected = math.prod(len(SAMPLES[name]) for name in SQL_TYPES)
    assert con.execute("SELECT count(*) FROM grid").fetchone()[0] == expected
    yield con
    con.close()


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.expression)
def test_every_sampled_value_lies_in_the_interval(grid, case: Case) -> None:
    result = _interval(case.expression)
    low, high, values = grid.execute(
        f"SELECT min(v), max(v), count(v) FROM (SELECT CAST(({case.expression}) AS DOUBLE) AS v FROM grid)").fetchone()
    assert values > 0, "the grid gives the expression no value to check"
    slack = 1e-12 * max(1.0, abs(result.lo), abs(result.hi))  # the intervals are computed in floats
    assert result.lo - slack <= low and high <= result.hi + slack, (low, high, result)
