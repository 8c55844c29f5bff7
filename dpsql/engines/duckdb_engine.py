"""Stage 5: the DuckDB that holds the private tables, and the only place bounded SQL runs.

Loading happens once per engine. Each declared table is read from its source with the declared types, only the
declared columns are kept (an undeclared column is invisible), NaN becomes NULL, rows without a privacy unit and
rows with NULL in a column declared `nullable = false` are dropped. Then the bounding is prepared: a secret
per-row hash (`__dp_key`), each row's rank within its unit by that hash (`__dp_rank`), the unit's row count
(`__dp_n`), and each bounded column's fixed-point integer (`__dp_q_<col>`). Queries then only filter, so they do
not sort the table per person each time.

After loading, external access is switched off and the configuration locked: should a query ever get past the
checker with a file name in it, DuckDB itself refuses to read, write, attach or load anything.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import duckdb
from sqlglot import exp

from dpsql.dp.fixedpoint import fixed_point
from dpsql.errors import ExecutionFailed, PolicyError, QueryRejected, first_line
from dpsql.policy import ColumnType, Policy, TablePolicy
from dpsql.sql import names
from dpsql.sql.lossless import canonical_select, faithful
from dpsql.sql.names import RANK, ROW_KEY, TWIN_SCHEMA, UNIT, UNIT_ROWS, prepared_table, quantized_column
from dpsql.sql.parse import DIALECT

_SANDBOX = (
    "SET enable_external_access = false",
    "SET lock_configuration = true",
)
_EXACT_CACHE = 512
# DuckDB optimizer rules that move analyst code out of the TRY written around it, or out of the CASE branch that
# guards it, so that it runs on rows (or at a place) where its failure is no longer absorbed:
# - in_clause: `e IN (c1, ..., cn)` with several constants becomes a MARK join; `e` is computed in a projection
#   below the join, outside its TRY;
# - common_subexpressions: an expression used twice in one projection (two keys, a key and an aggregated value, a
#   CASE condition and its branch) is computed once in a projection below, outside every TRY and every CASE.
# Both were shown to leak one row per query (benchmarks/attacks/side_channels.py); tests/test_engine_plans.py reads the
# physical plans of bounded queries and fails if analyst code is found outside its TRY again.
DISABLED_OPTIMIZERS = ("in_clause", "common_subexpressions")
_STARTUP_CONFIG = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "allow_community_extensions": "false",
    # Set at startup, before any query, and locked with the rest of the configuration (see _SANDBOX).
    "disabled_optimizers": ",".join(DISABLED_OPTIMIZERS),
}


class Engine:
    """A sandboxed in-memory DuckDB holding the policy's tables, prepared for bounded queries."""

    def __init__(self, policy: Policy, *, bounding_seed: int | None = None, threads: int | None = None) -> None:
        self.time_limit = policy.time_limit
        config = dict(_STARTUP_CONFIG)
        if threads is not None:
            config["threads"] = str(threads)
        self._lock = threading.Lock()
        self._exact: dict[str, str] = {}  # bounded SQL -> the SQL that runs it with exact columns
        self._policy_name = policy.path.name
        self._con = duckdb.connect(":memory:", config=config)
        # The salt makes the per-unit choice of rows unpredictable; a fixed one is for tests only.
        salt = bounding_seed if bounding_seed is not None else secrets.randbits(62)
        try:
            self._con.execute(f"CREATE SCHEMA {TWIN_SCHEMA}")
            for table in policy.tables.values():
                self._load(table, salt)
            # A second client whose default schema holds empty tables of the same names and columns: the very SQL
            # that will run on the data is first run there, where no row can influence what happens.
            self._twin = self._con.cursor()
            database = self._con.execute("SELECT current_database()").fetchone()[0]
            self._twin.execute(f"USE {_quote(database)}.{TWIN_SCHEMA}")
            for statement in _SANDBOX:
                self._con.execute(statement)
            self._watchdog = _Watchdog(self._con, policy.time_limit)
        except BaseException:
            self._con.close()
            raise

    def _load(self, table: TablePolicy, salt: int) -> None:
        found = self._source_columns(table, self._source(table, typed=False))
        missing = [name for name in table.columns if name not in found]
        if missing:
            self._fail(table, f"columns.{missing[0]}", f"the source has no column '{missing[0]}' (it has: "
                                                       f"{', '.join(sorted(found))})")
        source = self._source(table)
        cleaned = ", ".join(f"{_clean(name, c.type, c.text_length)} AS {_quote(name)}"
                            for name, c in table.columns.items())
        conditions = [f"{_quote(n)} IS NOT NULL" for n, c in table.columns.items() if not c.nullable]
        if table.privacy_unit is not None:
            conditions.append(f"{_quote(table.privacy_unit)} IS NOT NULL")
            unit = _quote(table.privacy_unit)
        else:
            unit = "row_number() OVER ()"
        row_hash = f"hash({', '.join(_quote(n) for n in table.columns)}, {salt})"
        # 32-bit columns: a fixed-point bound is below 2**30, and no unit has 2**31 rows.
        quantized = [f"CAST({fixed_point(c.interval).centered(exp.column(name)).sql(DIALECT)} AS INTEGER) AS "
                     f"{quantized_column(name)}" for name, c in table.columns.items() if c.bounded]
        ranks = (f"CAST(row_number() OVER (PARTITION BY {UNIT} ORDER BY {ROW_KEY}) AS INTEGER) AS {RANK}, "
                 f"CAST(count(*) OVER (PARTITION BY {UNIT}) AS INTEGER) AS {UNIT_ROWS}") if not table.row_privacy \
            else f"1 AS {RANK}, 1 AS {UNIT_ROWS}"
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        # The conditions test the cleaned columns (NaN already NULL), not the raw ones.
        cleaned_rows = f"SELECT * FROM (SELECT {cleaned} FROM {source}) {where}"
        keyed = f"SELECT *, {unit} AS {UNIT}, {row_hash} AS {ROW_KEY} FROM ({cleaned_rows})"
        prepared = f"SELECT *, {', '.join([ranks, *quantized])} FROM ({keyed})"
        try:
            self._con.execute(f"CREATE TABLE {prepared_table(table.name)} AS {prepared}")
        except duckdb.Error as exc:
            self._fail(table, "source", f"cannot load {table.source.pattern!r} with the declared column types: "
                                        f"{self._column_hint(table)} ({type(exc).__name__})")
        self._con.execute(f"CREATE TABLE {TWIN_SCHEMA}.{prepared_table(table.name)} AS "
                          f"SELECT * FROM {prepared_table(table.name)} LIMIT 0")
        if table.source.kind == "duckdb":  # the copy is made: the steward's database file is not needed any more
            self._con.execute(f"DETACH {names.attached_source(table.name)}")

    def _source(self, table: TablePolicy, typed: bool = True) -> str:
        path = exp.Literal.string(table.source.pattern).sql(DIALECT)
        if table.source.kind == "csv" and not typed:
            return f"read_csv({path}, header = true, all_varchar = true)"
        if table.source.kind == "csv":
            types = ", ".join(f"{exp.Literal.string(n).sql(DIALECT)}: '{c.type.duckdb}'"
                              for n, c in table.columns.items())
            return f"read_csv({path}, header = true, types = {{{types}}})"
        if table.source.kind == "parquet":
            return f"read_parquet({path})"
        alias = names.attached_source(table.name)
        attached = {row[0] for row in self._con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        if alias in attached:
            return f"{alias}.{_quote(table.source.table)}"
        try:
            self._con.execute(f"ATTACH {path} AS {alias} (READ_ONLY)")
        except duckdb.Error as exc:
            self._fail(table, "source", f"cannot open the DuckDB database ({type(exc).__name__})")
        return f"{alias}.{_quote(table.source.table)}"

    def _source_columns(self, table: TablePolicy, source: str) -> dict[str, str]:
        try:
            described = self._con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        except duckdb.Error as exc:
            self._fail(table, "source", f"cannot read {table.source.pattern!r} ({first_line(exc)})")
        return {row[0].lower(): row[1] for row in described}

    def _fail(self, table: TablePolicy, key: str, problem: str) -> None:
        raise PolicyError(f"policy {self._policy_name}: table '{table.name}', key '{key}': {problem}")

    def _column_hint(self, table: TablePolicy) -> str:
        """Name the first declared column whose values do not all read as its declared type.

        This message goes to whoever loads the policy and depends on the data; it names a column, never a value
        or a row, and it is the same for every query, so it cannot be used to probe individual rows.
        """
        source = self._source(table, typed=False)
        for name, column in table.columns.items():
            unreadable = self._con.execute(
                f"SELECT count(*) FROM {source} WHERE {_quote(name)} IS NOT NULL AND "
                f"TRY_CAST({_quote(name)} AS {column.type.duckdb}) IS NULL").fetchone()[0]
            if unreadable:
                return f"column '{name}' has values that are not {column.type.value}"
        return "the source could not be read"

    def dry_run(self, sql: str) -> list[str]:
        """Run a bounded query on the empty twin tables: type errors surface here, decided by the schema alone.

        The column types also decide, once per SQL text, how `run` fetches the columns (see `_fetch_exact`)."""
        with self._lock:
            try:
                cursor = self._twin.execute(sql)
                cursor.fetchall()
                types = [str(d[1]) for d in cursor.description]
            except duckdb.Error as exc:
                raise QueryRejected(f"the query does not type-check: {first_line(exc)}") from None
            if len(self._exact) >= _EXACT_CACHE:
                self._exact.pop(next(iter(self._exact)))
            self._exact[sql] = canonical_select(sql, types)
        return types

    def physical_plan(self, sql: str) -> str:
        """DuckDB's physical plan of a query on the data, as JSON, under the engine's locked configuration."""
        with self._lock:
            return str(self._con.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchall()[0][1])

    def run(self, sql: str) -> list[tuple[Any, ...]]:
        """Run a bounded query on the data. Any failure gets the same message, whatever the data.

        The query runs in a transaction that is always rolled back: only SELECTs built by the rewrite come here,
        but should anything else ever slip through, it could not change the tables for later queries. A query
        that runs longer than the policy's time limit is interrupted, and fails like any other.
        """
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                with self._watchdog.running():
                    return self._fetch_exact(sql)
            except duckdb.Error:
                raise ExecutionFailed() from None
            finally:
                self._con.execute("ROLLBACK")

    def _fetch_exact(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of `sql`, every column Python cannot hold exactly fetched as its DuckDB text (lossless.py).

        Which columns is decided by their types: from the dry run (the session always dry-runs first), or else
        from the result's description before any value is converted."""
        exact = self._exact.get(sql)
        if exact is not None:
            return self._con.execute(exact).fetchall()
        cursor = self._con.execute(sql)
        types = [str(d[1]) for d in cursor.description or ()]
        if all(faithful(kind) for kind in types):
            return cursor.fetchall()
        return self._con.execute(canonical_select(sql, types)).fetchall()

    def close(self) -> None:
        with self._lock:
            self._watchdog.close()
            self._con.close()


class _Watchdog:
    """Interrupts the connection when a query runs longer than `seconds` (DuckDB then raises InterruptException).

    One thread per engine, waiting on a condition, so a query pays no thread start. The interrupt is sent with the
    condition held, and a query ends by clearing its deadline under the same lock: once `running` is left, no
    interrupt for that query is in flight (and DuckDB forgets an interrupt that finds no query running). The
    thread holds the connection only weakly and stops when the watchdog is closed, collected, or at exit: a thread
    still waiting at exit would keep DuckDB's objects alive through interpreter shutdown.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self._seconds = seconds
        self._changed = threading.Condition()
        self._state = _WatchState()
        self._thread = threading.Thread(target=_watch, args=(self._changed, self._state, weakref.ref(con)),
                                        name="dpsql-time-limit", daemon=True)
        _THREADS[self._thread] = (self._changed, self._state)
        self._thread.start()
        self._stop = weakref.finalize(self, _stop, self._changed, self._state)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._changed:
            self._state.deadline = time.monotonic() + self._seconds
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._state.deadline = None

    def close(self) -> None:
        self._stop()
        self._thread.join()


class _WatchState:
    deadline: float | None = None  # time.monotonic() at which the running query is interrupted
    closed = False


_THREADS: dict[threading.Thread, tuple[threading.Condition, _WatchState]] = {}


def _stop(changed: threading.Condition, state: _WatchState) -> None:
    with changed:
        state.closed = True
        changed.notify()


@atexit.register
def _stop_all() -> None:
    for thread, (changed, state) in list(_THREADS.items()):
        _stop(changed, state)
        thread.join()


def _watch(changed: threading.Condition, state: _WatchState, con: weakref.ref) -> None:
    try:
        with changed:
            while not state.closed:
                if state.deadline is None:
                    changed.wait()
                elif time.monotonic() < state.deadline:
                    changed.wait(state.deadline - time.monotonic())
                else:
                    connection = con()
                    if connection is not None:
                        connection.interrupt()
                    del connection
                    state.deadline = None
    finally:
        _THREADS.pop(threading.current_thread(), None)


def _quote(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(DIALECT)


def _clean(name: str, ctype: ColumnType, max_length: int) -> str:
    column = f"CAST({_quote(name)} AS {ctype.duckdb})"
    if ctype is ColumnType.FLOAT:
        # NaN sorts above every number, so it would slip through comparisons and clamps: it becomes NULL.
        return f"CASE WHEN isnan({column}) THEN NULL ELSE {column} END"
    if ctype is ColumnType.TEXT:
        # Longer text is cut to the declared maximum, which the checker's per-row cost bound relies on.
        return f"left({column}, {max_length})"
    return column


