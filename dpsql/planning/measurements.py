"""What a plan measures: noisy vectors of exact integers, and how each output is computed from them.

A *measurement* is one noisy vector: an exact integer per group (a count, or a sum of clamped fixed-point
values) plus noise from one mechanism. An *output* (an aggregate the analyst asked for) is post-processing of
measurements: its recipe names the measurements it reads by their index in the plan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.check import AggregateCall, readable
from dpsql.dp.fixedpoint import FixedPoint
from dpsql.dp.mechanisms import Mechanism
from dpsql.dp.quantile import Grid, QuantileMechanism


class MeasurementKind(StrEnum):
    ROWS = "rows"  # COUNT(*) or COUNT(expr) of the bounded rows
    NULLS = "nulls"  # the bounded rows where expr is NULL: disjoint from ROWS(expr), see `budget_item`
    UNITS = "units"  # COUNT(DISTINCT privacy unit); with an argument Distinct(c), of the units with a row where c
    DISTINCT = "distinct"  # COUNT(DISTINCT expr) of the bounded rows: argument is exp.Distinct(expr), see distinct.py
    SUM = "sum"  # sum of the centered fixed-point value (plus center * count when plain)
    SUMSQ = "sumsq"  # sum of the squared centered value, itself centered in fixed point
    # A pair of complementary sums of one bounded argument on its fixed-point grid [lo, hi]: ABOVE sums x - lo,
    # BELOW sums hi - x. Each row adds hi - lo to the two together, so one share pays for both (see `Pair`).
    ABOVE = "above"
    BELOW = "below"
    # The rows per candidate of a grid (a histogram, not one integer): a quantile, MIN or MAX chooses a candidate
    # from it by the exponential mechanism (dp/quantile.py). argument is CAST(expr AS DOUBLE): the value itself,
    # apart from a SUM's fixed-point integer of the same expr.
    QUANTILE = "quantile"


@dataclass(frozen=True)
class MeasurementSpec:
    """What is measured, before any budget is attached."""

    kind: MeasurementKind
    argument: exp.Expression | None = None
    # SUM, SUMSQ, ABOVE, BELOW: how the argument is held as an integer. NULLS of a pair's argument: its rows counted
    # in the pair's units, hi - lo per row (`Pair.nulls`).
    value_point: FixedPoint | None = None
    square_point: FixedPoint | None = None  # SUMSQ: how its squared centered value is held
    plain: bool = False  # SUM: the uncentered sum
    grid: Grid | None = None  # QUANTILE: the candidates
    fraction: Fraction | None = None  # QUANTILE: q (0 for MIN, 1 for MAX)
    # ROWS, SUM: over the distinct fixed-point values of the argument among the bounded rows, not over the rows
    # (SUM(DISTINCT x), AVG(DISTINCT x): planning/aggregates/distinct_sums.py)
    distinct: bool = False

    @functools.cached_property
    def key(self) -> tuple:
        """What makes two specs the same measurement: sqlglot nodes compare (and hash) as trees."""
        return (self.kind, self.argument, self.value_point, self.plain, self.grid, self.fraction, self.distinct)

    @functools.cached_property
    def budget_item(self) -> tuple:
        """Measurements with the same budget item count disjoint sets of rows, so they spend one share together.

        ROWS(x) counts the rows where x is not NULL and NULLS(x) those where it is: every row is in exactly one,
        so one unit's at most m rows move the two vectors together by at most m in L1 and in L2, the sensitivity
        each has on its own. Noise calibrated to that sensitivity and one share on each therefore costs that share
        once (parallel composition), and COUNT(*) = NULLS(x) + ROWS(x) comes at no extra cost. A pair's sums (and
        its NULL rows) share one item by the same argument, in the pair's units: see `Pair`.
        """
        if self.paired:
            return ("pair", self.argument)
        if self.distinct:
            return self.key  # distinct values are no partition of the rows: a share of their own
        if self.kind in (MeasurementKind.ROWS, MeasurementKind.NULLS) and self.argument is not None:
            return ("rows by null", self.argument)
        return self.key

    @property
    def paired(self) -> bool:
        """Whether it is one of a pair's measurements (ABOVE, BELOW, or the NULLS beside them): see `Pair`."""
        return self.kind in (MeasurementKind.ABOVE, MeasurementKind.BELOW) or (
            self.kind is MeasurementKind.NULLS and self.value_point is not None)

    @property
    def label(self) -> str:
        arg = readable(self.argument) if self.argument is not None else None
        term = arg  # as an operand of the centering: SUM((x > 0) - 0.5), not SUM(x > 0 - 0.5)
        if arg is not None and not isinstance(self.argument, exp.Column | exp.Literal | exp.Func | exp.Paren):
            term = f"({arg})"
        if self.kind is MeasurementKind.ROWS:
            return f"COUNT({'DISTINCT ' if self.distinct else ''}{arg or '*'})"
        if self.kind is MeasurementKind.NULLS:
            if self.value_point is not None:
                return f"{self.value_point.width:g} * COUNT(*) WHERE {term} IS NULL"
            return f"COUNT(*) WHERE {term} IS NULL"
        if self.kind is MeasurementKind.ABOVE:
            lo = self.value_point.ends[0]
            return f"SUM({term} - {lo:g})" if lo >= 0 else f"SUM({term} + {-lo:g})"
        if self.kind is MeasurementKind.BELOW:
            return f"SUM({self.value_point.ends[1]:g} - {term})"
        if self.kind is MeasurementKind.UNITS:
            if self.argument is None:
                return "COUNT(DISTINCT unit)"
            return f"COUNT(DISTINCT unit) WHERE {readable(self.argument.expressions[0])}"
        if self.kind is MeasurementKind.DISTINCT:
            return f"COUNT({arg})"
        if self.kind is MeasurementKind.QUANTILE:
            return f"QUANTILE({readable(self.argument.this)}, {float(self.fraction):g})"
        if self.kind is MeasurementKind.SUM:
            distinct = "DISTINCT " if self.distinct else ""
            if self.plain:
                return f"SUM({distinct}{arg})"
            return f"SUM({distinct}{term} - {self.value_point.center_value:g})"
        return f"SUM(({term} - {self.value_point.center_value:g})^2 - {self.square_point.center_value:g})"

    def row_range(self) -> tuple[int, int]:
        """The integer one row contributes, in grid steps."""
        if self.paired:
            return 0, 2 * self.value_point.bound
        if self.kind in (MeasurementKind.ROWS, MeasurementKind.NULLS, MeasurementKind.UNITS, MeasurementKind.DISTINCT,
                         MeasurementKind.QUANTILE):
            return 0, 1
        point = self.square_point if self.kind is MeasurementKind.SUMSQ else self.value_point
        shift = point.center if self.plain else 0
        return shift - point.bound, shift + point.bound

    @property
    def step(self) -> Fraction:
        if self.kind is MeasurementKind.SUMSQ:
            return self.square_point.step
        if self.kind is MeasurementKind.SUM or self.paired:
            return self.value_point.step
        return Fraction(1)


@dataclass(frozen=True)
class Pair:
    """A bounded argument x measured as two complementary sums instead of a count and a centered sum.

    On x's fixed-point grid [lo, hi] (center -/+ bound steps) each row where x is not NULL adds x - lo to ABOVE and
    hi - x to BELOW: two parts, neither negative, of hi - lo. One unit's rows therefore move the two sums together
    by at most hi - lo per row in L1, and (the parts of a group's change having one sign) in L2: the sensitivity
    each of them has on its own. Noise calibrated to it on each and one share for both is as private as that share
    on one of them. When x can be NULL, its NULL rows counted in the same units (hi - lo each, `nulls`) join the
    share: every row then adds exactly hi - lo to the three together. From the pair, at that one share:

        COUNT(x) = (ABOVE + BELOW) / (hi - lo)        SUM(x) = (hi ABOVE + lo BELOW) / (hi - lo)
        AVG(x) = center + (ABOVE - BELOW) / 2 / COUNT(x)      COUNT(*) = COUNT(x) + NULLS / (hi - lo)

    A count and a centered sum measured apart split the share instead: with Laplace noise each is then at least
    twice as wide, and the pair halves the noise variance of COUNT(x) and of the centered sum (ABOVE - BELOW) / 2
    at once (with Gaussian noise the two ways are alike: L2 does not favour either). The planner compares it with
    the other ways of measuring, as for every choice.
    """

    argument: exp.Expression
    point: FixedPoint
    nullable: bool

    @property
    def above(self) -> MeasurementSpec:
        return MeasurementSpec(MeasurementKind.ABOVE, self.argument, self.point)

    @property
    def below(self) -> MeasurementSpec:
        return MeasurementSpec(MeasurementKind.BELOW, self.argument, self.point)

    @property
    def nulls(self) -> MeasurementSpec:
        return MeasurementSpec(MeasurementKind.NULLS, self.argument, self.point)

    @property
    def ends(self) -> tuple[float, float]:
        return self.point.ends

    @property
    def width(self) -> float:
        return self.point.width


@dataclass(frozen=True)
class Measurement:
    spec: MeasurementSpec
    sensitivity: int  # in grid steps: L1 for Laplace, L2 for Gaussian
    share: float  # the epsilon (pure) or rho (zCDP) of its budget item, spent once by all the item's measurements
    mechanism: Mechanism | QuantileMechanism

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
    parts: tuple[int, ...] = ()  # COUNT(*) as the sum of disjoint counts (NULLS(x), ROWS(x)), see Measures.split_by
    linear: tuple[tuple[float, int], ...] = ()  # COUNT or SUM from a pair: sum of coefficient * measurement
    pair: tuple[int, int] | None = None  # AVG from a pair: its ABOVE and BELOW measurements


@dataclass
class Measures:
    """The measurements one way of planning a query needs, each once, with the weight the outputs put on each.

    An output asks for a measurement with `use`; asking again for the same one (COUNT(*) beside AVG's count)
    returns the index it already has and adds to its weight, so outputs share measurements and their budget.
    """

    # When set, COUNT(*) is measured as the rows where this argument is NULL plus those where it is not, two
    # counts that share one budget share (MeasurementSpec.budget_item), instead of a count of its own.
    split_by: exp.Expression | None = None
    # The arguments measured as pairs (`Pair`): their SUM, AVG and COUNT, and COUNT(*) when one of them is never
    # NULL (or, with the NULL rows, when it is split_by), come from the pair.
    pairs: tuple[Pair, ...] = ()
    specs: list[MeasurementSpec] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    _index: dict[tuple, int] = field(default_factory=dict, repr=False)

    def use(self, spec: MeasurementSpec, weight: float) -> int:
        index = self._index.get(spec.key)
        if index is None:
            index = self._index[spec.key] = len(self.specs)
            self.specs.append(spec)
            self.weights.append(0.0)
        self.weights[index] += weight
        return index

    def pair(self, argument: exp.Expression | None) -> Pair | None:
        return next((p for p in self.pairs if p.argument == argument), None)
