"""What every aggregate kind provides, and the three ways of computing an output's 95% interval.

An aggregate kind knows, in one place: the sqlglot calls that ask for it, the measurements it needs and the weight
of each in the budget split (`recipe`), how its value, interval and noise std follow from the noisy measurements
(`estimate`, the release), how `dpsql explain` describes it (`explain`), and the SQL type of its value.

The interval method is an object, not a word: `estimate` computes with the object `interval_method` returns, and
`explain` prints that object's name, so the explanation cannot name a method the release does not use.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.analysis.written_types import released_range
from dpsql.dp.confidence import (
    fiducial_interval,
    fiducial_interval_joint,
    gaussian_sum_half_width,
    laplace_sum_half_width,
)
from dpsql.dp.fixedpoint import FixedPoint, fixed_point
from dpsql.dp.mechanisms import GaussianMechanism
from dpsql.planning.measurements import Measurement, MeasurementKind, MeasurementSpec, Measures, OutputRecipe, Pair
from dpsql.planning.reuse import Combination

LEVEL = 0.95


class Estimate(NamedTuple):
    """One aggregate over all released groups: (value, low, high, std) arrays, one entry per group."""

    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    std: np.ndarray


@dataclass(frozen=True)
class NoisyCells:
    """The noisy measurements of the released groups (groups x measurements), in value units on demand. With a
    `combination`, each measurement's cells are an estimate from released ones (planning/reuse.py), and intervals
    come from the law of its combined noise."""

    measurements: Sequence[Measurement]
    noisy: np.ndarray
    combination: Combination | None = None

    def real(self, index: int) -> np.ndarray:
        return self.noisy[:, index].astype(float) * float(self.measurements[index].spec.step)

    @property
    def groups(self) -> int:
        return self.noisy.shape[0]


def noise_scale(measurement: Measurement) -> float:
    """b for Laplace, sigma for Gaussian, in value units."""
    return float(measurement.mechanism.scale) * float(measurement.spec.step)


def gaussian(measurements: Sequence[Measurement]) -> bool:
    """Whether the plan's noise is Gaussian (a plan uses one mechanism for all its measurements)."""
    return isinstance(measurements[0].mechanism, GaussianMechanism)


Terms = tuple[tuple[float, int], ...]  # sum_i coef_i * measurement_i: (coef, index) pairs


class IntervalMethod(ABC):
    """How an output's interval is computed; `name` is what `dpsql explain` calls it."""

    name: str


class LinearInterval(IntervalMethod):
    """For an output that is a fixed linear combination of measurements: the same half-width for every group."""

    @abstractmethod
    def spread(self, terms: Terms, measurements: Sequence[Measurement]) -> tuple[float, float]:
        """(half-width, std) of the noise of sum_i coef_i * measurement_i, in value units."""


class LoneQuantile(LinearInterval):
    name = "the exact quantile of the noise"

    def spread(self, terms: Terms, measurements: Sequence[Measurement]) -> tuple[float, float]:
        ((coefficient, index),) = terms
        measurement = measurements[index]
        width = measurement.mechanism.half_width(LEVEL) * float(measurement.spec.step)
        return abs(coefficient) * width, abs(coefficient) * measurement.std


class SummedNoise(LinearInterval):
    name = "the closed-form distribution of the summed noises"

    def spread(self, terms: Terms, measurements: Sequence[Measurement]) -> tuple[float, float]:
        width = _half_width(tuple(abs(coef) * noise_scale(measurements[i]) for coef, i in terms),
                            gaussian(measurements))
        variance = sum(coef**2 * measurements[i].std ** 2 for coef, i in terms)
        return width, math.sqrt(variance)


class PairedCounts(LinearInterval):
    """For the sum of two counts that share one budget item (so one mechanism): the exact quantile of the sum of two
    independent integer noises. The continuous formula of SummedNoise gives a half-width between integers, and an
    integer sum leaves it more often than 5% of the time when the noise is small (91.6% coverage at worst, found by
    the red team)."""

    name = "the exact quantile of the two counts' summed noise"

    def spread(self, terms: Terms, measurements: Sequence[Measurement]) -> tuple[float, float]:
        (first, i), (second, j) = terms
        mechanism = measurements[i].mechanism
        if (first, second) != (1.0, 1.0) or measurements[j].mechanism != mechanism or measurements[i].spec.step != 1:
            raise ValueError("paired counts: two counts with one mechanism, added")
        return float(mechanism.pair_half_width(LEVEL)), math.sqrt(2) * measurements[i].std


class Fiducial(IntervalMethod):
    """For an output that is not linear in its measurements (dp/confidence.py): an interval per group."""

    name = "fiducial, per group"

    def estimate(self, indices: Sequence[int], output: Callable[..., np.ndarray], cells: NoisyCells) -> Estimate:
        observed = [cells.real(i) for i in indices]
        if cells.combination is not None:
            low, high, std = _joint_fiducial(indices, observed, output, cells)
            return Estimate(output(*observed), low, high, std)
        scales = [noise_scale(cells.measurements[i]) for i in indices]
        low, high, std = fiducial_interval(observed, scales, gaussian(cells.measurements), LEVEL, output)
        return Estimate(output(*observed), low, high, std)


def _joint_fiducial(indices: Sequence[int], observed: list[np.ndarray], output: Callable[..., np.ndarray],
                    cells: NoisyCells) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fiducial interval over estimated measurements: each one's noise a combination of independent sources,
    drawn jointly (two estimates reading one source share its draw)."""
    combination = cells.combination
    assert combination is not None
    used = sorted({s for i in indices for _, s in combination.estimates[i]})
    loadings = np.zeros((len(indices), len(used)))
    for row, i in enumerate(indices):
        step = float(cells.measurements[i].spec.step)
        for coefficient, s in combination.estimates[i]:
            loadings[row, used.index(s)] += float(coefficient) * step
    laws = [combination.sources[s].noise() for s in used]
    return fiducial_interval_joint(observed, [law.inverse_cdf for law in laws], loadings, LEVEL, output)


LONE_QUANTILE = LoneQuantile()
SUMMED_NOISE = SummedNoise()
PAIRED_COUNTS = PairedCounts()
FIDUCIAL = Fiducial()


@functools.lru_cache(maxsize=256)
def _half_width(scales: tuple[float, ...], gaussian: bool) -> float:
    """The half-width for noise with these scales: the same for every group and every release of a plan."""
    row = np.array([scales])
    return float((gaussian_sum_half_width(row, LEVEL) if gaussian else laplace_sum_half_width(row, LEVEL))[0])


class Aggregate(ABC):
    """One aggregate kind. Instances are stateless: the registry holds one per kind."""

    kind: AggregateKind
    listed_as: str  # how the message refusing an unsupported aggregate lists it among the supported ones
    functions: tuple[type[exp.Expression], ...] = ()  # the sqlglot calls that ask for it (COUNT: see check.py)
    # Whether the planner compares two ways of measuring it, plain (one uncentered sum) or centered (a centered
    # sum and a count), and keeps the one with the smaller expected error.
    measured_two_ways: bool = False
    # Whether it can be computed from its bounded argument's pair of complementary sums (measurements.Pair); the
    # planner compares measuring the argument so with the other ways.
    pairable: bool = False
    # The kind whose call with DISTINCT in it asks for this one (SUM(DISTINCT x): "sum"), if any.
    distinct_of: AggregateKind | None = None

    @abstractmethod
    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        """Ask `measures` for what `call` needs, with the weight of each in the budget split: how much one unit of
        that measurement's noise variance adds to the output's squared relative error (values assumed spread
        over their bounds). `plain` is the planner's choice for a kind measured two ways."""

    @abstractmethod
    def interval_method(self, recipe: OutputRecipe) -> IntervalMethod:
        """How `estimate` computes the interval: the one object `explain` names."""

    @abstractmethod
    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        """The released value, 95% interval and noise std of every group: post-processing of the noisy cells."""

    def release(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        """`estimate`, as the cells are released: in the type the analyst's SQL gives the call (AggregateCall.type),
        and NULL (NaN) where the noisy count of the values says there are none to aggregate (`empty`). Both are
        post-processing of the noisy cells."""
        estimate = in_type(self.estimate(recipe, cells), recipe.call.type)
        empty = self.empty(recipe, cells)
        if not empty.any():
            return estimate
        return Estimate(*(np.where(empty, math.nan, part) for part in estimate))

    def empty(self, recipe: OutputRecipe, cells: NoisyCells) -> np.ndarray:
        """The groups where the cell is NULL, as SQL's aggregate over no values is: none, unless the kind has a
        noisy count of its values to tell."""
        return np.zeros(cells.groups, dtype=bool)

    @abstractmethod
    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        """For explain: how the value follows from the measurements, and what to say of the interval's size."""

    def explain(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> str:
        value, size = self.formula(recipe, measurements)
        interval = " ".join(part for part in (f"{LEVEL:.0%} interval", size) if part)
        return f"{value}{released_as(recipe.call.type)}; {interval} ({self.interval_method(recipe).name})"


def released_as(kind: str) -> str:
    """What explain adds to a value's formula for its type (in_type): nothing for a DOUBLE."""
    limits = released_range(kind)
    if limits is None:
        return ""
    return f", rounded to a {kind}" if limits[2] else f", as a {kind}"


class CombinedNoise(LinearInterval):
    """For an output read from estimated measurements (planning/reuse.py): the law of the noise of its combination
    of released cells (dp/noise_sums.py), exact on one lattice and conservative otherwise."""

    name = "the law of the combined released noises"

    def __init__(self, combination: Combination) -> None:
        self.combination = combination

    def spread(self, terms: Terms, measurements: Sequence[Measurement]) -> tuple[float, float]:
        law = self.combination.law(terms, [m.spec.step for m in measurements])
        return law.half_width(LEVEL), law.std


class LinearAggregate(Aggregate):
    """An output that is a linear combination of measurements, clamped to what the true answer can be."""

    @abstractmethod
    def terms(self, recipe: OutputRecipe) -> Terms:
        """The combination, as (coefficient, measurement index) pairs."""

    @abstractmethod
    def limits(self, recipe: OutputRecipe) -> tuple[float, float]:
        """What the true answer can be: the value and its interval are clamped to it."""

    def interval_method(self, recipe: OutputRecipe) -> LinearInterval:
        return LONE_QUANTILE if len(self.terms(recipe)) == 1 else SUMMED_NOISE

    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        terms = self.terms(recipe)
        (first, index), rest = terms[0], terms[1:]
        value = first * cells.real(index)
        for coefficient, index in rest:
            value = value + coefficient * cells.real(index)
        method = self.interval_method(recipe) if cells.combination is None else CombinedNoise(cells.combination)
        width, std = method.spread(terms, cells.measurements)
        lower, upper = self.limits(recipe)
        # Clamping to what the true answer can be is post-processing; the interval keeps its coverage.
        clamped = (np.clip(v, lower, upper) for v in (value, value - width, value + width))
        return Estimate(*clamped, np.full(cells.groups, std))

    def width(self, recipe: OutputRecipe, measurements: Sequence[Measurement],
              combination: Combination | None = None) -> float:
        """The half-width of the interval, the same for every group (with a combination: of the estimate's)."""
        method = self.interval_method(recipe) if combination is None else CombinedNoise(combination)
        return method.spread(self.terms(recipe), measurements)[0]


def in_type(estimate: Estimate, kind: str) -> Estimate:
    """An estimate as a value of the DuckDB type `kind`, within its range (a noisy sum of large integers could leave
    a BIGINT's, and the cast would fail after the charge). A type of whole numbers (integers, BOOLEAN) takes the
    value rounded, and the whole numbers within the interval, widened to hold that value: the true value is a whole
    number, so the interval holds it exactly when the unrounded one does. (A count or sum measured with integer
    noise on an integer grid is already whole.) Rounding is half to even, as numpy does: post-processing either way."""
    limits = released_range(kind)
    if limits is None:
        return estimate
    lowest, highest, whole = limits
    value, low, high, std = estimate
    if whole:
        value = np.round(value)
        low, high = np.minimum(value, np.ceil(low)), np.maximum(value, np.floor(high))
    return Estimate(*(np.clip(part, lowest, highest) for part in (value, low, high)), std)


def rounded_count(count: np.ndarray) -> np.ndarray:
    """A noisy count as COUNT releases it (in_type of BIGINT, at least 0): the count an empty group is judged by."""
    return np.maximum(np.round(count), 0.0)


def counted_rows(call: AggregateCall) -> MeasurementSpec:
    """The count an output over `call`'s argument divides by or adds: the rows where the argument is not NULL
    (all rows when it never is, so that COUNT(*) and AVG(x) share one count)."""
    return MeasurementSpec(MeasurementKind.ROWS, call.argument if call.nullable else None)


def counting_pair(call: AggregateCall, measures: Measures) -> tuple[Pair, bool] | None:
    """The pair whose sums count the rows `counted_rows(call)` counts, and whether its NULL rows must be added: the
    argument's own pair for the rows where it is not NULL; for all rows, a pair of an argument that is never NULL,
    else the pair of split_by with its NULL rows. None when the plan measures no such pair."""
    if call.argument is not None and call.nullable:
        pair = measures.pair(call.argument)
        return (pair, False) if pair is not None else None
    whole = next((p for p in measures.pairs if not p.nullable), None)
    if whole is not None:
        return whole, False
    split = measures.pair(measures.split_by) if measures.split_by is not None else None
    return (split, True) if split is not None else None


@dataclass(frozen=True)
class BoundedArgument:
    """The argument of SUM, AVG, VAR or STDDEV on its fixed-point grid, and the sizes its budget weights use."""

    call: AggregateCall

    @functools.cached_property
    def point(self) -> FixedPoint:
        return fixed_point(self.call.interval)

    @property
    def center(self) -> float:
        return self.point.center_value

    @property
    def half(self) -> float:
        """Half the width of the bounds."""
        return float(self.point.bound * self.point.step)

    @property
    def typical(self) -> float:
        """The size of a value: errors are weighed relative to it."""
        return max(abs(self.center), self.half) or 1.0

    def total(self, plain: bool = False) -> MeasurementSpec:
        """The sum of the centered values, or with `plain` of the values themselves."""
        return MeasurementSpec(MeasurementKind.SUM, self.call.argument, self.point, plain=plain)


def number(value: float) -> str:
    """A number as explain prints it."""
    return f"{value:.4g}"
