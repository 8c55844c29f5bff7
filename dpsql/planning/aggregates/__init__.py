"""The supported aggregates: one module per kind, and this registry of them.

Adding an aggregate is a new module with an `Aggregate` subclass (base.py says what it provides) and one line in
AGGREGATES. The checker, the planner, the release, post-processing and explain all read the kinds from here.
"""

from __future__ import annotations

from dpsql.analysis.check import AggregateCall, AggregateKind, Vocabulary
from dpsql.planning.aggregates.average import Average
from dpsql.planning.aggregates.base import LEVEL, Aggregate, Estimate, IntervalMethod, NoisyCells
from dpsql.planning.aggregates.count import Count
from dpsql.planning.aggregates.distinct import DistinctValues
from dpsql.planning.aggregates.distinct_sums import AverageDistinct, SumDistinct
from dpsql.planning.aggregates.quantile import QUANTILES
from dpsql.planning.aggregates.spread import SPREADS
from dpsql.planning.aggregates.total import Sum
from dpsql.planning.aggregates.units import Units

AGGREGATES: tuple[Aggregate, ...] = (
    Count(),
    Units(),
    DistinctValues(),
    Sum(),
    Average(),
    SumDistinct(),
    AverageDistinct(),
    *SPREADS,
    *QUANTILES,
)


def _by_kind() -> dict[AggregateKind, Aggregate]:
    kinds = {a.kind: a for a in AGGREGATES}
    if len(kinds) != len(AGGREGATES):
        raise ImportError("two aggregates in the registry have the same kind")
    return kinds


def _vocabulary() -> Vocabulary:
    """What the checker (a layer below, which cannot import this) needs to read a query's aggregate calls."""
    functions = {function: a.kind for a in AGGREGATES for function in a.functions}
    if len(functions) != sum(len(a.functions) for a in AGGREGATES):
        raise ImportError("two aggregates in the registry answer the same SQL function")
    distinct = {a.distinct_of: a.kind for a in AGGREGATES if a.distinct_of is not None}
    return Vocabulary(functions, ", ".join(dict.fromkeys(a.listed_as for a in AGGREGATES)), distinct)


_BY_KIND = _by_kind()
VOCABULARY = _vocabulary()


def aggregate(call: AggregateCall) -> Aggregate:
    """The kind of aggregate `call` is."""
    return _BY_KIND[call.kind]


__all__ = ["AGGREGATES", "LEVEL", "VOCABULARY", "Aggregate", "Estimate", "IntervalMethod", "NoisyCells",
           "aggregate"]
