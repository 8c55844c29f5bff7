"""Stage 3: turn a checked query into measurements, a budget split and a partition-selection rule.

A *measurement* is one noisy vector: an exact integer per group (a count, or a sum of clamped fixed-point
values) plus noise from one mechanism. An *output* (an aggregate the analyst asked for) is post-processing of
measurements, so COUNT, SUM and AVG of one column share one count and one normalised sum:
SUM = S' + mid*N', AVG = mid + S'/N' (clamped to the bounds), VAR from N', S' and a sum of squares.

Sensitivity follows from the contribution bound: the rewrite keeps at most m rows per privacy unit in the whole
query, so one unit moves the vector of counts by at most m in L1 (and in L2), and a sum whose rows lie in
[-b, b] by at most m*b. One unit's rows can reach at most min(m, number of groups) groups.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.check import AggregateCall, AggregateKind, CheckedQuery, readable
from dpsql.dp.allocation import objective, split
from dpsql.dp.fixedpoint import FixedPoint, fixed_point
from dpsql.dp.interval import Interval
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism, Mechanism
from dpsql.errors import QueryRejected
from dpsql.policy import Accounting, MechanismKind
from dpsql.sql.parse import DIALECT

MAX_PUBLIC_CELLS = 100_000
_TAIL_MARGIN = 1e-9  # relative: far above the rounding of a float tail, far below any effect on the threshold


class MeasurementKind(StrEnum):
    ROWS = "rows"  # COUNT(*) or COUNT(expr) of the bounded rows
    UNITS = "units"  # COUNT(DISTINCT privacy unit)
    SUM = "sum"  # sum of the centered fixed-point value (plus center * count when plain)
    SUMSQ = "sumsq"  # sum of the squared centered value, itself centered in fixed point


@dataclass(frozen=True)
class MeasurementSpec:
    """What is measured, before any budget is attached."""

    kind: MeasurementKind
    argument: exp.Expression | None = None
    value_point: FixedPoint | None = None  # SUM, SUMSQ: how the argument is held as an integer
    square_point: FixedPoint | None = None  # SUMSQ: how its squared centered value is held
    plain: bool = False  # SUM: the uncentered sum

    @functools.cached_property
    def key(self) -> tuple:
        return (self.kind, self.argument.sql(DIALECT) if self.argument is not None else None, self.plain)

    @property
    def label(self) -> str:
        arg = readable(self.argument) if self.argument is not None else None
        if self.kind is MeasurementKind.ROWS:
            return f"COUNT({arg or '*'})"
        if self.kind is MeasurementKind.UNITS:
            return "COUNT(DISTINCT unit)"
        if self.kind is MeasurementKind.SUM:
            if self.plain:
                return f"SUM({arg})"
            return f"SUM({arg} - {self.value_point.center_value:g})"
        return f"SUM(({arg} - {self.value_point.center_value:g})^2 - {self.square_point.center_value:g})"

    def row_range(self) -> tuple[int, int]:
        """The integer one row contributes, in grid steps."""
        if self.kind in (MeasurementKind.ROWS, MeasurementKind.UNITS):
            return 0, 1
        point = self.square_point if self.kind is MeasurementKind.SUMSQ else self.value_point
        shift = point.center if self.plain else 0
        return shift - point.bound, shift + point.bound

    @property
    def step(self) -> Fraction:
        if self.kind is MeasurementKind.SUMSQ:
            return self.square_point.step
        if self.kind is MeasurementKind.SUM:
            return self.value_point.step
        return Fraction(1)


@dataclass(frozen=True)
class Measurement:
    spec: MeasurementSpec
    sensitivity: int  # in grid steps: L1 for Laplace, L2 for Gaussian
    share: float  # the epsilon (pure) or rho (zCDP) it spends
    mechanism: Mechanism

    @property
    def std(self) -> float:
        """The standard deviation of its noise, in value units."""
        return math.sqrt(self.mechanism.variance) * float(self.spec.step)


@dataclass(frozen=True)
class OutputRecipe:
    """How one aggregate call is computed from measurements (indices into QueryPlan.measurements)."""

    call: AggregateCall
    count: int | None = None
    total: int | None = None
    squares: int | None = None
    point: FixedPoint | None = None


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
    rho: Fraction  # epsilon**2 / 2: what the query costs under zCDP accounting


@dataclass(frozen=True)
class QueryPlan:
    query: CheckedQuery
    max_rows: int
    measurements: tuple[Measurement, ...]
    recipes: tuple[OutputRecipe, ...]
    selection: Selection | None
    cost: Cost
    accounting: Accounting
    mechanism: MechanismKind
    domains: tuple[tuple, ...] | None = field(default=None)  # the public values of every key, if all public


@dataclass(frozen=True)
class Budget:
    """What a query may spend: its epsilon, its delta for partition selection, and the accounting."""

    epsilon: Fraction
    delta: Fraction
    accounting: Accounting
    mechanism: MechanismKind


def plan(query: CheckedQuery, budget: Budget) -> QueryPlan:
    m = query.table.bound.max_rows
    public = all(k.domain is not None for k in query.keys)
    domains = tuple(k.domain for k in query.keys) if public else None
    cells = math.prod(len(d) for d in domains) if public else None
    if cells is not None and cells > MAX_PUBLIC_CELLS:
        raise QueryRejected(f"the public domains of the group keys make {cells} groups; at most "
                            f"{MAX_PUBLIC_CELLS} can be released")
    needs_selection = not public
    if needs_selection and budget.delta <= 0:
        undeclared = [k.text for k in query.keys if k.domain is None]
        raise QueryRejected(f"GROUP BY {', '.join(undeclared)}: the keys are not public. Declare the column's "
                            "public values in the policy (values = [...]), or give the budget a delta so that "
                            "groups can be chosen by DP partition selection")
    zcdp = budget.accounting is Accounting.ZCDP
    reach = min(m, cells) if cells is not None else m  # how many groups one unit's rows can reach

    best = None
    for specs, recipes, weights in _candidates(query, m, needs_selection):
        sensitivities = [_sensitivity(s, m, reach) for s in specs]
        scaled = [w * (d * float(s.step)) ** 2 for w, d, s in zip(weights, sensitivities, specs, strict=True)]
        # A measurement no output leans on (the count beside a sum centered at 0) still adds noise and needs a
        # positive share: floor every weight at a billionth of the largest.
        floor = max(scaled, default=0.0) * 1e-9
        scaled = [max(w, floor) for w in scaled]
        score = objective(scaled, zcdp)
        if best is None or score < best[0]:
            best = (score, specs, recipes, scaled, sensitivities)
    _, specs, recipes, scaled, sensitivities = best

    total = budget.epsilon**2 / 2 if zcdp else budget.epsilon
    shares = split(total, scaled, zcdp)
    measurements = tuple(
        Measurement(spec, sens, share, _mechanism(budget, sens, share))
        for spec, sens, share in zip(specs, sensitivities, shares, strict=True)
    )
    selection = None
    if needs_selection:
        rows = next(i for i, s in enumerate(specs) if s.kind is MeasurementKind.ROWS and s.argument is None)
        delta = float(budget.delta)
        selection = Selection(rows, _threshold(measurements[rows].mechanism, m, delta), delta)
    cost = Cost(budget.epsilon, budget.delta if needs_selection else Fraction(0), budget.epsilon**2 / 2)
    return QueryPlan(query, m, measurements, tuple(recipes), selection, cost, budget.accounting,
                     budget.mechanism, domains)


def _mechanism(budget: Budget, sensitivity: int, share: float) -> Mechanism:
    if budget.mechanism is MechanismKind.GAUSSIAN:
        return GaussianMechanism(sensitivity, share)
    epsilon = math.sqrt(2 * share) if budget.accounting is Accounting.ZCDP else share
    return LaplaceMechanism(sensitivity, epsilon)


def _sensitivity(spec: MeasurementSpec, m: int, reach: int) -> int:
    if spec.kind is MeasurementKind.UNITS:
        return reach
    lo, hi = spec.row_range()
    return m * max(abs(lo), abs(hi))


def _threshold(mechanism: Mechanism, m: int, delta: float) -> int:
    """The smallest count threshold that releases a group only one unit supports with probability <= delta.

    A unit puts c_g rows in each group it reaches, sum c_g <= m. The chance that some group existing only
    because of it is released is at most sum_g P(Z >= tau - c_g). That tail is convex in c_g, so the worst case
    is one group with m rows or m groups with one row each: the threshold bounds both.

    The tails are evaluated in floating point without cancellation (relative error about 1e-14 at the deltas
    that matter, down to 1e-300); comparing against delta shrunk by _TAIL_MARGIN absorbs that rounding, so the
    exact worst case never exceeds delta.
    """
    target = delta * (1 - _TAIL_MARGIN)

    def worst(tau: int) -> float:
        return max(mechanism.upper_tail(tau - m), m * mechanism.upper_tail(tau - 1))

    tau = m + 1
    step = 1
    while worst(tau) > target:  # gallop, then bisect: tails fall exponentially
        tau += step
        step *= 2
    lo, hi = max(m + 1, tau - step // 2), tau
    while lo < hi:
        mid = (lo + hi) // 2
        if worst(mid) > target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _candidates(query: CheckedQuery, m: int, needs_selection: bool):
    """Every way of measuring the outputs worth comparing: each SUM plain, or centered with a count."""
    sums = sorted({c.key for c in query.aggregates if c.kind is AggregateKind.SUM})
    choices = list(itertools.product((False, True), repeat=len(sums))) if len(sums) <= 6 else \
        [tuple([False] * len(sums)), tuple([True] * len(sums))]
    for choice in choices:
        plain_sums = {key for key, plain in zip(sums, choice, strict=True) if plain}
        yield _measure(query, m, needs_selection, plain_sums)


def _measure(query: CheckedQuery, m: int, needs_selection: bool, plain_sums: set):
    specs: list[MeasurementSpec] = []
    weights: list[float] = []

    def use(spec: MeasurementSpec, weight: float) -> int:
        keys = [s.key for s in specs]
        if spec.key in keys:
            index = keys.index(spec.key)
        else:
            specs.append(spec)
            weights.append(0.0)
            index = len(specs) - 1
        weights[index] += weight
        return index

    recipes = []
    for call in query.aggregates:
        recipes.append(_recipe(call, m, use, call.key in plain_sums))
    if needs_selection:
        use(MeasurementSpec(MeasurementKind.ROWS), 1.0)
    return specs, recipes, weights


def _recipe(call: AggregateCall, m: int, use, plain: bool) -> OutputRecipe:
    count_arg = call.argument if call.nullable else None
    if call.kind is AggregateKind.COUNT:
        return OutputRecipe(call, count=use(MeasurementSpec(MeasurementKind.ROWS, count_arg), 1.0))
    if call.kind is AggregateKind.COUNT_UNITS:
        # With one row per unit, counting rows is counting units: the same measurement serves both.
        spec = MeasurementSpec(MeasurementKind.ROWS) if m == 1 else MeasurementSpec(MeasurementKind.UNITS)
        return OutputRecipe(call, count=use(spec, 1.0))
    point = fixed_point(call.interval)
    mid, half = point.center_value, float(point.bound * point.step)
    typical = max(abs(mid), half) or 1.0
    value = MeasurementSpec(MeasurementKind.SUM, call.argument, point)
    if call.kind is AggregateKind.SUM:
        if plain:
            spec = MeasurementSpec(MeasurementKind.SUM, call.argument, point, plain=True)
            return OutputRecipe(call, total=use(spec, 1 / typical**2), point=point)
        total = use(value, 1 / typical**2)
        count = use(MeasurementSpec(MeasurementKind.ROWS, count_arg), mid**2 / typical**2)
        return OutputRecipe(call, count=count, total=total, point=point)
    if call.kind is AggregateKind.AVG:
        total = use(value, 1 / typical**2)
        count = use(MeasurementSpec(MeasurementKind.ROWS, count_arg), half**2 / 3 / typical**2)
        return OutputRecipe(call, count=count, total=total, point=point)
    # VAR and STDDEV: weights from the first-order error of Q/N + C - (S/N)^2 around values spread over
    # the interval (variance about half^2/3); a standard deviation's relative error is half its variance's.
    factor = 0.25 if call.kind in (AggregateKind.STDDEV_SAMP, AggregateKind.STDDEV_POP) else 1.0
    typical_var = (half**2 / 3) or 1.0
    square = fixed_point(Interval(0.0, half**2))
    squares = use(MeasurementSpec(MeasurementKind.SUMSQ, call.argument, point, square), factor / typical_var**2)
    total = use(value, factor * (4 * half**2 / 3) / typical_var**2)
    count = use(MeasurementSpec(MeasurementKind.ROWS, count_arg), factor * (half**2 / 6) ** 2 / typical_var**2)
    return OutputRecipe(call, count=count, total=total, squares=squares, point=point)
