"""AVG(x) of a bounded argument: the center of the bounds plus a sum of centered values over a count,
AVG = mid + S' / N', clamped to the bounds (a noisy count below 1 counts as 1)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.planning.aggregates.base import (
    FIDUCIAL,
    LEVEL,
    Aggregate,
    BoundedArgument,
    Estimate,
    Fiducial,
    NoisyCells,
    counted_rows,
    number,
)
from dpsql.planning.measurements import Measurement, Measures, OutputRecipe


class Average(Aggregate):
    kind = AggregateKind("avg")
    listed_as = "AVG"
    functions = (exp.Avg,)

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        argument = BoundedArgument(call)
        total = measures.use(argument.total(), 1 / argument.typical**2)
        count = measures.use(counted_rows(call), argument.half**2 / 3 / argument.typical**2)
        return OutputRecipe(call, count=count, total=total, point=argument.point)

    def interval_method(self, recipe: OutputRecipe) -> Fiducial:
        return FIDUCIAL

    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        return self.interval_method(recipe).estimate([recipe.count, recipe.total], _average(recipe), cells)

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        interval = recipe.point.interval
        total = measurements[recipe.total]
        width = total.mechanism.half_width(LEVEL) * float(total.spec.step)
        return (f"{number(recipe.point.center_value)} + m{recipe.total} / m{recipe.count}, clamped to "
                f"[{number(interval.lo)}, {number(interval.hi)}]", f"about +/-{number(width)} / count")


def _average(recipe: OutputRecipe) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    center, lower, upper = recipe.point.center_value, recipe.point.interval.lo, recipe.point.interval.hi

    def output(count: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.clip(center + total / np.maximum(count, 1.0), lower, upper)
    return output
