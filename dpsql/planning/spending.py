"""How much a query spends when released measurements are at hand (planning/reuse.py): nothing, when estimates from
them are as accurate as the query asks; else only what is missing, measured now at the least cost that reaches it,
and combined with them.

What "as accurate as the query asks" means, per output (a `Requirement`):
- COUNT, SUM and the other linear outputs: the 95% half-width of the law of its combined noise at most a width: the
  analyst's accuracy for that column, or what the query answered on its own would get (within TOLERANCE: the
  combined interval is conservative where the plain one is exact or continuous).
- AVG, VAR, STDDEV: an error proxy, sum_j w_j Var_j over the measurements it reads (the first-order weights the
  split uses, planning/plan.py), at most what the query answered on its own would get; or, sized for an accuracy
  (planning/targets.py), a sum of its measurements' half-widths over the smallest count the released ones allow.

The charge is searched among epsilons of three significant digits (planning/accuracy.py's grid): the smallest that
meets every requirement when the budget items that need it are measured now (an item with a measurement the stored
ones cannot estimate, or estimate with more variance than the query's own measurement would have), the others
estimated from released cells alone, each measurement's estimate combining both (reuse.combine). Among the ways of
measuring the query (plan.candidate_plans), the cheapest wins; a query that would spend as much as on its own is
answered on its own. None of this reads the data: only the policy, the plans and the laws of the released noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from dpsql.planning.accuracy import grid_epsilon, index_at_most
from dpsql.planning.aggregates import LEVEL, aggregate
from dpsql.planning.aggregates.base import LinearAggregate
from dpsql.planning.functionals import Functional, functional, nullable_arguments
from dpsql.planning.measurements import MeasurementKind, OutputRecipe
from dpsql.planning.plan import Cost, QueryPlan, candidate_plans, remeasured
from dpsql.planning.reuse import (
    Combination,
    Grouping,
    Source,
    StoredMeasurement,
    canonical,
    cells_per_group,
    combine,
    stored_source,
)

TOLERANCE = 1e-3


@dataclass(frozen=True)
class Requirement:
    """What one output (recipe) must reach; None: nothing (an output without a target)."""

    width: float | None = None  # the largest 95% half-width (a linear output)
    proxy: float | None = None  # the largest error proxy sum_j w_j Var_j (AVG, VAR, STDDEV)
    # AVG, VAR, STDDEV sized for an accuracy (planning/targets.py): (bound, k_count, k_total, k_squares), met when
    # the root of the sum of (k h)^2 is at most bound, h the 95% half-width (value units) of the estimate of the
    # output's count, centered sum and sum of squares (a way measuring it from a pair cannot).
    sized: tuple[float, float, float, float] | None = None


def proxy(query_plan: QueryPlan, output: int, combination: Combination | None = None) -> float:
    """The output's error proxy: sum_j w_j Var_j, Var_j the noise variance of measurement j (or of its estimate) in
    value units."""
    total = 0.0
    for j, weight in query_plan.output_weights[output]:
        step = float(query_plan.measurements[j].spec.step)
        variance = combination.variance(j) * step**2 if combination is not None else \
            query_plan.measurements[j].std ** 2
        total += weight * variance
    return total


def as_accurate_as(reference: QueryPlan) -> list[Requirement]:
    """What each output of the query answered on its own (`reference`) gets: the requirements of an epsilon."""
    found = []
    for o, recipe in enumerate(reference.recipes):
        kind = aggregate(recipe.call)
        if isinstance(kind, LinearAggregate):
            found.append(Requirement(width=kind.width(recipe, reference.measurements) * (1 + TOLERANCE)))
        else:
            found.append(Requirement(proxy=proxy(reference, o) * (1 + TOLERANCE)))
    return found


@dataclass(frozen=True)
class Choice:
    """A way of answering with released measurements: the plan (its measurements measured now carry their
    mechanisms at the charged epsilon; the others are estimated only), how each is estimated, and the charge."""

    plan: QueryPlan
    combination: Combination
    cost: Cost


def choose(reference: QueryPlan, stored: Sequence[StoredMeasurement], grouping: Grouping,
           requirements: Sequence[Requirement], ceiling: Fraction | None = None) -> Choice | None:
    """The cheapest way to answer `reference`'s query (as planned on its own) to the requirements with these stored
    measurements of its relation, if one costs less than `ceiling` (default: `reference`'s cost); None otherwise."""
    if reference.selection is not None or any(m.spec.kind is MeasurementKind.QUANTILE
                                              for m in reference.measurements):
        return None
    sources = [stored_source(s, grouping, n) for s in stored if (n := cells_per_group(s, grouping)) is not None]
    if not sources:
        return None
    limit = ceiling if ceiling is not None else reference.cost.epsilon
    return cheapest(candidate_plans(reference.query, reference.budget), sources, requirements, limit)


def targets_of(query_plan: QueryPlan) -> list[Functional | None]:
    """What each measurement of the plan measures (planning/functionals.py), its arguments written canonically."""
    nullable = nullable_arguments(query_plan.query, canonical)
    return [functional(m.spec, canonical, nullable) for m in query_plan.measurements]


def cheapest(candidates: Sequence[QueryPlan], stored: Sequence[Source], requirements: Sequence[Requirement],
             ceiling: Fraction) -> Choice | None:
    """The cheapest way to meet the requirements with the stored sources, spending less than `ceiling` (what the
    query costs on its own); None if no way does."""
    best: Choice | None = None
    for candidate in candidates:
        limit = ceiling if best is None else best.cost.epsilon
        found = _cheapest_for(candidate, stored, requirements, limit)
        if found is not None and found.cost.epsilon < limit:
            best = found
            if best.cost.epsilon == 0:
                break
    return best


def _cheapest_for(candidate: QueryPlan, stored: Sequence[Source], requirements: Sequence[Requirement],
                  limit: Fraction) -> Choice | None:
    targets = targets_of(candidate)
    if any(target is None for target in targets):
        return None  # a quantile: never estimated
    alone = [combine(target, stored) for target in targets]  # type: ignore[arg-type]
    if all(estimate is not None for estimate in alone):
        combination = Combination(tuple(stored), tuple(alone))  # type: ignore[arg-type]
        if meets(candidate, combination, requirements):
            return Choice(_free(candidate, combination), combination, Cost(Fraction(0), Fraction(0)))
    items = _items_to_measure(candidate, alone, stored)
    if not items:
        return None

    def attempt(epsilon: Fraction) -> Combination | None:
        measured = remeasured(candidate, items, epsilon)
        sources = (*stored, *(Source(None, j, targets[j], m.mechanism, m.spec.step)  # type: ignore[arg-type]
                              for j, m in sorted(measured.items())))
        estimates = [combine(target, sources) for target in targets]  # type: ignore[arg-type]
        if any(estimate is None for estimate in estimates):
            return None
        combination = Combination(sources, tuple(estimates))  # type: ignore[arg-type]
        return combination if meets(candidate, combination, requirements) else None

    high = index_at_most(limit)
    if high < 0 or attempt(grid_epsilon(high)) is None:
        return None
    low = -1  # attempt(grid_epsilon(low)) fails, or low is below the grid
    while high - low > 1:
        middle = (low + high) // 2
        if attempt(grid_epsilon(middle)) is not None:
            high = middle
        else:
            low = middle
    epsilon = grid_epsilon(high)
    combination = attempt(epsilon)
    assert combination is not None
    measured = remeasured(candidate, items, epsilon)
    plan = _with_measured(candidate, combination, measured, epsilon)
    return Choice(plan, combination, plan.cost)


def _items_to_measure(candidate: QueryPlan, alone: Sequence[tuple | None],
                      stored: Sequence[Source]) -> list[tuple]:
    """The budget items with a measurement the stored sources estimate worse than measuring it would (or not at all),
    in the plan's order; all of them when every estimate is as good and the requirements still fail (an output
    reading several estimates that share sources)."""
    items: dict[tuple, None] = {}
    for estimate, m in zip(alone, candidate.measurements, strict=True):
        if estimate is None or Combination(tuple(stored), (estimate,)).variance(0) > m.mechanism.variance:
            items[m.spec.budget_item] = None
    if not items:
        items = dict.fromkeys(m.spec.budget_item for m in candidate.measurements)
    return list(items)


def meets(candidate: QueryPlan, combination: Combination, requirements: Sequence[Requirement]) -> bool:
    steps = [m.spec.step for m in candidate.measurements]
    for o, (recipe, requirement) in enumerate(zip(candidate.recipes, requirements, strict=True)):
        kind = aggregate(recipe.call)
        if requirement.width is not None and isinstance(kind, LinearAggregate) and \
                kind.width(recipe, candidate.measurements, combination) > requirement.width:
            return False
        if requirement.proxy is not None and proxy(candidate, o, combination) > requirement.proxy:
            return False
        if requirement.sized is not None and not _sized(recipe, requirement.sized, combination, steps):
            return False
    return True


def _sized(recipe: OutputRecipe, sized: tuple[float, float, float, float], combination: Combination,
           steps: Sequence[Fraction]) -> bool:
    bound, *weights = sized
    parts = (recipe.count, recipe.total, recipe.squares)
    if recipe.count is None or recipe.total is None:
        return False  # from a pair: no count of its own to size by
    squared = 0.0
    for j, weight in zip(parts, weights, strict=True):
        if weight:
            if j is None:
                return False
            squared += (weight * combination.law(((1.0, j),), steps).half_width(LEVEL)) ** 2
    return math.sqrt(squared) <= bound


def _free(candidate: QueryPlan, combination: Combination) -> QueryPlan:
    return QueryPlan(candidate.query, candidate.measurements, candidate.recipes, None, Cost(Fraction(0), Fraction(0)),
                     candidate.budget, candidate.item_weights, candidate.output_weights, combination)


def _with_measured(candidate: QueryPlan, combination: Combination, measured: dict, epsilon: Fraction) -> QueryPlan:
    measurements = tuple(measured.get(j, m) for j, m in enumerate(candidate.measurements))
    budget = replace(candidate.budget, epsilon=epsilon)
    return QueryPlan(candidate.query, measurements, candidate.recipes, None, Cost(epsilon, Fraction(0)), budget,
                     candidate.item_weights, candidate.output_weights, combination)
