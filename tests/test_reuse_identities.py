"""Reuse derives only what is exactly the same quantity (planning/reuse.py, rules 1-3): on exact (noise-free)
measurements, every estimate a query's measurement gets from stored ones equals that measurement, cell for cell, and
queries of other rows (another filter, bound, look-ahead, data version, ranking, per-group cap) never share a
relation.

The data has what makes a wrong identity show: units with more rows than the cap (so the cap's choice matters), a
key with values outside its declared ones and NULLs (the OTHER cells), NULL and out-of-bounds values of the summed
column (clamping, COUNT(x) against COUNT(*)).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.support import Table, column, create_ledger, seeded, write_dataset, write_policy
from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.dp.noise import RandomSource
from dpsql.planning.plan import candidate_plans
from dpsql.planning.reuse import (
    OTHER,
    Grouping,
    StoredMeasurement,
    cells_per_group,
    combine,
    group_sums,
    stored_source,
)
from dpsql.planning.spending import targets_of
from dpsql.release.cells import release
from dpsql.rewrite.passes import rewrite
from dpsql.session import PrivateSession
from dpsql.store.measurements import MeasurementStore, NewMeasurement

TABLE = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b")), column("h", "bool"),
                           column("x", "float", 0, 10), column("y", "int", 0, 5, nullable=False)), max_rows=3)


def _rows(seed: int = 5) -> list[tuple]:
    r = random.Random(seed)
    rows = []
    for uid in range(1, 61):
        for _ in range(r.choice([1, 2, 3, 4, 6, 9])):
            rows.append((uid, r.choice(["a", "b", "c", None]), r.choice([True, False, None]),
                         r.choice([None, -3.0, 12.5, round(r.uniform(0, 10), 3)]), r.randint(0, 7)))
    return rows


@dataclass(frozen=True)
class _Silent(LaplaceMechanism):
    """A mechanism that adds nothing: its release is the exact bounded answer (its variance still weighs GLS)."""

    def sample(self, rng: RandomSource) -> int:
        return 0


def _silent(plan):
    return replace(plan, measurements=tuple(replace(m, mechanism=_Silent(max(m.sensitivity, 1), 1.0))
                                            for m in plan.measurements))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    policy = create_ledger(write_dataset(tmp_path_factory.mktemp("reuse"), TABLE, _rows()))
    opened = PrivateSession(policy, "alice", rng=seeded(1), bounding_seed=11,
                            measurements=MeasurementStore(None, "unused"))
    yield opened
    opened.close()


def _exact(session: PrivateSession, plan, grouping):
    """Every cell of every measurement of `plan`, exact (OTHER cells too)."""
    rows = session.engine.run(rewrite(plan, listed=session.engine.lists_earlier_rows).sql)
    return release(_silent(plan), rows, seeded(0), grouping).measured


def _stored(session: PrivateSession, sql: str, first_id: int) -> list[StoredMeasurement]:
    prepared = session.prepare(sql)
    plan = prepared.plan
    measured = _exact(session, plan, prepared.grouping)
    return [StoredMeasurement(first_id + j, "alice", None, m.spec.label, target, prepared.grouping,
                              LaplaceMechanism(max(m.sensitivity, 1), 1.0), m.spec.step, cells)
            for j, (m, target, cells) in enumerate(zip(plan.measurements, targets_of(plan), measured, strict=True))
            if cells is not None and target is not None]


def _derived(session: PrivateSession, stored_sql: str, target_sql: str) -> int:
    """Check every estimate of every way of measuring `target_sql` against its exact value; how many there were."""
    stored = _stored(session, stored_sql, 1)
    prepared = session.prepare(target_sql)
    assert prepared.relation == session.prepare(stored_sql).relation, "a pair of one relation"
    grouping = prepared.grouping
    sources = [stored_source(s, grouping, n) for s in stored if (n := cells_per_group(s, grouping)) is not None]
    checked = 0
    for candidate in candidate_plans(prepared.plan.query, prepared.plan.budget):
        exact = _exact(session, candidate, grouping)
        for j, target in enumerate(targets_of(candidate)):
            estimate = combine(target, sources) if target is not None else None
            if estimate is None:
                continue
            sums = [group_sums(sources[s].stored, grouping) for _, s in estimate]
            public = [exact[j][cell] for cell in grouping.cells() if cell in exact[j] and
                      all(v in d for v, d in zip(cell, grouping.domains, strict=True))]
            for g, truth in enumerate(public):
                value = sum((c * values[g] for (c, _), values in zip(estimate, sums, strict=True)), Fraction(0))
                assert value == truth, (candidate.measurements[j].spec.label, g, value, truth)
            checked += 1
    return checked


PAIRS = [  # (stored, asked, how many estimates at least): each identity of planning/functionals.py in use
    ("SELECT g, h, COUNT(*) FROM t GROUP BY g, h", "SELECT g, COUNT(*) FROM t GROUP BY g", 1),
    ("SELECT g, h, COUNT(*) FROM t GROUP BY g, h", "SELECT COUNT(*) FROM t", 1),
    ("SELECT g, COUNT(*), SUM(x), AVG(x) FROM t GROUP BY g", "SELECT COUNT(x), SUM(x) FROM t", 2),
    ("SELECT g, COUNT(*), COUNT(x), AVG(x) FROM t GROUP BY g", "SELECT g, COUNT(*) FROM t GROUP BY g", 1),
    ("SELECT h, SUM(x), VAR(x) FROM t GROUP BY h", "SELECT AVG(x), STDDEV(x) FROM t", 2),
    ("SELECT g, COUNT(*), SUM(y) FROM t GROUP BY g", "SELECT AVG(y) FROM t", 1),
    ("SELECT g, SUM(y) FROM t GROUP BY g", "SELECT SUM(y) FROM t", 1),
    ("SELECT g, COUNT(x), SUM(x) FROM t WHERE y > 2 GROUP BY g", "SELECT g, AVG(x) FROM t WHERE y > 2 GROUP BY g", 1),
    ("SELECT g, COUNT(DISTINCT uid) FROM t GROUP BY g", "SELECT g, COUNT(DISTINCT uid) FROM t GROUP BY g", 1),
]


@pytest.mark.parametrize(("stored", "asked", "least"), PAIRS)
def test_estimates_equal_the_exact_measurement(session, stored: str, asked: str, least: int) -> None:
    assert _derived(session, stored, asked) >= least


def test_distinct_counts_do_not_add_up_across_groups(session) -> None:
    """A unit in two groups is counted in both: the total of COUNT(DISTINCT uid) is no sum of its groups'."""
    stored = _stored(session, "SELECT g, COUNT(DISTINCT uid) FROM t GROUP BY g", 1)
    grouping = session.prepare("SELECT COUNT(DISTINCT uid) FROM t").grouping
    assert all(cells_per_group(s, grouping) is None for s in stored)


KEYS = ["g", "h"]
AGGREGATES = ["COUNT(*)", "COUNT(x)", "SUM(x)", "AVG(x)", "VAR(x)", "SUM(y)", "AVG(y)"]
FILTERS = ["", " WHERE y > 2", " WHERE x < 4 OR g = 'a'"]


def _query(keys: list[str], aggregates: list[str], where: str) -> str:
    listed = ", ".join([*keys, *aggregates])
    grouped = f" GROUP BY {', '.join(keys)}" if keys else ""
    return f"SELECT {listed} FROM t{where}{grouped}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored_keys=st.sets(st.sampled_from(KEYS)), asked_keys=st.sets(st.sampled_from(KEYS)),
       stored_aggregates=st.sets(st.sampled_from(AGGREGATES), min_size=1, max_size=3),
       asked_aggregates=st.sets(st.sampled_from(AGGREGATES), min_size=1, max_size=3),
       where=st.sampled_from(FILTERS))
def test_generated_estimates_equal_the_exact_measurement(session, stored_keys, asked_keys, stored_aggregates,
                                                         asked_aggregates, where) -> None:
    """Queries of one relation (the same filter; with a filter, the same keys: a filtered query's declared-values
    conditions and look-ahead depend on them)."""
    if where:
        asked_keys = stored_keys
    stored = _query(sorted(stored_keys), sorted(stored_aggregates), where)
    asked = _query(sorted(asked_keys), sorted(asked_aggregates), where)
    if session.prepare(stored).relation == session.prepare(asked).relation:
        _derived(session, stored, asked)
    else:
        assert where, "queries without a filter read the same rows"


# Near misses: the same SQL but for one thing that changes which rows are measured. Each must be another relation.
NEAR_MISSES = [
    ("SELECT COUNT(*) FROM t WHERE x > 1", "SELECT COUNT(*) FROM t WHERE x > 2"),
    ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t WHERE x > 1"),
    ("SELECT COUNT(*) FROM t WHERE x > 1", "SELECT g, COUNT(*) FROM t WHERE x > 1 GROUP BY g"),  # declared values
    ("SELECT COUNT(*) FROM t WHERE x > 1 OR y > 1", "SELECT COUNT(*) FROM t WHERE x > 1 AND y > 1"),
]
SAME = [  # spelled differently, the same rows
    ("SELECT COUNT(*) FROM t WHERE x > 1 AND y > 2", "SELECT COUNT(*) FROM t AS u WHERE u.y > 2 AND x > 1"),
    ("SELECT COUNT(*) FROM t", "SELECT g, SUM(x) FROM t GROUP BY g"),
]


@pytest.mark.parametrize(("first", "second"), NEAR_MISSES)
def test_other_rows_are_another_relation(session, first: str, second: str) -> None:
    assert session.prepare(first).relation != session.prepare(second).relation


@pytest.mark.parametrize(("first", "second"), SAME)
def test_the_same_rows_spelled_otherwise_are_one_relation(session, first: str, second: str) -> None:
    assert session.prepare(first).relation == session.prepare(second).relation


def test_a_different_clamp_is_another_quantity(session) -> None:
    """SUM(LEAST(x, 5)) and SUM(x) read the same rows, but not the same values (nor the same grid)."""
    first, second = (targets_of(session.prepare(sql).plan) for sql in ("SELECT SUM(x) FROM t",
                                                                         "SELECT SUM(LEAST(x, 5)) FROM t"))
    assert not set(first) & set(second)


def _policy(folder: Path, rows: list[tuple], **table: object) -> Path:
    folder.mkdir()
    write_dataset(folder, TABLE, rows)
    declaration = {**TABLE.declaration(), **table}
    return create_ledger(write_policy(folder / "policy.toml", {"t": declaration}))


def test_the_look_ahead_is_part_of_the_relation(tmp_path: Path) -> None:
    """With a tight work bound, a query with more expressions gets a shorter look-ahead for its filter: the filtered
    cap then keeps other rows of a unit whose passing rows come late, and the exact counts differ. Their relations
    must too."""
    # 100 units of 20 rows, one of which passes: a unit counts when that row is within the look-ahead
    rows = [(uid, "a", True, 9.0 if i == 0 else 1.0, 1) for uid in range(1000, 1100) for i in range(20)] + _rows()
    policy = _policy(tmp_path / "tight", rows)
    with policy.open("a") as handle:  # room for one row past the lists (8) with COUNT alone, none beside the SUM (7)
        handle.write("\n[engine]\nmax_person_slowdown = 0.0019\n")
    session = PrivateSession(policy, "alice", rng=seeded(1), bounding_seed=3)
    try:
        plain = session.prepare("SELECT COUNT(*) FROM t WHERE x > 5")
        costly = session.prepare("SELECT COUNT(*), SUM(y * y + y * 2 + y * 3 + y * 4) FROM t WHERE x > 5")
        assert plain.plan.query.work.examined != costly.plan.query.work.examined
        counts = [session.engine.run(rewrite(replace(p.plan, measurements=p.plan.measurements[:1])).sql)[0][0]
                  for p in (plain, costly)]
        assert counts[0] != counts[1], "the look-ahead changed the rows kept"
        with_store = PrivateSession(policy, "alice", engine=session.engine, measurements=MeasurementStore(None, ""))
        assert with_store.prepare("SELECT COUNT(*) FROM t WHERE x > 5").relation != with_store.prepare(
            "SELECT COUNT(*), SUM(y * y + y * 2 + y * 3 + y * 4) FROM t WHERE x > 5").relation
    finally:
        session.close()


def test_per_group_bounds_make_the_grouping_part_of_the_relation(tmp_path: Path) -> None:
    policy = _policy(tmp_path / "per_group", _rows(), max_groups_per_unit=1)
    session = PrivateSession(policy, "alice", bounding_seed=3, reuse=True)
    try:
        assert session.prepare("SELECT g, COUNT(*) FROM t GROUP BY g").relation != \
            session.prepare("SELECT COUNT(*) FROM t").relation
        assert session.prepare("SELECT g, COUNT(*) FROM t GROUP BY g").grouping.others is False
    finally:
        session.close()


def test_another_ranking_or_data_version_is_another_relation(tmp_path: Path) -> None:
    """Two engines that drew their own secret salts cap different rows; a seeded one ranks alike every time; data
    that changed is other data (and the store drops what it measured)."""
    policy = _policy(tmp_path / "data", _rows())
    sql = "SELECT COUNT(*) FROM t"

    def relation(**kwargs: object) -> str:
        session = PrivateSession(policy, "alice", reuse=True, **kwargs)
        try:
            return session.prepare(sql).relation
        finally:
            session.close()

    assert relation(bounding_seed=4) == relation(bounding_seed=4)
    assert relation(bounding_seed=4) != relation(bounding_seed=5)
    assert relation() != relation()
    before = relation(bounding_seed=4)
    write_dataset(tmp_path / "data", TABLE, _rows(6))
    assert relation(bounding_seed=4) != before


def test_the_store_forgets_other_data_and_keeps_each_analysts_own(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    store = MeasurementStore(path, "v1")
    stored = StoredMeasurement(0, "alice", 7, "COUNT(*)", ((("rows",), 1),), Grouping(("g",), (("a", "b"),), True),
                               LaplaceMechanism(1, 1.0), Fraction(1), {("a",): 3, ("b",): 4, (OTHER,): 5})
    store.put("r", "alice", 7, [NewMeasurement(stored.label, stored.functional, stored.grouping, stored.mechanism,
                                               stored.step, dict(stored.cells))])
    found = store.candidates("r", "alice", shared=False)
    assert len(found) == 1 and found[0].cells == stored.cells and found[0].charge == 7
    assert found[0].grouping == stored.grouping and found[0].mechanism == stored.mechanism
    assert store.candidates("r", "bob", shared=False) == []
    assert len(store.candidates("r", "bob", shared=True)) == 1
    store.close()
    assert MeasurementStore(path, "v2").candidates("r", "alice", shared=False) == []

