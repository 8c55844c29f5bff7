"""Many exact geometric noises at once: noise.geometric_exp's algorithm run on numpy arrays.

The quantile sampler draws one geometric noise per candidate, 4,097 per released cell; one at a time in Python
that took about 22 ms, and a GROUP BY pays it per group. Here every step of CKS algorithm 2 (U uniform below den,
accepted with probability exp(-U / den) by counting Bernoulli(U / (den k)) successes; V the successes of
Bernoulli(exp(-1)) before the first failure; Y = (U + den V) // num) runs on all the noises still at that step,
with integer arithmetic only, so each noise has exactly geometric_exp's law (the draws are fresh uniform integers;
only their order differs). About 4x faster at 4,097 noises.

The uniform integers come from the source's 64-bit words (`words(n)`: SecureRandom reads os.urandom), by
rejection: the top b bits of a word, b at least the bit length of bound - 1, kept when below the bound. What is
drawn, and so the time taken, depends on the noises' own outcomes only, never on the data (as for the scalar
sampler; tests/attacks/test_quantile_timing.py counts the draws).

Integers must stay below 2**63: den * k for the k of the acceptance loop (k > 20 has probability below 1/20!), so
den is at most 2**40; larger denominators are rounded down by the caller (a smaller rate is more noise) or go to
the scalar sampler.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MAX_DENOMINATOR = 1 << 40

Words = Callable[[int], np.ndarray]  # n uniform 64-bit words (numpy uint64)


def uniform_below(bounds: np.ndarray, words: Words) -> np.ndarray:
    """For each bound (1 <= bound < 2**62), a uniform integer in [0, bound)."""
    out = np.zeros(bounds.size, dtype=np.int64)
    # frexp's exponent is the bit length of bound - 1, or one more when the float rounds up: never less, so every
    # value below the bound can be drawn, and rejection keeps the draw uniform. A bound of 1 needs no draw.
    _, bits = np.frexp((bounds - 1).astype(np.float64))
    todo = np.flatnonzero(bits > 0)
    while todo.size:
        drawn = (words(todo.size) >> (64 - bits[todo]).astype(np.uint64)).astype(np.int64)
        kept = drawn < bounds[todo]
        out[todo[kept]] = drawn[kept]
        todo = todo[~kept]
    return out


def geometric_exp_many(num: int, den: int, count: int, words: Words) -> np.ndarray:
    """`count` independent integers Y >= 0 with P(Y = k) proportional to exp(-k num / den) (0 < num, 0 < den <=
    MAX_DENOMINATOR)."""
    if num <= 0 or not 0 < den <= MAX_DENOMINATOR:
        raise ValueError("a geometric needs num > 0 and 0 < den <= 2**40")
    result = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        u = uniform_below(np.full(pending.size, den, dtype=np.int64), words)
        # Bernoulli(exp(-u / den)) for each: k counts the successes of Bernoulli(u / (den k)), accepted when odd.
        k = np.ones(pending.size, dtype=np.int64)
        going = np.arange(pending.size)
        while going.size:
            going = going[uniform_below(den * k[going], words) < u[going]]
            k[going] += 1
        accepted = k % 2 == 1
        chosen = np.flatnonzero(accepted)
        result[pending[chosen]] = (u[chosen] + den * _exp_minus_one_successes(chosen.size, words)) // num
        pending = pending[~accepted]
    return result


def _exp_minus_one_successes(count: int, words: Words) -> np.ndarray:
    """For each of `count`: the successes of Bernoulli(exp(-1)) before its first failure. One Bernoulli(exp(-1))
    counts k = 2, 3, ... while Bernoulli(1 / k) succeeds (its first step, Bernoulli(1 / 1), always does) and is a
    success when it stops at an odd k."""
    v = np.zeros(count, dtype=np.int64)
    going = np.arange(count)
    while going.size:
        k = np.full(going.size, 2, dtype=np.int64)
        live = np.arange(going.size)
        while live.size:
            live = live[uniform_below(k[live], words) == 0]
            k[live] += 1
        going = going[k % 2 == 1]
        v[going] += 1
    return v
