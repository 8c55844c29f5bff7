"""The differential fuzzer at CI size (issue 7): generated accepted queries on tables that differ in one row.

`python -m benchmarks.attacks.differential` runs thousands of cases and reports wall-clock ratios; here a seeded
few hundred, with a deterministic count of per-row text work instead of time.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.differential import ADVERSARIAL_ROWS, Summary, fuzz, open_worlds, outcome
from dpsql.analysis.typecheck import MAX_ROW_COST
from tests.attacks.fuzz_side_channel_cases import CASES

FUZZ_CASES, SEED = 200, 7


@pytest.fixture(scope="module")
def worlds(tmp_path_factory: pytest.TempPathFactory):
    opened = open_worlds(tmp_path_factory.mktemp("differential"), SEED)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def summary(worlds) -> Summary:
    return fuzz(worlds, FUZZ_CASES, SEED)


def test_the_fuzzer_reaches_accepted_queries_on_every_adversarial_row(summary: Summary) -> None:
    assert summary.accepted >= FUZZ_CASES // 2 and summary.refused > 0
    assert {theme for _, theme, _ in summary.work_ratios} == set(ADVERSARIAL_ROWS)


def test_no_accepted_query_fails_or_merges_groups_on_any_row(summary: Summary) -> None:
    assert not summary.findings, "\n".join(summary.lines())


def test_one_row_handles_at_most_the_checkers_static_row_cost(summary: Summary, worlds) -> None:
    """The bound is the cost model's, fixed from the text and the policy (text cut to max_length at load): the most
    text any accepted expression handles on any adversarial row stays within it, whatever the row holds."""
    worst = summary.worst(summary.work_absolute, 1)
    assert worst[0][0] <= MAX_ROW_COST, f"{worst[0][0]:.0f} [{worst[0][1]}] {worst[0][2]}"


@pytest.mark.parametrize("case", CASES, ids=[case.sql for case in CASES])
def test_an_expression_found_to_fail_on_one_row_is_refused_or_harmless(worlds, case) -> None:
    assert outcome(worlds, case.sql, case.theme) in ("refused", "answered"), case.reason


def test_no_accepted_pair_query_fails_on_any_row(worlds) -> None:
    """COUNT(*), COUNT(e), SUM(e) and AVG(e) of one generated argument, measured as a pair of complementary sums
    (with its NULL rows): no adversarial row makes one fail after acceptance."""
    paired = fuzz(worlds, 150, SEED + 3, paired=True)
    assert paired.accepted >= 40, "\n".join(paired.lines())
    assert not paired.findings, "\n".join(paired.lines())
