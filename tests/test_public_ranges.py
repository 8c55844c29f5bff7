"""Red team 6a: a public table whose float column holds an infinity or values as large as 1e308 and -1e308 made
every join with that table fail with an uncaught OverflowError (an internal error, whatever the query reads): the
column's bounds came from its public min and max, and the fixed-point grid of an infinite range does not exist.
Public data only, so no privacy leak; but one value in a lookup table broke all of its joins. Now a public range
beyond the magnitude a policy may declare (1e15) gives no bound: the column is joined, filtered and grouped, and an
aggregate of it is refused with the reason (declare bounds in the policy).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import open_session, write_csv, write_policy
from dpsql.errors import QueryRejected


def _policy(folder: Path, values: list[str]) -> Path:
    write_csv(folder / "look.csv", ["city", "f"], list(zip("abc", values, strict=True)))
    write_csv(folder / "t.csv", ["pid", "city"], [(1, "a"), (2, "b")])
    return write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "city": {"type": "text"}}},
        "look": {"source": "look.csv", "public": True,
                 "columns": {"city": {"type": "text"}, "f": {"type": "float"}}}},
        {"epsilon": 100.0, "delta": 1e-6, "query_epsilon": 1.0, "query_delta": 1e-8})


@pytest.mark.parametrize("values", [["inf", "1", "2"], ["1e308", "-1e308", "1"], ["-inf", "0", "1"],
                                    ["2e15", "0", "1"]])
def test_a_public_column_with_a_huge_range_does_not_break_its_joins(tmp_path, values) -> None:
    session = open_session(_policy(tmp_path, values), 1)
    try:
        (count,), = session.execute("SELECT COUNT(*) FROM t JOIN look l ON t.city = l.city WHERE l.f > 0").rows
        assert count >= 0
        with pytest.raises(QueryRejected, match="needs bounds"):
            session.prepare("SELECT SUM(l.f) FROM t JOIN look l ON t.city = l.city")
    finally:
        session.close()


def test_a_public_column_within_range_keeps_its_bounds(tmp_path) -> None:
    session = open_session(_policy(tmp_path, ["1", "2.5", "-3"]), 1)
    try:
        prepared = session.prepare("SELECT SUM(l.f) FROM t JOIN look l ON t.city = l.city")
        column = prepared.plan.query.table.columns["f"]
        assert (column.lower, column.upper) == (-3.0, 2.5)
    finally:
        session.close()
