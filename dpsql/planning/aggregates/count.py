"""COUNT(*) and COUNT(expr): one count of the bounded rows (of those where expr is not NULL, if it can be)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpsql.analysis.check import COUNT, AggregateCall
from dpsql.planning.aggregates.base import (
    LONE_QUANTILE,
    PAIRED_COUNTS,
    SUMMED_NOISE,
    LinearAggregate,
    LinearInterval,
    Terms,
    counted_rows,
    counting_pair,
    number,
)
from dpsql.planning.measurements import Measurement, MeasurementKind, MeasurementSpec, Measures, OutputRecipe


class Count(LinearAggregate):
    """Released as a BIGINT (AggregateCall.type): a whole number, its interval the whole numbers within the
    unrounded one (base.in_type); a pair's noise is continuous, so that interval's ends are not whole numbers, and at
    large epsilon it can be narrower than one."""

    kind = COUNT
    listed_as = "COUNT"

    def recipe(self, call: AggregateCall, max_rows: int, measures: Measures, plain: bool) -> OutputRecipe:
        found = counting_pair(call, measures)
        if found is not None:
            # (ABOVE + BELOW [+ NULLS]) / (hi - lo): every row counted adds hi - lo to them (measurements.Pair).
            pair, with_nulls = found
            specs = (pair.above, pair.below, *([pair.nulls] if with_nulls else []))
            coefficient = 1 / pair.width
            return OutputRecipe(call, linear=tuple((coefficient, measures.use(s, coefficient**2)) for s in specs))
        rows = counted_rows(call)
        if rows.argument is None and measures.split_by is not None:
            # Every row is NULL in split_by or not: the two disjoint counts, one share for both, add up to COUNT(*).
            nulls = measures.use(MeasurementSpec(MeasurementKind.NULLS, measures.split_by), 1.0)
            values = measures.use(MeasurementSpec(MeasurementKind.ROWS, measures.split_by), 1.0)
            return OutputRecipe(call, parts=(nulls, values))
        return OutputRecipe(call, count=measures.use(rows, 1.0))

    def terms(self, recipe: OutputRecipe) -> Terms:
        if recipe.linear:
            return recipe.linear
        if recipe.parts:
            return tuple((1.0, part) for part in recipe.parts)
        return ((1.0, recipe.count),)

    def interval_method(self, recipe: OutputRecipe) -> LinearInterval:
        if recipe.linear:
            return SUMMED_NOISE  # the pair's noise is on a grid of 2**-29 of a row or finer: continuous
        return PAIRED_COUNTS if recipe.parts else LONE_QUANTILE

    def limits(self, recipe: OutputRecipe) -> tuple[float, float]:
        return 0.0, math.inf

    def formula(self, recipe: OutputRecipe, measurements: Sequence[Measurement]) -> tuple[str, str]:
        value = " + ".join(f"m{i}" for _, i in self.terms(recipe))
        whole = ""
        if recipe.linear:  # a pair's sums over hi - lo, with an interval of fractional ends
            value, whole = f"({value}) / {number(1 / recipe.linear[0][0])}", " (its whole numbers)"
        return f"{value}, at least 0", f"+/-{number(self.width(recipe, measurements))}{whole}"
