"""Stage 7: the analyst's SELECT list, HAVING, ORDER BY and LIMIT, run over the noisy cells only.

Post-processing of DP outputs is free, so arithmetic between aggregates, filters on noisy values, ordering and
limits can use full SQL. It runs in its own sandboxed DuckDB that has never seen the private tables: the only
table there is `__noisy`, so even a checker bug could not make this stage read raw rows.

An output that is a monotone function of one aggregate (ROUND(AVG(x), 1), SUM(x) / 1000) gets its interval by
evaluating the same expression at the aggregate's interval ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AGG_PREFIX, KEY_PREFIX, NOISY_TABLE, OUT_PREFIX, AggregateKind, CheckedQuery
from dpsql.errors import ProgrammingError
from dpsql.release.cells import ReleasedCells
from dpsql.sql.lossless import canonical_select, to_python
from dpsql.sql.parse import DIALECT

_INTEGER_KINDS = (AggregateKind.COUNT, AggregateKind.COUNT_UNITS)
# Each released row's place in the order release() chose (data-independent). It is the last ORDER BY term of every
# post-processing query: DuckDB's sort is not stable (it reorders 40 tied rows even on one thread, and with several
# threads large inputs come back in different orders from run to run), so without it rows with equal noisy values,
# and the rows a LIMIT keeps, would be chosen by the sort's internals; with it, ties keep release()'s order and the
# output is a function of the released cells. Analyst SQL cannot name it: the checker lets the outer query read
# only __k and __a columns.
_POSITION = "__position"


@dataclass(frozen=True)
class FinalRows:
    rows: list[tuple[Any, ...]]
    intervals: list[tuple[tuple[float, float] | None, ...]]
    stds: list[tuple[float | None, ...]]
    types: list[str]  # DuckDB type of each output column


class PostProcessor:
    def __init__(self) -> None:
        self._con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                                       "autoload_known_extensions": "false"})
        self._con.execute("SET error_on_division_by_zero = false")  # a noisy count of 0 gives inf, not an error
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET lock_configuration = true")

    def run(self, query: CheckedQuery, key_types: list[str], cells: ReleasedCells) -> FinalRows:
        projection = _plain_projection(query)
        if projection is not None:
            return _project(query, projection, key_types, cells)
        self._con.register("__cells", _columns(query, cells))
        casts = [f"CAST({KEY_PREFIX}{i} AS {t}) AS {KEY_PREFIX}{i}" for i, t in enumerate(key_types)]
        casts.append(_POSITION)
        for j, call in enumerate(query.aggregates):
            kind = "BIGINT" if call.kind in _INTEGER_KINDS else "DOUBLE"
            casts.append(f"CAST(round({AGG_PREFIX}{j}) AS BIGINT) AS {AGG_PREFIX}{j}" if kind == "BIGINT"
                         else f"{AGG_PREFIX}{j}")
            casts += [f"{AGG_PREFIX}{j}_{part}" for part in ("lo", "hi", "sd")]
        try:
            self._con.execute(f"CREATE OR REPLACE TABLE {NOISY_TABLE} AS SELECT {', '.join(casts)} FROM __cells")
            sql = _with_intervals(query).sql(DIALECT)
            # Output values leave exactly (lossless.py): a DATE 'infinity' key must not print as 9999-12-31.
            types = [str(d[1]) for d in self._con.execute(f"DESCRIBE {sql}").fetchall()]
            exact = self._con.execute(canonical_select(sql, types)).fetchall()
            rows = [tuple(to_python(v, t) for v, t in zip(row, types, strict=True)) for row in exact]
        except duckdb.Error as exc:
            raise ProgrammingError(f"post-processing the noisy answer failed: {str(exc).splitlines()[0]}") from None
        finally:
            self._con.unregister("__cells")
        width = len(query.output_names)
        return FinalRows(
            rows=[row[:width] for row in rows],
            intervals=[tuple(_pair(row, width, i) for i in range(width)) for row in rows],
            stds=[tuple(row[width + 2 * width + i] for i in range(width)) for row in rows],
            types=types[:width],
        )

    def close(self) -> None:
        self._con.close()


def _plain_projection(query: CheckedQuery) -> list[tuple[str, int]] | None:
    """When the outer query only lists keys and aggregates (no HAVING, ORDER BY, LIMIT or arithmetic), its
    columns as (prefix, index): the answer can be assembled without a round trip through DuckDB."""
    if any(query.outer.args.get(clause) for clause in ("where", "order", "limit", "offset")):
        return None
    columns = []
    for item in query.outer.expressions:
        if not isinstance(item.this, exp.Column):
            return None
        name = item.this.name
        prefix = KEY_PREFIX if name.startswith(KEY_PREFIX) else AGG_PREFIX
        columns.append((prefix, int(name[len(prefix):])))
    return columns


def _project(query: CheckedQuery, columns: list[tuple[str, int]], key_types: list[str],
             cells: ReleasedCells) -> FinalRows:
    rows, intervals, stds = [], [], []
    integer = [call.kind in _INTEGER_KINDS for call in query.aggregates]
    for g, key in enumerate(cells.keys):
        row, interval, std = [], [], []
        for prefix, i in columns:
            if prefix == KEY_PREFIX:
                row.append(to_python(key[i], key_types[i]))
                interval.append(None)
                std.append(None)
            else:
                value = float(cells.values[g, i])
                row.append(round(value) if integer[i] else value)
                interval.append((float(cells.lows[g, i]), float(cells.highs[g, i])))
                std.append(float(cells.stds[g, i]))
        rows.append(tuple(row))
        intervals.append(tuple(interval))
        stds.append(tuple(std))
    types = [key_types[i] if prefix == KEY_PREFIX else ("BIGINT" if integer[i] else "DOUBLE")
             for prefix, i in columns]
    return FinalRows(rows, intervals, stds, types)


def _pair(row: tuple, width: int, i: int) -> tuple[float, float] | None:
    low, high = row[width + 2 * i], row[width + 2 * i + 1]
    return None if low is None or high is None else (float(low), float(high))


def _columns(query: CheckedQuery, cells: ReleasedCells) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {}
    for i in range(len(query.keys)):
        columns[f"{KEY_PREFIX}{i}"] = np.array([key[i] for key in cells.keys], dtype=object)
    for j in range(len(query.aggregates)):
        columns[f"{AGG_PREFIX}{j}"] = cells.values[:, j].astype(float)
        columns[f"{AGG_PREFIX}{j}_lo"] = cells.lows[:, j].astype(float)
        columns[f"{AGG_PREFIX}{j}_hi"] = cells.highs[:, j].astype(float)
        columns[f"{AGG_PREFIX}{j}_sd"] = cells.stds[:, j].astype(float)
    columns[_POSITION] = np.arange(len(cells.keys), dtype=np.int64)
    return columns


def _with_intervals(query: CheckedQuery) -> exp.Select:
    """The outer query, plus per output its interval ends (lo, hi pairs) and its noise std, in that order; ties
    in its ORDER BY (and the whole order when it has none) are settled by the released order."""
    outer = query.outer.copy().order_by(exp.column(_POSITION), append=True)
    ends, stds = [], []
    for i, item in enumerate(query.outer.expressions):
        expression = item.this
        j = query.output_aggregate[i]
        if j is None:
            ends += [exp.alias_(exp.Null(), f"{OUT_PREFIX}{i}_lo"), exp.alias_(exp.Null(), f"{OUT_PREFIX}{i}_hi")]
            stds.append(exp.alias_(exp.Null(), f"{OUT_PREFIX}{i}_sd"))
            continue
        at_low = _substitute(expression, f"{AGG_PREFIX}{j}", f"{AGG_PREFIX}{j}_lo")
        at_high = _substitute(expression, f"{AGG_PREFIX}{j}", f"{AGG_PREFIX}{j}_hi")
        ends.append(exp.alias_(exp.Least(this=at_low, expressions=[at_high.copy()], ignore_nulls=True),
                               f"{OUT_PREFIX}{i}_lo"))
        ends.append(exp.alias_(exp.Greatest(this=at_low.copy(), expressions=[at_high], ignore_nulls=True),
                               f"{OUT_PREFIX}{i}_hi"))
        bare = isinstance(expression, exp.Column) and expression.name == f"{AGG_PREFIX}{j}"
        stds.append(exp.alias_(exp.column(f"{AGG_PREFIX}{j}_sd") if bare else exp.Null(), f"{OUT_PREFIX}{i}_sd"))
    return outer.select(*ends, *stds, append=True)


def _substitute(node: exp.Expression, name: str, replacement: str) -> exp.Expression:
    def swap(part: exp.Expression) -> exp.Expression:
        if isinstance(part, exp.Column) and part.name == name:
            return exp.column(replacement)
        return part
    return node.copy().transform(swap, copy=False)
