"""Normalisation (analysis/normalize.py, analysis/flatten.py): CTEs, row-level subqueries, GROUP BY ALL, FILTER and
table column aliases rewritten into one SELECT, with exactly the written query's meaning.

Three kinds of evidence: examples of each rewrite; a differential test, where seeded generated queries and their
normalised form run in plain DuckDB over a small generated table and must give the same multiset of rows; and the
session end to end, where a nested query and its hand-flattened form release the same values at the same cost.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

from benchmarks.support import seeded
from dpsql.analysis.check import check
from dpsql.analysis.flatten import MAX_PARTS
from dpsql.analysis.normalize import normalize
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.sql.names import prepared_table
from dpsql.sql.parse import DIALECT, parse
from tests.sizes import cases

ROOT = Path(__file__).resolve().parent.parent
VISITS = load_policy(ROOT / "sample_data" / "visits.toml")


def normalized(sql: str) -> str:
    return normalize(parse(sql), VISITS).tree.sql(DIALECT)


EXAMPLES = [
    # the brief's example: projections substituted, filters ANDed, the outer names resolved to the subquery's
    ("SELECT COUNT(*) FROM (SELECT age + 1 AS a, region FROM visits WHERE sex = 'F') AS s WHERE a > 30 "
     "GROUP BY region",
     "SELECT COUNT(*) FROM visits WHERE visits.sex = 'F' AND (visits.age + 1) > 30 GROUP BY visits.region"),
    # CTEs, one reading another; the inner ORDER BY (no LIMIT) is dropped
    ("WITH a AS (SELECT * FROM visits WHERE age > 3 ORDER BY age), b AS (SELECT region AS r, cost FROM a "
     "WHERE smoker) SELECT r, SUM(cost) FROM b GROUP BY r",
     "SELECT visits.region AS r, SUM(visits.cost) FROM visits WHERE visits.age > 3 AND visits.smoker "
     "GROUP BY visits.region"),
    # a CTE used twice is inlined twice (here in two subqueries of an IN, which the checker then refuses)
    ("WITH a AS (SELECT age FROM visits) SELECT COUNT(*) FROM a WHERE age IN (SELECT age FROM a)",
     "SELECT COUNT(*) FROM (SELECT age FROM visits) AS a WHERE age IN (SELECT visits.age AS age FROM visits)"),
    # an alias that shadows a column: inside the subquery the name is the column, outside it is the alias
    ("SELECT SUM(age) FROM (SELECT length_of_stay AS age, age AS length_of_stay FROM visits WHERE age > 5) AS t",
     "SELECT SUM(visits.length_of_stay) FROM visits WHERE visits.age > 5"),
    # DuckDB's lateral alias inside the subquery, and an outer alias used in GROUP BY and a bare ORDER BY name
    ("SELECT b AS k, COUNT(*) FROM (SELECT age + 1 AS a, a * 2 AS b FROM visits) GROUP BY k ORDER BY k",
     "SELECT (visits.age + 1) * 2 AS k, COUNT(*) FROM visits GROUP BY (visits.age + 1) * 2 ORDER BY k"),
    # any depth
    ("SELECT COUNT(*) FROM (SELECT * FROM (SELECT * FROM (SELECT region, age FROM visits WHERE age > 1) "
     "WHERE age < 90) WHERE region = 'north')",
     "SELECT COUNT(*) FROM visits WHERE (visits.age > 1 AND visits.age < 90) AND visits.region = 'north'"),
    # table column aliases rename the policy's columns by position
    ("SELECT b, COUNT(*) FROM visits AS v(p, d, b) GROUP BY b",
     "SELECT visits.region AS b, COUNT(*) FROM visits GROUP BY visits.region"),
    # GROUP BY ALL: the items without aggregates that read a column (the constant 1 is not a key, as in DuckDB)
    ("SELECT region, 1 AS one, age > 30 AS old, COUNT(*) FROM visits GROUP BY ALL",
     "SELECT region, 1 AS one, age > 30 AS old, COUNT(*) FROM visits GROUP BY region, age > 30"),
    # FILTER moves into the aggregate's argument
    ("SELECT COUNT(*) FILTER (WHERE smoker), SUM(cost) FILTER (WHERE age > 30), AVG(age) FILTER (WHERE sex = 'F') "
     "FROM visits",
     "SELECT COUNT(CASE WHEN smoker THEN 1 END), SUM(CASE WHEN age > 30 THEN cost END), "
     "AVG(CASE WHEN sex = 'F' THEN age END) FROM visits"),
    ("SELECT region, VAR(age) FILTER (WHERE smoker) FROM visits GROUP BY ALL",
     "SELECT region, VAR(CASE WHEN smoker THEN age END) FROM visits GROUP BY region"),
    # on a DISTINCT aggregate: the distinct values among the rows where the condition holds (issue 36)
    ("SELECT COUNT(DISTINCT patient_id) FILTER (WHERE age > 3), SUM(DISTINCT age) FILTER (WHERE smoker) FROM visits",
     "SELECT COUNT(DISTINCT CASE WHEN age > 3 THEN patient_id END), SUM(DISTINCT CASE WHEN smoker THEN age END) "
     "FROM visits"),
    # left as written: an aggregate sqlglot does not know (DuckDB's catalogue says histogram is one), a sample
    ("SELECT COUNT(*) FROM (SELECT histogram(age) AS h FROM visits) AS s",
     "SELECT COUNT(*) FROM (SELECT HISTOGRAM(age) AS h FROM visits) AS s"),
    ("SELECT COUNT(*) FROM (SELECT age FROM visits) AS s TABLESAMPLE 10%",
     "SELECT COUNT(*) FROM (SELECT age FROM visits) AS s TABLESAMPLE SYSTEM (10 PERCENT)"),
    # a HAVING name that is a subquery column and an output alias: DuckDB's reading depends on the GROUP BY
    ("SELECT age + 0 AS age, COUNT(*) FROM (SELECT age FROM visits) GROUP BY age HAVING age > 1",
     "SELECT age + 0 AS age, COUNT(*) FROM (SELECT age FROM visits) GROUP BY age HAVING age > 1"),
    # a subquery in an expression may name the enclosing query's columns: left as written, for the checker
    ("SELECT COUNT(*) FROM visits AS v WHERE EXISTS (SELECT 1 FROM (SELECT age FROM visits) AS s WHERE s.age = v.age)",
     "SELECT COUNT(*) FROM visits AS v WHERE EXISTS(SELECT 1 FROM (SELECT age FROM visits) AS s WHERE s.age = v.age)"),
    # left as written: grouped by the unit (the checker's to handle), DISTINCT, LIMIT, a join, a constant key
    ("SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) AS p",
     "SELECT COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n FROM visits GROUP BY patient_id) AS p"),
    ("SELECT COUNT(*) FROM (SELECT DISTINCT region FROM visits)",
     "SELECT COUNT(*) FROM (SELECT DISTINCT region FROM visits)"),
    ("SELECT COUNT(*) FROM (SELECT region FROM visits LIMIT 5)",
     "SELECT COUNT(*) FROM (SELECT region FROM visits LIMIT 5)"),
    ("SELECT COUNT(*) FROM (SELECT 2 AS k, region FROM visits) GROUP BY k",
     "SELECT COUNT(*) FROM (SELECT 2 AS k, region FROM visits) GROUP BY k"),
]


@pytest.mark.parametrize(("sql", "expected"), EXAMPLES)
def test_each_rewrite_gives_the_canonical_form(sql: str, expected: str) -> None:
    assert normalized(sql) == expected


def test_a_query_without_anything_to_rewrite_is_the_same_object() -> None:
    parsed = parse("SELECT region, COUNT(*) FROM visits GROUP BY region")
    assert normalize(parsed, VISITS) is parsed


@pytest.mark.parametrize(("sql", "names"), [
    ("SELECT r, SUM(a) FROM (SELECT region AS r, age + 1 AS a FROM visits) GROUP BY r", ("r", "sum(a)")),
    ("SELECT region, COUNT(*) FILTER (WHERE smoker) AS n FROM visits GROUP BY ALL", ("region", "n")),
    ("WITH t AS (SELECT * FROM visits) SELECT VAR(age), count(*) FROM t", ("var(age)", "count(*)")),
    ("SELECT s.b, COUNT(*) FROM visits AS s(a, b, c) GROUP BY s.b", ("b", "count(*)")),
])
def test_outputs_keep_the_names_the_analyst_wrote(sql: str, names: tuple[str, ...]) -> None:
    assert check(normalize(parse(sql), VISITS), VISITS, VOCABULARY).output_names == names


@pytest.mark.parametrize(("sql", "error", "message"), [
    ("WITH RECURSIVE t AS (SELECT 1) SELECT COUNT(*) FROM t", QueryRejected, "WITH RECURSIVE is not supported"),
    ("WITH visits AS (SELECT * FROM visits) SELECT COUNT(*) FROM visits", QueryRejected,
     "'visits' is the name of a declared table"),
    ("SELECT COUNT(*) FROM visits AS v(a, b, c, d, e, f, g, h, i, j)", QueryRejected,
     "table visits has 9 columns but 10 column aliases"),
    ("SELECT COUNT(*) FROM (SELECT age FROM visits) AS s(a, b)", QueryRejected,
     "the subquery has 1 columns but 2 column aliases"),
    ("SELECT COUNT(*) FROM (SELECT age AS a FROM visits) WHERE age > 3", ProgrammingError,
     "column 'age' not found \\(FROM has: a\\)"),
    ("SELECT COUNT(*) FROM (SELECT age AS a, sex AS a FROM visits) WHERE a > 3", ProgrammingError, "ambiguous"),
])
def test_refusals_name_the_problem(sql: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        normalize(parse(sql), VISITS)


def test_repetition_cannot_grow_the_query_exponentially() -> None:
    """Each CTE reads the one before twice, each subquery level doubles the expression: refused at a bound, before
    2^40 copies are built."""
    ctes = ", ".join(f"c{i} AS (SELECT age FROM c{i - 1} WHERE age IN (SELECT age FROM c{i - 1}))"
                     for i in range(1, 40))
    with pytest.raises(QueryRejected, match=f"more than {MAX_PARTS} parts"):
        normalize(parse(f"WITH c0 AS (SELECT age FROM visits), {ctes} SELECT COUNT(*) FROM c39"), VISITS)
    nested = "visits"
    for _ in range(40):
        nested = f"(SELECT age + age AS age FROM {nested})"
    with pytest.raises(QueryRejected, match=f"more than {MAX_PARTS} parts"):
        normalize(parse(f"SELECT SUM(age) FROM {nested}"), VISITS)


def test_the_policys_column_order_is_the_engines(visits_policy: Path) -> None:
    """Column aliases rename by the policy's order: it must be the order of the table the queries read."""
    policy = load_policy(visits_policy)
    engine = DuckDBEngine(policy, bounding_seed=1)
    try:
        names = [d[0] for d in engine._con.execute(f"SELECT * FROM {prepared_table('visits')} LIMIT 0").description]
    finally:
        engine.close()
    assert names[:len(policy.tables["visits"].columns)] == list(policy.tables["visits"].columns)


# ---- differential: generated queries, written and normalised, in plain DuckDB ----

_COLUMNS = list(VISITS.tables["visits"].columns)  # patient_id, visit_date, region, department, age, sex, ...


def _table(con: duckdb.DuckDBPyConnection, rng: random.Random) -> None:
    """A small table with the policy's columns in its order, with NULLs, and halves for cost so sums are exact."""
    con.execute("CREATE TABLE visits (patient_id INTEGER, visit_date DATE, region VARCHAR, department VARCHAR, "
                "age INTEGER, sex VARCHAR, smoker BOOLEAN, cost DOUBLE, length_of_stay INTEGER)")
    assert [r[0] for r in con.execute("DESCRIBE visits").fetchall()] == _COLUMNS
    rows = []
    for i in range(40):
        rows.append((i % 9, f"2024-01-{1 + i % 28:02d}", rng.choice(["north", "south", None]),
                     rng.choice(["general", "oncology"]), rng.randint(0, 100), rng.choice(["F", "M", None]),
                     rng.choice([True, False, None]), rng.choice([None, rng.randint(0, 200) / 2]), rng.randint(0, 30)))
    con.executemany("INSERT INTO visits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


_NUMERIC = {"patient_id", "age", "cost", "length_of_stay"}


class _Generator:
    """Random queries over visits: chains of row-level subqueries or CTEs, aliases that shadow columns, stars,
    table column aliases, and an outer query with filters, keys, aggregates (some with FILTER) and GROUP BY ALL."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def condition(self, names: dict[str, bool]) -> str:
        name = self.rng.choice(list(names))
        if names[name]:
            return f"{name} {self.rng.choice(['>', '<', '=', '<>'])} {self.rng.randint(0, 100)}"
        return self.rng.choice([f"{name} IS NULL", f"{name} IS NOT NULL", f"{name} = {name}"])

    def source(self, depth: int, ctes: list[str]) -> tuple[str, dict[str, bool]]:
        """A FROM source and its columns (name -> numeric?)."""
        if depth == 0:
            if self.rng.random() < 0.25:
                renamed = [f"c{i}" for i in range(self.rng.randint(1, len(_COLUMNS)))]
                names = {n: (n in _NUMERIC) for n in _COLUMNS}
                for new, old in zip(renamed, _COLUMNS, strict=False):
                    names[new] = names.pop(old)
                return f"visits AS v({', '.join(renamed)})", names
            return "visits", {n: (n in _NUMERIC) for n in _COLUMNS}
        inner, names = self.source(depth - 1, ctes)
        items, out = [], {}
        if self.rng.random() < 0.3:
            items.append("*")
            out.update(names)
        for _ in range(self.rng.randint(1, 3)):
            name = self.rng.choice(list(names))
            alias = self.rng.choice([*names, "a", "b", "k"])  # often shadows one of the columns
            if names[name] and self.rng.random() < 0.5:
                items.append(f"{name} + {self.rng.randint(1, 5)} AS {alias}")
                numeric = True
            else:
                items.append(f"{name} AS {alias}")
                numeric = names[name]
            if alias in out:
                continue  # a duplicate name cannot be read outside: keep the generated names unique
            out[alias] = numeric
        if "*" in items and len(out) != len(set(out)):
            items.remove("*")
        if len([i for i in items if " AS " in i]) + (len(names) if "*" in items else 0) != len(out):
            items = [i for i in items if i != "*"]
            out = {}
            rebuilt = []
            for item in items:
                alias = item.rsplit(" AS ", 1)[1]
                if alias not in out:
                    out[alias] = names.get(item.split(" ")[0], True) if "+" not in item else True
                    rebuilt.append(item)
            items = rebuilt
        where = f" WHERE {self.condition(names)}" if self.rng.random() < 0.6 else ""
        order = f" ORDER BY {self.rng.choice(list(names))}" if self.rng.random() < 0.2 else ""
        body = f"SELECT {', '.join(items)} FROM {inner}{where}{order}"
        renames = ""
        if "*" not in items and self.rng.random() < 0.2:  # column aliases on the subquery rename by position
            renamed = {f"r{i}": numeric for i, numeric in enumerate(out.values())}
            renamed = dict(list(renamed.items())[:self.rng.randint(1, len(renamed))])
            out = {**renamed, **dict(list(out.items())[len(renamed):])}
            renames = f"({', '.join(renamed)})"
            if len(set(out)) != len(out):
                renames, out = "", dict(zip([i.rsplit(' AS ', 1)[1] for i in items], out.values(), strict=True))
        if self.rng.random() < 0.4 and not renames:
            name = f"q{len(ctes)}"
            ctes.append(f"{name} AS ({body})")
            return name, out
        return f"({body}) AS s{depth}{renames}", out

    def query(self) -> str:
        ctes: list[str] = []
        source, names = self.source(self.rng.randint(0, 3), ctes)
        numeric = [n for n, is_numeric in names.items() if is_numeric] or [None]
        key = self.rng.choice(list(names))
        aggregates = []
        for _ in range(self.rng.randint(1, 3)):
            value = self.rng.choice(numeric)
            call = self.rng.choice(["COUNT(*)", f"SUM({value})", f"MIN({value})", f"MAX({value})",
                                    f"COUNT({value})"]) if value else "COUNT(*)"
            if self.rng.random() < 0.4:
                call += f" FILTER (WHERE {self.condition(names)})"
            aggregates.append(call)
        grouped = self.rng.random() < 0.7
        items = ([f"{key} AS g"] if grouped else []) + (["1 AS one"] if self.rng.random() < 0.2 else []) + aggregates
        sql = f"SELECT {', '.join(items)} FROM {source}"
        if self.rng.random() < 0.5:
            # sometimes no row at all: grouping by a constant or not grouping then differ (no row or one)
            sql += f" WHERE {self.condition(names) if self.rng.random() < 0.8 else 'false'}"
        if not grouped and self.rng.random() < 0.3:
            sql += " GROUP BY ALL"  # with no key: one group of all rows, as without GROUP BY
        if grouped:
            sql += self.rng.choice([f" GROUP BY {key}", " GROUP BY ALL", " GROUP BY g"])
            if self.rng.random() < 0.3:
                sql += self.rng.choice([" HAVING g IS NOT NULL", " HAVING COUNT(*) > 2", f" HAVING MIN({key}) = g"])
        return (f"WITH {', '.join(ctes)} " if ctes else "") + sql


def _multiset(con: duckdb.DuckDBPyConnection, sql: str) -> Counter:
    return Counter(con.execute(sql).fetchall())


def connected(rng: random.Random, make=_table) -> duckdb.DuckDBPyConnection:
    """A DuckDB on one thread (the same rows in the same order), with the tables `make` creates from `rng`."""
    con = duckdb.connect()
    con.execute("SET threads = 1")
    make(con, rng)
    return con


def test_normalised_queries_give_the_same_rows_as_written() -> None:
    rng = random.Random(20261123)
    con = connected(rng)
    generator = _Generator(rng)
    compared = flattened = 0
    unflattened: list[str] = []
    generated = cases(600)
    for _ in range(generated):
        sql = generator.query()
        try:
            expected = _multiset(con, sql)
        except duckdb.Error:
            continue  # not valid DuckDB (a type mismatch the generator made): nothing to compare
        tree = normalize(parse(sql), VISITS).tree
        assert _multiset(con, tree.sql(DIALECT)) == expected, (sql, tree.sql(DIALECT))
        compared += 1
        if any(isinstance(n, exp.Subquery | exp.With | exp.Filter) for n in tree.walk()):
            unflattened.append(sql)
        else:
            flattened += 1
    # Two in three generated queries are valid DuckDB; every generated form is one the stage merges.
    assert compared >= generated * 2 // 3 and flattened == compared, unflattened


# ---- end to end: a nested query answers as its hand-flattened form, at the same cost ----

@pytest.mark.parametrize(("nested", "flat"), [
    ("WITH f AS (SELECT region AS r, cost FROM visits WHERE sex = 'F') SELECT r, SUM(cost) AS total, "
     "COUNT(*) AS n FROM f GROUP BY r",
     "SELECT region AS r, SUM(cost) AS total, COUNT(*) AS n FROM visits WHERE sex = 'F' GROUP BY region"),
    ("SELECT department, AVG(stay) AS stay FROM (SELECT department, length_of_stay AS stay, age FROM visits) AS s "
     "WHERE age > 40 GROUP BY ALL",
     "SELECT department, AVG(length_of_stay) AS stay FROM visits WHERE age > 40 GROUP BY department"),
    ("SELECT region, COUNT(*) FILTER (WHERE smoker) AS smokers FROM visits GROUP BY region",
     "SELECT region, COUNT(CASE WHEN smoker THEN 1 END) AS smokers FROM visits GROUP BY region"),
])
def test_a_nested_query_releases_what_its_flat_form_releases(visits_policy: Path, nested: str, flat: str) -> None:
    results = []
    for sql in (nested, flat):
        session = PrivateSession(visits_policy, "tester", rng=seeded(5), bounding_seed=3)
        try:
            results.append((session.prepare(sql).bounded.sql, session.execute(sql)))
        finally:
            session.close()
    (nested_sql, nested_result), (flat_sql, flat_result) = results
    assert nested_sql == flat_sql
    assert nested_result.rows == flat_result.rows
    assert nested_result.cost == flat_result.cost
    assert [c.name for c in nested_result.columns] == [c.name for c in flat_result.columns]
