"""Joins as written (issue 36: analysis/written_joins.py, flatten.merge_join_members): RIGHT JOIN, comma joins,
conditions in ON and row-level subqueries (CTEs) joined, each rewritten into the form the join rules read.

The evidence is differential, as in test_normalize.py: seeded generated queries and their normalised form run in
plain DuckDB over small generated tables with NULLs, and must give the same multiset of rows; and every generated
query's normalised form has only the joins the rules read (no RIGHT, no comma join, no row-level subquery).
"""

from __future__ import annotations

import random
from collections import Counter

import duckdb
import pytest
from sqlglot import exp

from dpsql.analysis.normalize import normalize
from dpsql.errors import QueryRejected
from dpsql.sql.parse import DIALECT, parse
from tests.sizes import cases
from tests.test_normalize import VISITS, _table, connected


def _tables(con: duckdb.DuckDBPyConnection, rng: random.Random) -> None:
    _table(con, rng)
    con.execute("CREATE TABLE patients (patient_id INTEGER, birth_year INTEGER, sex VARCHAR, insurance VARCHAR, "
                "chronic_conditions INTEGER)")
    con.executemany("INSERT INTO patients VALUES (?, ?, ?, ?, ?)",
                    [(i, rng.randint(1930, 2010), rng.choice(["F", "M", None]), rng.choice(["public", "none"]),
                      rng.choice([None, rng.randint(0, 5)])) for i in range(0, 12) if i != 4])
    con.execute("CREATE TABLE departments (department VARCHAR, floor INTEGER, beds INTEGER, specialty_group VARCHAR)")
    con.executemany("INSERT INTO departments VALUES (?, ?, ?, ?)",
                    [("general", 1, 40, "medical"), ("oncology", 2, 10, "medical"), ("oncology", 3, 25, "surgical"),
                     ("cardiology", 4, 30, None)])


class _Joins:
    """Random queries over visits v, patients p and departments d, with the join forms of issue 36."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def visits(self) -> str:
        if self.r.random() < 0.3:
            where = self.r.choice(["WHERE age > 30", "WHERE region IS NOT NULL", ""])
            return f"(SELECT patient_id, department, age + 1 AS age, cost FROM visits {where}) AS v"
        return "visits AS v"

    def patients(self) -> str:
        if self.r.random() < 0.4:
            return self.r.choice(["(SELECT patient_id, insurance, birth_year FROM patients WHERE birth_year > 1950) "
                                  "AS p", "(SELECT * FROM patients) AS p",
                                  "(SELECT patient_id AS patient_id, chronic_conditions * 2 AS birth_year, insurance "
                                  "FROM patients) AS p"])
        return "patients AS p"

    def query(self) -> str:
        r = self.r
        form = r.randrange(5)
        where: list[str] = []
        if form == 0:  # RIGHT JOIN keeping the private table
            source = f"departments AS d RIGHT JOIN {self.visits()} ON v.department = d.department"
            if r.random() < 0.5:
                source += f" JOIN {self.patients()} ON p.patient_id = v.patient_id"
            keys = ["d.specialty_group", "d.floor", "v.department"]
        elif form == 1:  # comma joins with their equalities in WHERE
            source = f"{self.visits()}, {self.patients()}"
            where.append(r.choice(["v.patient_id = p.patient_id", "p.patient_id = v.patient_id"]))
            if r.random() < 0.5:
                source += ", departments AS d"
                where.append("d.department = v.department")
            keys = ["p.insurance", "v.department"]
        elif form == 2:  # conditions in an INNER join's ON
            extra = r.choice(["d.beds > 20", "v.age > d.floor", "d.specialty_group = 'medical'", "d.floor <> 3"])
            source = f"{self.visits()} JOIN departments AS d ON d.department = v.department AND {extra}"
            keys = ["d.specialty_group", "v.department"]
        elif form == 3:  # a LEFT join with a filter of the public table in ON
            extra = r.choice(["d.beds > 20", "d.specialty_group = 'medical'", "d.floor IN (1, 3)"])
            source = f"{self.visits()} LEFT JOIN departments AS d ON d.department = v.department AND {extra}"
            keys = ["d.floor", "d.specialty_group"]
        else:  # a CTE of a private table joined on the unit
            cte = r.choice(["SELECT patient_id, insurance FROM patients WHERE birth_year > 1960",
                            "SELECT patient_id AS pid, insurance AS ins FROM patients WHERE sex = 'F'"])
            unit = "pid" if "AS pid" in cte else "patient_id"
            key = "ins" if "AS ins" in cte else "insurance"
            return (f"WITH c AS ({cte}) SELECT c.{key} AS k, COUNT(*), SUM(v.age) FROM {self.visits()} JOIN c "
                    f"ON v.patient_id = c.{unit} GROUP BY c.{key}")
        if r.random() < 0.5:
            where.append(r.choice(["v.age > 20", "v.cost IS NOT NULL", "v.department <> 'oncology'"]))
        key = r.choice(keys)
        sql = f"SELECT {key} AS k, COUNT(*), SUM(v.age), COUNT(v.cost) FROM {source}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return sql + f" GROUP BY {key}"


def _rules_form(tree: exp.Select) -> bool:
    """Only INNER and LEFT joins with ON, over tables, no row-level subquery of a private table joined (one of
    public tables is a public relation: its rows are read with the engine's public facts, not given here)."""
    for select in tree.find_all(exp.Select):
        for join in select.args.get("joins") or []:
            if (join.args.get("side") or "").upper() not in ("", "LEFT") or join.args.get("on") is None:
                return False
        for source in [select.args.get("from_"), *(select.args.get("joins") or [])]:
            if source is not None and isinstance(source.this, exp.Subquery) and select.args.get("joins") and any(
                    not VISITS.table(t.name).public for t in source.this.find_all(exp.Table)):
                return False
    return True


def test_joins_as_written_give_the_same_rows_once_normalised() -> None:
    rng = random.Random(36)
    con = connected(rng, _tables)
    generator = _Joins(rng)
    compared, forms, generated = 0, [], cases(300)
    for _ in range(generated):
        sql = generator.query()
        expected = Counter(con.execute(sql).fetchall())
        tree = normalize(parse(sql), VISITS).tree
        assert Counter(con.execute(tree.sql(DIALECT)).fetchall()) == expected, (sql, tree.sql(DIALECT))
        assert _rules_form(tree), (sql, tree.sql(DIALECT))
        compared += 1
        forms.append(sql)
    assert compared == generated
    assert any("RIGHT JOIN" in s for s in forms) and any(", patients" in s for s in forms)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits v RIGHT JOIN departments d ON v.department = d.department",
     "keeps every row of the public table"),
    ("SELECT COUNT(*) FROM departments d JOIN visits v ON v.department = d.department RIGHT JOIN patients p "
     "ON p.patient_id = v.patient_id", "after another join"),
])
def test_a_right_join_that_keeps_a_public_table_or_follows_a_join_is_refused_with_its_reason(sql, message) -> None:
    with pytest.raises(QueryRejected, match=message):
        normalize(parse(sql), VISITS)
