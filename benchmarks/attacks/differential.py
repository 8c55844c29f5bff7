"""A differential fuzzer for side channels (issue 7): the same accepted query on tables that differ in one row.

Row expressions are generated from a typed grammar of what dpsql accepts (WHERE filters, CASE, group keys,
aggregate arguments over int, float, text, bool, date and timestamp columns). Each query runs through the real
pipeline (PrivateSession.execute) on a base table and on copies of it with one adversarial row added (NULLs,
+/-inf, extreme integers, empty and long strings, infinity and extreme dates, non-numeric text). A query the
checker accepts must then behave the same on all of them, apart from its noisy values:
- no error after acceptance in any world (an error that one row causes is a one-bit oracle; a refusal is free
  and decided from the text, so a refused query is simply not run);
- no group merge (dpsql fails such a query generically: it shows up as an error);
- per-row work bounded: the largest amount of text any row makes the expression handle (the sum of the lengths of
  its text-valued parts, a deterministic count) in an adversarial world, over the same in the base world. Wall-clock
  ratios are measured too, but only reported by the script (`python -m benchmarks.attacks.differential`).

An expression that errors on one row is a checker problem (the type and totality check of issue 7): the script
prints such cases minimised to the smallest failing subexpression, and tests/attacks/fuzz_side_channel_cases.py
keeps the ones found as expected refusals.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp

from benchmarks.attacks.script import options, scratch
from benchmarks.support import Budget, Table, column, open_session, write_dataset
from dpsql.errors import Error, ExecutionFailed
from dpsql.release.cells import release
from dpsql.session import PreparedQuery, PrivateSession
from dpsql.sql.parse import DIALECT

TABLE = Table("f", "uid", (
    column("uid", "int"), column("i", "int", -100.0, 100.0), column("x", "float", -10.0, 10.0), column("s", "text"),
    column("b", "bool"), column("d", "date"), column("ts", "timestamp"), column("g", "text", values=("a", "b"))),
    max_rows=2)
BUDGET = Budget(epsilon=1e12, delta=1e-3, query_epsilon=1.0, query_delta=1e-6, accounting="zcdp",
                mechanism="gaussian")
EPSILON = 1.0
LONG_TEXT = "ab%_" * 2500  # 10,000 characters
ADVERSARIAL_ROWS = {  # theme -> the one extra row (uid, i, x, s, b, d, ts, g)
    "nulls": (10_000, None, None, None, None, None, None, None),
    "largest": (10_001, 9223372036854775807, 1.7976931348623157e308, LONG_TEXT, True, "infinity", "infinity", "b"),
    "smallest": (10_002, -9223372036854775808, -1.7976931348623157e308, "", False, "-infinity", "-infinity", "a"),
    "infinities": (10_003, 0, float("inf"), "-0", True, "9999-12-31", "9999-12-31 23:59:59.999999", "a"),
    "negative infinity": (10_004, -1, float("-inf"), "1e999", False, "0001-01-01", "0001-01-01 00:00:00", "b"),
    "odd text": (10_005, 2147483648, 5e-324, "ü\\%_'\"\x01 x", None, "10000-01-01", "294247-01-01 00:00:00", "a"),
    "numeric text": (10_006, 1, -0.0, "12345678901234567890", True, "2024-02-29", "2024-02-29 23:59:59", "b"),
}


def base_rows(seed: int, people: int = 40) -> list[tuple]:
    r = random.Random(seed)
    return [ordinary_row(r, u) for u in range(people) for _ in range(r.randint(1, 2))]


def ordinary_row(r: random.Random, uid: int) -> tuple:
    """One row of `uid` with everyday values (uid, i, x, s, b, d, ts, g)."""
    return (uid, r.randint(-100, 100), round(r.uniform(-10, 10), 3), r.choice(["alpha", "Beta", "c d", "x1", "42"]),
            r.random() < 0.5, f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            f"2023-{r.randint(1, 12):02d}-{r.randint(1, 28):02d} {r.randint(0, 23):02d}:00:00", r.choice("ab"))


# The grammar ------------------------------------------------------------------------------------------------

TYPES = ("int", "float", "text", "bool", "date", "timestamp")
COLUMNS = {"int": ("i",), "float": ("x",), "text": ("s", "g"), "bool": ("b",), "date": ("d",), "timestamp": ("ts",)}
LITERALS = {"int": ("0", "1", "-1", "3", "100", "9223372036854775807"), "float": ("0.5", "-2.5", "1e300", "0.0"),
            "text": ("''", "'a'", "'%'", "'x_'", "'12'"), "bool": ("TRUE", "FALSE", "NULL"),
            "date": ("DATE '2024-01-01'", "DATE '1970-01-01'"), "timestamp": ("TIMESTAMP '2024-01-01 12:00:00'",)}
DATE_PARTS = ("year", "month", "day", "quarter", "week", "dayofweek", "dayofyear", "hour", "minute", "epoch")
TRUNC_PARTS = ("year", "month", "day", "hour", "week", "quarter")


@dataclass
class Expression:
    sql: str
    texts: list[str] = field(default_factory=list)  # its text-valued parts (for the per-row work count)


class Grammar:
    """Random well-typed row expressions of what dpsql's checker accepts; sized by `depth`. Their leaves are
    `columns` (by type: f's unqualified columns unless told otherwise) and literals."""

    def __init__(self, rng: random.Random, columns: dict[str, tuple[str, ...]] = COLUMNS) -> None:
        self.r = rng
        self.columns = columns

    def over(self, columns: dict[str, tuple[str, ...]]) -> Grammar:
        """The same grammar (and random stream) over other columns: those of a join, qualified."""
        return Grammar(self.r, columns)

    def pick(self, options):
        return options[self.r.randrange(len(options))]

    def of(self, kind: str, depth: int = 0) -> Expression:
        if depth >= 3 or self.r.random() < 0.3:
            names = self.columns.get(kind, ())
            leaf = self.pick(names) if names and self.r.random() < 0.75 else self.pick(LITERALS[kind])
            return Expression(leaf, [leaf] if kind == "text" else [])
        return getattr(self, kind)(depth + 1)

    def _combine(self, template: str, *parts: Expression, text: bool = False) -> Expression:
        sql = template.format(*(p.sql for p in parts))
        texts = [t for p in parts for t in p.texts]
        return Expression(sql, [*texts, sql] if text else texts)

    def int(self, depth: int) -> Expression:
        n = lambda: self.of("int", depth)  # noqa: E731 - a generator of fresh operands
        choice = self.r.randrange(9)
        if choice == 0:
            return self._combine(f"({{}} {self.pick(('+', '-', '*', '//', '%'))} {{}})", n(), n())
        if choice == 1:
            return self._combine(f"{self.pick(('abs', 'sign'))}({{}})", n())
        if choice == 2:
            return self._combine("length({})", self.of("text", depth))
        if choice == 3:
            return self._combine(f"{self.pick(('year', 'month', 'day'))}({{}})", self.of("date", depth))
        if choice == 4:
            source = self.of(self.pick(("date", "timestamp")), depth)
            return self._combine(f"extract({self.pick(DATE_PARTS)} FROM {{}})", source)
        if choice == 5:
            return self._combine("strpos({}, {})", self.of("text", depth), self.of("text", depth))
        if choice == 6:
            return self._combine(f"CAST({{}} AS {self.pick(('INTEGER', 'BIGINT'))})",
                                 self.of(self.pick(("float", "text")), depth))
        if choice == 7:
            return self._combine(f"{self.pick(('least', 'greatest', 'coalesce', 'nullif'))}({{}}, {{}})", n(), n())
        return self._combine("CASE WHEN {} THEN {} ELSE {} END", self.of("bool", depth), n(), n())

    def float(self, depth: int) -> Expression:
        f = lambda: self.of(self.pick(("float", "int")), depth)  # noqa: E731
        choice = self.r.randrange(6)
        if choice == 0:
            return self._combine(f"({{}} {self.pick(('+', '-', '*', '/', '**'))} {{}})", f(), f())
        if choice == 1:
            return self._combine(f"{self.pick(('sqrt', 'ln', 'exp', 'floor', 'ceil', 'abs'))}({{}})", f())
        if choice == 2:
            return self._combine(f"round({{}}, {self.pick(('0', '2', '-1'))})", f())
        if choice == 3:
            return self._combine("CAST({} AS DOUBLE)", self.of(self.pick(("int", "text")), depth))
        if choice == 4:
            return self._combine("CASE WHEN {} THEN {} END", self.of("bool", depth), f())
        return self._combine(f"{self.pick(('least', 'greatest', 'coalesce'))}({{}}, {{}})", f(), f())

    def text(self, depth: int) -> Expression:
        t = lambda: self.of("text", depth)  # noqa: E731
        choice = self.r.randrange(8)
        if choice == 0:
            return self._combine(f"{self.pick(('lower', 'upper', 'trim'))}({{}})", t(), text=True)
        if choice == 1:
            return self._combine("substring({}, {}, {})", t(), self.of("int", depth), self.of("int", depth),
                                 text=True)
        if choice == 2:
            return self._combine(f"{self.pick(('left', 'right'))}({{}}, {{}})", t(), self.of("int", depth),
                                 text=True)
        if choice == 3:
            return self._combine("replace({}, {}, {})", t(), t(), t(), text=True)
        if choice == 4:
            return self._combine("({} || {})", t(), t(), text=True)
        if choice == 5:
            return self._combine("concat({}, {})", t(), t(), text=True)
        if choice == 6:
            return self._combine("CAST({} AS TEXT)", self.of(self.pick(("int", "float", "date", "bool")), depth),
                                 text=True)
        return self._combine("CASE WHEN {} THEN {} ELSE {} END", self.of("bool", depth), t(), t(), text=True)

    def bool(self, depth: int) -> Expression:
        choice = self.r.randrange(9)
        if choice == 0:
            kind = self.pick(("int", "float", "text", "date", "timestamp"))
            op = self.pick(("=", "<>", "<", "<=", ">", ">="))
            return self._combine(f"{{}} {op} {{}}", self.of(kind, depth), self.of(kind, depth))
        if choice == 1:
            return self._combine(f"({{}} {self.pick(('AND', 'OR'))} {{}})", self.of("bool", depth),
                                 self.of("bool", depth))
        if choice == 2:
            return self._combine("NOT {}", self.of("bool", depth))
        if choice == 3:
            return self._combine(f"{{}} IS {self.pick(('NULL', 'NOT NULL'))}", self.of(self.pick(TYPES), depth))
        if choice == 4:
            pattern = self.pick(("'a%'", "'%b_'", "'%'", "''", "'x\\_%'"))
            escape = self.pick(("", "", " ESCAPE '\\'"))
            return self._combine(f"{{}} {self.pick(('LIKE', 'ILIKE', 'NOT LIKE'))} {pattern}{escape}",
                                 self.of("text", depth))
        if choice == 5:
            kind = self.pick(("int", "text"))
            items = ", ".join(self.pick(LITERALS[kind]) for _ in range(self.r.randint(1, 7)))
            return self._combine(f"{{}} {self.pick(('IN', 'NOT IN'))} ({items})", self.of(kind, depth))
        if choice == 6:
            kind = self.pick(("int", "float", "date"))
            return self._combine("{} BETWEEN {} AND {}", self.of(kind, depth), self.of(kind, depth),
                                 self.of(kind, depth))
        if choice == 7:
            return self._combine("starts_with({}, {})", self.of("text", depth), self.of("text", depth))
        return self._combine("CASE WHEN {} THEN {} ELSE {} END", self.of("bool", depth), self.of("bool", depth),
                             self.of("bool", depth))

    def date(self, depth: int) -> Expression:
        choice = self.r.randrange(3)
        if choice == 0:
            return self._combine("CAST({} AS DATE)", self.of(self.pick(("text", "timestamp")), depth))
        if choice == 1:
            return self._combine(f"date_trunc('{self.pick(TRUNC_PARTS[:3])}', {{}})", self.of("date", depth))
        return self._combine("CASE WHEN {} THEN {} ELSE {} END", self.of("bool", depth), self.of("date", depth),
                             self.of("date", depth))

    def timestamp(self, depth: int) -> Expression:
        choice = self.r.randrange(3)
        if choice == 0:
            return self._combine("CAST({} AS TIMESTAMP)", self.of(self.pick(("text", "date")), depth))
        if choice == 1:
            return self._combine(f"date_trunc('{self.pick(TRUNC_PARTS)}', {{}})", self.of("timestamp", depth))
        return self._combine("coalesce({}, {})", self.of("timestamp", depth), self.of("timestamp", depth))

    def query(self) -> tuple[str, Expression]:
        """A query and the row expression under test in it."""
        form = self.r.randrange(7)
        if form == 0:
            e = self.of("bool")
            return f"SELECT COUNT(*) FROM f WHERE {e.sql}", e
        if form == 1:
            e = self.of(self.pick(TYPES))
            return f"SELECT COUNT({e.sql}) FROM f", e
        if form == 2:
            e = self.of("bool")
            return f"SELECT SUM(CASE WHEN {e.sql} THEN i ELSE 0 END), AVG(CASE WHEN {e.sql} THEN x END) FROM f", e
        if form == 3:
            e = self.of(self.pick(("int", "text", "bool", "date", "timestamp")))
            return f"SELECT {e.sql} AS k, COUNT(*) FROM f GROUP BY k", e
        if form == 5:  # the quantile path: the row expression decides which values reach the histogram
            e = self.of("bool")
            return (f"SELECT g, MEDIAN(CASE WHEN {e.sql} THEN x END), MAX(CASE WHEN {e.sql} THEN i END) FROM f "
                    "GROUP BY g"), e
        if form == 6:  # keys without an aggregate
            e = self.of(self.pick(("int", "text", "bool")))
            return f"SELECT DISTINCT {e.sql} AS k FROM f", e
        e, w = self.of("bool"), self.of("bool")
        both = Expression(f"{e.sql} AND {w.sql}", [*e.texts, *w.texts])
        return f"SELECT g, COUNT(*) FROM f WHERE {both.sql} GROUP BY g", both


    def pair_query(self) -> tuple[str, Expression]:
        """COUNT, SUM and AVG of one generated numeric argument, which the planner measures as a pair of
        complementary sums (planning/measurements.Pair; its NULL rows beside it when COUNT(*) needs them)."""
        e = self.of(self.pick(("int", "float")))
        if self.r.random() < 0.3:
            e = self._combine(f"CASE WHEN {{}} THEN {e.sql} END", self.of("bool"))
        by = self.r.random() < 0.5
        return (f"SELECT {'g, ' if by else ''}COUNT(*), COUNT({e.sql}), SUM({e.sql}), AVG({e.sql}) FROM f"
                f"{' GROUP BY g' if by else ''}"), e

    def nested_query(self) -> tuple[str, Expression]:
        """A query of the SQL of issue 9 and the normaliser (per-unit aggregation, CTEs, row-level subqueries, the
        unit semi-join, EXISTS, FILTER, GROUP BY ALL, a per-unit subquery joined back) with the row expression under
        test inside it: the rewrites must not let one row make an accepted query fail."""
        form = self.r.randrange(9)
        e = self.of("bool")
        if form == 0:
            return (f"SELECT n, COUNT(*) FROM (SELECT uid, COUNT(*) AS n FROM f WHERE {e.sql} GROUP BY uid) AS p "
                    "GROUP BY n"), e
        if form == 1:
            v, w = self.of("int"), self.of("float")
            both = Expression(f"{v.sql}, {w.sql}", [*v.texts, *w.texts])
            return (f"SELECT COUNT(*), SUM(v), AVG(w), MAX(w) FROM (SELECT uid, SUM({v.sql}) AS v, "
                    f"MIN({w.sql}) AS w FROM f GROUP BY uid) AS p"), both
        if form == 2:
            return (f"SELECT COUNT(*), SUM(n) FROM (SELECT uid, COUNT(*) AS n FROM f GROUP BY uid "
                    f"HAVING SUM(CASE WHEN {e.sql} THEN 1 ELSE 0 END) > 0 OR AVG(x) < 0) AS p"), e
        if form == 3:  # the outer WHERE reads derived values named like the columns the grammar uses
            return (f"SELECT COUNT(*) FROM (SELECT uid, MAX(i) AS i, AVG(x) AS x, COUNT(*) AS n FROM f "
                    f"GROUP BY uid) AS p WHERE {e.sql}"), Expression(e.sql, [])
        if form == 4:
            return (f"WITH c AS (SELECT uid, g, {e.sql} AS v FROM f) SELECT g, COUNT(*) FROM (SELECT * FROM c "
                    "WHERE v) AS s GROUP BY g"), e
        if form == 5:
            return f"SELECT g, COUNT(*) FROM f WHERE uid IN (SELECT uid FROM f WHERE {e.sql}) GROUP BY g", e
        if form == 6:
            return (f"SELECT COUNT(*), SUM(i) FROM f AS a WHERE EXISTS (SELECT 1 FROM f AS b WHERE b.uid = a.uid "
                    f"AND {e.sql})"), e
        if form == 7:
            return f"SELECT g, COUNT(*) FILTER (WHERE {e.sql}), SUM(i) FILTER (WHERE {e.sql}) FROM f GROUP BY ALL", e
        return (f"SELECT COUNT(*), SUM(p.n) FROM (SELECT uid, COUNT(*) AS n FROM f WHERE {e.sql} GROUP BY uid) AS p "
                "JOIN f ON f.uid = p.uid"), e


# Running ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    sql: str
    theme: str  # the adversarial row that made it fail ("base" for the table without one)
    kind: str  # "error after acceptance" | "crash"
    detail: str


@dataclass
class Summary:
    cases: int = 0
    refused: int = 0
    findings: list[Finding] = field(default_factory=list)
    work: str = "per-row text work"  # what the work count counts (see run_case)
    work_ratios: list[tuple[float, str, str]] = field(default_factory=list)  # (ratio, theme, sql)
    work_absolute: list[tuple[float, str, str]] = field(default_factory=list)  # (the adversarial world's, theme, sql)
    work_added: list[tuple[float, str, str]] = field(default_factory=list)  # (adversarial minus base, theme, sql)
    time_ratios: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.cases - self.refused

    def worst(self, ratios: list[tuple[float, str, str]], n: int = 3) -> list[tuple[float, str, str]]:
        return sorted(ratios, reverse=True)[:n]

    def lines(self) -> list[str]:
        out = [f"{self.cases} queries: {self.accepted} accepted, {self.refused} refused from the text; "
               f"{len(self.findings)} failures after acceptance in {len({f.sql for f in self.findings})} queries"]
        for finding in self.findings[:40]:
            out.append(f"  [{finding.theme}] {finding.kind}: {finding.sql}  ({finding.detail[:80]})")
        for name, ratios in ((self.work, self.work_ratios), ("wall-clock time", self.time_ratios)):
            if ratios:
                values = [r for r, _, _ in ratios]
                out.append(f"{name}, adversarial world / base world: median {statistics.median(values):.2f}, "
                           f"max {max(values):.1f}")
                out += [f"  {r:.1f}x [{theme}] {sql}" for r, theme, sql in self.worst(ratios)]
        return out


@dataclass
class Worlds:
    sessions: dict[str, PrivateSession]  # "base" and one per adversarial theme

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    def __enter__(self) -> Worlds:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_worlds(folder: Path, seed: int, themes: tuple[str, ...] = tuple(ADVERSARIAL_ROWS)) -> Worlds:
    rows = base_rows(seed)
    sessions = {"base": open_session(write_dataset(folder / "base", TABLE, rows, BUDGET), seed, "differential")}
    for theme in themes:
        policy = write_dataset(folder / theme.replace(" ", "_"), TABLE, [*rows, ADVERSARIAL_ROWS[theme]], BUDGET)
        sessions[theme] = open_session(policy, seed, "differential")
    return Worlds(sessions)


def text_work(session: PrivateSession, expression: Expression) -> int:
    """The most text one row makes `expression` handle: the sum of the lengths of its text-valued parts, for the
    row where that is largest (a failing part counts as 0). Read on the engine's prepared table."""
    if not expression.texts:
        return 0
    total = " + ".join(f"coalesce(length(TRY({t})), 0)" for t in expression.texts)
    try:
        rows = session.engine.run(f"SELECT max({total}) FROM __dp_f AS f")
    except ExecutionFailed:  # only where DuckDB hoists out of TRY (the build before issue 7): no figure
        return 0
    return int(rows[0][0] or 0)


def answer(session: PrivateSession, prepared: PreparedQuery) -> None:
    """The stages of PrivateSession.execute after the charge (keep in step with dpsql/session.py), without the
    ledger: thousands of cases would otherwise spend most of their time committing charges."""
    rows = session.measure(prepared)
    session.post.run(prepared.plan.query, prepared.key_types, release(prepared.plan, rows, session.rng))


# A deterministic count of the work a prepared query makes a world's engine do (never a clock).
WorkCount = Callable[[PrivateSession, PreparedQuery], int]


def run_case(worlds: Worlds, sql: str, work: WorkCount, summary: Summary, timed: bool) -> PreparedQuery | None:
    """Run `sql` in every world; the prepared query if it was accepted."""
    summary.cases += 1
    base = worlds.sessions["base"]
    try:
        # Prepared once: preparing reads the text, the policy and the schema only, the same in every world.
        prepared = base.prepare(sql, epsilon=EPSILON)
    except Error:
        summary.refused += 1
        return None
    base_time = _timed(base, prepared) if timed else 0.0
    base_work = None
    for theme, session in worlds.sessions.items():
        try:
            if timed and theme != "base":
                elapsed = _timed(session, prepared)
            else:
                answer(session, prepared)
            counted = work(session, prepared)
        except ExecutionFailed as exc:
            summary.findings.append(Finding(sql, theme, "error after acceptance", str(exc)))
            continue
        except Exception as exc:  # a crash: any other exception
            summary.findings.append(Finding(sql, theme, "crash", f"{type(exc).__name__}: {exc}"))
            continue
        if theme == "base":
            base_work = counted
        elif base_work is not None:
            summary.work_ratios.append((counted / max(base_work, 1), theme, sql))
            summary.work_absolute.append((float(counted), theme, sql))
            summary.work_added.append((float(counted - base_work), theme, sql))
            if timed:
                summary.time_ratios.append((elapsed / base_time, theme, sql))
    return prepared


def _timed(session: PrivateSession, prepared: PreparedQuery, repeats: int = 3) -> float:
    """Median seconds of the stages after the charge (after one untimed run)."""
    answer(session, prepared)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        answer(session, prepared)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fuzz(worlds: Worlds, n: int, seed: int, timed: bool = False, nested: bool = False,
         paired: bool = False) -> Summary:
    """`nested`: the query forms of Grammar.nested_query (subqueries, CTEs, per-unit aggregation, semi-joins);
    `paired`: Grammar.pair_query's (COUNT, SUM and AVG of one argument, from a pair)."""
    grammar = Grammar(random.Random(seed))
    summary = Summary()
    for _ in range(n):
        sql, expression = grammar.nested_query() if nested else grammar.pair_query() if paired else grammar.query()
        run_case(worlds, sql, lambda session, _, e=expression: text_work(session, e), summary, timed)
    return summary


def outcome(worlds: Worlds, sql: str, theme: str) -> str:
    """"refused" (for free, from the text), "answered", or the name of the exception raised after acceptance."""
    try:
        prepared = worlds.sessions["base"].prepare(sql, epsilon=EPSILON)
    except Error:
        return "refused"
    try:
        answer(worlds.sessions[theme], prepared)
    except Exception as exc:  # any type: an error after acceptance is what this looks for
        return type(exc).__name__
    return "answered"


def minimise(worlds: Worlds, finding: Finding) -> str:
    """The smallest predicate or function call of the failing query that still fails on its own, in
    `SELECT COUNT(*) FROM f WHERE (part) IS NOT NULL`, on the same world."""
    tree = sqlglot.parse_one(finding.sql, read=DIALECT)
    parts = sorted({node.sql(DIALECT) for node in tree.walk() if isinstance(node, exp.Predicate | exp.Func)}, key=len)
    for text in parts:
        probe = f"SELECT COUNT(*) FROM f WHERE ({text}) IS NOT NULL"
        if outcome(worlds, probe, finding.theme) not in ("refused", "answered"):
            return probe
    return finding.sql


def main() -> None:
    args = options(__doc__, cases=2000, timed_cases=200, seed=7)
    with scratch() as folder:
        worlds = open_worlds(folder, args.seed)
        try:
            summary = fuzz(worlds, args.cases, args.seed)
            print("differential fuzz (errors, merges, per-row work):")
            print("\n".join(summary.lines()))
            if summary.findings:
                minimal = sorted({(minimise(worlds, f), f.theme) for f in summary.findings})
                print("minimised failing queries (checker problems: expected refusals):")
                print("\n".join(f"  [{theme}] {text}" for text, theme in minimal))
            nested = fuzz(worlds, args.cases // 2, args.seed + 2, nested=True)
            print("differential fuzz of subqueries, CTEs, per-unit aggregation and semi-joins:")
            print("\n".join(nested.lines()))
            timed = fuzz(worlds, args.timed_cases, args.seed + 1, timed=True)
            print("differential fuzz, timed (wall clock, reported only):")
            print("\n".join(timed.lines()))
        finally:
            worlds.close()


if __name__ == "__main__":
    main()
