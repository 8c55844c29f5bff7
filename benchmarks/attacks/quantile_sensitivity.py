"""Sensitivity of the quantile and per-group-bounded paths: does removing one unit move each measurement by at most
what its mechanism is calibrated to, also for the quantile's own bucket query?

sensitivity.py compares the bounded query's integer cells; a quantile's cell there is a placeholder, its counts
come from a separate query per argument (rewrite/quantile_buckets.py) merged by release/cells.with_buckets. Here
each dataset D and D minus one unit are measured through PrivateSession.measure (the bounded query and every
bucket query), and for each measurement the change summed over the groups a release can show (public keys outside
their declared values are never released) must not exceed: for a quantile, m (its mechanism's max_rows: every
group's utilities are calibrated to m max(q, 1 - q), so the bucket counts of all groups together may move by m);
for the others, the plan's L1 (Laplace) or L2 (Gaussian) sensitivity. The datasets mix per-group bounds
(max_groups_per_unit, max_rows_per_group), Laplace and Gaussian budgets, filters on per-unit and other columns,
NULL, NaN, infinities, -0.0 and values outside the bounds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.attacks.script import options, scratch
from benchmarks.support import open_session, write_csv, write_policy
from dpsql.dp.mechanisms import GaussianMechanism
from dpsql.planning.measurements import MeasurementKind
from dpsql.planning.plan import QueryPlan
from dpsql.rewrite.quantile_buckets import vector

COLUMNS = {"uid": {"type": "int"}, "g": {"type": "text", "values": ["a", "b"]}, "h": {"type": "text"},
           "x": {"type": "float", "lower": -10.0, "upper": 10.0}, "k": {"type": "int", "lower": 0, "upper": 20},
           "pu": {"type": "int", "per_unit": True}}
QUERIES = (
    "SELECT MEDIAN(x) FROM t",
    "SELECT g, MEDIAN(x), MAX(k), COUNT(*) FROM t GROUP BY g",
    "SELECT h, MIN(x), QUANTILE_CONT(k, 0.3), SUM(k) FROM t GROUP BY h",
    "SELECT g, h, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY x DESC) FROM t GROUP BY g, h",
    "SELECT g, MEDIAN(x) FROM t WHERE k > 5 GROUP BY g",
    "SELECT h, MEDIAN(x * 2), MAX(x) FROM t WHERE x IS NOT NULL OR k < 3 GROUP BY h",
    "SELECT h, MEDIAN(k) FROM t WHERE pu = 1 GROUP BY h",
    "SELECT g, COUNT(DISTINCT x), MEDIAN(k), COUNT(DISTINCT uid) FROM t GROUP BY g",
    "SELECT k > 10 AS big, MEDIAN(x) FROM t GROUP BY big",
    "SELECT h, COUNT(*), MEDIAN(x) FROM t WHERE h <> 'h1' GROUP BY h",
)
VALUES_X = (-20.0, -10.0, -0.0, 0.0, 1.5, 9.99, 10.0, 1e300, math.inf, -math.inf, math.nan, None, 3.3)
VALUES_K = (0, 5, 6, 11, 20, 99, -5, None)


def write(folder: Path, rows: Sequence[Sequence[Any]], max_rows: int, per_group: dict, budget: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "t.csv", list(COLUMNS), rows)
    table = {"source": "t.csv", "privacy_unit": "uid", "max_rows_per_unit": max_rows, **per_group,
             "columns": COLUMNS}
    return write_policy(folder / "policy.toml", {"t": table},
                        {"epsilon": 1000.0, "delta": 1e-6, "query_delta": 1e-8, **budget})


def changes(plan: QueryPlan, full: Sequence[tuple], without: Sequence[tuple]) -> list[tuple[str, float, int]]:
    """(measurement, its change over the releasable groups, the bound it must respect) per measurement."""
    k = len(plan.query.keys)
    a, b = ({tuple(r[:k]): r[k:] for r in rows} for rows in (full, without))
    domains = [key.domain for key in plan.query.keys]
    groups = [g for g in a.keys() | b.keys() if all(d is None or v in d for v, d in zip(g, domains, strict=True))]
    out = []
    for j, m in enumerate(plan.measurements):
        diffs = []
        for g in groups:
            if m.spec.kind is MeasurementKind.QUANTILE:
                va, vb = (vector(side[g][j] if g in side else None, m.spec.grid) for side in (a, b))
                diffs += [p - q for p, q in zip(va, vb, strict=True)]
            else:
                diffs.append(int((a.get(g) or [0] * (j + 1))[j] or 0) - int((b.get(g) or [0] * (j + 1))[j] or 0))
        if m.spec.kind is MeasurementKind.QUANTILE:
            out.append((m.spec.kind.value, float(sum(abs(d) for d in diffs)), m.mechanism.max_rows))
        elif isinstance(m.mechanism, GaussianMechanism):
            out.append((m.spec.kind.value, math.sqrt(sum(d * d for d in diffs)), m.sensitivity))
        else:
            out.append((m.spec.kind.value, float(sum(abs(d) for d in diffs)), m.sensitivity))
    return out


def check_dataset(folder: Path, chooser: random.Random, seed: int) -> tuple[int, list[str], float]:
    """One random dataset and one removed unit, every query: (measurements checked, violations, worst ratio)."""
    m = chooser.randint(1, 4)
    per_group = {}
    if chooser.random() < 0.6:
        if chooser.random() < 0.7:
            per_group["max_groups_per_unit"] = chooser.randint(1, m)
        if chooser.random() < 0.7:
            per_group["max_rows_per_group"] = chooser.randint(1, m)
    budget = {"accounting": "zcdp", "mechanism": "gaussian"} if chooser.random() < 0.5 else {}
    units = list(range(chooser.randint(1, 6)))
    per_unit = {u: chooser.choice([0, 1]) for u in units}
    rows = [(u, chooser.choice(["a", "b", "c", None]), chooser.choice(["h1", "h2", "h3", None]),
             chooser.choice(VALUES_X), chooser.choice(VALUES_K), per_unit[u])
            for u in [chooser.choice(units) for _ in range(chooser.randint(0, 25))]]
    removed = chooser.choice(units)
    sessions = [open_session(write(folder / "full", rows, m, per_group, budget), seed),
                open_session(write(folder / "without", [r for r in rows if r[0] != removed], m, per_group, budget),
                             seed)]
    checked, bad, worst = 0, [], 0.0
    try:
        for sql in QUERIES:
            prepared = [s.prepare(sql, epsilon=1.0) for s in sessions]
            measured = [s.measure(p) for s, p in zip(sessions, prepared, strict=True)]
            for label, change, bound in changes(prepared[0].plan, *measured):
                checked += 1
                worst = max(worst, change / bound if bound else 0.0)
                if change > bound:
                    bad.append(f"{sql}: {label} moved {change} > {bound} (m {m}, {per_group}, {budget})")
    finally:
        for session in sessions:
            session.close()
    return checked, bad, worst


def run(datasets: int, seed: int, folder: Path) -> tuple[int, list[str], float]:
    chooser = random.Random(seed)
    total, failures, worst = 0, [], 0.0
    for i in range(datasets):
        checked, bad, ratio = check_dataset(folder / str(i), chooser, seed + i)
        total, failures, worst = total + checked, failures + bad, max(worst, ratio)
    return total, failures, worst


def main() -> None:
    args = options(__doc__, datasets=200, seed=7)
    with scratch() as folder:
        checked, failures, worst = run(args.datasets, args.seed, folder)
    print(f"quantile sensitivity: {args.datasets} datasets, {checked} measurements, largest change / bound "
          f"{worst:.3f}, {len(failures)} violations")
    print("\n".join(f"  VIOLATION {f}" for f in failures[:20]))


if __name__ == "__main__":
    main()
