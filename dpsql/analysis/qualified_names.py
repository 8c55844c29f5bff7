"""Tables named as tools write them: `public.visits`, `"public"."visits"`, `<database>.public.visits`.

The declared tables are in PostgreSQL's default schema, `public`, of the database the analyst connected to (the
server's catalog says so, and tools qualify names from it). Such a name is the declared table itself: the
qualifiers are dropped, before anything else reads the query. Any other schema or database is left as written,
for the checker to refuse as an unknown table.
"""

from __future__ import annotations

from sqlglot import exp

PUBLIC = "public"


def unqualified(tree: exp.Expression, database: str | None) -> exp.Expression:
    """`tree` with `public.t` and `<database>.public.t` read as `t` (the same tree if no name is qualified so)."""
    tables = [t for t in tree.find_all(exp.Table) if _default_schema(t, database)]
    if not tables:
        return tree
    tree = tree.copy()
    for table in tree.find_all(exp.Table):
        if _default_schema(table, database):
            table.set("db", None)
            table.set("catalog", None)
    return tree


def _default_schema(table: exp.Table, database: str | None) -> bool:
    schema = table.args.get("db")
    if not isinstance(schema, exp.Identifier) or not _named(schema, PUBLIC):
        return False
    catalog = table.args.get("catalog")
    return catalog is None or (database is not None and isinstance(catalog, exp.Identifier)
                               and _named(catalog, database))


def _named(identifier: exp.Identifier, name: str) -> bool:
    """Whether the identifier names `name` as PostgreSQL reads it: folded to lower case unless quoted."""
    return identifier.name == name if identifier.quoted else identifier.name.lower() == name.lower()
