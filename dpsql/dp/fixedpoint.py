"""Fixed point: how a bounded real value is held as an integer so that sums are exact.

Float sums depend on the order of addition, and a sum whose rounding moves with the data can exceed its
sensitivity (Casacuberta et al., CCS 2022). dpsql never sums floats. Each row's value v, already clamped to
[lo, hi], becomes the integer round((v - center) * 2**exponent), clamped again to [-bound, bound]; DuckDB sums
these as BIGINT into HUGEINT (128-bit), which is exact and order-independent. The noise is then added to that
integer on the same grid, so the whole path from rows to released value is exact integer arithmetic.

The grid step 2**-exponent is chosen so that `bound` is about 2**29 (so one row's integer fits a 32-bit INTEGER
column): the rounding error of one row is at most 2**-30 of its range, far below the noise.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from dpsql.dp.interval import Interval

_PRECISION_BITS = 29


@dataclass(frozen=True)
class FixedPoint:
    exponent: int  # the grid step is 2**-exponent
    center: int  # the center of the interval, in grid steps
    bound: int  # every row's centered integer lies in [-bound, bound]
    interval: Interval

    # Read at every release (the measurement's step, AVG's center): a frozen dataclass computes them once.
    @functools.cached_property
    def step(self) -> Fraction:
        return Fraction(2) ** -self.exponent

    @functools.cached_property
    def center_value(self) -> float:
        return float(self.center * self.step)

    @functools.cached_property
    def ends(self) -> tuple[float, float]:
        """The grid's ends, center -/+ bound steps: every row's integer lies between them (a pair's lo and hi)."""
        return float((self.center - self.bound) * self.step), float((self.center + self.bound) * self.step)

    @functools.cached_property
    def width(self) -> float:
        """hi - lo of the grid, exactly 2 * bound steps (a power-of-two step: exact in a float below 2**53 steps)."""
        return float(2 * self.bound * self.step)

    def centered(self, value: exp.Expression) -> exp.Expression:
        """SQL turning a value into its clamped, centered integer. NULL stays NULL (LEAST/GREATEST would not)."""
        clamped = clamp(value, self.interval)
        center = double(float(self.center * self.step))
        scale = double(2.0**self.exponent)  # a power of two: exact in a DOUBLE, so scaling adds no rounding
        scaled = exp.cast(exp.Mul(this=exp.paren(exp.Sub(this=clamped, expression=center)), expression=scale),
                          "BIGINT")
        return null_preserving(value, _between(scaled, _integer(-self.bound), _integer(self.bound)))


def clamp(value: exp.Expression, interval: Interval) -> exp.Expression:
    """GREATEST(LEAST(value, hi), lo) computed in DOUBLE (a plain 0.5 would make DuckDB use DECIMAL)."""
    return _between(exp.cast(value.copy(), "DOUBLE"), double(interval.lo), double(interval.hi))


def _between(value: exp.Expression, lo: exp.Expression, hi: exp.Expression) -> exp.Expression:
    # ignore_nulls=True is DuckDB's own LEAST/GREATEST; without it sqlglot emulates NULL-propagating ones.
    return exp.Greatest(this=exp.Least(this=value, expressions=[hi], ignore_nulls=True), expressions=[lo],
                        ignore_nulls=True)


def null_preserving(value: exp.Expression, result: exp.Expression) -> exp.Expression:
    """CASE WHEN value IS NULL THEN NULL ELSE result END: DuckDB's LEAST and GREATEST skip NULLs."""
    return exp.Case().when(exp.Is(this=exp.paren(value.copy()), expression=exp.Null()), exp.Null()).else_(result)


def double(value: float) -> exp.Expression:
    """A DOUBLE literal: the exponent makes DuckDB read it as DOUBLE; repr round-trips the float exactly."""
    text = repr(abs(float(value)))
    literal = exp.Literal.number(text if "e" in text else f"{text}e0")
    return exp.Neg(this=literal) if value < 0 else literal


def _integer(value: int) -> exp.Expression:
    literal = exp.Literal.number(str(abs(value)))
    return exp.Neg(this=literal) if value < 0 else literal


@functools.lru_cache(maxsize=1024)
def fixed_point(interval: Interval) -> FixedPoint:
    magnitude = max(interval.half_width, abs(interval.mid) * 2.0**-_PRECISION_BITS, 2.0**-60)
    exponent = _PRECISION_BITS - math.floor(math.log2(magnitude))
    scale = Fraction(2) ** exponent
    center = round(Fraction(interval.mid) * scale)
    bound = math.ceil(max(Fraction(interval.hi) * scale - center, center - Fraction(interval.lo) * scale))
    # The float computation in SQL may round by a grid step either way; one extra step covers it, and the
    # integer clamp to [-bound, bound] makes the bound hold whatever the engine computes.
    return FixedPoint(exponent, center, bound + 1, interval)
