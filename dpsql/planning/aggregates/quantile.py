"""MEDIAN, the quantile calls, MIN and MAX: one exponential-mechanism measurement each (dp/quantile.py).

The measurement is the rows per candidate of a grid over the argument's bounds; the release chooses one candidate
per group by report-noisy-max and measures the interval around it (dp/quantile_interval.py), so the value and the
interval arrive ready here. MIN and MAX are the 0 and 1 quantiles (the same measurement as QUANTILE_CONT(x, 0) and
(x, 1)): no DP mechanism finds the true extreme, which one row moves anywhere within the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.analysis.quantile_calls import QUANTILE_CALLS
from dpsql.dp.quantile import QuantileRelease, grid_for
from dpsql.planning.aggregates.base import Aggregate, Estimate, IntervalMethod, NoisyCells, released_as
from dpsql.planning.measurements import Measurement, MeasurementKind, MeasurementSpec, Measures, OutputRecipe


class NoisyRanks(IntervalMethod):
    """The release computed the interval with the value (dp/quantile_interval.py): this reads both out."""

    name = "noisy counts of the rows around the chosen value, per group"

    def estimate(self, released: Sequence[QuantileRelease]) -> Estimate:
        value, low, high = (np.array([getattr(r, part) for r in released], dtype=float)
                            for part in ("value", "low", "high"))
        return Estimate(value, low, high, np.full(len(released), math.nan))


NOISY_RANKS = NoisyRanks()


@dataclass(frozen=True, kw_only=True)
class Quantile(Aggregate):
    kind: AggregateKind
    listed_as: str
    functions: tuple[type[exp.Expression], ...]
    extreme: str | None = None  # "min" or "max"; None for a quantile with its own fraction

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        grid = grid_for(call.interval.lo, call.interval.hi, call.integer)
        fraction = call.fraction if self.extreme is None else Fraction(int(self.extreme == "max"))
        spec = MeasurementSpec(MeasurementKind.QUANTILE, exp.cast(call.argument.copy(), "DOUBLE"), grid=grid,
                               fraction=fraction)
        # Budget weight: the rank error in rows is like a count's noise times about ln(candidates) max(q, 1 - q)
        # (the mechanism's tail, dp/quantile.utility_tail, over its sensitivity), so weigh it as such a count.
        spread = max(fraction, 1 - fraction)
        weight = (math.log(grid.candidates) * float(spread)) ** 2 / 2
        return OutputRecipe(call, count=measures.use(spec, weight))

    def interval_method(self, recipe: OutputRecipe) -> NoisyRanks:
        return NOISY_RANKS

    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        return self.interval_method(recipe).estimate(list(cells.noisy[:, recipe.count]))

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        return f"m{recipe.count}: {measurements[recipe.count].mechanism.describe()}", ""

    def explain(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> str:
        """Without an interval the mechanism's description says so, and no interval method is named."""
        if not getattr(measurements[recipe.count].mechanism, "interval_share", 1):
            return self.formula(recipe, measurements)[0] + released_as(recipe.call.type)
        return super().explain(recipe, measurements)


QUANTILE = Quantile(kind=AggregateKind("quantile"), listed_as="MEDIAN, QUANTILE_CONT", functions=QUANTILE_CALLS)
MINIMUM = Quantile(kind=AggregateKind("min"), listed_as="MIN", functions=(exp.Min,), extreme="min")
MAXIMUM = Quantile(kind=AggregateKind("max"), listed_as="MAX", functions=(exp.Max,), extreme="max")
QUANTILES = (QUANTILE, MINIMUM, MAXIMUM)
