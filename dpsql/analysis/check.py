"""Stage 2: decide whether a parsed SELECT can be answered privately, from the SQL and the policy alone.

The result, `CheckedQuery`, splits the query into the part that touches private rows (the table, the row filter,
the group keys, the aggregate calls with their bounds) and the part that is post-processing of noisy cells (the
outer SELECT over a table `__noisy`, with HAVING, ORDER BY, LIMIT). Nothing here reads the data, so a rejection
can never reveal anything about it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NewType

import duckdb
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import OptimizeError
from sqlglot.optimizer.qualify import qualify

from dpsql.analysis import person_work
from dpsql.analysis.bounds import Unbounded, interval_of
from dpsql.analysis.grouping_sets import flat_grouping_sets, grouping_bits, grouping_ids, grouping_indices
from dpsql.analysis.per_unit import per_unit_relation, resolve_per_unit
from dpsql.analysis.public_facts import PublicFacts
from dpsql.analysis.quantile_calls import quantile_parts
from dpsql.analysis.relation import Relation, resolve
from dpsql.analysis.text_parameters import type_text_parameters
from dpsql.analysis.typecheck import Kind, Typed, typed_expression
from dpsql.analysis.vetting import CONSTANTS, ROW_NODES, describe, vet_row_expression
from dpsql.analysis.written_types import COUNT_TYPE, written_type
from dpsql.dp.interval import Interval
from dpsql.errors import ProgrammingError, QueryRejected
from dpsql.policy import ColumnType, Policy, TablePolicy
from dpsql.sql import names
from dpsql.sql.parse import DIALECT, ParsedQuery

# The name of one supported aggregate ("sum", "var_samp"). Everything else about it (the calls that ask for it,
# how it is measured, estimated and explained) is in its module of dpsql/planning/aggregates, whose registry is
# the list of what is supported. This layer lies below planning, so the registry hands the checker what it needs
# to read calls: a Vocabulary.
AggregateKind = NewType("AggregateKind", str)

# COUNT is parsed here (its argument decides between COUNT(*), COUNT(expr) and COUNT(DISTINCT unit)): the two
# kinds it can give are named here, and their modules in the registry use these names.
COUNT = AggregateKind("count")
COUNT_UNITS = AggregateKind("count_units")
COUNT_DISTINCT = AggregateKind("count_distinct")  # COUNT(DISTINCT expr): one unit removes at most m values


@dataclass(frozen=True)
class Vocabulary:
    """The aggregates a query may use besides COUNT, from the registry in dpsql/planning/aggregates."""

    functions: Mapping[type[exp.Expression], AggregateKind]  # each sqlglot call and the kind it asks for
    supported: str  # every supported aggregate, for the message that refuses another
    # The kind a call asks for with DISTINCT in it (SUM(DISTINCT x): "sum" -> "sum_distinct"), where there is one.
    distinct: Mapping[AggregateKind, AggregateKind] = field(default_factory=dict)


@dataclass(frozen=True)
class AggregateCall:
    kind: AggregateKind
    argument: exp.Expression | None  # None for COUNT(*) and COUNT(DISTINCT unit)
    interval: Interval | None  # the bounds of the argument, for the kinds that need them
    nullable: bool  # whether the argument can be NULL on some row
    node: exp.Expression  # the call as written (qualified)
    fraction: Fraction | None = None  # a quantile's q: the share of rows below the answer
    integer: bool = False  # whether the argument is a whole number on every row (a quantile's grid can be exact)
    cost: int = 0  # the work its argument costs on one row, at most (typecheck.py; 0 without an argument)
    type: str = COUNT_TYPE  # the DuckDB type of the call as written: the released cell's (written_types.py)

    @functools.cached_property
    def text(self) -> str:
        return readable(self.node)

    @functools.cached_property
    def key(self) -> tuple[str, str, Fraction | None, str]:
        # The type too: MEDIAN(x) and QUANTILE_DISC(x, 0.5) share their measurement but not their type.
        return self.kind, self.argument.sql(DIALECT) if self.argument is not None else "", self.fraction, self.type


@dataclass(frozen=True)
class GroupKey:
    expression: exp.Expression
    domain: tuple[Any, ...] | None  # the public values; None means the keys need partition selection
    cost: int = 1  # the work it costs on one row, at most (typecheck.py)
    # The hidden last key of a query with grouping sets: which grouping a group is of (DuckDB's GROUPING() of all the
    # other keys), computed by the aggregation, never from a row.
    grouping_id: bool = False

    @functools.cached_property
    def text(self) -> str:
        return readable(self.expression)


@dataclass(frozen=True)
class CheckedQuery:
    sql: str
    table: TablePolicy
    where: exp.Expression | None
    keys: tuple[GroupKey, ...]
    aggregates: tuple[AggregateCall, ...]
    outer: exp.Select  # post-processing over __noisy(__k0.., __a0..): select items aliased __o0..
    output_names: tuple[str, ...]
    output_aggregate: tuple[int | None, ...]  # per output, the one aggregate it is a monotone function of
    output_noisy: tuple[bool, ...]  # per output, whether it depends on any aggregate
    relation: Relation | None = None  # the joined tables the query reads, or None for one table
    # ROLLUP, CUBE, GROUPING SETS: the groupings released together, each the indices of the keys it groups by (the
    # last key is then the grouping id: grouping_sets.py); () for a plain GROUP BY.
    groupings: tuple[tuple[int, ...], ...] = ()
    # The row filter reads only the unit and columns declared per_unit: it keeps whole units or none, so the rank
    # prepared at load caps the query (rewrite/bounding.cap_rows).
    whole_units: bool = False
    work: person_work.PersonWork | None = None  # the most work one person's rows can cause (person_work.py)


def readable(node: exp.Expression) -> str:
    """SQL as the analyst would write it: without the table qualifiers and quotes that qualify() adds."""
    def plain(part: exp.Expression) -> exp.Expression:
        if isinstance(part, exp.Column):
            return exp.column(part.name)
        return part
    return node.copy().transform(plain, copy=False).sql(DIALECT)


@dataclass(frozen=True)
class ReadableText:
    """`prefix` then readable(node), rendered when shown. Kept as its tree, the text of a plan made for one value of a
    parameter is made for another by substituting it (session.py, plan once)."""

    prefix: str
    node: exp.Expression

    def __str__(self) -> str:
        return self.prefix + readable(self.node)


_SELECT_CLAUSES = {"expressions", "from_", "where", "group", "having", "order", "limit", "offset"}


def check(parsed: ParsedQuery, policy: Policy, vocabulary: Vocabulary,
          facts: PublicFacts | None = None) -> CheckedQuery:
    tree = _read_var(parsed.tree.copy())
    output_names = parsed.output_names if parsed.output_names is not None else _output_names(tree, parsed.sql)
    # A join (or a public table) becomes one relation, read like a table from here on (relation.py).
    per_unit = resolve_per_unit(tree, policy, _type_check, facts)  # FROM (SELECT unit, aggregates ... GROUP BY unit)
    tree, relation = per_unit if per_unit is not None else resolve(
        tree, policy, facts, lambda subquery: per_unit_relation(subquery, policy, _type_check, facts))
    tree = _distinct_as_groups(tree)
    tree, grouping_sets = flat_grouping_sets(tree)  # ROLLUP, CUBE, GROUPING SETS: several groupings of the keys
    _check_clauses(tree)
    table = relation.schema if relation is not None else _table_of(tree, policy)
    _refuse_subqueries(tree)
    schema = {table.name: {c.name: c.type.duckdb for c in table.columns.values()}}
    try:
        # Quoting is left as the analyst wrote it (a reserved word must be quoted to parse at all).
        tree = qualify(tree, schema=schema, dialect=DIALECT, validate_qualify_columns=True, expand_stars=False,
                       quote_identifiers=False, identify=False)
    except OptimizeError as exc:
        raise ProgrammingError(f"{exc} (table '{table.name}' has the columns: "
                               f"{', '.join(sorted(table.columns))})") from None
    type_text_parameters(tree, table)
    where = tree.args.get("where")
    where_cost = None
    if where is not None:
        vet_row_expression(where.this, "WHERE")
        where_cost = _type_check(where.this, table, "WHERE", boolean=True).cost
    keys = tuple(_group_key(e, table) for e in _group_expressions(tree))
    groupings = grouping_indices(tree, grouping_sets, _group_expressions(tree))
    if groupings:
        keys = (*keys, GroupKey(exp.Grouping(expressions=[k.expression.copy() for k in keys]),
                                grouping_ids(groupings, len(keys)), cost=0, grouping_id=True))
    aggregates = _AggregateCalls(table, vocabulary)
    outer = _outer_query(tree, table, keys, aggregates)
    _check_constants(tree)
    if not aggregates.calls and not keys:
        raise QueryRejected("the query has no aggregate: only aggregates such as COUNT(*), SUM, AVG, and the "
                            "group keys of GROUP BY or SELECT DISTINCT, can be released privately, never individual "
                            "rows")
    whole_units = relation is None and where is not None and keeps_whole_units(table, where.this)
    return CheckedQuery(
        sql=parsed.sql,
        table=table,
        where=where.this if where is not None else None,
        keys=keys,
        aggregates=tuple(aggregates.calls),
        outer=outer,
        output_names=output_names,
        output_aggregate=tuple(_single_aggregate(e.this) for e in outer.expressions),
        output_noisy=tuple(bool(_aggregate_columns(e.this)) for e in outer.expressions),
        relation=relation,
        whole_units=whole_units,
        work=_person_work(table, relation, where, where_cost, keys, aggregates.calls, policy, whole_units,
                          groupings),
        groupings=groupings,
    )


def keeps_whole_units(table: TablePolicy, where: exp.Expression) -> bool:
    """Whether a row filter reads only the unit and columns declared per_unit: it keeps whole units or none."""
    return all(column.name == table.privacy_unit or table.columns[column.name].per_unit
               for column in where.find_all(exp.Column))


def _person_work(table: TablePolicy, relation: Relation | None, where: exp.Where | None, where_cost: int | None,
                 keys: tuple[GroupKey, ...], aggregates: list[AggregateCall], policy: Policy,
                 whole_units: bool, groupings: tuple[tuple[int, ...], ...] = ()) -> person_work.PersonWork:
    """The most work one person's rows can cause (person_work.py): refused over the policy's bound. `groupings`: the
    grouping sets (each row is aggregated into each, and adds candidate groups to those with keys that go through
    partition selection)."""
    m = table.bound.max_rows
    # The candidate groups one person can add, which partition selection goes through (public keys: none).
    selected = sum(1 for grouping in groupings or [range(len(keys))] if any(keys[i].domain is None for i in grouping))
    groups = min(m, table.bound.max_groups or m) * selected
    expressions = [(k.text, k.cost) for k in keys if not k.grouping_id] + [(a.text, a.cost) for a in aggregates
                                                                            if a.cost]
    expressions += person_work.grouping_terms(len(groupings), len(aggregates))
    # One bucket query per quantile argument reads the bounded rows again (rewrite/quantile_buckets.py).
    passes = 1 + len({a.argument for a in aggregates if a.fraction is not None})
    inherited = relation.work if relation is not None else ()
    filter_text = ReadableText("WHERE ", where.this) if where is not None else ""
    if where is None or relation is not None or whole_units or table.row_privacy:
        # Every filter evaluation is on a row within the cap: m rows of one person (the joined rows of a relation).
        terms = [*inherited, *person_work.stage_terms(m, where_cost, filter_text, expressions)]
        return person_work.bound(terms, passes, policy.limits, groups)
    # The filtered cap looks past the first m rows for ones that pass: as far as the bound allows.
    terms = [*inherited, *person_work.stage_terms(m, None, filter_text, expressions)]
    return person_work.with_lookahead(terms, passes, policy.limits, filter_text, where_cost, m, groups)


def _distinct_as_groups(tree: exp.Select) -> exp.Select:
    """`SELECT DISTINCT k1, k2 ... FROM t` is `SELECT k1, k2 ... GROUP BY k1, k2`: the keys are released like any
    group keys (every declared value when all are public, else those that pass partition selection). With GROUP BY
    or an aggregate the rows are one per group already, and DISTINCT is refused rather than guessed at."""
    distinct = tree.args.get("distinct")
    if distinct is None:
        return tree
    if distinct.args.get("on") is not None:
        raise QueryRejected("SELECT DISTINCT ON is not supported: it keeps one row per key, chosen by the data")
    if tree.args.get("group") is not None or any(isinstance(n, exp.AggFunc) for e in tree.expressions
                                                 for n in e.walk()):
        raise QueryRejected("SELECT DISTINCT with GROUP BY or aggregates: the answer has one row per group already; "
                            "drop DISTINCT")
    tree = tree.copy()
    tree.set("distinct", None)
    keys = [item.this if isinstance(item, exp.Alias) else item for item in tree.expressions]
    # A constant item is the same on every row: it adds nothing to what is distinct, and GROUP BY would read a bare
    # integer as a position (SELECT DISTINCT region, 1 grouped by region twice, every row repeated).
    varying = [key for key in keys if not isinstance(key, exp.Literal)]
    return tree.group_by(*[key.copy() for key in varying or keys], copy=False)


def _read_var(tree: exp.Select) -> exp.Select:
    for node in list(tree.find_all(exp.Anonymous)):  # VAR(x), which sqlglot does not know: the sample variance
        if node.name.lower() == "var" and len(node.expressions) == 1:
            variance = exp.Variance(this=node.expressions[0])
            variance.meta.update(node.meta)  # where the analyst wrote it, for the output's name
            node.replace(variance)
    return tree


def written_output_names(parsed: ParsedQuery) -> tuple[str, ...]:
    """The outputs' names as the written SQL gives them (for normalisation, which rewrites the select items)."""
    return _output_names(_read_var(parsed.tree.copy()), parsed.sql)


def _check_constants(tree: exp.Select) -> None:
    """Every constant part of the query evaluates without error (see vetting.ConstantChecker)."""
    parts = [("SELECT", e) for e in tree.expressions]
    for clause in ("where", "having"):
        if tree.args.get(clause) is not None:
            parts.append((clause.upper(), tree.args[clause].this))
    parts += [("GROUP BY", e) for e in _group_expressions(tree)]
    if tree.args.get("order") is not None:
        parts += [("ORDER BY", item.this) for item in tree.args["order"].expressions]
    for clause, node in parts:
        CONSTANTS.check(node, clause)


def _type_check(node: exp.Expression, table: TablePolicy, context: object, boolean: bool = False,
                numeric: bool = False) -> Typed:
    """Refuse a row expression that is not total for every row or whose per-row cost is unbounded (typecheck.py);
    the constants its total form adds (a text literal read as a date) must evaluate, from the text alone."""
    typed = typed_expression(node, table.columns, context)
    if boolean and typed.kind not in (Kind.BOOL, Kind.NULL):
        raise QueryRejected(f"{context}: the condition is {typed.kind.value}, not boolean: DuckDB would cast it "
                            "implicitly, which can fail on some rows; write a comparison")
    if numeric and typed.kind not in (Kind.INT, Kind.DOUBLE, Kind.DECIMAL, Kind.BOOL, Kind.NULL):
        raise QueryRejected(f"{context}: the argument is {typed.kind.value}: only numbers and booleans can be "
                            "summed or averaged")
    CONSTANTS.check(typed.node, context)
    return typed


def _check_clauses(tree: exp.Select) -> None:
    for clause, value in tree.args.items():
        if value and clause not in _SELECT_CLAUSES:
            label = {"with_": "WITH (common table expressions)", "joins": "JOIN", "distinct": "SELECT DISTINCT",
                     "qualify": "QUALIFY", "windows": "WINDOW", "laterals": "LATERAL", "sample": "TABLESAMPLE",
                     "into": "SELECT INTO", "pivots": "PIVOT", "kind": "SELECT AS STRUCT"}.get(clause, clause)
            raise QueryRejected(f"{label} is not supported: ask one table with WHERE, GROUP BY and aggregates")
    from_ = tree.args.get("from_")
    if from_ is None:
        raise QueryRejected("the query has no FROM: name one of the policy's tables")
    for select_item in tree.expressions:
        if isinstance(select_item, exp.Star) or (isinstance(select_item, exp.Column)
                                                 and isinstance(select_item.this, exp.Star)):
            raise QueryRejected("SELECT * would release individual rows: select aggregates such as COUNT(*)")
        if isinstance(select_item, exp.Columns):
            raise QueryRejected("COLUMNS(...) is not supported: name the aggregates you want")
    group = tree.args.get("group")
    if group is not None:
        sets = [e for e in group.expressions if isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets)]
        for clause in ("rollup", "cube", "grouping_sets", "totals"):
            if group.args.get(clause):  # how older sqlglot versions hold them
                sets.append(group)
        if sets:
            raise QueryRejected(f"GROUP BY {readable(sets[0])}: ROLLUP, CUBE and GROUPING SETS (several groupings "
                                "in one query) are not supported: ask one query per grouping, e.g. GROUP BY a, b "
                                "and then GROUP BY a, and a query without GROUP BY for the total")
        if group.args.get("all"):
            raise QueryRejected("GROUP BY ALL is not supported: name the group keys")


def _table_of(tree: exp.Select, policy: Policy) -> TablePolicy:
    source = tree.args["from_"].this
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        kind = describe(source.this if isinstance(source, exp.Table) else source)
        raise QueryRejected(f"FROM must name a declared table; {kind} is not allowed (table functions, files and "
                            "subqueries cannot be read)")
    if source.args.get("db") or source.args.get("catalog"):
        raise QueryRejected(f"FROM {source.sql(DIALECT)}: only the policy's tables can be read, without a schema "
                            "or catalog")
    alias = source.args.get("alias")
    if alias is not None and alias.args.get("columns"):
        # pums AS t(x) renames the table's columns by position: x would be the first column, whatever its role
        # in the policy. Refused rather than resolved: the policy's names are the only ones the checker knows.
        raise QueryRejected(f"FROM {source.sql(DIALECT)}: renaming columns in a table alias (AS t(x, ...)) is not "
                            f"supported: write AS {alias.name} and use the policy's column names")
    for clause in ("joins", "laterals", "pivots", "sample", "version", "when", "changes"):
        if source.args.get(clause):
            raise QueryRejected(f"FROM {source.sql(DIALECT)}: {clause} is not supported")
    table = policy.table(source.name)
    if table is None:
        raise ProgrammingError(f"unknown table '{source.name}' (the policy declares: "
                               f"{', '.join(sorted(policy.tables))})")
    return table


def _refuse_subqueries(tree: exp.Select) -> None:
    """Before qualify(), which would report a subquery's unknown table as a missing schema."""
    for node in tree.walk():
        if node is tree or not isinstance(node, exp.Query | exp.Subquery):
            continue
        clause = node
        while clause.parent is not tree:
            clause = clause.parent
        label = {"expressions": "SELECT", "from_": "FROM", "group": "GROUP BY", "order": "ORDER BY"}.get(
            clause.arg_key, clause.arg_key.upper())
        hint = "ask the inner query on its own"
        if isinstance(node.parent, exp.In | exp.Exists):
            hint = ("IN (SELECT ...) and EXISTS are answered in WHERE, over public tables, or over a private table "
                    "of the query's unit correlated on the unit (unit IN (SELECT unit FROM t WHERE ...), EXISTS "
                    "(SELECT ... FROM t WHERE t.unit = outer.unit AND ...)); otherwise list the values: IN (1, 2, 3)")
        raise QueryRejected(f"{label}: this subquery is not supported: {hint}")


class _WrittenNames(DuckDB):
    """DuckDB's SQL, with each function under the name the analyst typed (VAR_SAMP, not its synonym VARIANCE)."""

    ORIGINAL_NAME_META_KEY = "dpsql_written_name"


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _as_written(item: exp.Expression, sql: str) -> str:
    """An unaliased output's name, after DuckDB's convention: the expression as written, function names in lower
    case (`var_samp(age)`, `avg(age) + 1`). The parser keeps where each function's name is in the text."""
    named = item.copy()
    for node in named.walk():
        start, end = node.meta.get("start"), node.meta.get("end")
        if isinstance(node, exp.Func) and start is not None and end is not None:
            written = sql[start:end + 1]
            if _PLAIN_NAME.fullmatch(written):
                node.meta[_WrittenNames.ORIGINAL_NAME_META_KEY] = written
    return named.sql(dialect=_WrittenNames, normalize_functions="lower")


def _output_names(tree: exp.Select, sql: str) -> tuple[str, ...]:
    names: list[str] = []
    for item in tree.expressions:
        if isinstance(item, exp.Alias):
            name = item.alias
        elif isinstance(item, exp.Column):
            name = item.name
        else:
            name = _as_written(item, sql)
        base, n = name, 2
        while name in names:
            name, n = f"{base}_{n}", n + 1
        names.append(name)
    return tuple(names)


def _group_expressions(tree: exp.Select) -> list[exp.Expression]:
    """The GROUP BY expressions, each once: `GROUP BY a, a` groups as `GROUP BY a` does, and as two keys it made a
    grid of every pair of a's public values in which each output column showed one of the two, so that the empty
    off-diagonal cells read like a's groups with a count of 0."""
    group = tree.args.get("group")
    return list(dict.fromkeys(group.expressions)) if group is not None else []


def _group_key(expression: exp.Expression, table: TablePolicy) -> GroupKey:
    place = _Place("GROUP BY", expression)
    vet_row_expression(expression, place)
    typed = _type_check(expression, table, place)
    columns = {c.name for c in expression.find_all(exp.Column)}
    if table.privacy_unit in columns:
        raise QueryRejected(f"{place}: grouping by the privacy unit column '{table.privacy_unit}' would "
                            "give one group per person")
    return GroupKey(expression, _domain(expression, table), typed.cost)


def _domain(expression: exp.Expression, table: TablePolicy) -> tuple[Any, ...] | None:
    """The public values a group key can take, derived from the policy and the SQL only."""
    if isinstance(expression, exp.Paren):
        return _domain(expression.this, table)
    if isinstance(expression, exp.Column):
        column = table.columns[expression.name]
        if column.values is not None:
            return column.values
        if column.type is ColumnType.BOOL:
            return (False, True)
        return None
    if isinstance(expression, exp.Predicate | exp.Not) and not isinstance(expression, exp.Is):
        return (False, True)
    if isinstance(expression, exp.Case) and expression.args.get("default") is not None:
        results = [branch.args["true"] for branch in expression.args["ifs"]] + [expression.args["default"]]
        if all(isinstance(r, exp.Literal) for r in results):
            return _engine_values(results)
    return None


def _engine_values(results: list[exp.Literal]) -> tuple[Any, ...] | None:
    """The values a CASE with these literal results takes, exactly as the engine returns them.

    A released group is found by comparing the engine's key with the domain's values, so they must be the same
    Python values: DuckDB types the results together (0.1 and 0.2 are DECIMAL(2,1), read back as Decimal('0.1'),
    which no float equals; 1 and 2.5e0 are DOUBLE), so the values are computed by DuckDB itself, from a CASE with
    the same results, in the constant checker's empty sandbox. None if DuckDB finds no common type for them
    (1 and 'x'): the key then goes through partition selection, like any key without public values.
    """
    choose = exp.Case(ifs=[exp.If(this=exp.column("i").eq(n), true=r.copy()) for n, r in enumerate(results[:-1])],
                      default=results[-1].copy())
    try:
        rows = CONSTANTS.evaluate(f"SELECT {choose.sql(DIALECT)} FROM range({len(results)}) AS t(i) ORDER BY i")
    except duckdb.Error:
        return None
    return tuple(dict.fromkeys(row[0] for row in rows))


def _outer_query(tree: exp.Select, table: TablePolicy, keys: tuple[GroupKey, ...],
                 aggregates: _AggregateCalls) -> exp.Select:
    """Rewrite the SELECT into post-processing over __noisy: aggregates and group keys become columns."""
    key_index = {k.expression: i for i, k in enumerate(keys)}
    select_items = []
    for i, item in enumerate(tree.expressions):
        inner = item.this if isinstance(item, exp.Alias) else item
        replaced = _replace_private(inner, table, key_index, aggregates, _Place("SELECT", inner))
        select_items.append(exp.alias_(replaced, names.output(i)))
    outer = exp.select(*select_items).from_(names.NOISY_TABLE)
    having = tree.args.get("having")
    if having is not None:
        outer = outer.where(_replace_private(having.this, table, key_index, aggregates, _Place("HAVING")))
    order = tree.args.get("order")
    if order is not None:
        ordered = []
        for item in order.expressions:
            target = _resolve_order_names(item.this, tree, table)
            if not (isinstance(target, exp.Column) and names.marked(target, _OUTPUT_REFERENCE)):
                target = _replace_private(target, table, key_index, aggregates, _Place("ORDER BY", item.this))
            rewritten = item.copy()
            rewritten.set("this", target)
            ordered.append(rewritten)
        outer = outer.order_by(*ordered)
    for clause in ("limit", "offset"):
        node = tree.args.get(clause)
        if node is not None:
            value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
            if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()
                    and int(value.this) < 2**62):
                raise QueryRejected(f"{clause.upper()} must be a whole number below 2^62")
            outer.set(clause, node.copy())
    return outer


def _resolve_order_names(target: exp.Expression, tree: exp.Select, table: TablePolicy) -> exp.Expression:
    """An ORDER BY item with its output aliases resolved, as DuckDB resolves them.

    qualify() qualifies the table columns of ORDER BY and leaves the names it takes for output aliases bare.
    DuckDB reads a bare name as an alias first (`ORDER BY n`), but inside an expression as a table column first
    (`SELECT b AS a, ... ORDER BY a + 0` sorts by the column a). A bare alias becomes that output's column; inside
    an expression an alias becomes the output's expression, so that `n * -1` or `CAST(gender AS INT) * -1` are
    checked like the same expression in HAVING: functions of group keys and aggregates only.
    """
    items = tree.expressions
    aliases = [item.alias for item in items]
    if isinstance(target, exp.Column) and not target.table and target.name in aliases:
        return names.mark(exp.column(names.output(aliases.index(target.name))), _OUTPUT_REFERENCE)
    qualifier = tree.args["from_"].this.alias_or_name

    def resolve(part: exp.Expression) -> exp.Expression:
        if isinstance(part, exp.Column) and not part.table:
            if part.name in table.columns:
                return exp.column(part.name, table=qualifier)
            if part.name in aliases:
                return exp.paren(items[aliases.index(part.name)].this.copy())
        return part

    return target.copy().transform(resolve, copy=False)


# Meta key on an ORDER BY item that names an output by its alias: it is post-processing of that output as is.
_OUTPUT_REFERENCE = "dpsql_output_reference"


@dataclass(frozen=True)
class _Place:
    """Where in the query an error is: rendered only if an error message needs it."""

    clause: str
    node: exp.Expression | None = None

    def __str__(self) -> str:
        return f"{self.clause} {readable(self.node)}".strip() if self.node is not None else self.clause


@dataclass
class _AggregateCalls:
    """The distinct aggregate calls of a query, in the order they are first met."""

    table: TablePolicy
    vocabulary: Vocabulary
    calls: list[AggregateCall] = field(default_factory=list)

    def index(self, node: exp.Expression, context: _Place) -> int:
        """The index of the call `node`, checked and added if it is new."""
        call = _aggregate(node, self.table, self.vocabulary, context)
        keys = [a.key for a in self.calls]
        if call.key not in keys:
            self.calls.append(call)
            keys.append(call.key)
        return keys.index(call.key)


def _replace_private(node: exp.Expression, table: TablePolicy, key_index: dict[exp.Expression, int],
                     aggregates: _AggregateCalls, context: _Place) -> exp.Expression:
    """A copy of `node` where group keys and aggregates are columns of __noisy; anything else that would read
    a private row is refused. Keys match structurally, the largest matching subtree first (pre-order)."""
    grouping = next((i for key, i in key_index.items() if isinstance(key, exp.Grouping)), None)

    def swap(part: exp.Expression) -> exp.Expression:
        if part in key_index:
            return names.key_column(key_index[part])
        if isinstance(part, exp.Grouping | exp.GroupingId):
            # GROUPING(a, b): which of its keys the group's grouping rolls up, read from the grouping id (0 without
            # grouping sets, as in DuckDB)
            indices = [key_index.get(argument) for argument in part.expressions]
            if not indices or None in indices:
                raise QueryRejected(f"{context}: GROUPING() takes group keys of the query")
            if grouping is None:
                return exp.Literal.number(0)
            return grouping_bits(indices, grouping, names.key_column(grouping))
        if isinstance(part, exp.Window):  # before its function: RANK() or SUM(COUNT(*)) is not the problem
            raise QueryRejected(f"{context}: window functions (OVER) are not supported, even computed across the "
                                "released groups. To rank groups or keep the top ones, use ORDER BY and LIMIT "
                                "(ORDER BY COUNT(*) DESC LIMIT 10); for a total over all groups, ask it in its own "
                                "query without GROUP BY")
        if isinstance(part, exp.AggFunc | exp.Filter | exp.WithinGroup):
            return names.aggregate_column(aggregates.index(part, context))
        return part

    result = node.copy().transform(swap, copy=False)
    for part in result.walk():
        if isinstance(part, exp.Column) and names.key_index(part) is None and names.aggregate_index(part) is None:
            raise QueryRejected(f"{context}: column '{part.name}' is used outside an aggregate but is not a GROUP "
                                "BY key: only aggregates and group keys can be released")
        if isinstance(part, exp.Window):
            raise QueryRejected(f"{context}: window functions are not supported")
        if isinstance(part, exp.Subquery | exp.Query):
            raise QueryRejected(f"{context}: subqueries are not supported")
        if type(part) not in ROW_NODES and not isinstance(part, exp.Ordered):
            raise QueryRejected(f"{context}: {describe(part)} is not in the list of vetted SQL functions")
    return result


def _aggregate(node: exp.Expression, table: TablePolicy, vocabulary: Vocabulary, context: _Place) -> AggregateCall:
    text = _Place("", node)  # rendered only for a message
    if isinstance(node, exp.Filter):
        raise QueryRejected(f"{text}: FILTER (WHERE ...) is not supported; put the condition in a CASE inside "
                            "the aggregate or in the WHERE clause")
    quantile = quantile_parts(node)
    argument, fraction = quantile if quantile is not None else (node.this, None)
    if any(isinstance(n, exp.AggFunc) for n in argument.walk()) if argument is not None else False:
        raise QueryRejected(f"{text}: an aggregate inside an aggregate is not supported")
    if isinstance(node, exp.Count):
        return _count(node, table, text)
    if isinstance(node, exp.ApproxDistinct):
        # Computed exactly as COUNT(DISTINCT x): the sensitivity holds for the exact count, not for a sketch's.
        if node.args.get("accuracy") is not None:
            raise QueryRejected(f"{text}: APPROX_COUNT_DISTINCT takes one argument")
        return _count_distinct([node.this], table, node, text)
    kind = vocabulary.functions.get(type(node.this if isinstance(node, exp.WithinGroup) else node))
    if kind is None:
        name = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__
        raise QueryRejected(f"{context}: {name.upper()} is not supported: a single person can move it without "
                            f"bound, so it has no differentially private answer here (supported: "
                            f"{vocabulary.supported})")
    if isinstance(argument, exp.Distinct):
        if kind not in vocabulary.distinct or len(argument.expressions) != 1:
            written = node.this if isinstance(node, exp.WithinGroup) else node
            name = written.sql_name() if isinstance(written, exp.Func) else kind
            raise QueryRejected(f"{text}: DISTINCT inside {name.upper()} is not supported (SUM, AVG and COUNT "
                                "take DISTINCT)")
        kind, argument = vocabulary.distinct[kind], argument.expressions[0]
    if argument is None:  # QUANTILE_CONT(, 0.5) parses
        raise QueryRejected(f"{text}: {kind.upper()} needs a value to aggregate")
    vet_row_expression(argument, text)
    typed = _type_check(argument, table, text, numeric=True)
    try:
        interval = interval_of(argument, table.columns)
    except Unbounded as exc:
        raise QueryRejected(f"{text}: {exc}") from None
    return AggregateCall(kind, argument, interval, _nullable(argument, table), node, fraction,
                         integer=typed.kind in (Kind.INT, Kind.BOOL), cost=typed.cost,
                         type=written_type(node, table.columns, text))


def _count(node: exp.Count, table: TablePolicy, text: _Place) -> AggregateCall:
    argument = node.this
    if argument is None or isinstance(argument, exp.Star):
        return AggregateCall(COUNT, None, None, False, node)
    if isinstance(argument, exp.Distinct):
        return _count_distinct(argument.expressions, table, node, text)
    vet_row_expression(argument, text)
    typed = _type_check(argument, table, text)
    if not _nullable(argument, table):
        return AggregateCall(COUNT, None, None, False, node)
    return AggregateCall(COUNT, argument, None, True, node, cost=typed.cost)


def _count_distinct(inner: list[exp.Expression], table: TablePolicy, node: exp.Expression,
                    text: _Place) -> AggregateCall:
    """COUNT(DISTINCT expr) of any row expression, over the capped rows (planning/aggregates/distinct.py)."""
    if len(inner) != 1:
        raise QueryRejected(f"{text}: COUNT(DISTINCT ...) takes one expression")
    (argument,) = inner
    if isinstance(argument, exp.Column) and table.privacy_unit is not None and argument.name == table.privacy_unit:
        return AggregateCall(COUNT_UNITS, None, None, False, node)
    condition = _units_where(argument, table)
    if condition is not None:
        # COUNT(DISTINCT unit) FILTER (WHERE c), as normalize.py writes it: the units with a row where c holds. One
        # unit adds at most 1 to each group it reaches, as without the condition.
        vet_row_expression(condition, text)
        typed = _type_check(condition, table, text, boolean=True)
        return AggregateCall(COUNT_UNITS, exp.Distinct(expressions=[condition]), None, False, node, cost=typed.cost)
    vet_row_expression(argument, text)
    typed = _type_check(argument, table, text)
    # Hashed for its distinct values: as many units as the value can have characters, besides computing it.
    return AggregateCall(COUNT_DISTINCT, argument, None, True, node, cost=typed.cost + typed.length)


def _units_where(argument: exp.Expression, table: TablePolicy) -> exp.Expression | None:
    """c, when `argument` is `CASE WHEN c THEN unit END` (no ELSE, or ELSE NULL): the unit where c holds."""
    bare = argument.unnest()
    if not isinstance(bare, exp.Case) or bare.this is not None or len(bare.args.get("ifs") or []) != 1 \
            or not isinstance(bare.args.get("default") or exp.null(), exp.Null) or table.privacy_unit is None:
        return None
    branch = bare.args["ifs"][0]
    result = branch.args["true"].unnest()
    if isinstance(result, exp.Column) and result.name == table.privacy_unit:
        return branch.this
    return None


def _nullable(expression: exp.Expression, table: TablePolicy) -> bool:
    """Whether the expression can be NULL on some row; False only when that is certain from the policy."""
    if isinstance(expression, exp.Paren):
        return _nullable(expression.this, table)
    if isinstance(expression, exp.Column):
        return expression.name != table.privacy_unit and table.columns[expression.name].nullable
    return not isinstance(expression, exp.Literal)


def _aggregate_columns(node: exp.Expression) -> list[int]:
    """The aggregates an outer expression reads (their indices), once per occurrence."""
    return [i for i in map(names.aggregate_index, node.find_all(exp.Column)) if i is not None]


def _single_aggregate(node: exp.Expression) -> int | None:
    """The aggregate an output is a monotone function of, so its interval maps through; None otherwise."""
    columns = _aggregate_columns(node)
    if len(columns) != 1:
        return None
    monotone = (exp.Column, exp.Identifier, exp.Literal, exp.Paren, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg,
                exp.Round, exp.Floor, exp.Ceil, exp.Cast, exp.TryCast, exp.DataType)
    for part in node.walk():
        if not isinstance(part, monotone):
            return None
        if isinstance(part, exp.Div) and _aggregate_columns(part.expression):
            return None  # x / noisy is not monotone across zero
        if isinstance(part, exp.Cast | exp.TryCast) and not part.to.is_type(*exp.DataType.NUMERIC_TYPES):
            return None
        if isinstance(part, exp.Round | exp.Floor | exp.Ceil) and any(
                _aggregate_columns(arg) for key, arg in part.args.items() if key != "this" and
                isinstance(arg, exp.Expression)):
            return None  # monotone in the value, not in the digits: ROUND(0.45, 0), (.., 1), (.., 2) = 0, 0.5, 0.45
    return columns[0]
