"""Timing by one person's rows (issue 28): the work one person's rows cause, read from the clock, one bit a query.

The per-row cost model (dpsql/analysis/typecheck.py, measured by row_cost.py) bounds what one *row* can cost; this
script attacks what one *person* can cost, through every path that multiplies or re-reads a person's rows: private
self-joins on the unit, public joins on a low-cardinality key, per-unit subqueries, the IN / EXISTS semi-join
rewrites, quantile bucket queries, COUNT(DISTINCT), the filtered cap on a person with more than m rows, many
costly aggregates in one query, and the time limit turned into an error oracle. Beyond the issue's list: the memory
limit as an oracle, a public key whose values have different numbers of rows (the target's own key picks its
fan-out), a person's rows beyond the cap (how many it has), and GROUP BY candidate groups that one person's joined
rows create, each of which dpsql's release handles in Python.

The worlds. Four private tables with one unit (`person`), m = 5 rows each: `people` and `visits` (5 rows per
person), `diary` (1 to 5 rows per person, but the target has HEAVY) and `log` (1 to 5, but the target has HEAVY in
world 1 and 5 in world 0); a public table `codes` whose key `g` has 3 rows per value (2 values), and a public table
`skew` whose key has SKEW rows for the value 1 and one for 0. Every text value is LONG characters, declared
max_length LONG; the target's (and the two known people's, below) are 'a' but for their last character, the worst
case of the costly expression, which the forms guard so that only their rows reach it. Each private row carries
three 0/1 flags: `s` (the secret: the target's is 1 in world 1, 0 in world 0), `kt` and `kf` (the target's are 1
and 0 in both worlds; the attacker knows them). The target's `g` is its secret too (the skew form reads it through
a join key); KNOWN_KEY are two people whose `g` (and `log` rows) the attacker knows. Everyone else is the same in
both worlds.

The game (house style, as timing.py, with the attacker calibrating on the live system): each form is a query with
one condition slot `{c}`. The attacker calibrates on two conditions whose truth it knows (the target's `kt = 1`,
true, and `kf = 1`, false, or the known people for the forms whose secret is not a flag): the threshold is the
geometric mean of the medians of the last CALIBRATION runs of each, refreshed every RECALIBRATE rounds so that it
follows the machine's load. A fair coin picks the world each round, and the attacker sends the form with the
secret condition and guesses "1" when the query took longer than the threshold (for an error-oracle form: when it
failed, without a clock). Rounds run in the coin's order, so that a drift of the load falls on both worlds alike.
Any epsilon-DP release lets the attacker win with probability at most e^eps / (1 + e^eps) (0.5000003 at eps
1e-6); a win rate whose 95% lower bound lies above that is a leak. A refused form reports its refusal (after the
fix of issue 28, one acceptable outcome; the other is a win rate at chance).

Run: `python -m benchmarks.attacks.person_timing [--forms NAME ...] [--rounds 48] [--epsilon 1e-6] [--markdown
FILE]`; `--copies 3` and the other Sizes fields set how far each form multiplies the target's rows. `--reach 1`
also reports the deepest chain of each kind the checker accepts (prepared only: no charge, nothing read; about
three minutes), `--python-share 10` where the candidate-groups form's time goes, up to 10 joins, `--worst 10` the
deepest chains once each under a 10 s time limit. `--bound 1` plays instead each path as large as the per-person
work bound (dpsql/analysis/person_work.py) admits: its costly part a LIKE with the longest pattern the checker
accepts. Timing is measured here only, never in a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import Proportion, success_bound
from benchmarks.support import open_session, toml_value, write_csv, write_policy
from dpsql.errors import ExecutionFailed, ProgrammingError, QueryRejected
from dpsql.release.cells import release
from dpsql.session import PrivateSession

TARGET = 0
M = 5  # max_rows_per_unit of every private table
LONG = 1000  # characters of every text value, and its declared max_length (the default)
HEAVY = 500  # the target's rows in `diary`
SKEW = 30  # rows of the public table `skew` that share the key value 1 (the value 0 has one row)
CALIBRATION = 5  # runs of each known condition the threshold is the median of
RECALIBRATE = 4  # rounds between two new runs of each
KNOWN_KEY = (2, 1)  # people whose `g` is 0 and 1 (and whose `log` rows are M and HEAVY) in both worlds
PRIVATE_COLUMNS = {"pid": {"type": "int"}, "s": {"type": "int", "lower": 0, "upper": 1},
                   "kt": {"type": "int", "lower": 0, "upper": 1}, "kf": {"type": "int", "lower": 0, "upper": 1},
                   "g": {"type": "int", "lower": 0, "upper": 1}, "x": {"type": "int", "lower": 0, "upper": 100},
                   "t": {"type": "text", "max_length": LONG}}

# Costly row expressions the checker admits today (cost bound under its one million units per expression): a
# LIKE with '_' over text grown nine-fold backtracks at every position. Several patterns, so that aggregates and
# quantiles of them are distinct expressions (the rewrite projects an aggregated expression written twice once).
def costly(alias: str, variant: int = 0) -> str:
    return f"replace({alias}.t, 'a', 'aaaaaaaaa') LIKE '%a_a%{'a' * (80 - variant)}b'"


def hit(alias: str, variant: int = 0) -> str:
    """A bounded 0/1 aggregate argument that runs the costly expression on every row it reaches."""
    return f"CASE WHEN {costly(alias, variant)} THEN 1 ELSE 0 END"


@dataclass(frozen=True)
class Conditions:
    """The condition slot's three fillings: the secret, and two whose truth for the target the attacker knows."""
    secret: str
    true: str
    false: str


def flags(alias: str) -> Conditions:
    return Conditions(*(f"{alias}.pid = {TARGET} AND {alias}.{flag} = 1" for flag in ("s", "kt", "kf")))


TARGET_FLAGS = flags("p")


@dataclass(frozen=True)
class Form:
    name: str
    path: str  # what multiplies or re-reads the target's rows
    sql: str  # with `{c}` for the condition
    conditions: Conditions = TARGET_FLAGS
    engine: dict[str, float | str] = dataclasses.field(default_factory=dict)  # the policy's `[engine]` settings
    error_oracle: bool = False  # the attacker reads failures, not the clock


def self_join_chain(copies: int, table: str = "people") -> str:
    joins = "".join(f" JOIN {table} p{i} ON p{i}.pid = p{i - 1}.pid" for i in range(1, copies))
    return f"FROM {table} p0{joins}"


def public_chain(joins: int, join: str = "JOIN") -> str:
    chain = "".join(f" {join} codes c{i} ON c{i}.g = {'p' if i == 1 else f'c{i - 1}'}.g"
                    for i in range(1, joins + 1))
    return f"FROM people p{chain}"


def quantiles(count: int) -> str:
    return ", ".join(f"QUANTILE_CONT(CASE WHEN {costly('p', i)} THEN p.x ELSE 0 END, {(i + 1) / (count + 1):.3f})"
                     for i in range(count))


def sums(count: int) -> str:
    return ", ".join(f"SUM({hit('p', i % 80)})" for i in range(count))


def group_key(joins: int) -> str:
    """A key that differs on every joined row of one person: each public copy's row number at its own digit."""
    return " + ".join(f"c{i}.r * {101 * 3 ** (i - 1)}" for i in range(1, joins + 1)) + " + p.x"


@dataclass(frozen=True)
class Sizes:
    """How far each form multiplies the target's rows: small enough that a true case takes well under a second on
    today's code (the deepest chains accepted today are reported by `reach`)."""
    copies: int = 3  # private self-join copies: M^copies rows
    public_joins: int = 3  # M * 3^public_joins rows
    aggregates: int = 40
    quantiles: int = 12
    group_joins: int = 7  # M * 3^group_joins candidate groups
    semi_joins: int = 4  # IN / EXISTS subqueries in one query
    oracle_copies: int = 3
    time_limit: float = 0.1
    memory_copies: int = 4
    memory_limit: str = "32MB"


def forms(sizes: Sizes = Sizes()) -> list[Form]:
    """The attack forms, one per path of issue 28, then the ones found beyond its list."""
    copies = sizes.copies
    # The semi-joins carry the secret condition inside their subqueries, guarding a costly condition true of the
    # target's texts (they lack a 'b'), so that the target qualifies: each subquery's rows, and then the outer ones,
    # do the costly work only when the secret holds. In a CASE: the rewrite puts the inner WHERE in one TRY, where
    # DuckDB evaluates every conjunct on every row.
    def semi(condition: Conditions, build: Callable[[int, str], str]) -> Conditions:
        return Conditions(*(" AND ".join(build(i, f"CASE WHEN {c} THEN NOT {costly('v', i + 1)} ELSE false END")
                                         for i in range(sizes.semi_joins))
                            for c in (condition.secret, condition.true, condition.false)))

    within = flags("v")
    in_list = semi(within, lambda i, c: f"p.pid IN (SELECT v.pid FROM visits v WHERE {c})")
    exists = semi(within, lambda i, c: f"EXISTS (SELECT 1 FROM visits v WHERE v.pid = p.pid AND {c})")
    return [
        Form("self-join chain", f"private self-join on the unit, {copies} copies: {M}^{copies} rows of the target",
             f"SELECT SUM({hit('p0')}) {self_join_chain(copies)} WHERE {{c}}", flags("p0")),
        Form("public chain", f"{sizes.public_joins} joins of a public table on a 2-valued key (3 rows a value): "
             f"{M}*3^{sizes.public_joins} rows",
             f"SELECT SUM({hit('p')}) {public_chain(sizes.public_joins)} WHERE {{c}}"),
        Form("per-unit subquery", f"per-unit subquery over a {copies}-copy self-join, costly inner SUM",
             f"SELECT COUNT(*), SUM(h) FROM (SELECT p0.pid, COUNT(*) AS n, SUM({hit('p0')}) AS h "
             f"{self_join_chain(copies)} WHERE {{c}} GROUP BY p0.pid) AS u", flags("p0")),
        Form("IN semi-join", f"{sizes.semi_joins} x pid IN (SELECT ... WHERE secret AND costly): the inner rows, "
             "then the outer ones", f"SELECT SUM({hit('p')}) FROM people p WHERE {{c}}", in_list),
        Form("EXISTS semi-join", f"{sizes.semi_joins} x EXISTS (... WHERE secret AND costly), rewritten to IN",
             f"SELECT SUM({hit('p')}) FROM people p WHERE {{c}}", exists),
        Form("quantile buckets", f"{sizes.quantiles} quantiles of costly arguments: a bucket query each",
             f"SELECT {quantiles(sizes.quantiles)} FROM people p WHERE {{c}}"),
        Form("COUNT(DISTINCT)", f"COUNT(DISTINCT) of a long text (99 copies of t) over a {copies}-copy self-join",
             f"SELECT COUNT(DISTINCT concat({', '.join(['p0.t'] * 99)})) {self_join_chain(copies)} WHERE {{c}}",
             flags("p0")),
        # The cap's later parts hold the filter in a CASE branch, where DuckDB evaluates every conjunct of it (no
        # short cut): the secret guards the costly part in a CASE of its own, evaluated only where it holds.
        Form("filtered cap, heavy person", f"a costly filter on a person with {HEAVY} rows (m = {M}): the cap's "
             "later parts run it on every row",
             f"SELECT COUNT(*) FROM diary d WHERE CASE WHEN {{c}} THEN {costly('d')} ELSE false END", flags("d")),
        Form("filtered cap, unguarded", "the heavy person's filter as `secret AND costly`: in the cap's later "
             "parts DuckDB evaluates every conjunct on every row, so it runs whatever the secret (both worlds slow)",
             f"SELECT COUNT(*) FROM diary d WHERE {{c}} AND {costly('d')}", flags("d")),
        Form("single table, m rows", f"the same filter on the target's {M} rows of `people`: what the per-row "
             "bound allows",
             f"SELECT COUNT(*) FROM people p WHERE CASE WHEN {{c}} THEN {costly('p')} ELSE false END"),
        Form("many aggregates", f"{sizes.aggregates} aggregates, each near the per-row cost bound, on {M} rows",
             f"SELECT {sums(sizes.aggregates)} FROM people p WHERE {{c}}"),
        Form("error oracle", f"a {sizes.oracle_copies}-copy self-join chain past a {sizes.time_limit:g} s time "
             "limit: fails when true, answers when false",
             f"SELECT SUM({hit('p0')}) {self_join_chain(sizes.oracle_copies)} WHERE {{c}}", flags("p0"),
             engine={"time_limit_seconds": sizes.time_limit}, error_oracle=True),
        Form("memory oracle", f"COUNT(DISTINCT) of 99 copies of t over a {sizes.memory_copies}-copy self-join, "
             f"memory_limit {sizes.memory_limit}: fails when true, answers when false",
             f"SELECT COUNT(DISTINCT concat({', '.join(['p0.t'] * 99)})) {self_join_chain(sizes.memory_copies)} "
             "WHERE {c}", flags("p0"), engine={"memory_limit": sizes.memory_limit}, error_oracle=True),
        # Beyond issue 28's list.
        Form("skewed public key", f"a public key with {SKEW} rows for one value and 1 for the other: the target's "
             "own key (the secret) picks the fan-out; no condition reads the secret",
             f"SELECT SUM({hit('p')}) FROM people p JOIN skew w ON w.g = p.g WHERE {{c}}",
             Conditions(f"p.pid = {TARGET}", f"p.pid = {KNOWN_KEY[1]}", f"p.pid = {KNOWN_KEY[0]}")),
        Form("LEFT public chain", f"{sizes.public_joins} LEFT joins of the public table: as the public chain",
             f"SELECT SUM({hit('p')}) {public_chain(sizes.public_joins, 'LEFT JOIN')} WHERE {{c}}"),
        Form("rows beyond the cap", f"the target has {HEAVY} rows of `log` (secret 1) or {M} (secret 0), m = {M}: "
             "a costly filter reached only by its rows runs on all of them",
             f"SELECT COUNT(*) FROM log l WHERE CASE WHEN {{c}} THEN {costly('l')} ELSE false END",
             Conditions(f"l.pid = {TARGET}", f"l.pid = {KNOWN_KEY[1]}", f"l.pid = {KNOWN_KEY[0]}")),
        Form("candidate groups", f"GROUP BY a key each of the target's {M}*3^{sizes.group_joins} joined rows makes "
             "distinct: every candidate group goes through dpsql's release in Python",
             f"SELECT COUNT(*) {public_chain(sizes.group_joins)} WHERE {{c}} GROUP BY {group_key(sizes.group_joins)}"),
        Form("SELECT DISTINCT keys", "the candidate groups' key released alone (SELECT DISTINCT): the same path",
             f"SELECT DISTINCT {group_key(sizes.group_joins)} AS k {public_chain(sizes.group_joins)} WHERE {{c}}"),
    ]


# -- at the bound: each path with its costly part as large as the checker admits -----------------------------------

def fitted(alias: str, length: int, variant: int = 0) -> str:
    """A LIKE over the text whose pattern has `length` characters: the checker counts it the text's length times
    that (typecheck.py), and with '_' in it DuckDB backtracks over the pattern at every position of the text (from 6
    characters; shorter ones are a plain search, '%aab'). Length 0 or 1: no LIKE, a comparison of an integer (the
    cheapest row expression), for the paths that multiply a person's rows so far that even '%b' is refused."""
    if length < 2:
        return f"{alias}.x >= {length - 1}"
    if length < 6:
        return f"{alias}.t LIKE '%{'a' * max(0, length - 2 - variant)}b{'c' * variant}'"
    return f"{alias}.t LIKE '%a_a%{'a' * max(0, length - 6 - variant)}b{'c' * variant}'"


def fitted_hit(alias: str, length: int, variant: int = 0) -> str:
    return f"CASE WHEN {fitted(alias, length, variant)} THEN 1 ELSE 0 END"


def at_the_bound(sizes: Sizes = Sizes()) -> list[tuple[Form, Callable[[int], Form]]]:
    """Each path of issue 28 as the per-person work bound admits it: a form whose costly part is a LIKE of a
    pattern length `n`, searched (`fit`) for the largest n the checker accepts. After the fix these are what an
    attacker can still send; the game says whether the clock still tells the target's bit."""
    def form(name: str, path: str, build: Callable[[int], str], conditions: Conditions = TARGET_FLAGS,
             engine: dict | None = None, oracle: bool = False) -> tuple[Form, Callable[[int], Form]]:
        def sized(n: int) -> Form:
            return Form(name, f"{path} (pattern of {n} characters: the largest admitted)", build(n), conditions,
                        engine or {}, oracle)
        return sized(0), sized

    return [
        form("self-join", f"one self-join on the unit: {M}^2 rows of the target",
             lambda n: f"SELECT SUM({fitted_hit('p0', n)}) {self_join_chain(2)} WHERE {{c}}", flags("p0")),
        form("public join", f"one public join on a 2-valued key: {M}*3 rows",
             lambda n: f"SELECT SUM({fitted_hit('p', n)}) {public_chain(1)} WHERE {{c}}"),
        form("public chain", f"two public joins: {M}*9 rows",
             lambda n: f"SELECT SUM({fitted_hit('p', n)}) {public_chain(2)} WHERE {{c}}"),
        form("per-unit subquery", "a per-unit subquery over a self-join, costly inner SUM",
             lambda n: f"SELECT COUNT(*), SUM(h) FROM (SELECT p0.pid, SUM({fitted_hit('p0', n)}) AS h "
                       f"{self_join_chain(2)} WHERE {{c}} GROUP BY p0.pid) AS u", flags("p0")),
        form("IN semi-join", "pid IN (SELECT ... WHERE secret AND costly)",
             lambda n: "SELECT COUNT(*) FROM people p WHERE p.pid IN (SELECT v.pid FROM visits v WHERE CASE WHEN "
                       f"{{c}} THEN {fitted('v', n)} ELSE false END)", flags("v")),
        form("quantile buckets", "two quantiles of costly arguments: a bucket query each",
             lambda n: "SELECT " + ", ".join(f"QUANTILE_CONT(CASE WHEN {fitted('p', n, i)} THEN p.x ELSE 0 END, "
                                             f"0.{3 + 4 * i})" for i in range(2)) + " FROM people p WHERE {c}"),
        form("COUNT(DISTINCT)", "COUNT(DISTINCT) of a costly expression",
             lambda n: f"SELECT COUNT(DISTINCT CASE WHEN {fitted('p', n)} THEN p.x END) FROM people p WHERE {{c}}"),
        form("filtered cap, heavy person", f"a costly filter on a person with {HEAVY} rows: the look-ahead",
             lambda n: f"SELECT COUNT(*) FROM diary d WHERE CASE WHEN {{c}} THEN {fitted('d', n)} ELSE false END",
             flags("d")),
        form("single table, m rows", f"a costly filter on the target's {M} rows",
             lambda n: f"SELECT COUNT(*) FROM people p WHERE CASE WHEN {{c}} THEN {fitted('p', n)} ELSE false END"),
        form("many aggregates", "eight costly aggregates",
             lambda n: "SELECT " + ", ".join(f"SUM({fitted_hit('p', n, i)})" for i in range(8))
                       + " FROM people p WHERE {c}"),
        form("skewed public key", f"the target's own key picks a fan-out of {SKEW} or 1",
             lambda n: f"SELECT SUM({fitted_hit('p', n)}) FROM people p JOIN skew w ON w.g = p.g WHERE {{c}}",
             Conditions(f"p.pid = {TARGET}", f"p.pid = {KNOWN_KEY[1]}", f"p.pid = {KNOWN_KEY[0]}")),
        form("rows beyond the cap", f"the target has {HEAVY} rows of `log` (secret 1) or {M}",
             lambda n: f"SELECT COUNT(*) FROM log l WHERE CASE WHEN {{c}} THEN {fitted('l', n)} ELSE false END",
             Conditions(f"l.pid = {TARGET}", f"l.pid = {KNOWN_KEY[1]}", f"l.pid = {KNOWN_KEY[0]}")),
        form("candidate groups", "GROUP BY a key each joined row of the target makes distinct (one public join)",
             lambda n: f"SELECT COUNT(*), SUM({fitted_hit('p', n)}) {public_chain(1)} WHERE {{c}} "
                       f"GROUP BY {group_key(1)}"),
        form("error oracle", f"the self-join at the bound under a {sizes.time_limit / 10:g} s time limit",
             lambda n: f"SELECT SUM({fitted_hit('p0', n)}) {self_join_chain(2)} WHERE {{c}}", flags("p0"),
             {"time_limit_seconds": sizes.time_limit / 10}, True),
    ]


def fit(worlds: Worlds, seed: int, epsilon: float, sized: Callable[[int], Form]) -> Form:
    """The form with the longest pattern the checker admits (prepare only: no charge), or its smallest (refused)."""
    with sessions(worlds, seed, sized(0).engine) as (session, _):
        def accepts(n: int) -> str | None:
            form = sized(n)
            try:
                for condition in (form.conditions.secret, form.conditions.true, form.conditions.false):
                    session.prepare(form.sql.format(c=condition), epsilon=epsilon)
            except (QueryRejected, ProgrammingError) as refused:
                return str(refused)
            return None

        if accepts(0) is not None:
            return sized(0)  # refused even without a LIKE: played as refused
        n, _ = deepest(lambda k: accepts(k), 2000)
    return sized(n)


# -- the worlds ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Worlds:
    policies: tuple[Path, Path]  # world 0 (the target's secret is 0), world 1 (it is 1)


def _text(chooser: random.Random) -> str:
    return "".join(chooser.choice("abcdefgh") for _ in range(LONG))


def write_worlds(folder: Path, people: int, seed: int) -> Worlds:
    chooser = random.Random(seed)
    others = {pid: (chooser.randint(0, 1), chooser.randint(0, 1), chooser.randint(0, 1), chooser.randint(0, 1))
              for pid in range(1, people)}
    for g, pid in enumerate(KNOWN_KEY):  # people whose key g the attacker knows: the skew form's calibration
        others[pid] = (*others[pid][:3], g)
    texts = [_text(chooser) for _ in range(64)]
    costly_texts = {TARGET, *KNOWN_KEY}  # the people the attacker times
    diary_rows = {pid: chooser.randint(1, M) for pid in others} | {TARGET: HEAVY}
    # `log`: the target's rows are the secret (HEAVY in world 1, M in world 0); the attacker knows the known-key
    # people's (HEAVY and M).
    log_rows = {pid: chooser.randint(1, M) for pid in others} | {KNOWN_KEY[0]: M, KNOWN_KEY[1]: HEAVY}
    policies = []
    for bit in (0, 1):
        world = folder / f"world{bit}"
        world.mkdir(parents=True, exist_ok=True)
        flagged = others | {TARGET: (bit, 1, 0, bit)}  # s, kt, kf, g

        def rows(per_person: Callable[[int], int], flagged: dict = flagged) -> Iterator[tuple]:
            row = random.Random(seed + 1)  # the same rows in both worlds but the target's flags
            for pid, (s, kt, kf, g) in flagged.items():
                for _ in range(per_person(pid)):
                    # The target's texts differ in their last character only (so that the filtered cap's mask,
                    # which skips units whose filter columns hold one value, does not skip it): all but that 'a'.
                    text = "a" * (LONG - 1) + row.choice("cdefg") if pid in costly_texts else row.choice(texts)
                    yield pid, s, kt, kf, g, row.randint(0, 100), text

        header = list(PRIVATE_COLUMNS)
        write_csv(world / "people.csv", header, rows(lambda pid: M))
        write_csv(world / "visits.csv", header, rows(lambda pid: M))
        write_csv(world / "diary.csv", header, rows(diary_rows.__getitem__))
        write_csv(world / "log.csv", header, rows((log_rows | {TARGET: HEAVY if bit else M}).__getitem__))
        write_csv(world / "codes.csv", ["g", "r"], [(g, r) for g in (0, 1) for r in range(3)])
        write_csv(world / "skew.csv", ["g", "r"], [(0, 0), *((1, r) for r in range(SKEW))])
        private = {name: {"source": f"{name}.csv", "privacy_unit": "pid", "max_rows_per_unit": M, "unit": "person",
                          "columns": PRIVATE_COLUMNS} for name in ("people", "visits", "diary", "log")}
        public = {name: {"source": f"{name}.csv", "public": True,
                         "columns": {"g": {"type": "int"}, "r": {"type": "int"}}} for name in ("codes", "skew")}
        policies.append(write_policy(world / "policy.toml", private | public,
                                     {"epsilon": 1e6, "delta": 1e-3, "query_epsilon": 1.0, "query_delta": 1e-8}))
    return Worlds((policies[0], policies[1]))


def with_engine(policy: Path, settings: dict[str, float | str]) -> None:
    """The policy with these `[engine]` settings (only these)."""
    text = policy.read_text().split("\n[engine]")[0]
    lines = [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    policy.write_text("\n".join([text, "[engine]", *lines, ""]) if lines else text)


# -- the game ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timed:
    seconds: float
    failed: bool


def timed(session: PrivateSession, sql: str, epsilon: float) -> Timed:
    """One execute end to end, whether it answers or fails after the charge."""
    start = time.perf_counter()
    failed = False
    try:
        session.execute(sql, epsilon=epsilon)
    except ExecutionFailed:
        failed = True
    return Timed(time.perf_counter() - start, failed)


@dataclass(frozen=True)
class FormReport:
    form: Form
    refusal: str | None
    calibration_ms: tuple[float, float] = (math.nan, math.nan)  # first medians: known false, known true
    world_ms: tuple[float, float] = (math.nan, math.nan)  # medians of the secret query in world 0, world 1
    failures: tuple[int, int] = (0, 0)  # rounds that failed, per world
    rounds: tuple[int, int] = (0, 0)
    game: Proportion | None = None
    wall_seconds: float = 0.0
    load: float = math.nan  # the machine's 1-minute load average when the form finished (2 cores)

    def line(self) -> str:
        if self.refusal is not None:
            return f"  {self.form.name}: refused: {self.refusal}"
        assert self.game is not None
        slow = self.world_ms[1] / self.world_ms[0]
        failed = f", failed {self.failures[0]}/{self.rounds[0]} vs {self.failures[1]}/{self.rounds[1]}" \
            if any(self.failures) else ""
        return (f"  {self.form.name}: {self.world_ms[0]:.1f} ms (secret 0) vs {self.world_ms[1]:.1f} ms (secret 1), "
                f"x{slow:.1f}{failed}; calibrated {self.calibration_ms[0]:.1f} / {self.calibration_ms[1]:.1f} ms; "
                f"attacker wins {self.game.successes}/{self.game.trials} ({self.game}) "
                f"[{self.wall_seconds:.0f} s, load {self.load:.1f}]")

    def row(self, epsilon: float) -> str:
        if self.refusal is not None:
            return f"| {self.form.name} | refused: {self.refusal} | | | | | |"
        assert self.game is not None
        lo, hi = self.game.interval()
        failed = f"; failed {self.failures[0]}/{self.rounds[0]} vs {self.failures[1]}/{self.rounds[1]}" \
            if any(self.failures) else ""
        leak = "**bit leaks**" if self.game.lower() > success_bound(epsilon) else "at chance"
        return (f"| {self.form.name} | accepted{failed} | {self.world_ms[0]:.1f} | {self.world_ms[1]:.1f} | "
                f"{self.world_ms[1] / self.world_ms[0]:.1f}x | {self.game.successes}/{self.game.trials} "
                f"({lo:.2f}..{hi:.2f}) | {leak} | {self.load:.1f} |")


HEADER = ("| form | today | median ms, secret 0 | median ms, secret 1 | slowdown | attacker wins (95% CI) | verdict | "
          "load |\n|---|---|---|---|---|---|---|---|")


@contextlib.contextmanager
def sessions(worlds: Worlds, seed: int, engine: dict[str, float | str]) -> Iterator[tuple[PrivateSession, ...]]:
    for policy in worlds.policies:
        with_engine(policy, engine)
    opened = [open_session(policy, seed) for policy in worlds.policies]
    try:
        yield tuple(opened)
    finally:
        for session in opened:
            session.close()


def play(form: Form, worlds: Worlds, rounds: int, epsilon: float, seed: int) -> FormReport:
    started = time.perf_counter()
    secret, true, false = (form.sql.format(c=c) for c in (form.conditions.secret, form.conditions.true,
                                                           form.conditions.false))
    with sessions(worlds, seed, form.engine) as (world0, world1):
        try:
            for sql in (secret, true, false):
                world0.prepare(sql, epsilon=epsilon)
        except (QueryRejected, ProgrammingError) as refused:
            return FormReport(form, str(refused))
        for sql in (true, false):
            timed(world0, sql, epsilon)  # warm: the engine's caches and the prepared query
        for session in (world0, world1):
            timed(session, secret, epsilon)
        # The known conditions read nothing secret, so they take the same time in either world: the attacker runs
        # them in whichever world the round is in. A window of the last CALIBRATION runs of each, refreshed every
        # RECALIBRATE rounds, follows the machine's load as it drifts.
        known: dict[bool, deque[float]] = {truth: deque(maxlen=CALIBRATION) for truth in (False, True)}

        # An error oracle needs no clock: it is calibrated once only, for the record.
        every = rounds + 1 if form.error_oracle else RECALIBRATE

        def calibrate(session: PrivateSession) -> None:
            for truth, sql in ((False, false), (True, true)):
                known[truth].append(timed(session, sql, epsilon).seconds)

        for i in range(1 if form.error_oracle else CALIBRATION):
            calibrate((world0, world1)[i % 2])
        first = tuple(statistics.median(known[truth]) for truth in (False, True))
        coins = np.random.default_rng(seed).integers(0, 2, size=rounds)
        played: dict[int, list[Timed]] = {0: [], 1: []}
        wins = 0
        for i, coin in enumerate(coins):
            session = (world0, world1)[coin]
            if i and i % every == 0:
                calibrate(session)
            threshold = math.sqrt(statistics.median(known[False]) * statistics.median(known[True]))
            result = timed(session, secret, epsilon)
            played[int(coin)].append(result)
            guess = result.failed if form.error_oracle else result.failed or result.seconds > threshold
            wins += int(guess == bool(coin))
    world_ms = tuple(statistics.median(t.seconds for t in played[bit]) * 1000 if played[bit] else math.nan
                     for bit in (0, 1))
    return FormReport(form, None, (first[0] * 1000, first[1] * 1000), world_ms,
                      tuple(sum(t.failed for t in played[bit]) for bit in (0, 1)),
                      tuple(len(played[bit]) for bit in (0, 1)), Proportion(wins, rounds),
                      time.perf_counter() - started, os.getloadavg()[0])


# -- how far each chain reaches today -----------------------------------------------------------------------------


def deepest(accepts: Callable[[int], str | None], limit: int) -> tuple[int, str | None]:
    """The largest n <= limit for which `accepts(n)` is None (accepted), assuming a refusal stays one for larger
    n; with the refusal of n + 1 (None if limit is accepted). Doubling, then halving: each prepare is O(n)."""
    low, high = 0, 1
    while high <= limit and accepts(high) is None:
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if accepts(middle) is None else (low, middle)
    return low, accepts(high) if high <= limit else None


REACH: dict[str, tuple[Callable[[int], str], int]] = {
    "private self-join copies": (lambda n: f"SELECT COUNT(*) {self_join_chain(n)} WHERE p0.pid = 0", 20),
    "public joins on a 2-valued key (3 rows a value)": (lambda n: f"SELECT COUNT(*) {public_chain(n)}", 20),
    "costly SUMs in one query": (lambda n: f"SELECT {sums(n)} FROM people p", 2000),
    "quantiles of distinct costly arguments in one query": (lambda n: f"SELECT {quantiles(n)} FROM people p", 80),
}


def reach(worlds: Worlds, seed: int, epsilon: float) -> list[str]:
    """The deepest chain of each kind the checker accepts (prepare only: no charge, nothing read)."""
    lines = []
    with sessions(worlds, seed, {}) as (session, _):
        for name, (build, limit) in REACH.items():
            def accepts(n: int, build: Callable[[int], str] = build) -> str | None:
                try:
                    session.prepare(build(n), epsilon=epsilon)
                except (QueryRejected, ProgrammingError) as refused:
                    return str(refused)
                return None

            n, refusal = deepest(accepts, limit)
            beyond = f"{n + 1} refused: {refusal[:140]}" if refusal else f"the search stopped at {limit}"
            lines.append(f"  {name}: {n} accepted; {beyond}")
    return lines


def python_share(worlds: Worlds, seed: int, epsilon: float, joins: range) -> list[str]:
    """Of the candidate-groups form with the target's condition true: the engine's time and dpsql's own Python
    (release: partition selection, noise, order; then post-processing), per number of joins."""
    lines = []
    with sessions(worlds, seed, {}) as (session, _):
        for n in joins:
            try:
                prepared = session.prepare(f"SELECT COUNT(*) {public_chain(n)} WHERE {TARGET_FLAGS.true} "
                                           f"GROUP BY {group_key(n)}", epsilon=epsilon)
            except (QueryRejected, ProgrammingError) as refused:
                lines.append(f"  {n} joins: refused: {str(refused)[:140]}")
                continue
            start = time.perf_counter()
            rows = session.measure(prepared)
            measured = time.perf_counter()
            cells = release(prepared.plan, rows, session.rng)
            session.post.run(prepared.plan.query, prepared.key_types, cells)
            done = time.perf_counter()
            lines.append(f"  {n} joins: {len(rows)} candidate groups of the target; engine "
                         f"{(measured - start) * 1000:.0f} ms, dpsql's Python {(done - measured) * 1000:.0f} ms")
    return lines


def worst(worlds: Worlds, seed: int, epsilon: float, limit: float) -> list[str]:
    """The deepest chains accepted today (8 private copies, 11 public joins), once in each world: the join alone
    (COUNT(*)) and with the costly aggregate, under a time limit of `limit` seconds, to see how long a failing
    query really holds the engine."""
    chains = {"8 private copies": (self_join_chain(8), flags("p0"), "p0"),
              "11 public joins": (public_chain(11), TARGET_FLAGS, "p")}
    lines = []
    with sessions(worlds, seed, {"time_limit_seconds": limit}) as opened:
        for name, (source, conditions, alias) in chains.items():
            for what, aggregate in (("COUNT(*)", "COUNT(*)"), ("costly SUM", f"SUM({hit(alias)})")):
                sql = f"SELECT {aggregate} {source} WHERE {conditions.secret}"
                try:
                    opened[0].prepare(sql, epsilon=epsilon)
                except (QueryRejected, ProgrammingError) as refused:
                    lines.append(f"  {name}, {what}: refused: {str(refused)[:140]}")
                    continue
                runs = [timed(session, sql, epsilon) for session in opened]
                lines.append(f"  {name}, {what}: " + ", ".join(
                    f"secret {bit}: {run.seconds * 1000:.0f} ms{' (failed)' if run.failed else ''}"
                    for bit, run in enumerate(runs)))
    return lines


def main() -> None:
    sized = {field.name: field.default for field in dataclasses.fields(Sizes)}
    args = options(__doc__, people=200, rounds=48, seed=28, epsilon=1e-6, forms=["all"], reach=0,
                   python_share=0, worst=0.0, markdown="", bound=0, **sized)
    sizes = Sizes(**{name: getattr(args, name) for name in sized})
    chosen = [form for form in forms(sizes) if "all" in args.forms or form.name in args.forms]
    lines: list[str] = []

    def say(*new: str) -> None:
        print("\n".join(new), flush=True)
        lines.extend(new)

    with scratch() as folder:
        worlds = write_worlds(folder / "worlds", args.people, args.seed)
        say(f"person timing: {args.people} people, m = {M}, text {LONG} characters, the target {HEAVY} diary rows; "
            f"epsilon {args.epsilon:g} per query (DP bound on a guess {success_bound(args.epsilon):.7f}); "
            f"{args.rounds} rounds a form; load average at the start {os.getloadavg()[0]:.1f} (2 cores)")
        if args.reach:
            say("", "the deepest chains accepted:", *reach(worlds, args.seed, args.epsilon))
        if args.python_share:
            say("", "candidate groups, where the time goes:",
                *python_share(worlds, args.seed, args.epsilon, range(sizes.group_joins, args.python_share + 1)))
        if args.worst:
            say("", f"the deepest chains, once in each world, time limit {args.worst:g} s:",
                *worst(worlds, args.seed, args.epsilon, args.worst))
        say("")
        if args.bound:  # the paths as large as the per-person work bound admits, instead of the issue's forms
            chosen = [fit(worlds, args.seed, args.epsilon, sized) for first, sized in at_the_bound(sizes)
                      if "all" in args.forms or first.name in args.forms]
        reports = []
        for form in chosen:
            reports.append(play(form, worlds, args.rounds, args.epsilon, args.seed))
            say(reports[-1].line())
        say("", HEADER, *(report.row(args.epsilon) for report in reports), "",
            *(f"- {form.name}: {form.path}" for form in chosen))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
