"""The differential fuzzer over joins and subqueries (issue 28): worlds that differ in one person, whose rows are
amplified.

differential.py runs each generated query on one table and on copies of it with one extra row. Here each world
holds three tables: differential.py's private table f (m = 2), a second private table f2 of the same unit (m = 2),
and a public table `look` whose join key g has few values, each on several rows (the most repeated, 'a', on
HOT_ROWS rows). The base world has 40 people. Each adversarial world adds ONE person (uid TARGET) with AMPLIFIED
rows in f and as many in f2, far more than m: everyday values, or differential.py's adversarial row of one theme
(NULLs, extreme values, infinities, long text, odd text) repeated, all on the public table's most repeated key
(NULL for the NULL theme: a NULL join key).

The generator covers the grammar the checker accepts over several tables: private x public INNER and LEFT joins,
private x private on the unit (f2 and self-joins), chains of up to `longest` joins, USING, per-unit subqueries
(alone, over a join, joined to a table), the unit semi-join (IN and correlated EXISTS), IN over the public table,
quantiles (MEDIAN, QUANTILE_CONT, MIN, MAX) and COUNT(DISTINCT), its filters, keys and arguments drawn from
differential.py's typed grammar over the joined columns; now and then the WHERE also keeps the target person only,
the attack of issue 28 (below the joins, only that person's rows multiply).

Per accepted query, in every world:
- no error after acceptance and no group merge, as in differential.py;
- the rows the engine produced, counted without a clock: DuckDB's profile (EXPLAIN ANALYZE) of the bounded query and
  of each quantile's bucket query, the rows of every operator summed (`operator_rows`). The adversarial world's
  count minus the base world's is the rows one person caused (`JoinSummary.rows_caused`): what a static per-person
  bound has to cover. Where the person's rows make DuckDB choose another plan (a join order), that is recorded too
  (`replanned`), and the difference can be negative;
- when timed (`python -m benchmarks.attacks.differential_joins`, reported only, never asserted): the median of five
  runs per world, the worlds taking turns, the adversarial world's over the base world's, beside the base world
  timed again (the noise floor); the worst few are timed again with more runs.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.attacks.differential import (
    ADVERSARIAL_ROWS,
    BUDGET,
    EPSILON,
    TABLE,
    Grammar,
    Summary,
    Worlds,
    answer,
    base_rows,
    ordinary_row,
    run_case,
)
from benchmarks.attacks.script import options, scratch
from benchmarks.support import Table, column, open_session, write_datasets
from dpsql.errors import Error
from dpsql.session import PreparedQuery, PrivateSession

SECOND = Table("f2", "uid", (column("uid", "int"), column("w", "int", 0.0, 50.0), column("y", "float", -5.0, 5.0),
                             column("t", "text"), column("h", "text", values=("a", "b"))), max_rows=2)
LOOKUP = Table("look", "", (column("g", "text"), column("n", "int"), column("r", "text")), public=True)
HOT_KEY, HOT_ROWS = "a", 6  # the public table's most repeated join key, and its rows: k = 6 for a join on g
LOOKUP_ROWS = [*((HOT_KEY, n, f"r{n % 3}") for n in range(HOT_ROWS)), *(("b", n, "r1") for n in range(3)),
               ("c", 7, "r2"), (None, 9, "r0")]
TARGET = 10_000  # the adversarial person, in every adversarial world
AMPLIFIED = 60  # rows of the adversarial person in f and in f2 (m = 2 in both)
THEMES = ("everyday", *ADVERSARIAL_ROWS)
TEXTS = ("p", "q r", "zz", "Beta", "")


def second_rows(r: random.Random, uid: int, key: str | None = None) -> tuple:
    """A row of f2 (uid, w, y, t, h) with everyday values; `key` for h if given."""
    return uid, r.randint(0, 50), round(r.uniform(-5, 5), 3), r.choice(TEXTS), key or r.choice("ab")


def person_rows(theme: str, seed: int) -> tuple[list[tuple], list[tuple]]:
    """The adversarial person's rows in f and in f2: AMPLIFIED each, on the public table's most repeated key."""
    r = random.Random(seed)
    if theme == "everyday":
        return ([(*ordinary_row(r, TARGET)[:-1], HOT_KEY) for _ in range(AMPLIFIED)],
                [second_rows(r, TARGET, HOT_KEY) for _ in range(AMPLIFIED)])
    row = ADVERSARIAL_ROWS[theme]
    key = None if row[-1] is None else HOT_KEY
    return [(TARGET, *row[1:-1], key)] * AMPLIFIED, [(TARGET, row[1], row[2], row[3], key)] * AMPLIFIED


def open_worlds(folder: Path, seed: int, themes: tuple[str, ...] = THEMES, people: int = 40) -> Worlds:
    """The base world of `people` people, and one world per theme with the adversarial person added."""
    r = random.Random(seed + 1)
    first = base_rows(seed, people)
    second = [second_rows(r, u) for u in range(people) for _ in range(r.randint(0, 2))]
    worlds = {"base": ([], [])} | {theme: person_rows(theme, seed) for theme in themes}
    sessions = {}
    for name, (mine, mine_too) in worlds.items():
        tables = {TABLE: [*first, *mine], SECOND: [*second, *mine_too], LOOKUP: LOOKUP_ROWS}
        # One thread, so that the rows counted are exact: on two, the join filters DuckDB pushes into scans while
        # the query runs let a few more or fewer rows through from one run to the next.
        sessions[name] = open_session(write_datasets(folder / name.replace(" ", "_"), tables, BUDGET), seed, "joins",
                                      threads=1)
    return Worlds(sessions)


# The grammar ------------------------------------------------------------------------------------------------

Columns = dict[str, tuple[str, ...]]


def f_columns(alias: str) -> Columns:
    return {"int": (f"{alias}.i",), "float": (f"{alias}.x",), "text": (f"{alias}.s", f"{alias}.g"),
            "bool": (f"{alias}.b",), "date": (f"{alias}.d",), "timestamp": (f"{alias}.ts",)}


def f2_columns(alias: str) -> Columns:
    return {"int": (f"{alias}.w",), "float": (f"{alias}.y",), "text": (f"{alias}.t", f"{alias}.h")}


def look_columns(alias: str) -> Columns:
    return {"int": (f"{alias}.n",), "text": (f"{alias}.r", f"{alias}.g")}


def merged(*parts: Columns) -> Columns:
    out: dict[str, tuple[str, ...]] = {}
    for part in parts:
        for kind, names in part.items():
            out[kind] = (*out.get(kind, ()), *names)
    return out


@dataclass(frozen=True)
class Source:
    """A FROM clause, the columns it offers, its unit column and text columns to join the public table or group
    on, and its shape (for the report)."""

    sql: str
    columns: Columns
    unit: str
    keys: tuple[str, ...]
    shape: str


@dataclass(frozen=True)
class Generated:
    sql: str
    shape: str


class JoinGrammar:
    """Random queries over f, f2 and look of the forms the checker accepts over joins and subqueries."""

    def __init__(self, rng: random.Random, longest: int = 3) -> None:
        self.r = rng
        self.expressions = Grammar(rng)
        self.longest = longest  # the most joins in a chain

    def pick(self, options):
        return options[self.r.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def of(self, columns: Columns, kind: str) -> str:
        return self.expressions.over(columns).of(kind).sql

    def number(self, columns: Columns) -> str:
        """A numeric aggregate argument: mostly a bounded column (plain, or where a generated condition holds),
        sometimes a generated expression (which the checker bounds, or refuses)."""
        plain = self.pick((*columns.get("float", ()), *columns.get("int", ())))
        choice = self.r.randrange(4)
        if choice <= 1:
            return plain
        if choice == 2:
            return f"CASE WHEN {self.of(columns, 'bool')} THEN {plain} END"
        return self.of(columns, self.pick(("int", "float")))

    # FROM -----------------------------------------------------------------------------------------------------
    def chain(self, joins: int) -> Source:
        """f, then `joins` tables, each joined to an earlier one: look on a text key (INNER or LEFT, ON or USING),
        f2 or f again on the unit (INNER)."""
        sql, columns, keys, units, kinds = "f", f_columns("f"), ["f.g"], ["f.uid"], []
        for j in range(joins):
            choice = self.r.randrange(3)
            if choice == 0:
                alias, on = f"l{j}", self.pick(keys)
                how = "LEFT JOIN" if self.chance(0.3) else "JOIN"
                if j == 0 and self.chance(0.3):  # USING: f's g and look's g are one column
                    sql += f" {how} look USING (g)"
                    columns = merged(columns, {"int": ("look.n",), "text": ("look.r",)})
                    kinds.append("public")
                    continue
                sql += f" {how} look AS {alias} ON {alias}.g = {on}"
                columns, keys = merged(columns, look_columns(alias)), [*keys, f"{alias}.g"]
                kinds.append("public")
            else:
                table = "f2" if choice == 1 else "f"
                alias = f"{'b' if choice == 1 else 'a'}{j}"
                if j == 0 and choice == 1 and self.chance(0.3):
                    sql += " JOIN f2 USING (uid)"
                    columns, keys = merged(columns, f2_columns("f2")), [*keys, "f2.h"]
                else:
                    sql += f" JOIN {table} AS {alias} ON {alias}.uid = {self.pick(units)}"
                    units.append(f"{alias}.uid")
                    own = f2_columns(alias) if choice == 1 else f_columns(alias)
                    columns = merged(columns, own)
                    keys.append(f"{alias}.h" if choice == 1 else f"{alias}.g")
                kinds.append("private")
        shape = "f" if not kinds else " x ".join(["f", *kinds])
        return Source(sql, columns, "f.uid", tuple(keys), shape)

    def per_unit(self) -> Source:
        """A per-unit subquery over f or a short join, alone or joined to f2, f or look."""
        inner = self.chain(self.r.randint(0, 1))
        v, w = self.number(inner.columns), self.number(inner.columns)
        where = f" WHERE {self.of(inner.columns, 'bool')}" if self.chance(0.5) else ""
        having = f" HAVING COUNT(*) > {self.pick(('0', '1'))}" if self.chance(0.2) else ""
        sql = (f"(SELECT f.uid, COUNT(*) AS n, SUM({v}) AS s, AVG({w}) AS a, MAX({w}) AS mx, COUNT({w}) AS c "
               f"FROM {inner.sql}{where} GROUP BY f.uid{having}) AS p")
        columns: Columns = {"int": ("p.n", "p.s", "p.c"), "float": ("p.a", "p.mx")}
        shape = f"per-unit over {inner.shape}"
        choice = self.r.randrange(4)
        if choice == 0:
            return Source(sql, columns, "p.uid", (), shape)
        if choice == 1:
            return Source(f"{sql} JOIN f2 ON f2.uid = p.uid", merged(columns, f2_columns("f2")), "p.uid", ("f2.h",),
                          f"{shape}, x f2")
        if choice == 2:
            return Source(f"{sql} JOIN f ON f.uid = p.uid", merged(columns, f_columns("f")), "p.uid", ("f.g",),
                          f"{shape}, x f")
        return Source(f"{sql} JOIN look AS l ON l.n = p.n", merged(columns, look_columns("l")), "p.uid", ("l.r",),
                      f"{shape}, x look")

    def source(self) -> Source:
        return self.per_unit() if self.chance(0.25) else self.chain(self.r.randint(0, self.longest))

    # WHERE ----------------------------------------------------------------------------------------------------
    def semi_join(self, source: Source) -> tuple[str, str]:
        """A subquery condition the normaliser rewrites (on f's unit or key), and its shape; ("", "") for none."""
        if source.unit != "f.uid" or self.chance(0.4):
            return "", ""
        choice = self.r.randrange(8)
        if choice >= 4:  # issue 36: anywhere in WHERE, correlated beyond the key (analysis/semijoins.py)
            return self.general_semi_join(choice - 4)
        if choice == 0:
            return f"f.uid IN (SELECT uid FROM f2 WHERE {self.of(f2_columns('f2'), 'bool')})", "IN f2"
        if choice == 1:
            inner = self.of(f2_columns("e"), "bool")
            return f"EXISTS (SELECT 1 FROM f2 AS e WHERE e.uid = f.uid AND {inner})", "EXISTS f2"
        if choice == 2:
            return f"f.g IN (SELECT g FROM look WHERE {self.of(look_columns('look'), 'bool')})", "IN look"
        return f"f.uid IN (SELECT uid FROM f AS z WHERE {self.of(f_columns('z'), 'bool')})", "IN f"

    def general_semi_join(self, choice: int) -> tuple[str, str]:
        """A semi- or anti-join the checker answers as a semi-join flag: NOT EXISTS with a condition on both rows, NOT
        IN on the unit, EXISTS over f itself under OR, NOT EXISTS over the public table."""
        if choice == 0:
            both = self.of(merged(f2_columns("e"), f_columns("f")), "bool")
            return f"NOT EXISTS (SELECT 1 FROM f2 AS e WHERE e.uid = f.uid AND {both})", "NOT EXISTS f2"
        if choice == 1:
            return f"f.uid NOT IN (SELECT uid FROM f2 WHERE {self.of(f2_columns('f2'), 'bool')})", "NOT IN f2"
        if choice == 2:
            both = self.of(merged(f_columns("z"), f_columns("f")), "bool")
            return (f"({self.of(f_columns('f'), 'bool')} OR EXISTS (SELECT 1 FROM f AS z WHERE z.uid = f.uid AND "
                    f"{both}))", "OR EXISTS f")
        both = self.of(merged(look_columns("q"), f_columns("f")), "bool")
        return f"NOT EXISTS (SELECT 1 FROM look AS q WHERE q.g = f.g AND {both})", "NOT EXISTS look"

    def where(self, source: Source) -> tuple[str, list[str]]:
        conditions, notes = [], []
        if self.chance(0.5):
            conditions.append(self.of(source.columns, "bool"))
        if self.chance(0.25):  # the attack's filter: only the target's rows reach the joins
            conditions.append(f"{source.unit} = {TARGET}")
            notes.append("one person")
        condition, shape = self.semi_join(source)
        if condition:
            conditions.append(condition)
            notes.append(shape)
        return (f" WHERE {' AND '.join(conditions)}" if conditions else ""), notes

    # SELECT ---------------------------------------------------------------------------------------------------
    def aggregate(self, source: Source) -> tuple[str, str]:
        """An aggregate and its class ("count", "sum", "quantile", "distinct")."""
        choice = self.r.randrange(6)
        number = self.number(source.columns)
        if choice == 0:
            return "COUNT(*)", "count"
        if choice == 1:
            return f"COUNT({self.of(source.columns, self.pick(('int', 'text', 'bool', 'date')))})", "count"
        if choice == 2:
            return f"{self.pick(('SUM', 'AVG'))}({number})", "sum"
        if choice == 3:
            return f"{self.pick(('MEDIAN', 'MIN', 'MAX'))}({number})", "quantile"
        if choice == 4:
            return f"QUANTILE_CONT({number}, {self.pick(('0.25', '0.9'))})", "quantile"
        kind = self.pick(("int", "text", "bool", "date"))
        return f"COUNT(DISTINCT {self.of(source.columns, kind)})", "distinct"

    def query(self) -> Generated:
        source = self.source()
        where, notes = self.where(source)
        aggregates = [self.aggregate(source) for _ in range(self.r.randint(1, 3))]
        items = [text for text, _ in aggregates]
        group = ""
        if self.chance(0.4):
            key = self.pick(source.keys) if source.keys and self.chance(0.6) else (
                self.of(source.columns, self.pick(("int", "text", "bool"))))
            items.insert(0, f"{key} AS k")
            group = " GROUP BY k"
        kinds = sorted({kind for _, kind in aggregates} - {"count", "sum"})
        shape = "; ".join([source.shape, *notes, *kinds])
        return Generated(f"SELECT {', '.join(items)} FROM {source.sql}{where}{group}", shape)


# The work count ---------------------------------------------------------------------------------------------

def operator_rows(session: PrivateSession, prepared: PreparedQuery) -> int:
    """The rows every operator produced, summed over the bounded query and each quantile's bucket query: DuckDB's
    profile of them on this world's data (deterministic: the same data gives the same count)."""
    return sum(_produced(profile) for profile in _profiles(session, prepared))


@dataclass
class PlanRecorder:
    """operator_rows, as run_case's work count, keeping the plan each world ran the query last counted with: its
    operators with their depths, in order (a join order that differs shows)."""

    plans: dict[int, tuple[tuple[int, str], ...]] = field(default_factory=dict)  # id(session) -> plan

    def __call__(self, session: PrivateSession, prepared: PreparedQuery) -> int:
        profiles = _profiles(session, prepared)
        self.plans[id(session)] = tuple(step for profile in profiles for step in _shape(profile))
        return sum(_produced(profile) for profile in profiles)


def _profiles(session: PrivateSession, prepared: PreparedQuery) -> list[Any]:
    statements = [prepared.bounded.sql, *(sql for _, sql in prepared.bounded.buckets)]
    return [json.loads(session.engine.analyzed_plan(sql)) for sql in statements]


def _produced(profile: Any, scans: bool = True) -> int:
    """The rows every operator produced; without the scans' (`scans=False`): a scan outputs every row its own
    filters keep, beyond a person's cap too (the table's size, not the query's work on a person)."""
    return sum(int(node.get("operator_cardinality", node.get("intermediate_rows", 0)))
               for _, node in _operators(profile) if scans or not _scan(node))


def _scan(node: dict) -> bool:
    return "SCAN" in str(node.get("operator_name", node.get("name", ""))).upper()


def beyond_the_scans(session: PrivateSession, prepared: PreparedQuery) -> tuple[int, int]:
    """(rows the operators above the scans produced, how many such operators), over the bounded query and each
    quantile's bucket query: each can hold at most the most rows one person has at any stage of the query
    (analysis/person_work.py's terms) beyond the others' rows."""
    profiles = _profiles(session, prepared)
    operators = sum(1 for profile in profiles for _, node in _operators(profile) if not _scan(node))
    return sum(_produced(profile, scans=False) for profile in profiles), operators


def _shape(profile: Any) -> Iterator[tuple[int, str]]:
    return ((depth, str(node.get("name"))) for depth, node in _operators(profile))


def _operators(profile: Any, depth: int = 0) -> Iterator[tuple[int, dict]]:
    nodes = profile if isinstance(profile, list) else profile.get("operator", profile.get("children", []))
    for node in nodes if isinstance(nodes, list) else [nodes]:
        yield depth, node
        yield from _operators(node.get("children", []), depth + 1)


# Running ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Caused:
    rows: int  # the rows the person caused: the adversarial world's operator rows minus the base world's
    theme: str
    shape: str
    sql: str
    # Whether DuckDB ran another plan than in the base world: `rows` then also counts the plans' difference (an
    # extra projection of every row, another join order), in either direction.
    replanned: bool


@dataclass
class JoinSummary(Summary):
    shapes: dict[str, str] = field(default_factory=dict)  # accepted query -> its shape
    noise: list[float] = field(default_factory=list)  # timed: per query, the base world timed again over the base
    # (theme, query) where DuckDB ran another plan (join order, operators) than in the base world: the person's rows
    # changed its estimates. The rows caused can then be negative.
    replanned: list[tuple[str, str]] = field(default_factory=list)

    def rows_caused(self) -> list[Caused]:
        """Per accepted query and adversarial world, the rows one person caused, and the query: what the static
        per-person bound of issue 28 must cover."""
        replanned = set(self.replanned)
        return [Caused(int(added), theme, self.shapes[sql], sql, (theme, sql) in replanned)
                for added, theme, sql in self.work_added]

    def worst_per_shape(self) -> list[Caused]:
        worst: dict[str, Caused] = {}
        for caused in self.rows_caused():
            if caused.shape not in worst or caused.rows > worst[caused.shape].rows:
                worst[caused.shape] = caused
        return sorted(worst.values(), key=lambda caused: -caused.rows)

    def lines(self, shapes: int = 12) -> list[str]:
        out = super().lines()
        out.append(f"another plan than the base world's (the person's rows changed DuckDB's choices): "
                   f"{len(self.replanned)} of {len(self.work_added)} (query, person) pairs, in "
                   f"{len({sql for _, sql in self.replanned})} queries")
        out += [f"  [{theme}] {sql}" for theme, sql in self.replanned[:3]]
        out.append(f"rows one person caused (operator rows, adversarial world minus base), worst of "
                   f"{len(self.worst_per_shape())} query shapes:")
        out += [f"  {c.rows:>8}{'*' if c.replanned else ' '}[{c.theme}] ({c.shape}) {c.sql}"
                for c in self.worst_per_shape()[:shapes]]
        out.append("  (* another plan than the base world's: the figure includes the plans' difference)")
        return out


def fuzz(worlds: Worlds, n: int, seed: int, timed: bool = False, longest: int = 3) -> JoinSummary:
    """`timed`: also time each accepted query in every world (wall clock: for the script only)."""
    grammar = JoinGrammar(random.Random(seed), longest)
    summary = JoinSummary(work="operator rows")
    recorder = PlanRecorder()
    for _ in range(n):
        generated = grammar.query()
        recorder.plans.clear()
        prepared = run_case(worlds, generated.sql, recorder, summary, timed=False)
        if prepared is None:
            continue
        summary.shapes[generated.sql] = generated.shape
        base = recorder.plans.get(id(worlds.sessions["base"]))
        summary.replanned += [(theme, generated.sql) for theme, session in worlds.sessions.items()
                              if id(session) in recorder.plans and recorder.plans[id(session)] != base]
        if timed and not summary.findings:
            seconds = medians(interleaved_times(worlds, prepared))
            summary.time_ratios += [(seconds[theme] / seconds["base"], theme, generated.sql)
                                    for theme in worlds.sessions if theme != "base"]
            summary.noise.append(seconds[AGAIN] / seconds["base"])
    return summary


AGAIN = "base again"


def interleaved_times(worlds: Worlds, prepared: PreparedQuery, repeats: int = 5) -> dict[str, list[float]]:
    """Seconds of the stages after the charge in each world, `repeats` runs after an untimed one. The worlds take
    turns within each round, so that a load on the machine that comes and goes weighs on all of them alike; the
    base world runs first and last in each round, and the last (AGAIN) over the first is the noise a ratio has
    without any person."""
    turns = [*worlds.sessions.items(), (AGAIN, worlds.sessions["base"])]  # the base first and last
    times: dict[str, list[float]] = {name: [] for name, _ in turns}
    for _, session in turns:
        answer(session, prepared)
    for _ in range(repeats):
        for name, session in turns:
            start = time.perf_counter()
            answer(session, prepared)
            times[name].append(time.perf_counter() - start)
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in times.items()}


def confirmed(worlds: Worlds, summary: JoinSummary, n: int = 5, repeats: int = 15) -> list[tuple[float, str, str]]:
    """The `n` worst slowdowns timed again, each in its two worlds alone with `repeats` rounds: of many ratios
    measured a few times each on a loaded machine, the largest is the noise's as much as the person's."""
    again = []
    for _, theme, sql in summary.worst(summary.time_ratios, n):
        pair = Worlds({"base": worlds.sessions["base"], theme: worlds.sessions[theme]})
        seconds = medians(interleaved_times(pair, worlds.sessions["base"].prepare(sql, epsilon=EPSILON), repeats))
        again.append((seconds[theme] / seconds["base"], theme, sql))
    return sorted(again, reverse=True)


def attack_query(kind: str, joins: int, costly: bool = True) -> str:
    """Issue 28's shape: a chain of `joins` joins, of the public table on its key ("public") or of f on the unit
    ("private"), filtered to the target person, with a LIKE over f's text on every joined row (or, not `costly`, a
    bare COUNT(*), which the per-person work bound admits at a longer chain)."""
    table, key, alias = ("look", "g", "l") if kind == "public" else ("f", "uid", "a")
    chain = " ".join(f"JOIN {table} AS {alias}{i} ON {alias}{i}.{key} = {'f' if i == 0 else f'{alias}{i - 1}'}.{key}"
                     for i in range(joins))
    last = f"{alias}{joins - 1}.{'r' if kind == 'public' else 'g'}"
    counted = f"COUNT(CASE WHEN (f.s || {last}) LIKE '%zz%' THEN 1 END)" if costly else "COUNT(*)"
    return f"SELECT {counted} FROM f {chain} WHERE f.uid = {TARGET}"


def longest_attack(session: PrivateSession, kind: str) -> PreparedQuery | None:
    """The attack of `kind` with the most joins the checker accepts (its fan-out limit and the per-person work
    bound decide), or None when even one join is refused."""
    try:
        joins, prepared = 1, session.prepare(attack_query(kind, 1), epsilon=EPSILON)
    except Error:
        return None
    while True:
        try:
            prepared = session.prepare(attack_query(kind, joins + 1), epsilon=EPSILON)
        except Error:
            return prepared
        joins += 1


def attack_lines(worlds: Worlds, repeats: int = 15) -> list[str]:
    """The attack at the fan-out limit, public and private: its rows and time in each world, by the median run and
    by the fastest (the least disturbed by the machine's other work)."""
    out = []
    for kind in ("public", "private"):
        prepared = longest_attack(worlds.sessions["base"], kind)
        if prepared is None:
            out.append(f"  {kind}: refused already at one join (the per-person work bound)")
            continue
        times = interleaved_times(worlds, prepared, repeats)
        middle, fastest = medians(times), {name: min(values) for name, values in times.items()}
        base = operator_rows(worlds.sessions["base"], prepared)
        out.append(f"  {prepared.plan.max_rows} rows per person; base world {1000 * middle['base']:.0f} ms (median), "
                   f"{1000 * fastest['base']:.0f} ms (fastest): {prepared.canonical}")
        for theme, session in [*worlds.sessions.items(), (AGAIN, worlds.sessions["base"])][1:]:
            caused = operator_rows(session, prepared) - base
            out.append(f"    [{theme}] {caused} rows caused; time {middle[theme] / middle['base']:.2f}x the base "
                       f"world's (median), {fastest[theme] / fastest['base']:.2f}x (fastest)")
    return out


def main() -> None:
    args = options(__doc__, cases=600, timed_cases=120, seed=5, longest=3, people=40)
    with scratch() as folder:
        worlds = open_worlds(folder, args.seed, people=args.people)
        try:
            summary = fuzz(worlds, args.cases, args.seed, longest=args.longest)
            print("differential fuzz over joins and subqueries (errors, merges, rows one person caused):")
            print("\n".join(summary.lines()))
            timed = fuzz(worlds, args.timed_cases, args.seed + 1, timed=True, longest=args.longest)
            ratios = [r for r, _, _ in timed.time_ratios]
            print(f"timed (wall clock, median of 5 interleaved runs per world, reported only): {timed.accepted} "
                  f"accepted; adversarial / base: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
                  f"the base world again / base (noise): median {statistics.median(timed.noise):.2f}, max "
                  f"{max(timed.noise):.2f}; worst:")
            print("\n".join(f"  {r:.2f}x [{theme}] ({timed.shapes[sql]}) {sql}"
                            for r, theme, sql in timed.worst(timed.time_ratios, 5)))
            print("the same five timed again (15 interleaved runs, the two worlds alone):")
            print("\n".join(f"  {r:.2f}x [{theme}] {sql}" for r, theme, sql in confirmed(worlds, timed)))
            print("issue 28's attack at the checker's fan-out limit (the longest chain it accepts):")
            print("\n".join(attack_lines(worlds)))
        finally:
            worlds.close()


if __name__ == "__main__":
    main()

