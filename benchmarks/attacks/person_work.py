"""What the static per-person work bound (dpsql/analysis/person_work.py) allows, measured: how much slower one
person makes an admitted query, and how many nanoseconds a unit of the model takes.

Two worlds: the base (PEOPLE people, m = 5 rows each, a 1,000-character text) and the same plus one adversarial
person with HEAVY rows that make every admitted shape as costly as it can be (they pass every filter, hit the public
table's most repeated key, carry the longest text). For each shape (queries at or near the bound: a cheap filter
whose look-ahead reads many of a heavy person's rows, a costly LIKE, joins, a per-unit subquery, quantiles, COUNT
DISTINCT), the median time of the stages that read the data (engine, noise, post-processing) in each world,
alternating, and the difference over the model's units for one person: ns per unit. Also QUERY_FLOOR's figure:
the smallest query end to end.

`python -m benchmarks.attacks.person_work [--runs 41]`; timing is reported here only, never asserted in a test.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from benchmarks.attacks.script import options, scratch
from benchmarks.support import create_ledger, open_session, write_csv, write_policy
from dpsql.analysis.person_work import QUERY_FLOOR
from dpsql.errors import QueryRejected
from dpsql.session import PrivateSession

PEOPLE, M, HEAVY = 300, 5, 2000
LONG = "ab" * 500
SHAPES = {  # each admitted at the default bound, near it (shorter patterns where the rows multiply)
    "cheap filter, long look-ahead": "SELECT COUNT(*) FROM people WHERE tag >= 0",
    "costly LIKE filter": "SELECT COUNT(*) FROM people WHERE note LIKE '%a_b%z%'",
    "costly argument": "SELECT SUM(CASE WHEN note LIKE '%a_b%zz_%' THEN 1 ELSE 0 END) FROM people",
    "private join": "SELECT SUM(CASE WHEN p.note LIKE '%z%' THEN 1 ELSE 0 END) FROM people p JOIN visits v "
                    "ON v.pid = p.pid",
    "public join": "SELECT COUNT(*), SUM(CASE WHEN p.note LIKE '%z%' THEN 1 ELSE 0 END) FROM people p JOIN pairs a "
                   "ON a.band = p.band",
    "per-unit subquery": "SELECT AVG(n) FROM (SELECT pid, SUM(CASE WHEN note LIKE '%a_b%z%' THEN 1 ELSE 0 END) AS n "
                         "FROM people GROUP BY pid) AS u",
    "quantiles": "SELECT MEDIAN(tag), QUANTILE_CONT(tag, 0.9) FROM people WHERE note LIKE '%z%'",
    "COUNT(DISTINCT)": "SELECT COUNT(DISTINCT REPLACE(note, 'a', 'b')) FROM people",
    "groups one person adds": "SELECT tag, COUNT(*), SUM(cost), AVG(cost) FROM people JOIN visits v USING (pid) "
                              "GROUP BY tag",
}


def write_world(folder: Path, adversary: bool) -> Path:
    chooser = random.Random(9)
    rows = [(pid, LONG, chooser.randint(0, 100), pid % 2) for pid in range(PEOPLE) for _ in range(M)]
    if adversary:  # one more person: many rows, each passing every filter, on the most repeated public key
        rows += [(PEOPLE, LONG[:-2] + "zz", 1000 + i, 0) for i in range(HEAVY)]
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "people.csv", ["pid", "note", "tag", "band"], rows)
    write_csv(folder / "visits.csv", ["pid", "cost"], [(pid, 7.0) for pid in range(PEOPLE + 1) for _ in range(3)])
    write_csv(folder / "pairs.csv", ["band", "label"], [(b, f"l{i}") for b in (0, 1) for i in range(3)])
    return create_ledger(write_policy(folder / "policy.toml", {
        "people": {"source": "people.csv", "privacy_unit": "pid", "max_rows_per_unit": M, "columns": {
            "pid": {"type": "int"}, "note": {"type": "text"}, "tag": {"type": "int", "lower": 0, "upper": 5000},
            "band": {"type": "int"}}},
        "visits": {"source": "visits.csv", "privacy_unit": "pid", "max_rows_per_unit": 3, "columns": {
            "pid": {"type": "int"}, "cost": {"type": "float", "lower": 0, "upper": 100}}},
        "pairs": {"source": "pairs.csv", "public": True, "columns": {"band": {"type": "int"},
                                                                     "label": {"type": "text"}}},
    }, {"epsilon": 1e12}))


def answer_seconds(session: PrivateSession, sql: str) -> float:
    """The stages after the charge (engine, noise, post-processing): all that reads the data."""
    prepared = session.prepare(sql)
    spending = session.spending()
    start = time.perf_counter()
    session._answer(prepared, spending)
    return time.perf_counter() - start


def floor_seconds(session: PrivateSession, runs: int) -> float:
    """The smallest query, end to end (parse to answer), cached plan and all: what any query costs."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.execute("SELECT COUNT(*) FROM visits", epsilon=1.0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    args = options(__doc__, runs=41)
    with scratch() as folder:
        base, adversary = (open_session(write_world(folder / name, flag), 5, threads=1)
                           for name, flag in (("base", False), ("adversary", True)))
        try:
            floor = floor_seconds(base, args.runs)
            print(f"QUERY_FLOOR: the smallest query takes {floor * 1e3:.2f} ms end to end; the model counts it "
                  f"{QUERY_FLOOR:,} units ({floor * 1e9 / QUERY_FLOOR:.2f} ns per unit)")
            print("| shape | model units for one person | base ms | with the person ms | slowdown | ns per unit |")
            print("|---|---|---|---|---|---|")
            for name, sql in SHAPES.items():
                try:
                    units = base.prepare(sql).plan.query.work.total
                except QueryRejected as refused:
                    print(f"| {name} | refused: {str(refused)[:120]} | | | | |")
                    continue
                times: tuple[list[float], list[float]] = ([], [])
                for _ in range(args.runs):  # alternating, so that load on the machine falls on both alike
                    times[0].append(answer_seconds(base, sql))
                    times[1].append(answer_seconds(adversary, sql))
                low, high = statistics.median(times[0]), statistics.median(times[1])
                print(f"| {name} | {units:,} | {low * 1e3:.2f} | {high * 1e3:.2f} | {high / low:.2f}x | "
                      f"{(high - low) * 1e9 / units:.2f} |")
        finally:
            base.close()
            adversary.close()


if __name__ == "__main__":
    main()
