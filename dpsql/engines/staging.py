"""A database source's rows copied into a DuckDB staging table (names.staged_source), as read in one snapshot with
the source's version (engines/database.py); the loader then prepares them from there as a file's (engines/loading.py).

In a store build, a table with an append key (`source.append_key`: rows only ever appended, with ever larger keys)
keeps its staging table in the store, with what it held (names.APPENDED: its source, its largest key, its row count
and the checksum of its rows). The next build reads only the rows past that key, once the rows up to it show in the
database the very count and checksum the store holds; any other change (a row updated, deleted, or appended with a
smaller key) shows there, and every row is read again. The server still reads the kept rows to check them, but they
neither travel nor are parsed again. Everything after the staging table (checks, ranks, the prepared tables) is
built anew from all its rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import duckdb
from sqlglot import exp

from dpsql.engines.database import Counted, DatabaseTable, SourceColumn, SourceFailed, readable
from dpsql.engines.progress import Progress
from dpsql.policy import TablePolicy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT


def stage(con: duckdb.DuckDBPyConnection, table: TablePolicy, store: Path | None, progress: Progress) -> bytes:
    """Copy `table`'s declared columns into its staging table, and return the source's version as read in the
    snapshot of those rows. `store`: the prepared store being built (the older one, if it is there, may hold rows
    to keep); None: an engine's own database, where the staging table is temporary."""
    source = table.source
    with DatabaseTable(source) as database:
        declared = _declared(table, database.columns())
        appended = store is not None and source.append_key is not None
        origin = repr((database.credentials.shown, source.table, sorted((name, c.name, c.type_name, str(c.arrow))
                                                                        for name, c in declared.items())))
        kept = _kept(con, store, table.name, origin, database, declared) if appended else None
        counted = None
        if kept is not None:
            counted = kept + database.counted(declared, (kept.largest, None))
        elif appended:
            counted = database.counted(declared)
        version = database.version(declared, counted)
        stream = database.rows(declared, kept.largest if kept is not None else None)
        staged, arrow = names.staged_source(table.name), f"__dp_arrow_{table.name}"
        past = f" past the {kept.rows:,} rows kept" if kept is not None and progress.detailed else ""
        with progress.step(f"copying {source.shown}{past}") as step:
            con.register(arrow, stream.reader())
            try:
                if kept is not None:
                    con.execute(f"CREATE TABLE {staged} AS SELECT * FROM {names.PREVIOUS_STORE}.{staged}")
                    con.execute(f"INSERT INTO {staged} SELECT * FROM {arrow}")
                else:
                    con.execute(f"CREATE {'' if appended else 'TEMP '}TABLE {staged} AS SELECT * FROM {arrow}")
            except Exception:  # DuckDB's message, or the stream's own exception: `failure` says which
                raise stream.failure or SourceFailed("the rows could not be copied") from None
            finally:
                con.unregister(arrow)
                with contextlib.suppress(duckdb.Error):
                    con.execute(f"DETACH DATABASE IF EXISTS {names.PREVIOUS_STORE}")
            if progress.detailed:
                step.result = f"{stream.rows:,} rows"
    if counted is not None:
        con.execute(f"CREATE TABLE IF NOT EXISTS {names.APPENDED} (table_name VARCHAR, origin VARCHAR, "
                    "largest VARCHAR, count BIGINT, checksum VARCHAR)")
        con.execute(f"INSERT INTO {names.APPENDED} VALUES (?, ?, ?, ?, ?)",
                    [table.name, origin, counted.largest, counted.rows, str(counted.checksum)])
    return version.encode()


def kept_in_store(table: TablePolicy) -> bool:
    """Whether a store keeps `table`'s staging table, for its next build."""
    return table.source.kind == "database" and table.source.append_key is not None


def _declared(table: TablePolicy, found: Mapping[str, SourceColumn]) -> dict[str, SourceColumn]:
    """The source's columns the policy declares, each checked to be readable as its declared type."""
    missing = [name for name in table.columns if name not in found]
    if missing:
        raise SourceFailed(f"the source has no column '{missing[0]}' (it has: {', '.join(sorted(found))})",
                           f"columns.{missing[0]}")
    for name, column in table.columns.items():
        if not readable(found[name].arrow, column.type):
            raise SourceFailed(f"is {found[name].type_name} in the source, which is not read as "
                               f"{column.type.value}: declare another type, or convert it in the source's query",
                               f"columns.{name}")
    return {name: found[name] for name in table.columns}


def _kept(con: duckdb.DuckDBPyConnection, store: Path | None, name: str, origin: str, database: DatabaseTable,
          declared: Mapping[str, SourceColumn]) -> Counted | None:
    """The rows the older store holds of this table, if the database still holds exactly them up to their largest
    key (the store is left attached as names.PREVIOUS_STORE for the copy); None: read every row."""
    if store is None or not store.exists():
        return None
    try:
        con.execute(f"ATTACH {exp.Literal.string(str(store)).sql(DIALECT)} AS {names.PREVIOUS_STORE} (READ_ONLY)")
        found = con.execute(f"SELECT largest, count, checksum FROM {names.PREVIOUS_STORE}.{names.APPENDED} WHERE "
                            "table_name = ? AND origin = ?", [name, origin]).fetchall()
    except duckdb.Error:  # not a store this DuckDB reads, or one without such rows: everything is read
        return None
    if len(found) != 1 or found[0][0] is None:
        return None
    held = Counted(found[0][1], int(found[0][2]), found[0][0])
    now = database.counted(declared, (None, held.largest))
    return held if (now.rows, now.checksum) == (held.rows, held.checksum) else None
