"""Answering from released measurements: which stored noisy cells estimate a query's measurement, and how.

Everything here is post-processing of values already released and paid for, so it costs nothing; what must hold
is that an estimate is of the *same quantity* (else the answer is wrong while looking right). The soundness rules:

1. **Same relation.** A stored measurement is used only for a query of exactly the same bounded rows: the same
   tables and data (the engine's data version: the policy's text and the sources' fingerprints), the same ranking
   of each person's rows (the secret salt, which a prepared store keeps and each fresh load draws anew), the same
   row filter in canonical form (its top-level conjuncts in a fixed order, table qualifiers dropped), the same
   contribution bounding (m; the filtered cap's look-ahead `examined`, analysis/person_work.py: a different
   look-ahead keeps different rows; the declared-values conditions a filtered query adds for its public keys; with
   per-group bounds, the very grouping). rewrite/identity.py writes all of that as the SQL of the bounded rows,
   and the store keys measurements by its digest: two queries share a measurement only when those rows are the
   same SQL over the same data.
2. **Same quantity.** A measurement is a linear functional of those rows (planning/functionals.py): COUNT(*),
   COUNT(x), the centered sum of x on its fixed-point grid (the grid is part of the quantity, and so are x's
   clamping bounds, through the grid and the policy's text). Measurements of combinations of the same quantities
   combine linearly; COUNT(DISTINCT), distinct sums and the units of a filter only as measured; quantiles never.
3. **Groups.** A query's group is a sum of a stored measurement's cells only over *public* domains: the stored
   grouping has every key of the query (same expression, same declared values) and maybe more, and for each key
   the query does not have, the cells of its values outside the declared ones (and NULL) were measured too
   (`Grouping.others`, one more cell per key, released at no extra cost: each row is in exactly one cell, so the
   vector's sensitivity is unchanged). Groups chosen by partition selection are never summed or reused: a group
   not released is unreleased, not zero. Grouping sets are not reused either.
4. **The combination.** Several observations of combinations of the same quantities, each with independent noise
   (different measurements are different draws; a group's sum of n cells has n independent noises), combine into
   the minimum-variance unbiased linear estimate (generalised least squares: minimise sum c_s^2 V_s subject to
   sum c_s a_s = f, solved exactly in rationals, so that unbiasedness is exact). Its noise is then sum_s c_s N_s,
   whose law dp/noise_sums.py computes exactly (one lattice) or conservatively: the released interval covers at
   least 95%.

Measuring what is missing (planning/spending.py) is an ordinary measurement, charged in full (sequential
composition), combined with the stored ones. Noise reduction (releasing a less noisy version of a released value
for the difference of the epsilons: Koufogiannis et al. 2015) has proofs for continuous noise only; dpsql's noise
is discrete, so it is not done.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis.check import CheckedQuery
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.dp.noise_sums import NoiseTerm, WeightedNoise
from dpsql.planning.contribution import contribution
from dpsql.planning.functionals import Functional, additive
from dpsql.sql.parse import DIALECT

Mechanism = LaplaceMechanism | GaussianMechanism


class _Other:
    """A key's values outside its declared ones (NULL included), as one cell of a stored measurement."""

    _instance: _Other | None = None

    def __new__(cls) -> _Other:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OTHER"

    def __reduce__(self) -> str:
        return "OTHER"


OTHER = _Other()


def canonical(node: exp.Expression) -> str:
    """An expression of a query's relation as text that names what it computes, not how the query spelled its table:
    column qualifiers dropped (every column of a query is of its one relation), top-level AND conjuncts sorted."""
    bare = node.copy().transform(lambda part: exp.column(part.this.copy()) if isinstance(part, exp.Column) else part,
                                 copy=False)
    unwrapped = bare.unnest()
    if isinstance(unwrapped, exp.And):
        conjuncts = sorted(c.sql(DIALECT) for c in unwrapped.flatten())
        return " AND ".join(f"({c})" for c in conjuncts)
    return bare.sql(DIALECT)


@dataclass(frozen=True)
class Grouping:
    """A measurement's groups: its keys (canonical text), each key's declared values, and whether the cells of the
    values outside them were measured too (one OTHER value per key)."""

    keys: tuple[str, ...]
    domains: tuple[tuple[Any, ...], ...]
    others: bool

    def cells(self) -> list[tuple[Any, ...]]:
        """Every cell, the public combinations first (in the order of the declared values), then those with OTHER."""
        public = list(itertools.product(*self.domains))
        if not self.others:
            return public
        extended = itertools.product(*[(*domain, OTHER) for domain in self.domains])
        return public + [cell for cell in extended if OTHER in cell]


def grouping_of(query: CheckedQuery) -> Grouping | None:
    """The query's grouping, when its measurements can be stored and derived: every key has declared values (no
    partition selection), no grouping sets; `others` unless per-group bounds cap each group (then a unit could put
    k groups' rows into one OTHER cell, past the L2 bound the noise was calibrated to)."""
    if query.groupings or any(key.domain is None for key in query.keys):
        return None
    others = not contribution(query).per_group_enforced
    return Grouping(tuple(canonical(key.expression) for key in query.keys), tuple(key.domain for key in query.keys),
                    others)


@dataclass(frozen=True)
class StoredMeasurement:
    """One released noisy vector, as the measurement store keeps it (store/measurements.py)."""

    id: int
    analyst: str
    charge: int | None  # the ledger entry that paid for it
    label: str  # what it measures, as explain writes it
    functional: Functional
    grouping: Grouping
    mechanism: Mechanism  # its noise, in integer steps
    step: Fraction  # value units per step
    cells: Mapping[tuple[Any, ...], int]  # the noisy integer of every cell of the grouping

    @property
    def variance(self) -> Fraction:
        """One cell's noise variance, in steps squared (rounded to 15 digits: the weights need no more)."""
        return Fraction(float(f"{self.mechanism.variance:.15g}"))


def cells_per_group(stored: StoredMeasurement, grouping: Grouping) -> int | None:
    """How many of the stored cells make up one group of `grouping`, or None if the groups are no sums of them
    (rule 3): the stored keys include the query's (same expression, same declared values) and the others measured
    for the rest, and the quantity adds up across groups when there is a rest."""
    stored_keys = dict(zip(stored.grouping.keys, stored.grouping.domains, strict=True))
    if len(set(grouping.keys)) != len(grouping.keys) or len(stored_keys) != len(stored.grouping.keys):
        return None
    if any(stored_keys.get(key) != domain for key, domain in zip(grouping.keys, grouping.domains, strict=True)):
        return None
    rest = [domain for key, domain in stored_keys.items() if key not in grouping.keys]
    if rest and not (stored.grouping.others and additive(stored.functional)):
        return None
    if len(stored.cells) != len(stored.grouping.cells()):
        return None  # not a complete grid: refuse rather than sum a part
    return math.prod(len(domain) + 1 for domain in rest)


def group_sums(stored: StoredMeasurement, grouping: Grouping) -> list[int]:
    """The stored noisy integers summed into each public group of `grouping` (its cells() order, OTHER excluded)."""
    positions = [stored.grouping.keys.index(key) for key in grouping.keys]
    index = {cell: i for i, cell in enumerate(itertools.product(*grouping.domains))}
    sums = [0] * len(index)
    for cell, value in stored.cells.items():
        target = index.get(tuple(cell[p] for p in positions))
        if target is not None:
            sums[target] += value
    return sums


@dataclass(frozen=True)
class Observation:
    """What one source says of a group: a functional of its rows plus noise of `variance` (in its steps squared)."""

    functional: Functional
    variance: Fraction


def best_linear(target: Functional, observations: Sequence[Observation]) -> list[Fraction] | None:
    """The coefficients c of the minimum-variance unbiased estimate sum_s c_s Y_s of `target` (rule 4), or None if no
    combination of the observations is the target. Exact: c = V^-1 A lambda with (A^T V^-1 A) lambda = f, solved in
    rationals, so sum_s c_s a_s = f holds exactly."""
    quantities = sorted({q for o in observations for q, _ in o.functional} | {q for q, _ in target}, key=repr)
    if not observations or any(o.variance <= 0 for o in observations):
        return None
    position = {q: i for i, q in enumerate(quantities)}
    rows = [[Fraction(0)] * len(quantities) for _ in observations]
    for row, observation in zip(rows, observations, strict=True):
        for quantity, weight in observation.functional:
            row[position[quantity]] = Fraction(weight)
    wanted = [Fraction(0)] * len(quantities)
    for quantity, weight in target:
        wanted[position[quantity]] = Fraction(weight)
    normal = [[sum(row[i] * row[j] / o.variance for row, o in zip(rows, observations, strict=True))
               for j in range(len(quantities))] for i in range(len(quantities))]
    solution = _solve(normal, wanted)
    if solution is None:
        return None
    coefficients = [sum(row[i] * solution[i] for i in range(len(quantities))) / o.variance
                    for row, o in zip(rows, observations, strict=True)]
    for i in range(len(quantities)):  # unbiased, exactly (the solve is exact; this guards the code, not the maths)
        if sum(c * row[i] for c, row in zip(coefficients, rows, strict=True)) != wanted[i]:
            return None
    return coefficients


def _solve(matrix: list[list[Fraction]], vector: list[Fraction]) -> list[Fraction] | None:
    """One solution of matrix x = vector by Gaussian elimination in rationals, None if there is none."""
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    width = len(vector)
    pivots: list[int] = []
    top = 0
    for column in range(width):
        found = next((r for r in range(top, len(rows)) if rows[r][column] != 0), None)
        if found is None:
            continue
        rows[top], rows[found] = rows[found], rows[top]
        lead = rows[top][column]
        rows[top] = [value / lead for value in rows[top]]
        for r in range(len(rows)):
            if r != top and rows[r][column] != 0:
                factor = rows[r][column]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[top], strict=True)]
        pivots.append(column)
        top += 1
    if any(all(v == 0 for v in row[:width]) and row[width] != 0 for row in rows):
        return None
    solution = [Fraction(0)] * width
    for r, column in enumerate(pivots):
        solution[column] = rows[r][width]
    return solution


@dataclass(frozen=True)
class Source:
    """One independent noisy vector an estimate reads: a stored measurement summed into the query's groups (`count`
    cells each; `values`, its group sums), or one of the query's measurements measured now (`measured`: its index in
    the plan)."""

    stored: StoredMeasurement | None
    measured: int | None
    functional: Functional
    mechanism: Mechanism
    step: Fraction
    count: int = 1
    values: tuple[int, ...] | None = None

    @property
    def observation(self) -> Observation:
        variance = Fraction(float(f"{self.mechanism.variance:.15g}")) * self.count
        return Observation(self.functional, variance)

    def noise(self) -> WeightedNoise:
        """One group's noise in this source, in its own integer steps."""
        return WeightedNoise((NoiseTerm(self.mechanism, Fraction(1), self.count),))

    @property
    def name(self) -> str:
        if self.stored is None:
            return f"m{self.measured}, measured now"
        stored = self.stored
        by = ", ".join(stored.grouping.keys) or "no key"
        paid = f", ledger entry {stored.charge}" if stored.charge is not None else ""
        summed = f", {self.count} cells per group" if self.count > 1 else ""
        return f"stored #{stored.id}: {stored.label} by {by}{summed}{paid}"


def stored_source(stored: StoredMeasurement, grouping: Grouping, count: int) -> Source:
    """A stored measurement as a source for `grouping`'s groups."""
    return Source(stored, None, stored.functional, stored.mechanism, stored.step, count,
                  tuple(group_sums(stored, grouping)))


Estimate = tuple[tuple[Fraction, int], ...]  # (coefficient, source index) pairs


@dataclass(frozen=True)
class Combination:
    """How each of a plan's measurements is estimated: per measurement, (coefficient, source index) pairs, its value
    in its own integer steps being the sum of coefficient * the source's group value."""

    sources: tuple[Source, ...]
    estimates: tuple[Estimate, ...]

    @property
    def measured(self) -> tuple[int, ...]:
        """The plan's measurements measured now."""
        return tuple(s.measured for s in self.sources if s.measured is not None)

    def law(self, terms: Sequence[tuple[float, int]], steps: Sequence[Fraction]) -> WeightedNoise:
        """The noise of sum_j coef_j * measurement_j (value units; `steps`: each measurement's step), its sources'
        weights merged: two estimates reading one source are not independent."""
        weights: dict[int, Fraction] = {}
        for coefficient, j in terms:
            for c, s in self.estimates[j]:
                weights[s] = weights.get(s, Fraction(0)) + Fraction(coefficient) * c * steps[j]
        return WeightedNoise(tuple(NoiseTerm(self.sources[s].mechanism, w, self.sources[s].count)
                                   for s, w in weights.items()))

    def variance(self, j: int) -> float:
        """Measurement j's estimate's noise variance, in its steps squared."""
        return sum(float(c) ** 2 * float(self.sources[s].observation.variance) for c, s in self.estimates[j])

    def used(self) -> list[Source]:
        """The sources some estimate reads, in order."""
        return [self.sources[s] for s in sorted({s for estimate in self.estimates for _, s in estimate})]

    def values(self, groups: int, measured: Mapping[int, Sequence[int]]) -> np.ndarray:
        """groups x measurements: each estimate's value (in its steps) from its sources' group values; `measured`
        gives each measured-now source's noisy integers, by plan measurement."""
        found = [measured[s.measured] if s.values is None else s.values for s in self.sources]
        out = np.empty((groups, len(self.estimates)), dtype=object)
        for j, estimate in enumerate(self.estimates):
            for g in range(groups):
                total = sum((c * found[s][g] for c, s in estimate), Fraction(0))
                out[g, j] = int(total) if total.denominator == 1 else float(total)
        return out


def combine(target: Functional, sources: Sequence[Source]) -> Estimate | None:
    """The target's best linear estimate over the sources that share a quantity with it, directly or through other
    sources (the others cannot help), or None when no combination of them is the target."""
    wanted = {q for q, _ in target}
    useful: list[int] = []
    grew = True
    while grew:
        grew = False
        for i, source in enumerate(sources):
            if i not in useful and any(q in wanted for q, _ in source.functional):
                useful.append(i)
                wanted |= {q for q, _ in source.functional}
                grew = True
    coefficients = best_linear(target, [sources[i].observation for i in useful]) if useful else None
    if coefficients is None:
        return None
    return tuple((c, i) for c, i in zip(coefficients, useful, strict=True) if c != 0)


__all__ = ["OTHER", "Combination", "Estimate", "Grouping", "Observation", "Source", "StoredMeasurement",
           "best_linear", "canonical", "cells_per_group", "combine", "group_sums", "grouping_of", "stored_source"]
