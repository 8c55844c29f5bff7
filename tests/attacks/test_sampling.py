"""The batched release (sampling.py) draws from the same distribution as calling dpsql's release once per draw."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.attacks.sampling import measure, sample_releases
from benchmarks.attacks.stats import same_distribution_pvalue
from benchmarks.support import Table, column, open_session, seeded, write_dataset
from dpsql.release.cells import release

SIGNIFICANCE = 0.01
TABLE = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b", "c")),
                           column("x", "float", lower=0, upper=10)), max_rows=2)
QUERIES = ["SELECT AVG(x) FROM t", "SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g"]


@pytest.mark.parametrize("sql", QUERIES)
def test_batched_release_matches_one_release_per_draw(tmp_path: Path, sql: str) -> None:
    rows = [(u, "a" if u % 3 else "b", float(u % 11)) for u in range(40)]
    session = open_session(write_dataset(tmp_path, TABLE, rows), seed=1)
    try:
        measured = measure(session, sql, epsilon=1.0)
    finally:
        session.close()
    one_by_one = [release(measured.plan, measured.rows, seeded(1000 + i)) for i in range(200)]
    batched = sample_releases(measured.plan, measured.rows, seeded(2), 3000)

    single_keys = [tuple(k) for k in one_by_one[0].keys]
    assert all(sorted(run) == sorted(single_keys) for run in batched)  # every public group, empty "c" included
    for g, key in enumerate(single_keys):
        for a in range(len(measured.plan.recipes)):
            ours = np.array([run[key][a] for run in batched])
            theirs = np.array([cells.values[g, a] for cells in one_by_one])
            assert same_distribution_pvalue(ours, theirs) > SIGNIFICANCE, (sql, key, a)
