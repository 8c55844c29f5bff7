"""Fixed point (dpsql/dp/fixedpoint.py): the grid a bounded value is held on, so that sums are exact integers.

For any interval: the center and the step are exact doubles (the SQL writes them as literals), every value of
the interval maps to an integer within [-bound, bound] that fits a 32-bit INTEGER, and mapping back is off by
less than one grid step. The SQL `centered` builds is run in DuckDB for the same checks.
"""

from __future__ import annotations

import math
from fractions import Fraction

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpsql.dp.fixedpoint import FixedPoint, fixed_point
from dpsql.dp.interval import Interval
from dpsql.sql.parse import DIALECT

FINITE = st.floats(-1e15, 1e15, allow_nan=False, allow_infinity=False)


@st.composite
def intervals(draw) -> Interval:
    lo, hi = sorted((draw(FINITE), draw(FINITE)))
    return Interval(lo, hi)


@st.composite
def interval_and_value(draw) -> tuple[Interval, float]:
    interval = draw(intervals())
    fraction = draw(st.floats(0.0, 1.0))
    value = draw(st.sampled_from([interval.lo, interval.hi, interval.mid,
                                  interval.lo + fraction * (interval.hi - interval.lo)]))
    return interval, min(max(value, interval.lo), interval.hi)


def exact_integer(point: FixedPoint, value: float) -> int:
    """The grid integer of `value` in exact arithmetic: round((value - center) / step)."""
    return round(Fraction(value) / point.step - point.center)


SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)


@SETTINGS
@given(intervals())
def test_center_and_step_are_exact_doubles(interval: Interval) -> None:
    point = fixed_point(interval)
    assert all(n & (n - 1) == 0 for n in (point.step.numerator, point.step.denominator))  # a power of two
    assert Fraction(float(point.step)) == point.step
    assert Fraction(point.center_value) == point.center * point.step  # the literal in the SQL is the center
    assert abs(point.center * point.step - Fraction(interval.mid)) <= point.step / 2


@SETTINGS
@given(intervals())
def test_the_bound_covers_the_interval_and_fits_a_32_bit_integer(interval: Interval) -> None:
    point = fixed_point(interval)
    for end in (interval.lo, interval.hi):
        assert abs(exact_integer(point, end)) <= point.bound - 1  # one step to spare for the engine's rounding
    assert point.bound < 2**31
    if interval.half_width > abs(interval.mid) * 2.0**-29 and interval.half_width > 2.0**-60:
        assert point.bound > 2**28  # the grid is fine: the interval spans about 2**30 steps


@SETTINGS
@given(interval_and_value())
def test_a_value_round_trips_within_one_grid_step(case: tuple[Interval, float]) -> None:
    interval, value = case
    point = fixed_point(interval)
    scaled = (value - point.center_value) * 2.0**point.exponent  # what the SQL computes, in doubles
    integer = max(-point.bound, min(point.bound, round(scaled)))
    back = point.center * point.step + integer * point.step
    assert abs(back - Fraction(value)) <= point.step


@pytest.fixture(scope="module")
def duckdb_connection():
    con = duckdb.connect()
    yield con
    con.close()


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(case=interval_and_value(), outside=st.sampled_from([None, -1e300, 1e300, 0.0]))
def test_the_centered_sql_stays_in_bounds_and_round_trips(duckdb_connection, case, outside) -> None:
    """In the engine: the value (or one outside the interval, clamped first) becomes an integer in
    [-bound, bound] that maps back to within one step of the clamped value; NULL stays NULL."""
    interval, value = case
    point = fixed_point(interval)
    given_value = value if outside is None else outside
    literal = exp.cast(exp.Literal.number(repr(given_value)), "DOUBLE")
    integer, null = duckdb_connection.execute(
        f"SELECT {point.centered(literal).sql(DIALECT)}, "
        f"{point.centered(exp.cast(exp.Null(), 'DOUBLE')).sql(DIALECT)}").fetchone()
    assert null is None
    assert -point.bound <= integer <= point.bound
    clamped = min(max(given_value, interval.lo), interval.hi)
    assert abs(point.center * point.step + integer * point.step - Fraction(clamped)) <= point.step


def test_a_point_interval_and_a_tiny_one_still_get_a_grid() -> None:
    for interval in (Interval(3.0, 3.0), Interval(0.0, 0.0), Interval(1.0, 1.0 + 2**-50)):
        point = fixed_point(interval)
        assert Fraction(point.center_value) == point.center * point.step and point.bound >= 1
        assert abs(exact_integer(point, interval.hi)) < point.bound


def test_the_grid_for_a_unit_interval() -> None:
    """[0, 1]: half-width 1/2, so the step is 2**-30, the center 1/2, the interval 2**30 steps wide."""
    point = fixed_point(Interval(0.0, 1.0))
    assert point.exponent == 30 and point.center == 2**29 and point.center_value == 0.5
    assert point.bound == 2**29 + 1
    assert math.isclose(float(point.step), 2**-30)
