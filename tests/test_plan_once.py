"""Plan once (session.py, analysis/plan_once.py): a statement planned once and run with new values answers, refuses
and charges exactly as the full path does for each value.

Two sessions over two copies of the sample (each its own ledger), seeded alike: one plans once, one never does. Each
asks the same statements with the same values in the same order; every answer (rows, intervals), refusal (its
message) and charge must be the same. The values are the adversarial ones: zero, signs, the edges of every integer
type, the largest doubles, NaN and infinities, -0.0, NULL, booleans, decimals, text (typed and untyped) and dates.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.support import create_ledger, seeded
from dpsql.errors import Error
from dpsql.session import PrivateSession
from dpsql.sql.parse import TextParameter
from tests.conftest import VISITS_FILES
from tests.sizes import cases

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
EPSILON = 0.01

# Every value a parameter may take: the classes plan once reuses, and those it must not.
VALUES: tuple[Any, ...] = (
    30, 31, 45, 0, 1, -1, -5, 127, 128, -128, -129, 2**31 - 1, 2**31, -2**31, 2**63 - 1, 2**63, -2**63, -2**63 - 1,
    2**64, 2**127 - 1, 2**127, -2**127, 10**39, 10**40, 1000.5, 1000.25, 1500.75, 0.0, -0.0, -1000.5, 1e308, -1e308,
    5e-324, 1e15, 123456789.125, float("nan"), float("inf"), float("-inf"), None, True, False,
    decimal.Decimal("1000.50"), decimal.Decimal("-0"), decimal.Decimal("1E+5"), decimal.Decimal("NaN"),
    TextParameter("30"), TextParameter("1000.5"), TextParameter("abc"), "30", "1000.5",
    datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1, 12), 2**1000,
)

# Positions where the plan cannot depend on the value: planned once for each class of values.
REUSED = (
    "SELECT department, COUNT(*), AVG(cost) FROM visits WHERE age > ? AND cost < ? GROUP BY department",
    "SELECT d.specialty_group, COUNT(*), AVG(v.cost) FROM visits v JOIN departments d "
    "ON v.department = d.department WHERE v.age > ? AND v.cost < ? GROUP BY d.specialty_group",
    "SELECT COUNT(*), SUM(length_of_stay) FROM visits WHERE age BETWEEN ? AND ?",
    "SELECT region, COUNT(*) FROM visits WHERE NOT (age <= ?) OR cost IN (?, 100.5) GROUP BY region",
    "SELECT sex, MEDIAN(cost) FROM visits WHERE (cost >= ?) AND age <> ? GROUP BY sex",
)

# Positions where the value can change the plan (its bounds, costs, types, work, rows): never planned once.
FULL_PATH = (
    "SELECT SUM(cost * ?), COUNT(*) FROM visits WHERE age > ?",
    "SELECT COUNT(*) FROM visits WHERE age > ? LIMIT ?",
    "SELECT COUNT(*) FROM visits WHERE department LIKE ? AND age > ?",
    "SELECT COUNT(*) FROM visits WHERE age + ? > 40 AND cost < ?",
    "SELECT COUNT(*) FROM visits WHERE CASE WHEN age > ? THEN cost < ? ELSE FALSE END",
    "SELECT department, COUNT(*) FROM visits WHERE age > ? GROUP BY department HAVING COUNT(*) > ?",
    "SELECT COUNT(*), AVG(LEAST(cost, ?)) FROM visits WHERE age > ?",
    "SELECT d.floor, COUNT(*) FROM visits v JOIN departments d ON v.department = d.department AND d.floor > ? "
    "WHERE v.age > ? GROUP BY d.floor",
    "SELECT COUNT(*) FROM visits v JOIN departments d ON v.department = d.department WHERE d.beds > ? AND v.age > ?",
    "SELECT COUNT(*) FROM visits WHERE age > (SELECT ? ) AND cost < ?",
)

_FIRST, _SECOND = 30, 1000.5  # the other parameter's value while one parameter sweeps VALUES


def _policy(folder: Path) -> Path:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, folder / name)
    return create_ledger(folder / "visits.toml")


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[tuple[PrivateSession, PrivateSession]]:
    once, full = tmp_path / "once", tmp_path / "full"
    once.mkdir()
    full.mkdir()
    with contextlib.closing(PrivateSession(_policy(once), "tester", rng=seeded(7), bounding_seed=1,
                                           epsilon=EPSILON)) as planned_once, \
            contextlib.closing(PrivateSession(_policy(full), "tester", rng=seeded(7), bounding_seed=1,
                                              epsilon=EPSILON, plan_once=False)) as full_path:
        yield planned_once, full_path


def _outcome(session: PrivateSession, sql: str, parameters: tuple[Any, ...]) -> tuple[Any, ...]:
    """What the analyst sees: the answer and its cost, or the refusal's kind and message."""
    try:
        result = session.execute(sql, parameters)
    except Error as refused:
        return "refused", type(refused).__name__, str(refused)
    columns = [(c.name, c.type, c.noisy) for c in result.columns]
    return "answered", columns, result.rows, result.intervals, result.noise_std, result.cost, result.released_groups


def _parameter_lists(sql: str, values: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The values for each of the statement's parameters in turn, the others at a fixed value; each list twice, so
    that the second time every class has its template."""
    count = sql.count("?")
    fixed = (_FIRST, _SECOND, _FIRST)[:count]
    lists = [tuple(value if i == place else fixed[i] for i in range(count))
             for place in range(count) for value in values]
    return lists + lists


def _same(planned_once: PrivateSession, full_path: PrivateSession, sql: str, values: tuple[Any, ...]) -> None:
    for parameters in _parameter_lists(sql, values):
        assert _outcome(planned_once, sql, parameters) == _outcome(full_path, sql, parameters), (sql, parameters)
    charges = [(c.epsilon, c.delta, c.query) for c in planned_once.history("tester")]
    assert charges == [(c.epsilon, c.delta, c.query) for c in full_path.history("tester")]


def _values(count: int) -> tuple[Any, ...]:
    """`count` of VALUES, spread over the whole list (the first and the last always)."""
    step = max(1, len(VALUES) // count)
    return tuple(dict.fromkeys([*VALUES[::step], VALUES[-1]]))


@pytest.mark.slow
@pytest.mark.parametrize("sql", REUSED)
def test_planned_once_as_the_full_path(sessions: tuple[PrivateSession, PrivateSession], sql: str) -> None:
    planned_once, full_path = sessions
    _same(planned_once, full_path, sql, _values(cases(len(VALUES), 12)))
    assert any(t is not None for t in planned_once._templates.values()), "nothing was planned once"


@pytest.mark.slow
@pytest.mark.parametrize("sql", FULL_PATH)
def test_value_dependent_positions_take_the_full_path(sessions: tuple[PrivateSession, PrivateSession],
                                                      sql: str) -> None:
    planned_once, full_path = sessions
    _same(planned_once, full_path, sql, _values(cases(len(VALUES), 8)))
    assert all(t is None for t in planned_once._templates.values())


def test_grouped_query_planned_once(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """The benchmark's query (a few values, fast): planned once, the same answers and charges as the full path."""
    planned_once, full_path = sessions
    sql = REUSED[0]
    _same(planned_once, full_path, sql, (30, 41, 52, 2**40, -7, 1000.5, 1234.75, None))
    reused = [t for t in planned_once._templates.values() if t is not None]
    assert len(reused) >= 2  # (int, 2 digits) and (float, 4.1 digits) at least
    # Both values new each time, as the benchmark asks: the template is checked on the second pair, then filled in.
    for parameters in [(30, 1000.5), (41, 1200.5), (52, 1300.5), (45, 1000.25), (33, 1100.75), (34, 1100.5)]:
        assert _outcome(planned_once, sql, parameters) == _outcome(full_path, sql, parameters), parameters
    assert planned_once._planned_once(sql, (35, 1100.5)) is not None


def test_sum_times_parameter_never_planned_once(sessions: tuple[PrivateSession, PrivateSession]) -> None:
    """A parameter that scales the summed value changes the sensitivity: each value is planned afresh, its cost and
    refusal the full path's."""
    planned_once, full_path = sessions
    _same(planned_once, full_path, FULL_PATH[0], (1, 2, 10**6, 10**12, -3, 0.5))
    assert all(t is None for t in planned_once._templates.values())


def test_templates_are_per_session(sessions: tuple[PrivateSession, PrivateSession], tmp_path: Path) -> None:
    """Another analyst's session finds no template of this one's statements: nothing is shared between analysts."""
    planned_once, _ = sessions
    planned_once.execute(REUSED[0], (30, 1000.5))
    planned_once.execute(REUSED[0], (31, 1000.7))  # the same classes: the template is made, and checked
    with contextlib.closing(PrivateSession(planned_once.policy, "other", rng=seeded(1), bounding_seed=1,
                                           engine=planned_once.engine, epsilon=EPSILON)) as other:
        assert other._planned_once(REUSED[0], (32, 1000.9)) is None
    assert planned_once._planned_once(REUSED[0], (32, 1000.9)) is not None


@pytest.mark.slow  # about 1.5 s: a measurement store on both sides
def test_planned_once_with_released_measurements(tmp_path: Path) -> None:
    """With a measurement store (answers derived from released measurements, planning/reuse.py), the relation's key
    is made for each value: derived answers and their charges are the full path's."""
    once, full = tmp_path / "once", tmp_path / "full"
    once.mkdir()
    full.mkdir()
    with contextlib.closing(PrivateSession(_policy(once), "tester", rng=seeded(3), bounding_seed=1, epsilon=EPSILON,
                                           reuse=True)) as planned_once, \
            contextlib.closing(PrivateSession(_policy(full), "tester", rng=seeded(3), bounding_seed=1,
                                              epsilon=EPSILON, reuse=True, plan_once=False)) as full_path:
        assert planned_once.measurements is not None
        _same(planned_once, full_path, REUSED[0], (30, 41, 30, 1000.5, 1234.75, 1000.5))
        assert any(t is not None for t in planned_once._templates.values())
        assert any(c.note for c in planned_once.history("tester")), "no answer was derived"
