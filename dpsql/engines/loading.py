"""Reading a policy's tables into a DuckDB connection that is not locked yet: each declared table from its source
(a CSV glob, Parquet, a table of a DuckDB file, attached read-only and detached once copied, or a database's table
or query, copied as read into a staging table first: engines/database.py) with the declared types, only the
declared columns, prepared for contribution bounding by rewrite/bounding.py, with an empty twin in the twin schema
for the dry run. Used for the engine's in-memory database and for building a prepared store."""

from __future__ import annotations

from pathlib import Path

import duckdb
from sqlglot import exp

from dpsql.engines.csv_shape import csv_problem
from dpsql.engines.database import SourceFailed
from dpsql.engines.exact_values import inexact_column
from dpsql.engines.progress import SILENT, Percent, Progress
from dpsql.engines.staging import kept_in_store, stage
from dpsql.errors import PolicyError, first_line
from dpsql.policy import ColumnType, TablePolicy
from dpsql.rewrite.bounding import cleaned_rows, later_rows, prepared_rows, varying_units
from dpsql.sql import names
from dpsql.sql.names import TWIN_SCHEMA, later_rows_table, prepared_table
from dpsql.sql.parse import DIALECT


class TableLoader:
    """Loads tables into `con` (whose twin schema exists); errors name the policy, the table and the key."""

    def __init__(self, con: duckdb.DuckDBPyConnection, policy_name: str, portable: bool = False,
                 progress: Progress = SILENT, percent: Percent | None = None, store: Path | None = None) -> None:
        self.con = con
        self.store = store  # the prepared store being built (engines/staging.py keeps appended rows in it), or None
        self.policy_name = policy_name
        self.portable = portable  # rank by bounding.portable_key, as the Spark engine does (see `portable_ranks`)
        self.progress = progress  # told of each step (engines/progress.py); `percent` says how far one has gone
        self.percent = percent
        # Each database source's version, by table name, as read in the snapshot its rows were copied from.
        self.versions: dict[str, bytes] = {}

    def load(self, table: TablePolicy, salt: int) -> None:
        if table.source.kind == "database":
            self._stage(table)
        found = self._source_columns(table, self._source(table, typed=False))
        missing = [name for name in table.columns if name not in found]
        if missing:
            self._fail_shape(table)  # DuckDB read a malformed file as other columns: say where it is malformed
            self._fail(table, f"columns.{missing[0]}", f"the source has no column '{missing[0]}' (it has: "
                                                       f"{', '.join(sorted(found))})")
        self._check_exact(table, found)
        # A public table is kept as it is (typed and cleaned): its rows are read as they are, and joined.
        source = self._source(table)
        rows = cleaned_rows(table, source) if table.public else prepared_rows(table, source, salt, self.portable)
        try:
            reading = "preparing" if table.source.kind == "database" else f"reading {table.source.shown} into"
            with self.progress.step(f"{reading} table {table.name}", self.percent) as step:
                self.con.execute(f"CREATE TABLE {prepared_table(table.name)} AS {rows.sql(DIALECT)}")
                if self.progress.detailed:  # the steward's: the data's size is theirs to see
                    count = self.con.execute(f"SELECT COUNT(*) FROM {prepared_table(table.name)}").fetchone()[0]
                    step.result = f"{count:,} rows"
        except duckdb.Error:
            self._fail_shape(table)
            try:
                hint = self._column_hint(table)
            except duckdb.Error:  # never shown: DuckDB's message may quote a row
                hint = "the source could not be read to the end (a damaged or truncated file?)"
            self._fail(table, "source", f"cannot load {table.source.shown!r} with the declared column types: {hint}")
        for column in table.columns.values():
            if column.per_unit and not table.row_privacy:
                check = varying_units(table, prepared_table(table.name), column).sql(DIALECT)
                if self.con.execute(check).fetchone()[0]:
                    # To the steward loading the policy, the same for every query: names the column, no value.
                    self._fail(table, f"columns.{column.name}", "declared per_unit = true, but some unit has "
                                                               "different values (or NULL and a value) in it")
        tables = [prepared_table(table.name)]
        later = None if table.public else later_rows(table, prepared_table(table.name))
        if later is not None:
            with self.progress.step(f"listing the later rows of table {table.name}", self.percent):
                self.con.execute(f"CREATE TABLE {later_rows_table(table.name)} AS {later.sql(DIALECT)}")
            tables.append(later_rows_table(table.name))
        for name in tables:
            self.con.execute(f"CREATE TABLE {TWIN_SCHEMA}.{name} AS SELECT * FROM {name} LIMIT 0")
        if table.source.kind == "duckdb":  # the copy is made: the steward's database file is not needed any more
            self.con.execute(f"DETACH {names.attached_source(table.name)}")
        if table.source.kind == "database" and not (self.store is not None and kept_in_store(table)):
            self.con.execute(f"DROP TABLE {names.staged_source(table.name)}")

    def _stage(self, table: TablePolicy) -> None:
        """Copy a database source's rows into its staging table (engines/staging.py), keeping its version."""
        try:
            self.versions[table.name] = stage(self.con, table, self.store, self.progress)
        except SourceFailed as exc:
            self._fail(table, exc.key, f"{table.source.shown}: {exc}" if exc.key == "source" else str(exc))

    def _check_exact(self, table: TablePolicy, found: dict[str, str]) -> None:
        """Fail on the first value that the load's cast would read as another value of its declared type (1.5 in an
        int column, a time of day in a date column: engines/exact_values.py), naming its column and row. One
        aggregate query over the source, and none when no column's source type can hold such a value."""
        conditions = {name: inexact_column(name, found[name], column.type) for name, column in table.columns.items()}
        conditions = {name: condition for name, condition in conditions.items() if condition is not None}
        if not conditions:
            return
        try:
            rows, row = self._numbered(table)
            number = row.sql(DIALECT)
            firsts = ", ".join(f"MIN({number}) FILTER (WHERE {condition})" for condition in conditions.values())
            firsts = self.con.execute(f"SELECT {firsts} FROM {rows.sql(DIALECT)}").fetchone()
        except duckdb.Error:  # never shown: DuckDB's message may quote a row
            self._fail_shape(table)
            self._fail(table, "source", f"cannot read {table.source.shown!r} to the end (a damaged or truncated "
                                        "file?)")
        failing = [(first, name) for first, name in zip(firsts, conditions, strict=True) if first is not None]
        if failing:
            first, name = min(failing)  # the earliest row (then the first declared column)
            problem = ("a time of day, which its date would lose: correct the file or declare the column timestamp"
                       if table.columns[name].type is ColumnType.DATE else
                       "a number that is not an integer, which would be rounded: correct the file or declare the "
                       "column float")
            self._fail(table, f"columns.{name}", f"{self._place(table, first)} holds {problem}")

    def _numbered(self, table: TablePolicy, files: bool = False) -> tuple[exp.Expression, exp.Expression]:
        """The source read untyped with each row's number (from 1, in file order; without a CSV's header), and the
        expression of that number: a table function's ordinality, a DuckDB table's rowid + 1. `files`: the file
        each row comes from too, as the column names.SOURCE_FILE."""
        source = self._source(table, typed=False, files=files)
        if table.source.kind in ("duckdb", "database"):
            return source, exp.Add(this=exp.column("rowid"), expression=exp.Literal.number(1))
        source.set("ordinality", True)
        # DuckDB names the number `ordinality`, or another name when the file has a column so named: the last one.
        described = self.con.execute(f"DESCRIBE {exp.select('*').from_(source).sql(DIALECT)}").fetchall()
        return source, exp.column(exp.to_identifier(described[-1][0], quoted=True))

    def _place(self, table: TablePolicy, row: int) -> str:
        """Where a source row is, for a steward to find it: `row N of 'file'`, numbered within its file."""
        if table.source.kind == "duckdb":
            return f"row {row} of table '{table.source.table}'"
        if table.source.kind == "database":
            return f"row {row} as read from {table.source.shown}"
        rows, number = self._numbered(table, files=True)
        file = exp.column(names.SOURCE_FILE)
        found = self.con.execute(exp.select(file).from_(rows).where(number.eq(row)).sql(DIALECT)).fetchone()[0]
        start = self.con.execute(exp.select(exp.Min(this=number.copy())).from_(rows.copy()).where(
            file.copy().eq(exp.Literal.string(found))).sql(DIALECT)).fetchone()[0]
        header = " after the header" if table.source.kind == "csv" else ""
        return f"row {row - start + 1} of '{found}' (counted from 1{header})"

    def _source(self, table: TablePolicy, typed: bool = True, files: bool = False) -> exp.Expression:
        """The table's source as DuckDB reads it: CSV with the declared types (or every column as text, to find its
        columns and diagnose a type), Parquet, or the table of an attached DuckDB file. `files`: with the file of
        each row (CSV and Parquet), as the column names.SOURCE_FILE."""
        path = exp.Literal.string(table.source.pattern)
        options = [_named("filename", exp.Literal.string(names.SOURCE_FILE))] if files else []
        if table.source.kind == "csv":
            types = exp.Struct(expressions=[exp.PropertyEQ(this=exp.Literal.string(name),
                                                           expression=exp.Literal.string(column.type.duckdb))
                                            for name, column in table.columns.items()])
            option = _named("types", types) if typed else _named("all_varchar", exp.true())
            return exp.Table(this=exp.Anonymous(this="read_csv", expressions=[path, _named("header", exp.true()),
                                                                             option, *options]))
        if table.source.kind == "parquet":
            return exp.Table(this=exp.Anonymous(this="read_parquet", expressions=[path, *options]))
        if table.source.kind == "database":  # copied by `_stage`
            return exp.to_table(names.staged_source(table.name))
        alias = names.attached_source(table.name)
        attached = {row[0] for row in self.con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        if alias not in attached:
            try:
                self.con.execute(f"ATTACH {path.sql(DIALECT)} AS {alias} (READ_ONLY)")
            except duckdb.Error as exc:
                self._fail(table, "source", f"cannot open the DuckDB database ({first_line(exc)})")
        return exp.Table(this=exp.to_identifier(table.source.table, quoted=True), db=exp.to_identifier(alias))

    def _source_columns(self, table: TablePolicy, source: exp.Expression) -> dict[str, str]:
        try:
            described = self.con.execute(f"DESCRIBE {exp.select('*').from_(source).sql(DIALECT)}").fetchall()
        except duckdb.Error as exc:
            self._fail_shape(table)
            self._fail(table, "source", f"cannot read {table.source.shown!r} ({first_line(exc)})")
        return {row[0].lower(): row[1] for row in described}

    def _fail(self, table: TablePolicy, key: str, problem: str) -> None:
        raise PolicyError(f"policy {self.policy_name}: table '{table.name}', key '{key}': {problem}")

    def _fail_shape(self, table: TablePolicy) -> None:
        """After DuckDB failed to read a CSV source: fail naming the file and line that is malformed, if one is
        (engines/csv_shape.py)."""
        if table.source.kind == "csv":
            problem = csv_problem(table.source.pattern, table.columns)
            if problem is not None:
                self._fail(table, "source", problem)

    def _column_hint(self, table: TablePolicy) -> str:
        """Name the first declared column whose values do not all read as its declared type, and the first such row.

        This message goes to whoever loads the policy and depends on the data; it names a column and a row, never a
        value, and it is the same for every query, so it cannot be used to probe individual rows.
        """
        rows, row = self._numbered(table)
        for name, column in table.columns.items():
            raw = _quoted(name)
            declared = exp.TryCast(this=raw.copy(), to=exp.DataType.build(column.type.duckdb, dialect=DIALECT))
            unreadable = exp.and_(raw.is_(exp.null()).not_(), declared.is_(exp.null()))
            first = self.con.execute(exp.select(exp.Min(this=row.copy())).from_(rows.copy()).where(unreadable)
                                     .sql(DIALECT)).fetchone()[0]
            if first is not None:
                return (f"column '{name}' has values that are not {column.type.value} (or out of its range), the "
                        f"first in {self._place(table, first)}")
        return "the source could not be read"


def portable_ranks(bounding_seed: int | None) -> bool:
    """Whether tables are ranked by the portable key: with a fixed bounding seed (tests, comparisons), so that the
    DuckDB and Spark engines rank alike and release identical answers for the same seeds. With a secret salt DuckDB
    keeps its own hash(), 2.2-2.8x cheaper to load (10M rows: 2.5-3.3 s against 7.1 s, FINDINGS.md)."""
    return bounding_seed is not None


def _quoted(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True))


def _named(name: str, value: exp.Expression) -> exp.Expression:
    """A named argument of a DuckDB table function: `header = true`."""
    return exp.EQ(this=exp.var(name), expression=value)
