"""The rows of PostgreSQL's catalog for the policy's tables, generated from the policy alone.

The declared tables are in schema `public`, with their declared columns, PostgreSQL's types, NOT NULL where the
policy drops NULLs, and a description saying what the policy says of them (the privacy unit, the contribution
bound, a column's bounds or public values: all of it public, as the threat model says). The catalog relations
describe themselves too (pg_class lists pg_class), as in PostgreSQL. No index, constraint, sequence or statistic
exists; no row count is ever given (reltuples -1, "unknown"; n_live_tup 0).

The connection's own relations (its login as a role, its settings, its cursors, itself in pg_stat_activity) are
built from what the connection tells (`ConnectionFacts`) before each of its queries.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dpsql.frontends.schema_text import column_description, table_description
from dpsql.frontends.server.catalog.builtin_types import BUILTIN, BY_NAME, PgType, declared_type, shown_type
from dpsql.frontends.server.catalog.functions import FUNCTIONS
from dpsql.frontends.server.catalog.relations import (
    NAMESPACES,
    OWNER,
    OWNER_NAME,
    PG_CATALOG,
    PUBLIC,
    RELATIONS,
    Column,
    Relation,
)
from dpsql.policy import Policy

HERE = "\x00database"  # stands for the database's name, which each connection sees as the one it asked for
DATABASE_OID = 16384
USER_OID = 16385  # the analyst logged in (pg_roles shows the owner and them)
_FIRST_TABLE_OID = 16386
_FIRST_ROW_TYPE_OID = 14000  # the row types of the catalog relations that PostgreSQL does not number below
_ACL = ["=r/dpsql"]  # SELECT for everyone (PUBLIC), granted by the owner; nobody writes
_AGGREGATES = ("count", "sum", "avg", "min", "max", "stddev", "stddev_samp", "stddev_pop", "variance", "var_samp",
               "var_pop", "percentile_cont", "percentile_disc")


@dataclass(frozen=True)
class TableDescription:
    """A relation as pg_class and pg_attribute describe it: a declared table, or a catalog relation."""

    oid: int
    row_type: int
    schema: str
    name: str
    kind: str  # relkind
    columns: tuple[tuple[str, PgType, int, bool], ...]  # name, type, typmod, NOT NULL
    description: str | None = None
    column_descriptions: tuple[str | None, ...] = ()


def described(policy: Policy) -> list[TableDescription]:
    """Every relation the catalog describes: the policy's tables, then the catalog's own."""
    found = []
    for i, table in enumerate(policy.tables.values()):
        columns = []
        for column in table.columns.values():
            kind, modifier = declared_type(column)
            columns.append((column.name, kind, modifier, not column.nullable))
        found.append(TableDescription(_FIRST_TABLE_OID + 2 * i, _FIRST_TABLE_OID + 2 * i + 1, PUBLIC, table.name,
                                      "r", tuple(columns), table_description(table),
                                      tuple(column_description(table, c) for c in table.columns.values())))
    own_row_types = iter(range(_FIRST_ROW_TYPE_OID, _FIRST_ROW_TYPE_OID + len(RELATIONS)))
    for relation in RELATIONS:
        found.append(TableDescription(relation.oid, next(own_row_types), relation.schema, relation.name,
                                      "v" if relation.view else "r",
                                      tuple((c.name, c.type, -1, False) for c in relation.columns)))
    return found


def _row(relation: Relation, **values: Any) -> tuple[Any, ...]:
    unknown = set(values) - {c.name for c in relation.columns}
    assert not unknown, f"{relation.name} has no columns {unknown}"
    return tuple(values.get(c.name) for c in relation.columns)


_BY_NAME = {r.name: r for r in RELATIONS}


def _rows(name: str, items: Iterable[dict[str, Any]]) -> tuple[str, list[tuple[Any, ...]]]:
    relation = _BY_NAME[name]
    return name, [_row(relation, **item) for item in items]


def _align(kind: PgType) -> str:
    return {1: "c", 2: "s", 4: "i", 8: "d"}.get(kind.length, "i" if kind.length == -1 and kind.category != "A"
                                                   else "d" if kind.category == "A" else "c")


def _collation(kind: PgType) -> int:
    return 100 if kind.category == "S" else 0


def catalog_rows(policy: Policy) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of every relation that depends on the policy only (the connection's own are connection_rows)."""
    relations = described(policy)
    user_tables = [r for r in relations if r.schema == PUBLIC]
    rows = dict([
        _rows("pg_namespace", ({"oid": oid, "nspname": name, "nspowner": OWNER} for name, oid in NAMESPACES.items())),
        _rows("pg_class", (_class(r) for r in relations)),
        _rows("pg_attribute", (_attribute(r, i, column) for r in relations for i, column in enumerate(r.columns))),
        _rows("pg_type", [*(_base_type(t) for t in BUILTIN), *(_row_type(r) for r in relations)]),
        _rows("pg_description", _descriptions(user_tables)),
        _rows("pg_am", ({"oid": oid, "amname": name, "amhandler": handler, "amtype": kind} for oid, name, handler, kind
                        in ((2, "heap", "heap_tableam_handler", "t"), (403, "btree", "bthandler", "i"),
                            (405, "hash", "hashhandler", "i"), (783, "gist", "gisthandler", "i"),
                            (2742, "gin", "ginhandler", "i"), (4000, "spgist", "spghandler", "i"),
                            (3580, "brin", "brinhandler", "i")))),
        _rows("pg_collation", ({"oid": oid, "collname": name, "collnamespace": NAMESPACES[PG_CATALOG],
                                "collowner": OWNER, "collprovider": provider, "collisdeterministic": True,
                                "collencoding": -1, "collcollate": collate, "collctype": collate}
                               for oid, name, provider, collate in ((100, "default", "d", None), (950, "C", "c", "C"),
                                                                    (951, "POSIX", "c", "POSIX")))),
        _rows("pg_language", ({"oid": oid, "lanname": name, "lanowner": OWNER, "lanispl": False,
                               "lanpltrusted": name == "sql"} for oid, name in ((12, "internal"), (13, "c"),
                                                                                 (14, "sql")))),
        _rows("pg_tablespace", ({"oid": oid, "spcname": name, "spcowner": OWNER}
                                for oid, name in ((1663, "pg_default"), (1664, "pg_global")))),
        _rows("pg_database", [{"oid": DATABASE_OID, "datname": HERE, "datdba": OWNER, "encoding": 6,
                               "datlocprovider": "c", "datistemplate": False, "datallowconn": True,
                               "datconnlimit": -1, "datfrozenxid": 0, "datminmxid": 1, "dattablespace": 1663,
                               "datcollate": "C", "datctype": "C"}]),
        _rows("pg_proc", _functions()),
        _rows("pg_tables", ({"schemaname": PUBLIC, "tablename": r.name, "tableowner": OWNER_NAME,
                             "hasindexes": False, "hasrules": False, "hastriggers": False, "rowsecurity": False}
                            for r in user_tables)),
        _rows("pg_stat_user_tables", (_statistics(r) for r in user_tables)),
        _rows("pg_stat_all_tables", (_statistics(r) for r in user_tables)),
        _rows("schemata", ({"catalog_name": HERE, "schema_name": name, "schema_owner": OWNER_NAME}
                           for name in NAMESPACES)),
        _rows("tables", ({"table_catalog": HERE, "table_schema": r.schema, "table_name": r.name,
                          "table_type": "VIEW" if r.kind == "v" else "BASE TABLE", "is_insertable_into": "NO",
                          "is_typed": "NO"} for r in relations)),
        _rows("columns", (_information_column(r, i, column) for r in relations
                          for i, column in enumerate(r.columns))),
        _rows("table_privileges", _privileges(user_tables)),
        _rows("role_table_grants", _privileges(user_tables)),
        _rows("column_privileges", ({"grantor": OWNER_NAME, "grantee": "PUBLIC", "table_catalog": HERE,
                                     "table_schema": PUBLIC, "table_name": r.name, "column_name": name,
                                     "privilege_type": "SELECT", "is_grantable": "NO"}
                                    for r in user_tables for name, *_ in r.columns)),
        _rows("character_sets", [{"character_set_name": "UTF8", "character_repertoire": "UCS", "form_of_use": "UTF8",
                                  "default_collate_catalog": HERE, "default_collate_schema": PG_CATALOG,
                                  "default_collate_name": "C"}]),
    ])
    return {relation.name: rows.get(relation.name, []) for relation in RELATIONS if not relation.per_connection}


def type_names(policy: Policy) -> list[tuple[int, str, str]]:
    """(oid, typname, what format_type prints) of every type, the relations' row types included."""
    return [(t.oid, t.name, t.shown) for t in BUILTIN] + [(r.row_type, r.name, r.name) for r in described(policy)]


def _class(r: TableDescription) -> dict[str, Any]:
    return {"oid": r.oid, "relname": r.name, "relnamespace": NAMESPACES[r.schema], "reltype": r.row_type,
            "reloftype": 0, "relowner": OWNER, "relam": 2 if r.kind == "r" else 0, "relfilenode": 0,
            "reltablespace": 0, "relpages": 0, "reltuples": -1.0, "relallvisible": 0, "reltoastrelid": 0,
            "relhasindex": False, "relisshared": False, "relpersistence": "p", "relkind": r.kind,
            "relnatts": len(r.columns), "relchecks": 0, "relhasrules": False, "relhastriggers": False,
            "relhassubclass": False, "relrowsecurity": False, "relforcerowsecurity": False, "relispopulated": True,
            "relreplident": "d" if r.kind == "r" else "n", "relispartition": False, "relrewrite": 0,
            "relfrozenxid": 0, "relminmxid": 0, "relacl": _ACL if r.schema == PUBLIC else None}


def _attribute(r: TableDescription, i: int, column: tuple[str, PgType, int, bool]) -> dict[str, Any]:
    name, kind, modifier, not_null = column
    return {"attrelid": r.oid, "attname": name, "atttypid": kind.oid, "attlen": kind.length, "attnum": i + 1,
            "attcacheoff": -1, "atttypmod": modifier, "attndims": 1 if kind.category == "A" else 0,
            "attbyval": kind.by_value, "attalign": _align(kind), "attstorage": "p" if kind.length > 0 else "x",
            "attcompression": "", "attnotnull": not_null, "atthasdef": False, "atthasmissing": False,
            "attidentity": "", "attgenerated": "", "attisdropped": False, "attislocal": True, "attinhcount": 0,
            "attstattarget": -1, "attcollation": _collation(kind)}


# PostgreSQL's I/O functions are <type>in, <type>out, <type>recv, <type>send, or <type>_in ... for these (ADBC's
# driver knows a type by its receive function's name).
_UNDERSCORED = {"json", "jsonb", "pg_node_tree", "inet", "date", "time", "timestamp", "timestamptz", "interval",
                "numeric", "record", "cstring", "any", "anyarray", "void", "uuid"}


def _io(t: PgType, kind: str) -> str:
    if t.category == "A" and t.name.startswith("_"):
        return f"array_{kind}"
    if t.name in ("aclitem", "any") and kind in ("recv", "send"):
        return "-"
    return f"{t.name}_{kind}" if t.name in _UNDERSCORED else f"{t.name}{kind}"


def _base_type(t: PgType) -> dict[str, Any]:
    return {"oid": t.oid, "typname": t.name, "typnamespace": NAMESPACES[PG_CATALOG], "typowner": OWNER,
            "typlen": t.length, "typbyval": t.by_value, "typtype": "p" if t.category == "P" else "b",
            "typcategory": t.category, "typispreferred": t.name in ("text", "float8", "bool", "timestamptz", "oid"),
            "typisdefined": True, "typdelim": ",", "typrelid": 0,
            "typsubscript": "array_subscript_handler" if t.element else "-", "typelem": t.element,
            "typarray": t.array, "typinput": _io(t, "in"), "typoutput": _io(t, "out"), "typreceive": _io(t, "recv"),
            "typsend": _io(t, "send"), "typmodin": "-", "typmodout": "-",
            "typanalyze": "-", "typalign": _align(t), "typstorage": "p" if t.length > 0 else "x",
            "typnotnull": False, "typbasetype": 0, "typtypmod": -1, "typndims": 0, "typcollation": _collation(t)}


def _row_type(r: TableDescription) -> dict[str, Any]:
    return {"oid": r.row_type, "typname": r.name, "typnamespace": NAMESPACES[r.schema], "typowner": OWNER,
            "typlen": -1, "typbyval": False, "typtype": "c", "typcategory": "C", "typispreferred": False,
            "typisdefined": True, "typdelim": ",", "typrelid": r.oid, "typsubscript": "-", "typelem": 0,
            "typarray": 0, "typinput": "record_in", "typoutput": "record_out", "typreceive": "record_recv",
            "typsend": "record_send", "typmodin": "-", "typmodout": "-", "typanalyze": "-", "typalign": "d",
            "typstorage": "x", "typnotnull": False, "typbasetype": 0, "typtypmod": -1, "typndims": 0,
            "typcollation": 0}


def _descriptions(tables: list[TableDescription]) -> Iterable[dict[str, Any]]:
    for r in tables:
        if r.description:
            yield {"objoid": r.oid, "classoid": 1259, "objsubid": 0, "description": r.description}
        for i, text in enumerate(r.column_descriptions):
            if text:
                yield {"objoid": r.oid, "classoid": 1259, "objsubid": i + 1, "description": text}


def _functions() -> Iterable[dict[str, Any]]:
    oids = iter(range(15000, 16000))
    for function in FUNCTIONS:
        yield {"oid": next(oids), "proname": function.name, "pronamespace": NAMESPACES[function.schema],
               "proowner": OWNER, "prolang": 14, "procost": 1.0, "prorows": 1000.0 if function.returns_set else 0.0,
               "provariadic": 0, "prosupport": "-", "prokind": "f", "prosecdef": False, "proleakproof": False,
               "proisstrict": False, "proretset": function.returns_set, "provolatile": "s", "proparallel": "s",
               "pronargs": len(function.arguments), "pronargdefaults": 0,
               "prorettype": BY_NAME[function.returns].oid, "proargtypes": [BY_NAME[a].oid for a in function.arguments],
               "prosrc": function.name}
    for name in _AGGREGATES:  # what private queries may aggregate with (pgcli completes them)
        yield {"oid": next(oids), "proname": name, "pronamespace": NAMESPACES[PG_CATALOG], "proowner": OWNER,
               "prolang": 12, "procost": 1.0, "prorows": 0.0, "provariadic": 0, "prosupport": "-", "prokind": "a",
               "prosecdef": False, "proleakproof": False, "proisstrict": False, "proretset": False,
               "provolatile": "i", "proparallel": "s", "pronargs": 1, "pronargdefaults": 0,
               "prorettype": BY_NAME["numeric"].oid, "proargtypes": [BY_NAME["any"].oid], "prosrc": name}


def _statistics(r: TableDescription) -> dict[str, Any]:
    zero = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "n_tup_ins", "n_tup_upd", "n_tup_del",
            "n_tup_hot_upd", "n_tup_newpage_upd", "n_live_tup", "n_dead_tup", "n_mod_since_analyze",
            "n_ins_since_vacuum", "vacuum_count", "autovacuum_count", "analyze_count", "autoanalyze_count")
    return {"relid": r.oid, "schemaname": PUBLIC, "relname": r.name, **dict.fromkeys(zero, 0)}


_PRECISION = {"int8": (64, 2, 0), "int4": (32, 2, 0), "int2": (16, 2, 0), "float8": (53, 2, None),
              "float4": (24, 2, None), "oid": (32, 2, 0)}


def _information_column(r: TableDescription, i: int, column: tuple[str, PgType, int, bool]) -> dict[str, Any]:
    name, kind, modifier, not_null = column
    precision, radix, scale = _PRECISION.get(kind.name, (None, None, None))
    array = kind.category == "A"
    return {
        "table_catalog": HERE, "table_schema": r.schema, "table_name": r.name, "column_name": name,
        "ordinal_position": i + 1, "is_nullable": "NO" if not_null else "YES",
        "data_type": "ARRAY" if array else kind.shown,
        "character_maximum_length": modifier - 4 if kind.name == "varchar" and modifier > 4 else None,
        "character_octet_length": 4 * (modifier - 4) if kind.name == "varchar" and modifier > 4 else
        (1073741824 if kind.name in ("text", "varchar") else None),
        "numeric_precision": precision, "numeric_precision_radix": radix, "numeric_scale": scale,
        "datetime_precision": 0 if kind.name == "date" else 6 if kind.name.startswith("timestamp") else None,
        "udt_catalog": HERE, "udt_schema": PG_CATALOG, "udt_name": kind.name, "dtd_identifier": str(i + 1),
        "is_self_referencing": "NO", "is_identity": "NO", "identity_cycle": "NO", "is_generated": "NEVER",
        "is_updatable": "NO"}


def _privileges(tables: list[TableDescription]) -> Iterable[dict[str, Any]]:
    for r in tables:
        yield {"grantor": OWNER_NAME, "grantee": "PUBLIC", "table_catalog": HERE, "table_schema": PUBLIC,
               "table_name": r.name, "privilege_type": "SELECT", "is_grantable": "NO", "with_hierarchy": "YES"}


# ---- the connection's own relations ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CursorFacts:
    name: str
    statement: str
    holdable: bool
    binary: bool
    scrollable: bool
    created: datetime.datetime


@dataclass(frozen=True)
class ConnectionFacts:
    """What a connection tells the catalog about itself: never anything about the data."""

    database: str
    user: str
    pid: int
    started: datetime.datetime
    settings: tuple[tuple[str, str, str], ...] = ()  # name as spelt, value, description
    cursors: tuple[CursorFacts, ...] = ()
    search_path: tuple[str, ...] = (PUBLIC,)
    application_name: str = ""


def connection_rows(facts: ConnectionFacts) -> dict[str, list[tuple[Any, ...]]]:
    roles = ((OWNER_NAME, OWNER, True), (facts.user, USER_OID, False))
    return dict([
        _rows("pg_roles", ({"rolname": name, "rolsuper": superuser, "rolinherit": True, "rolcreaterole": superuser,
                            "rolcreatedb": superuser, "rolcanlogin": True, "rolreplication": superuser,
                            "rolconnlimit": -1, "rolpassword": "********", "rolbypassrls": superuser, "oid": oid}
                           for name, oid, superuser in roles)),
        _rows("pg_user", ({"usename": name, "usesysid": oid, "usecreatedb": superuser, "usesuper": superuser,
                           "userepl": superuser, "usebypassrls": superuser, "passwd": "********"}
                          for name, oid, superuser in roles)),
        _rows("pg_settings", ({"name": name, "setting": value, "category": "dpsql" if name.startswith("dpsql.")
                               else "Client Connection Defaults", "short_desc": description, "context": "user",
                               "vartype": "string", "source": "session", "boot_val": value, "reset_val": value,
                               "pending_restart": False} for name, value, description in facts.settings)),
        _rows("pg_cursors", ({"name": c.name, "statement": c.statement, "is_holdable": c.holdable,
                              "is_binary": c.binary, "is_scrollable": c.scrollable, "creation_time": c.created}
                             for c in facts.cursors)),
        _rows("pg_stat_activity", [{"datid": DATABASE_OID, "datname": facts.database, "pid": facts.pid,
                                    "usesysid": USER_OID, "usename": facts.user,
                                    "application_name": facts.application_name, "backend_start": facts.started,
                                    "state": "active", "backend_type": "client backend"}]),
    ])


def column_definitions(columns: tuple[Column, ...]) -> str:
    return ", ".join(f'"{c.name}" {c.type.duckdb}' for c in columns)


__all__ = ["HERE", "ConnectionFacts", "CursorFacts", "catalog_rows", "connection_rows", "shown_type", "type_names"]
