"""Attack on per-unit aggregation: SUM and AVG in a per-unit subquery were float sums (`CAST(SUM(clamped double)
AS DOUBLE)`), whose rounding depends on the order DuckDB adds a unit's rows in. That order is not the unit's own:
with several threads a unit whose rows straddle two morsels gets two partial sums combined in scheduling order,
and which units straddle depends on how many rows come before them, i.e. on other units (Casacuberta et al. 2022).
A condition on the per-unit value at a rounding boundary (`WHERE s > 0.6` with each unit's rows 0.1, 0.2, 0.3)
then moves with other people's rows.

Found (red team 6a): 200,000 units with rows 0.1, 0.2, 0.3, `SELECT COUNT(*) FROM (SELECT pid, SUM(x) AS s FROM t
GROUP BY pid) p WHERE s > 0.6` on 2 threads, 12 runs each: {133531, 133533} with every unit, {133529, 133530}
without unit 5: removing one unit moved the count by up to 4, its sensitivity being 1; and the same data gave two
answers. Even on one thread two units with the same rows got different sums (their rows are added in the order of
the secret row hash), so a unit's derived value was not a function of its rows as a multiset.

Fixed: per-unit SUM and AVG add the rows' fixed-point integers (dp/fixedpoint.py) exactly in HUGEINT, as every
released sum does, and turn the exact total into a DOUBLE once: the same rows give the same value in any order.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.support import open_session, write_csv, write_policy

UNITS = 600
QUERIES = {
    "SELECT COUNT(*) FROM (SELECT pid, SUM(x) AS s FROM t GROUP BY pid) p WHERE s > 0.6": None,
    "SELECT COUNT(*) FROM (SELECT pid, AVG(x) AS a FROM t GROUP BY pid) p WHERE a > 0.2": None,
    "SELECT COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid HAVING SUM(x) > 0.6) p": None,
}


def _policy(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    order = random.Random(seed)
    rows = []
    for pid in range(UNITS):
        values = [0.1, 0.2, 0.3]
        order.shuffle(values)  # the rows of a unit in any order in the file: the same multiset
        rows += [(pid, v) for v in values]
    write_csv(folder / "t.csv", ["pid", "x"], rows)
    return write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 3,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": -5, "upper": 10}}}},
        {"epsilon": 1e9, "delta": 1e-3, "query_epsilon": 1.0, "query_delta": 1e-6})


@pytest.mark.parametrize("sql", list(QUERIES))
@pytest.mark.parametrize("seed", [1, 2])
def test_units_with_the_same_rows_get_the_same_per_unit_value(tmp_path, sql, seed) -> None:
    """Every unit has the rows 0.1, 0.2, 0.3: a per-unit value that is a function of the unit's rows is the same
    for all of them, so a condition on it keeps all units or none, whatever the order of the additions."""
    session = open_session(_policy(tmp_path, seed), seed, threads=1)
    try:
        prepared = session.prepare(sql)
        ((count,),) = session.measure(prepared)
    finally:
        session.close()
    assert count in (0, UNITS), (sql, count)


def test_the_per_unit_sum_is_the_same_on_every_run_with_threads(tmp_path) -> None:
    """Several threads, rows enough for several morsels: the exact measurement is the same every time."""
    folder = tmp_path / "big"
    folder.mkdir()
    units = 60_000
    write_csv(folder / "t.csv", ["pid", "x"], [(pid, v) for pid in range(units) for v in (0.1, 0.2, 0.3)])
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 3,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": -5, "upper": 10}}}})
    session = open_session(policy, 3, threads=2)
    try:
        prepared = session.prepare("SELECT COUNT(*) FROM (SELECT pid, SUM(x) AS s FROM t GROUP BY pid) p "
                                   "WHERE s > 0.6")
        counts = {session.measure(prepared)[0][0] for _ in range(4)}
    finally:
        session.close()
    assert counts in ({0}, {units}), counts


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM (SELECT pid, MIN(x) AS lo FROM t GROUP BY pid) p WHERE CAST(lo AS TEXT) = '-0.0'",
    "SELECT COUNT(*) FROM (SELECT pid, MAX(x) AS hi FROM t GROUP BY pid) p WHERE CAST(hi AS TEXT) = '-0.0'",
    "SELECT COUNT(*) FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid HAVING CAST(MIN(x) AS TEXT) = '-0.0') p",
])
def test_per_unit_min_and_max_do_not_depend_on_the_order_of_tied_zeros(tmp_path, sql) -> None:
    """-0.0 and 0.0 tie, and DuckDB's MIN/MAX keep the one met first: with rows -0.0 and 0.0 in every unit, the
    text of the per-unit MIN was '-0.0' for 12 of 600 units and '0.0' for the others (the order of the rows;
    on several threads, other units' rows). Now the same for every unit."""
    folder = tmp_path / "zeros"
    folder.mkdir()
    write_csv(folder / "t.csv", ["pid", "x"], [(pid, v) for pid in range(UNITS) for v in ("-0.0", "0.0")])
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": -5, "upper": 10}}}})
    session = open_session(policy, 1, threads=1)
    try:
        ((count,),) = session.measure(session.prepare(sql))
    finally:
        session.close()
    assert count in (0, UNITS), (sql, count)
