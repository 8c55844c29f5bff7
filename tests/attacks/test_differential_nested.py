"""The differential fuzzer over the SQL of issue 9 and the normaliser (red team 6a): per-unit aggregation (inner
WHERE, aggregates of row expressions, HAVING, an outer WHERE on derived values, joined back to its table), CTEs
merged through row-level subqueries, the unit semi-join, correlated EXISTS, FILTER and GROUP BY ALL, each with a
generated row expression inside, on tables that differ in one adversarial row. An accepted query must not fail
on any of them (a one-row error oracle through a rewrite)."""

from __future__ import annotations

import pytest

from benchmarks.attacks.differential import ADVERSARIAL_ROWS, Summary, fuzz, open_worlds
from dpsql.analysis.typecheck import MAX_ROW_COST

CASES, SEED = 240, 11


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    worlds = open_worlds(tmp_path_factory.mktemp("nested"), SEED)
    try:
        return fuzz(worlds, CASES, SEED, nested=True)
    finally:
        worlds.close()


def test_the_nested_forms_reach_accepted_queries_on_every_adversarial_row(summary: Summary) -> None:
    assert summary.accepted >= CASES // 2 and summary.refused > 0
    assert {theme for _, theme, _ in summary.work_ratios} == set(ADVERSARIAL_ROWS)
    for form in ("GROUP BY uid) AS p GROUP BY n", "HAVING SUM(CASE", "AS p WHERE", "WITH c AS", "uid IN (SELECT",
                 "EXISTS (SELECT", "FILTER (WHERE", "JOIN f ON f.uid = p.uid"):
        assert any(form in sql for _, _, sql in summary.work_ratios), form  # accepted in some world


def test_no_nested_query_fails_or_merges_groups_on_any_row(summary: Summary) -> None:
    assert not summary.findings, "\n".join(summary.lines())


def test_one_row_handles_at_most_the_static_row_cost_through_the_rewrites(summary: Summary) -> None:
    worst = summary.worst(summary.work_absolute, 1)
    assert worst[0][0] <= MAX_ROW_COST, f"{worst[0][0]:.0f} [{worst[0][1]}] {worst[0][2]}"
