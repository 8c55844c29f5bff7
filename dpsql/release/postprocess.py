"""Stage 7: the analyst's SELECT list, HAVING, ORDER BY and LIMIT, run over the noisy cells only.

Post-processing of DP outputs is free, so arithmetic between aggregates, filters on noisy values, ordering and
limits can use full SQL. It runs in its own sandboxed DuckDB that has never seen the private tables: the only
table there is `__noisy`, so even a checker bug could not make this stage read raw rows.

An output that is a monotone function of one aggregate (ROUND(AVG(x), 1), SUM(x) / 1000) gets its interval by
evaluating the same expression at the aggregate's interval ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, CheckedQuery
from dpsql.analysis.typecheck import INTEGER_TYPES
from dpsql.errors import ProgrammingError, first_line
from dpsql.release.cells import ReleasedCells
from dpsql.sql import names, sandbox
from dpsql.sql.lossless import canonical_select, to_python
from dpsql.sql.parse import DIALECT

# names.POSITION: each released row's place in the order release() chose (data-independent). It is the last ORDER BY
# term of every post-processing query: DuckDB's sort is not stable (it reorders 40 tied rows even on one thread, and
# with several threads large inputs come back in different orders from run to run), so without it rows with equal
# noisy values, and the rows a LIMIT keeps, would be chosen by the sort's internals; with it, ties keep release()'s
# order and the output is a function of the released cells. Analyst SQL cannot name it: the checker lets the outer
# query read only the key and aggregate columns it made itself.


@dataclass(frozen=True)
class FinalRows:
    rows: list[tuple[Any, ...]]
    intervals: list[tuple[tuple[float, float] | None, ...]]
    stds: list[tuple[float | None, ...]]
    types: list[str]  # DuckDB type of each output column


class PostProcessor:
    def __init__(self) -> None:
        # A noisy count of 0 gives inf, not an error.
        self._con = sandbox.connect({"error_on_division_by_zero": "false"})

    def run(self, query: CheckedQuery, key_types: list[str], cells: ReleasedCells) -> FinalRows:
        projection = _plain_projection(query)
        if projection is not None:
            return _project(query, projection, key_types, cells)
        self._con.register(names.CELLS_VIEW, _columns(query, cells))
        casts = [f"CAST({names.key(i)} AS {t}) AS {names.key(i)}" for i, t in enumerate(key_types)]
        casts.append(names.POSITION)
        for j, call in enumerate(query.aggregates):
            # The type the analyst's SQL gives the call (the value is already in its range and, for an integer
            # type, whole: Aggregate.release); a NaN, a NULL cell, reaches DuckDB as NULL.
            value = names.aggregate(j)
            casts.append(f"CAST({value} AS {call.type}) AS {value}")
            casts += [names.aggregate(j, part) for part in ("lo", "hi", "sd")]
        try:
            self._con.execute(f"CREATE OR REPLACE TABLE {names.NOISY_TABLE} AS SELECT {', '.join(casts)} "
                              f"FROM {names.CELLS_VIEW}")
            sql = _with_intervals(query).sql(DIALECT)
            # Output values leave exactly (lossless.py): a DATE 'infinity' key must not print as 9999-12-31.
            types = [str(d[1]) for d in self._con.execute(f"DESCRIBE {sql}").fetchall()]
            exact = self._con.execute(canonical_select(sql, types)).fetchall()
            rows = [tuple(to_python(v, t) for v, t in zip(row, types, strict=True)) for row in exact]
        except duckdb.Error as exc:
            raise ProgrammingError(f"post-processing the noisy answer failed: {first_line(exc)}") from None
        finally:
            self._con.unregister(names.CELLS_VIEW)
        width = len(query.output_names)
        return FinalRows(
            rows=[row[:width] for row in rows],
            intervals=[tuple(_pair(row, width, i) for i in range(width)) for row in rows],
            stds=[tuple(row[width + 2 * width + i] for i in range(width)) for row in rows],
            types=types[:width],
        )

    def close(self) -> None:
        self._con.close()


def _plain_projection(query: CheckedQuery) -> list[tuple[bool, int]] | None:
    """When the outer query only lists keys and aggregates (no HAVING, ORDER BY, LIMIT or arithmetic) of types
    Python holds as a float or an int, its columns as (is a key, index): the answer can be assembled without a round
    trip through DuckDB."""
    if any(query.outer.args.get(clause) for clause in ("where", "order", "limit", "offset")):
        return None
    if not all(call.type == "DOUBLE" or _integer(call) for call in query.aggregates):
        return None  # a DECIMAL or BOOLEAN cell: DuckDB's cast makes the value
    columns = []
    for item in query.outer.expressions:
        if not isinstance(item.this, exp.Column):
            return None
        key = names.key_index(item.this)
        columns.append((True, key) if key is not None else (False, names.aggregate_index(item.this)))
    return columns


def _project(query: CheckedQuery, columns: list[tuple[bool, int]], key_types: list[str],
             cells: ReleasedCells) -> FinalRows:
    rows, intervals, stds = [], [], []
    integer = [_integer(call) for call in query.aggregates]
    for g, key in enumerate(cells.keys):
        row, interval, std = [], [], []
        for is_key, i in columns:
            if is_key:
                row.append(to_python(key[i], key_types[i]))
                interval.append(None)
                std.append(None)
            else:
                value = float(cells.values[g, i])
                row.append(None if math.isnan(value) else int(value) if integer[i] else value)
                interval.append(_ends(float(cells.lows[g, i]), float(cells.highs[g, i])))
                spread = float(cells.stds[g, i])
                std.append(None if math.isnan(spread) else spread)  # a quantile's error is not additive noise
        rows.append(tuple(row))
        intervals.append(tuple(interval))
        stds.append(tuple(std))
    types = [key_types[i] if is_key else query.aggregates[i].type for is_key, i in columns]
    return FinalRows(rows, intervals, stds, types)


def _integer(call: AggregateCall) -> bool:
    """Whether the aggregate is released as an integer (a whole number within its type: Aggregate.release)."""
    return call.type in INTEGER_TYPES


def _pair(row: tuple, width: int, i: int) -> tuple[float, float] | None:
    return _ends(row[width + 2 * i], row[width + 2 * i + 1])


def _ends(low: float | None, high: float | None) -> tuple[float, float] | None:
    """A cell's interval, or None: a key's (NULL ends), or a quantile's whose interval was not asked for (NaN)."""
    if low is None or high is None or (math.isnan(low) and math.isnan(high)):
        return None
    return float(low), float(high)


def _columns(query: CheckedQuery, cells: ReleasedCells) -> dict[str, np.ndarray]:
    columns: dict[str, np.ndarray] = {}
    for i in range(len(query.keys)):
        columns[names.key(i)] = np.array([key[i] for key in cells.keys], dtype=object)
    for j in range(len(query.aggregates)):
        columns[names.aggregate(j)] = cells.values[:, j].astype(float)
        columns[names.aggregate(j, "lo")] = cells.lows[:, j].astype(float)
        columns[names.aggregate(j, "hi")] = cells.highs[:, j].astype(float)
        columns[names.aggregate(j, "sd")] = cells.stds[:, j].astype(float)
    columns[names.POSITION] = np.arange(len(cells.keys), dtype=np.int64)
    return columns


def _with_intervals(query: CheckedQuery) -> exp.Select:
    """The outer query, plus per output its interval ends (lo, hi pairs) and its noise std, in that order; ties
    in its ORDER BY (and the whole order when it has none) are settled by the released order."""
    outer = _null_on_zero(query.outer.copy()).order_by(exp.column(names.POSITION), append=True)
    ends, stds = [], []
    for i, item in enumerate(outer.expressions):
        expression = item.this
        j = query.output_aggregate[i]
        if j is None:
            ends += [exp.alias_(exp.Null(), names.output(i, "lo")), exp.alias_(exp.Null(), names.output(i, "hi"))]
            stds.append(exp.alias_(exp.Null(), names.output(i, "sd")))
            continue
        at_low = _substitute(expression, j, "lo")
        at_high = _substitute(expression, j, "hi")
        ends.append(exp.alias_(exp.Least(this=at_low, expressions=[at_high.copy()], ignore_nulls=True),
                               names.output(i, "lo")))
        ends.append(exp.alias_(exp.Greatest(this=at_low.copy(), expressions=[at_high], ignore_nulls=True),
                               names.output(i, "hi")))
        bare = names.aggregate_index(expression) == j
        stds.append(exp.alias_(exp.column(names.aggregate(j, "sd")) if bare else exp.Null(), names.output(i, "sd")))
    return outer.select(*ends, *stds, append=True)


def _null_on_zero(outer: exp.Select) -> exp.Select:
    """Every `a / b` as `a / NULLIF(b, 0)`: a ratio whose divisor's noisy value is 0 (SUM(x) / COUNT(*) on a group
    the noisy count says is empty) is NULL, as `//` and `%` by 0 already are here and as SQL's aggregates over no
    rows are, rather than DuckDB's IEEE +/-inf or NaN (docs/explanation/aggregates.md, "Empty groups")."""
    def guarded(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Div):
            node.set("expression", exp.func("NULLIF", node.expression, exp.Literal.number(0)))
        return node
    return outer.transform(guarded, copy=False)


def _substitute(node: exp.Expression, index: int, part_name: str) -> exp.Expression:
    """The expression with aggregate `index` replaced by one end of its interval."""
    def swap(part: exp.Expression) -> exp.Expression:
        if names.aggregate_index(part) == index:
            return exp.column(names.aggregate(index, part_name))
        return part
    return node.copy().transform(swap, copy=False)
