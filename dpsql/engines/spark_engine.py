"""Stage 5 on Spark: the private tables loaded and prepared by Spark, the bounded SQL run there (`[engine] kind =
"spark"` in the policy; `pip install 'dpsql[spark]'`, Java 17 from the system).

The engine runs the very SQL the rewrite builds, transpiled by engines/spark_sql.py, which refuses (before the
charge, from the SQL text alone) whatever it cannot run with DuckDB's exact meaning. The dry run stays on DuckDB:
an in-memory, locked DuckDB holds empty tables of the prepared tables' columns, so the column types the session
reads (and post-processes with) are DuckDB's, decided by the schema alone, exactly as with the DuckDB engine.

Tables are read by Spark (CSV as text, then cast with ANSI mode on, so a value that is not of its declared type
fails the load as DuckDB's typed read does; or Parquet), prepared by bounding.prepared_rows with the portable row
key (both engines rank a unit's rows alike for the same salt) and cached in Spark's memory. Queries run with ANSI
mode off (a row's bad cast is NULL, as TRY makes it in DuckDB) on a session of their own whose only tables are the
prepared temporary views; SQL on files is switched off, the UI too, and the policy can size Spark but not change
any of that (policy.SPARK_SETTINGS).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.analysis.public_facts import PublicFacts
from dpsql.engines import spark_store, store
from dpsql.engines.base import Engine, ReleasedTable
from dpsql.engines.csv_shape import csv_problem
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.engines.spark_sql import refuse, to_spark
from dpsql.engines.versions import data_version, file_versions
from dpsql.errors import ExecutionFailed, PolicyError, QueryRejected, first_line
from dpsql.policy import ColumnType, EngineChoice, Policy, TablePolicy
from dpsql.rewrite.bounding import prepared_rows, varying_units
from dpsql.sql import sandbox
from dpsql.sql.names import prepared_table
from dpsql.sql.parse import DIALECT

# Set by dpsql, never by the policy: semantics the translation relies on, and the sandbox.
_FIXED_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.ansi.enabled": "false",
    "spark.sql.runSQLOnFiles": "false",  # no parquet.`/path` tables
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.sql.caseSensitive": "false",
}
_DEFAULT_CONF = {"spark.sql.shuffle.partitions": "8", "spark.driver.bindAddress": "127.0.0.1"}
_SPARK_TYPES = {ColumnType.INT: "BIGINT", ColumnType.FLOAT: "DOUBLE", ColumnType.TEXT: "STRING",
                ColumnType.BOOL: "BOOLEAN", ColumnType.DATE: "DATE"}
# Spark's names of the source types the translation knows, as DuckDB names them.
_FROM_SPARK = {"TINYINT": "TINYINT", "SMALLINT": "SMALLINT", "INT": "INTEGER", "BIGINT": "BIGINT", "FLOAT": "FLOAT",
               "DOUBLE": "DOUBLE", "STRING": "VARCHAR", "BOOLEAN": "BOOLEAN", "DATE": "DATE"}
# The DuckDB types of the public tables' columns (as loaded from the declared types), as pyspark.sql.types.
_SPARK_FIELDS = {"BIGINT": "LongType", "DOUBLE": "DoubleType", "VARCHAR": "StringType", "BOOLEAN": "BooleanType",
                 "DATE": "DateType"}
_INTEGER_RESULTS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"}
# TIMESTAMP: only DATE_TRUNC of a date makes one (no source column is a timestamp on Spark): a midnight.
_RESULT_TYPES = _INTEGER_RESULTS | {"BOOLEAN", "DOUBLE", "VARCHAR", "DATE", "TIMESTAMP", '"NULL"', "NULL"}
_shared_lock = threading.Lock()


def spark_session(choice: EngineChoice) -> Any:
    """The process's one SparkSession (a SparkContext is one per JVM), built for the policy's master and settings;
    a second policy asking for another master is refused."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise PolicyError('[engine] kind = "spark" needs PySpark: pip install \'dpsql[spark]\' (and Java 17)') from None
    from pyspark import SparkContext

    with _shared_lock:
        running = SparkContext._active_spark_context
        if running is not None and running.master != choice.master:
            raise PolicyError(f"[engine] master: this process already runs Spark on {running.master}")
        builder = SparkSession.builder.master(choice.master).appName("dpsql")
        for key, value in {**_DEFAULT_CONF, **dict(choice.spark), **_FIXED_CONF}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")  # Spark's warnings are not the analyst's business
        return session


class SparkEngine(Engine):
    """The policy's private tables in Spark, prepared for bounded queries; DuckDB's empty twin for the dry run."""

    # No later-rows tables: their lambdas over lists would need a translation of their own; the filtered cap ranks
    # the later rows by its window instead (the same rows: tests/test_spark_engine.py compares the two engines).
    lists_earlier_rows = False

    def __init__(self, policy: Policy, *, bounding_seed: int | None = None) -> None:
        self.time_limit = policy.time_limit
        self.data_version = data_version(policy, file_versions(policy))
        self._policy_name = policy.path.name
        self._lock = threading.Lock()
        self._spark = spark_session(policy.engine).newSession()  # temporary views of its own
        for key, value in _FIXED_CONF.items():
            if not key.startswith("spark.ui") and key != "spark.sql.catalogImplementation":
                self._spark.conf.set(key, value)
        self._stop: Callable[[], None] | None = None  # stops the query running (time limit, interrupt())
        self._translated: dict[str, tuple[str, list[str]]] = {}  # bounded SQL -> (Spark SQL, DuckDB types)
        self._schema: dict[str, dict[str, str]] = {}
        self._cached: list[Any] = []
        self.store_built = False  # whether this engine had to build the policy's prepared store
        salt = store.new_salt(bounding_seed)
        # A Parquet store keeps no build token: without a fixed seed, this engine's ranking is its own.
        self.ranking, self.ranking_persistent = store.ranking(
            self.data_version, bounding_seed, store.load_sql(policy, portable=True, listed=False) + "|spark")
        private = [t for t in policy.tables.values() if not t.public]
        for table in private:
            for name, column in table.columns.items():
                if column.type not in _SPARK_TYPES:
                    self._fail(table, f"columns.{name}", f"{column.type.value} columns are not supported on Spark")
        if policy.store is None:
            frames = {t.name: self._prepared(t, salt, lambda frame: frame.persist().count()) for t in private}
            self._cached = list(frames.values())
        else:
            load_sql = store.load_sql(policy, portable=True, listed=False)
            frames = self._from_store(policy.store, private, spark_store.identity(
                self.data_version, bounding_seed, self._spark.version, load_sql), salt)
        # The public tables are DuckDB's (loaded, typed and cleaned as the DuckDB engine does), which answers the
        # queries of public tables and the facts that bound joins with them; Spark joins the very same rows, copied.
        public = {t.name: t for t in policy.tables.values() if t.public}
        self._public: DuckDBEngine | None = None
        if public:
            self._public = DuckDBEngine(dataclasses.replace(policy, tables=public, store=None))
        with sandbox.opened() as twin:
            for table in private:
                self._register(table, frames[table.name], twin)
            for table in public.values():
                self._copy_public(table, twin)
            self._twin = twin

    def _from_store(self, path: Path, private: list[TablePolicy], wanted: store.Identity, salt: int) -> dict[str, Any]:
        """The prepared tables read from the Parquet store (engines/spark_store.py), built first if it is missing or
        was built for other data."""
        if not spark_store.ready(path, wanted):
            writers = {}
            for table in private:
                def write(target: Path, table: TablePolicy = table) -> None:
                    self._prepared(table, salt, lambda frame: frame.write.mode("error").parquet(str(target)))
                writers[prepared_table(table.name)] = write
            spark_store.build(path, wanted, writers)
            self.store_built = True
        return {t.name: self._spark.read.parquet(str(spark_store.table_path(path, prepared_table(t.name))))
                for t in private}

    def _prepared(self, table: TablePolicy, salt: int, materialize: Callable[[Any], object]) -> Any:
        """The table's prepared rows as a Spark DataFrame, materialized (cached, or written to the store) while ANSI
        mode is on, so that a value that is not of its declared type fails the load."""
        source_view = f"__dp_source_{uuid.uuid4().hex}"
        self._spark.conf.set("spark.sql.ansi.enabled", "true")
        try:
            source_types = self._source(table, source_view)
            rows = prepared_rows(table, exp.to_table(source_view), salt, portable=True)
            prepared = self._spark.sql(to_spark(rows.sql(DIALECT), {source_view: source_types}, trusted=True))
            materialize(prepared)
        except PolicyError:
            raise
        except QueryRejected as exc:  # a cast of the source's type the translation cannot make exactly
            self._fail(table, "source", str(exc))
        except Exception:  # Spark's own message may quote a row: never shown
            self._fail_shape(table)
            self._fail(table, "source", f"cannot load {table.source.pattern!r} with the declared column types: "
                                        f"{self._column_hint(table)}")
        finally:
            self._spark.conf.set("spark.sql.ansi.enabled", "false")
            self._spark.catalog.dropTempView(source_view)
        return prepared

    def _register(self, table: TablePolicy, prepared: Any, twin: Any) -> None:
        """The prepared rows as the view the rewrite reads, its empty twin in DuckDB, and the per_unit check."""
        name = prepared_table(table.name)
        prepared.createOrReplaceTempView(name)
        empty = exp.select(*[exp.alias_(exp.cast(exp.null(), _duckdb_type(c.type)), exp.to_identifier(n, quoted=True))
                             for n, c in table.columns.items()]).limit(0).subquery("__dp_empty")
        twin.execute(f"CREATE TABLE {name} AS {prepared_rows(table, empty, 0, portable=True).sql(DIALECT)}")
        self._schema[name] = {row[0]: row[1] for row in twin.execute(f"DESCRIBE {name}").fetchall()}
        self._check_per_unit(table, name)

    def _copy_public(self, table: TablePolicy, twin: Any) -> None:
        """A public table's rows, as the DuckDB engine loaded them, as a Spark view (and its empty twin). A table
        with a column of a type Spark does not take (a timestamp) stays DuckDB's only: queries of it are answered
        there, and a join with it is refused (spark_sql: not one of the tables)."""
        from pyspark.sql import types

        assert self._public is not None
        name = prepared_table(table.name)
        columns, kinds, rows = self._public.run_public(f"SELECT * FROM {name}")
        spark_types = [_SPARK_FIELDS.get(kind.upper()) for kind in kinds]
        if None in spark_types:
            return
        schema = types.StructType([types.StructField(c, getattr(types, t)()) for c, t in zip(columns, spark_types,
                                                                                              strict=True)])
        frame = self._spark.createDataFrame(rows, schema).persist()
        frame.createOrReplaceTempView(name)
        self._cached.append(frame)
        described = ", ".join(f"{_quoted(c).sql(DIALECT)} {k}" for c, k in zip(columns, kinds, strict=True))
        twin.execute(f"CREATE TABLE {name} ({described})")
        self._schema[name] = dict(zip(columns, kinds, strict=True))

    def public_facts(self) -> PublicFacts | None:
        return self._public.public_facts() if self._public is not None else None

    def _check_per_unit(self, table: TablePolicy, name: str) -> None:
        """A column declared per_unit must have one value in each unit, as DuckDB's load checks (engines/loading.py):
        the rewrite then caps before a filter of such columns."""
        if table.row_privacy:
            return
        for column in table.columns.values():
            if column.per_unit:
                check = to_spark(varying_units(table, name, column).sql(DIALECT), self._schema, trusted=True)
                if self._spark.sql(check).collect()[0][0]:
                    self._fail(table, f"columns.{column.name}", "declared per_unit = true, but some unit has "
                                                               "different values (or NULL and a value) in it")

    def _source(self, table: TablePolicy, raw_view: str) -> dict[str, str]:
        """Register the table's source as `raw_view`, with the declared columns only, and return their DuckDB types,
        which the prepared rows' casts to the declared types are translated from (spark_sql.py: a cast it cannot
        make exactly as DuckDB does, such as Parquet text to a number, fails the load). CSV is read as text and
        cast here, in Spark SQL under ANSI mode, so that a value not of its type fails the load as in DuckDB's
        typed read (Spark SQL on this engine's session: a DataFrame's cast would follow the process's active
        session's ANSI setting instead)."""
        kind = table.source.kind
        if kind == "csv":
            raw = self._csv(table)
        elif kind == "parquet":
            raw = self._spark.read.parquet(table.source.pattern)
        else:
            self._fail(table, "source", "a DuckDB database file is not supported on Spark (use CSV or Parquet)")
        found = {field.name.lower(): field.dataType.simpleString() for field in raw.schema.fields}
        missing = [name for name in table.columns if name not in found]
        if missing:
            self._fail(table, f"columns.{missing[0]}", f"the source has no column '{missing[0]}'")
        raw.createOrReplaceTempView(f"{raw_view}_file")
        if kind == "parquet":
            self._refuse_fractions(table, f"{raw_view}_file", found)
        if kind == "csv":
            types = {name: _SPARK_TYPES[column.type] for name, column in table.columns.items()}
        else:
            types = {name: found[name] for name in table.columns}
        columns = [(_integer_text(name) if kind == "csv" and types[name] == "BIGINT" else _cast_sql(name, types[name]))
                   + f" AS {_quoted(name).sql('spark')}" for name in table.columns]
        self._spark.sql(f"SELECT {', '.join(columns)} FROM {raw_view}_file").createOrReplaceTempView(raw_view)
        self._spark.catalog.dropTempView(f"{raw_view}_file")
        duckdb_types = {}
        for name, kind_name in types.items():
            duckdb_type = _FROM_SPARK.get(kind_name.upper())
            if duckdb_type is None:
                self._fail(table, f"columns.{name}", f"the source's type {kind_name} is not supported on Spark")
            duckdb_types[name] = duckdb_type
        return duckdb_types

    def _csv(self, table: TablePolicy, mode: str = "FAILFAST") -> Any:
        """A CSV source as text columns. FAILFAST: a line with more or fewer fields than the header fails the load,
        as in DuckDB (Spark's default would drop the extra field or read a missing one as NULL)."""
        return self._spark.read.options(header=True, escape='"', inferSchema=False, mode=mode).csv(
            table.source.pattern)

    def _fail_shape(self, table: TablePolicy) -> None:
        """After Spark failed to load a CSV source: fail naming the file and line that is malformed, if one is (the
        DuckDB engine's check, engines/csv_shape.py)."""
        if table.source.kind == "csv":
            problem = csv_problem(table.source.pattern, table.columns)
            if problem is not None:
                self._fail(table, "source", problem)

    def _column_hint(self, table: TablePolicy) -> str:
        """The first declared column of a CSV source with a value that does not read as its type (Spark's message,
        which may quote a row, is never shown; nor is a value here)."""
        if table.source.kind == "csv":
            view = f"__dp_hint_{uuid.uuid4().hex}"
            with contextlib.suppress(Exception):  # the generic message follows
                self._csv(table, "PERMISSIVE").createOrReplaceTempView(view)
                for name, column in table.columns.items():
                    raw = _quoted(name).sql("spark")
                    check = (f"SELECT COUNT(*) FROM {view} WHERE {raw} IS NOT NULL AND "
                             f"try_cast({raw} AS {_SPARK_TYPES[column.type]}) IS NULL")
                    if self._spark.sql(check).collect()[0][0]:
                        self._spark.catalog.dropTempView(view)
                        return f"column '{name}' has values that are not {column.type.value} (or out of its range)"
            self._spark.catalog.dropTempView(view)
        return "Spark could not read every value as its declared type"

    def _refuse_fractions(self, table: TablePolicy, view: str, found: dict[str, str]) -> None:
        """A Parquet float or decimal column declared int loads only when every value is whole (as on DuckDB:
        engines/exact_values.py): Spark's cast would round 2.5 to 2. Names the column, never a value."""
        for name, column in table.columns.items():
            source = found[name].lower()
            if column.type is not ColumnType.INT or not source.startswith(("double", "float", "decimal")):
                continue
            value = _quoted(name).sql("spark")
            check = (f"SELECT COUNT(*) FROM {view} WHERE {value} IS NOT NULL AND (isnan({value}) OR "
                     f"abs({value}) = double('Infinity') OR {value} <> floor({value}))")
            if self._spark.sql(check).collect()[0][0]:
                self._fail(table, f"columns.{name}", "holds a number that is not an integer, which would be "
                                                     "rounded: correct the file or declare the column float")

    def _fail(self, table: TablePolicy, key: str, problem: str) -> None:
        raise PolicyError(f"policy {self._policy_name}: table '{table.name}', key '{key}': {problem}")

    def dry_run(self, sql: str) -> list[str]:
        """The column types, from DuckDB's empty twin tables; and the Spark SQL, translated and analysed by Spark
        (which reads no row to do it): anything either refuses is a rejection that costs nothing."""
        with self._lock:
            try:
                cursor = self._twin.execute(sql)
                cursor.fetchall()
                types = [str(d[1]) for d in cursor.description]
            except Exception as exc:
                raise QueryRejected(f"the query does not type-check: {first_line(exc)}") from None
            # DECIMAL too: Spark's decimal arithmetic chooses other scales than DuckDB's (1.5 against 1.50).
            unsupported = [t for t in types if t.upper() not in _RESULT_TYPES]
            if unsupported:
                raise refuse(f"a result column of type {unsupported[0]}")
            spark_sql = to_spark(sql, self._schema)
            try:
                self._spark.sql(spark_sql)
            except Exception as exc:
                raise refuse(f"Spark cannot analyse the translated query ({type(exc).__name__})") from None
            self._translated[sql] = (spark_sql, types)
        return types

    def run(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows on Spark, under the time limit (the job group is cancelled); any failure is ExecutionFailed."""
        if sql not in self._translated:
            self.dry_run(sql)
        spark_sql, types = self._translated[sql]
        with self._lock:
            context = self._spark.sparkContext
            group = f"dpsql-{uuid.uuid4().hex}"
            stopped = threading.Event()

            def stop() -> None:  # a job not started yet is not cancelled: the flag discards its result then
                stopped.set()
                context.cancelJobGroup(group)

            timer = threading.Timer(self.time_limit, stop)
            self._stop = stop
            try:
                context.setJobGroup(group, "dpsql query", interruptOnCancel=True)
                timer.start()
                rows = self._spark.sql(spark_sql).collect()
                if stopped.is_set():
                    raise ExecutionFailed()
                return [tuple(_value(v, t) for v, t in zip(row, types, strict=True)) for row in rows]
            except Exception:
                raise ExecutionFailed() from None
            finally:
                timer.cancel()
                self._stop = None

    def run_public(self, sql: str, released: Sequence[ReleasedTable] = ()) -> tuple[list[str], list[str],
                                                                                    list[tuple[Any, ...]]]:
        """A query of public tables only: on the DuckDB engine that holds them, as on the DuckDB engine."""
        return self._public_side().run_public(sql, released)

    def describe_public(self, sql: str) -> tuple[list[str], list[str]]:
        return self._public_side().describe_public(sql)

    def _public_side(self) -> DuckDBEngine:
        if self._public is None:
            raise refuse("queries of public tables, where the policy declares none")
        return self._public

    def interrupt(self, owner: int | None = None) -> None:
        stop = self._stop  # one query at a time: whoever asks, it is that one
        if stop is not None:
            stop()

    def close(self) -> None:
        with self._lock:
            for frame in self._cached:
                with contextlib.suppress(Exception):
                    frame.unpersist()
            for name in self._schema:
                with contextlib.suppress(Exception):
                    self._spark.catalog.dropTempView(name)
            self._twin.close()
            if self._public is not None:
                self._public.close()


def _quoted(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True))


def _cast_sql(name: str, spark_type: str) -> str:
    return exp.cast(_quoted(name), exp.DataType.build(spark_type, dialect="spark")).sql("spark")


# A number in decimal notation, as DuckDB reads one for an integer column (engines/exact_values.py), without its
# underscores and hexadecimal forms: whole digits, fraction digits, exponent. Character classes, not backslashes
# (which Spark's string literals would escape).
_DECIMAL_TEXT = "^[+-]?([0-9]*)(?:[.]([0-9]*))?(?:[eE]([+-]?[0-9]+))?$"


def _integer_text(name: str) -> str:
    """A CSV cell (text) read as BIGINT as DuckDB reads it: a plain integer as Spark's cast reads it; a decimal
    spelling whose value is an integer ('17000.0', '1e3', '-0.0', '1.5e1': PUMS's income is written '17000.0') as
    that integer, through an exact DECIMAL; anything else through Spark's cast, which under the load's ANSI mode
    fails ('1.5', whose value is not an integer, fails the load on DuckDB too, engines/exact_values.py). Exactness
    is decided on the digits, as DuckDB's load decides it: the value is w f * 10^(e - len(f)), an integer when its
    last len(f) - e digits are zeros. DuckDB's underscores and hexadecimal spellings fail the load on Spark."""
    cell = f"trim({_quoted(name).sql('spark')})"

    def part(group: int) -> str:
        return f"regexp_extract({cell}, '{_DECIMAL_TEXT}', {group})"

    digits = f"concat({part(1)}, {part(2)})"
    significant = f"length(trim(TRAILING '0' FROM {digits}))"
    places = f"(length({part(2)}) - coalesce(CAST(nullif({part(3)}, '') AS INT), 0))"
    exact = f"({places} <= 0 OR length({digits}) - {significant} >= {places} OR {significant} = 0)"
    decimal_spelling = f"({cell} RLIKE '{_DECIMAL_TEXT}' AND {cell} RLIKE '[0-9]' AND {cell} RLIKE '[.eE]')"
    return (f"CASE WHEN {decimal_spelling} AND {exact} THEN CAST(CAST({cell} AS DECIMAL(38, 0)) AS BIGINT) "
            f"ELSE {_cast_sql(name, 'BIGINT')} END")


def _duckdb_type(kind: ColumnType) -> str:
    return kind.duckdb


def _value(value: Any, duckdb_type: str) -> Any:
    """A Spark value as the DuckDB engine gives it for that DuckDB type: integers as int (Spark's DECIMAL(38, 0)
    sums included), a DATE or TIMESTAMP as DuckDB's text of it (sql/lossless.py: DuckDB's engine fetches them as
    text). A timestamp is a TIMESTAMP_NTZ (spark_sql: DATE_TRUNC), read without a time zone, at midnight: DuckDB
    writes it 'YYYY-MM-DD HH:MM:SS' as isoformat does (a fraction of a second, which DuckDB writes otherwise, cannot
    come from a date)."""
    kind = duckdb_type.upper()
    if value is None:
        return None
    if kind in _INTEGER_RESULTS:
        if isinstance(value, decimal.Decimal) and value != value.to_integral_value():
            raise ValueError("an integer column with a fraction")
        return int(value)
    if kind == "DOUBLE":
        return float(value)
    if kind == "TIMESTAMP" and isinstance(value, datetime.datetime):
        if value.microsecond or value.tzinfo is not None:
            raise ValueError("a timestamp that is not a date's midnight")
        return value.isoformat(sep=" ")
    if kind == "DATE" and isinstance(value, datetime.date):
        return value.isoformat()
    return value
