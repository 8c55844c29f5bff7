"""Tables that live in a database: read through the database's ADBC driver, as Arrow, within one snapshot.

A policy's database source (`source = { uri = ..., table = ... }`, policy.py) is read here and nowhere else:
engines/staging.py copies its rows into a DuckDB table, and the loader prepares them from there exactly as a file's, so
every defence that rests on DuckDB holds as it is; analyst SQL never reaches the database, only the steward's load
and version queries do. One source kind, a driver per URI scheme (`DRIVERS`): PostgreSQL (libpq's binary COPY under
adbc-driver-postgresql) and SQLite (adbc-driver-sqlite).

Credentials. The policy never holds a password (policy.py refuses a URI with one). The driver finds it as it
always does: libpq reads PGPASSWORD, PGSERVICE / PGSERVICEFILE and ~/.pgpass (PGPASSFILE) itself, and `uri_env`
names a variable that holds the whole URI. Every message about a source is scrubbed (`Credentials.scrub`): a URI's
`user:password@` and `password=...` become `***`, and any known secret (PGPASSWORD's value, the password in the
URI read from the environment) is replaced wherever it appears.

Snapshot and version. A read opens one transaction, on PostgreSQL `REPEATABLE READ READ ONLY`: the version and
the rows come from the same snapshot, so the version a prepared store is labelled with is the version of the very
rows it holds, even while the table changes. The version is the steward's `version` query (e.g.
`SELECT max(updated_at) FROM visits`: instant with an index), or by default, on PostgreSQL, the row count and the sum
of each row's md5 (of the declared columns as read; any insert, update or delete changes it; a full scan on the
server, about 1.5 s per million rows), and for SQLite the database file's fingerprint (its path, size, modification
time and a sample of its content, with its -wal and -journal files), as for DuckDB files, taken before the snapshot
begins.

Errors never quote a value: a failure before any row is read (connecting, a table or column that does not exist)
shows the driver's first line, scrubbed; a failure while rows are read (the version query, the data) shows only its
SQLSTATE, since a database's message may quote the row it failed on (`invalid input syntax for type integer: "..."`).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dpsql.engines.versions import file_fingerprint, source_files
from dpsql.errors import PolicyError
from dpsql.policy import MISPLACED_AT, ColumnType, Policy, Source, misplaced_at, without_passwords

try:  # the `databases` extra; a policy with a database source says how to install it when it is missing
    import pyarrow as pa
except ImportError:  # pragma: no cover - the message below is tested by hand
    pa = None

_INSTALL = "install dpsql's database drivers: pip install 'dpsql[databases]'"
# Bytes per Arrow batch PostgreSQL's driver builds (its default, 16 MiB): the rows in flight between the two.
BATCH_BYTES = 16 << 20


class SourceFailed(Exception):
    """A database source could not be read; the message is scrubbed of credentials and holds no value. `key`: the
    policy's key it is about (a column's, or the source's)."""

    def __init__(self, message: str, key: str = "source") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class SourceColumn:
    name: str  # as the database spells it
    type_name: str  # the database's type (PostgreSQL's typname), or Arrow's where the driver gives none
    arrow: Any  # the Arrow type the rows arrive as, once normalized (`_normalized`)


# (after, upto): append keys, as the database writes them as text, bounding the rows meant (None: no bound).
KeyRange = tuple[str | None, str | None]


@dataclass(frozen=True)
class Counted:
    """Rows in one snapshot: how many, the sum of their digests (`_Driver.checksum`), their largest append key."""
    rows: int
    checksum: int
    largest: str | None = None  # as the database writes it as text; None: no rows, or no append key

    def __add__(self, later: Counted) -> Counted:
        return Counted(self.rows + later.rows, self.checksum + later.checksum, later.largest or self.largest)


class Credentials:
    """Where the URI comes from and which secrets must never be shown."""

    def __init__(self, source: Source) -> None:
        self.source = source
        if source.pattern.startswith("$"):
            variable = source.pattern[1:]
            value = os.environ.get(variable, "").strip()
            if not value:
                raise SourceFailed(f"the environment variable {variable} (uri_env) is not set")
            if misplaced_at(value):
                raise SourceFailed(f"the URI in {variable} {MISPLACED_AT}")
            self.uri = value
        else:
            self.uri = source.pattern
        self._secrets = [secret for secret in (os.environ.get("PGPASSWORD"), _password_in(self.uri)) if secret]

    @property
    def scheme(self) -> str:
        return self.uri.partition(":")[0].lower()

    @property
    def shown(self) -> str:
        """The URI connected to, as it may be shown and fingerprinted: without its password."""
        return self.scrub(self.uri)

    def scrub(self, text: str) -> str:
        text = without_passwords(text)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _password_in(uri: str) -> str | None:
    found = re.search(r"://[^/?#@\s:]*:([^/?#@\s]*)@", uri) or re.search(r"(?i)\bpassword\s*=\s*([^&\s]+)", uri)
    return found.group(1) if found else None


class _Driver:
    """How one kind of database is connected to, begins its snapshot and versions a source by default."""

    def connect(self, uri: str) -> Any:
        raise NotImplementedError

    def begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN")

    def checksum(self, rows_sql: str) -> str | None:
        """The SQL of the count of a SELECT's rows and the sum of a digest of each, the two as text (None: this
        database has none; a file's version is its fingerprint instead)."""
        return None

    def statement_options(self) -> dict[str, str]:
        return {}

    def files_version(self, uri: str) -> str | None:
        """The version of a database that is a file (its fingerprint, as a DuckDB file source's); None: a server."""
        return None

    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def selected(self, quoted: str) -> str:
        """How a column is selected for the rows: as it is, unless its values need to travel as text."""
        return quoted

    def arrived(self, array: Any) -> Any:
        """A column's values as they arrived (`selected`), made the values themselves again."""
        return array

    def unreadable(self, array: Any) -> int | None:
        """The index of the first value the driver could not have passed on as it is (None: all are fine)."""
        return None

    def column_type(self, cursor: Any, table: str | None, field: Any) -> tuple[str, Any]:
        """A source column's type, as named in the database, and the Arrow type its values arrive as."""
        metadata = field.metadata or {}
        return metadata.get(b"POSTGRESQL:type", b"").decode() or str(field.type), _normalized_type(field.type)

    def skeleton_type(self, type_name: str) -> ColumnType | None:
        """The declared type `dpsql init` writes for a column of this database type; None: not read by dpsql."""
        raise NotImplementedError


# PostgreSQL's types (typname) as `dpsql init` declares them; any other (bytea, arrays, json, ranges) is left out.
_POSTGRES_TYPES = {
    **dict.fromkeys(("int2", "int4", "int8", "oid"), ColumnType.INT),
    **dict.fromkeys(("float4", "float8", "numeric"), ColumnType.FLOAT),
    "bool": ColumnType.BOOL, "date": ColumnType.DATE,
    **dict.fromkeys(("timestamp", "timestamptz"), ColumnType.TIMESTAMP),
    **dict.fromkeys(("text", "varchar", "bpchar", "char", "name", "citext", "json", "jsonb"), ColumnType.TEXT),
}
# PostgreSQL types whose values arrive as another type's: money as an int64 of cents (12.50 would load as 1250).
_POSTGRES_MISREAD = {"money"}


class _Postgres(_Driver):
    def connect(self, uri: str) -> Any:
        try:
            import adbc_driver_postgresql.dbapi as driver
        except ImportError:
            raise SourceFailed(f"the PostgreSQL driver is not installed: {_INSTALL}") from None
        return driver.connect(uri, autocommit=True)

    def begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def checksum(self, rows_sql: str) -> str | None:
        # The sum (as numeric: no overflow) of each row's md5, first 64 bits: any insert, update or delete changes
        # it, and it adds up, so the rows kept and the rows appended are summed apart (engines/loading.py).
        return ("SELECT count(*)::text, coalesce(sum(('x' || substr(md5(__dp_rows::text), 1, 16))::bit(64)::bigint"
                f"::numeric), 0)::text FROM ({rows_sql}) AS __dp_rows")

    def statement_options(self) -> dict[str, str]:
        return {"adbc.postgresql.batch_size_hint_bytes": str(BATCH_BYTES)}

    def skeleton_type(self, type_name: str) -> ColumnType | None:
        return _POSTGRES_TYPES.get(type_name)

    def column_type(self, cursor: Any, table: str | None, field: Any) -> tuple[str, Any]:
        type_name, arrow = super().column_type(cursor, table, field)
        return type_name, (None if type_name in _POSTGRES_MISREAD else arrow)

    # The driver moves a date or timestamp from PostgreSQL's epoch (2000) to Arrow's (1970) without checking for
    # overflow: 'infinity' and '-infinity' (PostgreSQL's largest and smallest integers) arrive wrapped round to the
    # values below, far before any date PostgreSQL holds, and made DuckDB's infinities here, as a CSV file's
    # 'infinity' is. A finite timestamp after the year 294,246 wraps too, to another such value: refused.
    def arrived(self, array: Any) -> Any:
        infinities = _wrapped_infinities(array.type)
        if infinities is None:
            return array
        import pyarrow.compute as pc

        (plus, minus), raw = infinities, array.view(pa.int32() if pa.types.is_date32(array.type) else pa.int64())
        largest = pa.scalar(2**31 - 1 if pa.types.is_date32(array.type) else 2**63 - 1, raw.type)
        fixed = pc.if_else(pc.equal(raw, plus), largest,
                           pc.if_else(pc.equal(raw, minus), pc.negate(largest), raw))
        return fixed.view(array.type)

    def unreadable(self, array: Any) -> int | None:
        infinities = _wrapped_infinities(array.type)
        if infinities is None or not pa.types.is_timestamp(array.type):
            return None
        import pyarrow.compute as pc

        raw = array.view(pa.int64())
        wrapped = pc.and_(pc.less(raw, _POSTGRES_FIRST_MICROSECOND), pc.invert(pc.is_in(raw, pa.array(infinities))))
        found = pc.index(wrapped, True).as_py()
        return None if found < 0 else found


_EPOCHS_APART_DAYS = 10_957  # 1970-01-01 to 2000-01-01
# Before PostgreSQL's first timestamp (4714-11-24 BC, Julian day 0), in microseconds since 1970.
_POSTGRES_FIRST_MICROSECOND = -210_866_803_200_000_000


def _wrapped_infinities(arrow: Any) -> tuple[int, int] | None:
    """('infinity', '-infinity') of a date or microsecond timestamp as PostgreSQL's driver passes them on, wrapped
    round by the shift from 2000 to 1970 (None: not such a type)."""
    if pa.types.is_date32(arrow):
        bits, shift = 32, _EPOCHS_APART_DAYS
    elif pa.types.is_timestamp(arrow) and arrow.unit == "us":
        bits, shift = 64, _EPOCHS_APART_DAYS * 86_400 * 10**6
    else:
        return None
    largest, smallest = 2 ** (bits - 1) - 1, -(2 ** (bits - 1))
    return largest + shift - 2**bits, smallest + shift


class _Sqlite(_Driver):
    def connect(self, uri: str) -> Any:
        try:
            import adbc_driver_sqlite.dbapi as driver
        except ImportError:
            raise SourceFailed(f"the SQLite driver is not installed: {_INSTALL}") from None
        return driver.connect(sqlite_file(uri), autocommit=True)

    def files_version(self, uri: str) -> str | None:
        return "files " + b"".join(map(file_fingerprint, source_files("sqlite", sqlite_file(uri)))).hex()

    # SQLite's values carry their own types, whatever a column declares, and the ADBC driver types each result
    # column from its first batch of rows (a later value of another type fails the read, and a column of NULLs
    # first is typed int64). So every value travels as text and DuckDB casts it to the declared type, checking each
    # as it does a CSV file's: a REAL as its exact form ('%!.17g' round-trips a double; SQLite's own CAST keeps 15
    # digits), the others as SQLite's CAST gives them (a BLOB's bytes, checked to be UTF-8 as they pass). None is
    # NULL on the way ('v' and the value, or 'n'), so that the driver sees text from the first row on.
    def selected(self, quoted: str) -> str:
        text = f"CASE typeof({quoted}) WHEN 'real' THEN printf('%!.17g', {quoted}) ELSE CAST({quoted} AS TEXT) END"
        return f"coalesce('v' || ({text}), 'n')"

    def arrived(self, array: Any) -> Any:
        import pyarrow.compute as pc

        return pc.if_else(pc.equal(array, "n"), pa.scalar(None, array.type), pc.utf8_slice_codeunits(array, 1))

    def column_type(self, cursor: Any, table: str | None, field: Any) -> tuple[str, Any]:
        declared = ""
        if table is not None:  # a table's declared type (a query's columns have none that SQLite keeps)
            parts = [part.strip() for part in table.split(".")]  # `t` or `schema.t`: pragma_table_info(t, schema)
            arguments = ", ".join(map(_sqlite_string, reversed(parts)))
            cursor.execute(f"SELECT type FROM pragma_table_info({arguments}) WHERE lower(name) = "
                           f"{_sqlite_string(field.name.lower())}")
            found = cursor.fetchall()
            declared = found[0][0] if found else ""
        return declared or "any", pa.string()

    def skeleton_type(self, type_name: str) -> ColumnType | None:
        """SQLite's affinity rules (sqlite.org/datatype3.html, 3.1), with a numeric type's common names kept."""
        upper = type_name.upper()
        if "INT" in upper:
            return ColumnType.INT
        if any(word in upper for word in ("CHAR", "CLOB", "TEXT")):
            return ColumnType.TEXT
        if "BLOB" in upper or upper == "ANY":
            return None
        if any(word in upper for word in ("REAL", "FLOA", "DOUB")):
            return ColumnType.FLOAT
        if "BOOL" in upper:
            return ColumnType.BOOL
        if "TIME" in upper:
            return ColumnType.TIMESTAMP
        if "DATE" in upper:
            return ColumnType.DATE
        return ColumnType.FLOAT  # NUMERIC, DECIMAL


def _sqlite_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


DRIVERS: Mapping[str, _Driver] = {"postgresql": _Postgres(), "postgres": _Postgres(), "sqlite": _Sqlite()}


def sqlite_file(uri: str) -> str:
    """The path of a `sqlite://<absolute path>` source (policy.py resolves a relative one)."""
    return uri.partition(":")[2].removeprefix("//")


class DatabaseTable:
    """One database source, open within one snapshot: its columns, its version, its rows (as a context manager)."""

    def __init__(self, source: Source) -> None:
        if pa is None:
            raise SourceFailed(f"pyarrow is not installed: {_INSTALL}")
        self.source = source
        self.credentials = Credentials(source)
        driver = DRIVERS.get(self.credentials.scheme)
        if driver is None:
            raise SourceFailed(f"{self.credentials.shown.partition(':')[0]!r} is not a database URI scheme dpsql "
                               f"reads (uri_env must hold one of: {', '.join(DRIVERS)})")
        self.driver = driver
        self._con: Any = None
        self._cursor: Any = None
        self._files_version: str | None = None

    def __enter__(self) -> DatabaseTable:
        # A file's fingerprint is taken before its snapshot begins, as a file source's is before its load: a write
        # in between gives a new version next time. Taken after, it could label the older rows with the newer
        # version, and the store built from them would then look current.
        self._files_version = self.driver.files_version(self.credentials.uri)
        try:
            self._con = self.driver.connect(self.credentials.uri)
            self._cursor = self._con.cursor()
            self.driver.begin(self._cursor)
        except SourceFailed:
            raise
        except Exception as exc:
            self.close()
            # The policy's URI is named already, in front of this message; one from uri_env is not.
            target = "" if self.source.pattern == self.credentials.uri else f" to {self.credentials.shown}"
            raise SourceFailed(f"cannot connect{target}: {self._first_line(exc)}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for thing in (self._cursor, self._con):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._cursor = self._con = None

    def _first_line(self, exc: BaseException) -> str:
        """The driver's first line, scrubbed, without ADBC's status code and libpq's tag (`IO: [libpq] `)."""
        lines = [line.strip() for line in self.credentials.scrub(str(exc)).splitlines() if line.strip()]
        return re.sub(r"^[A-Z_]+: (\[libpq\] )?", "", lines[0]) if lines else "the driver gave no reason"

    def _rows_failed(self, exc: BaseException, what: str) -> SourceFailed:
        state = getattr(exc, "sqlstate", None)
        return SourceFailed(f"the database failed while {what} (SQLSTATE {state}: its message is not shown, as it "
                            f"may quote a row)" if state else f"the database failed while {what} (the connection "
                            f"was lost, or the driver could not read a value; its message is not shown, as it may "
                            f"quote a row)")

    @property
    def _from(self) -> str:
        if self.source.query is not None:
            return f"({self.source.query}) AS __dp_source"
        assert self.source.table is not None
        return ".".join(self.driver.quote(part.strip()) for part in self.source.table.split("."))

    def columns(self) -> dict[str, SourceColumn]:
        """The source's columns by lower-case name (no row is read: `LIMIT 0`)."""
        try:
            self._cursor.execute(f"SELECT * FROM {self._from} LIMIT 0")
            schema = self._cursor.fetch_arrow_table().schema
            found = {}
            for field in schema:
                type_name, arrow = self.driver.column_type(self._cursor, self.source.table, field)
                found.setdefault(field.name.lower(), SourceColumn(field.name, type_name, arrow))
        except Exception as exc:
            raise SourceFailed(f"cannot read it: {self._first_line(exc)}") from None
        return found

    def rows_sql(self, columns: Mapping[str, SourceColumn], keys: KeyRange = (None, None)) -> str:
        """The SELECT of the declared columns (by lower-case name, each as the database spells it); `keys`: only
        the rows whose append key is in that range (`_where`)."""
        select = ", ".join(f"{self.driver.selected(self.driver.quote(column.name))} AS {self.driver.quote(name)}"
                           for name, column in columns.items())
        return f"SELECT {select} FROM {self._from}{self._where(columns, keys)}"

    def _where(self, columns: Mapping[str, SourceColumn], keys: KeyRange) -> str:
        """`(after, upto)`: the rows whose append key is greater than `after` and at most `upto` (each a value as
        the database writes it as text, or None: no limit)."""
        if keys == (None, None):
            return ""
        assert self.source.append_key is not None
        key = self.driver.quote(columns[self.source.append_key].name)
        # A text literal: the database reads it as the key column's type, exactly as it wrote it.
        limits = [f"{key} {op} '{value.replace(chr(39), chr(39) * 2)}'" for op, value in zip((">", "<="), keys,
                                                                                            strict=True) if value]
        return " WHERE " + " AND ".join(limits)

    def counted(self, columns: Mapping[str, SourceColumn], keys: KeyRange = (None, None)) -> Counted:
        """The rows' count and checksum (`_Driver.checksum`) in this snapshot, and their largest append key (if the
        source has one); `keys`: of the rows whose key is in that range only."""
        sql = self.driver.checksum(self.rows_sql(columns, keys))
        if sql is None:
            raise SourceFailed("append_key needs a PostgreSQL source: SQLite's rows have no checksum to check that "
                               "the rows kept are unchanged")
        largest = None
        key = None if self.source.append_key is None else self.driver.quote(columns[self.source.append_key].name)
        try:
            self._cursor.execute(sql)
            count, total = self._cursor.fetchall()[0]
            if key is not None:
                self._cursor.execute(f"SELECT max({key})::text FROM {self._from}{self._where(columns, keys)}")
                largest = self._cursor.fetchall()[0][0]
        except Exception as exc:
            raise self._rows_failed(exc, "its version was read") from None
        return Counted(int(count), int(total), largest)

    def version(self, columns: Mapping[str, SourceColumn], counted: Counted | None = None) -> str:
        """The source's version in this snapshot: the steward's query's row, a file's fingerprint, or the count and
        checksum of the rows (`counted`, if the caller has them already)."""
        if self.source.version is None:
            if self._files_version is not None:
                return self._files_version
            found = counted or self.counted(columns)
            return f"rows {found.rows} {found.checksum}"
        try:
            self._cursor.execute(self.source.version)
            rows = self._cursor.fetchall()
        except Exception as exc:
            raise self._rows_failed(exc, "its version was read") from None
        if len(rows) != 1:
            raise SourceFailed(f"the version query returned {len(rows)} rows: it must return one")
        return f"query {rows[0]!r}"

    def rows(self, columns: Mapping[str, SourceColumn], after: str | None = None) -> RowStream:
        """The declared columns' rows (`after`: past that append key) as a stream of Arrow batches (normalized and
        checked as they pass)."""
        try:
            self._cursor.adbc_statement.set_options(**self.driver.statement_options())
            self._cursor.execute(self.rows_sql(columns, (after, None)))
            reader = self._cursor.fetch_record_batch()
        except Exception as exc:
            raise self._rows_failed(exc, "the rows were read") from None
        return RowStream(reader, self)


class RowStream:
    """The rows as they arrive, made what DuckDB reads as the declared types need (`_normalized`), each batch's
    text checked to be valid UTF-8 (DuckDB would refuse the whole load without saying where). A failure is kept in
    `failure` (a SourceFailed naming the column and row), and the stream ends: DuckDB then fails the statement that
    read it, and the loader reports `failure` instead of DuckDB's message. `rows` counts the rows passed."""

    def __init__(self, reader: Any, table: DatabaseTable) -> None:
        self._reader = reader
        self._table = table
        self.rows = 0
        self.failure: SourceFailed | None = None
        self.schema = pa.schema([pa.field(field.name, _normalized_type(field.type)) for field in reader.schema])

    def reader(self) -> Any:
        return pa.RecordBatchReader.from_batches(self.schema, self._batches())

    def _batches(self) -> Iterator[Any]:
        while True:
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                return
            except Exception as exc:
                self.failure = self._table._rows_failed(exc, "the rows were read")
                raise self.failure from None
            columns = [_normalized(array) for array in batch.columns]
            for name, array in zip(self.schema.names, columns, strict=True):
                bad = _invalid_text(array)
                if bad is not None:
                    self.failure = SourceFailed(f"column '{name}' holds text that is not valid UTF-8, the first in "
                                                f"row {self.rows + bad + 1} as read")
                    raise self.failure
                bad = self._table.driver.unreadable(array)
                if bad is not None:
                    self.failure = SourceFailed(f"column '{name}' holds a time beyond what its driver reads (after "
                                                f"the year 294,246), the first in row {self.rows + bad + 1} as read")
                    raise self.failure
            self.rows += batch.num_rows
            decoded = [self._table.driver.arrived(array) for array in columns]
            yield pa.RecordBatch.from_arrays(decoded, schema=self.schema)


def _normalized_type(arrow: Any) -> Any:
    """The type a column's values are handed to DuckDB as: an extension type (PostgreSQL's NUMERIC, as text; a
    UUID; JSON) as its storage, and a time-zoned timestamp (TIMESTAMPTZ) as its UTC time: DuckDB would otherwise
    read it as TIMESTAMP WITH TIME ZONE and turn it into a timestamp in its session's time zone."""
    if isinstance(arrow, pa.BaseExtensionType):
        arrow = arrow.storage_type
    if pa.types.is_timestamp(arrow) and arrow.tz is not None:
        return pa.timestamp(arrow.unit)
    return arrow


def _normalized(array: Any) -> Any:
    if isinstance(array.type, pa.BaseExtensionType):
        array = array.storage
    wanted = _normalized_type(array.type)
    return array.cast(wanted) if wanted != array.type else array


def _invalid_text(array: Any) -> int | None:
    """The index of the first value of a text array that is not valid UTF-8 (None: all are)."""
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return None
    try:
        array.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    binary = array.cast(pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary())
    for index, value in enumerate(binary.to_pylist()):
        if value is not None:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return index
    return 0


# Which Arrow types a declared type reads (then cast by DuckDB, every value checked as for files): text reads any
# scalar but binary; the others what holds their values, or text (NUMERIC arrives as text, checked value by value).
def readable(arrow: Any, declared: ColumnType) -> bool:
    """None: a type the driver knows its values would arrive as something else (`_POSTGRES_MISREAD`)."""
    if arrow is None:
        return False
    t = pa.types
    number = t.is_integer(arrow) or t.is_floating(arrow) or t.is_decimal(arrow)
    text = t.is_string(arrow) or t.is_large_string(arrow)
    if declared is ColumnType.TEXT:
        return text or number or t.is_boolean(arrow) or t.is_date(arrow) or t.is_timestamp(arrow)
    if declared in (ColumnType.INT, ColumnType.FLOAT):
        return number or text
    if declared is ColumnType.BOOL:
        return t.is_boolean(arrow) or text
    if declared is ColumnType.DATE:
        return t.is_date(arrow) or t.is_timestamp(arrow) or text
    return t.is_timestamp(arrow) or t.is_date(arrow) or text


def versions_now(policy: Policy) -> dict[str, bytes]:
    """Each database source's version now, by table name: whether a prepared store is still for the data
    (engines/store.py). A build reads them again, in the snapshot of its rows."""
    found = {}
    for table in policy.tables.values():
        if table.source.kind != "database":
            continue
        try:
            with DatabaseTable(table.source) as database:
                columns = database.columns()
                if any(name not in columns for name in table.columns):  # the build says which, and where
                    found[table.name] = b"a declared column is missing"
                    continue
                found[table.name] = database.version({name: columns[name] for name in table.columns}).encode()
        except SourceFailed as exc:
            raise PolicyError(f"policy {policy.path.name}: table '{table.name}', key 'source': {table.source.shown}: "
                              f"{exc}") from None
    return found
