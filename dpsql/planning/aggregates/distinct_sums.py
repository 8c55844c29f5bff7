"""SUM(DISTINCT x) and AVG(DISTINCT x) of a bounded argument: over the distinct values of x among the bounded rows
(after the cap of m rows per unit), each value clamped to x's bounds and held on its fixed-point grid, so that two
values are one when their grid points are (values closer than a grid step, or beyond a bound, merge).

Sensitivity. Removing one unit removes its at most m capped rows and changes no other row. In a group where it had
c_g rows, the set of distinct values can only lose values, at most c_g of them (a value disappears only when every
row holding it was the unit's; one another unit also holds stays), and gains none. Each value lost moves the sum of
the centered values by at most the half-width of the bounds (the plain sum by max(|lo|, |hi|)) and the count of
distinct values by 1: so the vectors move by at most sum c_g <= m times that, in L1 and L2, the sensitivity of the
same sums over rows. AVG(DISTINCT x) = center + S' / N' from the two, as AVG; SUM(DISTINCT x) is measured plain, or
centered with the count, whichever the planner finds more accurate (as SUM). No pair of complementary sums: the
planner's pairs are over rows.
"""

from __future__ import annotations

from dataclasses import replace

from dpsql.analysis.check import AggregateCall, AggregateKind
from dpsql.planning.aggregates.average import Average
from dpsql.planning.aggregates.base import BoundedArgument
from dpsql.planning.aggregates.total import Sum
from dpsql.planning.measurements import MeasurementKind, MeasurementSpec, Measures, OutputRecipe


def distinct_count(call: AggregateCall) -> MeasurementSpec:
    """COUNT(DISTINCT x) on x's grid: the count SUM(DISTINCT x) adds its center times, AVG(DISTINCT x) divides by."""
    return MeasurementSpec(MeasurementKind.ROWS, call.argument, BoundedArgument(call).point, distinct=True)


class _DistinctMeasures(Measures):
    """The planner's Measures, with every sum and count a SUM or AVG asks for taken over distinct values."""

    def __init__(self, measures: Measures, call: AggregateCall) -> None:
        self.__dict__.update(measures.__dict__)  # shares the planner's lists: what is used is used there
        self._count = distinct_count(call)

    def use(self, spec: MeasurementSpec, weight: float) -> int:
        if spec.kind is MeasurementKind.ROWS:
            spec = self._count
        elif spec.kind is MeasurementKind.SUM:
            spec = replace(spec, distinct=True)
        return Measures.use(self, spec, weight)

    def pair(self, argument):  # no pairs over distinct values
        return None


class SumDistinct(Sum):
    kind = AggregateKind("sum_distinct")
    listed_as = "SUM(DISTINCT x)"
    functions = ()  # SUM with DISTINCT: check.py reads it through Vocabulary.distinct
    distinct_of = AggregateKind("sum")
    pairable = False

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        return super().recipe(call, max_rows, _DistinctMeasures(measures, call), plain)


class AverageDistinct(Average):
    kind = AggregateKind("avg_distinct")
    listed_as = "AVG(DISTINCT x)"
    functions = ()
    distinct_of = AggregateKind("avg")
    pairable = False

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        return super().recipe(call, max_rows, _DistinctMeasures(measures, call), plain)
