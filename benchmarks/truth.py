"""Exact answers: on the raw rows (plain DuckDB), and after dpsql's bounding (dpsql's release without noise).

The *bounded truth* is what dpsql's noise is centred on: the answer after each unit's rows are capped and each
value is clamped to its declared bounds. It is computed by dpsql's own release stage from the exact bounded
measurements, with every mechanism replaced by a zero-sensitivity one (which adds exactly 0), so it goes through
the same post-processing (AVG = mid + S/N, the VAR formula, the clamps) as a noisy answer. The *raw truth* is
the plain SQL answer on the unbounded rows; the two differ where clamping or capping changes the data.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import duckdb
import numpy as np

from benchmarks.datasets import Dataset, source_sql
from benchmarks.workload import Aggregate, Kind, Query
from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import RandomSource
from dpsql.planning.plan import QueryPlan
from dpsql.release.cells import ReleasedCells, release


def group_label(key: object) -> str:
    """A group key as text, the same for every system (SmartNoise returns keys as strings, 1.0 becomes "1")."""
    if isinstance(key, float) and key.is_integer():
        key = int(key)
    return str(key)


def noiseless(plan: QueryPlan) -> QueryPlan:
    """The same plan with mechanisms that add nothing: its release is the exact bounded answer. A zero-sensitivity
    Laplace mechanism adds exactly 0 whatever its epsilon, and stands in for a Gaussian one as well."""
    quiet = tuple(replace(m, mechanism=LaplaceMechanism(0, 1.0)) for m in plan.measurements)
    return replace(plan, measurements=quiet)


def bounded_truth(plan: QueryPlan, rows: list[tuple], rng: RandomSource) -> ReleasedCells:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # Interval widths of zero-scale noise divide 0 by 0; only the values are used.
        warnings.simplefilter("ignore")
        return release(noiseless(plan), rows, rng)


class RawTruth:
    """Plain DuckDB over the same data file: the exact, unbounded answers and each cell's row count."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._con = duckdb.connect()
        self._con.execute(f"CREATE VIEW {dataset.table} AS SELECT * FROM {source_sql(dataset.data_path)}")

    def cells(self, query: Query) -> dict[str, tuple[list[float | None], int]]:
        """Per group: the exact value of each aggregate, and the number of rows."""
        counted = replace(query, aggregates=(*query.aggregates, Aggregate(Kind.COUNT)))
        result = {}
        for row in self._con.execute(counted.sql(self.dataset.table)).fetchall():
            key = group_label(row[0]) if query.grouped else ""
            values = row[1:] if query.grouped else row
            result[key] = ([None if v is None else float(v) for v in values[:-1]], int(values[-1]))
        return result

    def close(self) -> None:
        self._con.close()
