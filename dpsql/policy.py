"""The steward's policy: a TOML file read into frozen dataclasses, checked completely at load time.

A policy declares what may be asked of each table and what one person may contribute. Everything the privacy
core relies on (the unit column, the bounds, the public domains, the budget) comes from here and nowhere else:
in particular never from the data, which would itself leak.
"""

from __future__ import annotations

import datetime
import glob
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dpsql.dp.interval import Interval
from dpsql.errors import PolicyError
from dpsql.sql.names import RESERVED_PREFIX, is_reserved


class ColumnType(StrEnum):
    INT = "int"
    FLOAT = "float"
    TEXT = "text"
    BOOL = "bool"
    DATE = "date"
    TIMESTAMP = "timestamp"

    @property
    def duckdb(self) -> str:
        return _DUCKDB_TYPES[self]

    @property
    def numeric(self) -> bool:
        return self in (ColumnType.INT, ColumnType.FLOAT)


_DUCKDB_TYPES = {
    ColumnType.INT: "BIGINT",
    ColumnType.FLOAT: "DOUBLE",
    ColumnType.TEXT: "VARCHAR",
    ColumnType.BOOL: "BOOLEAN",
    ColumnType.DATE: "DATE",
    ColumnType.TIMESTAMP: "TIMESTAMP",
}


# A modest default: every text value is at most this long once loaded, so the checker can bound the work one row
# costs (dpsql/analysis/typecheck.py). A steward with longer free text declares max_length (up to MAX_TEXT_LENGTH).
DEFAULT_MAX_LENGTH = 1000
MAX_TEXT_LENGTH = 100_000


class Accounting(StrEnum):
    PURE = "pure"  # (epsilon, delta) summed over queries
    ZCDP = "zcdp"  # rho summed over queries, converted to (epsilon, delta) against the total


class MechanismKind(StrEnum):
    LAPLACE = "laplace"
    GAUSSIAN = "gaussian"


@dataclass(frozen=True)
class ColumnPolicy:
    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    values: tuple[Any, ...] | None = None  # a public domain: groups on this column need no partition selection
    nullable: bool = True  # False: rows with NULL (or NaN) here are dropped when the table is loaded
    max_length: int = 0  # text: the most characters a value keeps when loaded (longer ones are cut); 0: default
    # The same value on every row of a unit (a patient's sex or birth year): checked at load. A row filter on such
    # columns only keeps or drops whole units, so a query can cap each unit by the rank prepared at load.
    per_unit: bool = False
    # A derived column's DuckDB type as the analyst's SQL has it, where it is not `type`'s: a per-unit SUM of
    # integers is HUGEINT in DuckDB, though dpsql computes it as a DOUBLE (analysis/written_types.py).
    written_type: str = ""
    # A date or timestamp column's declared range (`lower`/`upper` in the policy): the bounds of its date parts
    # (YEAR(d) within the years of the range: analysis/bounds.py). Not a clamp of the column itself.
    earliest: datetime.date | None = None
    latest: datetime.date | None = None

    @property
    def sql_type(self) -> str:
        """The DuckDB type the analyst's SQL gives the column."""
        return self.written_type or self.type.duckdb

    @property
    def text_length(self) -> int:
        """The most characters a text value of this column has once loaded."""
        return self.max_length or DEFAULT_MAX_LENGTH

    @property
    def flags_values(self) -> bool:
        """Whether a private table's prepared copy has this column's declared-values flag (rewrite/bounding.known):
        a text or integer column with declared values."""
        return self.values is not None and self.type in (ColumnType.TEXT, ColumnType.INT)

    @property
    def bounded(self) -> bool:
        return self.lower is not None

    @property
    def interval(self) -> Interval:
        return Interval(self.lower, self.upper)


@dataclass(frozen=True)
class ContributionBound:
    """How much one privacy unit may contribute to one query: at most `max_rows` rows in total, and optionally, in a
    GROUP BY query, at most `max_groups` groups and `max_rows_per_group` rows in each (Google's and Tumult's L0 and
    Linf bounds: with both, one unit moves a vector of counts by sqrt(groups) * rows per group in L2)."""

    max_rows: int
    max_groups: int | None = None
    max_rows_per_group: int | None = None

    @property
    def per_group(self) -> bool:
        return self.max_groups is not None or self.max_rows_per_group is not None


@dataclass(frozen=True)
class Source:
    kind: str  # "csv" | "parquet" | "duckdb" | "database"
    # An absolute path, globs allowed for csv/parquet; a database's URI (never with a password: refused in the
    # policy), or for `uri_env` the variable's name, `$NAME` (its value, which may hold one, is read on connecting).
    pattern: str
    table: str | None = None  # the table inside a DuckDB database file, or a database's table ("schema.name")
    query: str | None = None  # a database: the steward's SELECT whose rows are the table (instead of `table`)
    version: str | None = None  # a database: the steward's query of the data's version (engines/database.py)
    # A PostgreSQL table whose rows are appended with ever larger values of this column: a refresh of the prepared
    # store reads only the rows past those it holds, once their checksum shows them unchanged (engines/loading.py).
    append_key: str | None = None

    @property
    def shown(self) -> str:
        """The source as messages name it: a file's path, or a database table (or query) and its URI."""
        if self.kind != "database":
            return self.pattern
        return f"{'the query' if self.query is not None else f'table {self.table}'} of {self.pattern}"


@dataclass(frozen=True)
class TablePolicy:
    name: str
    source: Source
    columns: dict[str, ColumnPolicy]
    bound: ContributionBound
    privacy_unit: str | None  # None only when row_privacy is declared explicitly, or for a public table
    row_privacy: bool = False
    # Public data (a lookup table): no unit, no bound, read row by row and joined freely (analysis/relation.py).
    public: bool = False
    # What the unit is ("patient"): two private tables may be joined on their unit columns only when their labels
    # are the same. Defaults to the unit column's name; None for row privacy and public tables.
    unit: str | None = None


@dataclass(frozen=True)
class AnalystBudget:
    epsilon: float
    delta: float


@dataclass(frozen=True)
class BudgetPolicy:
    epsilon: float
    delta: float
    query_epsilon: float
    query_delta: float
    accounting: Accounting
    mechanism: MechanismKind
    ledger: Path
    analysts: dict[str, AnalystBudget] = field(default_factory=dict)

    def for_analyst(self, analyst: str) -> AnalystBudget:
        return self.analysts.get(analyst, AnalystBudget(self.epsilon, self.delta))


ENGINE_KINDS = ("duckdb", "spark")
DEFAULT_SPARK_MASTER = "local[*]"
# The Spark settings a policy may give ([engine.spark]): resources and parallelism only. Anything else is refused,
# because so much of Spark's configuration opens a way out of the sandbox (spark.jars, spark.sql.extensions, a
# catalog, extraJavaOptions, spark.sql.runSQLOnFiles) or changes the semantics the engine relies on
# (spark.sql.ansi.enabled, the session time zone), and dpsql sets those itself (engines/spark_engine.py).
SPARK_SETTINGS = frozenset({
    "spark.driver.memory", "spark.driver.cores", "spark.driver.maxResultSize", "spark.executor.memory",
    "spark.executor.cores", "spark.executor.instances", "spark.cores.max", "spark.default.parallelism",
    "spark.sql.shuffle.partitions", "spark.memory.fraction", "spark.local.dir", "spark.app.name",
    "spark.sql.adaptive.enabled", "spark.sql.files.maxPartitionBytes", "spark.network.timeout",
})


@dataclass(frozen=True)
class EngineChoice:
    """Which engine runs the bounded SQL: DuckDB (embedded, the default) or Spark (engines/spark_engine.py)."""
    kind: str = "duckdb"
    master: str = DEFAULT_SPARK_MASTER  # Spark only: local[*] or a cluster's URL
    spark: tuple[tuple[str, str], ...] = ()  # Spark only: the [engine.spark] settings, each one in SPARK_SETTINGS


@dataclass(frozen=True)
class WorkLimits:
    """How much work one query may make the engine do for one person ([engine] max_joins, max_joined_rows,
    max_person_slowdown): the bounds of the static work model (analysis/person_work.py) that keep a query's running
    time from telling whether one person's rows are in the data, or what they hold."""

    max_joins: int = 3  # tables joined to the first one in one FROM (a per-unit subquery's own FROM included)
    max_joined_rows: int = 1000  # rows of one person after every join (m * k * m2 ...)
    # The most one person's rows may add to a query's work, as a multiple of the fixed work of the smallest query
    # (person_work.QUERY_FLOOR): 0.1 means that a query takes at most about 1.1 times as long with any one person
    # as without them.
    max_person_slowdown: float = 0.1


# Long enough for a grouped query over tens of millions of rows on a laptop; short enough that one query cannot
# hold the engine. `[engine] time_limit_seconds` in the policy overrides it.
DEFAULT_TIME_LIMIT = 60.0
_MAX_TIME_LIMIT = 86_400.0


@dataclass(frozen=True)
class Policy:
    path: Path
    tables: dict[str, TablePolicy]
    budget: BudgetPolicy
    time_limit: float = DEFAULT_TIME_LIMIT  # seconds a query may run on the data before it fails ([engine])
    users: Path | None = None  # the server's SCRAM verifiers ([server] users; default beside the ledger)
    # The server's answers already released ([server] answers; default beside the ledger; false: none kept).
    answers: Path | None = None
    store: Path | None = None  # the prepared store ([engine] store; None: each engine loads the sources itself)
    memory_limit: str | None = None  # DuckDB's memory limit ([engine] memory_limit; spills beyond it)
    # The limit while the prepared store is built ([engine] prepare_memory_limit; default: memory_limit).
    prepare_memory_limit: str | None = None
    engine: EngineChoice = field(default_factory=lambda: EngineChoice())  # [engine] kind, master, [engine.spark]
    limits: WorkLimits = field(default_factory=WorkLimits)  # [engine] max_joins, max_joined_rows, max_person_slowdown
    # The measurement store ([reuse] measurements; default beside the ledger; None: answers are never derived from
    # released measurements), and whether an analyst's answers may be derived from others' ([reuse] shared).
    measurements: Path | None = None
    share_measurements: bool = False

    def table(self, name: str) -> TablePolicy | None:
        return self.tables.get(name.lower())


def load_policy(path: str | Path) -> Policy:
    """Read and check a policy file. Raises PolicyError naming the table, the key and the problem."""
    path = Path(path).expanduser().resolve()
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"policy {path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        raw = tomllib.loads(raw_bytes.decode("utf-8-sig"))  # an editor's byte-order mark is not part of the TOML
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        line = raw_bytes[:exc.start].count(b"\n") + 1
        raise PolicyError(f"policy {path}: not valid TOML (line {line} is not UTF-8 text)") from None
    except RecursionError:  # tomllib reads nested arrays and inline tables recursively
        raise PolicyError(f"policy {path}: not valid TOML (arrays or inline tables nested too deeply)") from None
    reader = _Reader(path)
    reader.keys(raw, "", {"budget", "tables", "engine", "server", "reuse"})
    tables_raw = reader.require(raw, "", "tables", dict)
    if not tables_raw:
        reader.fail("", "tables", "declare at least one table")
    tables = {}
    for name, spec in tables_raw.items():
        table = reader.table(name, spec)
        if table.name in tables:
            reader.fail(f"table '{name}'", "name", "two tables have the same name (names are case-insensitive)")
        tables[table.name] = table
    budget = reader.budget(reader.require(raw, "", "budget", dict))
    engine = reader.typed(raw.get("engine", {}), "", "engine", dict)
    reader.keys(engine, "[engine]", {"time_limit_seconds", "store", "memory_limit", "prepare_memory_limit", "kind",
                                     "master", "spark", "max_joins", "max_joined_rows", "max_person_slowdown"})
    choice = _engine_choice(reader, engine)
    time_limit = reader.number(engine, "[engine]", "time_limit_seconds", default=DEFAULT_TIME_LIMIT,
                               hi=_MAX_TIME_LIMIT)
    store = _store_file(reader, engine, path, budget)
    memory_limit = _memory_size(reader, engine, "memory_limit")
    prepare_memory_limit = _memory_size(reader, engine, "prepare_memory_limit")
    if prepare_memory_limit is not None and store is None:
        reader.fail("[engine]", "prepare_memory_limit", "applies to building the prepared store: set store too")
    server = reader.typed(raw.get("server", {}), "", "server", dict)
    reader.keys(server, "[server]", {"users", "answers"})
    users_path = _server_file(reader, server, "users", f"{path.stem}.users.json", path, budget)
    answers_path = None
    if server.get("answers", True) is not False:  # `answers = false`: the server keeps no answers
        answers_path = _server_file(reader, server, "answers", f"{path.stem}.answers.sqlite", path, budget)
    for key, value in (("memory_limit", memory_limit), ("prepare_memory_limit", prepare_memory_limit)):
        if choice.kind == "spark" and value is not None:
            reader.fail("[engine]", key,
                        "is a DuckDB setting: not supported with kind = \"spark\" (size Spark with [engine.spark])")
    for table in tables.values():
        key = table.source.append_key
        if key is not None and (key not in table.columns or table.columns[key].type not in _APPEND_KEY_TYPES):
            kinds = ", ".join(t.value for t in _APPEND_KEY_TYPES)
            reader.fail(f"table '{table.name}'", "source.append_key", f"must name a column declared as {kinds}")
        if choice.kind == "spark" and table.source.kind == "database":
            reader.fail(f"table '{table.name}'", "source", "a database source is read by the DuckDB engine only: not "
                                                           "supported with kind = \"spark\"")
    if choice.kind == "spark" and engine.get("store") is True:  # Spark's store is a folder of Parquet files
        store = budget.ledger.parent / f"{path.stem}.store.spark"
    reuse = reader.typed(raw.get("reuse", {}), "", "reuse", dict)
    reader.keys(reuse, "[reuse]", {"measurements", "shared"})
    measurements = None
    named = reuse.get("measurements", True)
    if named is not False:  # true (the default): beside the ledger; a file name: relative to the policy
        measurements = _server_file(reader, {} if named is True else {"measurements": named}, "measurements",
                                    f"{path.stem}.measurements.sqlite", path, budget, "[reuse]")
    shared = reader.typed(reuse.get("shared", False), "[reuse]", "shared", bool)
    return Policy(path, tables, budget, time_limit, users_path, answers_path, store, memory_limit,
                  prepare_memory_limit=prepare_memory_limit or memory_limit, engine=choice,
                  limits=_work_limits(reader, engine), measurements=measurements, share_measurements=shared)


def _work_limits(reader: _Reader, engine: dict) -> WorkLimits:
    """`[engine] max_joins`, `max_joined_rows` and `max_person_slowdown`: a steward may loosen or tighten each."""
    default = WorkLimits()
    joins = reader.typed(engine.get("max_joins", default.max_joins), "[engine]", "max_joins", int)
    if not 0 <= joins <= 20:
        reader.fail("[engine]", "max_joins", f"must be between 0 and 20, got {joins}")
    rows = reader.typed(engine.get("max_joined_rows", default.max_joined_rows), "[engine]", "max_joined_rows", int)
    if not 1 <= rows <= 1_000_000:
        reader.fail("[engine]", "max_joined_rows", f"must be between 1 and 1000000, got {rows}")
    slowdown = reader.number(engine, "[engine]", "max_person_slowdown", default=default.max_person_slowdown, hi=100.0)
    return WorkLimits(joins, rows, slowdown)


def _dotted(settings: dict, prefix: str = "") -> dict[str, Any]:
    """`[engine.spark]` keys as Spark spells them: TOML reads an unquoted `spark.driver.memory` as nested tables."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _engine_choice(reader: _Reader, engine: dict) -> EngineChoice:
    """`[engine] kind`, `master` and the `[engine.spark]` table, each Spark setting checked against SPARK_SETTINGS."""
    kind = reader.typed(engine.get("kind", "duckdb"), "[engine]", "kind", str)
    if kind not in ENGINE_KINDS:
        reader.fail("[engine]", "kind", f"{kind!r} is not an engine (one of: {', '.join(ENGINE_KINDS)})")
    if kind != "spark" and ("master" in engine or "spark" in engine):
        reader.fail("[engine]", "master" if "master" in engine else "spark", 'is a Spark setting: set kind = "spark"')
    master = reader.typed(engine.get("master", DEFAULT_SPARK_MASTER), "[engine]", "master", str).strip()
    if not master:
        reader.fail("[engine]", "master", "must name a Spark master, such as local[*]")
    settings = reader.typed(engine.get("spark", {}), "[engine]", "spark", dict)
    checked = []
    for key, value in sorted(_dotted(settings).items()):
        if key not in SPARK_SETTINGS:
            reader.fail("[engine.spark]", key, f"not a Spark setting dpsql accepts (it accepts: "
                                               f"{', '.join(sorted(SPARK_SETTINGS))})")
        if not isinstance(value, str | int | float):  # bool is an int
            reader.fail("[engine.spark]", key, "must be a string, a number or a boolean")
        checked.append((key, str(value).lower() if isinstance(value, bool) else str(value)))
    return EngineChoice(kind, master, tuple(checked))


_MEMORY = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


def _memory_size(reader: _Reader, engine: dict, key: str) -> str | None:
    """A DuckDB memory size such as '4GB' from [engine], stripped; None when the key is absent."""
    if key not in engine:
        return None
    size = reader.typed(engine[key], "[engine]", key, str).strip()
    if not _MEMORY.fullmatch(size):
        reader.fail("[engine]", key, f"{size!r} is not a size such as '4GB' or '512MiB'")
    return size


def _store_file(reader: _Reader, engine: dict, path: Path, budget: BudgetPolicy) -> Path | None:
    """`[engine] store`: false (the default: tables loaded by each engine), true (a prepared store beside the
    ledger), or the store's file name, relative to the policy."""
    value = engine.get("store", False)
    if value is False:
        return None
    if value is True:
        return budget.ledger.parent / f"{path.stem}.store.duckdb"
    name = reader.typed(value, "[engine]", "store", str)
    if not name.strip():
        reader.fail("[engine]", "store", "must be true, false or a file name")
    named = Path(name).expanduser()
    return named if named.is_absolute() else path.parent / named


def _server_file(reader: _Reader, server: dict, key: str, default: str, path: Path, budget: BudgetPolicy,
                 section: str = "[server]") -> Path:
    """A file of the steward's: named relative to the policy, or by default beside the ledger."""
    name = reader.typed(server.get(key, default), section, key, str)
    if not name.strip():
        reader.fail(section, key, "must name a file")
    named = Path(name).expanduser()
    if not named.is_absolute():  # relative to the ledger's folder, so the default sits beside the ledger
        named = (budget.ledger.parent if key not in server else path.parent) / named
    return named


# What TOML calls the kinds of value a key may need, and what a value found is: messages speak TOML, not Python.
_TOML_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table",
               list: "an array"}


def toml_text(value: Any) -> str:
    """A value read from the policy, described as TOML writes it: `an integer (2)`, `a string ("x")`, `an array`."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"{'an integer' if isinstance(value, int) else 'a number'} ({value})"
    if isinstance(value, str):
        text = json.dumps(value[:40] + ("..." if len(value) > 40 else ""))  # TOML's escapes are JSON's
        return f"a string ({text})"
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        kind = "a date-time" if isinstance(value, datetime.datetime) else \
            "a date" if isinstance(value, datetime.date) else "a time"
        return f"{kind} ({value.isoformat()})"
    return "a table" if isinstance(value, dict) else "an array"


_TABLE_KEYS = {"source", "format", "table", "privacy_unit", "row_privacy", "max_rows_per_unit", "columns", "public",
               "unit", "max_groups_per_unit", "max_rows_per_group"}
_COLUMN_KEYS = {"type", "lower", "upper", "values", "nullable", "max_length", "per_unit"}
_BUDGET_KEYS = {"epsilon", "delta", "query_epsilon", "query_delta", "accounting", "mechanism", "ledger",
                "analysts"}
_MAX_DOMAIN = 10_000


class _Reader:
    """Checks one policy file; every failure names where in the file it is."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, key: str, problem: str) -> None:
        place = f"{where}, key '{key}'" if where else f"key '{key}'"
        raise PolicyError(f"policy {self.path.name}: {place}: {problem}")

    def keys(self, raw: dict, where: str, allowed: set[str]) -> None:
        for key in raw:
            if key not in allowed:
                self.fail(where, key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def require(self, raw: dict, where: str, key: str, kind: type) -> Any:
        if key not in raw:
            self.fail(where, key, "missing")
        return self.typed(raw[key], where, key, kind)

    def typed(self, value: Any, where: str, key: str, kind: type | tuple[type, ...]) -> Any:
        if kind in (float, (int, float)) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            wanted = _TOML_KINDS[kind if isinstance(kind, type) else float]
            self.fail(where, key, f"expected {wanted}, got {toml_text(value)}")
        return value

    def number(self, raw: dict, where: str, key: str, default: float | None = None,
               lo: float = 0.0, lo_open: bool = True, hi: float = math.inf) -> float:
        if key not in raw:
            if default is None:
                self.fail(where, key, "missing")
            return default
        value = self.typed(raw[key], where, key, float)
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or value > hi:
            bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
            self.fail(where, key, f"must be a finite number {bound}" + (f" and <= {hi:g}" if hi < math.inf else "")
                      + f", got {value!r}")
        return value

    def name(self, where: str, name: str, kind: str) -> None:
        if not name.isidentifier():
            self.fail(where, "name", f"a {kind} name must be a plain identifier (letters, digits, underscore)")
        if is_reserved(name):
            self.fail(where, "name", f"{kind} names starting with '{RESERVED_PREFIX}' are reserved for dpsql's own")

    def table(self, name: str, raw: Any) -> TablePolicy:
        where = f"table '{name}'"
        self.name(where, name, "table")
        if not isinstance(raw, dict):
            self.fail(where, "", "expected a table of keys")
        self.keys(raw, where, _TABLE_KEYS)
        source = self.source(raw, where)
        columns_raw = self.require(raw, where, "columns", dict)
        if not columns_raw:
            self.fail(where, "columns", "declare at least one column")
        columns = {}
        for col_name, col_raw in columns_raw.items():
            col = self.column(where, col_name, col_raw)
            if col.name in columns:
                self.fail(where, f"columns.{col_name}", "declared twice (names are case-insensitive)")
            columns[col.name] = col
        if self.typed(raw.get("public", False), where, "public", bool):
            return self.public_table(name, raw, where, source, columns)
        row_privacy = self.typed(raw.get("row_privacy", False), where, "row_privacy", bool)
        unit = raw.get("privacy_unit")
        if unit is None and not row_privacy:
            self.fail(where, "privacy_unit", "missing: name the column that identifies a person, or declare "
                                             "row_privacy = true if every row belongs to a different person")
        if unit is not None and row_privacy:
            self.fail(where, "row_privacy", "contradicts privacy_unit: declare one or the other")
        if unit is not None:
            unit = self.typed(unit, where, "privacy_unit", str).lower()
            if unit not in columns:
                self.fail(where, "privacy_unit", f"column '{unit}' is not declared under columns")
            if columns[unit].bounded or columns[unit].values is not None:
                self.fail(f"{where}, column '{unit}'", "lower" if columns[unit].bounded else "values",
                          "the privacy unit column cannot have bounds or public values")
            if columns[unit].type is ColumnType.FLOAT:
                # DuckDB groups and joins 0.0 and -0.0 as one value, and ids beyond 2**53 are read rounded: two
                # people would be one unit to the cap, which then chose one's rows by the other's (red team).
                self.fail(where, "privacy_unit", f"column '{unit}' is a float: ids must be exact (0.0 and -0.0 are "
                                                 f"one value to the engine); declare it int or text")
        default_rows = 1 if row_privacy else None
        if "max_rows_per_unit" not in raw and default_rows is None:
            self.fail(where, "max_rows_per_unit", "missing: how many rows one person may contribute to a query")
        max_rows = raw.get("max_rows_per_unit", default_rows)
        max_rows = self.typed(max_rows, where, "max_rows_per_unit", int)
        if max_rows < 1 or max_rows > 1_000_000:
            self.fail(where, "max_rows_per_unit", f"must be between 1 and 1000000, got {max_rows}")
        if row_privacy and max_rows != 1:
            self.fail(where, "max_rows_per_unit", "with row_privacy every row is its own unit: it must be 1")
        per_group = {}
        for key in ("max_groups_per_unit", "max_rows_per_group"):
            if key in raw:
                value = self.typed(raw[key], where, key, int)
                if value < 1 or value > max_rows:
                    self.fail(where, key, f"must be between 1 and max_rows_per_unit ({max_rows}), got {value}")
                if row_privacy:
                    self.fail(where, key, "with row_privacy every row is its own unit, in one group")
                per_group[key] = value
        bound = ContributionBound(max_rows, per_group.get("max_groups_per_unit"), per_group.get("max_rows_per_group"))
        label = None
        if unit is not None:
            label = self.typed(raw.get("unit", unit), where, "unit", str).strip().lower()
            if not label:
                self.fail(where, "unit", "must name what the unit is (e.g. \"patient\")")
        elif "unit" in raw:
            self.fail(where, "unit", "a unit label needs a privacy_unit column")
        return TablePolicy(name.lower(), source, columns, bound, unit, row_privacy, unit=label)

    def public_table(self, name: str, raw: dict, where: str, source: Source,
                     columns: dict[str, ColumnPolicy]) -> TablePolicy:
        """A public table: its rows may be read as they are, so nothing about a person's contribution applies."""
        for key in ("privacy_unit", "row_privacy", "max_rows_per_unit", "unit", "max_groups_per_unit",
                    "max_rows_per_group"):
            if key in raw:
                self.fail(where, key, "a public table has no privacy unit and no contribution bound")
        for column in columns.values():
            if column.per_unit:
                self.fail(f"{where}, column '{column.name}'", "per_unit", "a public table has no privacy unit")
        # The bound is never used: every path that bounds contributions reads it from a private table.
        return TablePolicy(name.lower(), source, columns, ContributionBound(1), None, public=True)

    def source(self, raw: dict, where: str) -> Source:
        if isinstance(raw.get("source"), dict):
            if "format" in raw or "table" in raw:
                self.fail(where, "format" if "format" in raw else "table",
                          "a database source names its table inside it: source = { uri = ..., table = ... }")
            return self.database(raw["source"], where)
        pattern = self.require(raw, where, "source", str)
        full = Path(pattern).expanduser()
        if not full.is_absolute():
            full = self.path.parent / full
        kind = raw.get("format") or _format_of(pattern)
        if kind not in ("csv", "parquet", "duckdb"):
            self.fail(where, "format", f"cannot tell the format of {pattern!r}: set format to csv, parquet or duckdb")
        if not glob.glob(str(full)):
            self.fail(where, "source", f"no file matches {str(full)!r}")
        table = raw.get("table")
        if kind == "duckdb":
            table = self.typed(table, where, "table", str) if table is not None else None
            if table is None:
                self.fail(where, "table", "a DuckDB source needs the name of the table inside the database")
            if any(ch in str(full) for ch in "*?["):
                self.fail(where, "source", "a DuckDB database source cannot be a glob")
        elif table is not None:
            self.fail(where, "table", "only a DuckDB database source takes a table name")
        return Source(kind, str(full), table)

    def database(self, raw: dict, where: str) -> Source:
        """`source = { uri = "postgresql://host/db", table = "visits" }` (or `query = "SELECT ..."`, or `uri_env`
        naming the variable that holds the URI), with optional `version` and `append_key`: a table read from a
        database through its ADBC driver (engines/database.py). The URI holds no password: the driver's own ways
        (PGPASSWORD, PGSERVICE, .pgpass) give it, so the policy, which analysts may read, never does."""
        here = f"{where}, key 'source'"
        self.keys(raw, here, {"uri", "uri_env", "table", "query", "version", "append_key"})
        if ("uri" in raw) == ("uri_env" in raw):
            self.fail(where, "source", "a database source needs uri (its address, no password) or uri_env (the "
                                       "environment variable that holds it), not both")
        if ("table" in raw) == ("query" in raw):
            self.fail(where, "source", "a database source needs table (a table's name) or query (a SELECT), not both")
        table = query = None
        if "table" in raw:
            table = self.typed(raw["table"], here, "table", str).strip()
            if not table or not all(part.strip() for part in table.split(".")) or table.count(".") > 1:
                self.fail(where, "source.table", "must name a table, or schema.table")
        else:
            query = self.statement(raw, where, "query")
        version = self.statement(raw, where, "version") if "version" in raw else None
        append_key = None
        if "append_key" in raw:
            append_key = self.typed(raw["append_key"], here, "append_key", str).strip().lower()
            if table is None:
                self.fail(where, "source.append_key", "applies to a table source (a query's rows may change in "
                                                      "ways no key shows)")
        if "uri_env" in raw:
            variable = self.typed(raw["uri_env"], here, "uri_env", str).strip()
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
                self.fail(where, "source.uri_env", "must name an environment variable (letters, digits, underscore)")
            return Source("database", f"${variable}", table, query, version, append_key)
        uri = self.typed(raw["uri"], here, "uri", str).strip()
        scheme, sep, rest = uri.partition(":")
        if not sep or scheme.lower() not in DATABASE_SCHEMES:
            self.fail(where, "source.uri", f"not a database URI dpsql reads (its scheme must be one of: "
                                           f"{', '.join(DATABASE_SCHEMES)})")
        if scheme.lower() == "sqlite":  # sqlite:///absolute/file.db, or sqlite:file.db relative to the policy
            file = Path(rest[2:] if rest.startswith("//") else rest).expanduser()
            if not file.is_absolute():
                file = self.path.parent / file
            if not file.is_file():
                self.fail(where, "source.uri", f"no SQLite database file {str(file)!r}")
            if append_key is not None:
                self.fail(where, "source.append_key", "needs a PostgreSQL source: SQLite's rows have no checksum to "
                                                      "check that the rows kept are unchanged")
            return Source("database", f"sqlite://{file}", table, query, version)
        if misplaced_at(uri):
            self.fail(where, "source.uri", MISPLACED_AT)
        if has_password(uri):  # the message never repeats the URI: it holds the secret
            self.fail(where, "source.uri", "holds a password, which a policy must never hold: give it through "
                                           "PGPASSWORD, a service file (PGSERVICE) or ~/.pgpass, or the whole URI "
                                           "through uri_env")
        return Source("database", uri, table, query, version, append_key)

    def statement(self, raw: dict, where: str, key: str) -> str:
        """A database source's query of the steward's: one SELECT (or WITH ... SELECT) statement."""
        text = self.typed(raw[key], f"{where}, key 'source'", key, str).strip().rstrip(";").strip()
        if not re.match(r"(?is)(select|with|values|table)\b", text):
            self.fail(where, f"source.{key}", "must be one SELECT statement")
        return text

    def column(self, where: str, name: str, raw: Any) -> ColumnPolicy:
        here = f"{where}, column '{name}'"
        self.name(here, name, "column")
        if not isinstance(raw, dict):
            self.fail(here, "", "expected a table of keys such as { type = \"int\" }")
        self.keys(raw, here, _COLUMN_KEYS)
        type_name = self.require(raw, here, "type", str)
        try:
            ctype = ColumnType(type_name.lower())
        except ValueError:
            self.fail(here, "type", f"unknown type {type_name!r} (expected one of: "
                                    f"{', '.join(t.value for t in ColumnType)})")
        lower, upper = raw.get("lower"), raw.get("upper")
        if (lower is None) != (upper is None):
            self.fail(here, "lower" if lower is None else "upper", "declare both lower and upper, or neither")
        earliest = latest = None
        if lower is not None and ctype in (ColumnType.DATE, ColumnType.TIMESTAMP):
            earliest, latest = (self.moment(raw, here, key, ctype) for key in ("lower", "upper"))
            if earliest > latest:
                self.fail(here, "lower", f"lower ({earliest}) is later than upper ({latest})")
            lower = upper = None
        elif lower is not None:
            if not ctype.numeric:
                self.fail(here, "lower", f"bounds need a numeric, date or timestamp type, but the column is "
                                         f"{ctype.value}")
            lower = self.number(raw, here, "lower", lo=-math.inf)
            upper = self.number(raw, here, "upper", lo=-math.inf)
            if lower > upper:
                self.fail(here, "lower", f"lower ({lower:g}) is greater than upper ({upper:g})")
            if max(abs(lower), abs(upper)) > 1e15:
                self.fail(here, "upper", "bounds beyond 1e15 in magnitude are not supported")
        values = raw.get("values")
        if values is not None:
            values = tuple(self.domain(here, ctype, values))
        nullable = self.typed(raw.get("nullable", True), here, "nullable", bool)
        per_unit = self.typed(raw.get("per_unit", False), here, "per_unit", bool)
        max_length = 0
        if ctype is ColumnType.TEXT:
            max_length = self.typed(raw.get("max_length", DEFAULT_MAX_LENGTH), here, "max_length", int)
            if not 1 <= max_length <= MAX_TEXT_LENGTH:
                self.fail(here, "max_length", f"must be between 1 and {MAX_TEXT_LENGTH}, got {max_length}")
            if values is not None and any(len(v) > max_length for v in values):
                self.fail(here, "values", f"a public value is longer than max_length ({max_length})")
        elif "max_length" in raw:
            self.fail(here, "max_length", f"applies to text columns, but the column is {ctype.value}")
        return ColumnPolicy(name.lower(), ctype, lower, upper, values, nullable, max_length, per_unit,
                            earliest=earliest, latest=latest)

    def moment(self, raw: dict, here: str, key: str, ctype: ColumnType) -> datetime.date:
        """A date column's bound: a TOML date (2015-01-01) or the same as text; a timestamp column's: a TOML
        date-time without a time zone (2015-01-01T00:00:00), a date (its midnight), or either as text."""
        value = raw[key]
        if isinstance(value, str):
            try:
                value = datetime.datetime.fromisoformat(value) if ctype is ColumnType.TIMESTAMP and (
                    "T" in value or " " in value) else datetime.date.fromisoformat(value)
            except ValueError:
                self.fail(here, key, f"{toml_text(value)} is not a {ctype.value} (write 2015-01-01)")
        if isinstance(value, datetime.datetime):
            if ctype is ColumnType.DATE or value.tzinfo is not None:
                self.fail(here, key, f"expected a {'date' if ctype is ColumnType.DATE else 'local date-time'}, "
                                     f"got {toml_text(value)}")
            return value
        if isinstance(value, datetime.date):
            return value if ctype is ColumnType.DATE else datetime.datetime.combine(value, datetime.time())
        self.fail(here, key, f"expected a {ctype.value}, got {toml_text(value)}")

    def domain(self, here: str, ctype: ColumnType, values: Any) -> list[Any]:
        if not isinstance(values, list) or not values:
            self.fail(here, "values", "expected a non-empty list of the public values")
        if len(values) > _MAX_DOMAIN:
            self.fail(here, "values", f"at most {_MAX_DOMAIN} public values")
        expected = {ColumnType.INT: int, ColumnType.FLOAT: (int, float), ColumnType.TEXT: str,
                    ColumnType.BOOL: bool}.get(ctype)
        if expected is None:
            self.fail(here, "values", f"public values are supported for int, float, text and bool, not {ctype.value}")
        for value in values:
            if not isinstance(value, expected) or (ctype is not ColumnType.BOOL and isinstance(value, bool)):
                self.fail(here, "values", f"{toml_text(value)} is not a {ctype.value}")
        if len(set(values)) != len(values):
            self.fail(here, "values", "a value is listed twice")
        return [float(v) if ctype is ColumnType.FLOAT else v for v in values]

    def budget(self, raw: dict) -> BudgetPolicy:
        where = "[budget]"
        self.keys(raw, where, _BUDGET_KEYS)
        epsilon = self.number(raw, where, "epsilon")
        delta = self.number(raw, where, "delta", default=0.0, lo=0.0, lo_open=False, hi=0.1)
        query_epsilon = self.number(raw, where, "query_epsilon", default=min(1.0, epsilon), hi=epsilon)
        query_delta = self.number(raw, where, "query_delta", default=delta / 100, lo=0.0, lo_open=False, hi=delta)
        if delta > 0 and query_delta == 0:
            self.fail(where, "query_delta", "must be > 0 when the budget has a delta")
        accounting = self.enum(raw, where, "accounting", Accounting, Accounting.PURE)
        mechanism = self.enum(raw, where, "mechanism", MechanismKind, MechanismKind.LAPLACE)
        if mechanism is MechanismKind.GAUSSIAN and accounting is not Accounting.ZCDP:
            self.fail(where, "mechanism", "the Gaussian mechanism needs accounting = \"zcdp\"")
        if accounting is Accounting.ZCDP and delta == 0:
            self.fail(where, "delta", "zCDP accounting converts to (epsilon, delta): the budget needs delta > 0")
        ledger = Path(raw.get("ledger") or f"{self.path.stem}.ledger.sqlite").expanduser()
        if not ledger.is_absolute():
            ledger = self.path.parent / ledger
        analysts = {}
        for analyst, spec in self.typed(raw.get("analysts", {}), where, "analysts", dict).items():
            here = f"[budget.analysts.{analyst}]"
            self.typed(spec, here, "", dict)
            self.keys(spec, here, {"epsilon", "delta"})
            analysts[analyst] = AnalystBudget(
                self.number(spec, here, "epsilon", hi=epsilon),
                self.number(spec, here, "delta", default=delta, lo=0.0, lo_open=False, hi=delta))
        return BudgetPolicy(epsilon, delta, query_epsilon, query_delta, accounting, mechanism, ledger, analysts)

    def enum(self, raw: dict, where: str, key: str, kind: type[StrEnum], default: StrEnum) -> Any:
        value = raw.get(key, default.value)
        try:
            return kind(self.typed(value, where, key, str).lower())
        except ValueError:
            self.fail(where, key, f"unknown value {value!r} (expected one of: {', '.join(k.value for k in kind)})")


# The types of an append key: ordered alike in PostgreSQL and in its text (engines/database.py compares as text).
_APPEND_KEY_TYPES = (ColumnType.INT, ColumnType.DATE, ColumnType.TIMESTAMP)
# The URI schemes of database sources, each read through its ADBC driver (engines/database.py).
DATABASE_SCHEMES = ("postgresql", "postgres", "sqlite")
# A password in a URI: `scheme://user:password@host`, or a `password=` parameter (libpq's keyword form too).
_URI_PASSWORD = re.compile(r"(?i)(://[^/?#@\s:]*:)[^/?#@\s]*@|(\bpassword\s*=\s*)('[^']*'|[^&\s]+)")


def has_password(uri: str) -> bool:
    return _URI_PASSWORD.search(uri) is not None


MISPLACED_AT = ("has an '@' past its host: a user name or password holding '/', '?', '#' or '@' must be "
                "percent-encoded (%2F, %3F, %23, %40); the URI is not repeated here, as it may hold a password")


def misplaced_at(uri: str) -> bool:
    """Whether an '@' comes after the first '/', '?' or '#' past `scheme://`: libpq would then read part of a
    password as the host or the port, and quote it in its message."""
    rest = uri.partition("://")[2]
    cut = re.search(r"[/?#]", rest)
    return cut is not None and "@" in rest[cut.start():]


def without_passwords(text: str) -> str:
    """`text` with any password a URI in it holds (`user:secret@`, `password=secret`) replaced by `***`."""
    return _URI_PASSWORD.sub(lambda m: f"{m.group(1)}***@" if m.group(1) else f"{m.group(2)}***", text)


def _format_of(pattern: str) -> str | None:
    lowered = pattern.lower()
    for suffix, kind in ((".csv", "csv"), (".csv.gz", "csv"), (".tsv", "csv"), (".parquet", "parquet"),
                         (".duckdb", "duckdb"), (".db", "duckdb")):
        if lowered.endswith(suffix):
            return kind
    return None
