"""A value that is not exactly of its column's declared type fails the load, naming the table, the column and the
row, never the value: an int column does not round 1.5 to 2, a date column does not cut a time of day away."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from sqlglot import exp

from benchmarks.support import write_csv, write_policy
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.engines.exact_values import inexact_integer_text
from dpsql.errors import PolicyError
from dpsql.frontends import cli
from dpsql.policy import load_policy
from dpsql.sql.names import prepared_table

COLUMNS = {"pid": {"type": "int"}, "n": {"type": "int"}, "day": {"type": "date"}}


def people(source: str = "people.csv") -> dict:
    return {"source": source, "privacy_unit": "pid", "max_rows_per_unit": 2, "columns": COLUMNS}


def loaded(policy: Path, column: str) -> list:
    engine = DuckDBEngine(load_policy(policy))
    try:
        return [row[0] for row in engine._con.execute(
            f'SELECT "{column}" FROM {prepared_table("people")} ORDER BY pid').fetchall()]
    finally:
        engine.close()


def csv_policy(tmp_path: Path, cells: list[str], column: str = "n") -> Path:
    """people.csv with one row per cell, `cells` in `column` (the other columns ordinary)."""
    rows = [{"pid": str(i), "n": str(10 * i), "day": "2024-01-01", column: cell} for i, cell in enumerate(cells, 1)]
    write_csv(tmp_path / "people.csv", ["pid", "n", "day"], [[row[c] for c in ("pid", "n", "day")] for row in rows])
    return write_policy(tmp_path / "p.toml", {"people": people()})


def parquet_policy(tmp_path: Path, select: str) -> Path:
    """people.parquet written by DuckDB from `select` (columns pid, n, day with their SQL types)."""
    path = tmp_path / "people.parquet"
    duckdb.execute(f"COPY ({select}) TO '{path}' (FORMAT PARQUET)")
    return write_policy(tmp_path / "p.toml", {"people": people("people.parquet")})


def refusal(policy: Path) -> str:
    with pytest.raises(PolicyError) as caught:
        DuckDBEngine(load_policy(policy))
    return str(caught.value)


@pytest.mark.parametrize("cell", ["1.5", "2.5", "-2.5", "0.4", " 7.25 ", "1.55e1", "1234e-2", "9223372036854775806.5",
                                  "1.0000000000000000000001"])
def test_a_fraction_in_an_int_column_of_a_csv_fails_naming_column_and_row(tmp_path: Path, cell: str) -> None:
    message = refusal(csv_policy(tmp_path, ["1", "2", cell, "4"]))
    assert "table 'people', key 'columns.n'" in message and "row 3 " in message and "not an integer" in message
    assert cell.strip() not in message  # the steward may share the log: no value


def test_a_fraction_in_the_unit_column_fails_too(tmp_path: Path) -> None:
    message = refusal(csv_policy(tmp_path, ["1", "2.5"], column="pid"))
    assert "key 'columns.pid'" in message and "row 2 " in message and "2.5" not in message


@pytest.mark.parametrize(("cell", "value"), [("1.0", 1), ("1e3", 1000), ("1.5e1", 15), ("+3", 3), (" 7 ", 7),
                                             ("1000e-3", 1), ("0e-5", 0), ("-0.0", 0), ("5.", 5), ("1_000", 1000),
                                             ("0x1e", 30), ("-9223372036854775808", -2**63),
                                             ("9223372036854775807.000", 2**63 - 1), ("", None)])
def test_every_exact_spelling_of_an_integer_loads_as_that_integer(tmp_path: Path, cell: str, value) -> None:
    assert loaded(csv_policy(tmp_path, ["1", cell]), "n") == [1, value]


@pytest.mark.parametrize("cell", ["9223372036854775808", "-9223372036854775809", "1e19", "forty"])
def test_an_integer_out_of_range_or_not_a_number_fails_naming_column_and_row(tmp_path: Path, cell: str) -> None:
    message = refusal(csv_policy(tmp_path, ["1", "2", cell]))
    assert "column 'n'" in message and "row 3 " in message and cell not in message


@pytest.mark.parametrize(("sql_type", "values", "fails"), [
    ("DOUBLE", "(1.0), (2.5), (3.0)", True),
    ("FLOAT", "(1.0), (-0.5), (3.0)", True),
    ("DECIMAL(10, 2)", "(1.00), (2.01), (3.00)", True),
    ("DOUBLE", "(1.0), (2.0), (3.0)", False),
    ("DECIMAL(10, 2)", "(1.00), (-2.00), (3.00)", False),
    ("HUGEINT", "(1), (170141183460469231731687303715884105727), (3)", True),
    ("VARCHAR", "('1'), ('2.5'), ('3')", True),
])
def test_a_parquet_number_declared_int_loads_only_when_integral(tmp_path: Path, sql_type: str, values: str,
                                                                 fails: bool) -> None:
    policy = parquet_policy(tmp_path, f"SELECT row_number() OVER () AS pid, CAST(v AS {sql_type}) AS n, "
                                      f"DATE '2024-01-01' AS day FROM (VALUES {values}) t(v)")
    if fails:
        message = refusal(policy)
        assert ("key 'columns.n'" in message or "column 'n'" in message) and "row 2 " in message
        assert not any(value in message for value in ("2.5", "2.01", "-0.5", "170141183460469231731687303715884105727"))
    else:
        assert [abs(v) for v in loaded(policy, "n")] == [1, 2, 3]


@pytest.mark.parametrize(("cell", "fails"), [("2024-01-02 10:00:00", True), ("2024-01-02 00:00:00.000001", True),
                                             ("2024-01-01 24:00:00", True), ("2024-01-02 00:00:00", False),
                                             ("2024-01-02T00:00", False), ("2024-01-02", False)])
def test_a_time_of_day_in_a_date_column_fails_rather_than_being_cut(tmp_path: Path, cell: str, fails: bool) -> None:
    policy = csv_policy(tmp_path, ["2024-01-01", cell], column="day")
    if fails:
        message = refusal(policy)
        assert "key 'columns.day'" in message and "row 2 " in message and "time of day" in message
        assert cell not in message
    else:
        assert loaded(policy, "day") == [datetime.date(2024, 1, 1), datetime.date(2024, 1, 2)]


def test_a_parquet_timestamp_declared_date_loads_only_at_midnight(tmp_path: Path) -> None:
    select = "SELECT i AS pid, i AS n, TIMESTAMP '2024-01-01' + to_hours({}) AS day FROM range(1, 4) t(i)"
    assert loaded(parquet_policy(tmp_path, select.format("24 * i")), "day") == [
        datetime.date(2024, 1, 2), datetime.date(2024, 1, 3), datetime.date(2024, 1, 4)]
    message = refusal(parquet_policy(tmp_path, select.format("24 * i + (i = 2)::INT")))
    assert "key 'columns.day'" in message and "row 2 " in message


def test_the_row_is_counted_within_its_file_when_a_pattern_matches_several(tmp_path: Path) -> None:
    write_csv(tmp_path / "a.csv", ["pid", "n", "day"], [(1, 1, "2024-01-01"), (2, 2, "2024-01-01")])
    write_csv(tmp_path / "b.csv", ["pid", "n", "day"], [(3, 3, "2024-01-01"), (4, "4.5", "2024-01-01")])
    message = refusal(write_policy(tmp_path / "p.toml", {"people": people("*.csv")}))
    assert "row 2 of" in message and "b.csv" in message and "4.5" not in message


def test_policy_check_exits_non_zero_on_a_rounded_value(tmp_path: Path) -> None:
    policy = csv_policy(tmp_path, ["1", "2.5"])
    result = CliRunner().invoke(cli.main, ["policy", "check", str(policy)], env={"DPSQL_ANALYST": "cli"})
    assert result.exit_code != 0 and "key 'columns.n'" in result.stderr and "row 2 " in result.stderr
    assert "2.5" not in result.stderr and "Traceback" not in result.stderr


def test_decimal_text_is_checked_exactly_not_through_a_double() -> None:
    """The rule the load applies to text, against Python's exact decimals, on spellings a double would blur."""
    con = duckdb.connect()
    cells = ["1.5", "1.0", "1e3", "1e-3", "1000e-3", "123.4500e2", "123.4501e2", "4503599627370497.5", "0.0e-99",
             "-12.000", "1.00000000000000000001", "12_3.0", "1e1_0", "0x1e", " 5 "]
    condition = inexact_integer_text(exp.column(exp.to_identifier("s", quoted=True))).sql("duckdb")
    got = {cell: con.execute(f"SELECT {condition} FROM (SELECT ?::VARCHAR AS s)", [cell]).fetchone()[0]
           for cell in cells}
    def exact(cell: str) -> bool:
        text = cell.strip().replace("_", "")
        if text.lower().startswith("0x"):
            return True
        value = decimal.Decimal(text)
        return value == value.to_integral_value()
    assert got == {cell: not exact(cell) for cell in cells}
