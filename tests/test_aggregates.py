"""The aggregate registry: every kind has one home, and what explain says of an interval is what release computes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlglot import exp

from dpsql.dp.quantile import QuantileRelease
from dpsql.errors import QueryRejected
from dpsql.frontends.explain import explain
from dpsql.planning.aggregates import AGGREGATES, VOCABULARY, aggregate
from dpsql.planning.aggregates.base import (
    FIDUCIAL,
    LONE_QUANTILE,
    SUMMED_NOISE,
    Fiducial,
    IntervalMethod,
    LinearInterval,
    NoisyCells,
)
from dpsql.planning.aggregates.quantile import NOISY_RANKS, NoisyRanks
from dpsql.planning.measurements import MeasurementKind
from dpsql.planning.plan import QueryPlan

METHODS: tuple[IntervalMethod, ...] = (LONE_QUANTILE, SUMMED_NOISE, FIDUCIAL, NOISY_RANKS)

# At least one query per registered kind, and both ways of measuring SUM (alone it is one plain sum; beside
# COUNT(*) and AVG, which pay for the count, it is a centered sum plus the center times that count).
QUERIES = (
    "SELECT COUNT(*) FROM pums",
    "SELECT COUNT(DISTINCT pid) FROM pums",
    "SELECT educ, COUNT(DISTINCT age) FROM pums GROUP BY educ",
    "SELECT SUM(income) FROM pums",
    "SELECT sex, COUNT(*), SUM(income), AVG(income) FROM pums GROUP BY sex",
    "SELECT AVG(age) FROM pums",
    "SELECT VAR_SAMP(age), VAR_POP(age), STDDEV_SAMP(income), STDDEV_POP(income) FROM pums",
    "SELECT sex, MEDIAN(income), MIN(age), MAX(age) FROM pums GROUP BY sex",
    "SELECT sex, SUM(DISTINCT income), AVG(DISTINCT age) FROM pums GROUP BY sex",
)


def _used_methods(monkeypatch: pytest.MonkeyPatch) -> list[IntervalMethod]:
    """Record every interval method a release computes with, whatever the aggregate asks explain to say."""
    used: list[IntervalMethod] = []
    for cls, name in ((type(LONE_QUANTILE), "spread"), (type(SUMMED_NOISE), "spread"), (Fiducial, "estimate"),
                      (NoisyRanks, "estimate")):
        original = getattr(cls, name)

        def record(self, *args, _original=original, **kwargs):
            used.append(self)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, record)
    return used


def _output_lines(query_plan: QueryPlan) -> list[str]:
    lines = explain(query_plan).splitlines()
    start = lines.index("Outputs (post-processing of the measurements, free):") + 1
    return lines[start:start + len(query_plan.recipes)]


def _disagreements(query_plan: QueryPlan, used: list[IntervalMethod], seen: set) -> list[str]:
    """Each output whose explain line does not name, alone, the one interval method its estimate computed with."""
    noisy = np.empty((3, len(query_plan.measurements)), dtype=object)
    for (g, j), _ in np.ndenumerate(noisy):  # what release hands the outputs: a count, or a chosen candidate
        quantile = query_plan.measurements[j].spec.kind is MeasurementKind.QUANTILE
        noisy[g, j] = QuantileRelease(20.0 + g, 10.0, 30.0 + j) if quantile else 1000 + 17 * g + j
    cells = NoisyCells(query_plan.measurements, noisy)
    wrong = []
    for recipe, line in zip(query_plan.recipes, _output_lines(query_plan), strict=True):
        kind = aggregate(recipe.call)
        used.clear()
        kind.estimate(recipe, cells)
        named = [m for m in METHODS if f"({m.name})" in line]
        if len(used) != 1 or named != used or "delta method" in line:
            wrong.append(f"{recipe.call.text}: computed with {[m.name for m in used]}, explained as: {line}")
        seen.update((kind.kind, m.name) for m in used)
    return wrong


def test_explain_names_the_interval_method_release_uses(pums_session, monkeypatch: pytest.MonkeyPatch) -> None:
    used = _used_methods(monkeypatch)
    seen: set = set()
    for sql in QUERIES:
        assert not _disagreements(pums_session.prepare(sql).plan, used, seen)
    assert {kind for kind, _ in seen} == {a.kind for a in AGGREGATES}, "a registered kind has no query here"
    assert {name for _, name in seen} == {m.name for m in METHODS}, "an interval method is not exercised"


def test_the_check_would_see_a_disagreement(pums_session, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test above can fail: an AVG whose estimate computes with another method than the one it names is
    caught."""
    query_plan = pums_session.prepare("SELECT AVG(age) FROM pums").plan
    average = type(aggregate(query_plan.recipes[0].call))
    computes = average.estimate
    monkeypatch.setattr(average, "interval_method", lambda self, recipe: SUMMED_NOISE)
    monkeypatch.setattr(average, "estimate", lambda self, recipe, cells: FIDUCIAL.estimate(
        list(recipe.pair or (recipe.count, recipe.total)), lambda first, second: first / second, cells))
    used = _used_methods(monkeypatch)
    assert _disagreements(query_plan, used, set())
    monkeypatch.setattr(average, "interval_method", lambda self, recipe: FIDUCIAL)
    monkeypatch.setattr(average, "estimate", computes)
    assert not _disagreements(query_plan, used, set())


def test_a_linear_interval_is_the_same_in_explain_and_release(pums_session) -> None:
    """The half-width explain prints for a lone count or sum is the one release adds and subtracts."""
    query_plan = pums_session.prepare("SELECT COUNT(*), SUM(income), SUM(income / 2) FROM pums").plan
    others = len(query_plan.measurements) - 1
    cells = NoisyCells(query_plan.measurements, np.array([[5000] + [10**9] * others], dtype=object))
    for recipe in query_plan.recipes:
        kind = aggregate(recipe.call)
        method = kind.interval_method(recipe)
        assert isinstance(method, LinearInterval)
        estimate = kind.release(recipe, cells)
        width = kind.width(recipe, query_plan.measurements)
        unrounded = sum(c * cells.real(i)[0] for c, i in kind.terms(recipe))
        if recipe.call.type in ("BIGINT", "HUGEINT"):  # COUNT, SUM of integers: the value rounded, the interval's
            # whole numbers
            assert estimate.value[0] == round(unrounded)
            assert (estimate.low[0], estimate.high[0]) == (max(0, math.ceil(unrounded - width)),
                                                           math.floor(unrounded + width))
        else:
            assert estimate.high[0] - estimate.value[0] == pytest.approx(width)


def test_the_registry_gives_the_checker_its_vocabulary() -> None:
    assert VOCABULARY.supported == ("COUNT, COUNT(DISTINCT unit), COUNT(DISTINCT expr), SUM, AVG, SUM(DISTINCT x), "
                                   "AVG(DISTINCT x), VAR, STDDEV, MEDIAN, QUANTILE_CONT, MIN, MAX")
    assert VOCABULARY.distinct == {"sum": "sum_distinct", "avg": "avg_distinct"}
    assert VOCABULARY.functions[exp.StddevSamp] == VOCABULARY.functions[exp.Stddev] == "stddev_samp"
    assert exp.Count not in VOCABULARY.functions  # COUNT's argument is read by the checker itself


def test_an_unregistered_aggregate_is_refused_with_the_registry_s_list(pums_session) -> None:
    with pytest.raises(QueryRejected, match=r"MODE is not supported: .*\(supported: COUNT, COUNT\(DISTINCT unit\), "
                                            r"COUNT\(DISTINCT expr\), SUM, AVG, SUM\(DISTINCT x\), AVG\(DISTINCT x\), "
                                            r"VAR, STDDEV, MEDIAN, QUANTILE_CONT, "
                                            r"MIN, MAX\)"):
        pums_session.prepare("SELECT MODE(age) FROM pums")
