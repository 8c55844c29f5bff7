"""Catalog queries (psql's `\\dt`, `\\d t`, `\\l`, `\\dn`) answered from the policy's declared schema alone.

A statement whose every relation is in pg_catalog or information_schema is a catalog query: it runs in its own
sandboxed, in-memory DuckDB that holds only EMPTY tables with the policy's declared columns and types, and DuckDB's
own pg_catalog views answer it. The private engine never sees it, no budget is charged, and nothing about the data
(row counts, statistics) can be in the answer: there is no data there. A statement that mixes a catalog relation
with anything else is not a catalog query and goes to the pipeline, which refuses it.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpsql.errors import ProgrammingError
from dpsql.policy import Policy
from dpsql.sql.sandbox import opened

_CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
# Functions psql's describe queries call that DuckDB lacks; answers that reveal nothing (no owner, no comment).
_MACROS = (
    "CREATE MACRO pg_get_userbyid(id) AS 'dpsql'",
    "CREATE MACRO pg_encoding_to_char(id) AS 'UTF8'",
    # DuckDB's views lack columns psql reads; reltuples is -1, PostgreSQL's "unknown": no row count is ever told.
    # Our own helper tables below are not the policy's: hidden from it.
    "CREATE VIEW dpsql_pg_class AS SELECT * REPLACE (-1::FLOAT AS reltuples), false AS relforcerowsecurity "
    "FROM pg_catalog.pg_class WHERE NOT starts_with(relname, 'dpsql_pg_')",
    # Empty: dpsql has no row-level policies.
    "CREATE TABLE dpsql_pg_policy (oid BIGINT, polname VARCHAR, polpermissive BOOLEAN, polroles BIGINT[], "
    "polqual VARCHAR, polwithcheck VARCHAR, polrelid BIGINT, polcmd VARCHAR)",
    "CREATE TABLE dpsql_pg_statistic_ext (oid BIGINT, stxrelid BIGINT, stxnamespace BIGINT, stxname VARCHAR, "
    "stxkind VARCHAR[], stxstattarget INTEGER)",
    "CREATE MACRO pg_get_statisticsobjdef_columns(id) AS ''",
    "CREATE TABLE dpsql_pg_publication (oid BIGINT, pubname VARCHAR, puballtables BOOLEAN)",
    "CREATE TABLE dpsql_pg_publication_namespace (pnpubid BIGINT, pnnspid BIGINT)",
    "CREATE TABLE dpsql_pg_publication_rel (prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, prattrs SMALLINT[])",
    "CREATE MACRO pg_relation_is_publishable(id) AS false",
    "CREATE MACRO array_upper(a, d) AS len(a)",
    # psycopg (and so SQLAlchemy) looks types up by name: none beyond DuckDB's own exist, so no name resolves.
    "CREATE MACRO to_regtype(name) AS NULL::BIGINT",
    # SQLAlchemy's reflection: no sequences, defaults, collations or comments.
    "CREATE MACRO pg_get_serial_sequence(t, c) AS NULL::VARCHAR",
    "CREATE MACRO pg_collation_is_visible(id) AS true",
    # Columns' types as PostgreSQL's OIDs (DuckDB's pg_attribute holds its own type ids, which clients would read as
    # other PostgreSQL types: the JDBC driver took DOUBLE for int4), and PostgreSQL's names for them.
    "CREATE VIEW dpsql_pg_attribute AS SELECT a.* REPLACE (coalesce((SELECT t.oid FROM pg_catalog.pg_type t "
    "WHERE t.typname = regexp_replace(pg_catalog.format_type(a.atttypid, a.atttypmod), '\\(.*\\)', '')), "
    "a.atttypid) AS atttypid) FROM pg_catalog.pg_attribute a",
    "CREATE MACRO format_type(id, m) AS CASE id WHEN 20 THEN 'bigint' WHEN 23 THEN 'integer' WHEN 21 THEN "
    "'smallint' WHEN 1043 THEN 'character varying' WHEN 25 THEN 'text' WHEN 701 THEN 'double precision' WHEN 700 "
    "THEN 'real' WHEN 16 THEN 'boolean' WHEN 1082 THEN 'date' WHEN 1114 THEN 'timestamp without time zone' WHEN "
    "1700 THEN 'numeric' ELSE (SELECT typname FROM pg_catalog.pg_type WHERE oid = id) END",
    # The declared tables are in PostgreSQL's default schema, public (DuckDB calls it main).
    "CREATE VIEW dpsql_pg_namespace AS SELECT * REPLACE (CASE nspname WHEN 'main' THEN 'public' ELSE nspname END "
    "AS nspname) FROM pg_catalog.pg_namespace",
    "CREATE TABLE dpsql_pg_sequence (seqrelid BIGINT, seqstart BIGINT, seqincrement BIGINT, seqmin BIGINT, "
    "seqmax BIGINT, seqcache BIGINT, seqcycle BOOLEAN)",
    "CREATE TABLE dpsql_pg_collation (oid BIGINT, collname VARCHAR, collnamespace BIGINT)",
    "CREATE TABLE dpsql_pg_attrdef (oid BIGINT, adrelid BIGINT, adnum SMALLINT, adbin VARCHAR)",
    "CREATE TABLE dpsql_pg_inherits (inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN)",
    "CREATE TABLE dpsql_pg_roles (oid BIGINT, rolname VARCHAR)",
    "CREATE VIEW dpsql_pg_database AS SELECT *, 0 AS datdba, 6 AS encoding, 'C' AS datcollate, 'C' AS datctype, "
    "NULL::VARCHAR AS daticulocale, 'c' AS datlocprovider, NULL::VARCHAR[] AS datacl FROM pg_catalog.pg_database",
)


def parameter_count(sql: str) -> int:
    """How many $n parameters a catalog query takes (the highest n)."""
    return max((int(n) for n in re.findall(r"\$(\d+)", sql)), default=0)


def is_catalog_query(sql: str) -> bool:
    """Whether `sql` is one SELECT that reads only pg_catalog / information_schema relations (at least one)."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except (SqlglotError, ValueError, RecursionError):
        return False
    if not isinstance(tree, exp.Query):
        return False
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tables = [t for t in tree.find_all(exp.Table) if t.name]
    catalog = 0
    for table in tables:
        schema = table.db.lower()
        if schema in _CATALOG_SCHEMAS or (not schema and table.name.lower().startswith("pg_")):
            catalog += 1
        elif schema or table.name.lower() not in ctes:
            return False
    return catalog > 0


# pg_catalog relations answered by our own dpsql_pg_* tables and views above (longest names first for the regex).
_OWN_RELATIONS = ("class", "database", "policy", "roles", "statistic_ext", "publication_namespace",
                  "publication_rel", "publication", "inherits", "sequence", "collation", "attrdef", "attribute",
                  "namespace")
# PostgreSQL spellings psql uses that DuckDB does not parse, with what DuckDB reads the same way.
_SPELLINGS = (
    (re.compile(r"OPERATOR\(pg_catalog\.([~!=<>]+)\)", re.IGNORECASE), r"\1"),
    (re.compile(r"\s+COLLATE\s+pg_catalog\.default", re.IGNORECASE), ""),
    (re.compile(r"\bpg_get_expr\(([^()]*),\s*true\s*\)", re.IGNORECASE), r"pg_get_expr(\1)"),  # no pretty flag
    (re.compile(r"::\s*(?:pg_catalog\.)?reg(?:type|class|proc|procedure|namespace|oper|role|collation|config)\b",
                re.IGNORECASE), "::VARCHAR"),  # regtype, regclass: names as text
    (re.compile(r"::\s*pg_catalog\.", re.IGNORECASE), "::"),
    (re.compile(r"\bAS\s+(?:pg_catalog\.)?reg(?:type|class|proc|namespace)\s*\)", re.IGNORECASE), "AS VARCHAR)"),
    (re.compile(r"\bjson_build_object\s*\(", re.IGNORECASE), "json_object("),
    (re.compile(rf"\bpg_catalog\.pg_({'|'.join(_OWN_RELATIONS)})\b(?!\s*\()", re.IGNORECASE), r"dpsql_pg_\1"),
    (re.compile(r"\bpg_catalog\.(?=\w+\s*\()", re.IGNORECASE), ""),  # functions: our macros live in main
)


def _duckdb_spelling(sql: str) -> str:
    for pattern, replacement in _SPELLINGS:
        sql = pattern.sub(replacement, sql)
    return sql


@dataclass
class Catalog:
    """An empty copy of the declared schema in a sandbox of its own, for catalog queries only."""

    policy: Policy
    _con: duckdb.DuckDBPyConnection | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            with opened() as con:
                for table in self.policy.tables.values():
                    # NOT NULL where the policy drops rows with NULL: a public fact, which clients show and reflect.
                    columns = ", ".join(f'"{c.name}" {c.type.duckdb}{"" if c.nullable else " NOT NULL"}'
                                        for c in table.columns.values())
                    con.execute(f'CREATE TABLE "{table.name}" ({columns})')
                for macro in _MACROS:
                    con.execute(macro)
            self._con = con
        return self._con

    def run(self, sql: str, parameters: list | None = None) -> tuple[tuple[tuple[str, str], ...], list[tuple]]:
        """The columns (name, DuckDB type) and rows of a catalog query, with its $n parameters (all NULL to describe
        it before they are bound: the tables are empty, so no value can matter but to the answer's rows)."""
        with self._lock:
            try:
                cursor = self._connection().cursor()
                relation = cursor.sql(_duckdb_spelling(sql), params=parameters or None)
                columns = tuple((name, str(kind)) for name, kind in zip(relation.columns, relation.types,
                                                                        strict=True))
                return columns, relation.fetchall()
            except duckdb.Error as exc:
                raise CatalogQueryError(f"dpsql cannot answer this catalog query: {exc}") from None


class CatalogQueryError(ProgrammingError):
    sqlstate = "0A000"
