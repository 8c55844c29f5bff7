"""Attack on `per_unit` columns: -0.0 and 0.0 are one value to the load check (COUNT(DISTINCT) sees one value),
but a vetted filter tells them apart (`1/y` is +inf or -inf, `CAST(y AS TEXT)` is '0.0' or '-0.0'). Such a filter
splits a unit, so the load-time rank (`__dp_rank <= m`, over all of the unit's rows) keeps fewer of the unit's
filtered rows than re-ranking them would: a different answer than the re-ranking path, contrary to the claim that
the two agree when the load check passes. Privacy held (each unit still kept at most m rows); the answer did not.
Fixed: the load check compares the values' text, so a unit with -0.0 and 0.0 in a per_unit column fails the load.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from benchmarks.support import write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import PolicyError
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, plan
from dpsql.policy import Accounting, MechanismKind, load_policy
from dpsql.rewrite.passes import rewrite
from dpsql.sql.parse import parse

# unit 1 has y = 0.0 and y = -0.0 on alternate rows (one value to the load check), unit 2 one row of 0.0
ROWS = [(1, "0.0", 1.0), (1, "-0.0", 2.0), (1, "0.0", 3.0), (1, "-0.0", 4.0), (2, "0.0", 5.0)]


def _write(folder: Path, per_unit: bool, rows: list[tuple]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "t.csv", ["pid", "y", "x"], rows)
    return write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
        "columns": {"pid": {"type": "int"}, "y": {"type": "float", "lower": -1, "upper": 1, "per_unit": per_unit},
                    "x": {"type": "float", "lower": 0, "upper": 10}}}})


def _count(policy_path: Path, sql: str) -> tuple[int, int]:
    policy = load_policy(policy_path)
    query_plan = plan(check(parse(sql), policy, VOCABULARY),
                      Budget(Fraction(1), Fraction(1, 10**8), Accounting.PURE, MechanismKind.LAPLACE))
    engine = DuckDBEngine(policy, bounding_seed=1)
    try:
        rows = engine.run(rewrite(query_plan).sql)
    finally:
        engine.close()
    return rows[0][0], query_plan.measurements[0].sensitivity


def test_a_unit_with_negative_and_positive_zero_fails_the_per_unit_check(tmp_path) -> None:
    with pytest.raises(PolicyError, match="key 'columns.y': declared per_unit = true, but some unit"):
        DuckDBEngine(load_policy(_write(tmp_path / "fast", True, ROWS)))


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM t WHERE 1 / y > 0",
                                 "SELECT COUNT(*) FROM t WHERE CAST(y AS TEXT) = '-0.0'"])
def test_whole_units_with_negative_zero_give_the_re_ranking_answer(tmp_path, sql) -> None:
    """Units that do hold one value each (-0.0 for one, 0.0 for the other) pass the check, and the load-time cap
    gives the answer re-ranking gives."""
    rows = [(1, "-0.0", 1.0), (1, "-0.0", 2.0), (1, "-0.0", 3.0), (2, "0.0", 5.0), (2, "0.0", 6.0), (2, "0.0", 7.0)]
    load_time_cap, sensitivity = _count(_write(tmp_path / "fast", True, rows), sql)
    re_ranked, _ = _count(_write(tmp_path / "slow", False, rows), sql)
    assert load_time_cap == re_ranked and sensitivity == 2
