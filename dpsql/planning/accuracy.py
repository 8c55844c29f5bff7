"""Ask for accuracy, not epsilon: the smallest epsilon whose plan gives every released noisy cell with a target
(planning/targets.py) a 95% interval no wider than +/- it.

Here: the outputs whose half-width the plan alone fixes: COUNT, COUNT(DISTINCT ...), SUM (LinearAggregate: a fixed
combination of measurements, the same half-width in every group, clamping only shrinks it). AVG, VAR, STDDEV divide
by a noisy count, so their targets are met in two stages (session.py, planning/targets.py); a quantile's interval
follows the rows around its value, and an expression of an aggregate is no aggregate: those are refused with the
reason (targets.py), before anything is read or charged.

The search reads only the SQL, the policy and the plan, never the data, so the epsilon it picks says nothing about
the data. Epsilons are searched on a grid of three significant digits (1.00e-9, 1.01e-9, ..., 9.99e5): the answer
is the smallest grid value that meets the accuracy, so one grid step smaller does not. Every plan's shares grow in
proportion to epsilon and each mechanism's half-width falls as its share grows, so the widths fall with epsilon and
a bisection over the grid finds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from fractions import Fraction

from dpsql.analysis.check import CheckedQuery
from dpsql.errors import ProgrammingError
from dpsql.planning.aggregates import aggregate
from dpsql.planning.aggregates.base import LinearAggregate
from dpsql.planning.plan import Budget, QueryPlan

_DIGITS = 900  # grid values per decade: 1.00 .. 9.99
_LOWEST = -9  # the first decade: 1e-9 (the session's smallest epsilon)


def grid_epsilon(index: int) -> Fraction:
    """The index-th epsilon of the grid, exactly."""
    decade, digits = divmod(index, _DIGITS)
    return Fraction(100 + digits, 100) * Fraction(10) ** (decade + _LOWEST)


def widest_half_width(query_plan: QueryPlan) -> float:
    """The largest 95% half-width of the cells the plan releases (each output is a bare linear aggregate)."""
    return max((aggregate(r.call).width(r, query_plan.measurements) for r in query_plan.recipes), default=0.0)


def widest_asked(query_plan: QueryPlan, asked: Mapping[int, float]) -> tuple[float, float]:
    """Of the linear outputs given a target (by aggregate index), the largest ratio of half-width to target, and that
    half-width: at most 1 when every one is met."""
    worst = (0.0, 0.0)
    for index, target in asked.items():
        recipe = query_plan.recipes[index]
        kind = aggregate(recipe.call)
        if isinstance(kind, LinearAggregate):
            width = kind.width(recipe, query_plan.measurements)
            worst = max(worst, (width / target, width))
    return worst


def budget_for_accuracy(query: CheckedQuery, asked: Mapping[int, float], template: Budget, ceiling: Fraction,
                        make_plan: Callable[[CheckedQuery, Budget], QueryPlan]) -> Budget:
    """The budget (template's accounting, mechanism and delta) with the smallest grid epsilon, at most `ceiling`,
    whose plan gives every linear output with a target (planning/targets.py) a half-width within it;
    ProgrammingError naming the widest when even `ceiling` does not. Without a linear target, the template."""
    if not any(isinstance(aggregate(query.aggregates[i]), LinearAggregate) for i in asked):
        return template

    def meets(index: int) -> bool:
        return widest_asked(make_plan(query, replace(template, epsilon=grid_epsilon(index))), asked)[0] <= 1

    low, high = 0, index_at_most(ceiling)
    if high < 0 or not meets(high):
        widest = widest_asked(make_plan(query, replace(template, epsilon=ceiling)), asked)[1] if high >= 0 else \
            math.inf
        target = min(asked.values())
        raise ProgrammingError(f"an accuracy of +/-{target:g} needs more than epsilon {float(ceiling):g} "
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
