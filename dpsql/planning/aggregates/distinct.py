"""COUNT(DISTINCT expr) and APPROX_COUNT_DISTINCT(expr) of any row expression: one exact count of the distinct
non-NULL values among the bounded rows (after the cap of m rows per unit), estimated like a count.

Sensitivity. Removing one unit removes its at most m capped rows and changes no other row (the cap ranks rows
within a unit only). In a group where it had c_g rows, the distinct count can only fall, by at most c_g (each value
that disappears had one of its rows), so the vector moves by at most sum c_g <= m in L1 and in L2, whatever
equality the engine uses (collation, case, trailing spaces, -0.0): the count is a function of the set of rows.
That is the sensitivity of COUNT(*), which `row_range` (0, 1) gives. Values shared by different units give no
better bound in general, so none is claimed.

(A smaller bound, one value per group, would hold for an expression constant within each unit, such as one of
per_unit columns; it is not claimed yet.) A query cannot route around the bound: the argument is vetted like any
row expression, failures become NULL (not counted), and the count is taken over the capped rows only.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.check import COUNT_DISTINCT, AggregateCall
from dpsql.planning.aggregates.count import Count
from dpsql.planning.measurements import MeasurementKind, MeasurementSpec, Measures, OutputRecipe


def distinct_values(call: AggregateCall, kind: MeasurementKind) -> MeasurementSpec:
    """The measurement of `call`. The argument is wrapped in DISTINCT so that the rewrite projects it unchanged
    (not clamped or put on a SUM's grid, which would merge values) and apart from a SUM or COUNT of the same x."""
    return MeasurementSpec(kind, exp.Distinct(expressions=[call.argument.copy()]))


class DistinctValues(Count):
    """A count like COUNT(*), of distinct values rather than rows: estimated and explained the same way."""

    kind = COUNT_DISTINCT
    listed_as = "COUNT(DISTINCT expr)"
    functions = ()  # COUNT and APPROX_COUNT_DISTINCT are read by check.py
    measured_as = MeasurementKind.DISTINCT

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        return OutputRecipe(call, count=measures.use(distinct_values(call, self.measured_as), 1.0))
