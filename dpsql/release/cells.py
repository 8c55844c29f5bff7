"""Stage 6: add the noise, select the partitions, and compute each output with its 95% interval.

Input: the exact integer measurements per group from the engine. Output: the released groups and, per group and
aggregate, a value, a confidence interval and the noise's standard deviation. After `_add_noise` nothing touches
the exact values again: everything below it is post-processing of the noisy integers.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsql.analysis.check import AggregateKind
from dpsql.dp.confidence import fiducial_interval, gaussian_sum_half_width, laplace_sum_half_width
from dpsql.dp.mechanisms import GaussianMechanism
from dpsql.dp.noise import RandomSource, uniform_permutation
from dpsql.errors import ExecutionFailed
from dpsql.planning.plan import Measurement, OutputRecipe, QueryPlan

LEVEL = 0.95


@dataclass(frozen=True)
class ReleasedCells:
    keys: list[tuple[Any, ...]]  # one tuple of group-key values per released group, in a data-independent order
    values: np.ndarray  # groups x aggregates
    lows: np.ndarray
    highs: np.ndarray
    stds: np.ndarray


def release(plan: QueryPlan, rows: Sequence[tuple[Any, ...]], rng: RandomSource) -> ReleasedCells:
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
    noisy = _add_noise(plan.measurements, exact, rng)
    if plan.selection is not None and keys:
        kept = [i for i, count in enumerate(noisy[:, plan.selection.measurement]) if count >= plan.selection.threshold]
        keys, noisy = [keys[i] for i in kept], noisy[kept]
    if plan.domains is None:
        order = uniform_permutation(len(keys), rng)
        keys, noisy = [keys[i] for i in order], noisy[order]
    columns = [_output(recipe, plan.measurements, noisy) for recipe in plan.recipes]
    shape = (len(keys), len(columns))
    stack = [np.array([c[k] for c in columns]).T.reshape(shape) for k in range(4)]
    return ReleasedCells(keys, *stack)


def _cells(plan: QueryPlan, rows: Sequence[tuple[Any, ...]]) -> tuple[list[tuple], np.ndarray]:
    """The groups to consider, with their exact measurements: every public group (empty ones as zeros), or
    the groups present in the data whose public parts are declared values."""
    k, n = len(plan.query.keys), len(plan.measurements)
    found = {tuple(_canonical(v) for v in row[:k]): [int(v) if v is not None else 0 for v in row[k:]] for row in rows}
    if len(found) != len(rows):
        # Two engine groups became one Python key: one would silently replace the other, and one row could decide
        # which (a large group released or not). Keys leave the engine exactly (lossless.py), so this should
        # never happen; if it does, the query fails, with the generic error the session gives every failure.
        raise ExecutionFailed()
    if plan.domains is not None:
        keys = list(itertools.product(*plan.domains))
        exact = [found.get(key, [0] * n) for key in keys]
    else:
        domains = [set(key.domain) if key.domain is not None else None for key in plan.query.keys]
        keys = [key for key in found if all(d is None or v in d for v, d in zip(key, domains, strict=True))]
        exact = [found[key] for key in keys]
    return keys, np.array(exact, dtype=object).reshape(len(keys), n)


def _canonical(value: Any) -> Any:
    """One representative of what DuckDB puts in one group. It groups -0.0 with 0.0 (and every NaN together) but
    returns the representation of the first row its scan met: the sign of a released zero key would tell whether
    some person's -0.0 row came first."""
    if isinstance(value, float) and (value == 0 or math.isnan(value)):
        return 0.0 if value == 0 else math.nan
    return value


def _add_noise(measurements: Sequence[Measurement], exact: np.ndarray, rng: RandomSource) -> np.ndarray:
    noisy = exact.copy()
    for (cell, j), value in np.ndenumerate(exact):
        noisy[cell, j] = value + measurements[j].mechanism.sample(rng)
    return noisy


def _output(recipe: OutputRecipe, measurements: Sequence[Measurement], noisy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(value, low, high, std) arrays for one aggregate over all released groups."""
    def real(index: int) -> np.ndarray:
        return noisy[:, index].astype(float) * float(measurements[index].spec.step)

    def scale(index: int) -> float:
        """b for Laplace, sigma for Gaussian, in value units."""
        return float(measurements[index].mechanism.scale) * float(measurements[index].spec.step)

    gaussian = isinstance(measurements[0].mechanism, GaussianMechanism)

    def spread(terms: list[tuple[float, int]], cells: int) -> tuple[np.ndarray, np.ndarray]:
        """Half-width and std of sum_i coef_i * noise_i, the same for every group."""
        width = _half_width(tuple(abs(coef) * scale(i) for coef, i in terms), gaussian)
        variance = sum(coef**2 * measurements[i].std ** 2 for coef, i in terms)
        return np.full(cells, width), np.full(cells, math.sqrt(variance))

    kind = recipe.call.kind
    if kind in (AggregateKind.COUNT, AggregateKind.COUNT_UNITS) or (kind is AggregateKind.SUM
                                                                    and recipe.count is None):
        index = recipe.count if recipe.count is not None else recipe.total
        value = real(index)
        width = measurements[index].mechanism.half_width(LEVEL) * float(measurements[index].spec.step)
        low, high = value - width, value + width
        lower = 0.0 if kind is not AggregateKind.SUM else _sum_floor(recipe)
        upper = math.inf if kind is not AggregateKind.SUM else _sum_ceiling(recipe)
        return (*_clip(value, low, high, lower, upper), np.full(value.shape, measurements[index].std))
    interval = recipe.point.interval
    center = recipe.point.center_value
    if kind is AggregateKind.SUM:
        value = real(recipe.total) + center * real(recipe.count)
        width, std = spread([(1.0, recipe.total), (center, recipe.count)], len(value))
        return (*_clip(value, value - width, value + width, _sum_floor(recipe), _sum_ceiling(recipe)), std)
    if kind is AggregateKind.AVG:
        output, indices = _average(center, interval.lo, interval.hi), [recipe.count, recipe.total]
    else:
        square_point = measurements[recipe.squares].spec.square_point
        output = _spread(kind, square_point.center_value, interval.half_width**2)
        indices = [recipe.count, recipe.total, recipe.squares]
    observed = [real(i) for i in indices]
    low, high, std = fiducial_interval(observed, [scale(i) for i in indices], gaussian, LEVEL, output)
    return output(*observed), low, high, std


@functools.lru_cache(maxsize=256)
def _half_width(scales: tuple[float, ...], gaussian: bool) -> float:
    """The half-width for noise with these scales: the same for every group and every release of a plan."""
    row = np.array([scales])
    return float((gaussian_sum_half_width(row, LEVEL) if gaussian else laplace_sum_half_width(row, LEVEL))[0])


def _average(center: float, lower: float, upper: float):
    """AVG from a count and a sum of centered values, clamped to the bounds (a count below 1 counts as 1)."""
    def output(count: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.clip(center + total / np.maximum(count, 1.0), lower, upper)
    return output


def _spread(kind: AggregateKind, square_center: float, ceiling: float):
    """VAR or STDDEV from a count, a sum of centered values and a sum of their centered squares."""
    def output(count: np.ndarray, total: np.ndarray, squares: np.ndarray) -> np.ndarray:
        n = np.maximum(count, 1.0)
        mean = total / n
        variance = np.clip(squares / n + square_center - mean**2, 0.0, ceiling)
        if kind in (AggregateKind.VAR_SAMP, AggregateKind.STDDEV_SAMP):
            variance = variance * np.where(n > 1, n / np.maximum(n - 1, 1.0), 1.0)
        if kind in (AggregateKind.STDDEV_SAMP, AggregateKind.STDDEV_POP):
            return np.sqrt(variance)
        return variance
    return output


def _clip(value: np.ndarray, low: np.ndarray, high: np.ndarray, lower: float, upper: float):
    """Clamping to what the true answer can be is post-processing; the interval keeps its coverage."""
    return np.clip(value, lower, upper), np.clip(low, lower, upper), np.clip(high, lower, upper)


def _sum_floor(recipe: OutputRecipe) -> float:
    return 0.0 if recipe.point.interval.lo >= 0 else -math.inf


def _sum_ceiling(recipe: OutputRecipe) -> float:
    return 0.0 if recipe.point.interval.hi <= 0 else math.inf
