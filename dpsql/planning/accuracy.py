"""Ask for accuracy, not epsilon: the smallest epsilon whose plan gives every released noisy cell a 95% interval no
wider than +/- the asked accuracy.

Which queries qualify: those whose every noisy output is an aggregate as such (not an expression of one) with a
half-width fixed by the plan alone: COUNT, COUNT(DISTINCT ...), SUM (LinearAggregate: a fixed combination of
measurements, the same half-width in every group, clamping only shrinks it). AVG, VAR, STDDEV divide by a noisy
count, and a quantile's interval follows the rows around its value: their widths depend on the data, so a query
with one of them is refused with the reason, before anything is read or charged.

The search reads only the SQL, the policy and the plan, never the data, so the epsilon it picks says nothing about
the data. Epsilons are searched on a grid of three significant digits (1.00e-9, 1.01e-9, ..., 9.99e5): the answer
is the smallest grid value that meets the accuracy, so one grid step smaller does not. Every plan's shares grow in
proportion to epsilon and each mechanism's half-width falls as its share grows, so the widths fall with epsilon and
a bisection over the grid finds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.check import CheckedQuery
from dpsql.errors import ProgrammingError, QueryRejected, shown
from dpsql.planning.aggregates import aggregate
from dpsql.planning.aggregates.base import LinearAggregate
from dpsql.planning.plan import Budget, QueryPlan
from dpsql.sql import names

_DIGITS = 900  # grid values per decade: 1.00 .. 9.99
_LOWEST = -9  # the first decade: 1e-9 (the session's smallest epsilon)


def grid_epsilon(index: int) -> Fraction:
    """The index-th epsilon of the grid, exactly."""
    decade, digits = divmod(index, _DIGITS)
    return Fraction(100 + digits, 100) * Fraction(10) ** (decade + _LOWEST)


def widest_half_width(query_plan: QueryPlan) -> float:
    """The largest 95% half-width of the cells the plan releases (each output is a bare linear aggregate)."""
    return max((aggregate(r.call).width(r, query_plan.measurements) for r in query_plan.recipes), default=0.0)


def refuse_unsized(query: CheckedQuery) -> None:
    """QueryRejected unless every released noisy cell has a half-width the plan alone fixes."""
    for call in query.aggregates:
        if not isinstance(aggregate(call), LinearAggregate):
            raise QueryRejected(f"{call.text}: its interval depends on the data (AVG, VAR and STDDEV divide by a noisy "
                                "count; a quantile's interval follows the rows around its value), so no epsilon can "
                                "be chosen for an accuracy before running it: ask with an epsilon, or ask for SUM and "
                                "COUNT, which an accuracy can size")
    for name, item, noisy in zip(query.output_names, query.outer.expressions, query.output_noisy, strict=True):
        if noisy and not (isinstance(item.this, exp.Column) and names.aggregate_index(item.this) is not None):
            raise QueryRejected(f"output {name}: an accuracy sizes the aggregates themselves; compute with them after "
                                "the query, or ask with an epsilon")


def budget_for_accuracy(query: CheckedQuery, accuracy: float, template: Budget, ceiling: Fraction,
                        make_plan: Callable[[CheckedQuery, Budget], QueryPlan]) -> Budget:
    """The budget (template's accounting, mechanism and delta) with the smallest grid epsilon, at most `ceiling`,
    whose plan meets the accuracy; ProgrammingError naming the widest half-width when even `ceiling` does not."""
    if isinstance(accuracy, bool) or not isinstance(accuracy, int | float | Fraction) or not (
            math.isfinite(float(accuracy)) and accuracy > 0):
        raise ProgrammingError(f"accuracy must be a finite number > 0, got {shown(accuracy)}")
    refuse_unsized(query)

    def meets(index: int) -> bool:
        return widest_half_width(make_plan(query, replace(template, epsilon=grid_epsilon(index)))) <= accuracy

    low, high = 0, index_at_most(ceiling)
    if high < 0 or not meets(high):
        widest = widest_half_width(make_plan(query, replace(template, epsilon=ceiling))) if high >= 0 else math.inf
        raise ProgrammingError(f"an accuracy of +/-{float(accuracy):g} needs more than epsilon {float(ceiling):g} "
                               f"(at that epsilon the widest 95% interval is +/-{widest:.4g})")
    if meets(low):
        return replace(template, epsilon=grid_epsilon(low))
    while high - low > 1:  # meets(high) and not meets(low)
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return replace(template, epsilon=grid_epsilon(high))


def index_at_most(ceiling: Fraction) -> int:
    """The largest grid index whose epsilon is at most `ceiling` (-1 if none)."""
    low, high = -1, _DIGITS * 20
    while high - low > 1:
        middle = (low + high) // 2
        if grid_epsilon(middle) <= ceiling:
            low = middle
        else:
            high = middle
    return low
