"""Stage 1: SQL text and parameters in, one sqlglot SELECT tree out.

Parameters (`?`, `$1` or `:name`) are bound by replacing placeholder nodes with literal nodes in the tree, never
by pasting text. Comments are dropped so nothing the analyst wrote travels into the SQL that runs except the
parts the later stages vetted.
"""

from __future__ import annotations

import datetime
import decimal
import logging
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from dpsql.errors import DataError, ProgrammingError, QueryRejected, first_line
from dpsql.sql import temporal

_SQLGLOT_LOG = logging.getLogger("sqlglot")

class _QuietWhileParsing(logging.Filter):
    """Drops sqlglot's warnings raised inside dpsql's own parse call, in that thread only.

    sqlglot warns when it falls back to a raw Command (an analyst's `SET ...`, which dpsql refuses anyway) and
    the warning quotes the SQL. The host application's own use of sqlglot, and its logging setup, stay as they
    are: importing dpsql changes no logger level."""

    def __init__(self) -> None:
        super().__init__()
        self.active = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.active, "on", False)


_QUIET = _QuietWhileParsing()

DIALECT = "duckdb"
_MAX_SQL_LENGTH = 100_000
_TEXT_POSITION = "dpsql_text_position"  # meta key: where in the SQL text a placeholder starts
TEXT_PARAMETER = "dpsql_text_parameter"  # meta key: the TextParameter a literal stands for, typed by its context
PARAMETER_LABEL = "dpsql_parameter"  # meta key: how errors name a bound parameter ($1, :name, or its place)


@dataclass(frozen=True)
class TextParameter:
    """A parameter value typed as text (on the command line) whose SQL type its place in the query decides:
    the checker converts it to the type of the column it is compared with (dpsql.analysis.text_parameters)."""

    text: str
    # A stand-in while a statement is described before it is bound (the server's Describe): it takes any column's
    # type, with a value of that type, since the columns of a query depend on its parameters' types only.
    stand_in: bool = False


class _PositionedDuckDB(DuckDB):
    """DuckDB's dialect, with each placeholder remembering where it stands in the text.

    Positional `?` parameters bind in the order they are written, which no tree walk gives: the tree of
    `(a > ? AND b > ?) OR c < ?` meets the placeholders in another order, breadth-first or depth-first, and
    `LIMIT ?` sits wherever the Select node keeps it. So the parser records each placeholder's text offset.
    """

    class Parser(DuckDB.Parser):
        def _parse_placeholder(self) -> exp.Expression | None:
            start = self._curr.start if self._curr else None
            placeholder = super()._parse_placeholder()
            if placeholder is not None and start is not None:
                placeholder.meta[_TEXT_POSITION] = start
            return placeholder


@dataclass(frozen=True)
class ParsedQuery:
    sql: str
    tree: exp.Select
    # Set by normalisation (analysis/normalize.py) when it rewrote the select items: the outputs' names as the
    # written SQL gives them, which the rewritten items no longer spell.
    output_names: tuple[str, ...] | None = None


def parse(sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> ParsedQuery:
    if not isinstance(sql, str):
        raise ProgrammingError(f"the query must be a string, got {type(sql).__name__}")
    if not sql.strip():
        raise ProgrammingError("the query is empty")
    if len(sql) > _MAX_SQL_LENGTH:
        raise ProgrammingError(f"the query is longer than {_MAX_SQL_LENGTH} characters")
    if _QUIET not in _SQLGLOT_LOG.filters:
        _SQLGLOT_LOG.addFilter(_QUIET)
    _QUIET.active.on = True
    try:
        statements = _statements(sql)
    except ParseError as exc:
        raise ProgrammingError(f"cannot parse the SQL: {_parse_problem(exc)}") from None
    except TokenError:
        raise ProgrammingError("cannot parse the SQL: a quote, a quoted name, a comment or a $$ string is not "
                               "closed, or a character has no meaning in SQL") from None
    except RecursionError:
        raise ProgrammingError("cannot parse the SQL: it is nested too deeply") from None
    finally:
        _QUIET.active.on = False
    if not statements:
        raise ProgrammingError("the query is empty")
    if len(statements) > 1:
        raise QueryRejected(f"send one statement at a time (got {len(statements)})")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        raise QueryRejected(f"only SELECT queries can be answered, not {_statement_kind(tree)}")
    for node in tree.walk():
        if any(_META_COMMENT in comment.lower() for comment in node.comments or ()):
            # sqlglot reads such a comment into the node's meta, where the stages keep their own annotations
            # (sql/names.py marks them unforgeably as well): refused from the text, at no cost.
            raise QueryRejected("a comment with 'sqlglot.meta' is not accepted: it would annotate the query's "
                                "syntax tree; remove the comment")
        if isinstance(node, exp.Aliases):  # `x AS (a, b)`, or `f(x) (y)` read so: one value has one name
            raise QueryRejected(f"{node.sql(DIALECT)}: a list of names for one value is not supported; name it "
                                "with AS name")
        node.comments = None
    temporal.instants_in_utc(tree)
    return ParsedQuery(sql, _bind(tree, parameters))


_MISSING = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]+'>")
_TOKEN = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: \d+, col: \d+, start: \d+, end: \d+, "
                    r"comments: \[.*?\]>", re.DOTALL)


def _parse_problem(exc: ParseError) -> str:
    """sqlglot's first parse error in words, where it is and what stands there, without the parser's own names
    for its node classes and tokens (`<class 'sqlglot.expressions.query.Where'>`, `<Token ...>`)."""
    if not exc.errors:
        return first_line(exc)
    error = exc.errors[0]
    problem = _MISSING.sub("something is missing", error.get("description") or "not SQL")
    problem = _TOKEN.sub(lambda m: "the end of the query" if m.group(1) == "SENTINEL" else
                         f"'{' '.join(m.group(2).split())}'", problem)
    near = f", near '{' '.join(error['highlight'].split())}'" if error.get("highlight") else ""
    problem = problem[:1].lower() + problem[1:]
    return f"{problem} at line {error.get('line')}, column {error.get('col')}{near}"


_META_COMMENT = "sqlglot.meta"
_SELECT_TOP = re.compile(r"\s*SELECT\s+TOP\s+\d", re.IGNORECASE)


class _TopDuckDB(_PositionedDuckDB):
    """With TOP a keyword, as in T-SQL: `SELECT TOP 5 ...` is `SELECT ... LIMIT 5` (SmartNoise's corpus writes it).
    Only a query that fails to parse otherwise and starts so is read with it: as a keyword, TOP would break a
    column named top."""

    class Tokenizer(_PositionedDuckDB.Tokenizer):
        KEYWORDS: ClassVar[dict[str, TokenType]] = {**_PositionedDuckDB.Tokenizer.KEYWORDS, "TOP": TokenType.TOP}


def _statements(sql: str) -> list[exp.Expression]:
    try:
        return [s for s in sqlglot.parse(sql, read=_PositionedDuckDB) if s is not None]
    except ParseError:
        if not _SELECT_TOP.match(sql):
            raise
        return [s for s in sqlglot.parse(sql, read=_TopDuckDB) if s is not None]




def _statement_kind(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Command):
        return f"{str(tree.this).upper()} commands"
    if isinstance(tree, exp.SetOperation):
        return "UNION/INTERSECT/EXCEPT (set operations)"
    return f"{type(tree).__name__.upper()} statements"


def _bind(tree: exp.Select, parameters: Sequence[Any] | Mapping[str, Any] | None) -> exp.Select:
    placeholders = sorted((node for node in tree.walk() if isinstance(node, exp.Placeholder | exp.Parameter)),
                          key=_text_position)
    if not placeholders:
        if parameters:
            raise ProgrammingError(f"the query has no placeholders but {len(parameters)} parameters were given")
        return tree
    names = [_placeholder_name(p) for p in placeholders]
    if parameters is None:
        raise ProgrammingError(f"the query has {len(placeholders)} placeholders but no parameters were given")
    if isinstance(parameters, Mapping):
        values = []
        for name in names:
            if name is None or name.isdigit():
                raise ProgrammingError("named parameters were given but the query uses positional placeholders")
            if name not in parameters:
                raise ProgrammingError(f"no value was given for the parameter :{name}")
            values.append(parameters[name])
    elif isinstance(parameters, Sequence) and not isinstance(parameters, str | bytes):
        if any(name is not None and not name.isdigit() for name in names):
            raise ProgrammingError("the query uses named placeholders (:name): pass the parameters as a mapping")
        if all(name is not None for name in names):  # $1, $2: numbered
            indices = [int(name) - 1 for name in names]
            if any(i < 0 or i >= len(parameters) for i in indices):
                raise ProgrammingError(f"a numbered placeholder is out of range for {len(parameters)} parameters")
            values = [parameters[i] for i in indices]
        elif any(name is not None for name in names):
            raise ProgrammingError("do not mix ? and $n placeholders in one query")
        else:
            if len(parameters) != len(placeholders):
                raise ProgrammingError(f"the query has {len(placeholders)} placeholders but {len(parameters)} "
                                       "parameters were given")
            values = list(parameters)
    else:
        raise ProgrammingError(f"parameters must be a sequence or a mapping, not {type(parameters).__name__}")
    for position, (node, value) in enumerate(zip(placeholders, values, strict=True), start=1):
        name = _placeholder_name(node)  # how errors name the parameter: $n, :name, or its place among the ?s
        label = f"${name}" if name is not None and name.isdigit() else f":{name}" if name else str(position)
        try:
            bound = literal(value)
        except DataError as exc:
            raise DataError(f"parameter {label}: {exc}") from None
        bound.meta[PARAMETER_LABEL] = label
        node.replace(bound)
    return tree


def _text_position(node: exp.Expression) -> int:
    position = node.meta.get(_TEXT_POSITION)
    if position is None:  # every placeholder comes from the parser above; binding out of order is a wrong answer
        raise ProgrammingError(f"cannot tell where the placeholder {node.sql(DIALECT)} stands in the text")
    return position


def _placeholder_name(node: exp.Expression) -> str | None:
    name = node.this if isinstance(node, exp.Placeholder) else node.name
    if isinstance(name, exp.Expression):
        name = name.name
    return str(name) if name not in (None, "") else None


def literal(value: Any) -> exp.Expression:
    """A SQL literal node for one Python parameter value: exactly that value, or a DataError."""
    if isinstance(value, TextParameter):
        node = literal(value.text)
        node.meta[TEXT_PARAMETER] = value
        return node
    value = _exact_python_value(value)
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        _writable(value)
        return exp.Literal.number(value) if value >= 0 else exp.Neg(this=exp.Literal.number(-value))
    if isinstance(value, float | decimal.Decimal):
        text = repr(value) if isinstance(value, float) else str(value)
        return exp.Literal.number(text) if value >= 0 else exp.Neg(this=exp.Literal.number(text.lstrip("-")))
    if isinstance(value, str):
        if "\x00" in value:
            raise DataError("a text parameter contains a NUL character")
        return exp.Literal.string(str(value))
    if isinstance(value, datetime.datetime):
        try:
            value = temporal.utc(value)  # an aware datetime: its UTC time (sql/temporal.py)
        except OverflowError:
            raise DataError(f"the timestamp {value.isoformat()} is out of range in UTC") from None
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, datetime.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if isinstance(value, datetime.time):
        raise DataError("a time of day (datetime.time) has no column to be compared with: columns hold dates and "
                        "timestamps, not times; pass a datetime, or compare EXTRACT(hour FROM a timestamp column)")
    if isinstance(value, bytes | bytearray | memoryview):
        raise DataError("bytes have no column to be compared with: there are no binary columns; pass text (str)")
    raise DataError(f"cannot bind a parameter of type {_type_name(value)}: pass a number, text, a boolean, a date, "
                    "a datetime or None")


# Python refuses str() of an integer of over 4300 digits (a ValueError; a host may lower the limit to 640): one of
# more bits than this is beyond any integer type by far, and is refused before anything writes it out.
_WRITABLE_BITS = 2000


def _writable(value: int) -> None:
    if value.bit_length() > _WRITABLE_BITS:
        raise DataError(f"an integer of more than {_WRITABLE_BITS} bits (about 600 digits) is beyond any integer "
                        "type (128 bits at most)")


def parameters_text(parameters: Sequence[Any] | Mapping[str, Any] | None) -> str:
    """The parameters written out (repr), as the session's caches key a query's parameters; a DataError, as
    literal() gives, for an integer too long to write out."""
    values = parameters.values() if isinstance(parameters, Mapping) else \
        parameters if isinstance(parameters, list | tuple) else ()
    for value in values:
        if type(value) is int:
            _writable(value)
    return repr(parameters)


def _exact_python_value(value: Any) -> Any:
    """The plain Python value a parameter stands for, or a DataError: numpy scalars (what pandas passes) become
    the Python number they hold, and a value without an exact finite meaning (NaN, infinity, sNaN, a complex or
    a long double that a float would round) is refused rather than bound as something else."""
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, np.floating):
            number = float(value)
            if math.isfinite(number) and type(value)(number) != value:
                raise DataError(f"parameter value {value} ({_type_name(value)}) has no exact float value")
            value = number
        elif isinstance(value, np.str_):
            return str(value)
        else:
            raise DataError(f"cannot bind a parameter of type {_type_name(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(f"parameter value {value} is not a finite number")
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        raise DataError(f"parameter value {value} is not a finite number")
    return value


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
