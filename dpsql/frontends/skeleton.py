"""`dpsql init`: a policy skeleton from a data file's schema, names and types only.

Bounds and public values are left as placeholders on purpose: reading them from the private data would itself
leak (the maximum income is some person's income). The steward fills them in from knowledge of the domain.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
from sqlglot import exp

from dpsql.errors import PolicyError, first_line

_TYPES = {
    "BIGINT": "int", "INTEGER": "int", "SMALLINT": "int", "TINYINT": "int", "HUGEINT": "int", "UBIGINT": "int",
    "UINTEGER": "int", "USMALLINT": "int", "UTINYINT": "int", "DOUBLE": "float", "FLOAT": "float",
    "REAL": "float", "DECIMAL": "float", "BOOLEAN": "bool", "DATE": "date", "TIMESTAMP": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamp",
}


def skeleton(data_file: Path, table: str | None = None, unit: str | None = None, row_privacy: bool = False,
             policy_dir: Path | None = None) -> str:
    data_file = data_file.resolve()
    if not data_file.is_file():
        raise PolicyError(f"init: no such file {str(data_file)!r}")
    name = table or _identifier(data_file.name.split(".")[0])
    columns = _schema(data_file)
    if unit is not None and unit.lower() not in columns:
        raise PolicyError(f"init: the file has no column {unit!r} to use as the privacy unit")
    source = data_file
    if policy_dir is not None:
        try:
            source = data_file.relative_to(policy_dir.resolve())
        except ValueError:
            source = data_file
    lines = [
        f"# Policy skeleton written by `dpsql init` from the schema of {data_file.name} (names and types only).",
        "# Fill in every TODO. dpsql never reads bounds or category values from the data: that would leak.",
        "",
        "[budget]",
        "epsilon = 1.0           # TODO: the total privacy budget for this data",
        "delta = 1e-7            # TODO: well below 1 / (number of people); only partition selection spends it",
        "query_epsilon = 0.1     # the cost of one query unless the analyst asks otherwise",
        "",
        f"[tables.{name}]",
        f"source = {_toml_string(str(source))}",
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
        if unit is not None and column == unit.lower():
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
