"""Stage 6: add the noise, select the partitions, and compute each output with its 95% interval.

Input: the exact integer measurements per group from the engine. Output: the released groups and, per group and
aggregate, a value, a confidence interval and the noise's standard deviation (each aggregate kind computes its own:
planning/aggregates). After `_add_noise` nothing touches the exact values again: everything below it is
post-processing of the noisy integers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dpsql.dp.noise import RandomSource, uniform_permutation
from dpsql.errors import ExecutionFailed
from dpsql.planning.aggregates import NoisyCells, aggregate
from dpsql.planning.measurements import Measurement, MeasurementKind
from dpsql.planning.plan import QueryPlan
from dpsql.planning.reuse import OTHER, Combination, Grouping
from dpsql.rewrite.quantile_buckets import vector

# The noisy integer of every cell of a measurement's grouping (Grouping.cells: OTHER where a key is outside its
# declared values), as the measurement store keeps it.
MeasuredCells = dict[tuple[Any, ...], int]


@dataclass(frozen=True)
class ReleasedCells:
    keys: list[tuple[Any, ...]]  # one tuple of group-key values per released group, in a data-independent order
    values: np.ndarray  # groups x aggregates; NaN for a NULL cell (Aggregate.release), with NaN interval and std
    lows: np.ndarray
    highs: np.ndarray
    stds: np.ndarray
    # With `grouping` given to release: per measurement of the plan (None for a quantile), its noisy cells to store.
    measured: tuple[MeasuredCells | None, ...] = ()


def release(plan: QueryPlan, rows: Sequence[tuple[Any, ...]], rng: RandomSource,
            grouping: Grouping | None = None) -> ReleasedCells:
    """The released cells, in an order that does not depend on the data.

    Public groups come in the order of their declared values. Groups found in the data come in the engine's
    order, which depends on which rows the scan met first and on its threads: with LIMIT and no ORDER BY that
    order would decide *which* groups are shown. So the released groups are put in a uniformly random order
    drawn from `rng`: the sequence is then the released set plus independent randomness, post-processing of a
    DP output, and a LIMIT without ORDER BY shows a uniformly random subset of it. (A canonical sort of the keys
    would also do, but only with a total order over every key type that never ties two distinct keys, NULLs,
    -0.0 and 0.0, mixed types included: a stable sort keeps the engine's order between ties.)
    """
    keys, exact = _cells(plan, rows)
    noisy = exact.copy()
    selected = plan.selection.measurement if plan.selection is not None and keys else None
    if selected is not None:
        # Partition selection first, from its own count's noise: the groups it drops get no other noise. A group
        # one person adds (at most m) then costs one draw here, not one per measurement (the other draws are
        # independent of the selection, so drawing them only for the groups released changes no law).
        _add_noise(plan.measurements[selected], exact, noisy, selected, rng)
        # (the public groups of a query with grouping sets, released whatever the data, are not selected)
        kept = [i for i, count in enumerate(noisy[:, selected])
                if count >= plan.selection.threshold or not plan.selected(keys[i])]
        keys, exact, noisy = [keys[i] for i in kept], exact[kept], noisy[kept]
    for j, measurement in enumerate(plan.measurements):
        if j != selected:
            _add_noise(measurement, exact, noisy, j, rng)
    if plan.selection is not None:  # groups found in the data (public ones alone come in the declared order)
        order = uniform_permutation(len(keys), rng)
        keys, exact, noisy = [keys[i] for i in order], exact[order], noisy[order]
    _choose_candidates(plan.measurements, exact, noisy, rng)
    released = _outputs(plan, keys, noisy)
    if grouping is None:
        return released
    return replace(released, measured=_measured(plan, grouping, keys, noisy, rows, rng))


def release_combined(plan: QueryPlan, combination: Combination, rows: Sequence[tuple[Any, ...]], rng: RandomSource,
                     grouping: Grouping) -> ReleasedCells:
    """The cells of a plan whose measurements are estimated from released ones (planning/reuse.py): `rows` are the
    bounded query's rows for the measurements measured now (combination.measured, in that order), which get their
    noise here as any measurement does; then every measurement's estimate, and the outputs from those. The groups
    are the public ones (reuse needs every key's declared values)."""
    now = replace(plan, measurements=tuple(plan.measurements[j] for j in combination.measured), recipes=(),
                  selection=None)
    keys, exact = _cells(now, rows)
    noisy = exact.copy()
    for column, measurement in enumerate(now.measurements):
        _add_noise(measurement, exact, noisy, column, rng)
    measured = {j: list(noisy[:, column]) for column, j in enumerate(combination.measured)}
    estimates = combination.values(len(keys), measured)
    released = _outputs(plan, keys, estimates, combination)
    stored = _measured(now, grouping, keys, noisy, rows, rng) if now.measurements else ()
    return replace(released, measured=tuple(stored[combination.measured.index(j)] if j in combination.measured
                                            else None for j in range(len(plan.measurements))))


def with_buckets(plan: QueryPlan, rows: Sequence[tuple[Any, ...]],
                 buckets: Mapping[tuple[int, ...], Sequence[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """The bounded query's rows with the quantile columns filled in as {bucket: rows} per group, the shape release
    reads: `buckets` maps the measurement indices that read one argument to its bucket query's rows (keys...,
    bucket, rows). The bucket query groups a subset of the same rows the same way, so it has no group the bounded
    query lacks; a group without a non-NULL value gets None (all zeros)."""
    k = len(plan.query.keys)
    counts: list[tuple[tuple[int, ...], dict[tuple, dict[int, int]]]] = []
    for indices, found in buckets.items():
        per_group: dict[tuple, dict[int, int]] = {}
        for row in found:
            key = tuple(_canonical(v) for v in row[:k])
            per_group.setdefault(key, {})[int(row[k])] = int(row[k + 1])
        counts.append((indices, per_group))
    filled = []
    for row in rows:
        key, values = tuple(_canonical(v) for v in row[:k]), list(row)
        for indices, per_group in counts:
            for index in indices:
                values[k + index] = per_group.get(key)
        filled.append(tuple(values))
    return filled


def release_no_groups(plan: QueryPlan) -> ReleasedCells:
    """Every output computed over no groups at all: what fails here fails whatever the data (session.py runs it
    before the charge). Draws no noise."""
    return _outputs(plan, [], np.empty((0, len(plan.measurements)), dtype=object))


def _outputs(plan: QueryPlan, keys: list[tuple[Any, ...]], noisy: np.ndarray,
             combination: Combination | None = None) -> ReleasedCells:
    """Each aggregate's value, interval and std from the noisy measurements of the released groups."""
    cells = NoisyCells(plan.measurements, noisy, combination)
    columns = [aggregate(recipe.call).release(recipe, cells) for recipe in plan.recipes]
    shape = (len(keys), len(columns))
    stack = [np.array([c[k] for c in columns]).T.reshape(shape) for k in range(4)]
    return ReleasedCells(keys, *stack)


def _measured(plan: QueryPlan, grouping: Grouping, keys: list[tuple[Any, ...]], noisy: np.ndarray,
              rows: Sequence[tuple[Any, ...]], rng: RandomSource) -> tuple[MeasuredCells | None, ...]:
    """Each additive measurement's noisy cells over the whole grouping: the released groups' (the public ones), and
    with `grouping.others` one cell more per combination with a key outside its declared values (NULL included),
    the exact sum of the engine's groups there plus fresh noise. Each row is in exactly one of all those cells, so
    one unit moves the whole vector as much as it moves the public cells alone: the noise the charge paid for
    covers them. Drawn after every released cell's noise, so that the released answer draws what it always drew."""
    k = len(plan.query.keys)
    public = dict(zip(keys, range(len(keys)), strict=True))
    extended = [cell for cell in grouping.cells() if cell not in public]
    sums = {cell: [0] * len(plan.measurements) for cell in extended}
    for row in rows:
        cell = tuple(v if v in domain else OTHER for v, domain in
                     zip((_canonical(v) for v in row[:k]), grouping.domains, strict=True))
        if cell in sums:
            for j, value in enumerate(row[k:]):
                if value is not None and plan.measurements[j].spec.kind is not MeasurementKind.QUANTILE:
                    sums[cell][j] += int(value)
    found: list[MeasuredCells | None] = []
    for j, measurement in enumerate(plan.measurements):
        if measurement.spec.kind is MeasurementKind.QUANTILE or not measurement.sensitivity:
            found.append(None)
            continue
        cells = {key: int(noisy[g, j]) for key, g in public.items()}
        for cell in extended:
            cells[cell] = sums[cell][j] + measurement.mechanism.sample(rng)
        found.append(cells)
    return tuple(found)


def _cells(plan: QueryPlan, rows: Sequence[tuple[Any, ...]]) -> tuple[list[tuple], np.ndarray]:
    """The groups to consider, with their exact measurements: every public group (empty ones as zeros), or
    the groups present in the data whose public parts are declared values."""
    k, n = len(plan.query.keys), len(plan.measurements)
    found = {tuple(_canonical(v) for v in row[:k]): row[k:] for row in rows}
    if len(found) != len(rows):
        # Two engine groups became one Python key: one would silently replace the other, and one row could decide
        # which (a large group released or not). Keys leave the engine exactly (lossless.py), so this should
        # never happen; if it does, the query fails, with the generic error the session gives every failure.
        raise ExecutionFailed()
    # Every public group (in the order of the declared values), then the groups found whose keys may be released
    # (plan.selected). Noise is drawn in a canonical order of the keys, not the engine's: then the same seeds give
    # the same answer whatever the engine (DuckDB, Spark) and its threads did. The order released is drawn after.
    keys = plan.public_keys() + sorted((key for key in found if plan.selected(key)), key=_key_order)
    exact = np.empty((len(keys), n), dtype=object)  # filled cell by cell: a quantile's cell is a list of counts
    for g, key in enumerate(keys):
        values = found.get(key, (None,) * n)  # a public group with no row: every measurement is empty
        for j, (measurement, value) in enumerate(zip(plan.measurements, values, strict=True)):
            exact[g, j] = _exact(measurement, value)
    return keys, exact


def _exact(measurement: Measurement, value: Any) -> int | dict | None:
    """One cell's exact measurement: an integer, or a quantile's {bucket: rows} (from with_buckets), made a count per
    candidate only in a released group (_choose_candidates): a group one person adds that partition selection drops
    then costs a few draws, not a vector the size of the grid."""
    if measurement.spec.kind is MeasurementKind.QUANTILE:
        return value
    return int(value) if value is not None else 0


def _key_order(key: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
    """A total order of group keys: NULL first, then by value; a NaN after every number. A column's values have one
    type, so values of different types meet only beside NULL (or a type's text); these are ordered by type name."""
    def order(value: Any) -> tuple[Any, ...]:
        if value is None:
            return (0,)
        if isinstance(value, float) and math.isnan(value):
            return (2, "float")
        if isinstance(value, int | float):  # bool is an int: True == 1 here, but a column is one type
            return (1, "number", value)
        return (1, type(value).__name__, value)
    return tuple(order(v) for v in key)


def _canonical(value: Any) -> Any:
    """One representative of what DuckDB puts in one group. It groups -0.0 with 0.0 (and every NaN together) but
    returns the representation of the first row its scan met: the sign of a released zero key would tell whether
    some person's -0.0 row came first."""
    if isinstance(value, float) and (value == 0 or math.isnan(value)):
        return 0.0 if value == 0 else math.nan
    return value


def _add_noise(measurement: Measurement, exact: np.ndarray, noisy: np.ndarray, column: int,
               rng: RandomSource) -> None:
    """Into `noisy`'s column, an additive measurement's exact values plus its noise; a quantile's cells are left to
    _choose_candidates."""
    if measurement.spec.kind is not MeasurementKind.QUANTILE:
        for cell in range(exact.shape[0]):
            noisy[cell, column] = exact[cell, column] + measurement.mechanism.sample(rng)


def _choose_candidates(measurements: Sequence[Measurement], exact: np.ndarray, noisy: np.ndarray,
                       rng: RandomSource) -> None:
    """Each quantile's value and interval in every released group (only those: the others are never shown)."""
    for j, measurement in enumerate(measurements):
        if measurement.spec.kind is MeasurementKind.QUANTILE:
            for cell in range(exact.shape[0]):
                noisy[cell, j] = measurement.mechanism.release(vector(exact[cell, j], measurement.spec.grid), rng)
