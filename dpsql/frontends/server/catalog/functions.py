"""PostgreSQL's functions that tools call in catalog queries, as DuckDB macros over the catalog's own tables.

Each is answered from public metadata only: the policy's schema (type names, descriptions), and the connection's
own login, settings and search path (DuckDB variables the database sets before each query: database.py). Nothing
here can reach the data: the catalog database holds none. What PostgreSQL would compute from the data (sizes,
statistics) is NULL, "unknown". Privileges say what dpsql allows: SELECT (read through the private pipeline),
never a write.

The macros live in the DuckDB schema that stands for pg_catalog (information_schema's helpers in its own); the
translation (translate.py) qualifies every call of one of these names, written with or without `pg_catalog.`.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.frontends.server.catalog.relations import INFORMATION_SCHEMA, PG_CATALOG

# The DuckDB schemas that hold the catalog: the base tables (rows), and the two schemas clients name.
ROWS = "pg_rows"
DUCKDB_SCHEMA = {PG_CATALOG: "pgcatalog", INFORMATION_SCHEMA: "pginformation"}
# The connection's own values, set before each of its queries (database.py).
DATABASE, USER, USER_OID, PID, SEARCH_PATH, STARTED = (
    "dpsql_database", "dpsql_user", "dpsql_user_oid", "dpsql_pid", "dpsql_search_path", "dpsql_started")


def variable(name: str) -> str:
    return f"getvariable('{name}')"


@dataclass(frozen=True)
class PgFunction:
    name: str
    arguments: tuple[str, ...]  # PostgreSQL type names, for pg_proc
    returns: str  # PostgreSQL type name
    body: str  # DuckDB SQL over the parameters a, b, c, d
    schema: str = PG_CATALOG
    returns_set: bool = False

    @property
    def parameters(self) -> str:
        return ", ".join("abcd"[:len(self.arguments)])


def _f(name: str, arguments: str, returns: str, body: str, **extra) -> PgFunction:
    return PgFunction(name, tuple(arguments.split()) if arguments else (), returns, body, **extra)


_TRUE_FOR = "contains(upper({}), '{}')"  # a privilege list names this one ('SELECT', 'SELECT WITH GRANT OPTION')
_SELECT = _TRUE_FOR.format("b", "SELECT")
_SELECT3 = _TRUE_FOR.format("c", "SELECT")
_USAGE = _TRUE_FOR.format("b", "USAGE")
_USAGE3 = _TRUE_FOR.format("c", "USAGE")
_SEARCHED = f"(['pg_catalog'] || {variable(SEARCH_PATH)})"
_OWNER_OR_USER = (f"CASE a WHEN 10 THEN 'dpsql' WHEN {variable(USER_OID)} THEN {variable(USER)} "
                  "ELSE 'unknown (OID=' || a || ')' END")
_FORMAT_TYPE = (f"(SELECT CASE WHEN dpsql_t.typname = 'varchar' AND b > 4 THEN 'character varying(' || (b - 4) || ')' "
                f"ELSE dpsql_t.shown END FROM {ROWS}.type_names dpsql_t WHERE dpsql_t.oid = a)")
_NO_TEXT = "NULL::VARCHAR"
_DESCRIPTION = (f"(SELECT min(dpsql_d.description) FROM {ROWS}.pg_description dpsql_d "
                "WHERE dpsql_d.objoid = a AND dpsql_d.objsubid = {part})")
_NO_SIZE = "NULL::BIGINT"  # sizes would tell how much data there is

FUNCTIONS: tuple[PgFunction, ...] = (
    _f("version", "", "text", "dpsql_version"),  # replaced by the text when the macros are made (database.py)
    _f("current_database", "", "name", variable(DATABASE)),
    _f("current_catalog", "", "name", variable(DATABASE)),
    _f("current_schema", "", "name", f"{variable(SEARCH_PATH)}[1]"),
    _f("current_schemas", "bool", "_name", f"CASE WHEN a THEN {_SEARCHED} ELSE {variable(SEARCH_PATH)} END"),
    _f("current_user", "", "name", variable(USER)),
    _f("session_user", "", "name", variable(USER)),
    _f("pg_backend_pid", "", "int4", variable(PID)),
    _f("current_setting", "text", "text",
       "(SELECT dpsql_s.setting FROM temp.main.pg_settings dpsql_s WHERE lower(dpsql_s.name) = lower(a))"),
    _f("current_setting", "text bool", "text",
       "(SELECT dpsql_s.setting FROM temp.main.pg_settings dpsql_s WHERE lower(dpsql_s.name) = lower(a))"),
    _f("format_type", "oid int4", "text", _FORMAT_TYPE),
    _f("pg_get_userbyid", "oid", "name", _OWNER_OR_USER),
    _f("pg_encoding_to_char", "int4", "name", "'UTF8'"),
    _f("pg_char_to_encoding", "name", "int4", "6"),
    _f("pg_table_is_visible", "oid", "bool",
       f"list_contains({_SEARCHED}, (SELECT dpsql_n.nspname FROM {ROWS}.pg_class dpsql_c "
       f"JOIN {ROWS}.pg_namespace dpsql_n ON dpsql_n.oid = dpsql_c.relnamespace WHERE dpsql_c.oid = a))"),
    _f("pg_type_is_visible", "oid", "bool", "true"),
    _f("pg_function_is_visible", "oid", "bool", "true"),
    _f("pg_collation_is_visible", "oid", "bool", "true"),
    _f("pg_opclass_is_visible", "oid", "bool", "true"),
    _f("pg_operator_is_visible", "oid", "bool", "true"),
    _f("pg_conversion_is_visible", "oid", "bool", "true"),
    _f("pg_statistics_obj_is_visible", "oid", "bool", "true"),
    _f("pg_ts_config_is_visible", "oid", "bool", "true"),
    _f("pg_has_role", "name text", "bool", "true"),
    _f("pg_has_role", "name name text", "bool", "true"),
    _f("has_table_privilege", "text text", "bool", _SELECT),
    _f("has_table_privilege", "name text text", "bool", _SELECT3),
    _f("has_any_column_privilege", "text text", "bool", _SELECT),
    _f("has_any_column_privilege", "name text text", "bool", _SELECT3),
    _f("has_column_privilege", "text text text", "bool", _SELECT3),
    _f("has_column_privilege", "name text text text", "bool", _TRUE_FOR.format("d", "SELECT")),
    _f("has_schema_privilege", "text text", "bool", _USAGE),
    _f("has_schema_privilege", "name text text", "bool", _USAGE3),
    _f("has_database_privilege", "text text", "bool", _TRUE_FOR.format("b", "CONNECT")),
    _f("has_database_privilege", "name text text", "bool", _TRUE_FOR.format("c", "CONNECT")),
    _f("has_function_privilege", "text text", "bool", _TRUE_FOR.format("b", "EXECUTE")),
    _f("has_function_privilege", "name text text", "bool", _TRUE_FOR.format("c", "EXECUTE")),
    _f("has_type_privilege", "text text", "bool", _USAGE),
    _f("has_type_privilege", "name text text", "bool", _USAGE3),
    _f("has_sequence_privilege", "text text", "bool", "false"),
    _f("has_sequence_privilege", "name text text", "bool", "false"),
    _f("obj_description", "oid", "text", _DESCRIPTION.format(part="0")),
    _f("obj_description", "oid name", "text", _DESCRIPTION.format(part="0")),
    _f("col_description", "oid int4", "text", _DESCRIPTION.format(part="b")),
    _f("shobj_description", "oid name", "text", _NO_TEXT),
    # No index, constraint, view, rule, trigger, default, partition or sequence exists: nothing to print.
    _f("pg_get_indexdef", "oid", "text", _NO_TEXT),
    _f("pg_get_indexdef", "oid int4 bool", "text", _NO_TEXT),
    _f("pg_get_constraintdef", "oid", "text", _NO_TEXT),
    _f("pg_get_constraintdef", "oid bool", "text", _NO_TEXT),
    _f("pg_get_expr", "pg_node_tree oid", "text", _NO_TEXT),
    _f("pg_get_expr", "pg_node_tree oid bool", "text", _NO_TEXT),
    _f("pg_get_viewdef", "oid", "text", _NO_TEXT),
    _f("pg_get_viewdef", "oid bool", "text", _NO_TEXT),
    _f("pg_get_triggerdef", "oid", "text", _NO_TEXT),
    _f("pg_get_triggerdef", "oid bool", "text", _NO_TEXT),
    _f("pg_get_ruledef", "oid", "text", _NO_TEXT),
    _f("pg_get_ruledef", "oid bool", "text", _NO_TEXT),
    _f("pg_get_partkeydef", "oid", "text", _NO_TEXT),
    _f("pg_get_statisticsobjdef_columns", "oid", "text", _NO_TEXT),
    _f("pg_get_serial_sequence", "text text", "text", _NO_TEXT),
    _f("pg_get_functiondef", "oid", "text", _NO_TEXT),
    _f("pg_get_function_arguments", "oid", "text", "''"),
    _f("pg_get_function_identity_arguments", "oid", "text", "''"),
    _f("pg_get_function_result", "oid", "text",
       f"(SELECT dpsql_t.shown FROM {ROWS}.pg_proc dpsql_p JOIN {ROWS}.type_names dpsql_t "
       "ON dpsql_t.oid = dpsql_p.prorettype WHERE dpsql_p.oid = a)"),
    _f("pg_relation_is_publishable", "regclass", "bool", "false"),
    _f("pg_is_other_temp_schema", "oid", "bool", "false"),
    _f("pg_my_temp_schema", "", "oid", "0"),
    _f("pg_is_in_recovery", "", "bool", "false"),
    _f("pg_postmaster_start_time", "", "timestamptz", variable(STARTED)),
    _f("pg_conf_load_time", "", "timestamptz", variable(STARTED)),
    _f("inet_server_addr", "", "inet", _NO_TEXT),
    _f("inet_server_port", "", "int4", "NULL::INTEGER"),
    _f("inet_client_addr", "", "inet", _NO_TEXT),
    _f("txid_current", "", "int8", "1"),
    _f("pg_current_xact_id", "", "xid8", "1"),
    _f("pg_relation_size", "regclass", "int8", _NO_SIZE),
    _f("pg_relation_size", "regclass text", "int8", _NO_SIZE),
    _f("pg_total_relation_size", "regclass", "int8", _NO_SIZE),
    _f("pg_table_size", "regclass", "int8", _NO_SIZE),
    _f("pg_indexes_size", "regclass", "int8", _NO_SIZE),
    _f("pg_database_size", "name", "int8", _NO_SIZE),
    _f("pg_size_pretty", "int8", "text", "CASE WHEN a IS NULL THEN NULL ELSE format_bytes(a) END"),
    _f("pg_tablespace_location", "oid", "text", "''"),
    _f("pg_index_column_has_property", "regclass int4 text", "bool", "NULL::BOOLEAN"),
    _f("pg_indexam_has_property", "oid text", "bool", "NULL::BOOLEAN"),
    _f("quote_ident", "text", "text",
       "CASE WHEN regexp_full_match(a, '[a-z_][a-z0-9_$]*') THEN a ELSE '\"' || replace(a, '\"', '\"\"') || '\"' END"),
    _f("to_regtype", "text", "regtype",
       f"(SELECT min(dpsql_t.oid) FROM {ROWS}.type_names dpsql_t "
       "WHERE dpsql_t.typname = lower(trim(a)) OR dpsql_t.shown = lower(trim(a)))"),
    _f("to_regclass", "text", "regclass",
       f"(SELECT min(dpsql_c.oid) FROM {ROWS}.pg_class dpsql_c "
       f"JOIN {ROWS}.pg_namespace dpsql_n ON dpsql_n.oid = dpsql_c.relnamespace "
       f"WHERE dpsql_c.relname = {ROWS}.ident_name(a) AND coalesce(dpsql_n.nspname = {ROWS}.ident_schema(a), true))"),
    _f("to_regproc", "text", "regproc",
       f"(SELECT min(dpsql_p.oid) FROM {ROWS}.pg_proc dpsql_p WHERE dpsql_p.proname = {ROWS}.ident_name(a))"),
    _f("to_regrole", "text", "regrole",
       f"CASE {ROWS}.ident_name(a) WHEN 'dpsql' THEN 10 WHEN lower({variable(USER)}) THEN {variable(USER_OID)} END"),
    _f("to_regnamespace", "text", "regnamespace",
       f"(SELECT min(dpsql_n.oid) FROM {ROWS}.pg_namespace dpsql_n WHERE dpsql_n.nspname = a)"),
    _f("array_upper", "anyarray int4", "int4", "CASE WHEN b = 1 AND len(a) > 0 THEN len(a) END"),
    _f("array_lower", "anyarray int4", "int4", "CASE WHEN b = 1 AND len(a) > 0 THEN 1 END"),
    # pgjdbc's key columns: one row per element, (x, n) as in PostgreSQL's information_schema.
    _f("_pg_expandarray", "anyarray", "record",
       "unnest(list_transform(range(1, len(a) + 1), lambda i: {'x': a[i], 'n': i}))",
       schema=INFORMATION_SCHEMA, returns_set=True),
)

# Helpers the macros above call (not PostgreSQL's: no pg_proc rows): the two parts of a possibly qualified name.
HELPERS = (
    f"CREATE MACRO {ROWS}.ident_name(a) AS lower(trim(string_split(a, '.')[-1], '\"'))",
    f"CREATE MACRO {ROWS}.ident_schema(a) AS CASE WHEN contains(a, '.') THEN lower(trim(string_split(a, '.')[1], "
    "'\"')) END",
    # What an OID type prints: the object's name (its number if there is none, as PostgreSQL does).
    f"CREATE MACRO {ROWS}.regclass_name(a) AS coalesce((SELECT min(dpsql_c.relname) FROM {ROWS}.pg_class dpsql_c "
    "WHERE dpsql_c.oid = a), CAST(a AS VARCHAR))",
    f"CREATE MACRO {ROWS}.regtype_name(a) AS coalesce((SELECT min(dpsql_t.shown) FROM {ROWS}.type_names dpsql_t "
    "WHERE dpsql_t.oid = a), CAST(a AS VARCHAR))",
    f"CREATE MACRO {ROWS}.regproc_name(a) AS coalesce((SELECT min(dpsql_p.proname) FROM {ROWS}.pg_proc dpsql_p "
    "WHERE dpsql_p.oid = a), CAST(a AS VARCHAR))",
    f"CREATE MACRO {ROWS}.regnamespace_name(a) AS coalesce((SELECT min(dpsql_n.nspname) "
    f"FROM {ROWS}.pg_namespace dpsql_n WHERE dpsql_n.oid = a), CAST(a AS VARCHAR))",
    f"CREATE MACRO {ROWS}.regrole_name(a) AS CASE a WHEN 10 THEN 'dpsql' WHEN {variable(USER_OID)} THEN "
    f"{variable(USER)} ELSE CAST(a AS VARCHAR) END",
    *(f"CREATE MACRO {ROWS}.{kind}_names(a) AS (SELECT list({ROWS}.{kind}_name(dpsql_u.x) ORDER BY dpsql_u.i) FROM "
      "(SELECT unnest(a) AS x, generate_subscripts(a, 1) AS i) dpsql_u)"
      for kind in ("regclass", "regtype", "regproc", "regnamespace", "regrole")),
)

NAMES = frozenset(f.name for f in FUNCTIONS)


def macros(version: str) -> list[str]:
    """The CREATE MACRO statements, one per name (its overloads together), version() returning `version`."""
    by_name: dict[tuple[str, str], list[PgFunction]] = {}
    for function in FUNCTIONS:
        by_name.setdefault((function.schema, function.name), []).append(function)
    text = "'" + version.replace("'", "''") + "'"
    statements = []
    for (schema, name), overloads in by_name.items():
        bodies = ", ".join(f"({f.parameters}) AS {f.body.replace('dpsql_version', text)}" for f in overloads)
        statements.append(f"CREATE MACRO {DUCKDB_SCHEMA[schema]}.{name}{bodies}")
    return statements
