"""Stage 5: the DuckDB that holds the private tables, and the only place bounded SQL runs.

Loading happens once per engine, in the sandbox (sql/sandbox.py) before it is locked: engines/loading.py reads
each declared table from its source with the declared types and prepares it for contribution bounding, with an
empty twin of each prepared table for the dry run. Then external access is switched off and the configuration
locked: should a query ever get past the checker with a file name in it, DuckDB itself refuses to read, write,
attach or load anything.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
from sqlglot import exp

from dpsql.analysis.public_facts import PublicFacts
from dpsql.engines import store
from dpsql.engines.base import Engine, ReleasedTable
from dpsql.engines.cursors import CursorPool
from dpsql.engines.declared import DeclaredTables
from dpsql.engines.loading import TableLoader, portable_ranks
from dpsql.engines.progress import SILENT, Progress, duckdb_percent
from dpsql.engines.public_facts import DuckDBPublicFacts
from dpsql.engines.versions import data_version, file_versions
from dpsql.errors import ExecutionFailed, PolicyError, QueryRejected, first_line
from dpsql.policy import Policy, TablePolicy
from dpsql.sql import names, sandbox
from dpsql.sql.lossless import canonical_select, faithful
from dpsql.sql.names import TWIN_SCHEMA, prepared_table
from dpsql.sql.parse import DIALECT

_EXACT_CACHE = 512
# DuckDB optimizer rules that move analyst code out of the TRY written around it, or out of the CASE branch that
# guards it, so that it runs on rows (or at a place) where its failure is no longer absorbed:
# - in_clause: `e IN (c1, ..., cn)` with several constants becomes a MARK join; `e` is computed in a projection
#   below the join, outside its TRY;
# - common_subexpressions: an expression used twice in one projection (two keys, a key and an aggregated value, a
#   CASE condition and its branch) is computed once in a projection below, outside every TRY and every CASE.
# Both were shown to leak one row per query (benchmarks/attacks/side_channels.py); tests/test_engine_plans.py reads the
# physical plans of bounded queries and fails if analyst code is found outside its TRY again.
# - compressed_materialization: group keys are narrowed to a smaller type when the column's statistics (its min
#   and max over the stored table) allow, so the plan, and its time, followed one row's extreme value (red team 7).
# - join_order, build_side_probe_side, statistics_propagation: the plan followed the stored tables' statistics, so
#   one person's rows chose it: the joins' order and build sides by the tables' sizes and distinct counts, and whole
#   operators kept or dropped by what min/max proved (a part of the filtered cap left out while no unit had more than
#   m + 4 rows, a NULL test dropped while a column held no NULL). In 275 of 624 (query, person) pairs of the joins
#   fuzzer one added person changed the plan, so the time moved with the work of everyone's rows, beyond what the
#   per-person bound covers (analysis/person_work.py); with the three off, in none. Joins run in the order
#   relation.py writes them (the private table first, capped, each further table built on), the order the bound is
#   derived in.
DISABLED_OPTIMIZERS = ("in_clause", "common_subexpressions", "compressed_materialization", "join_order",
                       "build_side_probe_side", "statistics_propagation")
# Startup options on top of the sandbox's own: set before any query, and locked with the rest of the configuration.
# perfect_ht_threshold 0: DuckDB chose a perfect hash table for a GROUP BY whose key columns' min/max (over the whole
# stored table, so one row could move them) fit in 2**12 cells, a hash table otherwise: one person's extreme value
# flipped the plan and the query's time (red team 7: 18 against 20-21 ms over 2M rows). Always a hash table now; a
# key of declared values still groups by its small code (10M rows: 45 ms against 108 by text).
_STARTUP_CONFIG = {
    "disabled_optimizers": ",".join(DISABLED_OPTIMIZERS),
    "perfect_ht_threshold": "0",
}


class DuckDBEngine(Engine):
    """A sandboxed in-memory DuckDB holding the policy's tables, prepared for bounded queries."""

    answers_probes = True

    def __init__(self, policy: Policy, *, bounding_seed: int | None = None, threads: int | None = None,
                 progress: Progress = SILENT) -> None:
        """Load the policy's tables (or attach its prepared store, built first if need be), telling `progress` of
        each long step."""
        self.time_limit = policy.time_limit
        config = dict(_STARTUP_CONFIG)
        if threads is not None:
            config["threads"] = str(threads)
        self._lock = threading.Lock()
        self._exact: dict[str, str] = {}  # bounded SQL -> the SQL that runs it with exact columns
        self._policy_name = policy.path.name
        files = file_versions(policy)  # taken before the load: see versions.data_version
        self.store_built = False  # whether this engine had to build the policy's prepared store
        if policy.memory_limit is not None:
            config["memory_limit"] = policy.memory_limit
        # Beyond its memory limit (the policy's, or DuckDB's default of 80% of the machine's memory) DuckDB spills to
        # a folder only the steward can read; its own default is `.tmp` in the working directory, made with the
        # process's umask (readable by others), and enable_external_access does not stop that (red team).
        config["temp_directory"] = str(_spill_folder(policy))
        with sandbox.opened(config) as con:  # locked when the tables are loaded
            self._con = con
            if policy.store is not None:
                self.data_version = self._attach_store(policy, files, bounding_seed, config, progress)
                token = store.build_token(con)
            else:
                token = None
                con.execute(f"CREATE SCHEMA {TWIN_SCHEMA}")
                salt = store.new_salt(bounding_seed)
                with duckdb_percent(con, progress) as percent:
                    loader = TableLoader(con, policy.path.name, portable_ranks(bounding_seed), progress, percent)
                    for table in policy.tables.values():
                        loader.load(table, salt)
                # Database sources' versions as read in the snapshots their rows came from.
                self.data_version = data_version(policy, {**files, **loader.versions})
            self.ranking, self.ranking_persistent = store.ranking(
                self.data_version, bounding_seed, store.load_sql(policy, portable_ranks(bounding_seed)), token)
            # A second client whose default schema holds empty tables of the same names and columns: the very SQL
            # that will run on the data is first run there, where no row can influence what happens. It has a
            # lock of its own: a dry run (a Describe) never waits for a query on the data.
            self._twin = con.cursor()
            self._twin_lock = threading.Lock()
            database, schema = con.execute("SELECT current_database(), current_schema()").fetchone()
            self._twin.execute(f"USE {_quote(database)}.{TWIN_SCHEMA}")
        # Queries on the data run at the same time, each on a cursor of its own with its own time limit.
        self._data = CursorPool(con, policy.time_limit, [f"USE {_quote(database)}.{_quote(schema)}"])
        # Queries of public tables only (and IN lists read from them) run on a database of their own that holds
        # nothing else: whatever got past the public query's checks, there is no private row there to reach.
        # Without public tables it is opened, empty, on first use (a query naming no table): a DuckDB instance
        # costs about 25 MB and 20 ms, which a process asking private questions only never needs.
        self._public_lock = threading.Lock()  # held while the public database is opened
        self._public_config = config
        self._public: tuple[duckdb.DuckDBPyConnection, CursorPool] | None = None
        public_tables = [table for table in policy.tables.values() if table.public]
        if public_tables:
            with sandbox.opened(config) as public:
                for table in public_tables:
                    self._copy_public(table, public)
            self._public = (public, CursorPool(public, policy.time_limit))
        self._facts = DuckDBPublicFacts(policy, lambda sql: self._con.execute(sql).fetchall(), self._lock,
                                        self._public_values)
        self._policy = policy
        self._declared: DeclaredTables | None = None  # made on the first column probe
        self._declared_lock = threading.Lock()

    def _public_cursors(self) -> CursorPool:
        """The public database's cursors, each under the time limit (the database opened on first use)."""
        with self._public_lock:
            if self._public is None:
                public = sandbox.connect(self._public_config)
                self._public = (public, CursorPool(public, self.time_limit))
            return self._public[1]

    def _public_values(self, sql: str) -> list[tuple[Any, ...]]:
        """An IN list's values, read by analyst-written SQL at check time: under the time limit, as any query of
        public tables (an interrupted read fails, and the IN is left for the checker to refuse)."""
        with self._public_cursors().taken() as (public, watchdog), watchdog.running():
            return public.execute(sql).fetchall()

    def _attach_store(self, policy: Policy, files: dict[str, bytes], bounding_seed: int | None,
                      config: dict[str, str], progress: Progress) -> str:
        """Use the prepared store (engines/store.py), built first if it is missing or was built for other data: its
        database, attached read-only, becomes the default one, where the rewrite's table names are found. Returns
        the data version it holds."""
        assert policy.store is not None
        build_config = {k: v for k, v in config.items() if k != "disabled_optimizers"}
        if policy.prepare_memory_limit is not None:  # a build sorts the whole table: it may get more than a query
            build_config["memory_limit"] = policy.prepare_memory_limit
        wanted, self.store_built, version = store.ensure(policy, files, bounding_seed, build_config, progress)
        path = exp.Literal.string(str(policy.store)).sql(DIALECT)
        self._con.execute(f"ATTACH {path} AS {names.STORE} (READ_ONLY)")
        self._con.execute(f"USE {names.STORE}")
        if not store.matches(self._con, wanted):  # replaced by a build for other data since `ensure` looked
            raise PolicyError(f"the prepared store {policy.store} changed while it was opened: run the query again")
        return version

    def _copy_public(self, table: TablePolicy, public: duckdb.DuckDBPyConnection) -> None:
        """A public table, as loaded (typed, cleaned), copied into the public database."""
        name = prepared_table(table.name)
        described = self._con.execute(f"DESCRIBE {name}").fetchall()
        public.execute(f"CREATE TABLE {name} ({', '.join(f'{_quote(c[0])} {c[1]}' for c in described)})")
        rows = self._con.execute(f"SELECT * FROM {name}").fetchall()
        if rows:
            public.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' for _ in described)})", rows)

    def public_facts(self) -> PublicFacts:
        return self._facts

    def dry_run(self, sql: str) -> list[str]:
        """Run a bounded query on the empty twin tables: type errors surface here, decided by the schema alone.

        The column types also decide, once per SQL text, how `run` fetches the columns (see `_fetch_exact`)."""
        with self._twin_lock:
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
        with self._on_data() as cursor:
            return self._fetch_exact(cursor, sql)

    def analyzed_plan(self, sql: str) -> str:
        """DuckDB's profile of a bounded query run on the data (EXPLAIN ANALYZE, as JSON): its operators, each with
        the rows it produced. It reads the data and is never part of an answer: it is for the tests and benchmarks
        that count the work one person's rows cause (benchmarks/attacks/differential_joins.py). It runs as `run`
        does; EXPLAIN ANALYZE profiles the one statement, with no setting changed, under the locked configuration."""
        with self._on_data() as cursor:
            return str(cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchall()[0][1])

    @contextlib.contextmanager
    def _on_data(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor of the data's for one statement: under the time limit, in a transaction always rolled back,
        any DuckDB failure turned into the one generic ExecutionFailed."""
        try:
            with self._data.taken() as (cursor, watchdog):
                cursor.execute("BEGIN TRANSACTION")
                try:
                    with watchdog.running():
                        yield cursor
                finally:
                    cursor.execute("ROLLBACK")
        except duckdb.Error:
            raise ExecutionFailed() from None

    def interrupt(self, owner: int | None = None) -> None:
        self._data.interrupt(owner)
        if self._public is not None:
            self._public[1].interrupt(owner)

    def run_public(self, sql: str, released: Sequence[ReleasedTable] = ()) -> tuple[list[str], list[str],
                                                                                    list[tuple[Any, ...]]]:
        """Run a query of public tables (and of the released answers given) as written, in the public database.
        Its errors are about public data only, so they are shown. A released answer is a temporary table there for
        the query's transaction, which is always rolled back: nothing of it stays."""
        with self._public_cursors().taken() as (public, watchdog):
            public.execute("BEGIN TRANSACTION")
            try:
                for table in released:
                    _create_released(public, table)
                with watchdog.running():
                    return _public_answer(public, sql)
            finally:
                public.execute("ROLLBACK")

    def describe_declared(self, sql: str) -> tuple[list[str], list[str]]:
        with self._declared_lock:
            if self._declared is None:
                self._declared = DeclaredTables(self._policy)
        return self._declared.describe(sql)

    def describe_public(self, sql: str) -> tuple[list[str], list[str]]:
        """The column names and types of a query of public tables (a wire Describe), from binding it: nothing runs
        (a Describe is free and unscheduled, so it must not do a query's work)."""
        with self._public_cursors().taken() as (public, _):
            try:
                relation = public.sql(sql)
            except duckdb.Error as exc:
                raise QueryRejected(f"the query of public tables failed: {first_line(exc)}") from None
            return list(relation.columns), [str(kind) for kind in relation.types]

    def _fetch_exact(self, cursor: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
        """The rows of `sql`, every column Python cannot hold exactly fetched as its DuckDB text (lossless.py).

        Which columns is decided by their types: from the dry run (the session always dry-runs first), or else
        from the result's description before any value is converted."""
        exact = self._exact.get(sql)
        if exact is not None:
            return cursor.execute(exact).fetchall()
        result = cursor.execute(sql)
        types = [str(d[1]) for d in result.description or ()]
        if all(faithful(kind) for kind in types):
            return result.fetchall()
        return cursor.execute(canonical_select(sql, types)).fetchall()

    def close(self) -> None:
        self._data.close()
        with self._twin_lock:
            self._twin.close()
        with self._lock:
            self._con.close()
        with self._public_lock:
            if self._public is not None:
                public, cursors = self._public
                cursors.close()
                public.close()
        with self._declared_lock:
            if self._declared is not None:
                self._declared.close()


def _public_answer(cursor: duckdb.DuckDBPyConnection, sql: str) -> tuple[list[str], list[str], list[tuple]]:
    try:
        result = cursor.execute(sql)
        rows = result.fetchall()
    except duckdb.Error as exc:
        raise QueryRejected(f"the query of public tables failed: {first_line(exc)}") from None
    return [d[0] for d in result.description], [str(d[1]) for d in result.description], rows


def _create_released(con: duckdb.DuckDBPyConnection, table: ReleasedTable) -> None:
    columns = ", ".join(f"{_quote(name)} {kind}" for name, kind in table.columns)
    con.execute(f"CREATE TEMP TABLE {_quote(table.name)} ({columns})")
    width = len(table.columns)
    for start in range(0, len(table.rows), 500):
        batch = table.rows[start:start + 500]
        values = ", ".join("(" + ", ".join("?" * width) + ")" for _ in batch)
        con.execute(f"INSERT INTO {_quote(table.name)} VALUES {values}", [v for row in batch for v in row])


def _quote(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(DIALECT)


def _spill_folder(policy: Policy) -> Path:
    """Where DuckDB writes what does not fit in its memory limit: a folder of mode 0700 beside the ledger (it holds
    pieces of the data)."""
    folder = policy.budget.ledger.parent / f"{policy.path.stem}.spill"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    return folder
