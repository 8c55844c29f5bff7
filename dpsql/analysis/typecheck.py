"""Static types, totality and per-row cost of row expressions (WHERE, GROUP BY keys, aggregate arguments).

The checker does not trust DuckDB's TRY to absorb a per-row error: TRY misses some kinds of error (a LIKE
pattern that fails only when matching reaches its end, a date part that is "not implemented" for a type) and
DuckDB inserts implicit casts the analyst never wrote (text used as a number). Instead every row expression is
typed here from the policy's column types, and each operator or function is allowed only through a signature for
which it is *total*: defined, without error, for every value of its argument types (NULL, NaN, +/-inf, empty and
long text, the extreme integers, the infinite and extreme dates). Where DuckDB's function is not total but a
rewrite makes it so, the rewrite is part of the typing: integer arithmetic is widened to a type that cannot
overflow, a cast that can fail becomes TRY_CAST, a date function that fails outside the years 1-9999 is guarded by
a CASE (and its argument clamped, so that it is total even if an optimizer hoists it out of the CASE), a count
beyond a text's length is clamped, and a text literal compared with a typed value becomes an explicit cast
evaluated from the text. Every node of a total form is total on its own, whatever order DuckDB evaluates them in.
Everything else is refused, from the SQL and the policy alone, naming the function and the types.

`total_expression` returns that rewrite; the bounded SQL runs it (still inside TRY, as a second layer only).
tests/test_typecheck.py evaluates every signature over a grid of adversarial values of its argument types, and
random admitted expressions over the same grid.

The same walk bounds the work one row can cause (`Typed.cost`): every text value has a maximum length (a text
column's `max_length` from the policy, enforced when the table is loaded; a literal's own length; each text
function's growth), and an expression larger than MAX_NODES, or whose bound exceeds MAX_ROW_COST or
MAX_TEXT_LENGTH, is refused, so one row cannot cost much more than any other (benchmarks/attacks/row_cost.py
measures it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from sqlglot import exp

from dpsql.analysis.vetting import describe
from dpsql.errors import QueryRejected
from dpsql.policy import MAX_TEXT_LENGTH, ColumnPolicy, ColumnType
from dpsql.sql import temporal

# MAX_TEXT_LENGTH (policy.py) also bounds every text value an expression computes.
# Units of work one row may cost: about one per character touched, measured at about 2 ns each (LIKE on text of
# 100000 characters), so a row costs at most a few milliseconds more than another.
MAX_ROW_COST = 1_000_000
MAX_NODES = 2_000  # the size of one row expression: every row that reaches it pays for each node


class Kind(StrEnum):
    BOOL = "boolean"
    INT = "integer"
    DOUBLE = "double"
    DECIMAL = "decimal"
    TEXT = "text"
    DATE = "date"
    TIMESTAMP = "timestamp"
    NULL = "null"


NUMERIC = (Kind.INT, Kind.DOUBLE, Kind.DECIMAL)

# DuckDB's integer types and the values they hold. An integer result that may leave the range of an operand's
# type is computed in a wider one instead (DuckDB raises on overflow, and TRY is not the argument).
INTEGER_TYPES: dict[str, tuple[int, int]] = {
    "TINYINT": (-2**7, 2**7 - 1), "SMALLINT": (-2**15, 2**15 - 1), "INTEGER": (-2**31, 2**31 - 1),
    "BIGINT": (-2**63, 2**63 - 1), "HUGEINT": (-2**127, 2**127 - 1),
    "UTINYINT": (0, 2**8 - 1), "USMALLINT": (0, 2**16 - 1), "UINTEGER": (0, 2**32 - 1), "UBIGINT": (0, 2**64 - 1),
    "UHUGEINT": (0, 2**128 - 1),
}
_WIDENING = ("BIGINT", "HUGEINT")

# The longest text a value of each kind becomes when cast to text (e.g. '-9223372036854775808', a timestamp).
_TEXT_WIDTH = {Kind.BOOL: 5, Kind.INT: 45, Kind.DOUBLE: 30, Kind.DECIMAL: 45, Kind.DATE: 20, Kind.TIMESTAMP: 40,
               Kind.NULL: 0}

# Date functions that DuckDB evaluates through a timestamp or a week calendar fail outside the timestamp range;
# the rewrite guards them to these dates (NULL outside), which is also the range Python's datetime holds.
DATE_GUARD = ("0001-01-01", "9999-12-31")

# EXTRACT / date_part parts per kind: total ones, and ones total only inside DATE_GUARD. Others are refused:
# some raise "not implemented" (timezone of a date, era of date_trunc), which TRY does not absorb.
_DATE_PARTS = frozenset({"year", "month", "day", "decade", "century", "millennium", "quarter", "dow", "isodow",
                         "doy", "epoch", "era", "dayofweek", "dayofyear", "weekday", "julian"})
_TIME_PARTS = frozenset({"hour", "minute", "second", "millisecond", "microsecond", "milliseconds",
                         "microseconds"})
_WEEK_PARTS = frozenset({"week", "weekofyear", "yearweek", "isoyear"})
EXTRACT_PARTS: dict[Kind, tuple[frozenset[str], frozenset[str]]] = {
    Kind.DATE: (_DATE_PARTS, _WEEK_PARTS),
    Kind.TIMESTAMP: (_DATE_PARTS | _TIME_PARTS, _WEEK_PARTS),
}
TRUNC_PARTS: dict[Kind, frozenset[str]] = {
    Kind.DATE: frozenset({"year", "quarter", "month", "week", "day", "decade", "century", "millennium"}),
    Kind.TIMESTAMP: frozenset({"year", "quarter", "month", "week", "day", "decade", "century", "millennium",
                               "hour", "minute", "second", "millisecond", "microsecond"}),
}


@dataclass(frozen=True)
class Typed:
    """A row expression's DuckDB type, the total rewrite of it, and bounds on its values and its cost."""

    kind: Kind
    node: exp.Expression  # the expression as it will run: total for every row
    integer: str = ""  # INT: DuckDB's integer type
    lo: int = 0  # INT: every value lies in lo..hi
    hi: int = 0
    length: int = 0  # TEXT: the most characters a value can have
    cost: int = 1  # work for one row, at most

    @property
    def text_literal(self) -> bool:
        return isinstance(self.node, exp.Literal) and self.node.is_string

    def describe(self) -> str:
        return self.kind.value


def _int(node: exp.Expression, lo: int, hi: int, integer: str, cost: int) -> Typed:
    return Typed(Kind.INT, node, integer=integer, lo=lo, hi=hi, cost=cost)


def _smallest_integer(lo: int, hi: int, names: tuple[str, ...] = ("INTEGER", *_WIDENING)) -> str | None:
    for name in names:
        low, high = INTEGER_TYPES[name]
        if low <= lo and hi <= high:
            return name
    return None


def _cast(node: exp.Expression, to: str) -> exp.Expression:
    return exp.Cast(this=node, to=_data_type(to).copy())


@functools.cache
def _data_type(name: str) -> exp.DataType:
    return exp.DataType.build(name, dialect="duckdb")  # parsing a type name is slow: once per name


class Rejected(QueryRejected):
    """A row expression refused by the type check: decided from the SQL and the policy alone."""


class TypeChecker:
    """Types row expressions over one table's columns. `context` is rendered only for a refusal message."""

    def __init__(self, columns: dict[str, ColumnPolicy], context: object) -> None:
        self.columns = columns
        self.context = context

    def refuse(self, problem: str) -> Rejected:
        return Rejected(f"{self.context}: {problem}")

    # -- entry point ------------------------------------------------------------------------------------------
    def infer(self, node: exp.Expression) -> Typed:
        rule = _RULES.get(type(node))
        if rule is None:
            raise self.refuse(f"{describe(node)} has no type rule (it is not in the list of vetted SQL)")
        typed = rule(self, node)
        if typed.kind is Kind.TEXT and typed.length > MAX_TEXT_LENGTH:
            raise self.refuse(f"{describe(node)} can produce text of up to {typed.length} characters (limit "
                              f"{MAX_TEXT_LENGTH}): one row could cost far more than another")
        if typed.cost > MAX_ROW_COST:
            raise self.refuse(f"{describe(node)} may cost up to {typed.cost} units of work on one row (limit "
                              f"{MAX_ROW_COST}): one row could cost far more than another")
        return typed

    def children(self, *nodes: exp.Expression | None) -> list[Typed]:
        return [self.infer(n) for n in nodes if n is not None]

    def expect(self, typed: Typed, kinds: tuple[Kind, ...], what: str) -> Typed:
        if typed.kind is Kind.NULL or typed.kind in kinds:
            return typed
        wanted = " or ".join(k.value for k in kinds)
        raise self.refuse(f"{what} takes {wanted}, not {typed.describe()} ({_sql(typed.node)}): DuckDB would "
                          "cast it implicitly and the cast can fail on some rows; write the comparison or the "
                          "CAST explicitly")

    # -- leaves -----------------------------------------------------------------------------------------------
    def column(self, node: exp.Column) -> Typed:
        policy = self.columns.get(node.name)
        if policy is None:
            raise self.refuse(f"column '{node.name}' is not declared in the policy")
        kind = _COLUMN_KINDS[policy.type]
        if kind is Kind.INT:
            return _int(node, *INTEGER_TYPES["BIGINT"], "BIGINT", 1)
        if kind is Kind.TEXT:
            return Typed(kind, node, length=policy.text_length)
        return Typed(kind, node)

    def literal(self, node: exp.Literal) -> Typed:
        if node.is_string:
            return Typed(Kind.TEXT, node, length=len(node.this))
        text = node.this
        if text.isdigit():
            if len(text) > 40:  # beyond any integer type (and Python refuses int() of over 4300 digits: a traceback)
                raise self.refuse(f"the integer {text[:20]}... ({len(text)} digits) is beyond the 128-bit range")
            value = int(text)
            # DuckDB gives an integer literal the type of the other operand when the value fits it (TINYINT + 100
            # is TINYINT arithmetic), so a literal's type is taken as the narrowest that holds it: a type here must
            # never be wider than DuckDB's, or an overflow could go unseen.
            integer = _smallest_integer(value, value, ("TINYINT", "SMALLINT", "INTEGER", *_WIDENING))
            if integer is None:
                raise self.refuse(f"the integer {text} is beyond the 128-bit range")
            return _int(node, value, value, integer, 1)
        return Typed(Kind.DOUBLE if "e" in text.lower() else Kind.DECIMAL, node)

    def paren(self, node: exp.Paren) -> Typed:
        inner = self.infer(node.this)
        return replace(inner, node=exp.paren(inner.node, copy=False))

    # -- logic and comparison ---------------------------------------------------------------------------------
    def logic(self, node: exp.Expression) -> Typed:
        parts = [self.expect(t, (Kind.BOOL,), node.key.upper()) for t in self.children(node.this, node.expression)]
        return Typed(Kind.BOOL, node.__class__(**_args(node, parts)), cost=_cost(parts))

    def comparison(self, node: exp.Expression) -> Typed:
        left, right = self.unify([node.this, node.expression], "comparison", node)
        return Typed(Kind.BOOL, node.__class__(this=left.node, expression=right.node),
                     cost=_cost([left, right]) + _compared(left, right))

    def between(self, node: exp.Between) -> Typed:
        parts = self.unify([node.this, node.args["low"], node.args["high"]], "BETWEEN in", node)
        rebuilt = exp.Between(this=parts[0].node, low=parts[1].node, high=parts[2].node)
        return Typed(Kind.BOOL, rebuilt, cost=_cost(parts) + _compared(*parts[:2]) + _compared(parts[0], parts[2]))

    def in_list(self, node: exp.In) -> Typed:
        items = node.expressions
        if not items:
            raise self.refuse("IN needs a list of values")
        typed = [self.infer(n) for n in (node.this, *items)]
        kinds = {t.kind for t in typed[1:]} - {Kind.NULL}
        if len(kinds) > 1:
            raise self.refuse(f"the IN list of {_sql(node)} mixes {' and '.join(sorted(k.value for k in kinds))}: "
                              "DuckDB would cast them to one type, which can fail on some rows; use one type")
        parts = self.join(typed, "IN in", node)
        rebuilt = exp.In(this=parts[0].node, expressions=[p.node for p in parts[1:]])
        # An equality with each item in turn (DuckDB's IN-list rewrite to a join is switched off).
        return Typed(Kind.BOOL, rebuilt, cost=_cost(parts) + sum(_compared(parts[0], item) for item in parts[1:]))

    def is_(self, node: exp.Is) -> Typed:
        value = self.infer(node.this)
        if not isinstance(node.expression, exp.Null):
            self.expect(value, (Kind.BOOL,), "IS TRUE / IS FALSE")
        return Typed(Kind.BOOL, exp.Is(this=value.node, expression=node.expression.copy()), cost=value.cost)

    def not_(self, node: exp.Not) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.BOOL,), "NOT")
        return Typed(Kind.BOOL, exp.Not(this=value.node), cost=value.cost + 1)

    def like(self, node: exp.Expression, escape: str | None = None) -> Typed:
        subject = self.as_text(self.infer(node.this), f"{node.key.upper()}")
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise self.refuse(f"the pattern of {node.key.upper()} must be a literal string")
        if escape is not None:
            _check_escaped_pattern(pattern.this, escape, self)
        rebuilt = node.__class__(**{**_shallow(node), "this": subject.node, "expression": pattern.copy()})
        # Measured: with '_' in the pattern, or with ILIKE, matching backtracks over the pattern at every position
        # of the text (about 2 ns per character pair), so the bound is their product.
        return Typed(Kind.BOOL, rebuilt, cost=subject.cost + subject.length * max(1, len(pattern.this)))

    def escape(self, node: exp.Escape) -> Typed:
        like = node.this
        escape = node.expression
        if not isinstance(like, exp.Like | exp.ILike):
            raise self.refuse("ESCAPE applies to LIKE and ILIKE only")
        if not (isinstance(escape, exp.Literal) and escape.is_string and len(escape.this.encode()) == 1):
            raise self.refuse("ESCAPE must be a single ASCII character in quotes")
        inner = self.like(like, escape.this)
        return replace(inner, node=exp.Escape(this=inner.node, expression=escape.copy()))

    # -- arithmetic -------------------------------------------------------------------------------------------
    def arithmetic(self, node: exp.Expression) -> Typed:
        left, right = self.children(node.this, node.expression)
        symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/", "intdiv": "//", "mod": "%", "pow": "^"}[node.key]
        for side in (left, right):
            if side.kind not in (*NUMERIC, Kind.NULL):
                raise self.refuse(f"{symbol} is not defined for {left.describe()} {symbol} {right.describe()} "
                                  f"({_sql(node)}); only numbers can be added, multiplied or divided here")
        cost = _cost([left, right])
        if Kind.NULL in (left.kind, right.kind):
            return Typed(Kind.NULL, node.__class__(this=left.node, expression=right.node), cost=cost)
        if isinstance(node, exp.Div | exp.Pow):  # DuckDB computes both in DOUBLE: inf or NaN, never an error
            return Typed(Kind.DOUBLE, node.__class__(this=_double(left), expression=_double(right)), cost=cost)
        if isinstance(node, exp.IntDiv | exp.Mod):
            return self.division(node, left, right, symbol, cost)
        if left.kind is Kind.INT and right.kind is Kind.INT:
            lo, hi = _integer_range(node, left, right)
            return self.widened(node.__class__, [left, right], lo, hi, cost)
        return Typed(Kind.DOUBLE, node.__class__(this=_double(left), expression=_double(right)), cost=cost)

    def division(self, node: exp.Expression, left: Typed, right: Typed, symbol: str, cost: int) -> Typed:
        if Kind.INT not in (left.kind, right.kind) or left.kind is not right.kind:
            # In DOUBLE, % is fmod (NaN for a zero divisor); // still fails on a zero divisor.
            if isinstance(node, exp.Mod) or _nonzero_literal(node.expression):
                return Typed(Kind.DOUBLE, node.__class__(this=_double(left), expression=_double(right)), cost=cost)
            raise self.refuse(f"{symbol} on {left.describe()} and {right.describe()} needs a literal divisor other "
                              f"than 0 ({_sql(node)}): other divisors can fail on some rows")
        divisor = _integer_literal(node.expression)
        if divisor is None or divisor in (0, -1):
            raise self.refuse(f"{symbol} needs a divisor that is an integer literal other than 0 and -1 "
                              f"({_sql(node)}): other divisors can fail on some rows")
        if isinstance(node, exp.Mod):
            bound = abs(divisor) - 1
            lo, hi = (-bound if left.lo < 0 else 0), (bound if left.hi > 0 else 0)
        else:
            ends = (left.lo // divisor, left.hi // divisor, -(-left.lo // divisor), -(-left.hi // divisor))
            lo, hi = min(ends), max(ends)
        return _int(node.__class__(this=left.node, expression=right.node), lo, hi, left.integer, cost)

    def widened(self, build: Callable[..., exp.Expression], parts: list[Typed], lo: int, hi: int,
                cost: int) -> Typed:
        """An integer operation whose result lies in lo..hi, computed in a type that holds it."""
        fits = all(INTEGER_TYPES[p.integer][0] <= lo and hi <= INTEGER_TYPES[p.integer][1] for p in parts)
        if fits:
            integer = max((p.integer for p in parts), key=lambda n: INTEGER_TYPES[n][1] - INTEGER_TYPES[n][0])
            nodes = [p.node for p in parts]
        else:
            integer = _smallest_integer(lo, hi)
            if integer is None:
                raise self.refuse("integer arithmetic here may exceed 128 bits on some rows; cast an operand to "
                                  "DOUBLE")
            integer = "BIGINT" if integer == "INTEGER" else integer  # never narrower than a column
            nodes = [_cast(p.node, integer) for p in parts]
        keys = ("this", "expression")
        return _int(build(**dict(zip(keys, nodes, strict=False))), lo, hi, integer, cost)

    def negation(self, node: exp.Neg) -> Typed:
        value = self.infer(node.this)
        self.expect(value, NUMERIC, "unary minus")
        if value.kind is Kind.INT:
            return self.widened(exp.Neg, [value], -value.hi, -value.lo, value.cost + 1)
        return replace(value, node=exp.Neg(this=value.node), cost=value.cost + 1)

    # -- functions --------------------------------------------------------------------------------------------
    def numeric_function(self, node: exp.Expression) -> Typed:
        """abs, sign, floor, ceil, round: the kind DuckDB gives (sign: TINYINT; floor and ceil: DOUBLE)."""
        value = self.expect(self.infer(node.this), NUMERIC, describe(node))
        extra = {k: v for k, v in node.args.items() if k != "this" and v is not None}
        if isinstance(node, exp.Sign):
            return _int(exp.Sign(this=value.node), -1, 1, "TINYINT", value.cost + 1)
        if isinstance(node, exp.Round) and set(extra) <= {"decimals"}:
            decimals = extra.get("decimals")
            places = _integer_literal(decimals) if decimals is not None else 0
            if places is None:
                raise self.refuse("round() takes a literal integer number of decimal places")
            if value.kind is Kind.INT and places >= 0:
                return replace(value, node=exp.Round(this=value.node, decimals=decimals and decimals.copy()),
                               cost=value.cost + 1)
            # Rounding an integer to tens (or a decimal at all) can overflow its type: round the double.
            return Typed(Kind.DOUBLE, exp.Round(this=_double(value), decimals=decimals and decimals.copy()),
                         cost=value.cost + 1)
        if extra:
            raise self.refuse(f"{describe(node)} takes one argument here")
        if isinstance(node, exp.Abs) and value.kind is Kind.INT:
            lo = 0 if value.lo <= 0 <= value.hi else min(abs(value.lo), abs(value.hi))
            return self.widened(exp.Abs, [value], lo, max(abs(value.lo), abs(value.hi)), value.cost + 1)
        if value.kind is Kind.DECIMAL or isinstance(node, exp.Floor | exp.Ceil):
            # DuckDB's floor and ceil of an integer are DOUBLE: say so; a decimal is computed as a double.
            return Typed(Kind.DOUBLE, node.__class__(this=_double(value)), cost=value.cost + 1)
        return replace(value, node=node.__class__(this=value.node), cost=value.cost + 1)

    def double_function(self, node: exp.Expression) -> Typed:
        """sqrt, ln, exp: NaN or +/-inf out of their domain, never an error."""
        if any(v is not None for k, v in node.args.items() if k != "this"):
            raise self.refuse(f"{describe(node)} takes one argument here")
        value = self.expect(self.infer(node.this), NUMERIC, describe(node))
        return Typed(Kind.DOUBLE, node.__class__(this=_double(value)), cost=value.cost + 1)

    def case_change(self, node: exp.Expression) -> Typed:
        value = self.as_text(self.infer(node.this), describe(node))
        # DuckDB maps case code point by code point: the length (in code points, as everywhere here) is kept.
        return Typed(Kind.TEXT, node.__class__(this=value.node), length=value.length,
                     cost=value.cost + value.length)

    def length(self, node: exp.Length) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.TEXT,), "length()")
        return _int(exp.Length(this=value.node), 0, value.length, "BIGINT", value.cost + value.length)

    def substring(self, node: exp.Substring) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.TEXT,), "substring()")
        for key in ("start", "length"):
            arg = node.args.get(key)
            if arg is not None and (_integer_literal(arg) is None or abs(_integer_literal(arg)) > 2**31):
                raise self.refuse("substring() takes literal integers (at most 2^31 in magnitude) for its start "
                                  "and length: DuckDB fails on some other values")
        rebuilt = exp.Substring(this=value.node, start=_copy(node.args.get("start")),
                                length=_copy(node.args.get("length")))
        return Typed(Kind.TEXT, rebuilt, length=value.length, cost=value.cost + value.length)

    def left_right(self, node: exp.Expression) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.TEXT,), describe(node))
        count = self.infer(node.expression)
        self.expect(count, (Kind.INT,), f"the count of {describe(node)}")
        # DuckDB fails on a count beyond 2^32; a count beyond the text's maximum length means the same as that
        # length, so it is clamped there.
        limit = value.length + 1
        clamped = count.node
        if count.lo < -limit or count.hi > limit:
            clamped = exp.Least(this=exp.Greatest(this=count.node, expressions=[_literal_int(-limit)]),
                                expressions=[_literal_int(limit)])
        if count.integer in ("HUGEINT", "UBIGINT", "UHUGEINT"):
            clamped = _cast(clamped, "BIGINT")  # DuckDB takes a BIGINT count; the value fits, being clamped
        # A NULL-preserving clamp names the count four times (sqlglot writes GREATEST/LEAST as CASEs).
        return Typed(Kind.TEXT, node.__class__(this=value.node, expression=clamped), length=value.length,
                     cost=value.cost + 4 * count.cost + value.length)

    def trim(self, node: exp.Trim) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.TEXT,), "trim()")
        characters = node.expression
        if characters is not None and not (isinstance(characters, exp.Literal) and characters.is_string):
            raise self.refuse("trim() takes a literal string of characters to remove")
        if node.args.get("collation"):
            raise self.refuse("trim() with a collation is not supported")
        rebuilt = exp.Trim(this=value.node, expression=_copy(characters), position=node.args.get("position"))
        width = len(characters.this) if characters is not None else 1
        return Typed(Kind.TEXT, rebuilt, length=value.length, cost=value.cost + value.length * width)

    def concat(self, node: exp.Expression) -> Typed:
        if isinstance(node, exp.DPipe):
            parts = [self.expect(t, (Kind.TEXT,), "||") for t in self.children(node.this, node.expression)]
            rebuilt = exp.DPipe(this=parts[0].node, expression=parts[1].node)
        else:
            parts = [self.as_text(self.infer(e), "concat()") for e in node.expressions]
            rebuilt = exp.Concat(expressions=[p.node for p in parts], safe=node.args.get("safe"))
        length = sum(p.length for p in parts)
        return Typed(Kind.TEXT, rebuilt, length=length, cost=_cost(parts) + length)

    def replace_text(self, node: exp.Replace) -> Typed:
        parts = [self.expect(t, (Kind.TEXT,), "replace()")
                 for t in self.children(node.this, node.expression, node.args.get("replacement"))]
        if len(parts) != 3:
            raise self.refuse("replace() takes three arguments")
        value, search, replacement = parts
        # At most length / len(search) occurrences each grow by len(replacement); DuckDB leaves text alone when
        # the search string is empty.
        step = len(search.node.this) if search.text_literal and search.node.this else 1
        length = value.length + (value.length // step) * replacement.length
        rebuilt = exp.Replace(this=value.node, expression=search.node, replacement=replacement.node)
        return Typed(Kind.TEXT, rebuilt, length=length, cost=_cost(parts) + value.length + search.length + length)

    def text_predicate(self, node: exp.Expression) -> Typed:
        """starts_with and strpos (two texts)."""
        second = node.expression if isinstance(node, exp.StartsWith) else node.args.get("substr")
        if any(node.args.get(k) is not None for k in ("position", "occurrence", "instance")):
            raise self.refuse(f"{describe(node)} takes two arguments here")
        value, search = [self.expect(t, (Kind.TEXT,), describe(node)) for t in self.children(node.this, second)]
        cost = value.cost + search.cost + value.length + search.length  # measured linear in DuckDB
        if isinstance(node, exp.StartsWith):
            return Typed(Kind.BOOL, exp.StartsWith(this=value.node, expression=search.node), cost=cost)
        return _int(exp.StrPosition(this=value.node, substr=search.node), 0, value.length, "BIGINT", cost)

    # -- dates ------------------------------------------------------------------------------------------------
    def date_function(self, node: exp.Expression) -> Typed:
        value = self.expect(self.infer(node.this), (Kind.DATE, Kind.TIMESTAMP), describe(node))
        if any(v is not None for k, v in node.args.items() if k != "this"):
            raise self.refuse(f"{describe(node)} takes one argument here")
        if isinstance(node, exp.Week | exp.WeekOfYear):
            return _int(_date_guarded(lambda arg: node.__class__(this=arg), value), -(2**31), 2**31, "BIGINT",
                        _guarded_cost(value))
        if isinstance(node, exp.Hour | exp.Minute | exp.Second) and value.kind is not Kind.TIMESTAMP:
            raise self.refuse(f"{describe(node)} of {value.describe()}: a date has no time of day (always zero)")
        return _int(node.__class__(this=value.node), -(2**31), 2**31, "BIGINT", value.cost + 2)

    def extract(self, node: exp.Extract) -> Typed:
        part = _part_name(node.this)
        value = self.expect(self.infer(node.expression), (Kind.DATE, Kind.TIMESTAMP), "EXTRACT")
        total, guarded = EXTRACT_PARTS.get(value.kind, (frozenset(), frozenset()))
        if part is None or part not in total | guarded:
            raise self.refuse(f"EXTRACT({node.this.sql()} FROM {value.describe()}) is not supported (parts: "
                              f"{', '.join(sorted(total | guarded))}): DuckDB fails on it for some values")
        def call(arg: exp.Expression) -> exp.Expression:
            return exp.Extract(this=exp.var(part.upper()), expression=arg)
        kind = Kind.DOUBLE if part in ("epoch", "julian") else Kind.INT
        node_out = _date_guarded(call, value) if part in guarded else call(value.node)
        cost = _guarded_cost(value) if part in guarded else value.cost + 2
        if kind is Kind.DOUBLE:
            return Typed(kind, node_out, cost=cost)
        return _int(node_out, -(2**63), 2**63 - 1, "BIGINT", cost)

    def truncate(self, node: exp.Expression) -> Typed:
        part = _part_name(node.args.get("unit"))
        value = self.expect(self.infer(node.this), (Kind.DATE, Kind.TIMESTAMP), "date_trunc()")
        allowed = TRUNC_PARTS.get(value.kind, frozenset())
        if part is None or part not in allowed:
            raise self.refuse(f"date_trunc('{part}', {value.describe()}) is not supported (parts: "
                              f"{', '.join(sorted(allowed))}): DuckDB fails on it for some values")
        guarded = _date_guarded(lambda arg: exp.TimestampTrunc(this=arg, unit=exp.var(part.upper())), value)
        return Typed(Kind.TIMESTAMP, guarded, cost=_guarded_cost(value))

    # -- conditionals -----------------------------------------------------------------------------------------
    def case(self, node: exp.Case) -> Typed:
        ifs = node.args.get("ifs") or []
        subject = node.this
        if subject is not None:  # CASE x WHEN v THEN ...: x is compared with every v, so all take one type
            compared = self.unify([subject, *(i.this for i in ifs)], "CASE ... WHEN", node)
            subject_node, conditions = compared[0].node, compared[1:]
        else:
            subject_node = None
            conditions = [self.expect(self.infer(i.this), (Kind.BOOL,), "CASE WHEN") for i in ifs]
        results = self.unify([*(i.args["true"] for i in ifs), node.args.get("default") or exp.null()],
                             "the results of", node)
        branches = zip(conditions, results[:-1], strict=True)
        rebuilt = exp.Case(this=subject_node, ifs=[exp.If(this=c.node, true=r.node) for c, r in branches],
                           default=results[-1].node)
        return replace(_joined(results), node=rebuilt, cost=_cost([*conditions, *results]))

    def if_(self, node: exp.If) -> Typed:
        condition = self.expect(self.infer(node.this), (Kind.BOOL,), "IF")
        results = self.unify([node.args["true"], node.args.get("false") or exp.null()], "the results of", node)
        rebuilt = exp.If(this=condition.node, true=results[0].node, false=results[1].node)
        return replace(_joined(results), node=rebuilt, cost=_cost([condition, *results]))

    def variadic(self, node: exp.Expression) -> Typed:
        """coalesce, least, greatest: one type over all arguments."""
        parts = self.unify([node.this, *node.expressions], "the arguments of", node)
        extra = {k: v for k, v in node.args.items() if k not in ("this", "expressions")}
        rebuilt = node.__class__(this=parts[0].node, expressions=[p.node for p in parts[1:]], **extra)
        return replace(_joined(parts), node=rebuilt, cost=_cost(parts) + sum(p.length for p in parts))

    def nullif(self, node: exp.Nullif) -> Typed:
        value, other = self.unify([node.this, node.expression], "the arguments of", node)
        return replace(value, node=exp.Nullif(this=value.node, expression=other.node),
                       cost=_cost([value, other]) + value.length + other.length)

    # -- casts ------------------------------------------------------------------------------------------------
    def cast(self, node: exp.Cast) -> Typed:
        value = self.infer(node.this)
        target = node.to
        name = target.this.value if isinstance(target.this, exp.DataType.Type) else ""
        name = {"TIMESTAMPNTZ": "TIMESTAMP", "INT": "INTEGER", "FLOAT": "FLOAT", "CHAR": "VARCHAR",
                "TEXT": "VARCHAR", "NCHAR": "VARCHAR", "NVARCHAR": "VARCHAR", "BPCHAR": "VARCHAR",
                "INT128": "HUGEINT", "UINT128": "UHUGEINT", "DATETIME": "TIMESTAMP"}.get(name, name)
        kind = _CAST_KINDS.get(name)
        if kind is None:
            raise self.refuse(f"cannot cast to {target.sql('duckdb')} (numbers, text, boolean, date and "
                              "timestamp are allowed)")
        cost = value.cost + value.length + 1
        # A cast of a constant runs once, whatever the data: it stays a CAST, and the checker evaluates it from the
        # text (vetting.ConstantChecker), so a bad literal is refused rather than silently NULL.
        total = isinstance(node, exp.TryCast) or _constant(node.this) or _cast_is_total(value, kind, name)
        built = (exp.Cast if total and not isinstance(node, exp.TryCast) else exp.TryCast)(
            this=value.node, to=target.copy())
        if kind is Kind.INT:
            lo, hi = INTEGER_TYPES[name]
            if value.kind is Kind.INT:
                lo, hi = max(lo, value.lo), min(hi, value.hi)
            elif value.kind is Kind.BOOL:
                lo, hi = 0, 1
            return _int(built, lo, hi, name, cost)
        if kind is Kind.TEXT:
            length = value.length if value.kind is Kind.TEXT else _TEXT_WIDTH[value.kind]
            return Typed(kind, built, length=length, cost=cost)
        return Typed(kind, built, cost=cost)

    # -- conversions ------------------------------------------------------------------------------------------
    def as_text(self, typed: Typed, what: str) -> Typed:
        """Text for a text function: another kind is cast explicitly (every kind casts to text without error)."""
        if typed.kind in (Kind.TEXT, Kind.NULL):
            return typed
        return Typed(Kind.TEXT, _cast(typed.node, "VARCHAR"), length=_TEXT_WIDTH[typed.kind],
                     cost=typed.cost + 1)

    def unify(self, nodes: list[exp.Expression], what: str, whole: exp.Expression) -> list[Typed]:
        """Type `nodes` as one DuckDB type, making every implicit conversion explicit, or refuse. `what` and
        `whole` name the place in a refusal (rendered only then: rendering SQL is slow)."""
        return self.join([self.infer(n) for n in nodes], what, whole)

    def join(self, parts: list[Typed], what: str, whole: exp.Expression) -> list[Typed]:
        """unify() for parts already typed."""
        kinds = {p.kind for p in parts} - {Kind.NULL}
        # A text literal beside a typed value is read as that type, once, from the text (checked as a constant).
        typed_kinds = {p.kind for p in parts if not p.text_literal} - {Kind.NULL}
        if Kind.TEXT in kinds and typed_kinds and Kind.TEXT not in typed_kinds and len(typed_kinds) == 1:
            target = next(iter(typed_kinds))
            integer = next((p.integer for p in parts if p.kind is Kind.INT), "BIGINT")
            name = _DUCKDB_NAMES[target] if target is not Kind.INT else integer
            parts = [replace(p, kind=target, node=_cast(p.node, name), length=0,
                             **({"lo": INTEGER_TYPES[name][0], "hi": INTEGER_TYPES[name][1], "integer": name}
                                if target is Kind.INT else {}))
                     if p.text_literal and not _timed_text(p, target) else
                     replace(p, kind=Kind.TIMESTAMP, node=_cast(p.node, "TIMESTAMP"), length=0)
                     if p.text_literal else p for p in parts]
            kinds = {p.kind for p in parts} - {Kind.NULL}
        if len(kinds) <= 1:
            return parts
        if kinds == {Kind.DATE, Kind.TIMESTAMP} and all(_constant(p.node) for p in parts if p.kind is Kind.DATE):
            # A constant date beside a timestamp (ts > DATE '2020-01-01') becomes a timestamp, checked from the
            # text; a date column would not (DuckDB fails to widen the extreme dates), so that stays refused...
            parts = [replace(p, kind=Kind.TIMESTAMP, node=_cast(p.node, "TIMESTAMP")) if p.kind is Kind.DATE else p
                     for p in parts]
            return parts
        if kinds == {Kind.DATE, Kind.TIMESTAMP} and what in _ORDERING and all(
                _written_timestamp(p.node) for p in parts if p.kind is Kind.TIMESTAMP):
            # ...unless it is compared with timestamps written in the query (a bound datetime, a driver's
            # '...'::timestamp): then, as DuckDB compares them, the date is a timestamp at midnight. Such a timestamp
            # lies in the years 1-9999, so a date beyond them compares with it as the day just past them does: the
            # date is clamped to those days first, and every date widens without fail.
            return [replace(p, kind=Kind.TIMESTAMP, node=_widened_date(p.node), cost=_guarded_cost(p))
                    if p.kind is Kind.DATE else p for p in parts]
        if Kind.BOOL in kinds and kinds - {Kind.BOOL} <= set(NUMERIC):
            # DuckDB compares a boolean with a number as the integer 0 or 1 (2 = TRUE is false): say so.
            parts = [_int(_cast(p.node, "INTEGER"), 0, 1, "INTEGER", p.cost + 1) if p.kind is Kind.BOOL else p
                     for p in parts]
            kinds = {p.kind for p in parts} - {Kind.NULL}
            if len(kinds) <= 1:
                return parts
        if kinds <= set(NUMERIC):
            if Kind.DOUBLE in kinds or Kind.DECIMAL in kinds:
                # Mixed numbers meet as DOUBLE, explicitly: DuckDB's decimal conversions can overflow.
                return [p if p.kind in (Kind.DOUBLE, Kind.NULL) else
                        Typed(Kind.DOUBLE, _double(p), cost=p.cost) for p in parts]
            return parts
        raise self.refuse(f"{what} {_sql(whole)} mixes {' and '.join(sorted(k.value for k in kinds))}: DuckDB "
                          "would cast one to the other, which can fail on some rows; CAST explicitly")


def _check_escaped_pattern(pattern: str, escape: str, checker: TypeChecker) -> None:
    """DuckDB raises (and TRY does not catch) when matching reaches an escape character at the pattern's end."""
    index = 0
    while index < len(pattern):
        if pattern[index] == escape:
            if index + 1 >= len(pattern):
                raise checker.refuse(f"the LIKE pattern {pattern!r} ends with its ESCAPE character {escape!r}")
            index += 1
        index += 1


def _cast_is_total(value: Typed, kind: Kind, name: str) -> bool:
    """Whether CAST(value AS name) succeeds for every value of the source type (else it becomes TRY_CAST)."""
    source = value.kind
    if source is Kind.NULL or kind is Kind.TEXT:
        return True
    if kind is Kind.INT:
        lo, hi = INTEGER_TYPES[name]
        return (source is Kind.INT and lo <= value.lo and value.hi <= hi) or (source is Kind.BOOL and lo <= 0)
    if kind is Kind.DOUBLE:  # a DOUBLE beyond FLOAT's range fails to become a FLOAT
        return source in (Kind.INT, Kind.DOUBLE, Kind.DECIMAL, Kind.BOOL) and (name == "DOUBLE" or source is not
                                                                               Kind.DOUBLE)
    if kind is Kind.BOOL:
        return source in (Kind.BOOL, Kind.INT, Kind.DOUBLE)
    if kind is Kind.DATE:
        return source in (Kind.DATE, Kind.TIMESTAMP)
    if kind is Kind.TIMESTAMP:
        return source is Kind.TIMESTAMP
    return False  # DECIMAL(p, s) can overflow: TRY_CAST


def _guarded_cost(value: Typed) -> int:
    return 3 * value.cost + 4  # the guard evaluates its argument three times (test, clamp, call)


def _date_guarded(call: Callable[[exp.Expression], exp.Expression], value: Typed) -> exp.Expression:
    """`call(value)`, NULL for dates outside DATE_GUARD (where DuckDB's timestamp and week arithmetic fail).

    The argument is also clamped into DATE_GUARD inside the call, so the call is total on its own: should an
    optimizer ever evaluate it outside the CASE (common subexpressions, hoisting), it still cannot fail."""
    name = _DUCKDB_NAMES[value.kind]
    low, high = (_cast(exp.Literal.string(d), name) for d in DATE_GUARD)
    inside = exp.Between(this=value.node.copy(), low=low.copy(), high=high.copy())
    # NULLs are ignored in the clamp (the CASE already makes a NULL date NULL), so it names its argument once.
    clamped = exp.Least(this=exp.Greatest(this=value.node.copy(), expressions=[low], ignore_nulls=True),
                        expressions=[high], ignore_nulls=True)
    return exp.Case(ifs=[exp.If(this=inside, true=call(clamped))])


_ORDERING = ("comparison", "BETWEEN in", "IN in")  # join()'s callers whose result is a truth value, not a value
_BEYOND_WRITTEN = ("0001-12-31 (BC)", "10000-01-01")  # the days just outside the years a written timestamp has


def _timed_text(part: Typed, target: Kind) -> bool:
    """A text literal beside a date that spells a time of day other than midnight: read as the date, DuckDB would
    cut the time away; it is read as the timestamp it is, and compared as one (see join)."""
    written = temporal.written(part.node) if target is Kind.DATE else None
    return written is not None and written.timed and not written.at_midnight


def _written_timestamp(node: exp.Expression) -> bool:
    """A timestamp literal, CAST('...' AS TIMESTAMP), whose text is a date and time (sql/temporal.py): in the
    years 1-9999."""
    return isinstance(node, exp.Cast) and temporal.written(node.this) is not None


def _widened_date(node: exp.Expression) -> exp.Expression:
    """A date as a timestamp at midnight, clamped to the days just outside the years 1-9999 (NULL stays NULL)."""
    low, high = (_cast(exp.Literal.string(day), "DATE") for day in _BEYOND_WRITTEN)
    clamped = exp.Case().when(node < low, low).when(node.copy() > high, high).else_(node.copy())
    return _cast(clamped, "TIMESTAMP")


def _constant(node: exp.Expression) -> bool:
    """Whether `node` reads no column: it runs once, whatever the data, and the checker evaluates it first."""
    return not any(isinstance(part, exp.Column) for part in node.walk())


def _double(typed: Typed) -> exp.Expression:
    return typed.node if typed.kind in (Kind.DOUBLE, Kind.NULL) else _cast(typed.node, "DOUBLE")


def _integer_range(node: exp.Expression, left: Typed, right: Typed) -> tuple[int, int]:
    if isinstance(node, exp.Add):
        return left.lo + right.lo, left.hi + right.hi
    if isinstance(node, exp.Sub):
        return left.lo - right.hi, left.hi - right.lo
    corners = [a * b for a in (left.lo, left.hi) for b in (right.lo, right.hi)]
    return min(corners), max(corners)


def _literal_int(value: int) -> exp.Expression:
    literal = exp.Literal.number(abs(value))
    return exp.Neg(this=literal) if value < 0 else literal


def _nonzero_literal(node: exp.Expression) -> bool:
    if isinstance(node, exp.Paren | exp.Neg):
        return _nonzero_literal(node.this)
    if not (isinstance(node, exp.Literal) and not node.is_string):
        return False
    try:
        return float(node.this) != 0.0
    except ValueError:
        return False


def _integer_literal(node: exp.Expression | None) -> int | None:
    if isinstance(node, exp.Paren):
        return _integer_literal(node.this)
    if isinstance(node, exp.Neg):
        inner = _integer_literal(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


def _part_name(node: exp.Expression | None) -> str | None:
    if isinstance(node, exp.Var) or (isinstance(node, exp.Literal) and node.is_string):
        return node.name.lower()
    return None


def _joined(parts: list[Typed]) -> Typed:
    """The type of a value that is one of `parts` (after unify)."""
    kinds = [p for p in parts if p.kind is not Kind.NULL]
    if not kinds:
        return parts[0]
    first = kinds[0]
    if first.kind is Kind.INT:
        integer = max((p.integer for p in kinds), key=lambda n: INTEGER_TYPES[n][1] - INTEGER_TYPES[n][0])
        return replace(first, lo=min(p.lo for p in kinds), hi=max(p.hi for p in kinds), integer=integer)
    return replace(first, length=max(p.length for p in kinds))


def _cost(parts: list[Typed]) -> int:
    return 1 + sum(p.cost for p in parts)


def _compared(left: Typed, right: Typed) -> int:
    """Comparing two values touches at most the shorter one's characters (texts are compared by length and prefix
    first, then character by character up to the first difference)."""
    return min(left.length, right.length)


def _args(node: exp.Expression, parts: list[Typed]) -> dict:
    return dict(zip(("this", "expression"), (p.node for p in parts), strict=False))


def _shallow(node: exp.Expression) -> dict:
    return {k: v for k, v in node.args.items() if not isinstance(v, exp.Expression)}


def _copy(node: exp.Expression | None) -> exp.Expression | None:
    return node.copy() if node is not None else None


def _sql(node: exp.Expression) -> str:
    def plain(part: exp.Expression) -> exp.Expression:
        return exp.column(part.name) if isinstance(part, exp.Column) else part
    return node.copy().transform(plain, copy=False).sql("duckdb")


_COLUMN_KINDS = {ColumnType.INT: Kind.INT, ColumnType.FLOAT: Kind.DOUBLE, ColumnType.TEXT: Kind.TEXT,
                 ColumnType.BOOL: Kind.BOOL, ColumnType.DATE: Kind.DATE, ColumnType.TIMESTAMP: Kind.TIMESTAMP}
_DUCKDB_NAMES = {Kind.BOOL: "BOOLEAN", Kind.INT: "BIGINT", Kind.DOUBLE: "DOUBLE", Kind.TEXT: "VARCHAR",
                 Kind.DATE: "DATE", Kind.TIMESTAMP: "TIMESTAMP", Kind.DECIMAL: "DOUBLE"}
_CAST_KINDS = {**{name: Kind.INT for name in INTEGER_TYPES}, "DOUBLE": Kind.DOUBLE, "FLOAT": Kind.DOUBLE,
               "DECIMAL": Kind.DECIMAL, "VARCHAR": Kind.TEXT, "BOOLEAN": Kind.BOOL, "DATE": Kind.DATE,
               "TIMESTAMP": Kind.TIMESTAMP}

_T = TypeChecker
_RULES: dict[type[exp.Expression], Callable[[TypeChecker, exp.Expression], Typed]] = {
    exp.Column: _T.column, exp.Literal: _T.literal, exp.Paren: _T.paren,
    exp.Null: lambda _, n: Typed(Kind.NULL, n.copy()), exp.Boolean: lambda _, n: Typed(Kind.BOOL, n.copy()),
    exp.And: _T.logic, exp.Or: _T.logic, exp.Not: _T.not_,
    **{c: _T.comparison for c in (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                                  exp.NullSafeNEQ)},
    exp.Between: _T.between, exp.In: _T.in_list, exp.Is: _T.is_, exp.Like: _T.like, exp.ILike: _T.like,
    exp.Escape: _T.escape,
    **{c: _T.arithmetic for c in (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Pow)},
    exp.Neg: _T.negation,
    **{c: _T.numeric_function for c in (exp.Abs, exp.Sign, exp.Round, exp.Floor, exp.Ceil)},
    **{c: _T.double_function for c in (exp.Sqrt, exp.Ln, exp.Exp)},
    exp.Lower: _T.case_change, exp.Upper: _T.case_change, exp.Length: _T.length, exp.Substring: _T.substring,
    exp.Left: _T.left_right, exp.Right: _T.left_right, exp.Trim: _T.trim, exp.Concat: _T.concat,
    exp.DPipe: _T.concat, exp.Replace: _T.replace_text, exp.StartsWith: _T.text_predicate,
    exp.StrPosition: _T.text_predicate,
    **{c: _T.date_function for c in (exp.Year, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfYear, exp.Quarter,
                                     exp.Week, exp.DayOfMonth, exp.DayOfWeekIso, exp.WeekOfYear, exp.Hour,
                                     exp.Minute, exp.Second)},
    exp.Extract: _T.extract, exp.TimestampTrunc: _T.truncate,
    exp.Case: _T.case, exp.If: _T.if_, exp.Coalesce: _T.variadic, exp.Least: _T.variadic,
    exp.Greatest: _T.variadic, exp.Nullif: _T.nullif, exp.Cast: _T.cast, exp.TryCast: _T.cast,
}


def typed_expression(node: exp.Expression, columns: dict[str, ColumnPolicy], context: object) -> Typed:
    """The type, total rewrite and cost bound of a row expression, or QueryRejected naming what is wrong."""
    size = sum(1 for _ in node.walk())
    if size > MAX_NODES:
        raise Rejected(f"{context}: the expression has {size} parts (limit {MAX_NODES}): one row could cost far "
                       "more than another")
    typed = TypeChecker(columns, context).infer(node)
    total_size = sum(1 for _ in typed.node.walk())
    if total_size > 4 * MAX_NODES:  # guards repeat their argument: nested ones multiply the size
        raise Rejected(f"{context}: the expression grows to {total_size} parts once made total (limit "
                       f"{4 * MAX_NODES}): nest fewer date functions")
    return typed


def total_expression(node: exp.Expression, columns: dict[str, ColumnPolicy]) -> exp.Expression:
    """The expression as the bounded SQL runs it: every operation total for every row (see the module doc)."""
    return typed_expression(node, columns, "").node.copy()
