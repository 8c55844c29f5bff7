"""A SQLAlchemy dialect for the embedded DB-API: `create_engine("dpsql:///path/to/policy.toml?analyst=alice")`.

pandas, Superset and other SQLAlchemy users then use dpsql without a server: `pandas.read_sql(sql, engine)`
answers a private query (charged as through `dpsql.connect`), and the inspector lists the policy's tables and
columns in schema `public` from the policy alone (no query, no charge). The URL's path is the policy file
(`dpsql:///relative/policy.toml`, `dpsql:////absolute/policy.toml`); its query may give `analyst`, `epsilon` and
`create_ledger`. There are no keys, indexes or constraints, and nothing is ever written.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default
from sqlalchemy.engine.url import URL

from dpsql.frontends.schema_text import column_description, table_description
from dpsql.policy import ColumnPolicy, ColumnType, Policy, TablePolicy

PUBLIC = "public"


def _sqlalchemy_type(column: ColumnPolicy) -> sqltypes.TypeEngine:
    if column.type is ColumnType.TEXT:
        return sqltypes.String(column.text_length)
    return {ColumnType.INT: sqltypes.BigInteger(), ColumnType.FLOAT: sqltypes.Double(),
            ColumnType.BOOL: sqltypes.Boolean(), ColumnType.DATE: sqltypes.Date(),
            ColumnType.TIMESTAMP: sqltypes.DateTime()}[column.type]


class DpsqlDialect(default.DefaultDialect):
    name = "dpsql"
    driver = "dbapi"
    default_paramstyle = "qmark"
    supports_statement_cache = True
    supports_native_boolean = True
    supports_native_decimal = True
    supports_alter = False
    supports_sequences = False
    supports_default_values = False
    supports_empty_insert = False
    supports_multivalues_insert = False
    postfetch_lastrowid = False
    default_schema_name = PUBLIC

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        from dpsql.frontends import dbapi

        return dbapi

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        options: dict[str, Any] = {"policy": url.database or ""}
        query = dict(url.query)
        if "analyst" in query:
            options["analyst"] = str(query.pop("analyst"))
        if "epsilon" in query:
            options["epsilon"] = float(str(query.pop("epsilon")))
        if "create_ledger" in query:
            options["create_ledger"] = str(query.pop("create_ledger")).lower() in ("1", "true", "yes", "on")
        if query:
            raise ValueError(f"dpsql:// takes analyst, epsilon and create_ledger, not {', '.join(sorted(query))}")
        return [], options

    # Nothing is ever written: there is no transaction to keep, no isolation level to set.
    def get_isolation_level(self, dbapi_connection: Any) -> str:
        return "AUTOCOMMIT"

    def set_isolation_level(self, dbapi_connection: Any, level: str) -> None:
        pass

    def get_isolation_level_values(self, dbapi_connection: Any) -> list[str]:
        return ["AUTOCOMMIT"]

    def do_ping(self, dbapi_connection: Any) -> bool:
        return dbapi_connection.session is not None  # raises the DB-API's own error once it is closed

    def _get_server_version_info(self, connection: Any) -> tuple[int, ...]:
        return (0, 1)

    def _get_default_schema_name(self, connection: Any) -> str:
        return PUBLIC

    # ---- reflection, from the policy alone -----------------------------------------------------------------------

    @staticmethod
    def _policy(connection: Any) -> Policy:
        return connection.connection.dbapi_connection.session.policy

    def _table(self, connection: Any, table_name: str, schema: str | None) -> TablePolicy:
        from sqlalchemy.exc import NoSuchTableError

        table = self._policy(connection).table(table_name) if schema in (None, PUBLIC) else None
        if table is None:
            raise NoSuchTableError(table_name)
        return table

    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        return [PUBLIC]

    def has_table(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> bool:
        return schema in (None, PUBLIC) and self._policy(connection).table(table_name) is not None

    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return list(self._policy(connection).tables) if schema in (None, PUBLIC) else []

    def get_view_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return []

    def get_columns(self, connection: Any, table_name: str, schema: str | None = None,
                    **kw: Any) -> list[dict[str, Any]]:
        table = self._table(connection, table_name, schema)
        return [{"name": c.name, "type": _sqlalchemy_type(c), "nullable": c.nullable, "default": None,
                 "autoincrement": False, "comment": column_description(table, c)} for c in table.columns.values()]

    def get_pk_constraint(self, connection: Any, table_name: str, schema: str | None = None,
                          **kw: Any) -> dict[str, Any]:
        self._table(connection, table_name, schema)
        return {"constrained_columns": [], "name": None}

    def _nothing(self, connection: Any, table_name: str, schema: str | None = None, **kw: Any) -> list[Any]:
        """No key, index or constraint exists (for a table that does)."""
        self._table(connection, table_name, schema)
        return []

    get_foreign_keys = get_indexes = get_unique_constraints = get_check_constraints = _nothing

    def get_table_comment(self, connection: Any, table_name: str, schema: str | None = None,
                          **kw: Any) -> dict[str, Any]:
        return {"text": table_description(self._table(connection, table_name, schema))}


dialect = DpsqlDialect
