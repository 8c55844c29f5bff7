"""A catalog query in PostgreSQL's dialect, read by sqlglot and written for the catalog's DuckDB.

`catalog_query` decides from the syntax tree whether a statement is a catalog query: one query (SELECT, set
operation) whose every relation is a catalog relation (relations.py), one of its own CTEs or a set-returning
function (unnest, generate_series); a query naming no relation at all (`SELECT version()`, `SELECT 1`) is one too.
Anything else (a declared table, a schema the catalog does not have) is not, and goes to the private pipeline.

`translate` rewrites the tree node by node: each relation becomes the catalog database's own (so no DuckDB system
view can answer instead), each call of a function PostgreSQL has and DuckDB lacks becomes the macro of that name
(functions.py), PostgreSQL's spellings DuckDB does not read (`OPERATOR(pg_catalog.~)`, `COLLATE`, the OID types
`::regclass`, `::oid`, `::name`) become what they mean, and each unnamed output gets PostgreSQL's name for it.

Two things sqlglot cannot parse are fixed on the tokens first (never inside a string or a comment): `select` as a
column name or alias (`AS select`, `t.select`, which PostgreSQL accepts after AS or a dot) is quoted, and an array
of an OID type (`::regtype[]`) is read as one type name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from dpsql.errors import DataError
from dpsql.frontends.server.catalog import relations
from dpsql.frontends.server.catalog.functions import DUCKDB_SCHEMA, NAMES, ROWS
from dpsql.frontends.server.catalog.relations import PG_CATALOG
from dpsql.frontends.server.types import text_array

_POSTGRES = Dialect.get_or_raise("postgres")
# Table functions a catalog query may read from (they make rows out of values, never out of a table).
_ROW_FUNCTIONS = frozenset({"generate_series", "generate_subscripts", "unnest", "_pg_expandarray",
                            "regexp_split_to_table", "current_schemas", "string_to_table"})
_TYPED_ROW_FUNCTIONS = (exp.GenerateSeries, exp.ExplodingGenerateSeries, exp.Unnest, exp.Explode)
# PostgreSQL's OID types: a number, whose text is a name.
_OID_TYPES = {"regclass": "regclass_name", "regtype": "regtype_name", "regproc": "regproc_name",
              "regprocedure": "regproc_name", "regnamespace": "regnamespace_name", "regrole": "regrole_name",
              "regoper": None, "regoperator": None, "regconfig": None, "regcollation": None}
_LOOKUPS = {"regclass": "to_regclass", "regtype": "to_regtype", "regnamespace": "to_regnamespace",
            "regproc": "to_regproc", "regprocedure": "to_regproc", "regrole": "to_regrole"}
# Other PostgreSQL types DuckDB does not have, as the type the catalog holds their values in.
_PLAIN_TYPES = {"oid": "BIGINT", "xid": "BIGINT", "xid8": "BIGINT", "cid": "BIGINT", "tid": "VARCHAR",
                "name": "VARCHAR", "char": "VARCHAR", '"char"': "VARCHAR", "pg_node_tree": "VARCHAR",
                "aclitem": "VARCHAR", "int2vector": "SMALLINT[]", "oidvector": "BIGINT[]", "inet": "VARCHAR",
                "information_schema.sql_identifier": "VARCHAR", "information_schema.character_data": "VARCHAR",
                "information_schema.yes_or_no": "VARCHAR", "information_schema.cardinal_number": "INTEGER",
                "information_schema.time_stamp": "TIMESTAMPTZ", "regtype_array": "VARCHAR[]", "name[]": "VARCHAR[]",
                "oid[]": "BIGINT[]", "regclass_array": "VARCHAR[]", "regproc_array": "VARCHAR[]",
                "regrole_array": "VARCHAR[]", "regnamespace_array": "VARCHAR[]", "aclitem[]": "VARCHAR[]"}
_OPERATORS = {"~": exp.RegexpLike, "~*": exp.RegexpILike, "=": exp.EQ, "<>": exp.NEQ, "!=": exp.NEQ, "<": exp.LT,
              ">": exp.GT, "<=": exp.LTE, ">=": exp.GTE, "~~": exp.Like, "~~*": exp.ILike, "||": exp.DPipe}
_NEGATED = {"!~": exp.RegexpLike, "!~*": exp.RegexpILike, "!~~": exp.Like, "!~~*": exp.ILike}
_RENAMED = {"json_build_object": "json_object", "jsonb_build_object": "json_object"}  # the same function in DuckDB
_TEXT_TYPES = {"text", "varchar", "name", "character varying", "bpchar", "char"}
_SELECT_WORDS = {TokenType.SELECT}  # keywords sqlglot refuses as a name, which PostgreSQL takes after AS and a dot


# Columns of type regproc: the catalog holds the function's name ('-' for none, as PostgreSQL prints OID 0).
_FUNCTION_COLUMNS = frozenset(c.name for r in relations.RELATIONS for c in r.columns if c.type.name == "regproc")
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


class NotCatalog(Exception):
    """The statement is not a catalog query (it names a table or a function the catalog does not have)."""


@dataclass(frozen=True)
class Translated:
    sql: str  # for the catalog's DuckDB
    parameters: int  # how many $n it takes (the highest n)
    arrays: frozenset[int] = frozenset()  # the n of each $n that is an array (`= ANY($n)`): text[] if untyped


def catalog_query(sql: str) -> exp.Query | None:
    """The syntax tree of `sql` if it is a catalog query, else None."""
    try:
        tree = sqlglot.parse_one(_fix_tokens(sql), read="postgres")
    except (SqlglotError, ValueError, RecursionError):
        return None
    if not isinstance(tree, exp.Query):
        return None
    try:
        _check_relations(tree)
    except NotCatalog:
        return None
    return tree


def _fix_tokens(sql: str) -> str:
    try:
        tokens = _POSTGRES.tokenize(sql)
    except (SqlglotError, ValueError):
        return sql
    edits: list[tuple[int, int, str]] = []
    for i, token in enumerate(tokens):
        before = tokens[i - 1].token_type if i else None
        if _qualifies_call_or_type(tokens, i):  # pg_catalog.array_to_string(...), ::pg_catalog.text: as unqualified
            edits.append((token.start, tokens[i + 1].end + 1, ""))
            continue
        if token.token_type in _SELECT_WORDS and before in (TokenType.ALIAS, TokenType.DOT):
            edits.append((token.start, token.end + 1, f'"{token.text.lower()}"'))
        elif (token.text.lower() in _OID_TYPES and before == TokenType.DCOLON and i + 2 < len(tokens)
              and tokens[i + 1].token_type == TokenType.L_BRACKET and tokens[i + 2].token_type == TokenType.R_BRACKET):
            edits.append((token.start, tokens[i + 2].end + 1, f"{token.text.lower()}_array"))
    for start, end, text in reversed(edits):
        sql = sql[:start] + text + sql[end:]
    return sql


def _qualifies_call_or_type(tokens: list, i: int) -> bool:
    """Whether tokens[i] is `pg_catalog` before `.` and a function call or after `::` (PostgreSQL finds both there
    unqualified: pg_catalog is first on every search path)."""
    if tokens[i].text.lower() != PG_CATALOG or i + 2 >= len(tokens) or tokens[i + 1].token_type != TokenType.DOT:
        return False
    if i and tokens[i - 1].token_type == TokenType.DCOLON:
        return True
    return i + 3 < len(tokens) and tokens[i + 3].token_type == TokenType.L_PAREN and \
        tokens[i + 2].token_type not in (TokenType.L_PAREN,)


def _ctes(tree: exp.Expression) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def _check_relations(tree: exp.Query) -> None:
    ctes = _ctes(tree)
    for table in tree.find_all(exp.Table):
        if isinstance(table.this, exp.Func):
            if not _row_function(table.this):
                raise NotCatalog(table.this.sql("postgres"))
            continue
        if table.catalog:
            raise NotCatalog(table.sql("postgres"))
        schema, name = table.db.lower(), table.name.lower()
        if not schema and name in ctes:
            continue
        if relations.find(schema, name) is None:
            raise NotCatalog(table.sql("postgres"))
    for function in tree.find_all(exp.Func):
        if isinstance(function.parent, exp.Table) and not _row_function(function):
            raise NotCatalog(function.sql("postgres"))


def _row_function(function: exp.Expression) -> bool:
    if isinstance(function, _TYPED_ROW_FUNCTIONS):
        return True
    name = function.name.lower() if isinstance(function, exp.Anonymous) else ""
    return name in _ROW_FUNCTIONS


def parameter_count(tree: exp.Expression) -> int:
    numbers = [int(p.name) for p in tree.find_all(exp.Parameter) if p.name.isdigit()]
    return max(numbers, default=0)


def translate(tree: exp.Query) -> Translated:
    """The DuckDB SQL of a catalog query (a tree from catalog_query)."""
    tree = tree.copy()
    _name_outputs(tree)
    ctes = _ctes(tree)
    tree = _bottom_up(tree, lambda node: _node(node, ctes))
    arrays = frozenset(int(p.name) for p in (_unparenthesized(any_.this) for any_ in tree.find_all(exp.Any))
                       if isinstance(p, exp.Parameter) and p.name.isdigit())
    return Translated(tree.sql("duckdb"), parameter_count(tree), arrays)


def _bottom_up(node: exp.Expression, change: Callable[[exp.Expression], exp.Expression]) -> exp.Expression:
    """`change` applied to every node, children first (so a replacement's arguments are already translated)."""
    for child in list(node.iter_expressions()):
        _bottom_up(child, change)
    new = change(node)
    if new is not node and node.parent is not None:
        node.replace(new)
    return new


def _unparenthesized(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _name_outputs(tree: exp.Query) -> None:
    """Give each unnamed output of the outermost SELECT the name PostgreSQL gives it."""
    select = tree
    while isinstance(select, exp.SetOperation):
        select = select.this
    if not isinstance(select, exp.Select):
        return
    for item in select.expressions:
        if isinstance(item, exp.Alias | exp.Column | exp.Star):
            continue
        item.replace(exp.alias_(item.copy(), postgres_name(item), quoted=True))


def postgres_name(node: exp.Expression) -> str:
    """The column name PostgreSQL gives an unnamed output: a column's or a function's name, a cast's inner name or
    else its type's, else ?column?."""
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Paren):
        return postgres_name(node.this)
    if isinstance(node, exp.Cast):
        inner = postgres_name(node.this)
        return inner if inner != "?column?" else node.to.sql("postgres").lower().split("(")[0]
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
        return postgres_name(node.expression)
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Identifier):
        return node.expression.name
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select) and len(node.this.expressions) == 1:
        return postgres_name(node.this.expressions[0].unalias()) if not isinstance(
            node.this.expressions[0], exp.Alias) else node.this.expressions[0].alias
    if isinstance(node, exp.Func):
        return _function_name(node)
    return "?column?"


def _function_name(node: exp.Func) -> str:
    names = {exp.CurrentUser: "current_user", exp.SessionUser: "session_user", exp.CurrentSchema: "current_schema",
             exp.CurrentDatabase: "current_database", exp.CurrentCatalog: "current_catalog",
             exp.CurrentVersion: "version", exp.ArraySize: "array_length", exp.Count: "count"}
    for kind, name in names.items():
        if isinstance(node, kind):
            return name
    return node.sql_name().lower()


def _macro(name: str, *arguments: exp.Expression, schema: str = relations.PG_CATALOG) -> exp.Expression:
    return exp.Dot(this=exp.to_identifier(DUCKDB_SCHEMA[schema]),
                   expression=exp.Anonymous(this=name, expressions=list(arguments)))


def _helper(name: str, argument: exp.Expression) -> exp.Expression:
    return exp.Dot(this=exp.to_identifier(ROWS), expression=exp.Anonymous(this=name, expressions=[argument]))


def _node(node: exp.Expression, ctes: set[str]) -> exp.Expression:
    if isinstance(node, exp.Table) and not isinstance(node.this, exp.Func):
        return _relation(node, ctes)
    if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Anonymous):
        schema = node.this.name.lower() if isinstance(node.this, exp.Identifier | exp.Column | exp.Var) else ""
        name = node.expression.name.lower()
        if schema in DUCKDB_SCHEMA and name in NAMES:
            return _macro(name, *node.expression.expressions, schema=schema if name != "_pg_expandarray" else
                          relations.INFORMATION_SCHEMA)
        return node
    if isinstance(node, exp.Anonymous) and node.name.lower() in NAMES and not isinstance(node.parent, exp.Dot):
        name = node.name.lower()
        schema = relations.INFORMATION_SCHEMA if name == "_pg_expandarray" else relations.PG_CATALOG
        return _macro(name, *node.expressions, schema=schema)
    if isinstance(node, exp.Anonymous) and node.name.lower() in _RENAMED:
        return exp.Anonymous(this=_RENAMED[node.name.lower()], expressions=node.expressions)
    replaced = _typed_function(node)
    if replaced is not None:
        return replaced
    if isinstance(node, exp.Collate):  # COLLATE pg_catalog.default: DuckDB's default collation is the same
        return node.this
    if isinstance(node, exp.Operator):
        return _operator(node)
    if isinstance(node, _COMPARISONS):
        return _function_comparison(node)
    if isinstance(node, exp.Any) and _array_text(node.this) is not None:
        return exp.Any(this=_array_text(node.this))
    if isinstance(node, exp.Cast):
        return _cast(node)
    if isinstance(node, exp.Column) and node.args.get("db") is not None:
        # pg_catalog.pg_namespace.nspname: the relation is named by its own name (its alias), without schema.
        node.set("db", None)
        node.set("catalog", None)
        return node
    if isinstance(node, exp.Column) and not node.table and node.name.lower() in ("user", "current_role") \
            and not node.this.quoted:
        return _macro("current_user")
    return node


def _typed_function(node: exp.Expression) -> exp.Expression | None:
    """sqlglot's own nodes for functions the catalog answers itself."""
    if isinstance(node, exp.CurrentUser | exp.SessionUser):
        return _macro("current_user")
    if isinstance(node, exp.CurrentSchema):
        return _macro("current_schema")
    if isinstance(node, exp.CurrentSchemas):
        return _macro("current_schemas", node.this if node.this is not None else exp.true())
    if isinstance(node, exp.CurrentDatabase | exp.CurrentCatalog):
        return _macro("current_database")
    if isinstance(node, exp.CurrentVersion):
        return _macro("version")
    if isinstance(node, exp.ArraySize):  # array_length(a, 1): DuckDB's len
        return exp.Anonymous(this="len", expressions=[node.this])
    return None


def _relation(table: exp.Table, ctes: set[str]) -> exp.Expression:
    schema, name = table.db.lower(), table.name.lower()
    if not schema and name in ctes:
        return table
    relation = relations.find(schema, name)
    if relation is None:  # catalog_query let only catalog relations through
        raise NotCatalog(table.sql("postgres"))
    alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(relation.name))
    return exp.Table(this=exp.to_identifier(relation.name), db=exp.to_identifier(DUCKDB_SCHEMA[relation.schema]),
                     alias=alias)


def _operator(node: exp.Operator) -> exp.Expression:
    symbol = str(node.args.get("operator") or "").split(".")[-1].strip()
    left, right = node.this, node.expression
    if symbol in _OPERATORS:
        return _OPERATORS[symbol](this=left, expression=right)
    if symbol in _NEGATED:
        return exp.Not(this=_NEGATED[symbol](this=left, expression=right))
    return node


def _function_comparison(node: exp.Binary) -> exp.Expression:
    """`typreceive != 0`: a regproc column compared with an OID; 0 is no function ('-'), other OIDs none here."""
    for column, other in ((node.this, node.expression), (node.expression, node.this)):
        if isinstance(column, exp.Column) and column.name.lower() in _FUNCTION_COLUMNS and \
                isinstance(other, exp.Literal) and not other.is_string:
            other.replace(exp.Literal.string("-") if other.this == "0" else exp.null())
    return node


def _type_name(to: exp.Expression) -> str:
    if isinstance(to, exp.ObjectIdentifier):
        return to.name.lower()
    text = re.sub(r"\s+", " ", to.sql("postgres").lower())
    return text.removeprefix("pg_catalog.")


def _array_text(node: exp.Expression) -> exp.Expression | None:
    """A string written as an array, `'{r,v}'`, as the list it stands for (PostgreSQL reads it so where an array
    is expected: `= ANY('{r,v}')`, `'{r,v}'::text[]`)."""
    inner = node.this if isinstance(node, exp.Paren) else node
    if not (isinstance(inner, exp.Literal) and inner.is_string and inner.this.startswith("{")):
        return None
    try:
        items = text_array(inner.this)
    except DataError:
        return None
    return exp.Array(expressions=[exp.Null() if item is None else exp.Literal.string(item) for item in items])


def _cast(node: exp.Cast) -> exp.Expression:
    if node.to.is_type(exp.DataType.Type.ARRAY) and _array_text(node.this) is not None:
        return exp.cast(_array_text(node.this), node.to)
    target = _type_name(node.to)
    base = target.removesuffix("_array")
    if base in _OID_TYPES:
        if target.endswith("_array"):
            function = _OID_TYPES.get(base)
            return _helper(f"{function}s", node.this) if function else exp.cast(node.this, "VARCHAR[]")
        return _oid_cast(node, base)
    plain = _PLAIN_TYPES.get(target)
    if plain is not None:
        return exp.cast(node.this, exp.DataType.build(plain, dialect="duckdb"))
    return node


def _oid_cast(node: exp.Cast, kind: str) -> exp.Expression:
    """`x::regclass`: a name given as text is looked up (its OID); a number stays the OID it is, and shows as the
    object's name where it is output as text (a select item, or cast on to text)."""
    value = node.this
    if isinstance(value, exp.Literal | exp.Parameter) and (value.is_string if isinstance(value, exp.Literal)
                                                           else True):
        if kind in ("regproc", "regprocedure"):  # the catalog keeps functions by name (pg_type.typinput)
            return exp.cast(value, "VARCHAR")
        lookup = _LOOKUPS.get(kind)
        return _macro(lookup, value) if lookup else exp.cast(value, "BIGINT")
    parent = node.parent
    shown = isinstance(parent, exp.Alias | exp.Select) or (
        isinstance(parent, exp.Cast) and _type_name(parent.to) in _TEXT_TYPES) or isinstance(parent, exp.DPipe)
    function = _OID_TYPES.get(kind)
    if shown and function:
        return _helper(function, value)
    return exp.cast(value, "BIGINT")
