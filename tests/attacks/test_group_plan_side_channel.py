"""Red team 7: DuckDB picks its grouping operator (perfect hash or hash) from the key column's statistics, its
min and max over the whole stored table, which one row can move. A key whose range can exceed DuckDB's perfect
hash threshold (2**12) then gets a plan, and a time, that shows whether some row holds an extreme value: e.g. one
person with the 5,000th of 5,000 declared values. Coded keys (rewrite/passes._coded_keys) made text keys, always
hashed before, subject to it; the same holds for integer keys grouped by value since before the codes. Checked
deterministically on the plan's text (EXPLAIN), on two tables that differ in one row. Fixed by the engine's
configuration: no perfect hash tables, no compressed materialization (engines/duckdb_engine.py)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from benchmarks.support import write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse


def _plans(tmp_path, columns: dict, header: list[str], rows: list[tuple], queries: tuple[str, ...]) -> list[str]:
    write_csv(tmp_path / "t.csv", header, rows)
    policy = load_policy(write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
        "columns": {"pid": {"type": "int"}, **columns}}}))
    engine = DuckDBEngine(policy)
    budget = Budget(Fraction(1), Fraction(0), Accounting.PURE, MechanismKind.LAPLACE)
    try:
        found = []
        for query in queries:
            sql = rewrite(plan(check(parse(query), policy, VOCABULARY), budget)).sql
            text = engine._con.execute("EXPLAIN " + sql).fetchall()[0][1]
            # The operators in order, and each one's text but numbers (estimated cardinalities follow the data):
            # a perfect hash table, or keys narrowed by compressed materialization, change them.
            found.append(re.sub(r"\d+", "#", text))
        return found
    finally:
        engine.close()


def _same_plans(tmp_path, columns: dict, base: list[tuple], extra: tuple, queries: tuple[str, ...]) -> None:
    header = ["pid", *columns]
    (tmp_path / "without").mkdir()
    (tmp_path / "with").mkdir()
    without = _plans(tmp_path / "without", columns, header, base, queries)
    with_row = _plans(tmp_path / "with", columns, header, [*base, extra], queries)
    assert without == with_row


@pytest.mark.parametrize(("kind", "values"), [("text", [f"v{i}" for i in range(5000)]), ("int", list(range(5000)))],
                         ids=["coded text", "integer"])
def test_one_key_of_5000_values(tmp_path, kind: str, values: list) -> None:
    """One person with the 5,000th declared value: Perfect Hash Group By without the row, Hash Group By with it."""
    _same_plans(tmp_path, {"g": {"type": kind, "values": values}},
                [(pid, values[pid % 3000]) for pid in range(1, 3001)], (9999, values[-1]),
                ("SELECT g, COUNT(*) FROM t GROUP BY g", "SELECT g, COUNT(*) FROM t WHERE pid > 5 GROUP BY g"))


def test_two_coded_text_keys_of_300_values(tmp_path) -> None:
    """Two coded keys (SMALLINT codes, no TINYINT cast): the sum of their ranges' bits decides."""
    values = [f"v{i}" for i in range(300)]
    column = {"type": "text", "values": values}
    _same_plans(tmp_path, {"g": column, "h": column},
                [(pid, values[pid % 10], values[(pid // 10) % 10]) for pid in range(1, 1001)],
                (9999, values[-1], values[0]),
                ("SELECT g, h, COUNT(*) FROM t GROUP BY g, h",
                 "SELECT g, h, COUNT(*) FROM t WHERE pid > 5 GROUP BY g, h"))


def test_three_coded_text_keys_of_46_values(tmp_path) -> None:
    """TINYINT-cast codes too: their statistics follow the data through the cast, and three keys' bits add up."""
    values = [f"v{i}" for i in range(46)]
    column = {"type": "text", "values": values}
    _same_plans(tmp_path, {"g": column, "h": column, "k": column},
                [(pid, values[pid % 10], values[(pid // 10) % 10], values[(pid // 100) % 10])
                 for pid in range(1, 1001)],
                (9999, values[-1], values[-1], values[-1]),
                ("SELECT g, h, k, COUNT(*) FROM t GROUP BY g, h, k",
                 "SELECT g, h, k, COUNT(*) FROM t WHERE pid > 5 GROUP BY g, h, k"))
