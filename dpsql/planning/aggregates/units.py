"""COUNT(DISTINCT unit): how many privacy units have a row. One unit changes it by at most 1."""

from __future__ import annotations

from dpsql.analysis.check import COUNT_UNITS, AggregateCall
from dpsql.planning.aggregates.count import Count
from dpsql.planning.measurements import MeasurementKind, MeasurementSpec, Measures, OutputRecipe


class Units(Count):
    """A count like COUNT(*), of units rather than rows: estimated and explained the same way."""

    kind = COUNT_UNITS
    listed_as = "COUNT(DISTINCT unit)"

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        # With one row per unit, counting rows is counting units: the same measurement serves both.
        kind = MeasurementKind.ROWS if max_rows == 1 else MeasurementKind.UNITS
        return OutputRecipe(call, count=measures.use(MeasurementSpec(kind), 1.0))
