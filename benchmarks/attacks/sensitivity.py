"""Sensitivity edge cases: does one unit move each measurement by at most the sensitivity the plan reports?

A measurement is the exact integer vector (one cell per group) that the noise is added to. For a dataset D and
D minus one unit, the bounded SQL runs on both with the same bounding seed; the change of each measurement
summed over groups (L1, what Laplace noise is calibrated to; L2 for Gaussian) must not exceed
`Measurement.sensitivity`. The datasets that matter are the awkward ones: float sums whose rounding depends on
the order (1e16, 1, -1e16, 1), values near the BIGINT limits, huge and tiny doubles, NaN, infinities and NULLs
in numeric columns, NULL in the unit column, a unit with very many rows, empty tables and empty groups.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from benchmarks.attacks.sampling import measure
from benchmarks.attacks.script import options, scratch
from benchmarks.support import DEFAULT_BUDGET, Budget, Table, column, open_session, write_dataset
from dpsql.dp.mechanisms import GaussianMechanism
from dpsql.planning.plan import QueryPlan

QUERIES = (
    "SELECT COUNT(*) FROM t",
    "SELECT COUNT(x), COUNT(k) FROM t",
    "SELECT COUNT(DISTINCT uid) FROM t",
    "SELECT SUM(x), SUM(k) FROM t",
    "SELECT AVG(x), AVG(k) FROM t WHERE flag",
    "SELECT VARIANCE(x), STDDEV(k) FROM t",
    "SELECT g, COUNT(*), SUM(x), AVG(k) FROM t GROUP BY g",
    "SELECT h, COUNT(*), SUM(k) FROM t GROUP BY h",
    "SELECT g, COUNT(DISTINCT uid), SUM(x - k) FROM t WHERE k > 0 OR x IS NULL GROUP BY g",
    "SELECT SUM(x * 2), SUM(k / 3), SUM(CASE WHEN x > 0 THEN k ELSE -k END) FROM t",
    "SELECT SUM(x + 1), SUM(-x), AVG(ROUND(x, 2)) FROM t WHERE NOT flag OR flag IS NULL",
)

BIG = 1.7976931348623157e308
EDGE_FLOATS = (1e16, -1e16, 1.0, -1.0, 0.0, -0.0, 0.1, 1e-300, -1e-300, 5e-324, BIG, -BIG, math.inf, -math.inf,
               math.nan, None, 2.0**53, 2.0**53 + 2, 1e14, -1e14)
EDGE_INTS = (2**63 - 1, -(2**63), 0, 1, -1, 2**53 + 1, -(2**53) - 1, 10**15, None)
FLOAT_BOUNDS = ((-1e14, 1e14), (0.0, 1.0), (-1e-300, 1e-300), (1e13, 1e14), (-5.0, -5.0))
INT_BOUNDS = ((-1e14, 1e14), (0.0, 100.0), (-3.0, 7.0))


def table(x_bounds: tuple[float, float], k_bounds: tuple[float, float], max_rows: int) -> Table:
    return Table("t", "uid", (
        column("uid", "int"), column("g", "text", values=("a", "b")), column("h", "text"), column("flag", "bool"),
        column("x", "float", *x_bounds), column("k", "int", *k_bounds)), max_rows)


@dataclass(frozen=True)
class Change:
    label: str
    l1: int
    l2: float
    sensitivity: int
    gaussian: bool

    @property
    def holds(self) -> bool:
        return (self.l2 if self.gaussian else self.l1) <= self.sensitivity

    def __str__(self) -> str:
        norm = "L2" if self.gaussian else "L1"
        return f"{self.label}: {norm} change {self.l2 if self.gaussian else self.l1} vs sensitivity {self.sensitivity}"


def changes(plan: QueryPlan, full: Sequence[tuple], without: Sequence[tuple]) -> list[Change]:
    """Per measurement, the change over all groups between two exact results of the same bounded SQL."""
    k = len(plan.query.keys)
    a = {tuple(r[:k]): r[k:] for r in full}
    b = {tuple(r[:k]): r[k:] for r in without}
    out = []
    for j, m in enumerate(plan.measurements):
        diffs = [int(a.get(g, [0] * (j + 1))[j] or 0) - int(b.get(g, [0] * (j + 1))[j] or 0) for g in set(a) | set(b)]
        out.append(Change(m.spec.label, sum(abs(d) for d in diffs), math.sqrt(sum(d * d for d in diffs)),
                          m.sensitivity, isinstance(m.mechanism, GaussianMechanism)))
    return out


def neighbour_changes(folder: Path, spec: Table, rows: Sequence[Sequence[Any]], removed: Any, sql: str,
                      budget: Budget = DEFAULT_BUDGET, seed: int = 1) -> list[Change]:
    """Load D and D without every row of unit `removed` (None: the rows whose unit is NULL); compare."""
    full = write_dataset(folder / "full", spec, rows, budget)
    without = write_dataset(folder / "without", spec, [r for r in rows if r[0] != removed], budget)
    return [change for _, change in _compare(full, without, [sql], seed)]


def _compare(full: Path, without: Path, queries: Sequence[str], seed: int) -> list[tuple[str, Change]]:
    sessions = [open_session(full, seed), open_session(without, seed)]
    try:
        out = []
        for sql in queries:
            measured = measure(sessions[0], sql, epsilon=1.0)
            neighbour = sessions[1].engine.run(measured.bounded_sql)
            out += [(sql, c) for c in changes(measured.plan, measured.rows, neighbour)]
        return out
    finally:
        for session in sessions:
            session.close()


def heavy_unit_changes(folder: Path, rows: int, queries: Sequence[str] = QUERIES) -> list[tuple[str, Change]]:
    """A unit with `rows` rows (written by DuckDB itself, fast) among ordinary ones, then removed."""
    spec = table(FLOAT_BOUNDS[0], INT_BOUNDS[1], 3)
    others = [(u, "ab"[u % 2], "h", u % 3 == 0, float(u), u) for u in range(2, 40)]
    without = write_dataset(folder / "without", spec, others)
    full = write_dataset(folder / "full", spec, others)
    data = full.parent / "t.csv"
    combined = full.parent / "combined.csv"
    con = duckdb.connect()
    try:
        heavy = ("SELECT 1 AS uid, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END AS g, 'h' || (i % 5) AS h, "
                 "i % 3 = 0 AS flag, CASE WHEN i % 7 = 0 THEN 1e16 ELSE i * 1e9 END AS x, i AS k FROM range(?) r(i)")
        con.execute(f"COPY (SELECT * FROM read_csv(?) UNION ALL {heavy}) TO ? (HEADER)",
                    [str(data), rows, str(combined)])
    finally:
        con.close()
    combined.replace(data)
    return _compare(full, without, queries, seed=1)


def random_dataset(chooser: random.Random) -> tuple[Table, list[tuple], Any]:
    """For the script: a dataset of awkward values, and the unit to remove."""
    spec = table(chooser.choice(FLOAT_BOUNDS), chooser.choice(INT_BOUNDS), chooser.randint(1, 3))
    units = [None, *range(chooser.randint(0, 6))]
    rows = [(chooser.choice(units), chooser.choice(["a", "b", "c", None]), chooser.choice(["h1", "h2", None]),
             chooser.choice([True, False, None]), chooser.choice(EDGE_FLOATS), chooser.choice(EDGE_INTS))
            for _ in range(chooser.randint(0, 40))]
    return spec, rows, chooser.choice(units)


def main() -> None:
    args = options(__doc__, datasets=300, heavy_rows=1_000_000, seed=23)
    chooser = random.Random(args.seed)
    checked, failures, worst = 0, [], 0.0
    with scratch() as folder:
        for i in range(args.datasets):
            spec, rows, removed = random_dataset(chooser)
            sql = chooser.choice(QUERIES)
            for change in neighbour_changes(folder / str(i), spec, rows, removed, sql, seed=i):
                checked += 1
                worst = max(worst, change.l1 / change.sensitivity if change.sensitivity else 0.0)
                if not change.holds:
                    failures.append(f"{sql}: {change}")
        print(f"sensitivity: {args.datasets} random awkward datasets, {checked} measurements checked, "
              f"largest change / sensitivity {worst:.3f}, {len(failures)} violations")
        print("\n".join(f"  VIOLATION {f}" for f in failures[:20]))
        heavy = heavy_unit_changes(folder / "heavy", args.heavy_rows)
        bad = [f"{sql}: {c}" for sql, c in heavy if not c.holds]
        print(f"  a unit with {args.heavy_rows} rows: {len(heavy)} measurements, {len(bad)} violations, largest "
              f"change {max(c.l1 for _, c in heavy)} (sensitivities up to {max(c.sensitivity for _, c in heavy)})")
        print("\n".join(f"  VIOLATION {b}" for b in bad))


if __name__ == "__main__":
    main()
