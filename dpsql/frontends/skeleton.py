"""`dpsql init`: a policy skeleton from a data file's or a database table's schema, names and types only.

Bounds and public values are left as placeholders on purpose: reading them from the private data would itself
leak (the maximum income is some person's income). The steward fills them in from knowledge of the domain.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
from sqlglot import exp

from dpsql.engines.database import DatabaseTable, SourceFailed
from dpsql.errors import PolicyError, first_line
from dpsql.policy import DATABASE_SCHEMES, Source, has_password

_TYPES = {
    "BIGINT": "int", "INTEGER": "int", "SMALLINT": "int", "TINYINT": "int", "HUGEINT": "int", "UBIGINT": "int",
    "UINTEGER": "int", "USMALLINT": "int", "UTINYINT": "int", "DOUBLE": "float", "FLOAT": "float",
    "REAL": "float", "DECIMAL": "float", "BOOLEAN": "bool", "DATE": "date", "TIMESTAMP": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamp",
}


def skeleton(data: str | Path, table: str | None = None, unit: str | None = None, row_privacy: bool = False,
             policy_dir: Path | None = None) -> str:
    """The skeleton of a policy for a data file (CSV, Parquet) or a database table (`data` a database URI, `table`
    the table's name in it)."""
    if is_database_uri(str(data)):
        return _database_skeleton(str(data), table, unit, row_privacy, policy_dir)
    data_file = Path(data).resolve()
    if not data_file.is_file():
        raise PolicyError(f"init: no such file {str(data_file)!r}")
    name = table or _identifier(data_file.name.split(".")[0])
    columns: dict[str, str | None] = dict(_schema(data_file))
    if unit is not None and unit.lower() not in columns:
        raise PolicyError(f"init: the file has no column {unit!r} to use as the privacy unit")
    return _written(data_file.name, name, _toml_string(str(_relative(data_file, policy_dir))), columns, unit,
                    row_privacy)


def _relative(path: Path, policy_dir: Path | None) -> Path:
    """`path` as the policy names it: relative to the policy's folder when it lies inside it."""
    if policy_dir is not None:
        try:
            return path.relative_to(policy_dir.resolve())
        except ValueError:
            pass
    return path


def is_database_uri(text: str) -> bool:
    scheme, sep, _ = text.partition(":")
    return bool(sep) and scheme.lower() in DATABASE_SCHEMES


def _database_skeleton(uri: str, table: str | None, unit: str | None, row_privacy: bool,
                       policy_dir: Path | None) -> str:
    """A database table's skeleton: its columns' names, each with the declared type its database type reads as
    (engines/database.py); a column of a type dpsql does not read is left out, named in a comment."""
    if table is None:
        raise PolicyError("init: a database needs --table, the table to read (name or schema.name)")
    if has_password(uri):  # never repeated: it holds the secret
        raise PolicyError("init: the URI holds a password, which a policy must never hold: give it through "
                          "PGPASSWORD, a service file (PGSERVICE) or ~/.pgpass")
    scheme, _, rest = uri.partition(":")
    named = uri
    if scheme.lower() == "sqlite":  # read as an absolute path; named relative to the policy, as a file is
        file = Path(rest[2:] if rest.startswith("//") else rest).expanduser().resolve()
        if not file.is_file():
            raise PolicyError(f"init: no SQLite database file {str(file)!r}")
        uri, named = f"sqlite://{file}", f"sqlite:{_relative(file, policy_dir)}"
    try:
        with DatabaseTable(Source("database", uri, table)) as database:
            found = database.columns()
            columns = {name: database.driver.skeleton_type(column.type_name) for name, column in found.items()}
            types = {name: column.type_name for name, column in found.items()}
    except SourceFailed as exc:
        raise PolicyError(f"init: {exc}") from None
    if unit is not None and unit.lower() not in columns:
        raise PolicyError(f"init: the table has no column {unit!r} to use as the privacy unit")
    kinds = {name: (kind.value if kind is not None else f"# {name}: {types[name]} in the database, which dpsql does "
                                                      f"not read (convert it in a query = \"SELECT ...\" source)")
             for name, kind in columns.items()}
    source = f"{{ uri = {_toml_string(named)}, table = {_toml_string(table)} }}"
    return _written(f"table {table}", _identifier(table.split(".")[-1]), source, kinds, unit, row_privacy)


def _written(origin: str, name: str, source: str, columns: dict[str, str], unit: str | None,
             row_privacy: bool) -> str:
    """The skeleton's text: `columns` by name, each its declared type (or a whole comment line: left out)."""
    lines = [
        f"# Policy skeleton written by `dpsql init` from the schema of {origin} (names and types only).",
        "# Fill in every TODO. dpsql never reads bounds or category values from the data: that would leak.",
        "",
        "[budget]",
        "epsilon = 1.0           # TODO: the total privacy budget for this data",
        "delta = 1e-7            # TODO: well below 1 / (number of people); only partition selection spends it",
        "query_epsilon = 0.1     # the cost of one query unless the analyst asks otherwise",
        "",
        f"[tables.{name}]",
        f"source = {source}",
    ]
    if row_privacy:
        lines.append("row_privacy = true       # every row belongs to a different person")
    else:
        lines.append(f"privacy_unit = {_toml_string(unit.lower() if unit else 'TODO')}"
                     "   # the column that identifies a person")
        lines.append("max_rows_per_unit = 1     # TODO: how many rows one person may contribute to a query")
    lines += ["", f"[tables.{name}.columns]"]
    for column, kind in columns.items():
        entry = f"{column} = {{ type = \"{kind}\" }}"
        if kind.startswith("#"):
            lines.append(kind)
        elif unit is not None and column == unit.lower():
            lines.append(entry)
        elif kind in ("int", "float"):
            lines.append(f"{entry}   # TODO: add lower = ..., upper = ... to allow SUM/AVG; values = [...] to "
                         "group by it")
        elif kind == "text":
            lines.append(f"{entry}   # TODO: add values = [...] (its public categories): without them, GROUP BY "
                         "releases only groups whose noisy count passes a threshold")
        elif kind == "bool":
            lines.append(f"{entry}   # groups by it release both true and false; no values needed")
        else:
            lines.append(entry)
    return "\n".join(lines) + "\n"


# What marks a place the steward must fill in: `TODO:` in a comment, or "TODO" as a value (the privacy unit).
_TODO = re.compile(r'\bTODO:|"TODO"')


def todos_left(text: str) -> list[tuple[int, str]]:
    """The skeleton's markers still in a policy's text: (line number, what that line asks for), in order."""
    left = []
    for number, line in enumerate(text.splitlines(), start=1):
        marker = _TODO.search(line)
        if marker is not None:
            asked = line[marker.end():].strip() if marker.group() == "TODO:" else line.split("#", 1)[-1].strip()
            left.append((number, asked or line.strip()))
    return left


def _schema(data_file: Path) -> dict[str, str]:
    path = exp.Literal.string(str(data_file)).sql("duckdb")
    lowered = data_file.name.lower()
    reader = f"read_parquet({path})" if lowered.endswith(".parquet") else f"read_csv({path}, header = true)"
    con = duckdb.connect()
    try:
        described = con.execute(f"DESCRIBE SELECT * FROM {reader}").fetchall()
    except duckdb.Error as exc:
        raise PolicyError(f"init: cannot read the schema of {data_file.name}: {first_line(exc)}") from None
    finally:
        con.close()
    return {_identifier(row[0]): _TYPES.get(str(row[1]).split("(")[0], "text") for row in described}


def _identifier(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name.strip().lower()) or "column"
    return cleaned if not cleaned[0].isdigit() else f"c_{cleaned}"


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
