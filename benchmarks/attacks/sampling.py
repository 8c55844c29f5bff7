"""Run a query's bounded SQL once per dataset, then draw its noisy release many times.

The noise stage `dpsql.release.cells.release(plan, rows, rng)` treats every group independently: each cell gets its
own noise draw and each output is computed from its own group's noisy cells. So n independent releases of one
query equal one release of a plan with an extra, leading group key `__run` over n copies of the exact rows. That
batching is what makes tens of thousands of releases affordable; `tests/attacks/test_sampling.py` checks it
against calling `release` once per draw. Only the data-dependent part (the bounded SQL) is run once, which is
sound because it is deterministic for a fixed bounding seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import GroupKey
from dpsql.dp.noise import RandomSource
from dpsql.planning.plan import QueryPlan
from dpsql.release.cells import release
from dpsql.session import PrivateSession

RUN_KEY = GroupKey(exp.column("__run"), None)

Release = dict[tuple[Any, ...], np.ndarray]  # one release: each released group's key -> its output values


@dataclass(frozen=True)
class Measured:
    """A query prepared once and its exact measurement rows on one dataset: everything but the noise."""

    sql: str
    plan: QueryPlan
    bounded_sql: str
    rows: list[tuple[Any, ...]]


def measure(session: PrivateSession, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
            epsilon: float) -> Measured:
    """Run the bounded SQL on the session's data without charging or releasing anything."""
    prepared = session.prepare(sql, parameters, epsilon=epsilon)
    return Measured(sql, prepared.plan, prepared.bounded.sql, session.engine.run(prepared.bounded.sql))


def all_groups(plan: QueryPlan, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows one release considers: with public keys every declared group, the empty ones as zeros."""
    if plan.domains is None:
        return list(rows)
    k, n = len(plan.query.keys), len(plan.measurements)
    found = {tuple(row[:k]): tuple(row[k:]) for row in rows}
    return [(*key, *found.get(key, (0,) * n)) for key in itertools.product(*plan.domains)]


def sample_releases(plan: QueryPlan, rows: Sequence[tuple[Any, ...]], rng: RandomSource, n: int) -> list[Release]:
    """n independent releases of `plan` on the exact `rows`, as one batched call of dpsql's own release."""
    # RUN_KEY has no public values, so the batched plan releases the groups it is given, in a random order.
    batched = replace(plan, query=replace(plan.query, keys=(RUN_KEY, *plan.query.keys)))
    groups = all_groups(plan, rows)
    cells = release(batched, [(run, *row) for run in range(n) for row in groups], rng)
    runs: list[Release] = [{} for _ in range(n)]
    for key, values in zip(cells.keys, cells.values, strict=True):
        runs[key[0]][tuple(key[1:])] = values
    return runs


def scalar_outputs(plan: QueryPlan, rows: Sequence[tuple[Any, ...]], rng: RandomSource, n: int,
                   aggregate: int = 0) -> np.ndarray:
    """n draws of one aggregate of an ungrouped query: an array of released values."""
    return np.array([run[()][aggregate] for run in sample_releases(plan, rows, rng, n)], dtype=float)
