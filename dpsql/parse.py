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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpsql.errors import DataError, ProgrammingError, QueryRejected

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # it warns when it falls back to a raw Command

DIALECT = "duckdb"
_MAX_SQL_LENGTH = 100_000


@dataclass(frozen=True)
class ParsedQuery:
    sql: str
    tree: exp.Select


def parse(sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> ParsedQuery:
    if not isinstance(sql, str):
        raise ProgrammingError(f"the query must be a string, got {type(sql).__name__}")
    if not sql.strip():
        raise ProgrammingError("the query is empty")
    if len(sql) > _MAX_SQL_LENGTH:
        raise ProgrammingError(f"the query is longer than {_MAX_SQL_LENGTH} characters")
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise ProgrammingError(f"cannot parse the SQL: {_first_line(exc)}") from None
    except RecursionError:
        raise ProgrammingError("cannot parse the SQL: it is nested too deeply") from None
    if not statements:
        raise ProgrammingError("the query is empty")
    if len(statements) > 1:
        raise QueryRejected(f"send one statement at a time (got {len(statements)})")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        raise QueryRejected(f"only SELECT queries can be answered, not {_statement_kind(tree)}")
    for node in tree.walk():
        node.comments = None
    return ParsedQuery(sql, _bind(tree, parameters))


def _first_line(exc: Exception) -> str:
    text = str(exc).replace("\x1b[4m", "").replace("\x1b[0m", "")
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _statement_kind(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Command):
        return f"{str(tree.this).upper()} commands"
    if isinstance(tree, exp.SetOperation):
        return "UNION/INTERSECT/EXCEPT (set operations)"
    return f"{type(tree).__name__.upper()} statements"


def _bind(tree: exp.Select, parameters: Sequence[Any] | Mapping[str, Any] | None) -> exp.Select:
    placeholders = [node for node in tree.walk() if isinstance(node, exp.Placeholder | exp.Parameter)]
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
    for node, value in zip(placeholders, values, strict=True):
        node.replace(literal(value))
    return tree


def _placeholder_name(node: exp.Expression) -> str | None:
    name = node.this if isinstance(node, exp.Placeholder) else node.name
    if isinstance(name, exp.Expression):
        name = name.name
    return str(name) if name not in (None, "") else None


def literal(value: Any) -> exp.Expression:
    """A SQL literal node for one Python parameter value."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value) if value >= 0 else exp.Neg(this=exp.Literal.number(-value))
    if isinstance(value, float | decimal.Decimal):
        if not math.isfinite(value):
            raise DataError(f"parameter value {value!r} is not a finite number")
        text = repr(float(value)) if isinstance(value, float) else str(value)
        return exp.Literal.number(text) if value >= 0 else exp.Neg(this=exp.Literal.number(text.lstrip("-")))
    if isinstance(value, str):
        if "\x00" in value:
            raise DataError("a text parameter contains a NUL character")
        return exp.Literal.string(value)
    if isinstance(value, datetime.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, datetime.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    raise DataError(f"cannot bind a parameter of type {type(value).__name__}")
