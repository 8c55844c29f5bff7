"""The relations of PostgreSQL's catalog that dpsql serves: their names, OIDs and columns, as PostgreSQL 16 has them.

Clients select these columns by name (psql's `\\d`, pgjdbc's DatabaseMetaData, SQLAlchemy's reflection, pgcli's
completion), so every column a tool might read is here with PostgreSQL's name and type, even where dpsql has
nothing to put in it (no indexes, no constraints, no sequences: those relations are present and empty).

Where a relation's rows come from (tables.py): the policy alone, fixed for the server's life ("catalog"); or the
connection asking ("connection": its settings, its cursors, its login; refreshed before each of its queries).
Every column naming the database (`table_catalog`, `datname`, ...) holds the name the client connected with.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.frontends.server.catalog.builtin_types import BY_NAME, PgType

PG_CATALOG = "pg_catalog"
INFORMATION_SCHEMA = "information_schema"
PUBLIC = "public"
# PostgreSQL's OIDs of the three schemas (information_schema's is assigned at initdb: any fixed number will do).
NAMESPACES = {PG_CATALOG: 11, PUBLIC: 2200, INFORMATION_SCHEMA: 13000}
OWNER = 10  # the bootstrap superuser owns everything, as in PostgreSQL; pg_get_userbyid(10) is "dpsql"
OWNER_NAME = "dpsql"


@dataclass(frozen=True)
class Column:
    name: str
    type: PgType


@dataclass(frozen=True)
class Relation:
    schema: str
    name: str
    oid: int
    columns: tuple[Column, ...]
    view: bool = False  # relkind 'v' (PostgreSQL's system views and every information_schema relation)
    per_connection: bool = False  # rows from the connection asking (its settings, cursors, login)

    @property
    def database_columns(self) -> tuple[str, ...]:
        """The columns that name the database: they show the name the client connected with."""
        return tuple(c.name for c in self.columns
                     if c.name.endswith("_catalog") or c.name in ("catalog_name", "datname"))


def _columns(spec: str) -> tuple[Column, ...]:
    """'oid oid, relname name, relacl aclitem[]' -> Columns of those PostgreSQL types."""
    columns = []
    for part in spec.split(","):
        name, kind = part.split()
        columns.append(Column(name, BY_NAME[f"_{kind[:-2]}" if kind.endswith("[]") else kind]))
    return tuple(columns)


_NEXT_VIEW_OID = iter(range(12000, 12999))


def _catalog(name: str, oid: int | None, spec: str, *, per_connection: bool = False) -> Relation:
    """A pg_catalog relation: a table where PostgreSQL's OID is given, else a system view."""
    return Relation(PG_CATALOG, name, oid if oid is not None else next(_NEXT_VIEW_OID), _columns(spec),
                    view=oid is None, per_connection=per_connection)


def _information(name: str, spec: str) -> Relation:
    """An information_schema view; its SQL domains (sql_identifier, character_data, cardinal_number, yes_or_no)
    are given as the types they are over (name, text, int4, text)."""
    return Relation(INFORMATION_SCHEMA, name, next(_NEXT_VIEW_OID), _columns(spec), view=True)


_STAT_TABLES = (
    "relid oid, schemaname name, relname name, seq_scan int8, last_seq_scan timestamptz, seq_tup_read int8, "
    "idx_scan int8, last_idx_scan timestamptz, idx_tup_fetch int8, n_tup_ins int8, n_tup_upd int8, n_tup_del int8, "
    "n_tup_hot_upd int8, n_tup_newpage_upd int8, n_live_tup int8, n_dead_tup int8, n_mod_since_analyze int8, "
    "n_ins_since_vacuum int8, last_vacuum timestamptz, last_autovacuum timestamptz, last_analyze timestamptz, "
    "last_autoanalyze timestamptz, vacuum_count int8, autovacuum_count int8, analyze_count int8, "
    "autoanalyze_count int8")

RELATIONS: tuple[Relation, ...] = (
    _catalog("pg_namespace", 2615, "oid oid, nspname name, nspowner oid, nspacl aclitem[]"),
    _catalog("pg_class", 1259,
             "oid oid, relname name, relnamespace oid, reltype oid, reloftype oid, relowner oid, relam oid, "
             "relfilenode oid, reltablespace oid, relpages int4, reltuples float4, relallvisible int4, "
             "reltoastrelid oid, relhasindex bool, relisshared bool, relpersistence char, relkind char, "
             "relnatts int2, relchecks int2, relhasrules bool, relhastriggers bool, relhassubclass bool, "
             "relrowsecurity bool, relforcerowsecurity bool, relispopulated bool, relreplident char, "
             "relispartition bool, relrewrite oid, relfrozenxid xid, relminmxid xid, relacl aclitem[], "
             "reloptions text[], relpartbound pg_node_tree"),
    _catalog("pg_attribute", 1249,
             "attrelid oid, attname name, atttypid oid, attlen int2, attnum int2, attcacheoff int4, atttypmod int4, "
             "attndims int2, attbyval bool, attalign char, attstorage char, attcompression char, attnotnull bool, "
             "atthasdef bool, atthasmissing bool, attidentity char, attgenerated char, attisdropped bool, "
             "attislocal bool, attinhcount int2, attstattarget int2, attcollation oid, attacl aclitem[], "
             "attoptions text[], attfdwoptions text[], attmissingval text[]"),
    _catalog("pg_type", 1247,
             "oid oid, typname name, typnamespace oid, typowner oid, typlen int2, typbyval bool, typtype char, "
             "typcategory char, typispreferred bool, typisdefined bool, typdelim char, typrelid oid, "
             "typsubscript regproc, typelem oid, typarray oid, typinput regproc, typoutput regproc, "
             "typreceive regproc, typsend regproc, typmodin regproc, typmodout regproc, typanalyze regproc, "
             "typalign char, typstorage char, typnotnull bool, typbasetype oid, typtypmod int4, typndims int4, "
             "typcollation oid, typdefaultbin pg_node_tree, typdefault text, typacl aclitem[]"),
    _catalog("pg_index", 2610,
             "indexrelid oid, indrelid oid, indnatts int2, indnkeyatts int2, indisunique bool, "
             "indnullsnotdistinct bool, indisprimary bool, indisexclusion bool, indimmediate bool, "
             "indisclustered bool, indisvalid bool, indcheckxmin bool, indisready bool, indislive bool, "
             "indisreplident bool, indkey int2vector, indcollation oidvector, indclass oidvector, "
             "indoption int2vector, indexprs pg_node_tree, indpred pg_node_tree"),
    _catalog("pg_constraint", 2606,
             "oid oid, conname name, connamespace oid, contype char, condeferrable bool, condeferred bool, "
             "convalidated bool, conrelid oid, contypid oid, conindid oid, conparentid oid, confrelid oid, "
             "confupdtype char, confdeltype char, confmatchtype char, conislocal bool, coninhcount int2, "
             "connoinherit bool, conkey int2[], confkey int2[], conpfeqop oid[], conppeqop oid[], conffeqop oid[], "
             "confdelsetcols int2[], conexclop oid[], conbin pg_node_tree"),
    _catalog("pg_am", 2601, "oid oid, amname name, amhandler regproc, amtype char"),
    _catalog("pg_opclass", 2616,
             "oid oid, opcmethod oid, opcname name, opcnamespace oid, opcowner oid, opcfamily oid, opcintype oid, "
             "opcdefault bool, opckeytype oid"),
    _catalog("pg_proc", 1255,
             "oid oid, proname name, pronamespace oid, proowner oid, prolang oid, procost float4, prorows float4, "
             "provariadic oid, prosupport regproc, prokind char, prosecdef bool, proleakproof bool, "
             "proisstrict bool, proretset bool, provolatile char, proparallel char, pronargs int2, "
             "pronargdefaults int2, prorettype oid, proargtypes oidvector, proallargtypes oid[], "
             "proargmodes char[], proargnames text[], proargdefaults pg_node_tree, protrftypes oid[], prosrc text, "
             "probin text, prosqlbody pg_node_tree, proconfig text[], proacl aclitem[]"),
    _catalog("pg_database", 1262,
             "oid oid, datname name, datdba oid, encoding int4, datlocprovider char, datistemplate bool, "
             "datallowconn bool, datconnlimit int4, datfrozenxid xid, datminmxid xid, dattablespace oid, "
             "datcollate text, datctype text, daticulocale text, daticurules text, datcollversion text, "
             "datacl aclitem[]"),
    _catalog("pg_description", 2609, "objoid oid, classoid oid, objsubid int4, description text"),
    _catalog("pg_shdescription", 2396, "objoid oid, classoid oid, description text"),
    _catalog("pg_attrdef", 2604, "oid oid, adrelid oid, adnum int2, adbin pg_node_tree"),
    _catalog("pg_inherits", 2611, "inhrelid oid, inhparent oid, inhseqno int4, inhdetachpending bool"),
    _catalog("pg_collation", 3456,
             "oid oid, collname name, collnamespace oid, collowner oid, collprovider char, collisdeterministic bool, "
             "collencoding int4, collcollate text, collctype text, colliculocale text, collicurules text, "
             "collversion text"),
    _catalog("pg_sequence", 2224,
             "seqrelid oid, seqtypid oid, seqstart int8, seqincrement int8, seqmax int8, seqmin int8, seqcache int8, "
             "seqcycle bool"),
    _catalog("pg_statistic_ext", 3381,
             "oid oid, stxrelid oid, stxname name, stxnamespace oid, stxowner oid, stxstattarget int4, "
             "stxkeys int2vector, stxkind char[], stxexprs pg_node_tree"),
    _catalog("pg_policy", 3256,
             "oid oid, polname name, polrelid oid, polcmd char, polpermissive bool, polroles oid[], "
             "polqual pg_node_tree, polwithcheck pg_node_tree"),
    _catalog("pg_publication", 6104,
             "oid oid, pubname name, pubowner oid, puballtables bool, pubinsert bool, pubupdate bool, "
             "pubdelete bool, pubtruncate bool, pubviaroot bool"),
    _catalog("pg_publication_rel", 6106, "oid oid, prpubid oid, prrelid oid, prqual pg_node_tree, "
                                         "prattrs int2vector"),
    _catalog("pg_publication_namespace", 6237, "oid oid, pnpubid oid, pnnspid oid"),
    _catalog("pg_extension", 3079,
             "oid oid, extname name, extowner oid, extnamespace oid, extrelocatable bool, extversion text, "
             "extconfig oid[], extcondition text[]"),
    _catalog("pg_enum", 3501, "oid oid, enumtypid oid, enumsortorder float4, enumlabel name"),
    _catalog("pg_range", 3541,
             "rngtypid oid, rngsubtype oid, rngmultitypid oid, rngcollation oid, rngsubopc oid, "
             "rngcanonical regproc, rngsubdiff regproc"),
    _catalog("pg_trigger", 2620,
             "oid oid, tgrelid oid, tgparentid oid, tgname name, tgfoid oid, tgtype int2, tgenabled char, "
             "tgisinternal bool, tgconstrrelid oid, tgconstrindid oid, tgconstraint oid, tgdeferrable bool, "
             "tginitdeferred bool, tgnargs int2, tgattr int2vector, tgargs bytea, tgqual pg_node_tree, "
             "tgoldtable name, tgnewtable name"),
    _catalog("pg_rewrite", 2618,
             "oid oid, rulename name, ev_class oid, ev_type char, ev_enabled char, is_instead bool, "
             "ev_qual pg_node_tree, ev_action pg_node_tree"),
    _catalog("pg_depend", 2608,
             "classid oid, objid oid, objsubid int4, refclassid oid, refobjid oid, refobjsubid int4, deptype char"),
    _catalog("pg_language", 2612,
             "oid oid, lanname name, lanowner oid, lanispl bool, lanpltrusted bool, lanplcallfoid oid, "
             "laninline oid, lanvalidator oid, lanacl aclitem[]"),
    _catalog("pg_tablespace", 1213, "oid oid, spcname name, spcowner oid, spcacl aclitem[], spcoptions text[]"),
    _catalog("pg_operator", 2617,
             "oid oid, oprname name, oprnamespace oid, oprowner oid, oprkind char, oprcanmerge bool, "
             "oprcanhash bool, oprleft oid, oprright oid, oprresult oid, oprcom oid, oprnegate oid, "
             "oprcode regproc, oprrest regproc, oprjoin regproc"),
    _catalog("pg_foreign_table", 3118, "ftrelid oid, ftserver oid, ftoptions text[]"),
    _catalog("pg_partitioned_table", 3350,
             "partrelid oid, partstrat char, partnatts int2, partdefid oid, partattrs int2vector, "
             "partclass oidvector, partcollation oidvector, partexprs pg_node_tree"),
    _catalog("pg_event_trigger", 3466,
             "oid oid, evtname name, evtevent name, evtowner oid, evtfoid oid, evtenabled char, evttags text[]"),
    _catalog("pg_cast", 2605,
             "oid oid, castsource oid, casttarget oid, castfunc oid, castcontext char, castmethod char"),
    _catalog("pg_auth_members", 1261,
             "oid oid, roleid oid, member oid, grantor oid, admin_option bool, inherit_option bool, set_option bool"),
    # System views.
    _catalog("pg_roles", None,
             "rolname name, rolsuper bool, rolinherit bool, rolcreaterole bool, rolcreatedb bool, "
             "rolcanlogin bool, rolreplication bool, rolconnlimit int4, rolpassword text, "
             "rolvaliduntil timestamptz, rolbypassrls bool, rolconfig text[], oid oid", per_connection=True),
    _catalog("pg_user", None,
             "usename name, usesysid oid, usecreatedb bool, usesuper bool, userepl bool, usebypassrls bool, "
             "passwd text, valuntil timestamptz, useconfig text[]", per_connection=True),
    _catalog("pg_tables", None,
             "schemaname name, tablename name, tableowner name, tablespace name, hasindexes bool, hasrules bool, "
             "hastriggers bool, rowsecurity bool"),
    _catalog("pg_views", None, "schemaname name, viewname name, viewowner name, definition text"),
    _catalog("pg_matviews", None,
             "schemaname name, matviewname name, matviewowner name, tablespace name, hasindexes bool, "
             "ispopulated bool, definition text"),
    _catalog("pg_indexes", None, "schemaname name, tablename name, indexname name, tablespace name, "
                                 "indexdef text"),
    _catalog("pg_sequences", None,
             "schemaname name, sequencename name, sequenceowner name, data_type regtype, start_value int8, "
             "min_value int8, max_value int8, increment_by int8, cycle bool, cache_size int8, last_value int8"),
    _catalog("pg_settings", None,
             "name text, setting text, unit text, category text, short_desc text, extra_desc text, context text, "
             "vartype text, source text, min_val text, max_val text, enumvals text[], boot_val text, reset_val text, "
             "sourcefile text, sourceline int4, pending_restart bool", per_connection=True),
    _catalog("pg_cursors", None,
             "name text, statement text, is_holdable bool, is_binary bool, is_scrollable bool, "
             "creation_time timestamptz", per_connection=True),
    _catalog("pg_prepared_statements", None,
             "name text, statement text, prepare_time timestamptz, parameter_types regtype[], "
             "result_types regtype[], from_sql bool, generic_plans int8, custom_plans int8"),
    _catalog("pg_stat_activity", None,
             "datid oid, datname name, pid int4, leader_pid int4, usesysid oid, usename name, "
             "application_name text, client_addr text, client_hostname text, client_port int4, "
             "backend_start timestamptz, xact_start timestamptz, query_start timestamptz, "
             "state_change timestamptz, wait_event_type text, wait_event text, state text, backend_xid xid, "
             "backend_xmin xid, query_id int8, query text, backend_type text", per_connection=True),
    # Row counts and scans of the data are not public: every figure is 0 or NULL (unknown), never the data's.
    _catalog("pg_stat_user_tables", None, _STAT_TABLES),
    _catalog("pg_stat_all_tables", None, _STAT_TABLES),
    _catalog("pg_stats", None,
             "schemaname name, tablename name, attname name, inherited bool, null_frac float4, avg_width int4, "
             "n_distinct float4, most_common_vals text[], most_common_freqs float4[], histogram_bounds text[], "
             "correlation float4"),
    _catalog("pg_available_extensions", None, "name name, default_version text, installed_version text, "
                                              "comment text"),
    _catalog("pg_timezone_names", None, "name text, abbrev text, utc_offset interval, is_dst bool"),
    # information_schema.
    _information("schemata",
                 "catalog_name name, schema_name name, schema_owner name, default_character_set_catalog name, "
                 "default_character_set_schema name, default_character_set_name name, sql_path text"),
    _information("tables",
                 "table_catalog name, table_schema name, table_name name, table_type text, "
                 "self_referencing_column_name name, reference_generation text, user_defined_type_catalog name, "
                 "user_defined_type_schema name, user_defined_type_name name, is_insertable_into text, "
                 "is_typed text, commit_action text"),
    _information("columns",
                 "table_catalog name, table_schema name, table_name name, column_name name, ordinal_position int4, "
                 "column_default text, is_nullable text, data_type text, character_maximum_length int4, "
                 "character_octet_length int4, numeric_precision int4, numeric_precision_radix int4, "
                 "numeric_scale int4, datetime_precision int4, interval_type text, interval_precision int4, "
                 "character_set_catalog name, character_set_schema name, character_set_name name, "
                 "collation_catalog name, collation_schema name, collation_name name, domain_catalog name, "
                 "domain_schema name, domain_name name, udt_catalog name, udt_schema name, udt_name name, "
                 "scope_catalog name, scope_schema name, scope_name name, maximum_cardinality int4, "
                 "dtd_identifier name, is_self_referencing text, is_identity text, identity_generation text, "
                 "identity_start text, identity_increment text, identity_maximum text, identity_minimum text, "
                 "identity_cycle text, is_generated text, generation_expression text, is_updatable text"),
    _information("views",
                 "table_catalog name, table_schema name, table_name name, view_definition text, check_option text, "
                 "is_updatable text, is_insertable_into text, is_trigger_updatable text, "
                 "is_trigger_deletable text, is_trigger_insertable_into text"),
    _information("table_constraints",
                 "constraint_catalog name, constraint_schema name, constraint_name name, table_catalog name, "
                 "table_schema name, table_name name, constraint_type text, is_deferrable text, "
                 "initially_deferred text, enforced text, nulls_distinct text"),
    _information("key_column_usage",
                 "constraint_catalog name, constraint_schema name, constraint_name name, table_catalog name, "
                 "table_schema name, table_name name, column_name name, ordinal_position int4, "
                 "position_in_unique_constraint int4"),
    _information("constraint_column_usage",
                 "table_catalog name, table_schema name, table_name name, column_name name, "
                 "constraint_catalog name, constraint_schema name, constraint_name name"),
    _information("constraint_table_usage",
                 "table_catalog name, table_schema name, table_name name, constraint_catalog name, "
                 "constraint_schema name, constraint_name name"),
    _information("referential_constraints",
                 "constraint_catalog name, constraint_schema name, constraint_name name, "
                 "unique_constraint_catalog name, unique_constraint_schema name, unique_constraint_name name, "
                 "match_option text, update_rule text, delete_rule text"),
    _information("check_constraints",
                 "constraint_catalog name, constraint_schema name, constraint_name name, check_clause text"),
    _information("table_privileges",
                 "grantor name, grantee name, table_catalog name, table_schema name, table_name name, "
                 "privilege_type text, is_grantable text, with_hierarchy text"),
    _information("role_table_grants",
                 "grantor name, grantee name, table_catalog name, table_schema name, table_name name, "
                 "privilege_type text, is_grantable text, with_hierarchy text"),
    _information("column_privileges",
                 "grantor name, grantee name, table_catalog name, table_schema name, table_name name, "
                 "column_name name, privilege_type text, is_grantable text"),
    _information("routines",
                 "specific_catalog name, specific_schema name, specific_name name, routine_catalog name, "
                 "routine_schema name, routine_name name, routine_type text, data_type text, type_udt_catalog name, "
                 "type_udt_schema name, type_udt_name name, routine_body text, routine_definition text, "
                 "external_language text, is_deterministic text, security_type text"),
    _information("parameters",
                 "specific_catalog name, specific_schema name, specific_name name, ordinal_position int4, "
                 "parameter_mode text, is_result text, as_locator text, parameter_name name, data_type text, "
                 "udt_catalog name, udt_schema name, udt_name name, parameter_default text"),
    _information("sequences",
                 "sequence_catalog name, sequence_schema name, sequence_name name, data_type text, "
                 "numeric_precision int4, numeric_precision_radix int4, numeric_scale int4, start_value text, "
                 "minimum_value text, maximum_value text, increment text, cycle_option text"),
    _information("character_sets",
                 "character_set_catalog name, character_set_schema name, character_set_name name, "
                 "character_repertoire name, form_of_use name, default_collate_catalog name, "
                 "default_collate_schema name, default_collate_name name"),
    _information("domains",
                 "domain_catalog name, domain_schema name, domain_name name, data_type text, "
                 "character_maximum_length int4, numeric_precision int4, numeric_scale int4, domain_default text, "
                 "udt_catalog name, udt_schema name, udt_name name"),
    _information("triggers",
                 "trigger_catalog name, trigger_schema name, trigger_name name, event_manipulation text, "
                 "event_object_catalog name, event_object_schema name, event_object_table name, "
                 "action_order int4, action_condition text, action_statement text, action_orientation text, "
                 "action_timing text"),
    _information("element_types",
                 "object_catalog name, object_schema name, object_name name, object_type text, "
                 "collection_type_identifier name, data_type text, udt_catalog name, udt_schema name, udt_name name"),
    _information("enabled_roles", "role_name name"),
    _information("applicable_roles", "grantee name, role_name name, is_grantable text"),
)

BY_NAME_IN: dict[tuple[str, str], Relation] = {(r.schema, r.name): r for r in RELATIONS}
# An unqualified pg_* name is pg_catalog's (it is first on every search path, as in PostgreSQL).
UNQUALIFIED = {r.name: r for r in RELATIONS if r.schema == PG_CATALOG}


def find(schema: str, name: str) -> Relation | None:
    """The catalog relation a query names (schema '' when unqualified), or None."""
    if not schema:
        return UNQUALIFIED.get(name)
    return BY_NAME_IN.get((schema, name))
