"""Mironov's low-bits distinguisher breaks textbook float Laplace and is reduced to a coin flip by dpsql."""

from __future__ import annotations

from pathlib import Path

from benchmarks.attacks.floating_point import attack
from benchmarks.attacks.stats import success_bound

EPSILON = 0.1


def test_low_bits_tell_zero_from_one_in_float_laplace_but_not_in_dpsql(tmp_path: Path) -> None:
    report = attack(tmp_path, EPSILON, per_value=1000, seed=2012)

    textbook = report.textbook
    assert textbook.in_own_support == textbook.outputs  # the support model admits every real output
    assert textbook.success.lower() > success_bound(EPSILON), str(textbook.success)

    ours = report.dpsql
    assert ours.in_own_support == ours.outputs
    assert ours.distinguishable == 0  # every output is possible for 0 and for 1: the same support
    low, high = ours.success.interval()
    assert low <= 0.5 <= high, str(ours.success)
