"""Joins: a FROM that reads several tables, resolved into one relation the rest of the checker treats as a table.

The relation is a TablePolicy-like schema (each column with its type, bounds, public values; the unit column; the
contribution bound m) plus the SQL over the prepared tables that produces its rows, already capped, and the steps
by which m was derived (for explain). The outer query is checked, planned and rewritten against it exactly as
against a single table; the rewrite reads the relation's SQL instead of a prepared table and adds no cap.

The rules, and why each keeps one unit's joined rows at most m:
- The first table in FROM is private; every further table is joined INNER, or LEFT with the joined-so-far rows on
  the preserved side, on an AND of equalities `a.x = b.y` of plain columns of the same declared type (not float),
  each between the newly joined table and an earlier one. No expression in a join key: a cast or a function could
  make one value meet many (text '1' and '01' both equal the integer 1), which the key counts below do not see.
- A public table joined on columns C meets each earlier row in at most k rows, k = the largest number of its rows
  sharing one value of C (read from the public data: public, so free; 1 for a unique key). Rows multiply by k.
- A private table is capped at its own rank <= m_i before the join (the prepared rank: it depends only on the
  unit's own rows). It may be joined only INNER, to tables with the same unit label, and its condition must equal
  its unit column to the unit column of an earlier private table: each earlier row (whose unit is u) then meets
  only rows of unit u of this table, at most m_i of them. Rows multiply by m_i.
- So one unit has at most m = prod(m_i) * prod(k_j) joined rows: the first private table's m_1 rows, each meeting
  at most k_j (or m_i) rows of each further table. The joined row's unit is the first table's unit.
- A WHERE of the outer query only removes joined rows, so it needs no new cap.

The same m bounds the time one person's rows can cost (person_work.py): the policy's [engine] max_joins and
max_joined_rows bound the joins, a private table may be read at most twice (one self-join pairs a person's rows; a
third copy adds nothing an analyst needs and multiplies their rows again), and each join stage's rows are part of the
person's work. So that no filter runs on rows beyond a table's cap (DuckDB pushes a filter into the table's scan
beside the cap's and orders the two as it likes), the relation carries each private table's rank: `caps`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from dpsql.analysis import person_work, semijoins
from dpsql.analysis.bounds import MAX_MAGNITUDE
from dpsql.analysis.public_facts import PublicFacts
from dpsql.analysis.public_relations import PublicRelation, public_relation
from dpsql.dp.fixedpoint import fixed_point
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.policy import ColumnPolicy, ColumnType, ContributionBound, Policy, TablePolicy, WorkLimits
from dpsql.sql import names
from dpsql.sql.parse import DIALECT

# The relation's name and alias in the checked query and in the rewrite's FROM.
JOINED = "__dp_joined"
# How often one private table may be read in one FROM: twice is one self-join.
MAX_COPIES = 2


@dataclass(frozen=True)
class Relation:
    schema: TablePolicy  # the columns the outer query reads, the unit column and the bound m
    sql: exp.Select  # the relation's rows over the prepared tables, capped: at most m rows per unit
    steps: tuple[str, ...]  # how m was derived, for explain
    # The columns whose declared-values flag the SQL carries (names.known_column of the column's name here): a
    # private table's, read from its prepared copy.
    flagged: frozenset[str] = frozenset()
    # Per column of a private table: the column of the SQL holding that table's rank, and its cap. A filter on the
    # column runs only where rank <= cap (rewrite/passes.filter_rows), even once DuckDB pushes it into the scan.
    caps: dict[str, tuple[str, int]] = dataclasses.field(default_factory=dict)
    # The work one person's rows cost to produce the relation's rows, each time they are read (person_work.py).
    work: tuple[person_work.WorkTerm, ...] = ()


@dataclass(frozen=True)
class _Member:
    table: TablePolicy
    alias: str
    name: str  # the prepared table's alias in the relation's SQL
    join: exp.Join | None  # None for the first table
    derived: Relation | None = None  # a per-unit subquery: its rows, one per unit, instead of a prepared table
    public: Public | None = None  # a public relation (public_relations.py): its rows, written into the SQL


@dataclass(frozen=True)
class Public:
    """A public relation in FROM: its facts and its SQL (a VALUES list of its rows)."""

    relation: PublicRelation
    sql: exp.Select


# The placeholder table name of the i-th subquery in FROM while the join is resolved.
def _placeholder(index: int) -> str:
    return f"__dp_sub{index}"


def _derived_tables(tree: exp.Select, subquery: SubqueryRelation | None
                    ) -> tuple[exp.Select, dict[str, Relation], dict[str, Public]]:
    """The query with each subquery in FROM replaced by a placeholder table, and the placeholders' relations: a
    per-unit one's, or a public relation's rows."""
    sources = [tree.args["from_"].this] + [join.this for join in tree.args.get("joins") or []]
    if not any(isinstance(source, exp.Subquery) for source in sources):
        return tree, {}, {}
    for source in sources:
        if isinstance(source, exp.Table) and names.is_reserved(source.name):
            raise ProgrammingError(f"unknown table '{source.name}'")
    if subquery is None and any(isinstance(source, exp.Subquery) and public_relation(source) is None
                                for source in sources):
        raise QueryRejected("a subquery cannot be joined here")
    tree = tree.copy()
    sources = [tree.args["from_"].this] + [join.this for join in tree.args.get("joins") or []]
    derived, publics = {}, {}
    for index, source in enumerate(sources):
        if isinstance(source, exp.Subquery):
            found = public_relation(source)
            if found is not None:
                publics[_placeholder(index)] = Public(found, source.this)
            else:
                derived[_placeholder(index)] = subquery(source)
            source.replace(exp.alias_(exp.to_table(_placeholder(index)), source.alias_or_name or _placeholder(index),
                                      table=True))
    return tree, derived, publics


SubqueryRelation = Callable[[exp.Subquery], Relation]  # per_unit.per_unit_relation, bound to the policy


def resolve(tree: exp.Select, policy: Policy, facts: PublicFacts | None,
            subquery: SubqueryRelation | None = None) -> tuple[exp.Select, Relation | None]:
    """The query over its relation, if its FROM joins tables or reads a public one; else (tree, None), untouched.

    A subquery joined to tables (`subquery` builds its relation: a per-unit aggregation) is a private member with
    one row per unit: its SQL stands for a prepared table, and it needs no cap."""
    from_ = tree.args.get("from_")
    needed = from_ is not None and _needs_relation(tree, policy)
    if not needed and (from_ is None or not semijoins.has_semijoins(tree)):
        return tree, None
    written_tree = tree
    tree, derived, publics = _derived_tables(tree, subquery)
    carrier = tree.args["from_"].this.alias_or_name  # the semi-joins' flags: columns of the first source
    tree, found = semijoins.extract(tree, policy, _source_columns(tree, policy, derived, publics), carrier)
    if not needed and not found:
        return written_tree, None  # subqueries that are no semi-joins: the checker refuses them
    written = _members(tree, policy, derived, publics)
    _refuse_public_only(written, tree, policy, found)
    flags = [one.flag for one in found]
    tree = _qualified(tree, written, {carrier: flags})
    tree = _private_first(tree, policy, derived)
    # Again: qualify() normalised the aliases and turned USING into ON.
    members = _checked_order(_members(tree, policy, derived, publics))
    bound, steps, work = _bound(members, facts, policy.limits, [one.table for one in found])
    checked = _checked_semijoins(found, members, bound, facts, policy.limits)
    steps[-1:-1] = [step for one in checked for step in one.steps]
    work = (*work, *(term for one in checked for term in one.work))
    mapping = _column_names(members)
    columns = _columns(members, mapping, facts)
    carried = next(m.alias for m in members if m.alias.lower() == carrier.lower())
    for flag in flags:
        mapping[(carried, flag)] = flag
        columns[flag] = ColumnPolicy(flag, ColumnType.BOOL, nullable=False)
    first = members[0]
    unit = mapping[(first.alias, first.table.privacy_unit)] if first.table.privacy_unit else None
    schema = TablePolicy(JOINED, first.table.source, columns, ContributionBound(bound), unit,
                         first.table.row_privacy, unit=first.table.unit)
    sql, flagged, caps = _relation_sql(members, mapping, columns, tree)
    if checked:
        sql = sql.select(*[exp.alias_(one.sql, one.semijoin.flag) for one in checked], copy=False)
    relation = Relation(schema, sql, tuple(steps), flagged, caps, work)
    return _over_relation(tree, mapping), relation


def _source_columns(tree: exp.Select, policy: Policy, derived: dict[str, Relation],
                    publics: dict[str, Public]) -> dict[str, set[str] | None]:
    """Each FROM source's alias and its columns (None when not a declared table or a known relation)."""
    found: dict[str, set[str] | None] = {}
    for source in [tree.args["from_"].this] + [join.this for join in tree.args.get("joins") or []]:
        schema = None
        if isinstance(source, exp.Table):
            relation, public = derived.get(source.name), publics.get(source.name)
            schema = relation.schema if relation else public.relation.schema if public else policy.table(source.name)
        found[source.alias_or_name] = set(schema.columns) if schema is not None else None
    return found


def _checked_semijoins(found: tuple[semijoins.SemiJoin, ...], members: list[_Member], m: int, facts: PublicFacts | None,
                    limits: WorkLimits) -> list[semijoins.CheckedSemiJoin]:
    """Each semi-join checked against the relation's sources (semijoins.py): a private source's unit column holds the
    relation's unit (the first table's, and every private table is joined INNER on it)."""
    outer = {member.alias.lower(): semijoins.Outer(member.table, member.name, not member.table.public)
             for member in members}
    first = members[0].table
    unit = None if first.row_privacy else first.unit
    return [semijoins.checked(one, index, outer, unit, m, facts, limits) for index, one in enumerate(found)]


def _needs_relation(tree: exp.Select, policy: Policy) -> bool:
    if tree.args.get("joins"):
        return True
    source = tree.args["from_"].this
    if public_relation(source) is not None:
        return True
    table = policy.table(source.name) if isinstance(source, exp.Table) and isinstance(source.this,
                                                                                       exp.Identifier) else None
    return table is not None and table.public


def _members(tree: exp.Select, policy: Policy, derived: dict[str, Relation],
             publics: dict[str, Public]) -> list[_Member]:
    sources = [(tree.args["from_"].this, None)] + [(join.this, join) for join in tree.args.get("joins") or []]
    members = []
    for index, (source, join) in enumerate(sources):
        if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
            raise QueryRejected("a join reads declared tables only: subqueries, table functions and files cannot "
                                "be joined")
        if source.args.get("db") or source.args.get("catalog"):
            raise QueryRejected(f"{source.sql(DIALECT)}: only the policy's tables can be read, without a schema")
        alias = source.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise QueryRejected(f"{source.sql(DIALECT)}: renaming columns in a table alias (AS t(x, ...)) is not "
                                "supported in a join")
        relation, public = derived.get(source.name), publics.get(source.name)
        schema = relation.schema if relation else public.relation.schema if public else None
        table = dataclasses.replace(schema, name=source.name) if schema else policy.table(source.name)
        if table is None:
            raise ProgrammingError(f"unknown table '{source.name}' (the policy declares: "
                                   f"{', '.join(sorted(policy.tables))})")
        members.append(_Member(table, source.alias_or_name, f"__dp_t{index}", join, relation, public))
    return members


def _refuse_public_only(members: list[_Member], tree: exp.Select, policy: Policy,
                        found: tuple[semijoins.SemiJoin, ...]) -> None:
    """A FROM of public tables only: the query came here because it also reads a private table elsewhere (or it
    is explained): neither is answered."""
    if all(m.table.public for m in members):
        if any(not one.table.public for one in found):
            raise QueryRejected("a query over public tables cannot ask EXISTS or IN of a private table: join the "
                                "private table, or put it first in FROM")
        if any(not (policy.table(t.name) and policy.table(t.name).public) for t in tree.find_all(exp.Table)):
            raise QueryRejected("subqueries are not supported: a query of public tables cannot read a private "
                                "table inside it; join the private table instead")
        raise QueryRejected("the query reads only public tables: it runs as written, without noise or cost, "
                            "and has no private plan to explain")


def _checked_order(members: list[_Member]) -> list[_Member]:
    if not members[0].table.public:
        for member in members[1:]:
            _check_join_kind(member.join, member.table)
        return members
    raise QueryRejected("name the private table first in FROM and join the public tables to it (a public table "
                        "first would make the bound depend on which side the rows are counted from)")


def _private_first(tree: exp.Select, policy: Policy, derived: dict[str, Relation]) -> exp.Select:
    """An INNER join written with a public table first (`FROM departments d JOIN visits v ON ...`), reordered so
    that a private table comes first, each equality placed at the later of its two tables. Inner joins commute, so
    the rows are the same; the bound is then derived from the private table, as the rules need. Anything else is
    returned as it is, for the rules to judge."""
    joins = tree.args.get("joins") or []
    sources = [tree.args["from_"].this] + [join.this for join in joins]

    def private(source: exp.Expression) -> bool:
        if not isinstance(source, exp.Table):
            return False
        table = policy.table(source.name)
        return source.name in derived or (table is not None and not table.public)

    inner = all(join.args.get("on") and not join.args.get("method") and not join.args.get("side")
                and (join.args.get("kind") or "").upper() in ("", "INNER") for join in joins)
    if private(sources[0]) or not inner or not any(private(source) for source in sources):
        return tree
    pool = [part for join in joins for part in (join.args["on"].flatten() if isinstance(join.args["on"], exp.And)
                                                else [join.args["on"]])]
    order = [next(source for source in sources if private(source))]
    remaining = [source for source in sources if source is not order[0]]
    placed: list[list[exp.Expression]] = []
    while remaining:
        done = {source.alias_or_name for source in order}
        for source in remaining:
            alias = source.alias_or_name
            mine = [part for part in pool if alias in _aliases(part) and _aliases(part) <= done | {alias}]
            if mine:
                break
        else:
            return tree  # a table that meets none of the others: the rules refuse it as written
        order.append(source)
        remaining.remove(source)
        placed.append(mine)
        pool = [part for part in pool if not any(part is m for m in mine)]
    if pool:
        return tree  # a condition between tables joined before: the rules refuse it as written
    reordered = tree.copy()
    reordered.set("from_", exp.From(this=order[0].copy()))
    reordered.set("joins", [exp.Join(this=source.copy(), on=exp.and_(*[p.copy() for p in parts]))
                            for source, parts in zip(order[1:], placed, strict=True)])
    return reordered


def _aliases(part: exp.Expression) -> set[str]:
    return {column.table for column in part.find_all(exp.Column)}


def _check_join_kind(join: exp.Join, table: TablePolicy) -> None:
    side, kind = (join.args.get("side") or "").upper(), (join.args.get("kind") or "").upper()
    text = f"JOIN {table.name}"
    if join.args.get("method"):
        raise QueryRejected(f"{text}: only INNER and LEFT joins are supported, with ON conditions; "
                            f"{join.args['method']} JOIN is not")
    cross = kind == "CROSS" or (kind in ("", "INNER") and not join.args.get("on") and not join.args.get("using"))
    if cross:
        raise QueryRejected(f"{text}: a cross join (no ON condition) is not supported: every private row would "
                            "meet every row of the other table. Join on equal columns: JOIN t ON a.x = t.x")
    if kind == "OUTER" and not side:  # not SQL: it would have run as an INNER join
        raise QueryRejected(f"{text}: OUTER JOIN needs LEFT (LEFT OUTER JOIN); only INNER and LEFT joins are "
                            "supported")
    if kind not in ("", "INNER", "OUTER") or side not in ("", "LEFT"):
        raise QueryRejected(f"{text}: only INNER and LEFT joins are supported, with the private table on the kept "
                            f"side; {' '.join(w for w in (side, kind) if w)} JOIN is not")
    if not join.args.get("on") and not join.args.get("using"):
        raise QueryRejected(f"{text}: a join needs an ON condition of equal columns")
    if side == "LEFT" and not table.public:
        raise QueryRejected(f"{text}: a private table can only be joined INNER (a LEFT join of private tables is "
                            "not supported)")
    for key in ("global_", "match_condition", "directed"):
        if join.args.get(key):
            raise QueryRejected(f"{text}: {key.upper()} joins are not supported")


def _qualified(tree: exp.Select, members: list[_Member], flags: dict[str, list[str]]) -> exp.Select:
    """The query with every column qualified by its source; `flags` are more boolean columns of a source (by
    alias): the semi-joins' (semijoins.py)."""
    schema = {m.table.name: {c.name: c.type.duckdb for c in m.table.columns.values()} for m in members}
    for member in members:
        for flag in flags.get(member.alias, ()):
            schema[member.table.name][flag] = "BOOLEAN"
    try:
        return qualify(tree, schema=schema, dialect=DIALECT, validate_qualify_columns=True, expand_stars=False,
                       quote_identifiers=False, identify=False)
    except OptimizeError as exc:
        tables = "; ".join(f"'{m.alias}': {', '.join(sorted(m.table.columns))}" for m in members)
        raise ProgrammingError(f"{exc} (the joined tables have the columns: {tables})") from None


def _equalities(member: _Member, earlier: dict[str, _Member]) -> list[tuple[exp.Column, exp.Column]]:
    """The join's ON as pairs (column of the new table, column of an earlier one); anything else is refused."""
    condition = member.join.args["on"]
    pairs = []
    for part in condition.flatten() if isinstance(condition, exp.And) else [condition]:
        part = part.unnest()
        rule = (f"JOIN {member.table.name} ON {part.sql(DIALECT)}: a join condition must be equalities of plain "
                "columns (a.x = b.y AND ...), each between the joined table and an earlier one, of the same type")
        if not isinstance(part, exp.EQ):
            raise QueryRejected(f"{rule}; a non-equality condition could let one row meet unboundedly many")
        sides = [side.unnest() for side in (part.this, part.expression)]
        if not all(isinstance(side, exp.Column) and not isinstance(side.this, exp.Star) for side in sides):
            raise QueryRejected(f"{rule}; a join key that is an expression (a cast, a function) could make several "
                                "values meet one")
        ours = [side for side in sides if side.table == member.alias]
        theirs = [side for side in sides if side.table in earlier]
        if len(ours) != 1 or len(theirs) != 1:
            raise QueryRejected(rule)
        mine, other = ours[0], theirs[0]
        mine_type = member.table.columns[mine.name].type
        other_type = earlier[other.table].table.columns[other.name].type
        if mine_type is not other_type:
            raise QueryRejected(f"{rule}; {mine.sql(DIALECT)} is {mine_type.value} but {other.sql(DIALECT)} is "
                                f"{other_type.value} (an implicit cast could make several values equal)")
        if mine_type is ColumnType.FLOAT:
            raise QueryRejected(f"{rule}; float columns cannot be join keys (-0.0 = 0.0, rounding)")
        pairs.append((mine, other))
    return pairs


def _bound(members: list[_Member], facts: PublicFacts | None, limits: WorkLimits,
           probed: list[TablePolicy]) -> tuple[int, list[str], tuple[person_work.WorkTerm, ...]]:
    """m, the steps that derive it (for explain), and the work of one person's rows through the joins. `probed`:
    the tables the semi-joins read (each a further read of a table, as a join is)."""
    _refuse_copies(members, limits, probed)
    first = members[0]
    m = first.table.bound.max_rows
    unit = "each row is its own unit" if first.table.row_privacy else f"unit '{first.table.unit}'"
    steps = [*_derived_steps(first), f"{first.alias}: {_described(first)} ({unit}), {_capped(first)}: m = {m}"]
    work = [*_derived_work(first)]
    earlier = {first.alias: first}
    for member in members[1:]:
        before = m
        pairs = _equalities(member, earlier)
        if member.table.public:
            keys = tuple(dict.fromkeys(mine.name for mine, _ in pairs))
            k = _rows_per_key(member, keys, facts)
            m *= k
            how = "unique key" if k == 1 else f"at most {k} rows share one value"
            steps.append(f"{member.alias}: {_described(member)} joined on ({', '.join(keys)}): {how}, "
                         f"so each row meets at most {k}: m = {m}")
        else:
            _check_private_join(member, pairs, earlier)
            m_i = member.table.bound.max_rows
            m *= m_i
            steps += _derived_steps(member)
            steps.append(f"{member.alias}: {_described(member)} joined on its unit column, {_capped(member)}: "
                         f"each row meets at most {m_i} row(s) of its own unit: m = {m}")
        if m > limits.max_joined_rows:
            raise QueryRejected(f"JOIN {member.table.name}: one person could have {m} joined rows (the policy allows "
                                f"{limits.max_joined_rows}: [engine] max_joined_rows): join on a key with fewer rows "
                                "per value, or fewer tables")
        label = "the per-unit subquery" if member.derived else "the public relation" if member.public \
            else member.table.name
        work += [*_derived_work(member), *person_work.join_terms(f"JOIN {label} {member.alias}", before, m)]
        earlier[member.alias] = member
    steps.append(f"at most {m} joined row(s) per unit; the joined row's unit is {first.alias}'s")
    return m, steps, tuple(work)


def _rows_per_key(member: _Member, keys: tuple[str, ...], facts: PublicFacts | None) -> int:
    """k: the most rows of a public member sharing one value of `keys` (at least 1), from its data."""
    if member.public is not None:
        return max(member.public.relation.max_rows_per_key(keys), 1)
    if facts is None:
        raise QueryRejected(f"JOIN {member.table.name}: this engine cannot read public tables")
    return max(facts.max_rows_per_key(member.table.name, keys), 1)


def _refuse_copies(members: list[_Member], limits: WorkLimits, probed: list[TablePolicy]) -> None:
    joins = len(members) - 1 + len(probed)
    if joins > limits.max_joins:
        raise QueryRejected(f"the query joins {joins} tables to the first one (the policy allows {limits.max_joins}: "
                            "[engine] max_joins): every join multiplies the rows of one person and the work they "
                            "cost; ask fewer tables at once")
    copies: dict[str, int] = {}
    read = [(m.table, f"JOIN {m.table.name} {m.alias}") for m in members if m.derived is None] + \
        [(table, f"EXISTS over {table.name}") for table in probed]
    for table, where in read:
        if not table.public:
            copies[table.name] = copies.get(table.name, 0) + 1
            if copies[table.name] > MAX_COPIES:
                raise QueryRejected(f"{where}: the private table '{table.name}' "
                                    f"is read {copies[table.name]} times; at most {MAX_COPIES} (one self-join, "
                                    "which pairs a person's rows): a further copy adds nothing and multiplies one "
                                    "person's rows again")


def _derived_work(member: _Member) -> tuple[person_work.WorkTerm, ...]:
    return member.derived.work if member.derived else ()


def _derived_steps(member: _Member) -> list[str]:
    return [f"{member.alias}: {step}" for step in member.derived.steps] if member.derived else []


def _capped(member: _Member) -> str:
    m = member.table.bound.max_rows
    return "one row per unit" if member.derived else f"capped at {m} row(s) per unit (rank <= {m})"


def _described(member: _Member) -> str:
    if member.public is not None:
        return f"the public relation of {len(member.public.relation.rows)} row(s) read from its query"
    if member.table.public:
        return f"public table '{member.table.name}'"
    return "the per-unit subquery" if member.derived else f"private table '{member.table.name}'"


def _check_private_join(member: _Member, pairs: list[tuple[exp.Column, exp.Column]],
                        earlier: dict[str, _Member]) -> None:
    table = member.table
    rule = ("two private tables can be joined only when they have the same privacy unit and the condition equals "
            "their unit columns (JOIN b ON a.unit = b.unit)")
    if table.row_privacy or any(e.table.row_privacy for e in earlier.values() if not e.table.public):
        raise QueryRejected(f"JOIN {table.name}: {rule}; a table with row privacy has no unit to join on")
    first = next(iter(earlier.values()))
    if table.unit != first.table.unit:
        raise QueryRejected(f"JOIN {table.name}: {rule}; its unit is '{table.unit}', but "
                            f"'{first.table.name}' has the unit '{first.table.unit}'")
    for mine, other in pairs:
        other_table = earlier[other.table].table
        if (mine.name == table.privacy_unit and not other_table.public
                and other.name == other_table.privacy_unit):
            return
    raise QueryRejected(f"JOIN {table.name}: {rule}; the condition does not equal '{table.privacy_unit}' to the "
                        "unit column of an earlier private table")


def _column_names(members: list[_Member]) -> dict[tuple[str, str], str]:
    """Each (alias, column) -> its unique name in the relation. A joined private table's unit column is the
    relation's unit column (the INNER join made them equal), so grouping by it is refused like the unit."""
    first = members[0]

    def joined_unit(index: int, member: _Member, name: str) -> bool:
        return (index > 0 and not member.table.public and name == member.table.privacy_unit
                and first.table.privacy_unit is not None)

    counts: dict[str, int] = {}
    for index, member in enumerate(members):
        for name in member.table.columns:
            if not joined_unit(index, member, name):
                counts[name] = counts.get(name, 0) + 1
    mapping: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    for index, member in enumerate(members):
        prefix = member.alias if member.alias.isidentifier() and member.alias.islower() else f"t{index}"
        for name in member.table.columns:
            if joined_unit(index, member, name):
                mapping[(member.alias, name)] = mapping[(first.alias, first.table.privacy_unit)]
                continue
            mapped = name if counts[name] == 1 else f"{prefix}_{name}"
            while mapped in taken or mapped.startswith(names.RESERVED_PREFIX):
                # an alias like `__a` or `_` would prefix a reserved name forever: t<index> never makes one
                longer = f"{prefix}_{mapped}"
                mapped = longer if not longer.startswith(names.RESERVED_PREFIX) else f"t{index}_{mapped}"
            taken.add(mapped)
            mapping[(member.alias, name)] = mapped
    return mapping


def _columns(members: list[_Member], mapping: dict[tuple[str, str], str],
             facts: PublicFacts | None) -> dict[str, ColumnPolicy]:
    columns: dict[str, ColumnPolicy] = {}
    for member in members:
        for name, column in member.table.columns.items():
            mapped = mapping[(member.alias, name)]
            if mapped in columns:
                continue
            if member.public is not None:
                columns[mapped] = dataclasses.replace(column, name=mapped)
            elif member.table.public:
                columns[mapped] = _public_column(member, column, mapped, facts)
            else:
                # per_unit is dropped: the relation is capped already, so nothing reads it.
                columns[mapped] = dataclasses.replace(column, name=mapped, per_unit=False)
    return columns


def _public_column(member: _Member, column: ColumnPolicy, mapped: str, facts: PublicFacts) -> ColumnPolicy:
    """A public column's bounds and public values, from the policy or else from the public data.

    Always nullable: a LEFT join gives NULL where no public row matched."""
    lower, upper, values = column.lower, column.upper, column.values
    if facts is not None and (lower is None or values is None):
        found = facts.column(member.table.name, column.name)
        if lower is None and column.type.numeric and found.lower is not None and all(
                math.isfinite(v) and abs(v) <= MAX_MAGNITUDE for v in (found.lower, found.upper)):
            # Beyond the magnitude a policy may declare (an infinity, 1e308), no bound: the fixed-point grid of
            # such a range does not exist, and every join with the table failed with an internal error.
            lower, upper = found.lower, found.upper
        if values is None and column.type in (ColumnType.TEXT, ColumnType.INT):
            values = found.values
    return dataclasses.replace(column, name=mapped, lower=lower, upper=upper, values=values, nullable=True)


def _relation_sql(members: list[_Member], mapping: dict[tuple[str, str], str], columns: dict[str, ColumnPolicy],
                  tree: exp.Select) -> tuple[exp.Select, frozenset[str], dict[str, tuple[str, int]]]:
    """SELECT the mapped columns (and the unit, and each bounded column's fixed-point integer) FROM the prepared
    tables joined as written, WHERE each private table's rank <= its m: the cap, before the join (for an INNER
    join, and for the preserved side of a LEFT join, filtering in WHERE is filtering before the join). Each capped
    table's rank is projected too, and each of its columns maps to it (`Relation.caps`)."""
    renamed = {m.alias: m.name for m in members}
    projection, seen, flagged = [], set(), set()
    caps: dict[str, tuple[str, int]] = {}
    for index, member in enumerate(members):
        if _capped_member(member):
            rank = names.member_rank(index)
            projection.append(exp.alias_(exp.column(names.RANK, member.name), rank))
            caps |= {mapping[(member.alias, name)]: (rank, member.table.bound.max_rows)
                     for name in member.table.columns if mapping[(member.alias, name)] not in caps}
    for member in members:
        for name in member.table.columns:
            mapped = mapping[(member.alias, name)]
            if mapped in seen:
                continue
            seen.add(mapped)
            value = _physical(member.name, name)
            projection.append(exp.alias_(value, mapped, quoted=True))
            if columns[mapped].bounded:
                if member.table.public:
                    quantized = exp.cast(fixed_point(columns[mapped].interval).centered(value.copy()),
                                         exp.DataType.Type.INT)
                else:
                    quantized = exp.column(names.quantized_column(name), member.name)
                projection.append(exp.alias_(quantized, names.quantized_column(mapped)))
            own = member.table.columns[name]
            if not member.table.public and member.derived is None and own.flags_values \
                    and own.values == columns[mapped].values:
                projection.append(exp.alias_(exp.column(names.known_column(name), member.name),
                                             names.known_column(mapped)))
                flagged.add(mapped)
    first = members[0]
    projection.append(exp.alias_(exp.column(names.UNIT, first.name), names.UNIT))
    # Built in place (copy=False): every part is fresh here, and each builder's copy was of the whole SELECT so far.
    sql = exp.select(*projection, copy=False).from_(_source(first), copy=False)
    for member, join in zip(members[1:], tree.args.get("joins") or [], strict=True):
        on = join.args["on"].copy().transform(
            lambda n: _physical(renamed[n.table], n.name) if isinstance(n, exp.Column) else n, copy=False)
        sql = sql.join(_source(member), on=on, copy=False,
                       join_type="LEFT" if (join.args.get("side") or "").upper() == "LEFT" else "INNER")
    ranks = [exp.column(names.RANK, m.name) <= m.table.bound.max_rows for m in members if _capped_member(m)]
    return (sql.where(exp.and_(*ranks, copy=False), copy=False) if ranks else sql), frozenset(flagged), caps


def _capped_member(member: _Member) -> bool:
    """A private table read from its prepared copy, capped by rank (a per-unit subquery has one row per unit
    already, capped inside it; under row privacy every row is its own unit)."""
    return not member.table.public and not member.table.row_privacy and member.derived is None


def gated(condition: exp.Expression, caps: dict[str, tuple[str, int]], alias: str) -> exp.Expression:
    """`condition` (over the relation's columns, read as `alias`) evaluated only on rows within the caps of the
    tables whose columns it reads: CASE WHEN rank <= m ... THEN condition ELSE FALSE END. DuckDB pushes a filter
    into the scan of the table it reads, beside that table's rank filter, and orders filters there adaptively: on
    its own a costly filter also ran on rows ranked beyond the cap, so a person's rows beyond m (any number) paid for
    it. A CASE evaluates its THEN only where its WHEN holds, wherever it is pushed."""
    read = {caps[column.name] for column in condition.find_all(exp.Column) if column.name in caps}
    if not read:
        return condition
    within = exp.and_(*[exp.column(rank, alias) <= cap for rank, cap in sorted(read)])
    return exp.Case().when(within, condition.copy(), copy=False).else_(exp.false(), copy=False)


def _source(member: _Member) -> exp.Expression:
    if member.public is not None:
        return member.public.sql.subquery(member.name)
    if member.derived is not None:
        return member.derived.sql.subquery(member.name)
    return exp.to_table(names.prepared_table(member.table.name)).as_(member.name)


def _physical(alias: str, column: str) -> exp.Column:
    return exp.column(exp.to_identifier(column, quoted=True), alias)


def _over_relation(tree: exp.Select, mapping: dict[tuple[str, str], str]) -> exp.Select:
    """The query with FROM the relation and every column the relation's."""
    tree = tree.copy()
    tree.set("joins", None)
    tree.set("from_", exp.From(this=exp.alias_(exp.to_table(JOINED), JOINED, table=True)))

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and (node.table, node.name) in mapping:
            return exp.column(mapping[(node.table, node.name)], JOINED)
        return node

    return tree.transform(rename, copy=False)


__all__ = ["JOINED", "Relation", "gated", "resolve"]
