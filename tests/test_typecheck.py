"""The type checker's signatures are total: evaluated by DuckDB over a grid of adversarial values, no error.

Each template below is typed by dpsql/analysis/typecheck.py over a table with two columns of each kind; an accepted
one is run in its total form, without TRY, over every combination of adversarial values of the columns it reads (NULL,
NaN, +/-inf, the extreme integers, empty, long and non-numeric text, infinite and extreme dates). An error fails
the test: the signature is not total. Every type rule of the checker must be exercised here, so a rule added
without a grid entry fails too. The raw forms of some templates do fail on the same grid, which shows the grid
can find what the rewrite prevents.
"""

from __future__ import annotations

import random
from typing import ClassVar

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from dpsql.analysis.typecheck import _RULES, EXTRACT_PARTS, MAX_ROW_COST, TRUNC_PARTS, Kind, typed_expression
from dpsql.analysis.vetting import ConstantChecker
from dpsql.errors import QueryRejected
from dpsql.policy import DEFAULT_MAX_LENGTH, ColumnPolicy, ColumnType

INTS = ["NULL", "0", "1", "-1", "2", "7", "1000", str(2**31 - 1), str(-(2**31)), str(2**63 - 1), str(-(2**63))]
DOUBLES = ["NULL", "0.0", "-0.0", "1.5", "-2.5", "1e308", "-1e308", "5e-324", "'inf'", "'-inf'", "'nan'",
           "9.3e18", "-9.3e18"]
TEXTS = ["NULL", "''", "'a'", "'%'", "'_'", "'\\'", "'ü'", "'🙂'", "'NULL'", "'2020-01-01'", "'nan'", "'1e309'",
         "' x '", "'true'", "'-9223372036854775809'", f"repeat('ab%', {DEFAULT_MAX_LENGTH // 3})"]
BOOLS = ["NULL", "true", "false"]
DATES = ["NULL", "'infinity'", "'-infinity'", "'5877642-06-25 (BC)'", "'5881580-07-10'", "'0001-01-01'",
         "'9999-12-31'", "'2020-02-29'", "'1970-01-01'", "'1582-10-10'"]
TIMESTAMPS = ["NULL", "'infinity'", "'-infinity'", "'290309-12-22 (BC) 00:00:00'", "'294247-01-10 04:00:54.775806'",
              "'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'", "'2020-02-29 12:34:56.789'",
              "'1970-01-01 00:00:00'"]
GRID = {  # column: (policy type, DuckDB type, values)
    "i": ("int", "BIGINT", INTS), "j": ("int", "BIGINT", INTS),
    "f": ("float", "DOUBLE", DOUBLES), "g": ("float", "DOUBLE", DOUBLES),
    "t": ("text", "VARCHAR", TEXTS), "u": ("text", "VARCHAR", TEXTS),
    "b": ("bool", "BOOLEAN", BOOLS), "c": ("bool", "BOOLEAN", BOOLS),
    "d": ("date", "DATE", DATES), "e": ("date", "DATE", DATES),
    "s": ("timestamp", "TIMESTAMP", TIMESTAMPS), "r": ("timestamp", "TIMESTAMP", TIMESTAMPS),
}
COLUMNS = {name: ColumnPolicy(name, ColumnType(kind), max_length=DEFAULT_MAX_LENGTH if kind == "text" else 0)
           for name, (kind, _, _) in GRID.items()}

COMPARED = [("i", "j"), ("f", "g"), ("i", "f"), ("t", "u"), ("b", "c"), ("d", "e"), ("s", "r"), ("i", "b"),
            ("f", "b"), ("i", "0.5"), ("f", "0.5"), ("d", "'2020-01-01'"), ("s", "'2020-01-01 10:00:00'"),
            ("i", "'5'"), ("f", "'inf'"), ("b", "'true'"), ("i", "NULL"), ("t", "'a'")]
CAST_TARGETS = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "UBIGINT", "DOUBLE", "FLOAT",
                "DECIMAL(10, 2)", "VARCHAR", "BOOLEAN", "DATE", "TIMESTAMP"]
ACCEPTED = [
    "b AND c", "b OR c", "NOT b", "b AND NULL",
    *(f"{x} {op} {y}" for x, y in COMPARED for op in ("=", "<>", "<", "<=", ">", ">=", "IS DISTINCT FROM",
                                                       "IS NOT DISTINCT FROM")),
    "s > DATE '2020-01-01'", "s BETWEEN DATE '2020-01-01' AND r", "coalesce(s, DATE '1970-01-01')",
    "i BETWEEN j AND 5", "t BETWEEN 'a' AND u", "d BETWEEN '2020-01-01' AND e", "f BETWEEN i AND 0.5",
    "i IN (1, 2, j)", "t IN ('a', u)", "d IN ('2020-01-01', '1970-01-01')", "f IN (1.5, 2.5)", "i IN (1, NULL)",
    "i IS NULL", "b IS TRUE", "NOT b IS FALSE", "t IS NOT NULL",
    "t LIKE 'a%'", "t LIKE '%\\%%' ESCAPE '\\'", "t ILIKE '_ü%'", "t NOT LIKE '%a_b%'", "i LIKE '1%'",
    "t LIKE 'a\\_' ESCAPE '\\'", "t LIKE 'x\\y' ESCAPE '\\'", "t LIKE '\\\\' ESCAPE '\\'", "t LIKE 'a\\'",
    "t NOT ILIKE '%\\%%' ESCAPE '%'", "d LIKE '2020%'",
    "i + j", "i - j", "i * j", "i + 1", "-i", "-(i - j)", "i / j", "i // 3", "i % 3", "i // -2", "i % -7",
    "i * 2 + j", "(i + j) * 2", "f + g", "f - g", "f * g", "f / g", "f // 3", "f % 3", "f % 0.5", "i + f",
    "i * 0.5", "0.5 * f", "f ^ g", "i ^ j", "i / 0", "abs(i)", "abs(f)", "abs(i - j)", "abs(-i)", "sign(f)",
    "sign(i) * 100 + sign(f)", "round(f)", "round(f, 2)", "round(i, -2)", "round(i)", "round(f, -400)",
    "round(i, 400)", "floor(f)", "ceil(i)", "floor(0.5 * i)", "ceil(f) + i", "sqrt(f)", "sqrt(i)", "ln(f)",
    "ln(i)", "exp(f)", "exp(i)",
    "lower(t)", "upper(t)", "length(t)", "substring(t, 2, 3)", "substring(t, -2147483648, 2147483647)",
    "substring(t, 0)", "left(t, i)", "right(t, i)", "right(t, -i)", "left(t, i * j)",
    "left(t, CAST(floor(f) AS BIGINT))",
    "trim(t)", "trim(BOTH 'a%' FROM t)", "ltrim(t)", "rtrim(t)",
    "concat(t, i, u)", "concat(f, b, d)", "concat(s, t)", "t || u", "replace(t, 'a', 'xyz')", "replace(t, u, 'xy')",
    "starts_with(t, u)", "strpos(t, u)", "lower(i)", "length(upper(t))",
    "year(d)", "month(s)", "day(d)", "dayofweek(s)", "dayofyear(d)", "quarter(s)", "week(d)", "week(s)",
    "dayofmonth(d)", "isodow(s)", "weekofyear(d)", "weekofyear(s)", "hour(s)", "minute(s)", "second(s)",
    *(f"extract({part} FROM {column})" for kind, column in ((Kind.DATE, "d"), (Kind.TIMESTAMP, "s"))
      for part in sorted(EXTRACT_PARTS[kind][0] | EXTRACT_PARTS[kind][1])),
    *(f"date_trunc('{part}', {column})" for kind, column in ((Kind.DATE, "d"), (Kind.TIMESTAMP, "s"))
      for part in sorted(TRUNC_PARTS[kind])),
    "CASE WHEN b THEN i ELSE j END", "CASE WHEN b THEN i ELSE 0.5 END", "CASE WHEN b THEN t END",
    "CASE WHEN b THEN d WHEN c THEN '2020-01-01' END", "CASE i WHEN 1 THEN 'a' WHEN j THEN u ELSE t END",
    "CASE d WHEN '2020-02-29' THEN 1 END", "CASE i + j WHEN 0.5 THEN f END", "CASE WHEN i > 0 THEN ln(i) END",
    "IF(b, f, i)",
    "IF(c, 1, 0) + 2147483647", "coalesce(i, j, 0)", "coalesce(t, 'x')", "least(i, f)",
    "greatest(d, '2020-01-01')", "nullif(i, 0)", "nullif(t, '')", "coalesce(b, c)",
    *(f"CAST({column} AS {target})" for column in ("i", "f", "t", "b", "d", "s") for target in CAST_TARGETS),
    *(f"TRY_CAST({column} AS {target})" for column in ("t", "f") for target in CAST_TARGETS),
    "CAST(i AS INTEGER) + 1", "CAST(b AS TINYINT) * 200", "CAST(i AS UTINYINT) - 1", "CAST(b AS TINYINT) + 100 + 100",
    "(CAST(b AS TINYINT) + 100) * 2", "CAST(i AS UTINYINT) // -2", "CAST(i AS UTINYINT) % 10 + 1",
    "CAST(i AS UBIGINT) = j", "CAST(i AS UTINYINT) < CAST(j AS TINYINT)", "CAST(i AS UBIGINT) + j",
    "CAST(i AS UHUGEINT) * 0", "sign(i) * 127 + sign(f)", "CASE WHEN b THEN 100 ELSE 27 END + 100",
    "CAST(i AS SMALLINT) * 1000", "-CAST(i AS TINYINT)", "abs(CAST(i AS TINYINT))",
    # A date column beside a timestamp written in the query: widened as DuckDB widens it, the far dates clamped.
    "d > TIMESTAMP '2020-01-01 10:00:00'",
    "d BETWEEN TIMESTAMP '0001-01-01' AND TIMESTAMP '9999-12-31 23:59:59.999999'",
    "d IN (TIMESTAMP '2020-01-01 10:00', TIMESTAMP '2020-01-02')", "d >= '2020-01-01 10:00'",
]
REFUSED = [
    "i * j * 3", "i // j", "i % j", "i // 0", "i % -1", "f // g", "t + 1", "d + 1", "d - e", "b + 1",
    "i IN (1, 'x')", "i IN (1, 0.5)", "replace(t, 'a', u)", "t NOT ILIKE '%\\%' ESCAPE '%'",
    "t = 1", "t < i", "d = s", "i = d", "b AND t", "NOT i", "b OR 1",
    "t LIKE u", "t LIKE 'a\\' ESCAPE '\\'", "t LIKE '\\' ESCAPE '\\'", "t LIKE 'ab' ESCAPE 'ü'",
    "substring(t, i, 1)", "substring(t, 1, j)", "round(f, i)", "extract(timezone FROM d)",
    "extract(timezone_hour FROM s)", "date_trunc('era', d)", "date_trunc('timezone', s)", "date_trunc('hour', d)",
    "CASE WHEN t THEN 1 END", "CASE t WHEN 1 THEN 1 END", "CASE WHEN b THEN 1 ELSE t END", "coalesce(i, t)",
    "least(d, s)",
    "length(i)", "year(t)", "sqrt(t)", "abs(t)", "t || i", "trim(t, u)", "starts_with(t, i)",
    "d + INTERVAL 1 DAY", "i * i * i", "left(t, floor(f))",
]


def _typed(template: str):
    return typed_expression(sqlglot.parse_one(template, read="duckdb"), COLUMNS, "grid")


def _evaluate(con: duckdb.DuckDBPyConnection, node: exp.Expression) -> None:
    """Evaluate `node` on every combination of the grid values of the columns it reads."""
    used = sorted({c.name for c in node.find_all(exp.Column)})
    sources = [f"(SELECT CAST(v AS {GRID[n][1]}) AS {n} FROM (VALUES {', '.join(f'({v})' for v in GRID[n][2])}) "
               f"AS _{n}(v))" for n in used] or ["(SELECT 1)"]
    grid = " CROSS JOIN ".join(sources)
    con.execute(f"SELECT count(v), min(hash(v)) FROM (SELECT {node.sql('duckdb')} AS v FROM {grid})").fetchall()


@pytest.fixture(scope="module")
def con():
    connection = duckdb.connect(":memory:")
    yield connection
    connection.close()


@pytest.mark.parametrize("template", ACCEPTED)
def test_an_accepted_signature_is_total_over_adversarial_values(con, template: str) -> None:
    typed = _typed(template)
    _evaluate(con, typed.node)


@pytest.mark.parametrize("template", REFUSED)
def test_an_operation_without_a_total_form_is_refused(template: str) -> None:
    with pytest.raises(QueryRejected):
        _typed(template)


@pytest.mark.parametrize("template", ["i + j", "i * j", "abs(i)", "i // -1", "i % 0", "CAST(t AS BIGINT)",
                                      "CAST(f AS INTEGER)", "CAST(d AS TIMESTAMP)", "extract(week FROM d)",
                                      "date_trunc('month', d)", "date_trunc('month', s)", "week(d)",
                                      "substring(t, i, 1)", "d = s", "i IN (1, 'x')",
                                      "t LIKE 'a\\' ESCAPE '\\'", "extract(timezone FROM d)",
                                      "date_trunc('era', d)", "round(i, -1)"])
def test_the_grid_finds_the_errors_of_the_raw_forms(con, template: str) -> None:
    """Without the checker's rewrite (or refusal) the same grid makes DuckDB fail: the grid has teeth. DuckDB 2.0.1
    made week() total on the grid's dates; the checker keeps its guarded form for 2.0.0 (pyproject allows both)."""
    raw = sqlglot.parse_one(template, read="duckdb")
    if template in _TOTAL_SINCE and _duckdb_version() >= _TOTAL_SINCE[template]:
        _evaluate(con, raw)  # no failure left to find: the grid shows it, rather than expecting one
        return
    with pytest.raises(duckdb.Error):
        _evaluate(con, raw)


_TOTAL_SINCE = {"extract(week FROM d)": (2, 0, 1), "week(d)": (2, 0, 1)}


def _duckdb_version() -> tuple[int, ...]:
    return tuple(int(part) for part in duckdb.__version__.split(".")[:3] if part.isdigit())


def test_every_type_rule_is_exercised_by_the_grid() -> None:
    seen: set[type] = set()
    for template in ACCEPTED:
        seen |= {type(node) for node in sqlglot.parse_one(template, read="duckdb").walk()}
    missing = sorted(cls.__name__ for cls in _RULES if cls not in seen)
    assert not missing, f"type rules without a grid entry: {missing}"


def test_a_text_literal_beside_a_typed_value_becomes_an_explicit_cast() -> None:
    assert _typed("d > '2020-01-01'").node.sql("duckdb") == "d > CAST('2020-01-01' AS DATE)"
    assert _typed("i = '5'").node.sql("duckdb") == "i = CAST('5' AS BIGINT)"


def test_a_cast_that_can_fail_on_a_row_becomes_try_cast_but_a_constant_one_stays_checked() -> None:
    assert _typed("CAST(t AS BIGINT)").node.sql("duckdb") == "TRY_CAST(t AS BIGINT)"
    assert _typed("CAST(i AS DOUBLE)").node.sql("duckdb") == "CAST(i AS DOUBLE)"
    assert _typed("d > DATE '2020-01-01'").node.sql("duckdb") == "d > CAST('2020-01-01' AS DATE)"


@pytest.mark.parametrize("template", ["week(d)", "extract(week FROM s)", "date_trunc('month', d)",
                                      "date_trunc('year', s)", "left(t, i)", "right(t, -i)"])
def test_a_guarded_call_is_total_even_outside_its_guard(con, template: str) -> None:
    """A guard is a CASE; should an optimizer evaluate the call outside it, the call must still not fail."""
    guarded = _typed(template).node
    for case in list(guarded.find_all(exp.Case)):
        case.replace(case.args["ifs"][0].args["true"])
    _evaluate(con, guarded)


def test_integer_arithmetic_is_widened_only_where_it_could_overflow() -> None:
    assert _typed("i % 10 + 1").node.sql("duckdb") == "i % 10 + 1"
    assert _typed("i + 1").node.sql("duckdb") == "CAST(i AS INT128) + CAST(1 AS INT128)"


def test_text_growth_is_bounded_by_the_cost_model() -> None:
    nested = "t"
    for _ in range(7):  # 128 copies of a text of 1000 characters
        nested = f"concat({nested}, {nested})"
    with pytest.raises(QueryRejected, match="characters"):
        _typed(nested)
    grown = "replace(replace(replace(t, 'a', repeat_text), 'a', repeat_text), 'a', repeat_text)".replace(
        "repeat_text", "'" + "x" * 100 + "'")
    with pytest.raises(QueryRejected, match="characters|units of work"):
        _typed(grown)
    assert _typed("lower(t) LIKE '%a%'").cost <= MAX_ROW_COST
    with pytest.raises(QueryRejected, match="parts"):
        _typed(" OR ".join(["i = 1"] * 1000))
    nested = "d"
    for _ in range(9):  # each guard repeats its argument three times
        nested = f"date_trunc('month', {nested})"
    with pytest.raises(QueryRejected, match="parts|units of work"):
        _typed(nested)


class _RandomExpressions:
    """Random row expressions over the grid's columns, by the kind of value they produce (a small grammar of what
    the checker may admit, and of much it must refuse)."""

    LEAVES: ClassVar[dict[str, list[str]]] = {
        "number": ["i", "j", "f", "g", "0", "1", "-1", "100", "2147483647", "9223372036854775807", "0.5", "1e308",
                   "length(t)", "year(d)", "sign(f)", "CAST(b AS TINYINT)", "strpos(t, u)", "extract(epoch FROM s)"],
        "text": ["t", "u", "'a'", "''", "'%'", "CAST(i AS TEXT)", "CAST(d AS VARCHAR)"],
        "date": ["d", "e", "CAST(s AS DATE)", "DATE '2020-01-01'"],
        "boolean": ["b", "c", "true", "NULL"],
    }

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def pick(self, options: list[str]) -> str:
        return options[self.random.randrange(len(options))]

    def make(self, kind: str, depth: int) -> str:
        if depth <= 0:
            return self.pick(self.LEAVES[kind])
        return getattr(self, kind)(depth - 1)

    def number(self, depth: int) -> str:
        a, b, p = self.make("number", depth), self.make("number", depth), self.make("boolean", depth)
        return self.pick([
            f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} / {b})", f"({a} // 3)", f"({a} % 7)", f"-({a})",
            f"abs({a})", f"round({a}, {self.pick(['-2', '0', '3'])})", f"floor({a})", f"({a} ^ {b})", f"sqrt({a})",
            f"ln({a})", f"exp({a})", f"CASE WHEN {p} THEN {a} ELSE {b} END", f"coalesce({a}, {b})",
            f"least({a}, {b})", f"nullif({a}, {b})", f"CASE {a} WHEN 1 THEN {b} WHEN 0.5 THEN 2 END",
            f"CAST({a} AS {self.pick(['INTEGER', 'BIGINT', 'DOUBLE', 'SMALLINT', 'HUGEINT', 'UTINYINT'])})",
            f"extract({self.pick(['year', 'week', 'dow', 'isoyear', 'hour'])} FROM {self.pick(['s', 'r'])})",
            f"week({self.make('date', depth)})", f"length({self.make('text', depth)})"])

    def text(self, depth: int) -> str:
        a, n = self.make("text", depth), self.make("number", depth)
        return self.pick([
            f"lower({a})", f"upper({a})", f"substring({a}, {self.pick(['-5', '0', '3'])}, {self.pick(['0', '100'])})",
            f"left({a}, {n})", f"right({a}, {n})", f"trim({a})", f"concat({a}, {n})",
            f"{a} || {self.make('text', depth)}",
            f"replace({a}, 'a', 'bc')", f"CASE WHEN {self.make('boolean', depth)} THEN {a} END", f"coalesce({a}, 'x')"])

    def date(self, depth: int) -> str:
        a = self.make("date", depth)
        return self.pick([f"date_trunc('{self.pick(['year', 'month', 'week', 'day'])}', {a})",
                          f"CAST({self.make('text', depth)} AS DATE)", f"greatest({a}, '2000-01-01')"])

    def boolean(self, depth: int) -> str:
        n, m, t = self.make("number", depth), self.make("number", depth), self.make("text", depth)
        return self.pick([
            f"({n} {self.pick(['=', '<', '>=', '<>'])} {m})", f"({t} < {self.make('text', depth)})",
            f"({self.make('boolean', depth)} AND {self.make('boolean', depth)})", f"NOT {self.make('boolean', depth)}",
            f"{t} LIKE '{self.pick(['%a', 'a_%', '%b%'])}'", f"{n} IN (1, 2, {m})",
            f"{self.make('date', depth)} > '2020-01-01'",
            f"{n} BETWEEN 0 AND {m}", f"starts_with({t}, 'a')", f"{t} = {n}", f"{n} + {t} > 0"])


def test_random_admitted_expressions_are_total_over_adversarial_values(con) -> None:
    """A differential run of the checker against DuckDB: whatever random expression it admits (and whose constants
    evaluate, as the checker requires), its total form runs over the grid without an error."""
    generator = _RandomExpressions(seed=7)
    constants = ConstantChecker()
    admitted = failures = 0
    for _ in range(400):
        text = generator.make(generator.pick(["number", "text", "date", "boolean"]), generator.random.randrange(1, 4))
        node = sqlglot.parse_one(text, read="duckdb")
        if len({c.name for c in node.find_all(exp.Column)}) > 3:
            continue  # keeps the cross product of grid values small
        try:
            typed = typed_expression(node, COLUMNS, "random")
            constants.check(typed.node, "random")
        except QueryRejected:
            continue
        admitted += 1
        try:
            _evaluate(con, typed.node)
        except duckdb.Error as exc:
            failures += 1
            print(f"{text}\n  -> {typed.node.sql('duckdb')}\n  {str(exc).splitlines()[0]}")
    assert failures == 0
    assert admitted > 200  # the grammar reaches the checker's admitted language, not only its refusals


def test_an_integer_literal_of_thousands_of_digits_is_refused_not_a_traceback() -> None:
    """Python's int() refuses more than 4300 digits with a ValueError, which reached the analyst as a traceback."""
    with pytest.raises(QueryRejected, match="beyond the 128-bit range"):
        _typed("i > " + "9" * 5000)
