"""Releasing group keys without an aggregate: SELECT DISTINCT k and GROUP BY k with no aggregate (check.py turns the
first into the second). Public keys: every declared value, no data read, no charge. Other keys: those that pass
partition selection, charged like the COUNT(*) that selects them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from scipy.stats import binom

import dpsql
from benchmarks.support import seeded, write_csv, write_policy
from dpsql.errors import QueryRejected
from dpsql.frontends.cli import main
from dpsql.release.cells import release
from dpsql.session import PrivateSession
from tests.conftest import create_ledger
from tests.sizes import cases

REGIONS = ["north", "south", "east", "west", "central"]


def _session(policy: Path, seed: int = 5) -> PrivateSession:
    return PrivateSession(policy, "tester", rng=seeded(seed), bounding_seed=3)


def test_public_keys_are_the_declared_values_without_reading_or_charging(visits_policy: Path,
                                                                         monkeypatch) -> None:
    session = _session(visits_policy)
    try:
        def no_data(sql: str) -> list:
            raise AssertionError("the data was read")
        monkeypatch.setattr(session.engine, "run", no_data)
        for sql in ("SELECT DISTINCT region FROM visits", "SELECT region FROM visits GROUP BY region",
                    "SELECT DISTINCT region FROM visits WHERE cost > 4000"):
            result = session.execute(sql)
            assert [row[0] for row in result.rows] == REGIONS
            assert result.cost.epsilon == 0 and result.cost.delta == 0
        both = session.execute("SELECT DISTINCT sex, smoker AS s FROM visits ORDER BY s DESC, sex LIMIT 3")
        assert both.rows == [("F", True), ("M", True), ("F", False)]
        assert [c.name for c in both.columns] == ["sex", "s"] and both.intervals[0] == (None, None)
        assert session.history() == [] and session.spending("tester").epsilon_spent == 0
    finally:
        session.close()


def _policy(folder: Path, rows: list[tuple], delta: float = 1e-6) -> Path:
    write_csv(folder / "t.csv", ["pid", "city", "region"], rows)
    return create_ledger(write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 1,
        "columns": {"pid": {"type": "int"}, "city": {"type": "text"},
                    "region": {"type": "text", "values": ["n", "s"]}}}},
        {"epsilon": 1000, "delta": 0.1, "query_epsilon": 1, "query_delta": delta}))


def test_selected_keys_are_those_a_count_would_release_and_cost_the_same(tmp_path: Path) -> None:
    rows = [(u, f"c{u % 7}", "ns"[u % 2]) for u in range(300)] + [(1000, "lonely", "n")]
    policy = _policy(tmp_path, rows)
    keys = _session(policy, seed=9)
    counts = _session(policy, seed=9)
    try:
        released = keys.execute("SELECT DISTINCT city FROM t")
        counted = counts.execute("SELECT city, COUNT(*) FROM t GROUP BY city")
        # the same selection: one count of all rows, the same noise and threshold (the engine's group order, and
        # so which group gets which draw, differs between the two queries)
        assert released.plan.selection == counted.plan.selection
        assert [m.mechanism for m in released.plan.measurements] == [counted.plan.measurements[0].mechanism]
        assert sorted(row[0] for row in released.rows) == sorted(row[0] for row in counted.rows)
        assert sorted(row[0] for row in released.rows) == [f"c{i}" for i in range(7)]  # ~43 units each; not lonely
        assert released.cost == counted.cost and released.cost.delta > 0
        assert released.cost.epsilon == 1 and released.columns[0].noisy is False
        mixed = keys.execute("SELECT region, city FROM t GROUP BY region, city ORDER BY city, region")
        assert {row[0] for row in mixed.rows} <= {"n", "s"} and len(mixed.rows) == 14
    finally:
        keys.close()
        counts.close()


def test_a_key_only_one_unit_holds_appears_at_most_delta_of_the_time(tmp_path: Path) -> None:
    """One unit (m = 1) holds the key `lonely`: over RUNS releases (fresh noise each) it may appear with probability
    at most delta; the count of appearances must stay below Binomial(RUNS, delta)'s 1 - 1e-4 quantile."""
    delta, runs = 0.05, cases(2000, floor=500)
    policy = _policy(tmp_path, [(u, "common", "n") for u in range(200)] + [(1000, "lonely", "s")], delta=delta)
    session = _session(policy)
    try:
        prepared = session.prepare("SELECT DISTINCT city FROM t")
        rows = session.engine.run(prepared.bounded.sql)
        rng = seeded(21)
        seen = sum(("lonely",) in release(prepared.plan, rows, rng).keys for _ in range(runs))
    finally:
        session.close()
    assert seen <= binom.ppf(1 - 1e-4, runs, delta)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT DISTINCT patient_id FROM visits", "grouping by the privacy unit"),
    ("SELECT DISTINCT COUNT(*) FROM visits GROUP BY region", "one row per group already"),
    ("SELECT DISTINCT ON (region) region, age FROM visits", "DISTINCT ON"),
    ("SELECT age FROM visits", "not a GROUP BY key"),
    ("SELECT DISTINCT cost + age FROM visits", None),  # any vetted row expression is a key: selected, charged
])
def test_what_is_refused_and_what_is_a_key(visits_policy: Path, sql: str, message: str | None) -> None:
    session = _session(visits_policy)
    try:
        if message is None:
            assert session.prepare(sql).plan.selection is not None
        else:
            with pytest.raises(QueryRejected, match=message):
                session.prepare(sql)
    finally:
        session.close()


def test_keys_over_a_join_and_through_the_front_ends(visits_policy: Path) -> None:
    with dpsql.connect(visits_policy, "tester") as con:
        cursor = con.cursor().execute("SELECT DISTINCT r.urban FROM visits v JOIN regions r ON v.region = r.region")
        assert sorted(cursor.fetchall()) == [(False,), (True,)] and cursor.cost.epsilon == 0
    out = CliRunner().invoke(main, ["query", "SELECT DISTINCT region FROM visits", "--policy", str(visits_policy),
                                    "--analyst", "tester"])
    assert out.exit_code == 0 and all(region in out.output for region in REGIONS)


def test_keys_through_a_cte_and_a_per_unit_subquery(visits_policy: Path, monkeypatch) -> None:
    """The normaliser's shapes reach key release too: a CTE's public key, and a per-unit count, whose values the
    policy bounds (1 to m = 5), are all declared values, released without reading the data."""
    session = _session(visits_policy)
    try:
        monkeypatch.setattr(session.engine, "run", lambda sql: (_ for _ in ()).throw(AssertionError("read")))
        cte = session.execute("WITH v AS (SELECT region, cost FROM visits WHERE cost > 10) SELECT DISTINCT region "
                              "FROM v ORDER BY region LIMIT 2")
        assert cte.rows == [("central",), ("east",)] and cte.cost.epsilon == 0
        per_unit = session.execute("SELECT DISTINCT n FROM (SELECT patient_id, COUNT(*) AS n FROM visits "
                                   "GROUP BY patient_id)")
        assert sorted(per_unit.rows) == [(n,) for n in range(1, 6)] and per_unit.cost.epsilon == 0
    finally:
        session.close()


def test_a_constant_beside_the_keys_is_not_read_as_a_group_by_position(visits_policy: Path) -> None:
    """SELECT DISTINCT region, 1 was GROUP BY region, 1: position 1 is region again, and every declared region came
    twice (found by the red team)."""
    session = _session(visits_policy)
    try:
        result = session.execute("SELECT DISTINCT region, 1 AS one, 'x' AS t FROM visits")
        assert [tuple(row) for row in result.rows] == [(region, 1, "x") for region in REGIONS]
        assert result.cost.epsilon == 0
    finally:
        session.close()
