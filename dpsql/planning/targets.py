"""Accuracy targets: what an analyst asks of the noisy columns instead of an epsilon.

One number asks every noisy column for a 95% interval within +/- it; `name=value` pairs ask named output columns
only (`n=25, avg_cost=2%`), each an absolute half-width or, with %, a share of the column's range: the width of its
argument's bounds for AVG and a quantile, half of it for STDDEV (the largest deviation values within the bounds
can have), its square for VAR. COUNT and SUM have no range (a count's grows with the rows), so a relative target
for them is refused: give a number.

A target on COUNT, SUM and the other linear outputs is met by their law alone (planning/accuracy.py); one on AVG,
VAR or STDDEV depends on the noisy count it divides by, so it is met in two stages (session.py): the count first
(released measurements are used when they are as good), then the sums at the epsilon the count's lower 95% bound
says is needed, both charged. Everything here reads the SQL and the policy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sqlglot import exp

from dpsql.analysis.check import CheckedQuery
from dpsql.errors import DataError, ProgrammingError, QueryRejected, shown
from dpsql.planning.accuracy import grid_epsilon, index_at_most
from dpsql.planning.aggregates import LEVEL, aggregate
from dpsql.planning.aggregates.base import BoundedArgument, LinearAggregate
from dpsql.planning.aggregates.quantile import Quantile
from dpsql.planning.aggregates.spread import Spread
from dpsql.planning.plan import Budget, QueryPlan, candidate_plans, remeasured
from dpsql.planning.reuse import Combination, Grouping, StoredMeasurement, cells_per_group, combine, stored_source
from dpsql.planning.spending import Requirement, as_accurate_as, targets_of
from dpsql.policy import Accounting
from dpsql.sql import names


@dataclass(frozen=True)
class Accuracy:
    """One half-width for every noisy column, or targets for named output columns (value, and whether relative)."""

    every: Fraction | None = None
    columns: tuple[tuple[str, Fraction, bool], ...] = ()

    def __str__(self) -> str:
        if self.every is not None:
            return f"{float(self.every):g}"
        return ", ".join(f"{name}={float(value * 100) if relative else float(value):g}{'%' if relative else ''}"
                         for name, value, relative in self.columns)


def accuracy_of(value: Any) -> Accuracy:
    """An accuracy as front ends give it: a number, text (a number, or `name=value[%]` pairs separated by commas), a
    mapping of output names to numbers or `value%` text, or an Accuracy. DataError naming what is wrong."""
    if isinstance(value, Accuracy):
        return value
    if isinstance(value, Mapping):
        return Accuracy(columns=tuple((str(name), *_target(str(name), target)) for name, target in value.items()))
    if isinstance(value, str) and "=" in value:
        pairs = [part.split("=") for part in value.split(",")]
        if any(len(pair) != 2 or not pair[0].strip() or not pair[1].strip() for pair in pairs):
            raise DataError(f"accuracy {shown(value)}: write one number, or name=value pairs separated by commas "
                            "(a value is a number, or a number and % of the column's range)")
        return Accuracy(columns=tuple((name.strip(), *_target(name.strip(), target)) for name, target in pairs))
    number, relative = _target(None, value)
    if relative:
        raise DataError("a relative accuracy (%) is asked of named columns: name=value%")
    return Accuracy(every=number)


def _target(name: str | None, value: Any) -> tuple[Fraction, bool]:
    where = f" for {name}" if name is not None else ""
    relative = isinstance(value, str) and value.strip().endswith("%")
    text = value.strip()[:-1] if relative else value
    try:
        if isinstance(text, bool) or not isinstance(text, int | float | Fraction | str):
            raise ValueError
        number = Fraction(text.strip()) if isinstance(text, str) else Fraction(text)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise DataError(f"accuracy{where} must be a number > 0 (or a number and %), got {shown(value)}") from None
    if not (number > 0 and math.isfinite(float(number))):
        raise DataError(f"accuracy{where} must be a finite number > 0, got {shown(value)}")
    return (number / 100 if relative else number), relative


def targets(query: CheckedQuery, accuracy: Accuracy) -> dict[int, float]:
    """The absolute 95% half-width asked of each aggregate (by its index), from the outputs the accuracy names
    (each must be an aggregate as such: an expression of one, or a quantile, has no interval an epsilon can size)."""
    outputs = list(zip(query.output_names, query.outer.expressions, query.output_noisy, strict=True))
    if accuracy.every is not None:
        wanted = [(name, accuracy.every, False) for name, _, noisy in outputs if noisy]
    else:
        known = [name for name, _, _ in outputs]
        for name, _, _ in accuracy.columns:
            if name not in known:
                raise ProgrammingError(f"accuracy for {name}: the query has no output column of that name (it has: "
                                       f"{', '.join(known)})")
        wanted = list(accuracy.columns)
    found: dict[int, float] = {}
    for name, value, relative in wanted:
        item = next(item for output, item, _ in outputs if output == name)
        index = names.aggregate_index(item.this) if isinstance(item.this, exp.Column) else None
        if index is None:
            raise QueryRejected(f"output {name}: an accuracy sizes the aggregates themselves; compute with them after "
                                "the query, or ask with an epsilon")
        call = query.aggregates[index]
        kind = aggregate(call)
        if isinstance(kind, Quantile):
            raise QueryRejected(f"{call.text}: a quantile's interval follows the rows around its value, so no "
                                "epsilon can be chosen for an accuracy before running it: ask it with an epsilon")
        size = float(value)
        if relative:
            if isinstance(kind, LinearAggregate):
                raise DataError(f"accuracy for {name}: {call.text} has no range to be a share of (a count or sum "
                                "grows with the rows): give an absolute half-width")
            size *= _range(kind, call.interval.hi - call.interval.lo)
        found[index] = min(size, found.get(index, math.inf))
    return found


def _range(kind: Any, width: float) -> float:
    """The range of values an output can take, for a relative target: AVG's is its bounds' width; a spread's is what
    values within the bounds can have (a deviation up to half the width, a variance up to its square)."""
    if isinstance(kind, Spread):
        return (width / 2) if kind.root else (width / 2) ** 2
    return width


def sized_in_two_stages(query: CheckedQuery, asked: Mapping[int, float]) -> bool:
    """Whether a target falls on an output that divides by a noisy count (AVG, VAR, STDDEV)."""
    return any(not isinstance(aggregate(query.aggregates[i]), LinearAggregate) for i in asked)


@dataclass(frozen=True)
class TwoStages:
    """How a query with a target on AVG, VAR or STDDEV is met (session.py runs it): `reference`, the way of measuring
    it with each such output's count and sums apart (a pair has no count of its own to size by), at the epsilon of a
    default query; its counts first, then every target from the counts' lower 95% bounds."""

    query_plan: QueryPlan  # the query as prepared (its epsilon: the linear targets', or a default query's)
    reference: QueryPlan
    asked: Mapping[int, float]

    @property
    def sized(self) -> list[int]:
        """The outputs (aggregate indices) whose target depends on a count."""
        return [i for i in self.asked if not isinstance(aggregate(self.query_plan.query.aggregates[i]),
                                                        LinearAggregate)]

    @property
    def asked_text(self) -> str:
        calls = self.query_plan.query.aggregates
        return ", ".join(f"{calls[i].text} +/-{self.asked[i]:g}" for i in self.sized)

    @property
    def first_note(self) -> str:
        return f"first stage of an accuracy for {self.asked_text}: the counts"

    @property
    def second_note(self) -> str:
        return f"second stage of an accuracy for {self.asked_text}, sized by the counts"

    def first_stage(self, stored: Sequence[StoredMeasurement], grouping: Grouping) -> tuple[dict, Fraction]:
        """The counts to measure now (by the reference's indices, each at its share of a default query's epsilon) and
        what that costs (rounded up to the grid); none when released ones estimate each count as well already."""
        sources = _sources(stored, grouping)
        targets = targets_of(self.reference)
        items: dict[tuple, None] = {}
        for index in self.sized:
            j = self.reference.recipes[index].count
            measurement = self.reference.measurements[j]
            estimate = combine(targets[j], sources) if targets[j] is not None else None
            if estimate is None or Combination(tuple(sources), (estimate,)).variance(0) > \
                    measurement.mechanism.variance:
                items[measurement.spec.budget_item] = None
        if not items:
            return {}, Fraction(0)
        shares = sum((m.share for m in self.reference.measurements if m.spec.budget_item in items), 0.0)
        zcdp = self.reference.budget.accounting is Accounting.ZCDP
        cost = math.sqrt(2 * shares) if zcdp else shares
        epsilon = grid_epsilon(index_at_most(Fraction(cost)) + 1)  # the grid value above: never less than the shares
        return remeasured(self.reference, list(items), epsilon), epsilon

    def _count_lows(self, stored: Sequence[StoredMeasurement], grouping: Grouping) -> dict[int, float]:
        """Each sized output's count's smallest lower 95% bound over the groups, from the released measurements."""
        sources = _sources(stored, grouping)
        targets = targets_of(self.reference)
        lows = {}
        for index in self.sized:
            j = self.reference.recipes[index].count
            estimate = combine(targets[j], sources) if targets[j] is not None else None
            if estimate is None:
                lows[index] = 0.0
                continue
            combination = Combination(tuple(sources), (estimate,))
            groups = math.prod(len(domain) for domain in grouping.domains)
            values = combination.values(groups, {})[:, 0].astype(float)
            width = combination.law(((1.0, 0),), [Fraction(1)]).half_width(LEVEL)
            lows[index] = float(values.min()) - width if values.size else 0.0
        return lows

    def smallest(self, stored: Sequence[StoredMeasurement], grouping: Grouping) -> float:
        return max(0.0, min(self._count_lows(stored, grouping).values(), default=0.0))

    def second_requirements(self, stored: Sequence[StoredMeasurement], grouping: Grouping) -> list[Requirement]:
        """Every target, each sized output's from its count's lower bound n, to first order in the noises (combined as
        independent: the root of their squared half-widths): AVG = c + S/N errs by (e_S - (AVG - c) e_N) / n, with
        |AVG - c| at most half the bounds' width; VAR = Q/N + C - (S/N)^2 by (e_Q - 2 mean e_S - (Q/N - 2 mean^2) e_N)
        / n, taken as (h_Q, 2 half h_S, half^2 h_N) / n (over n - 1 for a sample variance); a STDDEV's target a as its
        variance's a^2 (|sqrt(u) - sqrt(v)| <= sqrt(|u - v|): conservative near 0). A sizing, not a promise: the
        released interval is the fiducial one (its coverage measured), and the benchmark reports how often it meets
        the target. Untargeted outputs: what they get at the prepared epsilon."""
        lows = self._count_lows(stored, grouping)
        alone = as_accurate_as(self.query_plan)
        found = []
        for index, recipe in enumerate(self.query_plan.recipes):
            kind = aggregate(recipe.call)
            if index not in self.asked:
                found.append(alone[index])
            elif isinstance(kind, LinearAggregate):
                found.append(Requirement(width=self.asked[index]))
            else:
                half = BoundedArgument(recipe.call).half
                n = max(lows[index], 1.0)
                target = self.asked[index]
                if isinstance(kind, Spread):
                    target = target**2 if kind.root else target
                    bound = target * (max(n - 1, 1.0) if kind.sample else n)
                    found.append(Requirement(sized=(bound, half**2, 2 * half, 1.0)))
                else:
                    found.append(Requirement(sized=(target * n, half, 1.0, 0.0)))
        return found


def two_stages(query_plan: QueryPlan, asked: Mapping[int, float], default: Budget) -> TwoStages:
    """The two stages of `query_plan`'s query, its counts measured as a query at `default` would."""
    sized = [i for i in asked if not isinstance(aggregate(query_plan.query.aggregates[i]), LinearAggregate)]
    for candidate in candidate_plans(query_plan.query, default):
        if all(candidate.recipes[i].count is not None and candidate.recipes[i].total is not None for i in sized):
            return TwoStages(query_plan, candidate, asked)
    raise QueryRejected("no way of measuring this query has the counts of its AVG, VAR or STDDEV apart: ask with an "
                        "epsilon")


def _sources(stored: Sequence[StoredMeasurement], grouping: Grouping) -> list:
    return [stored_source(s, grouping, n) for s in stored if (n := cells_per_group(s, grouping)) is not None]
