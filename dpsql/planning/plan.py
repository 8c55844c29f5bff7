"""Stage 3: turn a checked query into measurements, a budget split and a partition-selection rule.

Each aggregate kind says which measurements it needs and how much its error depends on each (aggregates/); the
planner gathers them, so COUNT, SUM and AVG of one column share one count and one normalised sum, compares the
ways of measuring SUM, and splits the budget to minimise the summed squared relative error of the outputs.

Sensitivity follows from the contribution bound: the rewrite keeps at most m rows per privacy unit in the whole
query, so one unit moves the vector of counts by at most m in L1 (and in L2), and a sum whose rows lie in
[-b, b] by at most m*b. One unit's rows can reach at most min(m, number of groups) groups.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.check import COUNT, AggregateCall, CheckedQuery
from dpsql.dp.allocation import objective, split
from dpsql.dp.fixedpoint import fixed_point
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism, Mechanism, smallest
from dpsql.dp.quantile import QuantileMechanism, zcdp_epsilon
from dpsql.dp.quantile_interval import INTERVAL_SHARE
from dpsql.errors import QueryRejected
from dpsql.planning.aggregates import aggregate
from dpsql.planning.contribution import Contribution, contribution
from dpsql.planning.measurements import Measurement, MeasurementKind, MeasurementSpec, Measures, OutputRecipe, Pair
from dpsql.planning.reuse import Combination
from dpsql.policy import Accounting, MechanismKind

MAX_PUBLIC_CELLS = 100_000
_TAIL_MARGIN = 1e-9  # relative: far above the rounding of a float tail, far below any effect on the threshold


@dataclass(frozen=True)
class Selection:
    """DP partition selection: a group is released only if its noisy row count reaches `threshold`."""

    measurement: int
    threshold: int
    delta: float


@dataclass(frozen=True)
class Cost:
    """A query's privacy cost, as exact rationals so that the ledger's sums are exact."""

    epsilon: Fraction
    delta: Fraction

    @property
    def rho(self) -> Fraction:
        """What the query costs under zCDP accounting."""
        return self.epsilon**2 / 2


@dataclass(frozen=True)
class Budget:
    """What a query may spend: its epsilon, its delta for partition selection, and the accounting; and whether a
    quantile's 95% interval is measured (with a quarter of its share) or the value gets all of it."""

    epsilon: Fraction
    delta: Fraction
    accounting: Accounting
    mechanism: MechanismKind
    # Not in the repr, which keys stored answers (store/answers.answer_key adds it when False): answers stored
    # before it existed keep their keys.
    quantile_intervals: bool = field(default=True, repr=False)


@dataclass(frozen=True)
class QueryPlan:
    query: CheckedQuery
    measurements: tuple[Measurement, ...]
    recipes: tuple[OutputRecipe, ...]
    selection: Selection | None
    cost: Cost
    budget: Budget  # what the plan was made for: its accounting and mechanism
    # Per budget item (MeasurementSpec.budget_item), the weight the split gave it: `remeasured` splits anew with it.
    item_weights: tuple[tuple[tuple, float], ...] = field(default=(), repr=False, compare=False)
    # Per output (recipe), (measurement index, weight) pairs: how much one unit of that measurement's noise variance
    # (value units) adds to that output's squared relative error, as the split assumes (planning/spending.py).
    output_weights: tuple[tuple[tuple[int, float], ...], ...] = field(default=(), repr=False, compare=False)
    # When the measurements are estimated from released ones: how (planning/reuse.py); None: all measured now.
    combination: Combination | None = field(default=None, repr=False, compare=False)

    @property
    def max_rows(self) -> int:
        """The contribution bound: how many rows one unit may have in the query."""
        return self.query.table.bound.max_rows

    @functools.cached_property  # read for every candidate group by release (plan.selected)
    def domains(self) -> tuple[tuple, ...] | None:
        """The public values of every key when all keys have them: then every combination is a released group."""
        return public_domains(self.query)

    def public_keys(self) -> list[tuple]:
        """The groups released whatever the data: every combination of the public values of the keys of each
        grouping whose keys all have them (a grouping set's rolled-up keys NULL, its grouping id last)."""
        if not self.query.groupings:
            domains = self.domains
            return list(itertools.product(*domains)) if domains is not None else []
        found: list[tuple] = []
        for grouping in groupings(self.query):
            if grouping.domains is not None:
                found += itertools.product(*grouping.domains)
        return found

    def selected(self, key: tuple) -> bool:
        """Whether a group found in the data goes through partition selection: when it is of a grouping with a key
        without public values, and its keys that have public values hold one of them (and its rolled-up keys NULL)."""
        if self.query.groupings:
            grouping = next((g for g in groupings(self.query) if g.id == key[-1]), None)
            if grouping is None or grouping.domains is not None:
                return False
            return all(value is None if domain == ROLLED_UP else domain is None or value in domain
                       for value, domain in zip(key[:-1], grouping.key_domains, strict=True))
        return self.domains is None and all(k.domain is None or v in k.domain
                                            for v, k in zip(key, self.query.keys, strict=True))


# A rolled-up key's one value in a grouping set's groups (NULL).
ROLLED_UP = (None,)


@dataclass(frozen=True)
class Grouping:
    """One grouping of a query with grouping sets: its id (DuckDB's GROUPING() of all keys), each key's values in
    its groups (ROLLED_UP for a rolled-up key, None for a key without public values), and every key's with the id
    when all have them."""

    id: int
    key_domains: tuple[tuple | None, ...]

    @property
    def domains(self) -> tuple[tuple, ...] | None:
        if any(domain is None for domain in self.key_domains):
            return None
        return (*self.key_domains, (self.id,))


def groupings(query: CheckedQuery) -> list[Grouping]:
    keys = query.keys[:-1]
    return [Grouping(key_id, tuple(k.domain if i in grouping else ROLLED_UP for i, k in enumerate(keys)))
            for grouping, key_id in zip(query.groupings, query.keys[-1].domain, strict=True)]


def public_domains(query: CheckedQuery) -> tuple[tuple, ...] | None:
    if query.groupings:
        return None  # each grouping has its own: QueryPlan.public_keys
    if all(k.domain is not None for k in query.keys):
        return tuple(k.domain for k in query.keys)
    return None


def _public_cells(query: CheckedQuery) -> int | None:
    """How many groups the public values make, when every group is public (else None)."""
    if query.groupings:
        found = [g.domains for g in groupings(query)]
        if any(domains is None for domains in found):
            return None
        return sum(math.prod(len(d) for d in domains) for domains in found)
    domains = public_domains(query)
    return math.prod(len(d) for d in domains) if domains is not None else None


@dataclass(frozen=True)
class _Candidate:
    """One way of measuring the outputs, with the budget weight of each budget item and the objective reached."""

    specs: list[MeasurementSpec]
    recipes: tuple[OutputRecipe, ...]
    sensitivities: list[int]  # what each measurement's mechanism is calibrated to: L1, or L2 rounded up (Gaussian)
    squared: list[int]  # the exact squared L2, for a Gaussian
    items: list[int]  # per measurement, its budget item (measurements of disjoint rows share one)
    weights: list[float]  # per budget item, in value units, floored
    score: float
    output_weights: tuple[tuple[tuple[int, float], ...], ...] = ()


def plan(query: CheckedQuery, budget: Budget) -> QueryPlan:
    """The plan of least expected error among the ways of measuring the query (the first of equals)."""
    setting = _setting(query, budget)
    best = min(setting.candidates, key=lambda candidate: candidate.score)  # the first of equals: the order is fixed
    return _planned(query, budget, setting, best)


def candidate_plans(query: CheckedQuery, budget: Budget) -> list[QueryPlan]:
    """Every way of measuring the query, as a plan at `budget`, best first: when released measurements can stand in
    for some, another way may cost less (planning/spending.py)."""
    setting = _setting(query, budget)
    ordered = sorted(setting.candidates, key=lambda candidate: candidate.score)  # stable: the first of equals first
    found: dict[tuple, QueryPlan] = {}
    for candidate in ordered:
        key = tuple(spec.key for spec in candidate.specs)
        if key not in found:
            found[key] = _planned(query, budget, setting, candidate)
    return list(found.values())


def remeasured(query_plan: QueryPlan, items: Sequence[tuple], epsilon: Fraction) -> dict[int, Measurement]:
    """The plan's measurements of these budget items, measured at a total cost of `epsilon` split between the items
    as the plan weighs them (by index in the plan): what measuring only part of a plan costs."""
    budget = replace(query_plan.budget, epsilon=epsilon)
    zcdp = budget.accounting is Accounting.ZCDP
    weights = dict(query_plan.item_weights)
    total = epsilon**2 / 2 if zcdp else epsilon
    shares = dict(zip(items, split(total, [weights[item] for item in items], zcdp), strict=True))
    found = {}
    for j, m in enumerate(query_plan.measurements):
        if m.spec.budget_item in shares:
            share = shares[m.spec.budget_item]
            mechanism = m.mechanism
            squared = mechanism.squared if isinstance(mechanism, GaussianMechanism) and mechanism.squared is not None \
                else m.sensitivity**2
            found[j] = Measurement(m.spec, m.sensitivity, share,
                                   _mechanism(budget, m.spec, m.sensitivity, squared, share,
                                              contribution(query_plan.query).max_rows))
    return found


@dataclass(frozen=True)
class _Setting:
    cells: int | None
    needs_selection: bool
    unit: Contribution
    candidates: list[_Candidate]


def _setting(query: CheckedQuery, budget: Budget) -> _Setting:
    cells = _public_cells(query)
    public = sum(math.prod(len(d) for d in g.domains) for g in groupings(query) if g.domains is not None) \
        if query.groupings else cells or 0
    if public > MAX_PUBLIC_CELLS:
        raise QueryRejected(f"the public domains of the group keys make {public} groups; at most "
                            f"{MAX_PUBLIC_CELLS} can be released")
    needs_selection = cells is None
    if needs_selection and budget.delta <= 0:
        undeclared = [k.text for k in query.keys if k.domain is None]
        raise QueryRejected(f"GROUP BY {', '.join(undeclared)}: the keys are not public. Declare the column's "
                            "public values in the policy (values = [...]), or give the budget a delta so that "
                            "groups can be chosen by DP partition selection")
    zcdp = budget.accounting is Accounting.ZCDP
    unit = contribution(query)
    m = unit.max_rows  # with grouping sets, G m: each row counts once in each grouping
    gaussian = budget.mechanism is MechanismKind.GAUSSIAN

    candidates = [_candidate(measures, recipes, unit, cells, gaussian, zcdp, outputs)
                  for measures, recipes, outputs in _candidates(query, m, needs_selection)]
    return _Setting(cells, needs_selection, unit, candidates)


def _planned(query: CheckedQuery, budget: Budget, setting: _Setting, best: _Candidate) -> QueryPlan:
    zcdp = budget.accounting is Accounting.ZCDP
    unit, needs_selection, m = setting.unit, setting.needs_selection, setting.unit.max_rows
    total = budget.epsilon**2 / 2 if zcdp else budget.epsilon
    shares = split(total, best.weights, zcdp)
    measurements = tuple(
        Measurement(spec, sens, shares[item], _mechanism(budget, spec, sens, squared, shares[item], m))
        for spec, sens, squared, item in zip(best.specs, best.sensitivities, best.squared, best.items, strict=True)
    )
    selection = None
    if needs_selection:
        rows = next(i for i, s in enumerate(best.specs) if s.kind is MeasurementKind.ROWS and s.argument is None)
        delta = float(budget.delta)
        selection = Selection(rows, _threshold(measurements[rows].mechanism, unit, delta), delta)
    # No measurement at all (keys with public values and no aggregate): the answer is the declared values, which
    # the policy makes public, so it reads no data and costs nothing.
    cost = Cost(budget.epsilon, budget.delta if needs_selection else Fraction(0)) if measurements else \
        Cost(Fraction(0), Fraction(0))
    if not any(m.spec.kind is MeasurementKind.QUANTILE for m in measurements):
        budget = replace(budget, quantile_intervals=True)  # nothing to decide: the same plan, the same stored answer
    # _candidate numbers the items in the order their first measurement comes
    item_weights = tuple(zip(dict.fromkeys(spec.budget_item for spec in best.specs), best.weights, strict=True))
    return QueryPlan(query, measurements, best.recipes, selection, cost, budget, item_weights, best.output_weights)


def _candidate(measures: Measures, recipes: tuple[OutputRecipe, ...], unit: Contribution, cells: int | None,
               gaussian: bool, zcdp: bool, outputs: tuple[tuple[tuple[int, float], ...], ...] = ()) -> _Candidate:
    specs = measures.specs
    squared = [_l2_squared(s, unit, cells) for s in specs]
    sensitivities = [math.isqrt(q - 1) + 1 if q else 0 for q in squared] if gaussian else \
        [_l1(s, unit, cells) for s in specs]
    scaled = [w * (d * float(s.step)) ** 2 for w, d, s in zip(measures.weights, sensitivities, specs, strict=True)]
    # A measurement no output leans on (the count beside a sum centered at 0) still adds noise and needs a
    # positive share: floor every weight at a billionth of the largest.
    floor = max(scaled, default=0.0) * 1e-9
    scaled = [max(w, floor) for w in scaled]
    # A budget item's share sets the noise of each of its measurements: its weight is theirs summed.
    index = {key: i for i, key in enumerate(dict.fromkeys(s.budget_item for s in specs))}
    items = [index[s.budget_item] for s in specs]
    weights = [0.0] * len(index)
    for item, weight in zip(items, scaled, strict=True):
        weights[item] += weight
    return _Candidate(specs, recipes, sensitivities, squared, items, weights, objective(weights, zcdp), outputs)


def _mechanism(budget: Budget, spec: MeasurementSpec, sensitivity: int, squared: int, share: float,
               max_rows: int) -> Mechanism | QuantileMechanism:
    if spec.kind is MeasurementKind.QUANTILE:
        interval = INTERVAL_SHARE if budget.quantile_intervals else Fraction(0)
        # The exponential mechanism is pure DP whatever the policy's noise, and so are the interval's counts: under
        # zCDP the share buys the epsilon whose two parts cost rho together (sqrt(2 rho) for both spent only 10/16).
        epsilon = zcdp_epsilon(share, interval) if budget.accounting is Accounting.ZCDP else share
        return QuantileMechanism(spec.grid, spec.fraction, max_rows, epsilon, interval)
    if budget.mechanism is MechanismKind.GAUSSIAN:
        return GaussianMechanism(sensitivity, share, squared)
    epsilon = math.sqrt(2 * share) if budget.accounting is Accounting.ZCDP else share
    return LaplaceMechanism(sensitivity, epsilon)


def _l1(spec: MeasurementSpec, unit: Contribution, cells: int | None) -> int:
    if spec.kind is MeasurementKind.UNITS:
        return unit.reach(cells)
    if spec.kind is MeasurementKind.QUANTILE:
        return unit.max_rows  # its mechanism calibrates itself to m max(q, 1 - q): see dp/quantile.py
    lo, hi = spec.row_range()
    return unit.l1 * max(abs(lo), abs(hi))


def _l2_squared(spec: MeasurementSpec, unit: Contribution, cells: int | None) -> int:
    """The exact squared L2 sensitivity: one unit moves each group's cell by at most its rows there times the
    largest value a row contributes (COUNT(DISTINCT unit): by one in each group it reaches)."""
    if spec.kind is MeasurementKind.UNITS:
        return unit.reach(cells)
    if spec.kind is MeasurementKind.QUANTILE:
        return unit.max_rows**2
    lo, hi = spec.row_range()
    return unit.l2_squared * max(abs(lo), abs(hi)) ** 2


def _threshold(mechanism: Mechanism, unit: Contribution, delta: float) -> int:
    """The smallest count threshold that releases a group only one unit supports with probability <= delta.

    A unit puts c_g rows in each group it reaches (sum c_g <= m, c_g <= r, at most k groups: contribution.py).
    The chance that some group existing only because of it is released is at most sum_g P(Z >= tau - c_g). That
    tail is convex in c_g, so the worst case is a peaked allocation (Contribution.allocations: without per-group
    bounds, one group with m rows, m groups with one row, and those between): the threshold bounds them all.

    The tails are evaluated in floating point without cancellation (relative error about 1e-14 at the deltas
    that matter, down to 1e-300); comparing against delta shrunk by _TAIL_MARGIN absorbs that rounding, so the
    exact worst case never exceeds delta.
    """
    target = delta * (1 - _TAIL_MARGIN)

    allocations = unit.allocations()
    top = max(rows for allocation in allocations for _, rows in allocation)

    def worst(tau: int) -> float:
        return max(sum(count * mechanism.upper_tail(tau - rows) for count, rows in allocation)
                   for allocation in allocations)

    return top + 1 + smallest(lambda k: worst(top + 1 + k) <= target)  # tails fall exponentially: gallop, bisect


def _candidates(query: CheckedQuery, m: int, needs_selection: bool) -> Iterator[
        tuple[Measures, tuple[OutputRecipe, ...], tuple[tuple[tuple[int, float], ...], ...]]]:
    """Every way of measuring the outputs worth comparing: each bounded argument of SUM or AVG as a pair of
    complementary sums or not; each SUM not from a pair plain, or centered with a count; COUNT(*) as a count of its
    own, or as the sum of the counts of rows where a nullable argument is NULL and where it is not. The ways without
    pairs come first: the first of equals wins."""
    first_calls: dict[exp.Expression, AggregateCall] = {}  # a pair's grid and nullability: from any call reading it
    for call in query.aggregates:
        if aggregate(call).pairable:
            first_calls.setdefault(call.argument, call)
    pairs = [Pair(c.argument, fixed_point(c.interval), c.nullable) for c in first_calls.values()]
    subsets = [combination for size in range(len(pairs) + 1) for combination in itertools.combinations(pairs, size)] \
        if len(pairs) <= _MAX_PAIRED else [(), tuple(pairs)]
    ways = [(paired, _plain_choices(query, paired)) for paired in subsets]  # the same for every split
    for split_by in _split_choices(query, needs_selection):
        for paired, plain_choices in ways:
            for plain_sums in plain_choices:
                yield _measure(query, m, needs_selection, plain_sums, split_by, paired)


_MAX_PAIRED = 3  # arguments tried as pairs one by one; beyond, all or none


def _plain_choices(query: CheckedQuery, paired: tuple[Pair, ...]) -> list[set]:
    """Which of the SUMs not computed from a pair are measured plain: every combination (all or none beyond 6)."""
    arguments = [p.argument for p in paired]
    sums = sorted({c.key for c in query.aggregates if aggregate(c).measured_two_ways and c.argument not in arguments})
    choices = list(itertools.product((False, True), repeat=len(sums))) if len(sums) <= 6 else \
        [tuple([False] * len(sums)), tuple([True] * len(sums))]
    return [{key for key, plain in zip(sums, choice, strict=True) if plain} for choice in choices]


_MAX_SPLITS = 3  # nullable arguments tried as the split of COUNT(*), in the order the query names them


def _split_choices(query: CheckedQuery, needs_selection: bool) -> list[exp.Expression | None]:
    """No split, then each nullable argument the query also counts (COUNT(x), or AVG/SUM/VAR of x), when it asks
    for COUNT(*). Partition selection thresholds one count of all rows, so a query that needs it keeps its own."""
    counts_all = any(c.kind == COUNT and not c.nullable for c in query.aggregates)
    if needs_selection or not counts_all:
        return [None]
    arguments = dict.fromkeys(c.argument for c in query.aggregates if c.nullable)  # trees, as measurements are
    return [None, *list(arguments)[:_MAX_SPLITS]]


def _measure(query: CheckedQuery, m: int, needs_selection: bool, plain_sums: set, split_by: exp.Expression | None,
             pairs: tuple[Pair, ...]) -> tuple[Measures, tuple[OutputRecipe, ...],
                                               tuple[tuple[tuple[int, float], ...], ...]]:
    measures = Measures(split_by=split_by, pairs=pairs)
    recipes = tuple(aggregate(call).recipe(call, m, measures, call.key in plain_sums) for call in query.aggregates)
    if needs_selection:
        measures.use(MeasurementSpec(MeasurementKind.ROWS), 1.0)
    # Each output's own weights: its recipe alone, its measurements found among the plan's.
    index = {spec.key: i for i, spec in enumerate(measures.specs)}
    outputs = []
    for call in query.aggregates:
        alone = Measures(split_by=split_by, pairs=pairs)
        aggregate(call).recipe(call, m, alone, call.key in plain_sums)
        outputs.append(tuple((index[spec.key], weight) for spec, weight in zip(alone.specs, alone.weights,
                                                                               strict=True)))
    return measures, recipes, tuple(outputs)
