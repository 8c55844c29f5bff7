"""VAR_SAMP, VAR_POP, STDDEV_SAMP and STDDEV_POP of a bounded argument, from a count, a sum of centered values
and a sum of their centered squares: VAR = Q/N + C - (S/N)^2, clamped to what the bounds allow, times
N/(N-1) for a sample variance; a standard deviation is its square root. NULL where the noisy count rounds below
the values SQL needs (1, or 2 for a sample variance): docs/explanation/aggregates.md, "Empty groups"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.dp.fixedpoint import fixed_point
from dpsql.dp.interval import Interval
from dpsql.planning.aggregates.base import (
    FIDUCIAL,
    Aggregate,
    BoundedArgument,
    Estimate,
    Fiducial,
    NoisyCells,
    counted_rows,
    rounded_count,
)
from dpsql.planning.measurements import Measurement, MeasurementKind, MeasurementSpec, Measures, OutputRecipe


@dataclass(frozen=True, kw_only=True)
class Spread(Aggregate):
    kind: AggregateKind
    listed_as: str
    functions: tuple[type[exp.Expression], ...]
    sample: bool  # divide by N - 1 rather than N
    root: bool  # the standard deviation rather than the variance

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        # Weights from the first-order error of Q/N + C - (S/N)^2 around values spread over the interval
        # (variance about half^2/3); a standard deviation's relative error is half its variance's.
        argument = BoundedArgument(call)
        half = argument.half
        factor = 0.25 if self.root else 1.0
        typical_var = (half**2 / 3) or 1.0
        square = fixed_point(Interval(0.0, half**2))
        squares = measures.use(MeasurementSpec(MeasurementKind.SUMSQ, call.argument, argument.point, square),
                               factor / typical_var**2)
        total = measures.use(argument.total(), factor * (4 * half**2 / 3) / typical_var**2)
        count = measures.use(counted_rows(call), factor * (half**2 / 6) ** 2 / typical_var**2)
        return OutputRecipe(call, count=count, total=total, squares=squares, point=argument.point)

    def interval_method(self, recipe: OutputRecipe) -> Fiducial:
        return FIDUCIAL

    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        square_center = cells.measurements[recipe.squares].spec.square_point.center_value
        output = self._output(square_center, recipe.point.interval.half_width**2)
        return self.interval_method(recipe).estimate([recipe.count, recipe.total, recipe.squares], output, cells)

    def empty(self, recipe: OutputRecipe, cells: NoisyCells) -> np.ndarray:
        """NULL where COUNT(x), released from the same noisy count, would be 0, or 1 for a sample variance: as
        DuckDB's VAR_SAMP and STDDEV_SAMP of one value, SQL's spread of too few values is NULL."""
        return rounded_count(cells.real(recipe.count)) < (2 if self.sample else 1)

    def _output(self, square_center: float, ceiling: float) -> Callable[..., np.ndarray]:
        sample, root = self.sample, self.root

        def output(count: np.ndarray, total: np.ndarray, squares: np.ndarray) -> np.ndarray:
            n = np.maximum(count, 1.0)
            mean = total / n
            variance = np.clip(squares / n + square_center - mean**2, 0.0, ceiling)
            if sample:
                variance = variance * np.where(n > 1, n / np.maximum(n - 1, 1.0), 1.0)
            if root:
                return np.sqrt(variance)
            return variance
        return output

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        return (f"from m{recipe.squares} (squares), m{recipe.total} and m{recipe.count}, clamped to what the bounds "
                f"allow, NULL where m{recipe.count} rounds below {2 if self.sample else 1}", "")


VAR_SAMP = Spread(kind=AggregateKind("var_samp"), listed_as="VAR", functions=(exp.Variance,), sample=True, root=False)
VAR_POP = Spread(kind=AggregateKind("var_pop"), listed_as="VAR", functions=(exp.VariancePop,), sample=False,
                 root=False)
STDDEV_SAMP = Spread(kind=AggregateKind("stddev_samp"), listed_as="STDDEV", functions=(exp.Stddev, exp.StddevSamp),
                     sample=True, root=True)
STDDEV_POP = Spread(kind=AggregateKind("stddev_pop"), listed_as="STDDEV", functions=(exp.StddevPop,), sample=False,
                    root=True)
SPREADS = (VAR_SAMP, VAR_POP, STDDEV_SAMP, STDDEV_POP)
