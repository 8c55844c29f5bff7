"""PostgreSQL's built-in types as its catalog lists them: OIDs, names, sizes, categories and array types.

Clients read these OIDs from pg_type and pg_attribute and on the wire (RowDescription), so they are PostgreSQL's
own numbers, not DuckDB's. Each declared column type of the policy is one of them; so is each column of the
catalog relations themselves (relations.py), which PostgreSQL also describes in its own catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.policy import ColumnPolicy, ColumnType


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str  # typname
    length: int  # typlen: bytes, -1 variable, -2 a C string
    by_value: bool
    category: str  # typcategory
    array: int  # the OID of its array type (0: none)
    shown: str  # what format_type() prints
    duckdb: str  # the DuckDB type the catalog database holds its values in
    element: int = 0  # typelem: an array's element type


_BASE = (
    PgType(16, "bool", 1, True, "B", 1000, "boolean", "BOOLEAN"),
    PgType(17, "bytea", -1, False, "U", 1001, "bytea", "BLOB"),
    PgType(18, "char", 1, True, "Z", 1002, '"char"', "VARCHAR"),
    PgType(19, "name", 64, False, "S", 1003, "name", "VARCHAR"),
    PgType(20, "int8", 8, True, "N", 1016, "bigint", "BIGINT"),
    PgType(21, "int2", 2, True, "N", 1005, "smallint", "SMALLINT"),
    PgType(22, "int2vector", -1, False, "A", 1006, "int2vector", "SMALLINT[]", element=21),
    PgType(23, "int4", 4, True, "N", 1007, "integer", "INTEGER"),
    PgType(24, "regproc", 4, True, "N", 1008, "regproc", "VARCHAR"),
    PgType(25, "text", -1, False, "S", 1009, "text", "VARCHAR"),
    PgType(26, "oid", 4, True, "N", 1028, "oid", "BIGINT"),
    PgType(28, "xid", 4, True, "U", 1011, "xid", "BIGINT"),
    PgType(30, "oidvector", -1, False, "A", 1013, "oidvector", "BIGINT[]", element=26),
    PgType(114, "json", -1, False, "U", 199, "json", "VARCHAR"),
    PgType(194, "pg_node_tree", -1, False, "Z", 0, "pg_node_tree", "VARCHAR"),
    PgType(700, "float4", 4, True, "N", 1021, "real", "FLOAT"),
    PgType(701, "float8", 8, True, "N", 1022, "double precision", "DOUBLE"),
    PgType(869, "inet", -1, False, "I", 1041, "inet", "VARCHAR"),
    PgType(705, "unknown", -2, False, "X", 0, "unknown", "VARCHAR"),
    PgType(1033, "aclitem", 16, False, "U", 1034, "aclitem", "VARCHAR"),
    PgType(1042, "bpchar", -1, False, "S", 1014, "character", "VARCHAR"),
    PgType(1043, "varchar", -1, False, "S", 1015, "character varying", "VARCHAR"),
    PgType(1082, "date", 4, True, "D", 1182, "date", "DATE"),
    PgType(1083, "time", 8, True, "D", 1183, "time without time zone", "TIME"),
    PgType(1114, "timestamp", 8, True, "D", 1115, "timestamp without time zone", "TIMESTAMP"),
    PgType(1184, "timestamptz", 8, True, "D", 1185, "timestamp with time zone", "TIMESTAMPTZ"),
    PgType(1186, "interval", 16, False, "T", 1187, "interval", "INTERVAL"),
    PgType(1700, "numeric", -1, False, "N", 1231, "numeric", "DECIMAL(38, 10)"),
    PgType(2205, "regclass", 4, True, "N", 2210, "regclass", "BIGINT"),
    PgType(2206, "regtype", 4, True, "N", 2211, "regtype", "BIGINT"),
    PgType(4096, "regrole", 4, True, "N", 4097, "regrole", "BIGINT"),
    PgType(4089, "regnamespace", 4, True, "N", 4090, "regnamespace", "BIGINT"),
    PgType(5069, "xid8", 8, True, "U", 271, "xid8", "BIGINT"),
    PgType(2249, "record", -1, False, "P", 2287, "record", "VARCHAR"),
    PgType(2275, "cstring", -2, False, "P", 1263, "cstring", "VARCHAR"),
    PgType(2276, "any", 4, True, "P", 0, '"any"', "VARCHAR"),
    PgType(2277, "anyarray", -1, False, "P", 0, "anyarray", "VARCHAR[]"),
    PgType(2278, "void", 4, True, "P", 0, "void", "VARCHAR"),
    PgType(2950, "uuid", 16, False, "U", 2951, "uuid", "UUID"),
    PgType(3802, "jsonb", -1, False, "U", 3807, "jsonb", "VARCHAR"),
)
def _array_of(duckdb: str) -> str:
    return duckdb if duckdb.endswith("[]") else f"{duckdb}[]"


ARRAYS = tuple(PgType(t.array, f"_{t.name}", -1, False, "A", 0, f"{t.shown}[]", _array_of(t.duckdb), element=t.oid)
               for t in _BASE if t.array)
BUILTIN = _BASE + ARRAYS
BY_NAME = {t.name: t for t in BUILTIN}
BY_OID = {t.oid: t for t in BUILTIN}

# The type each declared column has in the catalog (and on the wire, types.py: BIGINT int8, DOUBLE float8, VARCHAR
# text; a text column is `character varying(max_length)`, its values being cut to that length at load).
_DECLARED = {ColumnType.INT: "int8", ColumnType.FLOAT: "float8", ColumnType.TEXT: "varchar", ColumnType.BOOL: "bool",
             ColumnType.DATE: "date", ColumnType.TIMESTAMP: "timestamp"}


def declared_type(column: ColumnPolicy) -> tuple[PgType, int]:
    """A declared column's PostgreSQL type and type modifier (atttypmod: -1, or a varchar's length + 4)."""
    kind = BY_NAME[_DECLARED[column.type]]
    return kind, column.text_length + 4 if column.type is ColumnType.TEXT else -1


def shown_type(kind: PgType, modifier: int) -> str:
    """format_type(oid, typmod): the type as PostgreSQL prints it, with a varchar's length."""
    if kind.name == "varchar" and modifier > 4:
        return f"character varying({modifier - 4})"
    return kind.shown
