"""Generated queries of the SQL of issue 9 through the whole pipeline (normalise, check, rewrite), on a random
database and on it without one unit: no measurement moves by more than its sensitivity (red team 6a).

tests/test_join_sensitivity.py checks a fixed list through check() alone; this goes through PrivateSession.prepare,
so the normaliser's rewrites (the unit semi-join, EXISTS, public IN lists) are in the path, and draws the query
from FROM forms x filters x aggregates x group keys. Groups whose key is outside a public domain (the NULL of a
LEFT join) are not released and are not counted.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.support import open_session, write_csv, write_policy
from dpsql.errors import DataError, ProgrammingError, QueryRejected

TABLES = {
    "t": {"source": "t.csv", "privacy_unit": "pid", "unit": "person", "max_rows_per_unit": 2,
          "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                      "city": {"type": "text"}, "x": {"type": "float", "lower": -5, "upper": 10},
                      "k": {"type": "int", "lower": 0, "upper": 9}}},
    "u": {"source": "u.csv", "privacy_unit": "pid", "unit": "person", "max_rows_per_unit": 2,
          "columns": {"pid": {"type": "int"}, "y": {"type": "int", "lower": 0, "upper": 5}, "city": {"type": "text"}}},
    "look": {"source": "look.csv", "public": True,
             "columns": {"city": {"type": "text"}, "weight": {"type": "int"}, "region": {"type": "text"}}},
}
LOOK = [("x", 1, "n"), ("x", 3, "s"), ("y", 2, "n"), ("w", 5, "s")]  # city x: k = 2
PER_UNIT = "SELECT pid, COUNT(*) AS n, SUM(x) AS sx, MAX(k) AS mk, COUNT(x) AS cx, COUNT(DISTINCT k) AS dk FROM t"
FROMS = [
    ("t", "t"), ("t JOIN look l ON t.city = l.city", "t"), ("t LEFT JOIN look l ON t.city = l.city", "t"),
    ("t JOIN u ON t.pid = u.pid", "t"), ("t JOIN u ON t.pid = u.pid JOIN look l ON l.city = u.city", "t"),
    ("look l JOIN t ON t.city = l.city", "t"), ("t JOIN t AS t2 ON t.pid = t2.pid", "t"),
    (f"({PER_UNIT} GROUP BY pid) AS p", "p"),
    ("(SELECT t.pid, COUNT(*) AS n, SUM(l.weight) AS sx, MAX(l.weight) AS mk, COUNT(l.region) AS cx, "
     "COUNT(DISTINCT l.region) AS dk FROM t "
     "JOIN look l ON t.city = l.city GROUP BY t.pid) AS p", "p"),
    (f"({PER_UNIT} WHERE k > 2 GROUP BY pid HAVING SUM(x) > 1) AS p JOIN u ON u.pid = p.pid", "p"),
    (f"({PER_UNIT} GROUP BY pid) AS p JOIN t ON t.pid = p.pid", "p"),
    # issue 36: joins as written, a public relation, a private table's rows as a CTE
    ("look l RIGHT JOIN t ON t.city = l.city", "t"), ("t JOIN look l ON t.city = l.city AND l.weight > 1", "t"),
    ("t JOIN (SELECT city, weight, region FROM look WHERE weight < 5) AS l ON l.city = t.city", "t"),
    ("t JOIN (SELECT pid, y FROM u WHERE y > 1) AS u ON t.pid = u.pid", "t"),
]
WHERES = {"t": ["", "WHERE t.pid IN (SELECT pid FROM u WHERE y > 1)",
                "WHERE EXISTS (SELECT 1 FROM u WHERE u.pid = t.pid)",
                "WHERE t.city IN (SELECT city FROM look WHERE weight > 1)", "WHERE t.k > 3",
                # issue 36: semi- and anti-joins in general form
                "WHERE NOT EXISTS (SELECT 1 FROM u AS q WHERE q.pid = t.pid AND q.y > 2)",
                "WHERE t.k > 5 OR EXISTS (SELECT 1 FROM u AS q WHERE q.pid = t.pid AND q.y < t.k)",
                "WHERE t.pid NOT IN (SELECT pid FROM u WHERE y > 1)",
                "WHERE NOT EXISTS (SELECT 1 FROM look AS q WHERE q.city = t.city AND q.weight > t.k)",
                "WHERE NOT EXISTS (SELECT 1 FROM t AS q WHERE q.pid = t.pid AND q.k > t.k)"],
          "p": ["", "WHERE p.n > 1", "WHERE p.pid IN (SELECT pid FROM u)", "WHERE p.mk < 5",
                "WHERE NOT EXISTS (SELECT 1 FROM u AS q WHERE q.pid = p.pid AND q.y > p.n)"]}
AGGREGATES = {"t": ["COUNT(*)", "COUNT(DISTINCT t.pid)", "COUNT(DISTINCT t.city)", "SUM(t.x)", "COUNT(t.x)",
                    "SUM(t.k)", "AVG(t.x)", "COUNT(DISTINCT t.grp)", "SUM(DISTINCT t.k)", "AVG(DISTINCT t.x)",
                    "COUNT(DISTINCT t.pid) FILTER (WHERE t.k > 2)", "COUNT(DISTINCT t.city) FILTER (WHERE t.x > 0)"],
              "p": ["COUNT(*)", "SUM(p.n)", "SUM(p.sx)", "COUNT(DISTINCT p.mk)", "AVG(p.sx)", "COUNT(p.cx)",
                    "COUNT(DISTINCT p.pid)", "SUM(p.cx)", "SUM(DISTINCT p.n)", "AVG(p.dk)"]}
KEYS = {"t": ["", "t.grp", "l.region", "l.weight", "t.city"], "p": ["", "p.n", "p.mk"]}
QUERIES, TRIALS = 60, 2


def _query(r: random.Random) -> str:
    source, kind = r.choice(FROMS)
    key = r.choice(KEYS[kind])
    items = ([key] if key else []) + r.sample(AGGREGATES[kind], r.randint(1, 3))
    return f"SELECT {', '.join(items)} FROM {source} {r.choice(WHERES[kind])}" + (f" GROUP BY {key}" if key else "")


def _units(r: random.Random) -> list[tuple[list[tuple], list[tuple]]]:
    units = []
    for pid in range(1, r.randint(3, 7)):
        rows = [(pid, r.choice("abc"), r.choice(["x", "y", "z", "w", None]), r.choice([None, r.uniform(-6, 12)]),
                 r.choice([None, r.randint(0, 9)])) for _ in range(r.randint(0, 4))]
        units.append((rows, [(pid, r.randint(0, 5), r.choice(["x", "y", None])) for _ in range(r.randint(0, 3))]))
    return units


def _write(folder: Path, units) -> Path:
    folder.mkdir(parents=True)
    write_csv(folder / "t.csv", ["pid", "grp", "city", "x", "k"], [row for rows, _ in units for row in rows])
    write_csv(folder / "u.csv", ["pid", "y", "city"], [row for _, rows in units for row in rows])
    write_csv(folder / "look.csv", ["city", "weight", "region"], LOOK)
    return write_policy(folder / "p.toml", TABLES, {"epsilon": 1e9, "delta": 1e-3, "query_epsilon": 1.0,
                                                    "query_delta": 1e-6})


def _measured(policy: Path, sql: str, seed: int):
    session = open_session(policy, seed)
    try:
        prepared = session.prepare(sql)
        rows = session.measure(prepared)
    finally:
        session.close()
    plan = prepared.plan
    keys = plan.query.keys
    released = {tuple(r[:len(keys)]): [int(v or 0) for v in r[len(keys):]] for r in rows
                if all(k.domain is None or v in k.domain for k, v in zip(keys, r, strict=False))}
    return plan, released


@pytest.mark.parametrize("seed", range(3))
def test_generated_queries_move_each_measurement_by_at_most_its_sensitivity(tmp_path, seed) -> None:
    r = random.Random(seed)
    answered = 0
    for index in range(QUERIES // 3):
        sql = _query(r)
        for trial in range(TRIALS):
            units = _units(r)
            removed = r.randrange(len(units))
            folder = tmp_path / f"{index}_{trial}"
            full = _write(folder / "with", units)
            neighbour = _write(folder / "without", [u if i != removed else ([], []) for i, u in enumerate(units)])
            try:
                plan, a = _measured(full, sql, trial)
            except (QueryRejected, ProgrammingError, DataError):
                break
            _, b = _measured(neighbour, sql, trial)
            answered += 1
            items: dict = {}
            for j, measurement in enumerate(plan.measurements):
                change = sum(abs(a.get(g, [0] * 99)[j] - b.get(g, [0] * 99)[j]) for g in set(a) | set(b))
                assert change <= measurement.sensitivity, (sql, measurement.spec.label, change)
                items[measurement.spec.budget_item] = items.get(measurement.spec.budget_item, 0) + change
            for measurement in plan.measurements:
                assert items[measurement.spec.budget_item] <= measurement.sensitivity, (sql, measurement.spec.label)
    assert answered >= QUERIES // 3  # most generated queries are answered
