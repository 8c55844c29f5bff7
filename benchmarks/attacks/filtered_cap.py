"""A differential fuzzer for the filtered cap (rewrite/bounding.cap_rows): its three UNION ALL branches must keep
EXACTLY the first m passing rows of each unit, in the load-time rank order, for every filter the checker accepts.

A cap that keeps anything else is a sensitivity bug when the choice of a unit's rows depends on other units' rows
(or keeps more than m), and an accuracy bug otherwise. For each generated accepted query with a row filter (the
typed grammar of benchmarks/attacks/differential.py, plus filters over a column declared per_unit, which takes the
load-time-rank path), the rows the rewrite keeps (its own filter and cap passes, reading the unit and the rank) are
compared with a reference: the same WHERE, then `row_number() OVER (PARTITION BY unit ORDER BY rank) <= m`, a
window over each unit's own passing rows. This runs on a base table where units have 1 to 7 rows (m = 2) and on
its neighbours: one unit removed, and each of differential.py's adversarial rows added as a unit's further row.
The exact measurement of the whole pipeline (COUNT(*), before any noise) is compared with the reference's size too.
Run as `python -m benchmarks.attacks.filtered_cap`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlglot import exp

from benchmarks.attacks.differential import ADVERSARIAL_ROWS, Expression, Grammar
from benchmarks.attacks.script import options, scratch
from benchmarks.support import Budget, Table, column, open_session, seeded, write_dataset
from benchmarks.truth import bounded_truth
from dpsql.errors import Error
from dpsql.planning.plan import QueryPlan
from dpsql.rewrite import passes
from dpsql.session import PreparedQuery, PrivateSession
from dpsql.sql import names
from dpsql.sql.parse import DIALECT

M = 2
TABLE = Table("f", "uid", (
    column("uid", "int"), column("i", "int", -100.0, 100.0), column("x", "float", -10.0, 10.0), column("s", "text"),
    column("b", "bool"), column("d", "date"), column("ts", "timestamp"), column("g", "text", values=("a", "b")),
    column("pu", "int", 0.0, 9.0)), max_rows=M)
BUDGET = Budget(epsilon=1e12, delta=1e-3, query_epsilon=1.0, query_delta=1e-6)
REMOVED = 7  # the unit the "one unit removed" world lacks


def base_rows(seed: int, people: int = 40) -> list[tuple]:
    """Units of 1 to 7 rows (so most have more than m), with exact duplicates among a unit's rows now and then
    (the same row hash: ties in the load-time order); `pu` is the unit's own value on all its rows."""
    r = random.Random(seed)
    rows = []
    for u in range(people):
        pu = r.randint(0, 9) if r.random() < 0.9 else None
        mine = []
        for _ in range(r.randint(1, 7)):
            if mine and r.random() < 0.15:
                last = mine[-1]  # an exact duplicate, or (a zero) the same row with the zero's sign flipped
                mine.append((*last[:2], -last[2], *last[3:]) if last[2] == 0 and r.random() < 0.7 else last)
                continue
            mine.append((u, r.randint(-100, 100), r.choice([round(r.uniform(-10, 10), 2), 0.0, -0.0, None]),
                         r.choice(["alpha", "Beta", "c d", "x1", "42", "", None]), r.choice([True, False, None]),
                         f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
                         f"2023-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {r.randint(0, 23):02d}:00:00",
                         r.choice("abc"), pu))
        rows += mine
    return rows


class CapGrammar(Grammar):
    """differential.py's typed grammar, with the per_unit column among the integer leaves now and then."""

    def of(self, kind: str, depth: int = 0) -> Expression:
        if kind == "int" and self.r.random() < 0.15:
            return Expression("pu")
        return super().of(kind, depth)

    def filtered_query(self) -> tuple[str, Expression]:
        form = self.r.randrange(5)
        e = self.of("bool")
        if form == 0:
            return f"SELECT COUNT(*) FROM f WHERE {e.sql}", e
        if form == 1:  # a declared-values key: its IN filter joins the WHERE before the cap
            return f"SELECT g, COUNT(*) FROM f WHERE {e.sql} GROUP BY g", e
        if form == 2:  # per_unit columns and the unit only: the load-time rank caps
            w = self.pick(("pu > 3", "pu IS NULL", "uid % 3 = 1", "pu + uid > 20", "NOT (pu = 2)", "pu IN (1, 2, 7)",
                           "CASE WHEN pu > 5 THEN uid < 30 ELSE uid > 4 END", "coalesce(pu, 0) < 4"))
            return f"SELECT COUNT(*) FROM f WHERE {w}", Expression(w)
        if form == 3:  # the quantile's bucket query reads the same rows
            return f"SELECT MEDIAN(x), COUNT(*) FROM f WHERE {e.sql}", e
        return f"SELECT COUNT(*), SUM(i) FROM f WHERE {e.sql} AND pu < 6", e


@dataclass(frozen=True)
class Mismatch:
    sql: str
    world: str
    detail: str


@dataclass
class Summary:
    cases: int = 0
    refused: int = 0
    compared: int = 0  # (query, world) pairs compared
    mismatches: list[Mismatch] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.cases} filtered queries: {self.cases - self.refused} accepted, {self.compared} comparisons "
               f"over {len(WORLD_NAMES)} worlds; {len(self.mismatches)} mismatches"]
        out += [f"  [{m.world}] {m.sql}  ({m.detail[:120]})" for m in self.mismatches[:30]]
        return out


WORLD_NAMES = ("base", "one unit removed", *ADVERSARIAL_ROWS)


def open_worlds(folder: Path, seed: int, threads: int = 2, bounds: dict | None = None) -> dict[str, PrivateSession]:
    rows = base_rows(seed)
    worlds = {"base": rows, "one unit removed": [r for r in rows if r[0] != REMOVED]}
    pu = next(r[-1] for r in rows if r[0] == 3)
    for theme, row in ADVERSARIAL_ROWS.items():
        worlds[theme] = [*rows, (3, *row[1:], pu)]  # unit 3's further row
    sessions = {}
    for name, data in worlds.items():
        policy = write_dataset(folder / re.sub(r"\W", "_", name), TABLE, data, BUDGET)
        declared = 'pu = { type = "int", lower = 0.0, upper = 9.0'
        text = policy.read_text().replace(f"{declared} }}", f"{declared}, per_unit = true }}")
        if bounds:
            text = text.replace(f"max_rows_per_unit = {M}\n", "".join(f"{k} = {v}\n" for k, v in bounds.items()))
        policy.write_text(text)
        sessions[name] = open_session(policy, seed, "cap", threads=threads)
    return sessions


def kept_rows(plan) -> str:
    """The unit and load-time rank of every row the rewrite keeps (its filter and cap passes, as _rows runs them)."""
    table = names.prepared_table(plan.query.table.name)
    context = passes._Context(plan, table, passes._alias(plan), passes._arguments(plan), passes._whole_units(plan))
    tree = exp.select("*").from_(exp.to_table(table).as_(context.alias))
    tree = passes.cap_rows_per_unit(passes.filter_rows(tree, context), context)
    return tree.select(exp.column(names.UNIT, context.alias), exp.column(names.RANK, context.alias),
                       append=False).sql(DIALECT)


def reference_rows(plan) -> str:
    """The first m passing rows of each unit among its first `examined` (the filtered cap's look-ahead, which the
    per-person work bound sets: analysis/person_work.py), by a window over its own passing rows: the definition of
    the cap. (With a filter of whole units the rewrite leaves the declared-values filter of the keys out, as without
    a filter: the reference leaves it out too.)"""
    table = names.prepared_table(plan.query.table.name)
    context = passes._Context(plan, table, passes._alias(plan), passes._arguments(plan), passes._whole_units(plan))
    filtered = passes.filter_rows(exp.select("*").from_(exp.to_table(table).as_(context.alias)), context)
    where = filtered.args["where"].this.sql(DIALECT) if filtered.args.get("where") else "TRUE"
    examined = plan.query.work.examined if plan.query.work is not None else None
    if examined is not None:
        where = f"({where}) AND {names.RANK} <= {examined}"
    return (f"SELECT {names.UNIT}, {names.RANK} FROM (SELECT *, row_number() OVER (PARTITION BY {names.UNIT} "
            f"ORDER BY {names.RANK}) AS __rk FROM {table} AS {context.alias} WHERE {where}) "
            f"WHERE __rk <= {plan.max_rows}")


# Per-group bounds (max_groups_per_unit = k, max_rows_per_group = r): of each unit's capped rows, the r with the
# smallest row hash in each of its groups, in the k groups whose smallest row hash is smallest.
PER_GROUP = {"max_rows_per_unit": 3, "max_groups_per_unit": 2, "max_rows_per_group": 1}


def open_per_group_worlds(folder: Path, seed: int, threads: int = 2) -> dict[str, PrivateSession]:
    sessions = open_worlds(folder / "per_group", seed, threads, bounds=PER_GROUP)
    return sessions


def per_group_query(grammar: CapGrammar) -> str:
    e = grammar.of("bool")
    keys = grammar.pick(("g", "g, b", "s", "b", "CASE WHEN i > 0 THEN 'p' ELSE 'n' END"))
    where = "" if grammar.r.random() < 0.2 else f" WHERE {e.sql}"
    return f"SELECT {keys}, COUNT(*) FROM f{where} GROUP BY ALL"


def per_group_kept(plan) -> str:
    """(unit, row hash, keys...) of every row the rewrite's row passes keep, per-group cap included."""
    rows, _ = passes._rows(plan, names.prepared_table(plan.query.table.name))
    keys = [names.key(i) for i in range(len(plan.query.keys))]
    return exp.select(names.UNIT, names.ROW_KEY, *keys).from_(rows.subquery("r")).sql(DIALECT)


def per_group_reference(session: PrivateSession, plan) -> list[tuple]:
    """The same, computed here: the reference unit cap, then each unit's groups and rows chosen in Python."""
    table = names.prepared_table(plan.query.table.name)
    context = passes._Context(plan, table, passes._alias(plan), passes._arguments(plan), passes._whole_units(plan))
    keys = ", ".join(passes._guarded(k.expression, context).sql(DIALECT) for k in plan.query.keys)
    capped = session.engine.run(
        f"SELECT {context.alias}.{names.UNIT}, {context.alias}.{names.ROW_KEY}, {keys} FROM {table} AS "
        f"{context.alias} JOIN ({reference_rows(plan)}) AS kept ON {context.alias}.{names.UNIT} = kept.{names.UNIT}"
        f" AND {context.alias}.{names.RANK} = kept.{names.RANK}")
    groups: dict[tuple, list[tuple]] = {}
    for row in capped:
        groups.setdefault((row[0], _group(row[2:])), []).append(row)
    bound = plan.query.table.bound
    by_unit: dict = {}
    for (unit, _), rows in groups.items():
        rows.sort(key=lambda row: row[1])
        by_unit.setdefault(unit, []).append(rows[:bound.max_rows_per_group])
    kept = []
    for chosen in by_unit.values():
        chosen.sort(key=lambda rows: rows[0][1])
        kept += [row for rows in chosen[:bound.max_groups] for row in rows]
    return kept


def _group(values: tuple) -> tuple:
    """A group key as DuckDB groups it: -0.0 with 0.0, every NaN together."""
    return tuple(0.0 if isinstance(v, float) and v == 0 else ("nan" if isinstance(v, float) and v != v else v)
                 for v in values)


def _accepted(sessions: dict[str, PrivateSession], sql: str, summary: Summary) -> PreparedQuery | None:
    """The query prepared on the base world, counted as a case (and as refused when it is)."""
    summary.cases += 1
    try:
        return sessions["base"].prepare(sql, epsilon=1.0)
    except Error:
        summary.refused += 1
        return None


def run_per_group_case(sessions: dict[str, PrivateSession], sql: str, summary: Summary) -> None:
    prepared = _accepted(sessions, sql, summary)
    if prepared is None:
        return
    mine = per_group_kept(prepared.plan)
    for world, session in sessions.items():
        summary.compared += 1
        try:
            got = sorted(map(repr, (_canonical_row(r) for r in session.engine.run(mine))))
            want = sorted(map(repr, (_canonical_row(r) for r in per_group_reference(session, prepared.plan))))
            session.measure(prepared)
        except Exception as exc:  # any failure after acceptance is a finding
            summary.mismatches.append(Mismatch(sql, world, f"{type(exc).__name__}: {exc}"))
            continue
        if got != want:
            summary.mismatches.append(Mismatch(sql, world, f"kept {len(got)} rows, reference {len(want)}: "
                                                           f"{sorted(set(got) ^ set(want))[:3]}"))


def _canonical_row(row: tuple) -> tuple:
    return (*row[:2], *_group(tuple(row[2:])))


def fuzz_per_group(sessions: dict[str, PrivateSession], n: int, seed: int) -> Summary:
    grammar = CapGrammar(random.Random(seed))
    summary = Summary()
    for _ in range(n):
        run_per_group_case(sessions, per_group_query(grammar), summary)
    return summary


CHANGED = {"one unit removed": REMOVED, **{theme: 3 for theme in ADVERSARIAL_ROWS}}  # the unit each world changes


def kept_content(session: PrivateSession, mine: str) -> dict[int, list[str]]:
    """Per unit, the kept rows as text (every declared column, a zero's sign included): what a query can read."""
    columns = ", ".join(f"CAST(r.{c.name} AS VARCHAR)" for c in TABLE.columns)
    rows = session.engine.run(f"SELECT r.{names.UNIT}, concat_ws('|', {columns}) FROM __dp_f AS r JOIN ({mine}) AS k "
                              f"ON r.{names.UNIT} = k.{names.UNIT} AND r.{names.RANK} = k.{names.RANK}")
    kept: dict[int, list[str]] = {}
    for unit, text in rows:
        kept.setdefault(unit, []).append(text)
    return {unit: sorted(texts) for unit, texts in kept.items()}


def _first_output(plan: QueryPlan, measured: list[tuple[Any, ...]]) -> int:
    """The query's first output, COUNT(*), from the exact measurements by its recipe (a count of its own, or a
    pair's sums over hi - lo): the bounded truth, dpsql's release without noise."""
    return round(float(bounded_truth(plan, measured, seeded(0)).values[0, 0]))


def run_case(sessions: dict[str, PrivateSession], sql: str, summary: Summary) -> None:
    prepared = _accepted(sessions, sql, summary)
    if prepared is None:
        return
    plan = prepared.plan
    mine, reference = kept_rows(plan), reference_rows(plan)
    base = kept_content(sessions["base"], mine)
    for world, session in sessions.items():
        # The rows kept of every unit the world does not change are the base world's: a unit's choice of rows
        # depends on its own rows only (a rank that ties rows a query can tell apart fails this).
        if world != "base":
            other = kept_content(session, mine)
            moved = sorted(u for u in set(base) | set(other) if u != CHANGED[world] and base.get(u) != other.get(u))
            if moved:
                summary.mismatches.append(Mismatch(sql, world, f"units {moved[:5]} kept other rows than in the base"))
        summary.compared += 1
        try:
            got = sorted(session.engine.run(mine))
            want = sorted(session.engine.run(reference))
            exact = session.measure(prepared)
        except Exception as exc:  # any failure after acceptance is a finding
            summary.mismatches.append(Mismatch(sql, world, f"{type(exc).__name__}: {exc}"))
            continue
        if got != want:
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            summary.mismatches.append(Mismatch(sql, world, f"kept {len(got)} rows, reference {len(want)}; extra "
                                                           f"{extra[:4]}, missing {missing[:4]}"))
        elif sql.startswith("SELECT COUNT(*)") and (counted := _first_output(plan, exact)) != len(want):
            summary.mismatches.append(Mismatch(sql, world, f"COUNT(*) measured {counted}, reference {len(want)}"))
        elif sql.startswith("SELECT MEDIAN(x)"):  # the bucket query's rows: the kept rows with a value of x
            histogram = sum((exact[0][0] or {}).values())
            valued = session.engine.run(f"SELECT COUNT(*) FROM __dp_f AS r JOIN ({reference}) AS k ON "
                                        f"r.{names.UNIT} = k.{names.UNIT} AND r.{names.RANK} = k.{names.RANK} "
                                        "WHERE r.x IS NOT NULL")[0][0]
            if exact[0][1] != len(want) or histogram != valued:
                summary.mismatches.append(Mismatch(sql, world, f"COUNT(*) {exact[0][1]} and {histogram} rows in the "
                                                               f"histogram; reference {len(want)} and {valued}"))


def fuzz(sessions: dict[str, PrivateSession], n: int, seed: int) -> Summary:
    grammar = CapGrammar(random.Random(seed))
    summary = Summary()
    for _ in range(n):
        sql, _ = grammar.filtered_query()
        run_case(sessions, sql, summary)
    return summary


def main() -> None:
    args = options(__doc__, cases=600, seed=11)
    with scratch() as folder:
        sessions = open_worlds(folder, args.seed)
        try:
            print("\n".join(fuzz(sessions, args.cases, args.seed).lines()))
        finally:
            for session in sessions.values():
                session.close()
        sessions = open_per_group_worlds(folder, args.seed)
        try:
            print("per-group bounds (k = 2 groups, r = 1 row per group, m = 3):")
            print("\n".join(fuzz_per_group(sessions, args.cases // 2, args.seed).lines()))
        finally:
            for session in sessions.values():
                session.close()


if __name__ == "__main__":
    main()
