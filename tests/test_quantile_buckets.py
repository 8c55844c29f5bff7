"""The engine's bucket counts for a quantile match the exact grid of dp/quantile.py."""

from __future__ import annotations

import random

import duckdb
from sqlglot import exp, parse_one

from dpsql.dp.quantile import grid_for
from dpsql.rewrite.quantile_buckets import bucket_counts, count_vectors


def test_duckdb_counts_every_row_in_its_grid_bucket_per_group() -> None:
    rng = random.Random(3)
    rows = [(rng.choice("ab"), rng.uniform(-20, 120) if rng.random() > 0.1 else None) for _ in range(2000)]
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (g TEXT, x DOUBLE)")
    connection.executemany("INSERT INTO t VALUES (?, ?)", rows)
    grid = grid_for(0.0, 100.0, integer=False)
    query = bucket_counts(parse_one("SELECT g, x FROM t"), ["g"], exp.column("x"), grid)
    got = count_vectors(connection.execute(query.sql("duckdb")).fetchall(), 1, grid)
    expected = {(g,): [0] * grid.candidates for g in "ab"}
    for g, x in rows:
        if x is not None:
            expected[(g,)][grid.bucket(x)] += 1
    assert got == expected
    assert got[("a",)][0] > 0 and got[("a",)][-1] > 0  # values beyond the bounds were clamped into the end buckets


def test_an_integer_grid_needs_no_rounding() -> None:
    connection = duckdb.connect()
    grid = grid_for(1, 1001, integer=True)
    query = bucket_counts(parse_one("SELECT x FROM range(1, 1002) AS r(x)"), [], exp.column("x"), grid)
    assert count_vectors(connection.execute(query.sql("duckdb")).fetchall(), 0, grid) == {(): [1] * 1001}
