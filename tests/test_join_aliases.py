"""Red team 6a: a join whose alias starts with the reserved prefix (`__`, or `_`, which makes `__` with the
separator) sent the relation's column naming into an endless loop: a column name shared by two tables is
prefixed with the alias until it is not reserved, and with such an alias it always was. The checker then spun
forever on one CPU before anything was charged (`SELECT COUNT(*) FROM t AS __a JOIN u ON __a.pid = u.pid`): on
the server a query still being planned cannot be cancelled, so each such query held a worker for good.
Fixed: a prefix that would make a reserved name falls back to `t<index>`.

The loop is counted, not timed: the relation module's `names` is wrapped so that reading the reserved prefix
more than a few thousand times fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import open_session, write_csv, write_policy
from dpsql.analysis import relation
from dpsql.sql import names


class _CountingNames:
    def __init__(self) -> None:
        self.reads = 0

    def __getattr__(self, attribute: str):
        if attribute == "RESERVED_PREFIX":
            self.reads += 1
            if self.reads > 5000:
                raise AssertionError("the relation's column naming does not terminate")
        return getattr(names, attribute)


def _policy(folder: Path) -> Path:
    write_csv(folder / "t.csv", ["pid", "city", "x"], [(1, "a", 1.0), (2, "b", 2.0)])
    write_csv(folder / "u.csv", ["pid", "city"], [(1, "a"), (2, "b")])
    write_csv(folder / "look.csv", ["city", "w"], [("a", 1), ("b", 2)])
    return write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "city": {"type": "text"},
                          "x": {"type": "float", "lower": 0, "upper": 5}}},
        "u": {"source": "u.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
              "columns": {"pid": {"type": "int"}, "city": {"type": "text"}}},
        "look": {"source": "look.csv", "public": True, "columns": {"city": {"type": "text"}, "w": {"type": "int"}}}},
        {"epsilon": 100.0, "delta": 1e-6, "query_epsilon": 1.0, "query_delta": 1e-8})


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t AS __a JOIN u ON __a.pid = u.pid",
    "SELECT COUNT(*), SUM(__dp_t0.x) FROM t AS __dp_t0 JOIN look l ON __dp_t0.city = l.city",
    "SELECT l.w, COUNT(*) FROM t AS _ JOIN look l ON _.city = l.city GROUP BY l.w",
    "SELECT COUNT(*) FROM t JOIN t AS __b ON t.pid = __b.pid",
])
def test_a_join_with_a_reserved_looking_alias_is_planned(tmp_path, monkeypatch, sql) -> None:
    monkeypatch.setattr(relation, "names", _CountingNames())
    session = open_session(_policy(tmp_path), 1)
    try:
        prepared = session.prepare(sql)
    finally:
        session.close()
    relation_columns = prepared.plan.query.table.columns
    assert not any(name.startswith(names.RESERVED_PREFIX) for name in relation_columns)
