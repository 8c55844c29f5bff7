"""Exactness against plain DuckDB (issue 29): generated queries at negligible noise, on data where no bound binds.

`python -m benchmarks.exactness [--queries 2000 --seed 29]` prints the figures; tests/test_exactness.py runs a seeded
few hundred. Each query runs through the whole pipeline (PrivateSession.execute: check, plan, bounded SQL, noise,
post-processing) at epsilon 1e12, where every noise draw is 0 (even with the epsilon split among a query's
measurements, a count's discrete Laplace has a scale below 1e-10 and a sum's below 0.02 grid steps), and in plain
DuckDB over the same files. The data keep every value inside its declared bounds and
every unit within `max_rows_per_unit`, so dpsql's bounded answer is the exact one, and dpsql must answer what
DuckDB answers, cell by cell, with the type DuckDB gives the same SQL.

What "equal" means per cell: integers, text, booleans and decimals exactly; a double within 1e-9 of DuckDB's,
relatively (dpsql computes AVG as center + S/N and VAR from sums of squares on a fixed-point grid: the same number,
rounded by a few float operations of its own; the values here lie on the grid, so the sums themselves are exact);
the type's name exactly.

The documented differences, checked as what the README says instead of skipped (each is counted in the summary):
- quantiles: a value of the candidate grid, so "exact" is within the grid's resolution: between the two data
  values DuckDB interpolates between (its QUANTILE_CONT position q (n - 1)), widened by one grid width;
- MIN and MAX are the 0 and 1 quantiles of the grid: between the lower bound and the data's minimum (between the
  maximum and the upper bound), widened by one grid width ("what MIN and MAX mean here differs from SQL's");
- empty declared groups: a declared key value with no row is released (DuckDB has no such group): its counts and
  sums are 0, an AVG, VAR or STDDEV is NULL, as is a division by its count, a quantile lies within the bounds;
- partition selection: a group of keys without declared values is released only when its noisy row count reaches
  the threshold, so a DuckDB group with fewer rows than the threshold may be missing.
Keys are never NULL in these data (a NULL key is never released: README), and every group DuckDB finds has rows
with non-NULL values of every aggregated column (SQL's SUM over no values is NULL, dpsql's a noisy 0).
"""

from __future__ import annotations

import datetime
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.attacks.script import options, scratch
from benchmarks.support import Budget, create_ledger, open_session, write_csv, write_policy
from dpsql.errors import Error
from dpsql.session import PrivateSession

EPSILON = 1e12
BUDGET = Budget(epsilon=1e15, delta=1e-2, query_epsilon=EPSILON, query_delta=1e-8)  # delta: 1e6 grouped queries
MAX_ROWS = 5
RELATIVE = 1e-9  # a double's tolerance (module docstring)
DEPARTMENTS = ("a", "b", "c", "d", "z")  # declared; no visit is in 'z': an empty declared group
REGIONS = ("north", "south", "east")  # not declared: partition selection
INSURANCE = ("public", "private", "none")

# Column declarations, as a policy file reads them; every value in the data lies inside these bounds.
VISITS = {
    "pid": {"type": "int"},
    "dept": {"type": "text", "values": list(DEPARTMENTS), "nullable": False},
    "region": {"type": "text", "nullable": False},
    "age": {"type": "int", "lower": 0, "upper": 100, "nullable": False},
    "stay": {"type": "int", "lower": 0, "upper": 30, "nullable": False},
    "cost": {"type": "float", "lower": 0, "upper": 500},
    "score": {"type": "float", "lower": -10, "upper": 10, "nullable": False},
    "smoker": {"type": "bool", "nullable": False},
    "day": {"type": "date", "lower": "2019-01-01", "upper": "2024-12-31", "nullable": False},
}
PATIENTS = {
    "pid": {"type": "int"},
    "birth_year": {"type": "int", "lower": 1920, "upper": 2025, "nullable": False},
    "insurance": {"type": "text", "values": list(INSURANCE), "nullable": False},
}
DEPTS = {"dept": {"type": "text"}, "floor": {"type": "int"}, "wing": {"type": "text"}}
_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE"}


def write_data(folder: Path, seed: int, people: int = 300) -> Path:
    """The three tables and their policy; returns the policy's path. Values are quarters (exact on every grid)."""
    rng = random.Random(seed)
    visits, patients = [], []
    for pid in range(1, people + 1):
        patients.append((pid, rng.randint(1920, 2025), rng.choice(INSURANCE)))
        for _ in range(rng.randint(1, MAX_ROWS)):
            cost = None if rng.random() < 0.1 else rng.randint(0, 2000) / 4
            day = datetime.date(2019, 1, 1) + datetime.timedelta(days=rng.randint(0, 6 * 365))
            visits.append((pid, rng.choice(DEPARTMENTS[:-1]), rng.choice(REGIONS), rng.randint(0, 100),
                           rng.randint(0, 30), cost, rng.randint(-40, 40) / 4, rng.random() < 0.3, day.isoformat()))
    depts = [("a", 1, "east"), ("b", 2, "east"), ("c", 3, "west"), ("d", 4, "west"), ("z", 5, "west")]
    for name, header, rows in (("visits", VISITS, visits), ("patients", PATIENTS, patients),
                               ("depts", DEPTS, depts)):
        write_csv(folder / f"{name}.csv", list(header), rows)
    tables = {
        "visits": {"source": "visits.csv", "privacy_unit": "pid", "unit": "patient", "max_rows_per_unit": MAX_ROWS,
                   "columns": VISITS},
        "patients": {"source": "patients.csv", "privacy_unit": "pid", "unit": "patient", "max_rows_per_unit": 1,
                     "columns": PATIENTS},
        "depts": {"source": "depts.csv", "public": True, "columns": DEPTS},
    }
    policy = write_policy(folder / "policy.toml", tables, BUDGET.keys())
    # What is compared is the answer, not the time: a ROLLUP over partition-selected keys with m = 5 is over the
    # default per-person work bound (ten candidate groups of one person: analysis/person_work.py), so the steward's
    # bound is raised here.
    policy.write_text(policy.read_text() + "\n[engine]\nmax_person_slowdown = 0.5\n")
    return create_ledger(policy)


def plain_duckdb(folder: Path) -> duckdb.DuckDBPyConnection:
    """The same files in plain DuckDB, with the declared types."""
    con = duckdb.connect()
    for name, columns in (("visits", VISITS), ("patients", PATIENTS), ("depts", DEPTS)):
        types = ", ".join(f"'{c}': '{_SQL_TYPES[spec['type']]}'" for c, spec in columns.items())
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_csv('{folder / name}.csv', header = true, "
                    f"columns = {{{types}}})")
    return con


# The generator ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """What a query reads: its FROM (and WITH), the numeric columns it offers and the group keys it can use."""

    shape: str  # table, public join, private join, subquery, CTE, per-unit, per-unit join
    from_: str
    numbers: dict[str, str]  # column reference -> int, float or bool
    nullable: frozenset[str]
    keys: tuple[str, ...]
    conditions: tuple[str, ...]
    unit: str
    with_: str = ""
    joined_by: str = ""  # a condition every query of it has (a comma join's equality)


def _visits(prefix: str = "") -> dict[str, str]:
    return {f"{prefix}{c}": kind for c, kind in (("age", "int"), ("stay", "int"), ("cost", "float"),
                                                 ("score", "float"), ("smoker", "bool"))} | {
        f"YEAR({prefix}day)": "int", f"MONTH({prefix}day)": "int", f"DAYOFWEEK({prefix}day)": "int"}  # issue 36


_KEYS = ("dept", "region", "smoker", "age > 60", "CASE WHEN stay < 10 THEN 'short' ELSE 'long' END")
_CONDITIONS = ("age > 10", "stay < 28", "cost IS NOT NULL", "NOT smoker OR age > 5", "score > -9")

SOURCES = (
    Source("table", "visits", _visits(), frozenset({"cost"}), _KEYS, _CONDITIONS, "pid"),
    Source("public join", "visits v JOIN depts d ON v.dept = d.dept", _visits("v."), frozenset({"v.cost"}),
           ("d.wing", "v.dept", "v.region"), ("v.age > 10", "d.floor < 4", "v.stay < 28"), "v.pid"),
    Source("private join", "visits v JOIN patients p ON v.pid = p.pid", {**_visits("v."), "p.birth_year": "int"},
           frozenset({"v.cost"}), ("p.insurance", "v.dept", "v.smoker"), ("p.birth_year > 1930", "v.age > 10"),
           "v.pid"),
    Source("subquery", "(SELECT pid, dept, region, age + 1 AS age1, stay, cost, score FROM visits WHERE stay < 29) "
           "AS s", {"age1": "int", "stay": "int", "cost": "float", "score": "float"}, frozenset({"cost"}),
           ("dept", "region", "age1 > 50"), ("age1 > 3", "score < 9.5"), "pid"),
    Source("CTE", "s", {"age": "int", "stay2": "int", "cost": "float"}, frozenset({"cost"}), ("dept", "region"),
           ("stay2 < 56", "age > 2"), "pid",
           with_="WITH s AS (SELECT pid, dept, region, age, stay * 2 AS stay2, cost FROM visits WHERE age >= 1) "),
    Source("per-unit", "(SELECT pid, COUNT(*) AS n, SUM(stay) AS total_stay, AVG(age) AS mean_age, "
           "MAX(score) AS top_score, COUNT(DISTINCT dept) AS depts FROM visits GROUP BY pid) AS u",
           {"n": "int", "total_stay": "int", "mean_age": "float", "top_score": "float", "depts": "int"}, frozenset(),
           ("n", "depts"), ("total_stay > 3", "mean_age > 5", "depts > 1"), "pid"),
    Source("per-unit join", "(SELECT pid, COUNT(*) AS n, SUM(stay) AS total_stay FROM visits GROUP BY pid) AS u "
           "JOIN patients p ON u.pid = p.pid", {"u.n": "int", "u.total_stay": "int", "p.birth_year": "int"},
           frozenset(), ("p.insurance", "u.n"), ("p.birth_year > 1925",), "u.pid"),
    # issue 36: joins as written, public relations, semi- and anti-joins
    Source("right join", "depts d RIGHT JOIN visits v ON v.dept = d.dept", _visits("v."), frozenset({"v.cost"}),
           ("d.wing", "v.dept"), ("v.age > 10", "d.floor < 4"), "v.pid"),
    Source("comma join", "visits v, patients p", {**_visits("v."), "p.birth_year": "int"}, frozenset({"v.cost"}),
           ("p.insurance", "v.dept"), ("p.birth_year > 1930", "v.stay < 20"), "v.pid", joined_by="v.pid = p.pid"),
    Source("ON filter", "visits v JOIN depts d ON d.dept = v.dept AND d.floor < 4", _visits("v."),
           frozenset({"v.cost"}), ("d.wing", "v.region"), ("v.age > 10",), "v.pid"),
    Source("public CTE", "visits v JOIN w ON w.dept = v.dept", _visits("v."), frozenset({"v.cost"}),
           ("w.wing", "v.dept"), ("v.stay < 28", "w.floor > 1"), "v.pid",
           with_="WITH w AS (SELECT dept, wing, floor FROM depts WHERE floor <> 3) "),
    Source("private CTE", "visits v JOIN p ON p.pid = v.pid", {**_visits("v."), "p.birth_year": "int"},
           frozenset({"v.cost"}), ("p.insurance", "v.dept"), ("v.age > 10",), "v.pid",
           with_="WITH p AS (SELECT pid, insurance, birth_year FROM patients WHERE birth_year > 1940) "),
    Source("semi/anti-join", "visits v", _visits("v."), frozenset({"v.cost"}), ("v.dept", "v.region"), (
        "NOT EXISTS (SELECT 1 FROM patients p WHERE p.pid = v.pid AND p.birth_year > 1960)",
        "v.age > 80 OR EXISTS (SELECT 1 FROM visits w WHERE w.pid = v.pid AND w.stay > v.stay)",
        "NOT EXISTS (SELECT 1 FROM visits w WHERE w.pid = v.pid AND w.age > v.age)",
        "v.pid NOT IN (SELECT pid FROM patients WHERE insurance = 'none')",
        "NOT (v.smoker AND v.pid IN (SELECT pid FROM patients WHERE birth_year < 1950))",
        "NOT EXISTS (SELECT 1 FROM depts d WHERE d.dept = v.dept AND d.floor > v.stay)",
        "v.dept NOT IN (SELECT dept FROM depts WHERE wing = 'west')",
        "v.cost > (SELECT AVG(floor) FROM depts)"), "v.pid"),
)


@dataclass(frozen=True)
class Output:
    """One generated select item: its SQL, what it is, and its value in an empty declared group."""

    sql: str
    kind: str  # exact, quantile, min, max
    argument: str = ""  # a quantile's (or MIN's, MAX's) argument
    fraction: float = 0.5
    empty: Any = 0  # the value in an empty declared group; WITHIN: within the bounds (quantiles)


FEATURES = ("COUNT(*)", "COUNT(DISTINCT", "SUM", "AVG", "VAR", "STDDEV", "MEDIAN", "QUANTILE_CONT", "QUANTILE_DISC",
            "PERCENTILE_CONT", "MIN", "MAX", "CAST", "//", "* 1.5", "/ COUNT(*)", "SUM(DISTINCT", "AVG(DISTINCT",
            "FILTER", "YEAR(", "MONTH(", "DAYOFWEEK(")  # what the summary counts
NULL = None
WITHIN = "within the bounds"


class Generator:
    def __init__(self, rng: random.Random, sources: tuple[Source, ...] = SOURCES) -> None:
        self.rng = rng
        self.sources = sources  # benchmarks/spark_parity.py adds sources of adversarial expressions

    def outputs(self, source: Source) -> list[Output]:
        r = self.rng
        x = r.choice(list(source.numbers))
        kind = source.numbers[x]
        spread = r.choice(["VAR_POP", "VAR_SAMP", "STDDEV_POP", "STDDEV_SAMP"])
        choices: list[Callable[[], Output]] = [
            lambda: Output("COUNT(*)", "exact"),
            lambda: Output(f"SUM({x})", "exact"),
            lambda: Output(f"COUNT(DISTINCT {source.unit})", "exact"),
            lambda: Output(f"SUM(CASE WHEN {x} > 3 THEN 1 ELSE 0 END)", "exact"),
            lambda: Output(f"SUM({x}) / COUNT(*)", "exact", empty=NULL),  # a division by a noisy 0 is NULL
            lambda: Output(f"MIN({x})", "min", x, 0.0, WITHIN),
            lambda: Output(f"MAX({x})", "max", x, 1.0, WITHIN),
            lambda: Output(f"COUNT(DISTINCT {source.unit}) FILTER (WHERE {x} > 2)", "exact"),
        ]
        if x in source.nullable:
            choices.append(lambda: Output(f"COUNT({x})", "exact"))
        if kind != "bool":  # DuckDB has no AVG, VAR or quantile of a boolean
            choices += [
                lambda: Output(f"AVG({x})", "exact", empty=NULL),
                lambda: Output(f"{spread}({x})", "exact", empty=NULL),
                lambda: Output(f"MEDIAN({x})", "quantile", x, 0.5, WITHIN),
                lambda: Output(f"QUANTILE_CONT({x}, 0.25)", "quantile", x, 0.25, WITHIN),
                lambda: Output(f"PERCENTILE_CONT(0.75) WITHIN GROUP (ORDER BY {x})", "quantile", x, 0.75, WITHIN),
                lambda: Output(f"QUANTILE_DISC({x}, 0.5)", "quantile", x, 0.5, WITHIN),
                lambda: Output(f"SUM(DISTINCT {x})", "exact"),
                lambda: Output(f"AVG(DISTINCT {x})", "exact", empty=NULL),
            ]
        if kind != "float":  # as text, a sum of doubles is exact only on the grid (a per-unit AVG is not)
            choices.append(lambda: Output(f"CAST(SUM({x}) AS VARCHAR)", "exact", empty="0"))
        if kind == "int":
            choices += [lambda: Output(f"SUM({x}) // 7", "exact"), lambda: Output(f"SUM({x} * 2)", "exact"),
                        lambda: Output(f"COUNT(DISTINCT {x})", "exact"), lambda: Output(f"SUM({x} * 1.5)", "exact"),
                        lambda: Output(f"COUNT(DISTINCT {x}) FILTER (WHERE {x} > 5)", "exact")]
        return [r.choice(choices)() for _ in range(r.randint(1, 3))]

    def query(self) -> Case:
        r = self.rng
        source = r.choice(self.sources)
        outputs = self.outputs(source)
        keys = [r.choice(source.keys)] if r.random() < 0.75 else []
        group = f" GROUP BY {keys[0]}" if keys else ""
        if keys and len(source.keys) > 1 and r.random() < 0.2:  # issue 36: several groupings of two keys
            keys = r.sample(source.keys, 2)
            a, b = (f"({key})" if " " in key else key for key in keys)  # sqlglot parses ROLLUP of names or (x)
            group = " GROUP BY " + r.choice([f"ROLLUP ({a}, {b})", f"CUBE ({a}, {b})", f"GROUPING SETS (({a}), "
                                             f"({b}), ())", f"{a}, ROLLUP ({b})"])
        named = [f"{key} AS k{i}" for i, key in enumerate(keys)]
        items = named + [f"{o.sql} AS o{i}" for i, o in enumerate(outputs)]
        conditions = [r.choice(source.conditions)] if r.random() < 0.5 or source.shape == "semi/anti-join" else []
        conditions += [source.joined_by] if source.joined_by else []
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        head = f"{source.with_}SELECT "
        tail = f" FROM {source.from_}{where}{group}"
        # The same query with each quantile's (MIN's, MAX's) item replaced by the sorted non-NULL values it reads
        # and the group's row count appended: what the documented differences are checked against.
        listed = [f"list({o.argument} ORDER BY {o.argument}) FILTER (WHERE {o.argument} IS NOT NULL)"
                  if o.kind != "exact" else o.sql for o in outputs]
        facts = named + [f"{s} AS o{i}" for i, s in enumerate(listed)] + ["COUNT(*)"]
        return Case(head + ", ".join(items) + tail, head + ", ".join(facts) + tail, source.shape, len(keys), outputs)


@dataclass
class Case:
    sql: str
    facts: str  # the companion query (Generator.query)
    shape: str
    keys: int  # the group keys the query selects first (0: not grouped)
    outputs: list[Output]


# The comparison ---------------------------------------------------------------------------------------------------

@dataclass
class Summary:
    queries: int = 0
    exact: int = 0  # every cell and type equal to DuckDB's (within the documented differences)
    cells: int = 0
    exact_cells: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)
    differences: list[tuple[str, str]] = field(default_factory=list)  # (query, first difference)
    documented: Counter = field(default_factory=Counter)  # documented difference -> cells checked as such
    shapes: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)  # outputs by what they use (FEATURES)
    kinds: Counter = field(default_factory=Counter)  # why cells differed

    def lines(self) -> list[str]:
        lines = [f"{self.queries} queries ({', '.join(f'{n} {s}' for s, n in sorted(self.shapes.items()))}): "
                 f"{self.exact} answered exactly as DuckDB, {len(self.differences)} differ, "
                 f"{len(self.refused)} refused; {self.exact_cells} of {self.cells} cells equal",
                 "outputs using " + ", ".join(f"{f} {n}" for f, n in sorted(self.calls.items())),
                 "documented differences checked: " + (", ".join(f"{n} {d}" for d, n in
                                                                  sorted(self.documented.items())) or "none")]
        if self.kinds:
            lines.append("differences: " + ", ".join(f"{n} {k}" for k, n in self.kinds.most_common()))
        lines += [f"  DIFFERS {sql}\n          {why}" for sql, why in self.differences[:20]]
        lines += [f"  REFUSED {sql}\n          {why}" for sql, why in self.refused[:10]]
        return lines


def _equal(ours: Any, theirs: Any) -> bool:
    if ours is None or theirs is None:
        return ours is theirs
    if isinstance(theirs, float) and isinstance(ours, float):
        if math.isnan(theirs) or math.isnan(ours):
            return math.isnan(theirs) and math.isnan(ours)
        return math.isclose(ours, theirs, rel_tol=RELATIVE, abs_tol=RELATIVE)
    return type(ours) is type(theirs) and ours == theirs


def _bracket(values: list[Any], output: Output, width: float, low: float, high: float) -> tuple[float, float]:
    """Where the documented quantile (MIN, MAX) lies: between the values DuckDB interpolates between (the bounds
    and the extreme for MIN and MAX), widened by the grid's width."""
    if output.kind == "min":
        return low, float(values[0]) + width
    if output.kind == "max":
        return float(values[-1]) - width, high
    position = output.fraction * (len(values) - 1)
    return float(values[math.floor(position)]) - width, float(values[math.ceil(position)]) + width


class Comparison:
    """One case: dpsql's answer against DuckDB's, cell by cell."""

    def __init__(self, session: PrivateSession, con: duckdb.DuckDBPyConnection, case: Case,
                 summary: Summary) -> None:
        self.session, self.con, self.case, self.summary = session, con, case, summary
        self.problems: list[str] = []

    def run(self) -> None:
        case, summary = self.case, self.summary
        summary.queries += 1
        summary.shapes[case.shape] += 1
        summary.calls.update(f for o in case.outputs for f in FEATURES if f in o.sql)
        if case.keys > 1:
            summary.calls["GROUPING SETS"] += 1  # ROLLUP, CUBE or GROUPING SETS of two keys
        try:
            prepared = self.session.prepare(case.sql)
            ours = self.session.execute(case.sql)
        except Error as exc:
            summary.refused.append((case.sql, str(exc).splitlines()[0]))
            return
        try:
            relation = self.con.sql(case.sql)
        except duckdb.Error as exc:
            self._differs(f"answered, where DuckDB refuses: {str(exc).splitlines()[0]}", "DuckDB refuses")
            summary.differences.append((case.sql, self.problems[0]))
            return
        types = [str(t) for t in relation.types]
        theirs = relation.fetchall()
        facts = {self._key(row): row for row in self.con.sql(case.facts).fetchall()}
        for column, kind in zip(ours.columns, types, strict=True):
            if column.type != kind:
                self._differs(f"type of {column.name}: {column.type}, DuckDB {kind}", "type")
        plan = prepared.plan
        found = {self._key(row): row for row in ours.rows}
        for key, row in found.items():
            if key in facts:
                self._compare(row, next(r for r in theirs if self._key(r) == key), facts[key], plan)
            else:
                self._empty_group(row, plan)
        threshold = plan.selection.threshold if plan.selection is not None else None
        for key, fact in facts.items():
            if key not in found:
                if threshold is not None and fact[-1] < threshold:
                    summary.documented["groups below the partition-selection threshold"] += 1
                else:
                    self._differs(f"group {key} missing ({fact[-1]} rows)", "missing group")
        if not self.problems:
            summary.exact += 1
        else:
            summary.differences.append((case.sql, self.problems[0]))

    def _key(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(row[:self.case.keys])

    def _cells(self) -> list[tuple[int, Output]]:
        offset = self.case.keys
        return [(offset + i, output) for i, output in enumerate(self.case.outputs)]

    def _compare(self, ours: tuple, theirs: tuple, facts: tuple, plan: Any) -> None:
        for i, output in self._cells():
            self.summary.cells += 1
            if output.kind == "exact":
                if _equal(ours[i], theirs[i]):
                    self.summary.exact_cells += 1
                else:
                    self._differs(f"{output.sql}: {ours[i]!r}, DuckDB {theirs[i]!r}", f"value of {output.kind}")
                continue
            grid = self._grid(plan, i)
            low, high = _bracket(facts[i], output, float(grid.width), float(grid.low), float(grid.high))
            if ours[i] is not None and low <= float(ours[i]) <= high:
                self.summary.exact_cells += 1
                label = "MIN/MAX between the bound and the extreme" if output.kind != "quantile" else \
                    "quantiles within the grid's resolution"
                self.summary.documented[label] += 1
            else:
                self._differs(f"{output.sql}: {ours[i]!r} not in [{low}, {high}] (DuckDB {theirs[i]!r})",
                              f"value of {output.kind}")

    def _empty_group(self, ours: tuple, plan: Any) -> None:
        for i, output in self._cells():
            self.summary.cells += 1
            value = ours[i]
            if output.empty == WITHIN:
                grid = self._grid(plan, i)
                fine = value is not None and float(grid.low) <= float(value) <= float(grid.high)
            else:
                fine = value == output.empty and (value is None) == (output.empty is None)
            if fine:
                self.summary.exact_cells += 1
                self.summary.documented["cells of empty declared groups"] += 1
            else:
                self._differs(f"{output.sql} in an empty declared group: {value!r}, expected {output.empty!r}",
                              "empty group")

    def _grid(self, plan: Any, output: int) -> Any:
        recipe = plan.recipes[plan.query.output_aggregate[output]]
        return plan.measurements[recipe.count].spec.grid

    def _differs(self, problem: str, kind: str) -> None:
        self.problems.append(problem)
        self.summary.kinds[kind] += 1


def compare(folder: Path, queries: int, seed: int) -> Summary:
    policy = write_data(folder, seed)
    con = plain_duckdb(folder)
    session = open_session(policy, seed, "analyst")
    summary = Summary()
    generator = Generator(random.Random(seed))
    try:
        for _ in range(queries):
            Comparison(session, con, generator.query(), summary).run()
    finally:
        session.close()
        con.close()
    return summary


def main() -> None:
    args = options(__doc__, queries=2000, seed=29)
    with scratch() as folder:
        print("\n".join(compare(folder, args.queries, args.seed).lines()))


if __name__ == "__main__":
    main()

