"""COUNT(*) and COUNT(expr): one count of the bounded rows (of those where expr is not NULL, if it can be)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpsql.analysis.check import COUNT, AggregateCall
from dpsql.planning.aggregates.base import LinearAggregate, Terms, counted_rows, number
from dpsql.planning.measurements import Measurement, Measures, OutputRecipe


class Count(LinearAggregate):
    kind = COUNT
    listed_as = "COUNT"
    output_type = "BIGINT"

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        return OutputRecipe(call, count=measures.use(counted_rows(call), 1.0))

    def terms(self, recipe: OutputRecipe) -> Terms:
        return ((1.0, recipe.count),)

    def limits(self, recipe: OutputRecipe) -> tuple[float, float]:
        return 0.0, math.inf

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        return f"m{recipe.count}, at least 0", f"+/-{number(self.width(recipe, measurements))}"
