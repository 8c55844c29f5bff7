"""SUM(x) of a bounded argument: one plain sum of the values, or a sum of values centered on the middle of the
bounds plus that center times a count (SUM = S' + mid * N'), or from the argument's pair of complementary sums
(measurements.Pair). Which has the smallest error depends on the other outputs (a count AVG or COUNT already pays
for is shared), so the planner tries each."""

from __future__ import annotations

import math
from collections.abc import Sequence

from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.planning.aggregates.base import BoundedArgument, LinearAggregate, Terms, counted_rows, number
from dpsql.planning.measurements import Measurement, Measures, OutputRecipe


class Sum(LinearAggregate):
    kind = AggregateKind("sum")
    listed_as = "SUM"
    functions = (exp.Sum,)
    measured_two_ways = True
    pairable = True

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        argument = BoundedArgument(call)
        pair = measures.pair(call.argument)
        if pair is not None:
            # (hi ABOVE + lo BELOW) / (hi - lo): measurements.Pair
            (lo, hi), width = pair.ends, pair.width
            above = measures.use(pair.above, (hi / width / argument.typical) ** 2)
            below = measures.use(pair.below, (lo / width / argument.typical) ** 2)
            return OutputRecipe(call, linear=((hi / width, above), (lo / width, below)), point=argument.point)
        if plain:
            total = measures.use(argument.total(plain=True), 1 / argument.typical**2)
            return OutputRecipe(call, total=total, point=argument.point)
        total = measures.use(argument.total(), 1 / argument.typical**2)
        count = measures.use(counted_rows(call), argument.center**2 / argument.typical**2)
        return OutputRecipe(call, count=count, total=total, point=argument.point)

    def terms(self, recipe: OutputRecipe) -> Terms:
        if recipe.linear:
            return recipe.linear
        if recipe.count is None:
            return ((1.0, recipe.total),)
        return (1.0, recipe.total), (recipe.point.center_value, recipe.count)

    def limits(self, recipe: OutputRecipe) -> tuple[float, float]:
        """A sum of values that cannot be negative cannot be negative, nor one of values that cannot be positive
        positive."""
        interval = recipe.point.interval
        return 0.0 if interval.lo >= 0 else -math.inf, 0.0 if interval.hi <= 0 else math.inf

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        if recipe.linear:
            (high, above), (low, below) = recipe.linear
            return f"{number(high)} * m{above} + {number(low)} * m{below}", \
                f"+/-{number(self.width(recipe, measurements))}"
        if recipe.count is None:
            return f"m{recipe.total}", f"+/-{number(self.width(recipe, measurements))}"
        return f"m{recipe.total} + {number(recipe.point.center_value)} * m{recipe.count}", ""
