"""A broken policy fails at load time with a message naming the table, the key and the problem."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from benchmarks.support import write_csv, write_policy
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import PolicyError
from dpsql.frontends.skeleton import skeleton
from dpsql.policy import DEFAULT_MAX_LENGTH, ColumnType, load_policy
from dpsql.sql.names import prepared_table


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "people.csv", ["pid", "age", "city"], [(1, 30, "a"), (2, 40, "b"), (2, 41, "b")])


def people(**overrides) -> dict:
    spec = {"source": "people.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
            "columns": {"pid": {"type": "int"}, "age": {"type": "int", "lower": 0, "upper": 100},
                        "city": {"type": "text", "values": ["a", "b"]}}}
    spec.update(overrides)
    return spec


def test_a_good_policy_loads_with_its_declarations(tmp_path: Path, data: Path) -> None:
    policy = load_policy(write_policy(tmp_path / "p.toml", {"people": people()}))
    table = policy.table("PEOPLE")
    assert table.privacy_unit == "pid" and table.bound.max_rows == 2
    assert table.unit == "pid" and not table.public  # the unit label defaults to the unit column's name
    assert table.columns["age"].interval.lo == 0 and table.columns["age"].interval.hi == 100
    assert table.columns["city"].values == ("a", "b") and table.columns["city"].type is ColumnType.TEXT
    assert table.source.pattern == str(data)  # resolved against the policy's folder
    assert policy.budget.ledger == tmp_path / "p.ledger.sqlite"


@pytest.mark.parametrize(("overrides", "where", "problem"), [
    ({"source": "missing.csv"}, "key 'source'", "no file matches"),
    ({"privacy_unit": "nobody"}, "key 'privacy_unit'", "column 'nobody' is not declared"),
    ({"privacy_unit": None}, "key 'privacy_unit'", "missing"),
    ({"max_rows_per_unit": 0}, "key 'max_rows_per_unit'", "between 1 and"),
    ({"colour": "red"}, "key 'colour'", "unknown key"),
    ({"columns": {"pid": {"type": "int"}, "age": {"type": "integer"}}}, "column 'age', key 'type'", "unknown type"),
    ({"columns": {"pid": {"type": "int"}, "age": {"type": "int", "lower": 10, "upper": 5}}},
     "column 'age', key 'lower'", "lower (10) is greater than upper (5)"),
    ({"columns": {"pid": {"type": "int"}, "age": {"type": "int", "lower": 1}}}, "column 'age', key 'upper'",
     "declare both"),
    ({"columns": {"pid": {"type": "int"}, "city": {"type": "text", "lower": 0, "upper": 1}}},
     "column 'city', key 'lower'", "need a numeric, date or timestamp type"),
    ({"columns": {"pid": {"type": "int"}, "city": {"type": "text", "values": ["a", 2]}}},
     "column 'city', key 'values'", "an integer (2) is not a text"),
    ({"columns": {"pid": {"type": "int", "lower": 0, "upper": 9}}}, "column 'pid'",
     "privacy unit column cannot have bounds"),
    ({"row_privacy": True}, "key 'row_privacy'", "contradicts privacy_unit"),
    ({"columns": {"pid": {"type": "int"}, "city": {"type": "text", "max_length": 0}}},
     "column 'city', key 'max_length'", "between 1 and 100000"),
    ({"columns": {"pid": {"type": "int"}, "city": {"type": "text", "max_length": "long"}}},
     "column 'city', key 'max_length'", 'expected an integer, got a string ("long")'),
    ({"columns": {"pid": {"type": "int"}, "age": {"type": "int", "max_length": 3}}},
     "column 'age', key 'max_length'", "applies to text columns"),
    ({"columns": {"pid": {"type": "int"}, "city": {"type": "text", "values": ["abc"], "max_length": 2}}},
     "column 'city', key 'values'", "longer than max_length"),
    ({"columns": {"pid": {"type": "int"}, "age": {"type": "int", "per_unit": "yes"}}}, "column 'age', key 'per_unit'",
     'expected true or false, got a string ("yes")'),
    ({"columns": {"pid": {"type": "int"}, "__dp_rank": {"type": "int"}}}, "column '__dp_rank'",
     "reserved for dpsql's own"),
    ({"unit": " "}, "key 'unit'", "must name what the unit is"),
    ({"unit": 3}, "key 'unit'", "expected a string, got an integer (3)"),
    ({"privacy_unit": None, "row_privacy": True, "max_rows_per_unit": 1, "unit": "person"}, "key 'unit'",
     "needs a privacy_unit column"),
    ({"public": "yes"}, "key 'public'", 'expected true or false, got a string ("yes")'),
    ({"public": True}, "key 'privacy_unit'", "a public table has no privacy unit"),
])
def test_broken_table_declarations_name_table_key_and_problem(tmp_path, data, overrides, where, problem) -> None:
    spec = people(**overrides)
    spec = {k: v for k, v in spec.items() if v is not None}
    path = write_policy(tmp_path / "p.toml", {"people": spec})
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert "table 'people'" in message and where in message and problem in message


def test_a_reserved_table_name_is_refused(tmp_path, data) -> None:
    with pytest.raises(PolicyError, match="table '__noisy'.*reserved for dpsql's own"):
        load_policy(write_policy(tmp_path / "p.toml", {"__noisy": people()}))


@pytest.mark.parametrize(("budget", "key", "problem"), [
    ({"epsilon": -1.0}, "epsilon", "must be a finite number > 0"),
    ({"epsilon": "lots"}, "epsilon", r'expected a number, got a string \("lots"\)'),
    ({"query_epsilon": 500.0}, "query_epsilon", "<= 100"),
    ({"accounting": "renyi"}, "accounting", "unknown value"),
    ({"mechanism": "gaussian"}, "mechanism", "needs accounting"),
])
def test_broken_budgets_name_the_key(tmp_path, data, budget, key, problem) -> None:
    path = write_policy(tmp_path / "p.toml", {"people": people()}, budget)
    with pytest.raises(PolicyError, match=f"key '{key}'.*{problem}"):
        load_policy(path)


def test_unreadable_policy_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the file"):
        load_policy(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text("[budget\nepsilon = 1")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(tmp_path / "bad.toml")


def test_row_privacy_must_be_explicit_and_means_one_row(tmp_path, data) -> None:
    spec = people(privacy_unit=None, row_privacy=True, max_rows_per_unit=1)
    spec = {k: v for k, v in spec.items() if v is not None}
    table = load_policy(write_policy(tmp_path / "p.toml", {"people": spec})).table("people")
    assert table.row_privacy and table.privacy_unit is None and table.bound.max_rows == 1


def test_a_declared_column_missing_from_the_data_fails_at_load(tmp_path, data) -> None:
    spec = people(columns={**people()["columns"], "income": {"type": "float", "lower": 0, "upper": 1}})
    policy = load_policy(write_policy(tmp_path / "p.toml", {"people": spec}))
    with pytest.raises(PolicyError, match="table 'people', key 'columns.income': the source has no column 'income'"):
        DuckDBEngine(policy)


def test_text_is_cut_to_its_max_length_when_loaded(tmp_path) -> None:
    """The checker's per-row cost bound relies on it (dpsql/analysis/typecheck.py); the default is modest."""
    write_csv(tmp_path / "people.csv", ["pid", "age", "city"], [(1, 30, "ü" * 5000), (2, 40, "abcdef")])
    columns = {"pid": {"type": "int"}, "age": {"type": "int"}, "city": {"type": "text", "max_length": 4}}
    policy = load_policy(write_policy(tmp_path / "p.toml", {"people": people(columns=columns)}))
    assert policy.table("people").columns["age"].max_length == 0
    engine = DuckDBEngine(policy)
    try:
        lengths = engine._con.execute(f"SELECT length(city) FROM {prepared_table('people')} ORDER BY pid").fetchall()
    finally:
        engine.close()
    assert lengths == [(4,), (4,)]
    default = load_policy(write_policy(tmp_path / "d.toml", {"people": people(columns={
        "pid": {"type": "int"}, "city": {"type": "text"}})}))
    assert default.table("people").columns["city"].max_length == DEFAULT_MAX_LENGTH


def test_values_that_do_not_match_the_declared_type_fail_at_load(tmp_path) -> None:
    write_csv(tmp_path / "people.csv", ["pid", "age", "city"], [(1, "thirty", "a"), (2, 40, "b")])
    policy = load_policy(write_policy(tmp_path / "p.toml", {"people": people()}))
    with pytest.raises(PolicyError, match="column 'age' has values that are not int") as caught:
        DuckDBEngine(policy)
    assert "thirty" not in str(caught.value)  # the message names the column, never a value


def test_init_writes_a_skeleton_from_the_schema_only(tmp_path: Path) -> None:
    rows = [(1, 123456.78, "Smallville"), (2, 98765.43, "Gotham")]
    write_csv(tmp_path / "secret.csv", ["person", "salary", "town"], rows)
    text = skeleton(tmp_path / "secret.csv", unit="person", policy_dir=tmp_path)
    for value in ("123456", "98765", "Smallville", "Gotham"):
        assert value not in text  # no bound or category is read from the data
    parsed = tomllib.loads(text)
    columns = parsed["tables"]["secret"]["columns"]
    assert columns == {"person": {"type": "int"}, "salary": {"type": "float"}, "town": {"type": "text"}}
    assert parsed["tables"]["secret"]["privacy_unit"] == "person"
    assert parsed["tables"]["secret"]["source"] == "secret.csv"
    load_policy(_written(tmp_path / "secret.toml", text))  # it is a loadable policy once written


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
