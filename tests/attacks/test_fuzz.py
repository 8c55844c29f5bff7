"""Fuzzing at CI size: generated and mutated SQL through PrivateSession.execute and the dpsql command.

Every outcome must be an answer with exactly its charge (reading only the declared table) or a clean
dpsql.errors.Error that cost nothing. The script `python -m benchmarks.attacks.fuzz` runs thousands of cases.
"""

from __future__ import annotations

import pytest

from benchmarks.attacks.fuzz import EDGE_CASES, Summary, fuzz_cli, fuzz_edges, fuzz_session

SESSION_CASES, CLI_CASES, SEED = 300, 40, 31


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Summary]:
    return {"session": fuzz_session(tmp_path_factory.mktemp("fuzz"), SESSION_CASES, SEED),
            "cli": fuzz_cli(tmp_path_factory.mktemp("fuzz_cli"), CLI_CASES, SEED + 1)}


@pytest.mark.parametrize("interface", ["session", "cli"])
def test_fuzz_reaches_answers_and_rejections(runs, interface: str) -> None:
    counts = runs[interface].counts
    assert counts["answered"] > 0 and counts["rejected"] > 0, counts
    assert runs[interface].exhausted == 0


@pytest.mark.parametrize("interface", ["session", "cli"])
@pytest.mark.parametrize("kind", ["crash", "charged error", "free answer", "foreign read"])
def test_fuzz_finds_no(runs, interface: str, kind: str) -> None:
    summary = runs[interface]
    assert not summary.violations(kind), summary.report()


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    return fuzz_edges(tmp_path_factory.mktemp("edges"), SEED)


@pytest.mark.parametrize("index", range(len(EDGE_CASES)),
                         ids=[f"{c.sql} [epsilon={c.epsilon!r}]" for c in EDGE_CASES])
def test_a_minimised_edge_case_is_answered_with_its_charge_or_refused_for_free(edges, index: int) -> None:
    assert edges.exhausted == 0
    outcome = edges.outcomes[index]
    assert not outcome.violation, f"{outcome.signature}\n  sql={outcome.case.sql!r} epsilon={outcome.case.epsilon!r}"
