"""The unprotected baseline: the same data in plain DuckDB, exact answers, no noise and no budget.

It reads the CSV a dpsql policy declares, so baseline and dpsql answer from byte-identical data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from dpsql.policy import load_policy


class PlainDuckDB:
    def __init__(self, policy: Path) -> None:
        self._con = duckdb.connect(":memory:")
        for table in load_policy(policy).tables.values():
            self._con.execute(f"CREATE TABLE {table.name} AS SELECT * FROM read_csv(?, header = true)",
                              [table.source.pattern])

    def rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._con.execute(sql, list(parameters)).fetchall()

    def scalar(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        return self.rows(sql, parameters)[0][0]

    def close(self) -> None:
        self._con.close()
