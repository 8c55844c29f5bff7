"""ROLLUP, CUBE and GROUPING SETS (issue 36, analysis/grouping_sets.py): several groupings released together.

Checked here: which groupings each form stands for, and the refusals; that one unit moves the vector of all the
groupings' cells by at most the planned sensitivity (L1 G m with Laplace noise, L2 sqrt(G) m with Gaussian noise),
and that the bound is reached; which groups are released (every public combination of each grouping, the others
through partition selection, nothing else); GROUPING() as DuckDB computes it; the work of aggregating into each
grouping. benchmarks/exactness.py compares generated ROLLUP, CUBE and GROUPING SETS queries with plain DuckDB.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.support import open_session, write_csv, write_policy
from dpsql.analysis.check import check
from dpsql.errors import QueryRejected
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import MechanismKind, load_policy
from dpsql.sql.parse import parse
from tests.sizes import cases
from tests.test_sensitivity import measurements

TABLE = {"source": "t.csv", "privacy_unit": "pid", "columns": {
    "pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]}, "city": {"type": "text"},
    "flag": {"type": "bool"}, "x": {"type": "float", "lower": -5, "upper": 10}}}


def _policy(folder: Path, units: list[list[tuple]], m: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "t.csv", ["pid", "grp", "city", "flag", "x"],
              [(pid, *row) for pid, rows in enumerate(units, start=1) for row in rows])
    return write_policy(folder / "p.toml", {"t": {**TABLE, "max_rows_per_unit": m}},
                        {"epsilon": 1e9, "delta": 1e-3, "query_delta": 1e-6})


def _checked(sql: str, tmp_path: Path):
    return check(parse(sql), load_policy(_policy(tmp_path, [[("a", "x", True, 1.0)]], 2)), VOCABULARY)


@pytest.mark.parametrize(("group", "groupings"), [
    ("ROLLUP (grp, city)", ((0, 1), (0,), ())),
    ("CUBE (grp, city)", ((0, 1), (0,), (1,), ())),
    ("GROUPING SETS ((grp), (city, flag), ())", ((0,), (1, 2), ())),
    ("grp, ROLLUP (city, flag)", ((0, 1, 2), (0, 1), (0,))),
    ("ROLLUP (grp), CUBE (city)", ((0, 1), (0,), (1,), ())),
    ("GROUPING SETS (ROLLUP (grp, city), (flag))", ((0, 1), (0,), (), (2,))),
])
def test_each_form_stands_for_its_groupings(tmp_path: Path, group: str, groupings: tuple) -> None:
    query = _checked(f"SELECT COUNT(*) FROM t GROUP BY {group}", tmp_path)
    assert query.groupings == groupings
    assert query.keys[-1].grouping_id and len(query.keys) == 1 + max(i for g in groupings for i in g) + 1


@pytest.mark.parametrize(("group", "message"), [
    ("GROUPING SETS ((grp), (grp))", "listed twice"),
    ("GROUPING SETS ((grp, city), (city, grp))", "listed twice"),
    ("CUBE (grp, city, flag, x, pid, grp)", "at most 32"),
    ("ROLLUP (pid)", "privacy unit"),
])
def test_what_cannot_be_released_is_refused_with_its_reason(tmp_path: Path, group: str, message: str) -> None:
    with pytest.raises(QueryRejected, match=message):
        _checked(f"SELECT COUNT(*) FROM t GROUP BY {group}", tmp_path)


def _measured(policy: Path, sql: str, mechanism: MechanismKind = MechanismKind.LAPLACE):
    return measurements(policy, sql, 3, mechanism)


QUERIES = [
    "SELECT grp, flag, COUNT(*), SUM(x) FROM t GROUP BY ROLLUP (grp, flag)",
    "SELECT grp, city, COUNT(*), AVG(x), COUNT(DISTINCT pid) FROM t GROUP BY CUBE (grp, city)",
    "SELECT grp, COUNT(DISTINCT city), SUM(DISTINCT x) FROM t GROUP BY GROUPING SETS ((grp), (), (city, grp))",
    "SELECT flag, grp, MEDIAN(x), COUNT(x) FROM t WHERE x > -3 GROUP BY flag, ROLLUP (grp)",
]
row = st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["x", "y", "z"]), st.booleans(),
                st.one_of(st.none(), st.floats(min_value=-50, max_value=50, allow_nan=False)))


@settings(max_examples=cases(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(row, max_size=6), min_size=1, max_size=5), m=st.integers(1, 3),
       removed=st.integers(0, 4), query=st.sampled_from(QUERIES),
       mechanism=st.sampled_from([MechanismKind.LAPLACE, MechanismKind.GAUSSIAN]))
def test_one_unit_moves_all_groupings_cells_by_at_most_the_sensitivity(tmp_path_factory, units, m, removed, query,
                                                                     mechanism) -> None:
    removed %= len(units)
    base = tmp_path_factory.mktemp("sets")
    query_plan, full = _measured(_policy(base / "with", units, m), query, mechanism)
    _, neighbour = _measured(_policy(base / "without", [u if i != removed else [] for i, u in enumerate(units)], m),
                             query, mechanism)
    for j, measurement in enumerate(query_plan.measurements):
        if measurement.spec.kind.value == "quantile":
            continue  # the exponential mechanism's own calibration: G m rows (tests/test_quantile.py's argument)
        changes = [abs(full.get(g, [0] * 99)[j] - neighbour.get(g, [0] * 99)[j]) for g in set(full) | set(neighbour)]
        if mechanism is MechanismKind.GAUSSIAN:
            squared = measurement.mechanism.squared or measurement.sensitivity ** 2
            assert sum(c * c for c in changes) <= squared, (query, measurement.spec.label)
        else:
            assert sum(changes) <= measurement.sensitivity, (query, measurement.spec.label, sum(changes))


def test_the_bound_is_reached_in_every_grouping(tmp_path: Path) -> None:
    """A unit with m rows in one group of each of G groupings moves the counts by G m in L1 (the Laplace noise's
    sensitivity) and by sqrt(G) m in L2 (the Gaussian's)."""
    units = [[("a", "x", True, 1.0)] * 3, [("b", "y", False, 2.0)]]
    with_unit, without = _policy(tmp_path / "w", units, 3), _policy(tmp_path / "o", [[], units[1]], 3)
    sql = "SELECT grp, city, COUNT(*) FROM t GROUP BY CUBE (grp, city)"  # four groupings
    for mechanism in (MechanismKind.LAPLACE, MechanismKind.GAUSSIAN):
        query_plan, full = _measured(with_unit, sql, mechanism)
        _, neighbour = _measured(without, sql, mechanism)
        changes = [abs(full.get(g, [0])[0] - neighbour.get(g, [0])[0]) for g in set(full) | set(neighbour)]
        (count,) = query_plan.measurements
        if mechanism is MechanismKind.LAPLACE:
            assert sum(changes) == count.sensitivity == 4 * 3
        else:
            assert sum(c * c for c in changes) == count.mechanism.squared == 4 * 3 ** 2
            assert math.isqrt(count.mechanism.squared) == 2 * 3  # sqrt(G) m


@pytest.fixture
def session(tmp_path: Path):
    units = [[("a", "x", True, 1.0), ("b", "y", False, 2.0)] for _ in range(60)]
    session = open_session(_policy(tmp_path, units, 2), 4)
    yield session
    session.close()


def test_every_public_combination_of_each_grouping_is_released_and_nothing_else(session) -> None:
    result = session.execute("SELECT grp, flag, COUNT(*) FROM t GROUP BY ROLLUP (grp, flag)", epsilon=1.0)
    expected = {(g, f) for g in "abc" for f in (False, True)} | {(g, None) for g in "abc"} | {(None, None)}
    assert {row[:2] for row in result.rows} == expected and result.cost.delta == 0  # no partition selection
    mixed = session.execute("SELECT grp, city, COUNT(*) FROM t GROUP BY CUBE (grp, city)", epsilon=1.0)
    public = {(g, None) for g in "abc"} | {(None, None)}  # the groupings without city
    found = {row[:2] for row in mixed.rows}
    assert public <= found and mixed.cost.delta > 0
    assert found - public <= {("a", "x"), ("b", "y"), (None, "x"), (None, "y")}  # city: only groups with rows


def test_grouping_is_what_duckdb_computes(session, tmp_path: Path) -> None:
    sql = ("SELECT grp, flag, GROUPING(grp) AS g1, GROUPING(flag, grp) AS g2, GROUPING_ID(grp, flag) AS g3 FROM t "
           "GROUP BY CUBE (grp, flag)")
    ours = {row[:2]: row[2:] for row in session.execute(sql, epsilon=1.0).rows}
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_csv('{tmp_path / 't.csv'}')")
    theirs = {row[:2]: row[2:] for row in con.execute(sql).fetchall()}
    assert theirs and all(ours[key] == theirs[key] for key in theirs), (ours, theirs)
    assert {values for values in theirs.values()} == {(0, 0, 0), (0, 2, 1), (1, 1, 2), (1, 3, 3)}


def test_each_row_is_aggregated_into_each_grouping_in_the_persons_work(session) -> None:
    one = session.prepare("SELECT grp, COUNT(*) FROM t GROUP BY grp").plan.query.work
    three = session.prepare("SELECT grp, flag, COUNT(*) FROM t GROUP BY ROLLUP (grp, flag)").plan.query.work
    term = next(t for t in three.terms if str(t.what).startswith("aggregating each row into 3 groupings"))
    assert term.rows == 2 and not any(str(t.what).startswith("aggregating each row") for t in one.terms)
    selected = session.prepare("SELECT grp, city, COUNT(*) FROM t GROUP BY CUBE (grp, city)").plan.query.work
    assert selected.release[0].rows == 2 * 2  # the two groupings with city, each up to m = 2 groups of a person


def test_explain_states_the_groupings_and_the_budget_split(session) -> None:
    from dpsql.frontends.explain import explain

    text = explain(session.prepare("SELECT grp, city, COUNT(*) FROM t GROUP BY CUBE (grp, city)").plan)
    assert "4 groupings released together, (grp, city), (grp), (city), ()" in text
    assert "one unit is 4 x 2 rows" in text and "4 equal shares at 2 rows each" in text
    assert "partition selection" in text and "4 public group(s)" in text
