"""A closed interval of reals: the declared or derived bounds of a value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float

    @property
    def mid(self) -> float:
        return (self.lo + self.hi) / 2

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    def hull(self, other: Interval) -> Interval:
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def contains_zero(self) -> bool:
        return self.lo <= 0 <= self.hi
