"""The budget split between a query's measurements (dpsql/dp/allocation.py), against brute force.

The error of a split is sum W_j / epsilon_j**2 under pure DP (Laplace variances) and sum W_j / rho_j under
zCDP (Gaussian variances); `split` must minimise it for the given total, and `objective` must be that minimum
for a unit budget.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.dp.allocation import objective, split


def error(weights: list[float], shares: list[float], zcdp: bool) -> float:
    """The summed weighted variance of a split (up to the mechanisms' constant factors)."""
    power = 1 if zcdp else 2
    return sum(w / s**power for w, s in zip(weights, shares, strict=True) if w > 0)


def grid_minimum(weights: list[float], total: float, zcdp: bool, steps: int = 300) -> float:
    """The least error over every split of `total` on a grid of steps along the simplex."""
    best = np.inf
    for cut in itertools.product(range(1, steps), repeat=len(weights) - 1):
        if sum(cut) >= steps:
            continue
        shares = [c / steps * total for c in (*cut, steps - sum(cut))]
        best = min(best, error(weights, shares, zcdp))
    return best


WEIGHTS = [[1.0, 1.0], [1.0, 8.0], [0.3, 5.0, 2.0], [100.0, 1.0, 0.01], [2.0, 3.0, 5.0]]


@pytest.mark.parametrize("zcdp", [False, True], ids=["pure", "zcdp"])
@pytest.mark.parametrize("weights", WEIGHTS, ids=str)
def test_the_split_is_no_worse_than_any_split_on_a_grid(weights: list[float], zcdp: bool) -> None:
    total = 1.5
    shares = split(Fraction(total), weights, zcdp)
    best = grid_minimum(weights, total, zcdp)
    assert error(weights, shares, zcdp) <= best * (1 + 1e-9)
    # and the grid comes close to it, so the grid searched the right function
    assert best <= error(weights, shares, zcdp) * 1.01


@pytest.mark.parametrize("zcdp", [False, True], ids=["pure", "zcdp"])
@pytest.mark.parametrize("weights", WEIGHTS, ids=str)
def test_the_objective_is_the_minimal_error_for_a_unit_budget(weights: list[float], zcdp: bool) -> None:
    total = 2.0
    shares = split(Fraction(total), weights, zcdp)
    scale = total if zcdp else total**2  # error falls as 1/rho under zCDP and as 1/epsilon**2 under pure DP
    assert error(weights, shares, zcdp) * scale == pytest.approx(objective(weights, zcdp), rel=1e-9)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(weights=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=8),
       total=st.fractions(Fraction(1, 10**6), Fraction(10**6)), zcdp=st.booleans())
def test_shares_sum_to_the_total_and_never_exceed_it(weights: list[float], total: Fraction, zcdp: bool) -> None:
    shares = split(total, weights, zcdp)
    assert len(shares) == len(weights) and all(s >= 0 for s in shares)
    exact = sum(Fraction(s) for s in shares)
    assert exact <= total  # the ledger charges `total`: the noise may not use more
    assert exact >= total * (1 - Fraction(1, 10**10))  # and nothing of it is wasted beyond the 1e-12 shrink
    assert all(s == 0 for s, w in zip(shares, weights, strict=True) if w == 0) or not any(weights)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(weights=st.lists(st.floats(1e-3, 1e3), min_size=2, max_size=6), zcdp=st.booleans(),
       moved=st.floats(1e-4, 0.5), pair=st.tuples(st.integers(0, 5), st.integers(0, 5)))
def test_moving_budget_between_two_measurements_never_helps(weights, zcdp, moved, pair) -> None:
    giver, taker = (i % len(weights) for i in pair)
    shares = split(Fraction(1), weights, zcdp)
    changed = list(shares)
    changed[giver] -= moved * shares[giver]
    changed[taker] += moved * shares[giver]
    assert error(weights, shares, zcdp) <= error(weights, changed, zcdp) * (1 + 1e-12)


def test_zcdp_and_pure_dp_split_by_different_powers_of_the_weights() -> None:
    pure = split(Fraction(3), [1.0, 8.0], zcdp=False)
    zcdp = split(Fraction(3), [1.0, 8.0], zcdp=True)
    assert pure[1] / pure[0] == pytest.approx(2.0, rel=1e-12)  # 8 ** (1/3)
    assert zcdp[1] / zcdp[0] == pytest.approx(8**0.5, rel=1e-12)
    assert pure == pytest.approx([1.0, 2.0], rel=1e-11)
    assert objective([1.0, 8.0], zcdp=False) == pytest.approx(27.0)  # (1 + 2) ** 3
    assert objective([1.0, 8.0], zcdp=True) == pytest.approx((1 + 8**0.5) ** 2)


def test_edge_cases() -> None:
    assert split(Fraction(1), [], zcdp=False) == []
    assert split(Fraction(1), [0.0, 0.0], zcdp=True) == pytest.approx([0.5, 0.5], rel=1e-11)  # nothing to weigh
    assert split(Fraction(1), [0.0, 4.0], zcdp=False) == pytest.approx([0.0, 1.0], rel=1e-11)
    with pytest.raises(ValueError, match="must not be negative"):
        split(Fraction(1), [1.0, -1.0], zcdp=False)
