"""The empirical DP audit: dpsql stays within its claimed epsilon; deliberately broken variants are caught.

Each case runs its bounded SQL once on D and once on D' (D plus one worst-case unit) and draws dpsql's release
DRAWS times on each (benchmarks/attacks/audit.py explains the claims and the statistics).
"""

from __future__ import annotations

import itertools

import pytest

from benchmarks.attacks.audit import BROKEN, CASES, MECHANISMS, Neighbours, audit, end_to_end, load

DRAWS = 6000
SEED = 17
CASE_IDS = {case.kind: case for case in CASES}

# Variants whose witness is tight enough to exceed the claim; the others are reported by the script.
CAUGHT = [
    *[(kind, mechanism, "noise scale halved") for kind in ("COUNT(*)", "COUNT(DISTINCT unit)", "SUM", "AVG",
                                                            "COUNT, SUM, AVG (a pair)") for mechanism in MECHANISMS],
    ("COUNT(*)", "laplace", "rows per unit uncapped"),
    # The pair's NULL rows calibrated as rows: only COUNT(*) - COUNT(x) shows it (the pair case has no NULL row)
    *[("COUNT(*) - COUNT(x) (a pair, NULL rows)", mechanism, "pair's NULL rows in rows") for mechanism in MECHANISMS],
    *[("GROUP BY, partition selection", mechanism, "selection threshold 1") for mechanism in MECHANISMS],
]


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[tuple[str, str], Neighbours] = {}

    def get(kind: str, mechanism: str) -> Neighbours:
        if (kind, mechanism) not in cache:
            folder = tmp_path_factory.mktemp("audit")
            cache[kind, mechanism] = load(folder, CASE_IDS[kind], mechanism, SEED)
        return cache[kind, mechanism]
    return get


@pytest.mark.parametrize(("kind", "mechanism"), list(itertools.product(CASE_IDS, MECHANISMS)))
def test_the_audit_stays_within_the_claimed_epsilon(neighbours, kind: str, mechanism: str) -> None:
    result = audit(neighbours(kind, mechanism), DRAWS, SEED)
    assert result.holds, result.line()


@pytest.mark.parametrize(("kind", "mechanism", "variant"), CAUGHT)
def test_the_audit_catches_a_broken_mechanism(neighbours, kind: str, mechanism: str, variant: str) -> None:
    case = neighbours(kind, mechanism)
    plan, rows = BROKEN[variant](case)
    result = audit(case, DRAWS, SEED + 1, variant, plan, rows)
    assert not result.holds, result.line()


def test_end_to_end_answers_follow_the_audited_distribution(neighbours) -> None:
    """PrivateSession.execute releases what the batched release draws, and stays within the claim too."""
    e2e = end_to_end(neighbours("COUNT(*)", "laplace"), executions=100, draws=DRAWS, seed=SEED)
    assert min(e2e.pvalues) > 0.01, e2e.pvalues
    assert e2e.witness.epsilon <= e2e.claim.epsilon
