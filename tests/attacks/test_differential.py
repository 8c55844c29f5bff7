"""The differential fuzzer at CI size (issue 7): generated accepted queries on tables that differ in one row.

`python -m benchmarks.attacks.differential` runs thousands of cases and reports wall-clock ratios; here a seeded
few hundred, with a deterministic count of per-row text work instead of time.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.differential import ADVERSARIAL_ROWS, Summary, fuzz, open_worlds, outcome
from tests.attacks.fuzz_side_channel_cases import CASES

FUZZ_CASES, SEED = 200, 7
# One row may make a query do at most this many times the per-row work of the table without it (issue 7: one row
# made a query 100x slower). The bound needs every text value's length bounded (the policy's max_length, on the
# branch that builds the type and cost check): here a 10,000-character value makes `lower(s)` 2,000x the work.
WORK_BOUND = 100.0


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


@pytest.mark.xfail(strict=True, reason="per-row cost needs bounded text lengths (policy max_length, cost model): "
                                       "the type and cost check of issue 7, built on another branch")
def test_one_row_costs_at_most_the_bound_in_per_row_work(summary: Summary) -> None:
    worst = summary.worst(summary.work_ratios, 1)
    assert worst[0][0] <= WORK_BOUND, f"{worst[0][0]:.0f}x [{worst[0][1]}] {worst[0][2]}"


_OPEN = pytest.mark.xfail(strict=True, reason="a checker problem (fuzz_side_channel_cases.py): refused by the type "
                                               "and totality check of issue 7, built on another branch")


@pytest.mark.parametrize("case", [pytest.param(case, marks=() if case.refused_yet else _OPEN) for case in CASES],
                         ids=[case.sql for case in CASES])
def test_an_expression_found_to_fail_on_one_row_is_refused_or_harmless(worlds, case) -> None:
    assert outcome(worlds, case.sql, case.theme) in ("refused", "answered"), case.reason
