"""What a measurement measures, as a linear functional of the bounded rows: the vocabulary of reuse.

Every additive measurement (planning/measurements.py) sums, over the bounded rows of a group, an integer that is a
fixed combination of a few per-row quantities of one argument x on its fixed-point grid:

    ROWS      1 per row                                  ("rows")
    PRESENT   1 per row where x is not NULL              ("present", x)   (rows itself when x is never NULL)
    CENTERED  x's centered grid integer, where not NULL  ("centered", x, grid)
    SQUARES   its centered square on the squares' grid   ("squares", x, grid, squares' grid)

so that, in the measurement's own integer units (the rewrite's SQL, rewrite/passes._measurement):

    ROWS()           = rows                       SUM(x) centered = centered
    ROWS(x)          = present                    SUM(x) plain    = centered + center * present
    NULLS(x)         = rows - present             ABOVE(x)        = centered + bound * present
    NULLS(x) of a pair = 2 bound (rows - present) BELOW(x)        = bound * present - centered
    SUMSQ(x)         = squares

A measurement that is no such sum (COUNT(DISTINCT ...), the sums over distinct values, the units of a filter) is a
quantity of its own ("exact", its key), reused only as measured: its cells do not add up across groups (a unit in
two groups is counted in both). A quantile is never reused (its release is not additive). Two measurements of the
same relation (store/measurements.py, rewrite/identity.py) that are combinations of the same quantities can be
combined linearly (planning/reuse.py); `tests/test_reuse_identities.py` checks every identity above on the exact
measurements of the engine.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from dpsql.analysis.check import CheckedQuery
from dpsql.planning.measurements import MeasurementKind, MeasurementSpec

Quantity = tuple  # ("rows",), ("present", x), ("centered", x, grid), ("squares", x, grid, grid), ("exact", key)
Functional = tuple[tuple[Quantity, int], ...]  # sorted (quantity, integer coefficient) pairs, none zero


def nullable_arguments(query: CheckedQuery, text: Callable[[exp.Expression], str]) -> frozenset[str]:
    """The arguments (as `text` writes them) that can be NULL on some row, from the checker's calls: any other
    argument's PRESENT is ROWS."""
    return frozenset(text(call.argument) for call in query.aggregates
                     if call.argument is not None and call.nullable)


def functional(spec: MeasurementSpec, text: Callable[[exp.Expression], str],
               nullable: frozenset[str]) -> Functional | None:
    """The measurement as a combination of quantities, or None for a quantile (never reused). `text` writes an
    argument canonically (the same expression of the same relation: the same text)."""
    kind = spec.kind
    if kind is MeasurementKind.QUANTILE:
        return None
    argument = text(spec.argument) if spec.argument is not None else None
    if spec.distinct or kind in (MeasurementKind.UNITS, MeasurementKind.DISTINCT):
        label = (kind.value, argument, _grid(spec), spec.plain)
        return ((("exact", *label), 1),)
    rows: Quantity = ("rows",)
    if kind is MeasurementKind.ROWS:
        return _canonical({rows if argument is None else _present(argument, nullable): 1})
    present = _present(argument, nullable)
    if kind is MeasurementKind.NULLS:
        weight = 2 * spec.value_point.bound if spec.value_point is not None else 1
        return _canonical({rows: weight, present: -weight})
    centered: Quantity = ("centered", argument, _grid(spec))
    point = spec.value_point
    if kind is MeasurementKind.SUM:
        return _canonical({centered: 1, present: point.center if spec.plain else 0})
    if kind is MeasurementKind.ABOVE:
        return _canonical({centered: 1, present: point.bound})
    if kind is MeasurementKind.BELOW:
        return _canonical({centered: -1, present: point.bound})
    if kind is MeasurementKind.SUMSQ:
        square = spec.square_point
        return _canonical({("squares", argument, _grid(spec), (square.exponent, square.center, square.bound)): 1})
    raise ValueError(f"no functional for {kind}")


def additive(found: Functional) -> bool:
    """Whether its cells add up across groups (a coarser grouping is their sum)."""
    return all(quantity[0] != "exact" for quantity, _ in found)


def _present(argument: str | None, nullable: frozenset[str]) -> Quantity:
    return ("present", argument) if argument in nullable else ("rows",)


def _grid(spec: MeasurementSpec) -> tuple[int, int, int] | None:
    point = spec.value_point
    return (point.exponent, point.center, point.bound) if point is not None else None


def _canonical(coefficients: dict[Quantity, int]) -> Functional:
    merged: dict[Quantity, int] = {}
    for quantity, weight in coefficients.items():
        merged[quantity] = merged.get(quantity, 0) + weight
    return tuple(sorted(((q, w) for q, w in merged.items() if w), key=repr))
