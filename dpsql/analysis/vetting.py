"""Which SQL an analyst may write inside a row expression (WHERE, GROUP BY, an aggregate's argument).

An allowlist, not a denylist: a node type that is not listed here is refused, whatever sqlglot learns to parse
next. Everything listed is deterministic and reads nothing but the current row. Whether it can fail on some
row value is decided by the type check (typecheck.py), which admits each operation only where it is total and
gives the total form the bounded SQL runs; `TRY` around it (the rewrite) is a second layer, not the argument.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

import duckdb
from sqlglot import exp

from dpsql.errors import QueryRejected, first_line
from dpsql.policy import ColumnPolicy, ColumnType
from dpsql.sql import sandbox

# Structure that appears inside vetted expressions.
_STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.DataType, exp.DataTypeParam,
    exp.Var, exp.Interval, exp.Tuple,
)
_LOGIC = (exp.And, exp.Or, exp.Not, exp.Xor)
_COMPARISON = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is, exp.In,
    exp.Between, exp.Like, exp.ILike, exp.Escape,
)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Pow)
_CONDITIONAL = (exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Least, exp.Greatest)
_MATH = (exp.Abs, exp.Sign, exp.Round, exp.Floor, exp.Ceil, exp.Sqrt, exp.Ln, exp.Exp)
_TEXT = (
    exp.Lower, exp.Upper, exp.Length, exp.Substring, exp.Trim, exp.Concat, exp.DPipe, exp.StartsWith, exp.Left,
    exp.Right, exp.Replace, exp.StrPosition,
)
_TIME = (
    exp.Year, exp.Month, exp.Day, exp.DayOfWeek, exp.DayOfYear, exp.Quarter, exp.Week, exp.Extract,
    exp.TimestampTrunc, exp.DateTrunc, exp.DayOfMonth, exp.DayOfWeekIso, exp.WeekOfYear, exp.Hour, exp.Minute,
    exp.Second,
)
_CASTS = (exp.Cast, exp.TryCast)

ROW_NODES = frozenset(_STRUCTURE + _LOGIC + _COMPARISON + _ARITHMETIC + _CONDITIONAL + _MATH + _TEXT + _TIME
                      + _CASTS)

# The only nodes that cannot raise on any row value. Everything else may: even a comparison can hide an
# implicit cast that fails on the rows that reach it (`pid IN (1, 'x')`), which would make the error an oracle.
NEVER_FAILS = frozenset((exp.Column, exp.Identifier, exp.Literal, exp.Boolean, exp.Null, exp.Paren))

_CAST_TARGETS = (
    *exp.DataType.NUMERIC_TYPES, *exp.DataType.TEXT_TYPES, exp.DataType.Type.BOOLEAN, exp.DataType.Type.DATE,
    exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ,  # sqlglot reads TIMESTAMP as TIMESTAMPNTZ
)

_VOLATILE = (exp.Rand, exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.CurrentUser)


def describe(node: exp.Expression) -> str:
    """A short name for a node in an error message: the function name the analyst typed where there is one."""
    if isinstance(node, exp.Anonymous):
        return f"function {node.name.lower()}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name().lower()}()"
    return type(node).__name__.lower()


def vet_row_expression(node: exp.Expression, context: object) -> None:
    """Refuse `node` unless every part of it is a vetted, deterministic, row-local construct. `context` says where
    it is in the query; it is rendered (str) only for an error message."""
    for part in node.walk():
        if isinstance(part, exp.AggFunc):
            raise QueryRejected(f"{context}: aggregate {part.sql('duckdb')} is not allowed here")
        if isinstance(part, exp.Subquery | exp.Select | exp.Query):
            raise QueryRejected(f"{context}: subqueries are not supported")
        if isinstance(part, exp.Window):
            raise QueryRejected(f"{context}: window functions are not supported")
        if isinstance(part, _VOLATILE):
            raise QueryRejected(f"{context}: {describe(part)} is not allowed: its value changes from run to run, "
                                "so answers would depend on when they were asked")
        if isinstance(part, exp.Placeholder | exp.Parameter):
            raise QueryRejected(f"{context}: parameter {part.sql('duckdb')} has no value bound to it")
        if type(part) not in ROW_NODES:
            raise QueryRejected(f"{context}: {describe(part)} is not in the list of vetted SQL functions")
        _vet_arguments(part, context)


def _vet_arguments(part: exp.Expression, context: object) -> None:
    if isinstance(part, exp.In) and any(part.args.get(k) for k in ("query", "unnest", "field")):
        raise QueryRejected(f"{context}: IN takes a list of values here, not a subquery or UNNEST")
    if isinstance(part, _CASTS) and not part.to.is_type(*_CAST_TARGETS):
        raise QueryRejected(f"{context}: cannot cast to {part.to.sql('duckdb')} (numbers, text, boolean, date "
                            "and timestamp are allowed)")
    if isinstance(part, exp.Like | exp.ILike) and not _is_literal(part.expression):
        raise QueryRejected(f"{context}: the pattern of LIKE must be a literal string")
    if isinstance(part, exp.Escape):
        # DuckDB raises on a bad ESCAPE only for rows that reach it, and TRY does not catch that error
        # (a SyntaxException): it has to be refused here, from the text, or it would be an oracle on the data.
        # DuckDB counts bytes, not characters: 'ü' is two and fails like 'ab'.
        escape = part.expression
        if not (isinstance(escape, exp.Literal) and escape.is_string and len(escape.this.encode()) == 1):
            raise QueryRejected(f"{context}: ESCAPE must be a single ASCII character in quotes")
    if isinstance(part, exp.TimestampTrunc | exp.DateTrunc | exp.Extract):
        unit = part.args.get("unit") if not isinstance(part, exp.Extract) else part.this
        if unit is not None and not isinstance(unit, exp.Var | exp.Literal):
            raise QueryRejected(f"{context}: the date part of {part.sql('duckdb')} must be a literal")


def _is_literal(node: exp.Expression | None) -> bool:
    return isinstance(node, exp.Literal) or (isinstance(node, exp.Escape) and isinstance(node.this, exp.Literal))


_LEAVES = (exp.Literal, exp.Null, exp.Boolean, exp.Identifier, exp.DataType, exp.DataTypeParam, exp.Var, exp.Star,
           exp.Interval)
_NOT_CONSTANT = (exp.Column, exp.AggFunc, exp.Star, exp.Placeholder, exp.Parameter, exp.Window, exp.Query,
                 exp.Subquery, exp.Table)


def constant_parts(node: exp.Expression) -> list[exp.Expression]:
    """The largest subexpressions that read no column and no aggregate (beyond bare literals)."""
    if isinstance(node, _LEAVES):
        return []
    if not any(isinstance(part, _NOT_CONSTANT) for part in node.walk()):
        return [node]
    return [part for child in node.iter_expressions() for part in constant_parts(child)]


class ConstantChecker:
    """Evaluates an expression's constant parts once, in an empty sandboxed DuckDB, before any data is touched.

    DuckDB folds constants while it plans, and a constant that fails (`0 IN ('NULL', 0.5)`: 'NULL' is no
    DECIMAL) raises an error that TRY does not catch; whether the planner reaches it can depend on the table's
    statistics (a filter pruned by min/max), which would make the error an oracle. Evaluated here, from the text
    alone, such a constant is refused whatever the data.
    """

    _REMEMBERED = 4096  # constants known to evaluate (the date guards, casts of literals): each costs a query

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._evaluates: set[str] = set()
        self._opened: duckdb.DuckDBPyConnection | None = None  # opened on first use: importing dpsql opens nothing

    @property
    def _con(self) -> duckdb.DuckDBPyConnection:
        """The sandbox; call with the lock held."""
        if self._opened is None:
            self._opened = sandbox.connect()
        return self._opened

    def evaluate(self, select: str) -> list[tuple]:
        """The rows of a SELECT over constants only, computed in the same empty sandbox."""
        with self._lock:
            return self._con.execute(select).fetchall()

    def check(self, node: exp.Expression, context: object) -> None:
        for part in constant_parts(node):
            text = part.sql("duckdb")
            if text in self._evaluates:
                continue
            with self._lock:
                try:
                    # IS NULL: the value is computed but never converted to Python (an INTERVAL beyond timedelta
                    # would raise OverflowError there, a traceback instead of a rejection).
                    self._con.execute(f"SELECT ({part.unalias().sql('duckdb')}) IS NULL").fetchall()
                except duckdb.Error as exc:
                    raise QueryRejected(f"{context}: {text} cannot be evaluated ({first_line(exc)})") from None
                if len(self._evaluates) < self._REMEMBERED:
                    self._evaluates.add(text)  # decided by the text alone, so it holds for every later query


# The one constant checker: every query's constants are evaluated, and its aggregates typed (written_types.py), in
# its sandbox. Locked: a server's sessions share it.
CONSTANTS = ConstantChecker()


def may_fail(node: exp.Expression, columns: Mapping[str, ColumnPolicy] | None = None) -> bool:
    """Whether the rewrite wraps `node` in TRY, as a second layer behind the type check: anything but a bare
    column or literal; given the table's `columns`, also anything but comparisons of numeric columns with each
    other and with integer literals or literals cast to DOUBLE (and AND, OR, NOT of those). DuckDB compares
    BIGINT and DOUBLE as DOUBLE, which cannot fail; a DECIMAL literal could make it cast the column to a
    DECIMAL that overflows on some rows, so it keeps its TRY. TRY cost a fifth of a filtered query's time."""
    if columns is not None and _numeric_comparisons(node, columns):
        return False
    return any(type(part) not in NEVER_FAILS for part in node.walk())


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _numeric_comparisons(node: exp.Expression, columns: Mapping[str, ColumnPolicy]) -> bool:
    node = node.unnest()
    if isinstance(node, exp.And | exp.Or):
        return _numeric_comparisons(node.this, columns) and _numeric_comparisons(node.expression, columns)
    if isinstance(node, exp.Not):
        return _numeric_comparisons(node.this, columns)
    if isinstance(node, _COMPARISONS):
        return all(_numeric_operand(side, columns) for side in (node.this, node.expression)) and any(
            isinstance(side.unnest(), exp.Column) for side in (node.this, node.expression))
    return False


def _numeric_operand(node: exp.Expression, columns: Mapping[str, ColumnPolicy]) -> bool:
    node = node.unnest()
    if isinstance(node, exp.Column):
        return node.name in columns and columns[node.name].type in (ColumnType.INT, ColumnType.FLOAT)
    if isinstance(node, exp.Neg):
        node = node.this
    if isinstance(node, exp.Cast) and node.to.this is exp.DataType.Type.DOUBLE:
        return isinstance(node.this, exp.Literal) and not node.this.is_string and bool(
            _NUMBER.fullmatch(node.this.name))
    return isinstance(node, exp.Literal) and not node.is_string and bool(_INTEGER.fullmatch(node.name)) and int(
        node.name) < 2 ** 63


# ASCII digits only; an integer of at most 19 of them (so int() is cheap and below Python's digit limit).
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")
_INTEGER = re.compile(r"[0-9]{1,19}")
