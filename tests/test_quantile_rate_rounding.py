"""Red team 9: the vectorised sampler's rate rounding (dp/quantile.noisy_max_scaled). A rate whose denominator is
past 2**40 was rounded down onto k / 2**40 whatever k: at rate 1.99 * 2**-40 (QUANTILE_CONT(x, 0.000000000001),
scale 10**12, epsilon 3.62) that is 2**-40, about half the rate, so the value had about half the accuracy its
epsilon pays for while explain said the whole. Rounding down stays epsilon-DP; it must not lose more than 2**-10."""

from __future__ import annotations

from fractions import Fraction

import dpsql.dp.quantile as quantile
from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.dp.noise_vector import MAX_DENOMINATOR


def test_a_rounded_rate_keeps_almost_all_of_its_epsilon(monkeypatch) -> None:
    used: list[Fraction] = []
    original = quantile.geometric_exp_many

    def spy(num, den, count, words):
        used.append(Fraction(num, den))
        return original(num, den, count, words)

    monkeypatch.setattr(quantile, "geometric_exp_many", spy)
    scale, sensitivity = 10**12, Fraction(10**12 - 1, 10**12)  # q = 1e-12, m = 1
    exact = Fraction(199, 100) / MAX_DENOMINATOR
    epsilon = exact * 2 * sensitivity * scale + Fraction(1, 3**40)  # a denominator past 2**40
    rate = epsilon / (2 * sensitivity * scale)
    assert rate.denominator > MAX_DENOMINATOR and 1.98 < rate * MAX_DENOMINATOR < 2
    quantile.noisy_max_scaled([0] * 9, scale, epsilon, sensitivity, InsecureSeededRandomForTests(1))
    assert all(r >= rate * (1 - Fraction(1, 2**10)) for r in used) and all(r <= rate for r in used)
