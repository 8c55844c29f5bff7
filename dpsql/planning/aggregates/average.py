"""AVG(x) of a bounded argument: the center of the bounds plus a sum of centered values over a count,
AVG = mid + S' / N', clamped to the bounds (a noisy count between 1/2 and 1 counts as 1); or the same from the
argument's pair of complementary sums, S' = (ABOVE - BELOW) / 2 and N' = (ABOVE + BELOW) / (hi - lo)
(measurements.Pair). Where N' rounds to 0, as COUNT(x) would be released, the cell is NULL: SQL's AVG of no values
(docs/explanation/aggregates.md, "Empty groups")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.planning.aggregates.base import (
    FIDUCIAL,
    LEVEL,
    SUMMED_NOISE,
    Aggregate,
    BoundedArgument,
    Estimate,
    Fiducial,
    NoisyCells,
    counted_rows,
    number,
    rounded_count,
)
from dpsql.planning.measurements import Measurement, Measures, OutputRecipe


class Average(Aggregate):
    kind = AggregateKind("avg")
    listed_as = "AVG"
    functions = (exp.Avg,)
    pairable = True

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        argument = BoundedArgument(call)
        pair = measures.pair(call.argument)
        if pair is not None:
            # AVG = lo + (hi - lo) ABOVE / (ABOVE + BELOW) moves by (hi - AVG) / (hi - lo) / N' per unit of ABOVE and
            # by (AVG - lo) / (hi - lo) / N' per unit of BELOW: squared, 1/3 each for values spread over the bounds.
            weight = 1 / 3 / argument.typical**2
            return OutputRecipe(call, pair=(measures.use(pair.above, weight), measures.use(pair.below, weight)),
                                point=argument.point)
        total = measures.use(argument.total(), 1 / argument.typical**2)
        count = measures.use(counted_rows(call), argument.half**2 / 3 / argument.typical**2)
        return OutputRecipe(call, count=count, total=total, point=argument.point)

    def interval_method(self, recipe: OutputRecipe) -> Fiducial:
        return FIDUCIAL

    def estimate(self, recipe: OutputRecipe, cells: NoisyCells) -> Estimate:
        if recipe.pair is not None:
            return self.interval_method(recipe).estimate(list(recipe.pair), _average_of_pair(recipe), cells)
        return self.interval_method(recipe).estimate([recipe.count, recipe.total], _average(recipe), cells)

    def empty(self, recipe: OutputRecipe, cells: NoisyCells) -> np.ndarray:
        """NULL where COUNT(x), released from the same noisy count, would be 0: nothing to average."""
        if recipe.pair is not None:
            above, below = recipe.pair
            count = (cells.real(above) + cells.real(below)) / recipe.point.width
        else:
            count = cells.real(recipe.count)
        return rounded_count(count) < 1

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        interval = recipe.point.interval
        if recipe.pair is not None:
            above, below = recipe.pair
            spread = SUMMED_NOISE.spread(((0.5, above), (-0.5, below)), measurements)[0]  # the centered sum's
            return (f"{number(recipe.point.center_value)} + (m{above} - m{below}) / 2 / ((m{above} + m{below}) / "
                    f"{number(recipe.point.width)}), clamped to [{number(interval.lo)}, {number(interval.hi)}], "
                    "NULL where that count rounds to 0", f"about +/-{number(spread)} / count")
        total = measurements[recipe.total]
        width = total.mechanism.half_width(LEVEL) * float(total.spec.step)
        return (f"{number(recipe.point.center_value)} + m{recipe.total} / m{recipe.count}, clamped to "
                f"[{number(interval.lo)}, {number(interval.hi)}], NULL where m{recipe.count} rounds to 0",
                f"about +/-{number(width)} / count")


def _average(recipe: OutputRecipe) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    center, lower, upper = recipe.point.center_value, recipe.point.interval.lo, recipe.point.interval.hi

    def output(count: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.clip(center + total / np.maximum(count, 1.0), lower, upper)
    return output


def _average_of_pair(recipe: OutputRecipe) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """AVG from the pair: `_average` of the count (ABOVE + BELOW) / (hi - lo) and the centered sum
    (ABOVE - BELOW) / 2."""
    average, width = _average(recipe), recipe.point.width

    def output(above: np.ndarray, below: np.ndarray) -> np.ndarray:
        return average((above + below) / width, (above - below) / 2)
    return output
