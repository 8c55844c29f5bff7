"""dpsql: a differentially private SQL proxy.

Ordinary SQL in; noisy answers with 95% intervals out; every person in the data protected by a privacy budget
that each answer spends. See README.md and docs/. The public API is the DB-API 2.0 module interface (`connect` and the
PEP 249 names below), `PrivateSession` for direct use, and `load_policy`.
"""

from dpsql.errors import (
    BudgetExhausted,
    DatabaseError,
    DataError,
    Error,
    ExecutionFailed,
    IntegrityError,
    InterfaceError,
    InternalError,
    LedgerError,
    NoRowsReleased,
    NotSupportedError,
    OperationalError,
    PolicyError,
    ProgrammingError,
    QueryRejected,
    Warning,
)
from dpsql.frontends.dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Connection,
    Cursor,
    Date,
    DateFromTicks,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)
from dpsql.policy import Policy, load_policy
from dpsql.session import PrivateResult, PrivateSession

__version__ = "0.1.0"

__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "BudgetExhausted", "Connection", "Cursor",
    "DataError", "DatabaseError", "Date", "DateFromTicks", "Error", "ExecutionFailed", "IntegrityError",
    "InterfaceError", "InternalError", "LedgerError", "NoRowsReleased", "NotSupportedError", "OperationalError",
    "Policy", "PolicyError", "PrivateResult", "PrivateSession", "ProgrammingError", "QueryRejected", "Time",
    "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning", "apilevel", "connect", "load_policy",
    "paramstyle", "threadsafety",
]
