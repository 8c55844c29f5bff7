"""Exact samplers for integer noise: discrete Laplace and discrete Gaussian.

Every sample is drawn with integer arithmetic only, following Canonne, Kamath and Steinke, "The Discrete
Gaussian for Differential Privacy" (NeurIPS 2020), algorithms 1-3. No floating-point number is ever part of the
noise, so the output set has none of the gaps that Mironov (CCS 2012) exploited in textbook float Laplace.
Scales are exact rationals (`fractions.Fraction`); callers pass the noise scale in units of the value's grid.

Randomness comes from a `RandomSource`. Production code uses `SecureRandom` (the operating system's CSPRNG,
os.urandom, read in blocks); `InsecureSeededRandomForTests` exists only so tests and benchmarks can repeat a run.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import weakref
from fractions import Fraction
from math import isqrt
from typing import ClassVar, Protocol

import numpy as np

_WORD = struct.Struct(">Q")


class RandomSource(Protocol):
    def randbelow(self, n: int) -> int:
        """A uniform integer in [0, n)."""
        ...

    @property
    def secure(self) -> bool: ...

    # Sources may also have words(n) -> numpy uint64 array, n uniform 64-bit words: the quantile sampler then
    # draws its noises all at once (noise_vector.py), else one at a time.


class SecureRandom:
    """Uniform integers from the operating system's cryptographically secure generator (os.urandom, what `secrets`
    reads), fetched in blocks of _BLOCK bytes: one system call per block rather than per draw (the quantile sampler
    draws some twenty thousand integers for one quantile cell). Each draw takes the next bits of the block and is
    rejected and redrawn when not below n, so it is uniform; no bit is used twice.

    A forked child process starts with an empty block and a new lock (os.register_at_fork): it would otherwise
    draw the rest of its parent's block, the very noise the parent draws next, so that two answers from parent
    and child would differ by their true difference exactly; and a lock held by another thread at the fork would
    stay locked forever in the child."""

    secure = True
    _BLOCK = 1 << 14
    _instances: ClassVar[weakref.WeakSet[SecureRandom]] = weakref.WeakSet()

    def __init__(self) -> None:
        self._reset()
        SecureRandom._instances.add(self)

    def _reset(self) -> None:
        self._block = b""
        self._used = 0
        self._lock = threading.Lock()

    @classmethod
    def _after_fork_in_child(cls) -> None:
        for source in list(cls._instances):
            source._reset()

    def randbelow(self, n: int) -> int:
        if n <= 0:
            raise ValueError("randbelow needs n > 0")
        bits = n.bit_length()
        size = (bits + 7) >> 3
        shift = 8 * size - bits
        with self._lock:
            block, used = self._block, self._used
            while True:
                end = used + size
                if size <= 8 and used + 8 <= len(block):
                    # The same bits as below (the top `bits` of the next `size` bytes), read as one 64-bit word
                    # without slicing: most draws are of at most 8 bytes. The bytes past `end` are not used here.
                    value = _WORD.unpack_from(block, used)[0] >> (64 - bits)
                else:
                    if end > len(block):
                        block, used = os.urandom(max(self._BLOCK, size)), 0
                        self._block, end = block, size
                    value = int.from_bytes(block[used:end], "big") >> shift
                used = end
                if value < n:
                    self._used = used
                    return value

    def words(self, n: int) -> np.ndarray:
        """n uniform 64-bit words (numpy uint64) straight from os.urandom: no block, no lock, nothing kept."""
        return np.frombuffer(os.urandom(8 * n), dtype=">u8").astype(np.uint64)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SecureRandom._after_fork_in_child)


class InsecureSeededRandomForTests:
    """A repeatable, predictable generator. For tests and benchmarks only: it protects no one."""

    secure = False

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._random.randrange(n)

    def words(self, n: int) -> np.ndarray:
        return np.array([self._random.getrandbits(64) for _ in range(n)], dtype=np.uint64)


def _bernoulli(num: int, den: int, rng: RandomSource) -> bool:
    """True with probability num/den (0 <= num <= den)."""
    return rng.randbelow(den) < num


def _bernoulli_exp_le1(num: int, den: int, rng: RandomSource) -> bool:
    """True with probability exp(-num/den), for 0 <= num/den <= 1 (CKS algorithm 1, first part)."""
    k = 1
    while _bernoulli(num, den * k, rng):
        k += 1
    return k % 2 == 1


def bernoulli_exp(gamma: Fraction, rng: RandomSource) -> bool:
    """True with probability exp(-gamma), for any rational gamma >= 0 (CKS algorithm 1)."""
    num, den = gamma.numerator, gamma.denominator
    if num < 0:
        raise ValueError("exp(-gamma) needs gamma >= 0")
    while num > den:
        if not _bernoulli_exp_le1(1, 1, rng):
            return False
        num -= den
    return _bernoulli_exp_le1(num, den, rng)


def geometric_exp(num: int, den: int, rng: RandomSource) -> int:
    """An integer Y >= 0 with P(Y = k) proportional to exp(-k num / den), for integers num, den > 0 (CKS algorithm
    2's magnitude: X = U + den V has P(X = x) proportional to exp(-x / den), and Y = X // num). The draws it makes
    depend on its own outcome only, never on anything else.

    Algorithm 1's Bernoulli(exp(-gamma)) is written out here (no Fraction, no call per coin): the quantile
    sampler draws one of these per candidate, thousands per released cell."""
    if num <= 0 or den <= 0:
        raise ValueError("a geometric needs num > 0 and den > 0")
    draw = rng.randbelow
    while True:
        u = draw(den)
        k = 1  # Bernoulli(exp(-u / den)): count the successes of Bernoulli(u / (den k)), k = 1, 2, ...
        while draw(den * k) < u:
            k += 1
        if k % 2 == 0:
            continue  # rejected: U is accepted with probability exp(-U / den)
        v = 0
        while True:  # V: the successes of Bernoulli(exp(-1)) before its first failure
            k = 2  # its first step, Bernoulli(1 / 1), always succeeds
            while draw(k) == 0:
                k += 1
            if k % 2 == 0:
                return (u + den * v) // num
            v += 1


def discrete_laplace(scale: Fraction, rng: RandomSource) -> int:
    """An integer Z with P(Z = z) proportional to exp(-|z| / scale) (CKS algorithm 2)."""
    t, s = scale.numerator, scale.denominator  # scale = t / s, s > 0
    if t <= 0:  # scale <= 0, without a Fraction comparison per sample
        raise ValueError("the scale of discrete Laplace noise must be positive")
    while True:
        y = geometric_exp(s, t, rng)
        negative = rng.randbelow(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def uniform_permutation(n: int, rng: RandomSource) -> list[int]:
    """A uniformly random ordering of range(n) (Fisher-Yates), drawn from `rng` whatever order came in."""
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def discrete_gaussian(sigma2: Fraction, rng: RandomSource) -> int:
    """An integer Z with P(Z = z) proportional to exp(-z^2 / (2 sigma2)) (CKS algorithm 3)."""
    if sigma2 <= 0:
        raise ValueError("the variance of discrete Gaussian noise must be positive")
    t = isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = discrete_laplace(Fraction(t), rng)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp(gamma, rng):
            return y
