"""The bounded SQL computes each aggregate kind exactly as the policy says: rows capped, values clamped.

Answers are taken at a huge epsilon, where the noise is negligible: each comparison allows 40 noise standard
deviations (a Laplace variable exceeds that with probability below exp(-40 / sqrt(2)) < 1e-12), so a failure is
a wrong rewrite, not bad luck.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from sqlglot import exp

from benchmarks.support import caps_rows, clamps, number, open_session, sql_tree, write_csv, write_policy
from dpsql.session import PrivateSession
from dpsql.sql import names

# pid, grp, x (bounds 0..10), y (bounds -5..5), flag
ROWS = [
    (1, "a", 1.0, 2, True), (1, "a", 2.0, -1, False), (1, "b", 100.0, 9, True),   # 100 clamps to 10, 9 to 5
    (2, "b", -3.0, -7, False),                                                    # -3 clamps to 0, -7 to -5
    (3, "a", None, 0, True), (3, "a", 4.0, 3, False),
]
TOLERANCE = 40


@pytest.fixture
def session(tmp_path: Path):
    yield from _session(tmp_path, max_rows=3)


def _session(tmp_path: Path, max_rows: int, rows=ROWS):
    write_csv(tmp_path / "t.csv", ["pid", "grp", "x", "y", "flag"], rows)
    policy = write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": max_rows,
        "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                    "x": {"type": "float", "lower": 0, "upper": 10},
                    "y": {"type": "int", "lower": -5, "upper": 5, "nullable": False},
                    "flag": {"type": "bool"}}}}, {"epsilon": 1e12, "query_epsilon": 1e6})
    session = open_session(policy, 3, "t", bounding_seed=11)
    yield session
    session.close()


def _answer(session: PrivateSession, sql: str) -> list[tuple]:
    result = session.execute(sql)
    return result.rows, result.noise_std


def _close(value: float, truth: float, std: float | None) -> bool:
    return abs(value - truth) <= TOLERANCE * (std or 0.0) + 1e-9 * max(1.0, abs(truth))


CLAMPED_X = [1.0, 2.0, 10.0, 0.0, 4.0]  # non-NULL x, each clamped to [0, 10]
CLAMPED_Y = [2, -1, 5, -5, 0, 3]


@pytest.mark.parametrize(("sql", "truth"), [
    ("SELECT COUNT(*) FROM t", 6),
    ("SELECT COUNT(x) FROM t", 5),  # NULL is not counted
    ("SELECT COUNT(DISTINCT pid) FROM t", 3),
    ("SELECT SUM(x) FROM t", sum(CLAMPED_X)),
    ("SELECT SUM(y) FROM t", sum(CLAMPED_Y)),
    ("SELECT AVG(x) FROM t", statistics.fmean(CLAMPED_X)),
    ("SELECT AVG(y) FROM t", statistics.fmean(CLAMPED_Y)),
    ("SELECT VAR_POP(x) FROM t", statistics.pvariance(CLAMPED_X)),
    ("SELECT VAR_SAMP(x) FROM t", statistics.variance(CLAMPED_X)),
    ("SELECT STDDEV_POP(y) FROM t", statistics.pstdev(CLAMPED_Y)),
    ("SELECT STDDEV(y) FROM t", statistics.stdev(CLAMPED_Y)),
    ("SELECT SUM(CASE WHEN y > 0 THEN 1 ELSE 0 END) FROM t", 3),
    ("SELECT SUM(x * y) FROM t", 1 * 2 + 2 * -1 + 10 * 5 + 0 * -5 + 4 * 3),
    ("SELECT AVG(x / 2) FROM t", statistics.fmean(v / 2 for v in CLAMPED_X)),
    ("SELECT SUM(flag) FROM t", 3),
    ("SELECT SUM(y) FROM t WHERE flag", 2 + 5 + 0),
    ("SELECT COUNT(*) FROM t WHERE x BETWEEN 1 AND 50 AND grp IN ('a', 'b')", 3),  # raw values: 100 fails
    ("SELECT SUM(x) / COUNT(x) FROM t", sum(CLAMPED_X) / 5),  # post-processing of two noisy cells
])
def test_each_aggregate_kind_is_computed_on_bounded_values(session, sql, truth) -> None:
    rows, stds = _answer(session, sql)
    assert len(rows) == 1
    value = rows[0][0]
    std = stds[0][0]
    if std is None:  # a combination of cells: the interval carries the uncertainty
        std = 1e-3
    assert _close(value, truth, std), (value, truth, std)


def test_public_groups_are_all_present_even_empty_ones(session) -> None:
    rows, stds = _answer(session, "SELECT grp, COUNT(*), SUM(y) FROM t GROUP BY grp ORDER BY grp")
    assert [r[0] for r in rows] == ["a", "b", "c"]
    truths = {"a": (4, 2 - 1 + 0 + 3), "b": (2, 5 - 5), "c": (0, 0)}
    for (group, count, total), (_, count_std, total_std) in zip(rows, stds, strict=True):
        assert _close(count, truths[group][0], count_std) and _close(total, truths[group][1], total_std)


def test_rows_beyond_the_cap_do_not_count(tmp_path: Path) -> None:
    many = [(1, "a", 1.0, 1, True)] * 50 + [(2, "b", 1.0, 1, True)] * 3 + [(3, "c", 1.0, 1, False)]
    for session in _session(tmp_path, max_rows=2, rows=many):
        rows, stds = _answer(session, "SELECT COUNT(*), SUM(y) FROM t")
        assert _close(rows[0][0], 2 + 2 + 1, stds[0][0]) and _close(rows[0][1], 5, stds[0][1])
        # With a filter the cap applies to the filtered rows: each unit keeps up to 2 rows that match.
        rows, stds = _answer(session, "SELECT COUNT(*) FROM t WHERE flag")
        assert _close(rows[0][0], 2 + 2, stds[0][0])


def test_the_sql_that_runs_enforces_the_bounds(session) -> None:
    plain = sql_tree(session.prepare("SELECT grp, SUM(y), AVG(x * 2) FROM t GROUP BY grp").bounded.sql)
    assert caps_rows(plain, names.RANK, 3)  # the per-unit rank prepared at load, filtered per query
    assert plain.find(exp.RowNumber) is None  # no per-query sort without a filter
    assert names.quantized_column("y") in {c.name for c in plain.find_all(exp.Column)}  # y's precomputed integer
    assert clamps(plain, 0.0, 10.0, column="x")  # x clamped inside the aggregate
    assert clamps(plain, 0.0, 20.0)  # x * 2 clamped to its derived interval [0, 20]
    filtered = sql_tree(session.prepare("SELECT COUNT(*) FROM t WHERE y > 0").bounded.sql)
    # the first 3 rows of each unit kept if they pass; the next 4 counted over their earlier rows' lists; the rows
    # after those, in units of more than 3 + 4 rows, ranked again per query
    assert caps_rows(filtered, names.RANK, 3) and filtered.find(exp.Qualify) is not None
    later = [t for t in filtered.find_all(exp.Table) if t.name == names.later_rows_table("t")]
    assert len(later) == 1 and isinstance(later[0].parent_select.args["where"].this, exp.Case)
    listed = later[0].parent_select.find(exp.ArrayFilter)
    assert listed is not None and listed.this.name == names.earlier_column("y")
    assert any(isinstance(n.this, exp.Column) and n.this.name == names.UNIT_ROWS and number(n.expression) == 3 + 4
               for n in filtered.find_all(exp.GT))
    ranked = [w for w in filtered.find_all(exp.Window) if isinstance(w.this, exp.RowNumber)]
    assert [[p.name for p in w.args["partition_by"]] for w in ranked] == [[names.UNIT]]  # rows ranked per unit
    kept = ranked[0].parent  # ... a later row kept while fewer of its unit's first 3 pass than later ones before it
    assert isinstance(kept, exp.LTE) and isinstance(kept.expression.unnest(), exp.Mul)
    failing_first = kept.expression.unnest().expression
    assert isinstance(failing_first, exp.Window) and caps_rows(failing_first.this, names.RANK, 3)
    guarded = sql_tree(session.prepare("SELECT COUNT(*) FROM t WHERE CAST(grp AS INT) > 1").bounded.sql)
    casts = [c for c in guarded.find_all(exp.Cast) if isinstance(c.this, exp.Column) and c.this.name == "grp"]
    assert casts  # a cast that could fail on some row becomes NULL instead of an error:
    assert all(isinstance(c, exp.TryCast) or c.find_ancestor(exp.Try) is not None for c in casts)


def test_sums_are_exact_integers_whatever_the_order(session) -> None:
    """A float sum depends on the order of addition; the fixed-point measurement does not."""
    prepared = session.prepare("SELECT SUM(x) FROM t")
    exact = session.engine.run(prepared.bounded.sql)
    assert all(isinstance(v, int) for row in exact for v in row)
    again = session.engine.run(prepared.bounded.sql.replace("SELECT", "SELECT /* again */", 1))
    assert exact == again


@pytest.mark.parametrize(("case", "if_large", "otherwise"), [
    ("CASE WHEN y >= 3 THEN 0.1 ELSE 0.2 END", 0.1, 0.2),  # DECIMAL(2,1) in the engine
    ("CASE WHEN y >= 3 THEN 1 ELSE 0.5 END", 1, 0.5),  # one common DECIMAL type
    ("CASE WHEN y >= 3 THEN 1e-1 ELSE 2 END", 0.1, 2),  # DOUBLE
    ("CASE WHEN y >= 3 THEN 'big' ELSE 'small' END", "big", "small"),
])
@pytest.mark.parametrize("order", ["", " ORDER BY b"])  # assembled directly, or through the post-processor
def test_a_case_key_with_literal_results_finds_its_own_groups(session, case, if_large, otherwise, order) -> None:
    """The key's public domain is matched against the engine's values: they must compare equal (a float 0.1
    never equals DuckDB's DECIMAL 0.1, which left every group a noisy zero)."""
    rows, stds = _answer(session, f"SELECT {case} AS b, COUNT(*) FROM t GROUP BY b{order}")
    truth = {if_large: 2, otherwise: 4}  # y >= 3 on two of the six rows (9 and 3)
    assert len(rows) == 2
    for (key, count), (_, std) in zip(rows, stds, strict=True):
        assert _close(count, truth[float(key) if not isinstance(key, str) else key], std), (key, count)


def test_cast_to_timestamp_is_accepted(session) -> None:
    """sqlglot reads TIMESTAMP as TIMESTAMPNTZ: a vetted cast target, as docs/reference/sql.md says."""
    sql = ("SELECT COUNT(*) FROM t WHERE CAST(CAST(y + 2000 AS TEXT) || '-01-01' AS TIMESTAMP) "
           "> TIMESTAMP '2001-06-01'")
    rows, stds = _answer(session, sql)
    assert _close(rows[0][0], 3, stds[0][0])  # years 2002, 2009 and 2003 of 2002, 1999, 2009, 1993, 2000, 2003
