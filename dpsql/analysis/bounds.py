"""Interval arithmetic over sqlglot expressions: the bounds of an aggregated value, derived from the policy.

`SUM(price * qty)` is answerable when price and qty are declared bounded, because the product then has bounds
too. This module computes them, or says which column is missing bounds. The intervals are computed with Python
floats and may be off by rounding; the rewrite therefore clamps every aggregated expression to its interval in
the SQL that runs, so the sensitivity holds whatever the engine computes.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable

from sqlglot import exp

from dpsql.dp.interval import Interval
from dpsql.policy import ColumnPolicy


class Unbounded(Exception):
    """The expression has no bounds derivable from the policy; the message says what is missing."""


_BOOLEAN = Interval(0.0, 1.0)


def _text(node: exp.Expression) -> str:
    return node.copy().transform(lambda n: exp.column(n.name) if isinstance(n, exp.Column) else n).sql("duckdb")
MAX_MAGNITUDE = 1e15


def interval_of(node: exp.Expression, columns: dict[str, ColumnPolicy]) -> Interval:
    """The interval every non-NULL value of `node` lies in, for any row the policy admits."""
    result = _interval(node, columns)
    if not (math.isfinite(result.lo) and math.isfinite(result.hi)) or \
            max(abs(result.lo), abs(result.hi)) > MAX_MAGNITUDE:
        raise Unbounded(f"the value of {_text(node)} may reach {result.lo:g}..{result.hi:g}, beyond "
                        f"what can be summed exactly (1e15)")
    return result


def _interval(node: exp.Expression, columns: dict[str, ColumnPolicy]) -> Interval:
    rule = _RULES.get(type(node))
    if rule is not None:
        return rule(node, columns)
    if isinstance(node, exp.Predicate | exp.Connector | exp.Not):
        return _BOOLEAN  # comparisons and logic are 0/1 when summed
    raise Unbounded(f"cannot bound {_text(node)}: {type(node).__name__.lower()} has no interval rule")


def _column(node: exp.Column, columns: dict[str, ColumnPolicy]) -> Interval:
    policy = columns[node.name]
    if policy.type.value == "bool":
        return _BOOLEAN
    if not policy.bounded:
        raise Unbounded(f"column '{node.name}' needs bounds: declare lower and upper for it in the policy")
    return Interval(policy.lower, policy.upper)


def _literal(node: exp.Literal, _: dict) -> Interval:
    if node.is_string:
        raise Unbounded(f"cannot sum the text literal {_text(node)}")
    value = float(node.this)
    return Interval(value, value)


def _products(a: Interval, b: Interval, op: Callable[[float, float], float]) -> Interval:
    values = [op(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return Interval(min(values), max(values))


def _binary(op: Callable[[Interval, Interval, exp.Expression], Interval]):
    def rule(node: exp.Expression, columns: dict) -> Interval:
        return op(_interval(node.left, columns), _interval(node.right, columns), node)
    return rule


def _divide(a: Interval, b: Interval, node: exp.Expression) -> Interval:
    if b.contains_zero():
        raise Unbounded(f"cannot bound {_text(node)}: the divisor {_text(node.right)} may be 0 "
                        f"(its bounds are {b.lo:g}..{b.hi:g})")
    return _products(a, b, lambda x, y: x / y)


def _int_divide(a: Interval, b: Interval, node: exp.Expression) -> Interval:
    quotient = _divide(a, b, node)
    return Interval(math.floor(quotient.lo), math.floor(quotient.hi) + 1)


def _modulo(a: Interval, b: Interval, node: exp.Expression) -> Interval:
    limit = max(abs(b.lo), abs(b.hi))
    if b.contains_zero():
        raise Unbounded(f"cannot bound {_text(node)}: the divisor may be 0")
    lo = 0.0 if a.lo >= 0 else -min(limit, abs(a.lo))
    hi = 0.0 if a.hi <= 0 else min(limit, a.hi)
    return Interval(lo, hi)


def _power(node: exp.Pow, columns: dict) -> Interval:
    base = _interval(node.this, columns)
    exponent = node.expression
    if not (isinstance(exponent, exp.Literal) and not exponent.is_string and float(exponent.this).is_integer()
            and 0 <= float(exponent.this) <= 8):
        raise Unbounded(f"cannot bound {_text(node)}: only whole exponents from 0 to 8 are supported")
    n = int(float(exponent.this))
    ends = [base.lo**n, base.hi**n]
    lo = 0.0 if n % 2 == 0 and base.contains_zero() else min(ends)
    return Interval(lo, max(ends))


def _monotone(fn: Callable[[float], float], domain_lo: float = -math.inf, strict: bool = False):
    """A rule for a non-decreasing one-argument function defined on [domain_lo, inf) (or (domain_lo, inf))."""
    def rule(node: exp.Expression, columns: dict) -> Interval:
        inner = _interval(node.this, columns)
        if inner.lo < domain_lo or (strict and inner.lo == domain_lo):
            raise Unbounded(f"cannot bound {_text(node)}: its argument may be "
                            f"{'<=' if strict else '<'} {domain_lo:g} (bounds {inner.lo:g}..{inner.hi:g})")
        try:
            return Interval(fn(inner.lo), fn(inner.hi))
        except OverflowError:
            raise Unbounded(f"cannot bound {_text(node)}: it overflows") from None
    return rule


def _round(node: exp.Expression, columns: dict) -> Interval:
    """ROUND, FLOOR and CEIL are non-decreasing; rounding to `d` decimals stays on the grid of 10**-d around."""
    inner = _interval(node.this, columns)
    decimals = node.args.get("decimals")
    if decimals is None:
        step = 1.0
    elif isinstance(decimals, exp.Literal) and not decimals.is_string and float(decimals.this).is_integer():
        step = 10.0 ** -int(float(decimals.this))
    elif isinstance(decimals, exp.Neg) and isinstance(decimals.this, exp.Literal):
        step = 10.0 ** int(float(decimals.this.this))
    else:
        raise Unbounded(f"cannot bound {_text(node)}: the number of decimals must be a whole literal")
    return Interval(math.floor(inner.lo / step) * step, math.ceil(inner.hi / step) * step)


def _hull(parts: list[exp.Expression], columns: dict) -> Interval:
    intervals = [_interval(p, columns) for p in parts if not isinstance(p, exp.Null)]
    if not intervals:
        raise Unbounded("an expression that is always NULL has nothing to sum")
    result = intervals[0]
    for other in intervals[1:]:
        result = result.hull(other)
    return result


def _case(node: exp.Case, columns: dict) -> Interval:
    branches = [branch.args["true"] for branch in node.args["ifs"]]
    if node.args.get("default") is not None:
        branches.append(node.args["default"])
    return _hull(branches, columns)


def _if(node: exp.If, columns: dict) -> Interval:
    return _hull([node.args["true"], *([node.args["false"]] if node.args.get("false") else [])], columns)


def _neg(node: exp.Neg, columns: dict) -> Interval:
    inner = _interval(node.this, columns)
    return Interval(-inner.hi, -inner.lo)


def _abs(node: exp.Abs, columns: dict) -> Interval:
    inner = _interval(node.this, columns)
    if inner.contains_zero():
        return Interval(0.0, max(-inner.lo, inner.hi))
    return Interval(min(abs(inner.lo), abs(inner.hi)), max(abs(inner.lo), abs(inner.hi)))


def _sign(node: exp.Sign, columns: dict) -> Interval:
    inner = _interval(node.this, columns)
    return Interval(float(math.copysign(1, inner.lo)) if inner.lo else 0.0,
                    float(math.copysign(1, inner.hi)) if inner.hi else 0.0)


def _cast(node: exp.Cast, columns: dict) -> Interval:
    if not node.to.is_type(*exp.DataType.NUMERIC_TYPES, exp.DataType.Type.BOOLEAN):
        raise Unbounded(f"cannot bound {_text(node)}: only casts to numbers can be summed")
    inner = _interval(node.this, columns)
    if node.to.is_type(*exp.DataType.INTEGER_TYPES):
        return Interval(math.floor(inner.lo), math.ceil(inner.hi))
    return inner


def _any_argument(node: exp.Expression, columns: dict) -> Interval:
    """COALESCE, LEAST and GREATEST return one of their arguments (the latter two skip NULLs, so not
    necessarily the smallest or largest): only the hull of all the arguments is safe."""
    return _hull([node.this, *node.expressions], columns)


# Date parts: the calendar's fixed ranges, and for the year and the parts that follow from it the years of the
# argument's declared range (a date column's `lower`/`upper`), else those DuckDB's date functions are guarded to
# (typecheck.DATE_GUARD: 1 to 9999). Every aggregated value is clamped to its interval in the SQL that runs
# (dp/fixedpoint.py), so a date outside them counts as the nearest end: the sensitivity holds whatever the data.
_GUARDED_YEARS = (1, 9999)
_PART_RANGES = {
    "month": (1, 12), "day": (1, 31), "quarter": (1, 4), "dow": (0, 6), "dayofweek": (0, 6), "weekday": (0, 6),
    "isodow": (1, 7), "doy": (1, 366), "dayofyear": (1, 366), "week": (1, 53), "weekofyear": (1, 53),
    "hour": (0, 23), "minute": (0, 59), "second": (0, 59), "millisecond": (0, 59_999), "milliseconds": (0, 59_999),
    "microsecond": (0, 59_999_999), "microseconds": (0, 59_999_999), "era": (0, 1),
}
_YEAR_PARTS: dict[str, Callable[[int], float]] = {
    "year": float, "isoyear": float, "decade": lambda y: float(y // 10), "century": lambda y: float(-(-y // 100)),
    "millennium": lambda y: float(-(-y // 1000)),
}
_FUNCTION_PARTS = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day",
                   exp.DayOfWeek: "dayofweek", exp.DayOfWeekIso: "isodow", exp.DayOfYear: "dayofyear",
                   exp.Quarter: "quarter", exp.Week: "week", exp.WeekOfYear: "week", exp.Hour: "hour",
                   exp.Minute: "minute", exp.Second: "second"}


def _date_part(node: exp.Expression, columns: dict) -> Interval:
    if isinstance(node, exp.Extract):
        part = (node.this.name if isinstance(node.this, exp.Var | exp.Column | exp.Identifier) else
                str(node.this.this) if isinstance(node.this, exp.Literal) else "").lower()
        argument = node.expression
    else:
        part, argument = _FUNCTION_PARTS[type(node)], node.this
    if part in _PART_RANGES:
        lo, hi = _PART_RANGES[part]
        return Interval(float(lo), float(hi))
    first, last = _years(argument, columns)
    if part in _YEAR_PARTS:
        if part == "isoyear":  # the ISO year of early January or late December is the year before or after
            first, last = first - 1, last + 1
        return Interval(_YEAR_PARTS[part](first), _YEAR_PARTS[part](last))
    if part == "yearweek":  # the ISO year times 100 plus the ISO week
        return Interval(float((first - 1) * 100 + 1), float((last + 1) * 100 + 53))
    if part == "epoch":  # seconds since 1970-01-01 from the first day of the first year to the end of the last
        start = datetime.datetime(first, 1, 1)
        end = datetime.datetime(last, 12, 31, 23, 59, 59, 999999)
        epoch = datetime.datetime(1970, 1, 1)
        return Interval((start - epoch).total_seconds(), (end - epoch).total_seconds())
    raise Unbounded(f"cannot bound {_text(node)}: the date part '{part}' has no interval rule")


def _years(argument: exp.Expression, columns: dict) -> tuple[int, int]:
    """The years a date argument can have: a bare column's declared range, else the guarded years."""
    bare = argument.unnest()
    if isinstance(bare, exp.Column) and bare.name in columns and columns[bare.name].earliest is not None:
        return columns[bare.name].earliest.year, columns[bare.name].latest.year
    return _GUARDED_YEARS


_RULES: dict[type, Callable[[exp.Expression, dict], Interval]] = {
    exp.Extract: _date_part,
    **{function: _date_part for function in _FUNCTION_PARTS},
    exp.Column: _column,
    exp.Literal: _literal,
    exp.Boolean: lambda node, _: Interval(float(node.this), float(node.this)),
    exp.Paren: lambda node, columns: _interval(node.this, columns),
    exp.Add: _binary(lambda a, b, _: Interval(a.lo + b.lo, a.hi + b.hi)),
    exp.Sub: _binary(lambda a, b, _: Interval(a.lo - b.hi, a.hi - b.lo)),
    exp.Mul: _binary(lambda a, b, _: _products(a, b, lambda x, y: x * y)),
    exp.Div: _binary(_divide),
    exp.IntDiv: _binary(_int_divide),
    exp.Mod: _binary(_modulo),
    exp.Neg: _neg,
    exp.Abs: _abs,
    exp.Sign: _sign,
    exp.Pow: _power,
    exp.Sqrt: _monotone(math.sqrt, 0.0),
    exp.Ln: _monotone(math.log, 0.0, strict=True),
    exp.Exp: _monotone(math.exp),
    exp.Round: _round,
    exp.Floor: _round,
    exp.Ceil: _round,
    exp.Case: _case,
    exp.If: _if,
    exp.Coalesce: _any_argument,
    exp.Nullif: lambda node, columns: _interval(node.this, columns),
    exp.Least: _any_argument,
    exp.Greatest: _any_argument,
    exp.Cast: _cast,
    exp.TryCast: _cast,
}
