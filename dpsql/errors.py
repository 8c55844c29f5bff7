"""The exception hierarchy: PEP 249's classes, with dpsql's own beneath them.

Every error dpsql raises on purpose is one of these, so the CLI and the DB-API can turn it into one clear line.
Messages name the problem from the SQL and the policy only; none may carry a value read from the private data.
"""

from __future__ import annotations


class Warning(Exception):
    """PEP 249: important warnings."""


class Error(Exception):
    """PEP 249: base class of every dpsql error."""


class InterfaceError(Error):
    """PEP 249: misuse of the interface itself (a closed cursor, a bad parameter count)."""


class DatabaseError(Error):
    """PEP 249: errors related to the database."""


class DataError(DatabaseError):
    """PEP 249: problems with processed data (a bad parameter value)."""


class OperationalError(DatabaseError):
    """PEP 249: errors in the operation of the database, not the programmer's fault."""


class IntegrityError(DatabaseError):
    """PEP 249: relational integrity; dpsql is read-only and never raises it."""


class InternalError(DatabaseError):
    """PEP 249: the engine failed internally."""


class ProgrammingError(DatabaseError):
    """PEP 249: the SQL is wrong: a syntax error, an unknown table or column."""


class NotSupportedError(DatabaseError):
    """PEP 249: a method or SQL construct that dpsql does not offer."""


class PolicyError(OperationalError):
    """The steward's policy is broken: it names the table, the key and the problem."""


class QueryRejected(NotSupportedError):
    """The query cannot be answered privately. Decided from the SQL and the policy alone; costs nothing."""


class BudgetExhausted(OperationalError):
    """The query would spend more privacy budget than remains. Nothing was released or charged."""


class LedgerError(OperationalError):
    """The budget ledger cannot be read or written; dpsql refuses to answer rather than answer for free."""


class ExecutionFailed(OperationalError):
    """The engine failed while running a query on the data.

    The message is the same whatever the data, and the query stays charged: it ran on the data, so whether it
    failed is itself information about the data.
    """

    MESSAGE = ("the query failed while running on the data. It was charged: whether it fails could depend on the "
               "data")

    def __init__(self, message: str = MESSAGE) -> None:
        super().__init__(message)


__all__ = [
    "BudgetExhausted",
    "DataError",
    "DatabaseError",
    "Error",
    "ExecutionFailed",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "LedgerError",
    "NotSupportedError",
    "OperationalError",
    "PolicyError",
    "ProgrammingError",
    "QueryRejected",
    "Warning",
]
