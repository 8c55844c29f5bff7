"""Issue 7, classes 1 and 3: per-row errors that TRY does not absorb, and implicit casts the checker never saw.

Class 1 (errors TRY does not absorb). Some DuckDB functions raise, per row, an error of a kind TRY lets through:
- a LIKE pattern that ends with its ESCAPE character raises a SyntaxException only when matching reaches the end
  of the pattern: `'%\\'` reaches it on every row that gets to the LIKE, `'may%\\'` only on text that starts
  with 'may', so even a plain WHERE fails if and only if the target's text does;
- a date part DuckDB does not implement for DATE (`EXTRACT(timezone FROM d)`, `timezone_hour`, `timezone_minute`)
  raises a NotImplementedException per row: an empty table (the dry run) raises nothing.
Inside `CASE WHEN pid = ? AND smoker THEN <failing> END` the query fails if and only if the target smokes.

Class 3 (implicit casts). A text column where a boolean is expected (`WHERE code`) makes DuckDB cast it per row;
the checker took a bare column for something that cannot fail, so it was not even inside TRY, and the query fails
if and only if some row's text is not a boolean: here, the target's.

The two worlds differ in the target's row only: in world 1 the target smokes and its `code` is 'maybe'; in world 0
it does not and its code is 'true'. The game's bound is the one for two rows changed (2 epsilon), since a class 3
query counts the target in world 0. The fix (dpsql/analysis/typecheck.py) refuses every one of these from the text, the
same in both worlds, at no cost.
"""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.attacks.error_oracle import ErrorOracleReport, Probe, attack, scan, scan_lines
from benchmarks.attacks.people import TARGET, Worlds
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import success_bound
from benchmarks.support import DEFAULT_BUDGET, Table, column, write_dataset

PEOPLE = Table("people", "pid", (column("pid", "int"), column("smoker", "bool"), column("code", "text"),
                                 column("born", "date")))
IN_CASE = "SELECT COUNT(CASE WHEN pid = ? AND smoker THEN {probe} END) FROM people"
UNTRIED_ERRORS = {  # class 1
    "LIKE '%\\' ESCAPE '\\'": IN_CASE.format(probe="code LIKE '%\\' ESCAPE '\\'"),
    "ILIKE '%!' ESCAPE '!'": IN_CASE.format(probe="code ILIKE '%!' ESCAPE '!'"),
    "NOT LIKE '%#' ESCAPE '#'": IN_CASE.format(probe="CAST(pid AS TEXT) NOT LIKE '%#' ESCAPE '#'"),
    "WHERE LIKE 'may%\\' ESCAPE '\\'": "SELECT COUNT(*) FROM people WHERE code LIKE 'may%\\' ESCAPE '\\'",
    "EXTRACT(timezone FROM date)": IN_CASE.format(probe="EXTRACT(timezone FROM born)"),
    "EXTRACT(timezone_hour FROM date)": IN_CASE.format(probe="EXTRACT(timezone_hour FROM born)"),
    "EXTRACT(timezone_minute FROM date)": IN_CASE.format(probe="EXTRACT(timezone_minute FROM born)"),
}
IMPLICIT_CASTS = {  # class 3
    "WHERE text": "SELECT COUNT(*) FROM people WHERE code",
    "WHERE (text)": "SELECT COUNT(*) FROM people WHERE (code)",
    "WHERE ((text))": "SELECT COUNT(*) FROM people WHERE ((code))",
}
ORACLES = {**UNTRIED_ERRORS, **IMPLICIT_CASTS}
# Implicit casts that were inside TRY (so did not leak before) and that the checker now refuses from the text.
PROBES = (
    "pid IN (1, 'x')", "code = 1", "code > pid", "born = 'x' || code", "code IN ('a', 1)", "smoker = code",
    "CASE WHEN smoker THEN code ELSE 1 END = 1", "coalesce(code, pid) IS NULL", "least(born, code) IS NULL",
    "NOT code", "code AND smoker",
)


def write_worlds(folder: Path, people: int, seed: int) -> Worlds:
    chooser = random.Random(seed)
    others = [(pid, chooser.random() < 0.5, chooser.choice(("true", "false")),
               f"{chooser.randrange(1940, 2005)}-{chooser.randrange(1, 13):02d}-{chooser.randrange(1, 29):02d}")
              for pid in range(1, people)]
    target = ((TARGET, False, "true", "1970-01-01"), (TARGET, True, "maybe", "1970-01-01"))
    policies = tuple(write_dataset(folder / f"world{bit}", PEOPLE, [target[bit], *others], DEFAULT_BUDGET)
                     for bit in (0, 1))
    return Worlds(policies, sum(smoker for _, smoker, _, _ in others))


def run(worlds: Worlds, epsilon: float, rounds: int, seed: int) -> ErrorOracleReport:
    return attack(worlds, epsilon, rounds, seed, ORACLES)


def probes(worlds: Worlds, epsilon: float, seed: int) -> list[Probe]:
    return scan(worlds, epsilon, seed, PROBES)


def main() -> None:
    args = options(__doc__, people=100, epsilon=0.01, rounds=200, seed=17)
    with scratch() as folder:
        worlds = write_worlds(folder, args.people, args.seed)
        report = run(worlds, args.epsilon, args.rounds, args.seed)
        print("\n".join(report.lines()))
        print(f"  bound for two changed rows: {success_bound(2 * args.epsilon):.4f}")
        found = probes(worlds, args.epsilon, args.seed)
    print("\n".join(scan_lines(found, "row")))


if __name__ == "__main__":
    main()
