"""Parameters typed as text on the command line take the type their place in the query needs.

`dpsql query "... WHERE age > ?" -p 40` receives the text "40". Bound as text it would be compared with an
integer column, and a value such as "abc" would be NULL on every row: a noisy zero, charged. So the CLI binds each
value as a `TextParameter`, and this pass, which runs in the checker once names are resolved, converts it to the
type of the column it is compared with (as PostgreSQL types an untyped literal), or refuses the query with a
DataError before anything runs or is charged. Where no column gives the type (LIMIT, a THEN branch, arithmetic),
the text is a whole number, else an exact decimal, else text. Numbers stay exact: "0.1" is the decimal 0.1.
"""

from __future__ import annotations

import datetime
import decimal

from sqlglot import exp

from dpsql.errors import DataError
from dpsql.policy import ColumnPolicy, ColumnType, TablePolicy
from dpsql.sql import temporal
from dpsql.sql.comparisons import compared_column
from dpsql.sql.parse import PARAMETER_LABEL, TEXT_PARAMETER, literal

_BOOLEANS = {"true": True, "t": True, "yes": True, "y": True, "1": True,
             "false": False, "f": False, "no": False, "n": False, "0": False}


def type_text_parameters(tree: exp.Expression, table: TablePolicy) -> None:
    """Replace, in place, every text parameter of `tree` by a literal of the type its context needs."""
    for node in list(tree.find_all(exp.Literal)):
        parameter = node.meta.get(TEXT_PARAMETER)
        if parameter is None:
            continue
        text = parameter.text
        column = _compared_column(node, table)
        label = f"{node.meta[PARAMETER_LABEL]} ({text!r})" if PARAMETER_LABEL in node.meta else repr(text)
        if column is None:
            node.replace(literal(_guess(text)))
        else:
            node.replace(literal(_STAND_INS[column.type] if parameter.stand_in else
                                 _typed(text, column.type, column.name, label)))


def _compared_column(node: exp.Expression, table: TablePolicy) -> ColumnPolicy | None:
    """The declared column the parameter is compared with, if it is compared with a bare column."""
    column = compared_column(node)
    return table.columns.get(column.name) if column is not None else None


def _typed(text: str, kind: ColumnType, column: str, label: str) -> object:
    try:
        if kind in (ColumnType.INT, ColumnType.FLOAT):  # 40.5 compares with an int column as it should
            value = _number(text.strip())
            if value is None:
                raise ValueError
            return value
        if kind is ColumnType.BOOL:
            return _BOOLEANS[text.strip().lower()]
        if kind in (ColumnType.DATE, ColumnType.TIMESTAMP):
            return _temporal(text, kind)
        return text
    except (ValueError, KeyError, decimal.InvalidOperation):
        raise DataError(f"parameter {label} is compared with the {kind.value} column {column!r} but is not "
                        f"{_ARTICLE[kind]}") from None


def _temporal(text: str, kind: ColumnType) -> datetime.date:
    """A date or timestamp as drivers send them (sql/temporal.py), its wall-clock value: for a date column, the date
    when no time of day (or midnight) was written, else the timestamp, which the checker compares with the date as
    DuckDB does (the date at midnight)."""
    read = temporal.read(text)
    if read is None:
        raise ValueError
    if kind is ColumnType.DATE and (not read.timed or read.at_midnight):
        return read.value.date()
    return read.value


_STAND_INS = {ColumnType.INT: 1, ColumnType.FLOAT: 1.0, ColumnType.TEXT: "1", ColumnType.BOOL: True,
              ColumnType.DATE: datetime.date(2000, 1, 1), ColumnType.TIMESTAMP: datetime.datetime(2000, 1, 1)}
_ARTICLE = {ColumnType.INT: "a finite number", ColumnType.FLOAT: "a finite number",
            ColumnType.BOOL: "true or false", ColumnType.DATE: "a date (YYYY-MM-DD, or a timestamp)",
            ColumnType.TIMESTAMP: "a timestamp (YYYY-MM-DD HH:MM:SS)", ColumnType.TEXT: "text"}


def _guess(text: str) -> object:
    number = _number(text)
    return number if number is not None else text


def _number(text: str) -> int | decimal.Decimal | None:
    """The exact number the text spells (a whole number as int), or None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return None
    return value if value.is_finite() else None
