"""Every DuckDB connection dpsql opens, opened one way: in memory, cut off from files, network and extensions, with
its configuration locked.

There are three: the engine's (the private tables), the constant checker's (no table at all) and post-processing's
(the noisy cells only). Should a query ever get past the checker with a file name, an ATTACH, an INSTALL or a SET in
it, DuckDB itself refuses: it cannot read or write a file, attach a database, install or load an extension (known
ones are not loaded behind the query's back either), and no setting can be changed back, since the configuration
is locked.

Some things must happen before the lock: options only read at startup (the engine's disabled optimizers, its
thread count), settings a connection needs for its own work (post-processing's division by zero), and the engine
reading its tables, which needs external access until they are loaded. `opened` runs its with-block for exactly
that, and locks the connection when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import duckdb

# Given when the database is opened. Extensions are never installed or loaded implicitly (a known function name
# in a query would otherwise fetch and load its extension), and no community extension can be loaded at all.
_STARTUP_SAFETY = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "allow_community_extensions": "false",
}
# Set once the connection is ready: from then on no file, no network, no attached database, no setting changed.
_LOCK = (
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)
SAFETY_OPTIONS = frozenset([*_STARTUP_SAFETY, "enable_external_access", "lock_configuration"])


@contextlib.contextmanager
def opened(config: Mapping[str, str] | None = None, database: str = ":memory:") -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB (or the database file being built as a prepared store) with every safety option, locked
    when the with-block ends.

    `config` holds the startup options the caller needs on top (it may not weaken a safety option); the block is
    where anything else that must precede the lock is done. Should the block raise, the connection is closed.
    """
    config = dict(config or {})
    weakened = sorted(SAFETY_OPTIONS & set(config))
    if weakened:
        raise ValueError(f"the sandbox sets {', '.join(weakened)} itself")
    con = duckdb.connect(database, config={**config, **_STARTUP_SAFETY})
    try:
        yield con
        for statement in _LOCK:
            con.execute(statement)
    except BaseException:
        con.close()
        raise


def connect(config: Mapping[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with every safety option, already locked: for a connection that needs nothing more."""
    with opened(config) as con:
        pass
    return con
