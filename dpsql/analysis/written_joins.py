"""Joins as analysts write them, into the form the join rules read (relation.py): every rewrite here is exact.

- A comma join (`FROM visits v, departments d WHERE v.department = d.department`), or a CROSS JOIN, with WHERE
  equalities between its table and an earlier one is the INNER JOIN on those equalities: `FROM a, b WHERE e AND
  rest` keeps the pairs of rows where e and rest are TRUE, and so does `FROM a JOIN b ON e WHERE rest`. Only the
  plain column equalities `a.x = b.y` between the new table and an earlier one move: they are the join conditions
  the rules need (each private table on its unit, each public one on its keys); the rest stays in WHERE. A comma
  join without one stays as written, and is refused as a cross join.
- `FROM p RIGHT JOIN v ON c` is `FROM v LEFT JOIN p ON c` (the same pairs, the kept side is v): the mirrored LEFT.
  Only when the RIGHT JOIN is the first join (its left side is one table), so that the mirror is a flat join, and
  only when the table it keeps is private: a RIGHT JOIN that keeps a public table's rows would count rows that
  belong to no person (removing a person could turn a matched row into an unmatched one that still counts).
- An INNER join's ON condition may hold more than the equalities the rules need: a condition on one side
  (`ON s.department = v.department AND s.role = 'nurse'`), or any other condition. For an INNER join, a conjunct
  of ON is a conjunct of WHERE (a row pair is kept when all of them are TRUE either way), so every conjunct but the
  plain column equalities between the joined table and an earlier one moves to WHERE, where it is a filter of the
  joined rows (a filter only removes rows: the bound stays the join's). Of a LEFT join with a public table on the
  optional side, a conjunct that reads only that table is a filter of the table before the join (`LEFT JOIN (SELECT
  * FROM t WHERE f) AS t ON ...` keeps the same rows: a row of the kept side that meets no row passing f is kept
  with NULLs, as it is when f is in ON); the public relation then has its own rows per key (public_relations.py).
  An ON with no plain equality left stays as written, for the rules to refuse with their reason.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.errors import QueryRejected
from dpsql.policy import Policy
from dpsql.sql.parse import DIALECT


def written_joins(tree: exp.Select, policy: Policy) -> None:
    """Rewrite, in place, RIGHT and comma joins of every SELECT in the tree into the form relation.py reads."""
    for select in list(tree.find_all(exp.Select)):
        if select.args.get("joins") and select.args.get("from_") is not None:
            _mirror_right_join(select, policy)
            _comma_joins(select, policy)


def join_filters(tree: exp.Select, policy: Policy) -> None:
    """Move, in place, the conditions of every join's ON that are not its join keys to where they filter."""
    for select in list(tree.find_all(exp.Select)):
        if select.args.get("joins") and select.args.get("from_") is not None:
            _on_filters(select, policy)


def has_written_joins(tree: exp.Select) -> bool:
    """Whether any SELECT of the tree has a join this module may rewrite."""
    return any(select.args.get("joins") for select in tree.find_all(exp.Select))


def _sources(select: exp.Select) -> list[exp.Expression]:
    return [select.args["from_"].this] + [join.this for join in select.args.get("joins") or []]


def _public(source: exp.Expression, policy: Policy) -> bool | None:
    """Whether a FROM source is a declared public table (None: not a declared table, or not known here)."""
    if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
        table = policy.table(source.name)
        return table.public if table is not None else None
    return None


def columns_of(source: exp.Expression, policy: Policy) -> set[str] | None:
    """The column names a FROM source exposes, when known from the SQL and the policy (None otherwise)."""
    if isinstance(source, exp.Table) and isinstance(source.this, exp.Identifier):
        table = policy.table(source.name)
        alias = source.args.get("alias")
        if table is None or (alias is not None and alias.args.get("columns")):
            return None
        return set(table.columns)
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        alias = source.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            return None
        names = [item.alias_or_name for item in source.this.expressions]
        return None if any(not name or name == "*" for name in names) else {name.lower() for name in names}
    return None


def _owner(column: exp.Column, sources: list[exp.Expression], policy: Policy) -> str | None:
    """The alias of the FROM source a column belongs to: its qualifier, or the one source that has an unqualified
    column of its name (None when that cannot be told from the SQL and the policy: ambiguous or unknown)."""
    aliases = [source.alias_or_name for source in sources]
    if column.table:
        return column.table if column.table in aliases else None
    owners = []
    for source in sources:
        names = columns_of(source, policy)
        if names is None:
            return None
        if column.name.lower() in names:
            owners.append(source.alias_or_name)
    return owners[0] if len(owners) == 1 else None


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    bare = condition.unnest()
    return list(bare.flatten()) if isinstance(bare, exp.And) else [condition]


def _join_equality(part: exp.Expression, alias: str, earlier: set[str], sources: list[exp.Expression],
                   policy: Policy) -> bool:
    """Whether `part` is `a.x = b.y` of plain columns, one of the joined table `alias` and one of an earlier one."""
    bare = part.unnest()
    if not isinstance(bare, exp.EQ):
        return False
    sides = [side.unnest() for side in (bare.this, bare.expression)]
    if not all(isinstance(side, exp.Column) and not isinstance(side.this, exp.Star) for side in sides):
        return False
    owners = [_owner(side, sources, policy) for side in sides]
    return sorted((owner == alias, owner in earlier) for owner in owners) == [(False, True), (True, False)]


def _mirror_right_join(select: exp.Select, policy: Policy) -> None:
    joins = select.args["joins"]
    for index, join in enumerate(joins):
        if (join.args.get("side") or "").upper() != "RIGHT":
            continue
        kept = join.this
        if index > 0:
            raise QueryRejected(f"RIGHT JOIN {kept.sql(DIALECT)}: a RIGHT JOIN after another join would keep its "
                                "table against several joined tables, which no flat join states; write the table "
                                "it keeps first, and LEFT JOIN the others to it")
        if _public(kept, policy):
            raise QueryRejected(f"RIGHT JOIN {kept.sql(DIALECT)}: it keeps every row of the public table "
                                f"'{kept.name}', which belongs to no person: a row that no private row matches "
                                "would still count. A RIGHT JOIN is answered when the table it keeps is private "
                                "(the mirrored LEFT JOIN)")
    first = joins[0]
    if (first.args.get("side") or "").upper() == "RIGHT":
        kept = first.this
        mirrored = first.copy()
        mirrored.set("side", "LEFT")
        mirrored.set("this", select.args["from_"].this.copy())
        select.set("from_", exp.From(this=kept.copy()))
        select.set("joins", [mirrored, *joins[1:]])


def _comma_joins(select: exp.Select, policy: Policy) -> None:
    where = select.args.get("where")
    sources = _sources(select)
    conditions = _conjuncts(where.this) if where is not None else []
    changed = False
    for index, join in enumerate(select.args["joins"], start=1):
        kind = (join.args.get("kind") or "").upper()
        if any(join.args.get(k) for k in ("on", "using", "method", "side")) or kind not in ("", "CROSS"):
            continue
        alias = sources[index].alias_or_name
        earlier = {source.alias_or_name for source in sources[:index]}
        keys = [c for c in conditions if _join_equality(c, alias, earlier, sources, policy)]
        if not keys:
            continue  # a cross join: refused by the join rules
        join.set("kind", None)
        join.set("on", exp.and_(*[key.copy() for key in keys]))
        conditions = [c for c in conditions if not any(c is key for key in keys)]
        changed = True
    if changed:
        select.set("where", exp.Where(this=exp.and_(*[c.copy() for c in conditions])) if conditions else None)


def _on_filters(select: exp.Select, policy: Policy) -> None:
    sources = _sources(select)
    moved: list[exp.Expression] = []
    for index, join in enumerate(select.args["joins"], start=1):
        on = join.args.get("on")
        if on is None or join.args.get("method"):
            continue
        side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "").upper()
        alias = sources[index].alias_or_name
        earlier = {source.alias_or_name for source in sources[:index]}
        parts = _conjuncts(on)
        keys = [p for p in parts if _join_equality(p, alias, earlier, sources, policy)]
        rest = [p for p in parts if not any(p is key for key in keys)]
        if not keys or not rest:
            continue
        if not side and kind in ("", "INNER"):
            moved += rest
        elif side == "LEFT" and _public(join.this, policy):
            own = [p for p in rest if _reads_only(p, alias, sources, policy)]
            if len(own) != len(rest):
                continue  # a condition on the kept side: refused by the rules, as written
            join.set("this", _filtered(join.this, own))
        else:
            continue
        join.set("on", exp.and_(*[key.copy() for key in keys]))
    if moved:
        where = select.args.get("where")
        conditions = _conjuncts(where.this) if where is not None else []
        select.set("where", exp.Where(this=exp.and_(*[c.copy() for c in [*moved, *conditions]])))


def _reads_only(part: exp.Expression, alias: str, sources: list[exp.Expression], policy: Policy) -> bool:
    if any(isinstance(node, exp.Query | exp.Subquery) for node in part.walk()):
        return False
    columns = list(part.find_all(exp.Column))
    return all(_owner(column, sources, policy) == alias for column in columns)


def _filtered(table: exp.Expression, conditions: list[exp.Expression]) -> exp.Subquery:
    """`(SELECT * FROM t AS a WHERE conditions) AS a`: the table `a` with only the rows passing the conditions."""
    alias = table.alias_or_name
    inner = table.copy()
    inner.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    query = exp.select("*").from_(inner).where(exp.and_(*[c.copy() for c in conditions]))
    return query.subquery(alias)


__all__ = ["columns_of", "has_written_joins", "join_filters", "written_joins"]
