"""Plan once, attacked (session.py, analysis/plan_once.py): values of one class that the stages might still tell
apart, positions and settings the author's tests did not sweep, and the session's own state.

Two kinds of test. Differential ones run a planning-once session and a full-path session side by side (same seeds,
two ledgers over two copies of the data) and compare every answer, refusal and charge, as tests/test_plan_once.py
does, over a table built for the attack: an integer column bounded [0, 120] (values of one class on both sides of a
bound: 110, 119, 121, 127), a coded integer column with declared values [1, 2, 3], a float column, a 41-bit integer
column, a boolean, a date, a timestamp and a per-unit column. Plan-equality ones ask one session for a statement's
plan from its template and from the full path and compare the two whole (plan, bounded SQL, canonical text, the
person-work terms' texts): cheap, so they sweep many values of each class.
"""

from __future__ import annotations

import contextlib
import csv
import decimal
import functools
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dpsql
import dpsql.session
from benchmarks import support
from benchmarks.support import RunningServer, create_ledger, seeded
from dpsql.analysis.plan_once import value_class
from dpsql.errors import Error
from dpsql.frontends.server.server import DpsqlServer, ServerConfig
from dpsql.policy import load_policy
from dpsql.session import PrivateSession, build_engine
from dpsql.store.answers import AnswerStore
from tests.server.conftest import charges as server_charges
from tests.server.conftest import dsn as server_dsn
from tests.server.conftest import sample_policy as server_policy
from tests.sizes import cases

# About 35 s of CPU: the red team's sweep runs in the full suite (CI); tests/test_plan_once.py's fast tests keep
# plan once's core in the fast loop.
pytestmark = pytest.mark.slow

D = decimal.Decimal
EPSILON = 0.5

_POLICY = """
[budget]
epsilon = TOTAL
delta = 1e-3
query_epsilon = 1.0
query_delta = 1e-8

[tables.t]
source = "t.csv"
privacy_unit = "pid"
max_rows_per_unit = 4

[tables.t.columns]
pid = { type = "int" }
code = { type = "int", values = [1, 2, 3] }
x = { type = "float", lower = -10, upper = 10 }
big = { type = "int", lower = -1099511627776, upper = 1099511627776 }
d = { type = "date" }
ts = { type = "timestamp" }
b = { type = "bool" }
n = { type = "int", lower = 0, upper = 120 }
pu = { type = "int", lower = 0, upper = 6, per_unit = true }

[tables.units]
source = "units.csv"
privacy_unit = "pid"
max_rows_per_unit = 1

[tables.units.columns]
pid = { type = "int" }
born = { type = "int", lower = 1900, upper = 2030 }
"""


def _write_table(folder: Path, total: float = 1000.0) -> Path:
    """The attack's policy (a whole budget of `total`) and data (fixed: random.Random(5)), with a fresh ledger, in
    `folder`."""
    draw = random.Random(5)
    with open(folder / "t.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["pid", "code", "x", "big", "d", "ts", "b", "n", "pu"])
        for _ in range(600):
            pid = draw.randint(1, 150)
            rows.writerow([pid, draw.choice([1, 2, 3]), round(draw.uniform(-10, 10), 3),
                           draw.randint(-2**40, 2**40), f"2020-0{draw.randint(1, 9)}-1{draw.randint(0, 9)}",
                           f"2021-03-0{draw.randint(1, 9)} 1{draw.randint(0, 9)}:00:00",
                           draw.choice(["true", "false"]), draw.randint(0, 130) if draw.random() > 0.1 else "",
                           pid % 7])
    with open(folder / "units.csv", "w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["pid", "born"])
        for pid in range(1, 151):
            rows.writerow([pid, draw.randint(1920, 2020)])
    (folder / "t.toml").write_text(_POLICY.replace("TOTAL", repr(total)))
    return create_ledger(folder / "t.toml")


def _pair(tmp_path: Path, total: float = 1000.0, **options: Any) -> tuple[PrivateSession, PrivateSession]:
    once, full = tmp_path / "once", tmp_path / "full"
    once.mkdir()
    full.mkdir()
    return (PrivateSession(_write_table(once, total), "tester", rng=seeded(7), bounding_seed=1, epsilon=EPSILON,
                           **options),
            PrivateSession(_write_table(full, total), "tester", rng=seeded(7), bounding_seed=1, epsilon=EPSILON,
                           plan_once=False, **options))


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[tuple[PrivateSession, PrivateSession]]:
    planned_once, full_path = _pair(tmp_path)
    with contextlib.closing(planned_once), contextlib.closing(full_path):
        yield planned_once, full_path


def _outcome(session: PrivateSession, sql: str, parameters: Any, **cost: Any) -> tuple[Any, ...]:
    """What the analyst sees: the answer and its cost, or the refusal's kind and message."""
    try:
        result = session.execute(sql, parameters, **cost)
    except Error as refused:
        return "refused", type(refused).__name__, str(refused)
    columns = [(c.name, c.type, c.noisy) for c in result.columns]
    return ("answered", columns, result.rows, result.intervals, result.noise_std, result.cost, result.released_groups,
            result.cached_at is not None)


def _same(planned_once: PrivateSession, full_path: PrivateSession, sql: str, sequence: list[Any],
          **cost: Any) -> None:
    """Each value set in turn, answered alike; then the two ledgers alike (charges, deltas, notes)."""
    for parameters in sequence:
        seen = _outcome(planned_once, sql, parameters, **cost)
        assert seen == _outcome(full_path, sql, parameters, **cost), (sql, parameters)
    assert _charges(planned_once) == _charges(full_path)


def _charges(session: PrivateSession) -> list[tuple[Any, ...]]:
    return [(c.epsilon, c.delta, c.query, c.note) for c in session.history("tester")]


def _reused(session: PrivateSession) -> int:
    return sum(template is not None for template in session._templates.values())


# -- values of one class on both sides of something the policy declares -----------------------------------------

def test_one_class_across_a_column_bound(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """n is declared in [0, 120]: 110, 119, 121 and 127 are one class (three digits, TINYINT), two inside the bound
    and two beyond it. The plan learnt on either side serves the other exactly as the full path does."""
    planned_once, full_path = sessions
    for sql in ("SELECT COUNT(*), AVG(n) FROM t WHERE n > ?", "SELECT COUNT(*) FROM t WHERE n BETWEEN ? AND ?"):
        count = sql.count("?")
        _same(planned_once, full_path, sql, [(v,) * count for v in (121, 110, 127, 119, 121, 100)])
    assert _reused(planned_once) >= 2


def test_one_class_inside_and_outside_a_coded_domain(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """code has the declared values 1, 2, 3 (its groups are public): 3 and 7 are one class, one a declared value
    and one not; the released groups, their noise and the charges are the full path's."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, "SELECT code, COUNT(*) FROM t WHERE code = ? GROUP BY code",
          [(7,), (3,), (9,), (1,), (4,)])
    _same(planned_once, full_path, "SELECT code, COUNT(*) FROM t WHERE code IN (?, ?) GROUP BY code",
          [(5, 6), (1, 2), (2, 9), (3, 3)])
    assert _reused(planned_once) >= 2


# -- comparisons the checker might fold or turn into something else -----------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE n IN (?, ?)",
    "SELECT COUNT(*) FROM t WHERE n = ? OR n = ?",
    "SELECT COUNT(*) FROM t WHERE n = ? AND n = ?",
    "SELECT COUNT(*) FROM t WHERE n = ? AND n <> ?",
    "SELECT COUNT(*) FROM t WHERE n NOT IN (?, ?)",
])
def test_equal_values_then_different_ones(sessions: tuple[PrivateSession, PrivateSession], sql: str) -> None:
    """Learnt on two equal values (whose shadows are equal too, so a stage that merged duplicates would pass the
    template's check), then used for two different ones: nothing was merged, each answer is the full path's."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, sql, [(11, 11), (12, 15), (30, 30), (31, 47), (64, 20)])
    assert _reused(planned_once) == 1


def test_reversed_and_empty_ranges(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """BETWEEN with its bounds reversed (an empty range, never folded) and a contradiction, learnt either way."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, "SELECT COUNT(*), SUM(pu) FROM t WHERE n BETWEEN ? AND ?",
          [(60, 20), (20, 60), (50, 50), (90, 10)])
    _same(planned_once, full_path, "SELECT COUNT(*) FROM t WHERE n > ? AND n < ?", [(80, 20), (20, 80), (70, 30)])


# -- a value's type against its column's ----------------------------------------------------------------------------

_TYPE_MIXES = (
    ("SELECT COUNT(*) FROM t WHERE n > ?", [2.5, 2.0, 3.0, 1e2, 2e2, 9e9, 1.5, D("2.5"), D("2.50"), D("2.0"),
                                            D("1E+1"), D("2E+1"), D("10"), D("20"), D("1.0"), D("1.00")]),
    ("SELECT COUNT(*) FROM t WHERE x < ?", [2**62, 2**62 + 1, 2**53 + 1, 2**53, 1e16, 2e16, 1e15, 3e15, 0.1, 0.3,
                                            0.30000000000000004, 0.10000000000000002, 5e-324, 1.5, -1.5]),
    ("SELECT COUNT(*) FROM t WHERE x > ?", [D("1E+300"), D("1E+400"), D("-1E+400"), D("-2E+300"), D("1E-400"),
                                            D("2E-300"), D("-0"), D("-0.0"), D("0.0"), -0.0, 0.0, 0]),
    ("SELECT COUNT(*) FROM t WHERE b = ?", [1, 2, 3, 5, 0]),
    ("SELECT COUNT(*) FROM t WHERE d > ?", [5, 6, 7.5]),
    ("SELECT COUNT(*) FROM t WHERE ts < ?", [5, 6]),
    ("SELECT COUNT(*) FROM t WHERE big > ?", [2**31 - 2, 2**31 - 1, 2**31 - 3, -2**63, -2**63 + 1, -2**63 + 2,
                                              2**64 - 1, 2**64 - 2, 2**127 - 1, 2**127 - 2, -2**127, -2**127 + 1,
                                              2**128 - 1, 2**128 - 2, 2**128]),
)


@pytest.mark.parametrize(("sql", "values"), _TYPE_MIXES, ids=[sql.split("WHERE ")[1] for sql, _ in _TYPE_MIXES])
def test_values_whose_type_differs_from_the_column(sessions: tuple[PrivateSession, PrivateSession], sql: str,
                                                   values: list[Any]) -> None:
    """An integer column against decimals and floats of one shape (2.5 and 2.0; 1E+1 and 10), a float column
    against integers beyond a double's precision and floats whose repr changes shape (1e16 against 1e15), decimals
    whose exponent overflows a double (1E+300 and 1E+400 are one class), signed zeros, a boolean column against
    integers, dates and timestamps against numbers (refused), the integer types' edges: each the full path's, the
    second time round from the templates."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, sql, [(v,) for v in values] * 2)


def test_named_and_repeated_parameters(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """A named parameter used twice (in two columns' comparisons), numbered ones repeated, a mapping with a key the
    query does not use: filled in everywhere it stands."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, "SELECT COUNT(*) FROM t WHERE :a < n AND x < :a",
          [{"a": 5}, {"a": 7}, {"a": 9}, {"a": 1.5}, {"a": 2.5}])
    _same(planned_once, full_path, "SELECT COUNT(*) FROM t WHERE $1 < n AND x < $1 AND n < $2",
          [(1, 50), (2, 60), (3, 70)])
    _same(planned_once, full_path, "SELECT COUNT(*) FROM t WHERE n > :low",
          [{"low": 10, "unused": 5}, {"low": 20, "unused": 6}, {"low": 30, "unused": 7}])
    assert _reused(planned_once) >= 3


@pytest.mark.parametrize("value", [10**5000, -10**5000, {"big": 10**5000}], ids=["positive", "negative", "named"])
def test_an_integer_too_long_to_write_out(sessions: tuple[PrivateSession, PrivateSession], value: Any) -> None:
    """Python refuses str() of an integer of over 4300 digits (a ValueError): the value's class, the caches' keys
    and the bound literal all write it out. Refused by both sessions with a message naming the problem (it was a
    traceback from both), nothing charged."""
    planned_once, full_path = sessions
    sql = "SELECT COUNT(*) FROM t WHERE n > :big" if isinstance(value, dict) else "SELECT COUNT(*) FROM t WHERE n > ?"
    parameters = value if isinstance(value, dict) else (value,)
    for session in sessions:
        seen = _outcome(session, sql, parameters)
        assert seen[:2] == ("refused", "DataError") and "integer" in seen[2] and "digits" in seen[2], seen
        assert not session.known_public_only(sql, parameters) and not session.reads_public_only(sql, parameters)
    _same(planned_once, full_path, sql, [parameters, parameters])
    assert not _charges(planned_once)

# -- positions: joins, per-unit columns, quantiles, grouping sets -----------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), AVG(u.born) FROM t JOIN units u ON t.pid = u.pid WHERE t.pid > ? AND u.born < ?",
    "SELECT COUNT(*) FROM t JOIN units u ON t.pid = u.pid WHERE u.pid IN (?, ?)",
    "SELECT COUNT(*) FROM t, units u WHERE t.pid = u.pid AND t.n > ? AND u.born > ?",
    "SELECT COUNT(*), SUM(n) FROM t WHERE pu > ? AND pid < ?",
    "SELECT COUNT(DISTINCT pid), COUNT(DISTINCT code), MEDIAN(x), QUANTILE_CONT(n, 0.9) FROM t WHERE n > ? AND x < ?",
    "SELECT code, COUNT(*) FROM t WHERE n > ? AND x < ? GROUP BY ROLLUP (code)",
    "SELECT n, COUNT(*) FROM t WHERE n > ? AND x < ? GROUP BY n",
    "SELECT MIN(x), MAX(x) FROM t WHERE n > ? AND x < ?",
])
def test_positions_beyond_the_authors(sessions: tuple[PrivateSession, PrivateSession], sql: str) -> None:
    """A join key compared with a value (on either side of the join), a comma join, the unit and a per-unit
    column (the filter keeps whole units: another person-work bound), quantiles, COUNT(DISTINCT), ROLLUP, private
    group keys (partition selection, delta): answers, refusals and charges the full path's."""
    planned_once, full_path = sessions
    second = (1990, 1985, 1970, 2000) if "born" in sql else (41, 62, 47, 73) if "IN" in sql else (5.5, 6.5, 2.5, 8.5)
    sequence = [pair[:sql.count("?")] for pair in zip((40, 60, 45, 70), second, strict=True)]
    _same(planned_once, full_path, sql, sequence + sequence)
    assert _reused(planned_once) >= 1


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), AVG(s) FROM (SELECT pid, SUM(n) AS s FROM t WHERE n > ? GROUP BY pid) AS per_person",
    "WITH kept AS (SELECT * FROM t WHERE n > ?) SELECT COUNT(*) FROM kept",
    "SELECT COUNT(*) FROM t WHERE pid IN (SELECT pid FROM units WHERE born > ?)",
    "SELECT COUNT(*) FROM t WHERE n IS NOT DISTINCT FROM ?",
    "SELECT COUNT(*) FROM t WHERE ? < n + 0",
    "SELECT COUNT(*) FROM t WHERE ? BETWEEN n AND 200",
    "SELECT code, COUNT(*) FROM t WHERE n > 3 GROUP BY code HAVING COUNT(*) > ?",
])
def test_positions_that_must_never_reuse(sessions: tuple[PrivateSession, PrivateSession], sql: str) -> None:
    """A per-unit subquery, a CTE, a semi-join on the unit, IS NOT DISTINCT FROM, arithmetic on the column, the
    value as BETWEEN's subject and HAVING: never planned once, each value the full path's."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, sql, [(40,), (60,), (45,), (40,)])
    assert not _reused(planned_once)

# -- the budget and the session's settings -----------------------------------------------------------------------------

def test_template_of_one_budget_never_serves_another(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """Learnt at one epsilon, asked at another, with an accuracy instead, with quantile intervals off, and after
    the session's default epsilon and intervals change: each answer and charge is the full path's at that budget."""
    planned_once, full_path = sessions
    sql = "SELECT code, COUNT(*), MEDIAN(x) FROM t WHERE n > ? GROUP BY code"
    _same(planned_once, full_path, sql, [(20,), (30,)])
    _same(planned_once, full_path, sql, [(40,), (20,)], epsilon=0.25)
    _same(planned_once, full_path, sql, [(50,), (30,)], accuracy=40)
    _same(planned_once, full_path, sql, [(60,), (40,)], quantile_intervals=False)
    for session in sessions:
        session.default_epsilon = 0.75
        session.quantile_intervals = False
    _same(planned_once, full_path, sql, [(70,), (20,), (80,)])
    budgets = {key[2] for key, template in planned_once._templates.items() if template is not None}
    assert len(budgets) >= 3


def test_refused_alike_when_the_budget_runs_out(tmp_path: Path) -> None:
    """A whole budget of 2 at 0.5 a query: the fifth and later values, from the template, are refused with the full
    path's message, nothing charged; then too large an epsilon for the whole budget, refused before anything."""
    planned_once, full_path = _pair(tmp_path, total=2.0)
    with contextlib.closing(planned_once), contextlib.closing(full_path):
        sql = "SELECT code, COUNT(*) FROM t WHERE n > ? GROUP BY code"
        _same(planned_once, full_path, sql, [(10,), (20,), (30,), (40,), (50,), (60,)])
        _same(planned_once, full_path, sql, [(70,)], epsilon=3.0)
        assert _reused(planned_once) == 1 and len(_charges(planned_once)) == 4
        assert _outcome(planned_once, sql, (80,))[:2] == ("refused", "BudgetExhausted")

def test_answer_and_measurement_stores(tmp_path: Path) -> None:
    """With an answer cache (a value asked again is answered free, from its canonical text) and a measurement
    store (answers derived from released measurements): the same cached and derived answers as the full path."""
    planned_once, full_path = _pair(tmp_path, reuse=True)
    with contextlib.closing(planned_once), contextlib.closing(full_path):
        planned_once.answers = AnswerStore(tmp_path / "once" / "answers.sqlite")
        full_path.answers = AnswerStore(tmp_path / "full" / "answers.sqlite")
        for sql in ("SELECT code, COUNT(*), AVG(x) FROM t WHERE n >= ? AND n <= ? GROUP BY code",
                    "SELECT code, COUNT(*) FROM t WHERE x < ? OR x > ? GROUP BY code"):
            _same(planned_once, full_path, sql, [(10, 50), (20, 60), (10, 50), (60, 20), (20, 60), (11, 50)])
        assert _reused(planned_once) >= 2
        assert _outcome(planned_once, sql, (20, 60))[-1], "the value asked before was not answered from the cache"


# -- the template against the full path's plan, many values of each class --------------------------------------------

def _random_value(draw: random.Random, kind: type) -> Any:
    if kind is int:
        digits = draw.choice([1, 2, 3, 5, 10, 19, 20, 39])
        value = draw.randint(10 ** (digits - 1), 10**digits - 1)
        return -value if draw.random() < 0.3 else value
    if kind is float:
        return draw.choice([draw.uniform(-200, 200), float(draw.randint(-200, 200)) + draw.choice([0, 0.5, 0.25]),
                            10.0 ** draw.randint(-320, 308) * draw.choice([1, 2.5, -9.5])])
    if draw.random() < 0.5:
        return D(draw.randint(-10**6, 10**6)).scaleb(draw.randint(-8, 8))
    return D(f"{draw.randint(1, 999)}E{draw.randint(-400, 400)}")


def _same_class(draw: random.Random, value: Any) -> Any:
    """`value` with every digit but the first drawn afresh: most often a value of its class."""
    text = repr(value) if type(value) is float else str(value)
    changed = "".join(draw.choice("0123456789") if c.isdigit() and i > 1 else c for i, c in enumerate(text))
    try:
        return type(value)(changed)
    except (ValueError, decimal.InvalidOperation):
        return value


def _full_plan(session: PrivateSession, sql: str, parameters: Any) -> Any:
    try:
        prepared = session._planned(session._parsed(sql, parameters, cache=False), session._budget(None), None)
    except Error as refused:
        return str(refused)
    return _whole(prepared)


def _whole(prepared: Any) -> Any:
    """All a prepared query decides, its relation's key aside (made only with a measurement store), with the texts
    compared exactly (sqlglot compares trees by a hash that ignores case) and the person-work terms as shown."""
    return (replace(prepared, relation=None), prepared.bounded.sql, prepared.bounded.buckets, prepared.canonical,
            [(str(term.what), term.rows, term.units) for term in prepared.plan.query.work.terms])


@pytest.mark.slow
def test_templates_give_the_full_paths_plan_for_random_values(tmp_path: Path) -> None:
    """Random statements (one or two comparisons, BETWEEN or IN, AND or OR, every numeric and boolean column) and
    random values of int, float and Decimal, then other values of the same classes: the plan from the template is
    the full path's, whole, for each (refused alike where the full path refuses)."""
    draw = random.Random(11)
    planned_once, full_path = _pair(tmp_path)
    full_path.close()
    columns, comparisons = ("code", "x", "big", "n", "pu", "pid", "b"), ("=", "<>", "<", "<=", ">", ">=")
    compared = 0
    with contextlib.closing(planned_once):
        for _ in range(cases(60)):
            parts, count = [], 0
            for _ in range(draw.randint(1, 2)):
                column, shape = draw.choice(columns), draw.random()
                if shape < 0.6:
                    parts.append(f"{column} {draw.choice(comparisons)} ?")
                    count += 1
                elif shape < 0.8:
                    parts.append(f"{column} BETWEEN ? AND ?")
                    count += 2
                else:
                    items = draw.randint(1, 3)
                    parts.append(f"{column} IN ({', '.join(['?'] * items)})")
                    count += items
            joined = f" {draw.choice(('AND', 'OR'))} ".join(parts)
            sql = f"SELECT code, COUNT(*), AVG(x) FROM t WHERE {joined} GROUP BY code"
            first = tuple(_random_value(draw, draw.choice([int, float, D])) for _ in range(count))
            classes = [value_class(v) for v in first]
            if None in classes:
                continue
            for parameters in [first] + [tuple(_same_class(draw, v) for v in first) for _ in range(6)]:
                if [value_class(v) for v in parameters] != classes:
                    continue
                try:
                    seen = _whole(planned_once.prepare(sql, parameters))
                except Error as refused:
                    seen = str(refused)
                assert seen == _full_plan(planned_once, sql, parameters), (sql, parameters)
                compared += 1
        assert _reused(planned_once) >= 10 and compared >= 100


# -- the session's own state ---------------------------------------------------------------------------------------

def test_many_classes_keep_bounded_state(sessions: tuple[PrivateSession, PrivateSession],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An analyst who sends one statement with ever new classes of values (here integers of 1, 2, ... 18 digits)
    must not grow the session without bound: what plan once keeps is bounded as the prepared plans are, and a
    statement whose template was dropped is learnt and reused again."""
    planned_once, full_path = sessions
    monkeypatch.setattr(dpsql.session, "_PREPARED_CACHE", 4)
    sql = "SELECT COUNT(*) FROM t WHERE big > ?"
    for digits in range(1, 19):
        planned_once.prepare(sql, (10 ** (digits - 1) + 1,))
        assert len(planned_once._templates) <= 4
        assert len(planned_once._private_shapes) <= 4, "plan once's memory grows with every class of values"
    _same(planned_once, full_path, sql, [(10**17 + 2,), (10**17 + 3,), (11,), (12,), (13,)])
    assert planned_once._planned_once(sql, (14,)) is not None


# -- the server's extended protocol ------------------------------------------------------------------------------------

def _served(policy: Path, plan_once: bool, monkeypatch: pytest.MonkeyPatch,
            opened: list[PrivateSession]) -> RunningServer:
    """The server over `policy`, its sessions seeded (and planning once or not, each put in `opened`), its
    engine's ranking fixed."""
    def session(*args: Any, **options: Any) -> PrivateSession:
        opened.append(PrivateSession(*args, rng=seeded(7), plan_once=plan_once, **options))
        return opened[-1]
    monkeypatch.setattr(support, "DpsqlServer", functools.partial(DpsqlServer, session_factory=session))
    engine = build_engine(load_policy(policy), bounding_seed=1)
    return RunningServer(policy, ServerConfig(port=0), engine=engine).start()


def _asked_over_the_wire(running: RunningServer, sql: str, sequence: list[tuple[Any, ...]]) -> list[Any]:
    """What a psycopg client sees: each answer (its rows, and the notice of its cost), with the statement prepared
    on the server from its third execution (Parse once, then Bind and Execute), its parameters sent in text and
    in binary, and the session's epsilon and intervals SET between executions."""
    seen: list[Any] = []
    with psycopg.connect(server_dsn(running), autocommit=True, prepare_threshold=2) as conn:
        conn.add_notice_handler(lambda diag: seen.append(diag.message_primary))
        for i, parameters in enumerate(sequence):
            if i == len(sequence) // 2:
                conn.execute("SET dpsql.epsilon = 0.25")
            if i == 3 * len(sequence) // 4:
                conn.execute("SET dpsql.intervals = off")
            binary = sql.replace("%s", "%b") if i % 3 == 2 else sql
            try:
                seen.append(conn.execute(binary, parameters).fetchall())
            except psycopg.Error as refused:
                seen.append(("refused", refused.sqlstate, str(refused)))
    return seen


def test_the_server_answers_as_the_full_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two servers over two copies of the sample, their sessions seeded alike, one planning once: a psycopg client
    asking a statement with new values (ints that psycopg sends as int2, int4, int8 or numeric by their size,
    floats, decimals; text and binary), prepared on the server, with SET between executions, sees the same rows,
    refusals and notices from both, and both ledgers hold the same charges."""
    sql = "SELECT department, COUNT(*), AVG(cost) FROM visits WHERE age > %s AND cost < %s GROUP BY department"
    sequence = [(30, 1000.5), (31, 1000.25), (45, 1500.75), (2**40, 1000.5), (32, D("1000.50")), (33, D("1001.50")),
                (300, 999.5), (301, 998.5), (-5, 1000.5), (34, 2**63), (35, 1000.5), (36, 1200.5)]
    seen, history, opened = [], [], []
    for plan_once in (True, False):
        policy = server_policy(tmp_path / str(plan_once))
        running = _served(policy, plan_once, monkeypatch, opened)
        try:
            seen.append(_asked_over_the_wire(running, sql, sequence))
        finally:
            running.stop()
        history.append([(c.epsilon, c.delta, c.query, c.note) for c in server_charges(policy)])
    assert seen[0] == seen[1]
    assert history[0] == history[1] and len(history[0]) >= len(sequence) - 2
    assert _reused(opened[0]) >= 2 and not _reused(opened[1])


def test_executemany_as_the_full_path(tmp_path: Path) -> None:
    """The DB-API's executemany over one statement and many values, with the policy's measurement store (the
    DB-API's default): values asked again are derived from what was released. The same last rows, and the same
    charges and notes in both ledgers."""
    seen, history = [], []
    for plan_once in (True, False):
        folder = tmp_path / str(plan_once)
        folder.mkdir()
        with dpsql.connect(_write_table(folder), "tester", epsilon=EPSILON, rng=seeded(7),
                           bounding_seed=1) as connection:
            connection.session.plan_once = plan_once
            cursor = connection.cursor()
            cursor.executemany("SELECT code, COUNT(*), AVG(x) FROM t WHERE n > ? AND x < ? GROUP BY code",
                               [(10, 5.5), (20, 6.5), (30, 7.5), (40, 8.5), (20, 6.5), (10, 5.5)])
            seen.append((cursor.fetchall(), cursor.intervals))
            history.append(_charges(connection.session))
            if plan_once:
                assert _reused(connection.session) == 1
    assert seen[0] == seen[1] and history[0] == history[1] and len(history[0]) == 6
    assert any(note for *_, note in history[0]), "no answer was derived from released measurements"
