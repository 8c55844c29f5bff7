"""The exception hierarchy: PEP 249's classes, with dpsql's own beneath them.

Every error dpsql raises on purpose is one of these, so the CLI and the DB-API can turn it into one clear line.
Messages name the problem from the SQL and the policy only; none may carry a value read from the private data.
"""

from __future__ import annotations

import builtins
from fractions import Fraction
from typing import ClassVar


class Warning(builtins.Warning):
    """PEP 249: important warnings. A subclass of Python's own Warning (itself an Exception, as PEP 249 asks), so
    that the DB-API can issue it with `warnings.warn` as well as list it in `Cursor.messages`."""


class NoRowsReleased(Warning):
    """A grouped query came back with no rows (and was charged): no group passed partition selection, or HAVING,
    LIMIT or OFFSET removed every released one. The message says which, and what to change."""


class Error(Exception):
    """PEP 249: base class of every dpsql error.

    `exit_code` is the CLI's exit status for the class, `label` the word its one-line message starts with, and
    `sqlstate` the PostgreSQL error code a wire front end reports: the front ends read them from here, never
    from class names.
    """

    exit_code: ClassVar[int] = 1  # the policy, the ledger or the engine: the steward's side
    label: ClassVar[str] = "error"
    sqlstate: ClassVar[str] = "XX000"  # internal_error


class InterfaceError(Error):
    """PEP 249: misuse of the interface itself (a closed cursor, a bad parameter count)."""

    sqlstate = "55000"  # object_not_in_prerequisite_state: a closed connection or cursor
    exit_code = 4


class DatabaseError(Error):
    """PEP 249: errors related to the database."""


class DataError(DatabaseError):
    """PEP 249: problems with processed data (a bad parameter value)."""

    sqlstate = "22023"  # invalid_parameter_value
    exit_code = 4


class OperationalError(DatabaseError):
    """PEP 249: errors in the operation of the database, not the programmer's fault."""

    sqlstate = "58000"  # system_error


class IntegrityError(DatabaseError):
    """PEP 249: relational integrity; dpsql is read-only and never raises it."""

    sqlstate = "23000"  # integrity_constraint_violation


class InternalError(DatabaseError):
    """PEP 249: the engine failed internally."""


class ProgrammingError(DatabaseError):
    """PEP 249: the SQL is wrong: a syntax error, an unknown table or column."""

    sqlstate = "42000"  # syntax_error_or_access_rule_violation
    exit_code = 4


class NotSupportedError(DatabaseError):
    """PEP 249: a method or SQL construct that dpsql does not offer."""

    sqlstate = "0A000"  # feature_not_supported
    exit_code = 4


class PolicyError(OperationalError):
    """The steward's policy is broken: it names the table, the key and the problem."""

    sqlstate = "F0000"  # config_file_error


class QueryRejected(NotSupportedError):
    """The query cannot be answered privately. Decided from the SQL and the policy alone; costs nothing."""

    label = "rejected"


class BudgetExhausted(OperationalError):
    """The query would spend more privacy budget than remains. Nothing was released or charged."""

    sqlstate = "53000"  # insufficient_resources
    exit_code = 3
    label = "refused"


class LedgerError(OperationalError):
    """The budget ledger cannot be read or written; dpsql refuses to answer rather than answer for free."""

    sqlstate = "58030"  # io_error


class CannotListen(OperationalError):
    """`dpsql serve` cannot listen on its address: the port is in use, needs privileges, or the host is unknown."""

    exit_code = 69  # sysexits EX_UNAVAILABLE: a service the command needs is not available


class NoTerminal(InterfaceError):
    """A command would ask a question (a password), and there is no terminal to ask it on."""

    exit_code = 66  # sysexits EX_NOINPUT: the input the command needs cannot be read


class ServerSetupError(OperationalError):
    """The server's own files (the TLS certificate and key) cannot be used."""

    exit_code = 78  # sysexits EX_CONFIG: a configuration error


class ExecutionFailed(OperationalError):
    """The engine failed while running a query on the data.

    The message is the same whatever the data, and the query stays charged: it ran on the data, so whether it
    failed is itself information about the data.
    """

    MESSAGE = ("the query failed while running on the data. It was charged: whether it fails could depend on the "
               "data")

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


def shown(value: object) -> str:
    """A number (or text) the user gave, written as they would write it in a message, never as Python's repr: an
    exact rational is its decimal (-1, not Fraction(-1, 1)), text is quoted."""
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (a library's message may go on with hints and a caret
    diagram), without terminal colour codes; the exception's class name when the message is empty."""
    text = str(exc).replace("\x1b[4m", "").replace("\x1b[0m", "").strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "BudgetExhausted",
    "CannotListen",
    "DataError",
    "DatabaseError",
    "Error",
    "ExecutionFailed",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "LedgerError",
    "NoRowsReleased",
    "NoTerminal",
    "NotSupportedError",
    "OperationalError",
    "PolicyError",
    "ProgrammingError",
    "QueryRejected",
    "ServerSetupError",
    "Warning",
]
