"""COUNT(DISTINCT unit): how many privacy units have a row (with FILTER (WHERE c), a row where c holds). One unit
changes it by at most 1 in each group it reaches."""

from __future__ import annotations

from dpsql.analysis.check import COUNT_UNITS, AggregateCall
from dpsql.planning.aggregates.count import Count
from dpsql.planning.measurements import MeasurementKind, MeasurementSpec, Measures, OutputRecipe


class Units(Count):
    """A count like COUNT(*), of units rather than rows: estimated and explained the same way."""

    kind = COUNT_UNITS
    listed_as = "COUNT(DISTINCT unit)"

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        if call.argument is not None:
            # COUNT(DISTINCT unit) FILTER (WHERE c): the units with a row where c holds; one unit adds at most 1 to
            # each group it reaches, as without c (the argument is Distinct(c): projected as the condition itself).
            return OutputRecipe(call, count=measures.use(MeasurementSpec(MeasurementKind.UNITS, call.argument), 1.0))
        # With one row per unit, counting rows is counting units: the same measurement serves both.
        kind = MeasurementKind.ROWS if max_rows == 1 else MeasurementKind.UNITS
        return OutputRecipe(call, count=measures.use(MeasurementSpec(kind), 1.0))
